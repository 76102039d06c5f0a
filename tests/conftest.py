"""Shared fixtures: real multi-process clusters and separate dask processes."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# Stepping tests must not be slowed by BLAS/torch thread oversubscription on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# SB3's logger makes a directory /tmp/SB3-<date> at every learn() without a log folder (its
# configure(folder=None)); the suite calls learn() hundreds of times. One directory, made by
# tempfile, holds them all (SB3 reads SB3_LOGDIR; the notebooks' kernels inherit it).
if "SB3_LOGDIR" not in os.environ:
    os.environ["SB3_LOGDIR"] = tempfile.mkdtemp(prefix="daskvec-tests-sb3-")
    atexit.register(shutil.rmtree, os.environ["SB3_LOGDIR"], True)
# Every worker the suite starts (LocalCluster, `dask worker`, SLURM jobs inherit the
# environment) runs without Dask's stack-sampling profiler: on CPython 3.11 it can
# deadlock a worker while an env group starts its threads (python/cpython#106883, seen
# once in CI as a worker frozen in Thread.start). DaskVecEnv warns users about such
# workers; test_errors checks that warning on a cluster that keeps the profiler on.
os.environ["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] = "False"
if "dask" in sys.modules:  # imported before this file (a plugin): read the variable again
    import dask

    dask.config.refresh()

TESTS_DIR = Path(__file__).parent


@pytest.fixture(scope="session")
def cluster2() -> Iterator[object]:
    """A real 2-process LocalCluster (1 thread each), shared by the session."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=40
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def dclient(cluster2: object) -> Iterator[object]:
    """One direct-to-workers client on :func:`cluster2` for a test module."""
    from distributed import Client

    with Client(cluster2, direct_to_workers=True, set_as_default=False) as c:
        yield c


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Deterministic and fair on a shared 2-core machine: torch uses one thread in this module.

    Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def restore_daskvec_logger() -> Iterator[None]:
    """``cli.main`` configures the ``daskvec`` logger for a terminal; undo it afterwards."""
    import logging

    log = logging.getLogger("daskvec")
    saved = (log.level, list(log.handlers), log.propagate)
    yield
    log.setLevel(saved[0])
    log.handlers[:] = saved[1]
    log.propagate = saved[2]


@pytest.fixture
def client2(cluster2: object) -> Iterator[object]:
    """A direct-to-workers client on :func:`cluster2`."""
    from distributed import Client

    with Client(cluster2, direct_to_workers=True, set_as_default=False) as c:
        yield c


@dataclass
class DaskProcesses:
    """A ``dask scheduler`` and ``dask worker`` processes started by a test."""

    address: str
    scheduler: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cwd: Path = Path("/")
    worker_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def add_worker(self, *extra: str, log: Path | None = None) -> subprocess.Popen[bytes]:
        """Start one more ``dask worker`` process (no nanny, so SIGKILL kills it for good).

        ``log``: a file that gets the worker's output (else it is discarded).
        """
        cmd = [
            sys.executable,
            "-m",
            "distributed.cli.dask_worker",
            self.address,
            "--nthreads",
            "1",
            "--no-nanny",
            "--no-dashboard",
            *self.worker_args,
            *extra,
        ]
        if log is None:
            p = subprocess.Popen(cmd, cwd=self.cwd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            with log.open("ab") as out:
                p = subprocess.Popen(cmd, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.workers.append(p)
        return p

    def kill_worker(self, p: subprocess.Popen[bytes]) -> None:
        """SIGKILL one worker process, like a node dying."""
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)

    def wait_for_workers(self, n: int, timeout: float = 60.0) -> None:
        """Block until the scheduler sees ``n`` workers."""
        from distributed import Client

        with Client(self.address, timeout=timeout, set_as_default=False) as c:
            c.wait_for_workers(n, timeout=timeout)

    def stop(self) -> None:
        """Terminate every process (kill after 10 s)."""
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                p.terminate()
        for p in [*self.workers, self.scheduler]:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def start_dask_processes(
    n_workers: int, tmp_path: Path, scheduler_args: tuple[str, ...] = (), worker_args: tuple[str, ...] = ()
) -> DaskProcesses:
    """Start ``dask scheduler`` and ``n_workers`` ``dask worker`` processes in ``tmp_path``.

    The processes run from ``tmp_path`` with a ``PYTHONPATH`` holding only the root of
    the daskvec the tests import (the checkout, when it is not the installed one): they
    import that daskvec and installed packages, but not the tests' own modules.
    """
    # the scheduler picks its own free port (0) and reports its address in its scheduler
    # file: no port is chosen here and handed over later, when another process may hold it
    scheduler_file = tmp_path / f"scheduler-{uuid.uuid4().hex}.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    import daskvec  # here, not at the top: OMP_NUM_THREADS is set before NumPy comes

    root = Path(daskvec.__file__).resolve().parents[1]
    if root.name not in ("site-packages", "dist-packages"):
        # the daskvec under test, not the one the venv's editable install points at (another
        # checkout, a mutated copy): its root holds no test module, so those stay out of reach
        env["PYTHONPATH"] = str(root)
    env["OMP_NUM_THREADS"] = "1"
    scheduler = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--dashboard-address",
            ":0",
            "--scheduler-file",
            str(scheduler_file),
            *scheduler_args,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            address = str(json.loads(scheduler_file.read_text())["address"])
            break
        except (OSError, ValueError, KeyError):  # not written yet, or half written
            if scheduler.poll() is not None or time.monotonic() > deadline:
                DaskProcesses("", scheduler).stop()
                raise RuntimeError("dask scheduler did not start") from None
            time.sleep(0.1)
    procs = DaskProcesses(address, scheduler, cwd=tmp_path, worker_args=list(worker_args), env=env)
    try:
        for _ in range(n_workers):
            procs.add_worker()
        if n_workers:
            procs.wait_for_workers(n_workers)
    except BaseException:
        procs.stop()
        raise
    return procs


@pytest.fixture
def dask_processes(tmp_path: Path) -> Iterator[object]:
    """Factory fixture: ``dask_processes(n)`` starts a scheduler and ``n`` workers."""
    started: list[DaskProcesses] = []

    def start(
        n_workers: int = 2, scheduler_args: tuple[str, ...] = (), worker_args: tuple[str, ...] = ()
    ) -> DaskProcesses:
        p = start_dask_processes(n_workers, tmp_path, scheduler_args, worker_args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def have_chromium() -> bool:
    """Whether Debian's chromium is installed."""
    return shutil.which("chromium") is not None


#: Fixtures that start processes: a test using any of them (directly or through another
#: fixture) is marked ``processes``.
PROCESS_FIXTURES = frozenset({"cluster2", "dclient", "client2", "dask_processes"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with what it needs, so that ``-m "not processes"`` is the fast loop.

    A test needs ``processes`` when it uses a fixture that starts them, or when its module
    or itself says so (``pytestmark = pytest.mark.processes``: it starts a cluster, a
    ``dask`` command or a script itself). ``browser``, ``slurm`` and ``hosts`` imply it.
    """
    for item in items:
        needs = {m.name for m in item.iter_markers()}
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or needs & {"browser", "slurm", "hosts"}:
            item.add_marker(pytest.mark.processes)


if os.environ.get("DASKVEC_CHECK_MARKERS") == "1":
    import threading

    import psutil

    @pytest.fixture(autouse=True)
    def _no_child_process_unmarked(request: pytest.FixtureRequest) -> Iterator[None]:
        """Checks the markers themselves: a test not marked ``processes`` starts no process.

        Run the fast loop with ``DASKVEC_CHECK_MARKERS=1`` after adding tests: a child of
        the test process seen while an unmarked test runs fails it, naming the process.
        """
        if request.node.get_closest_marker("processes") is not None:
            yield
            return
        me = psutil.Process()
        before = {p.pid for p in me.children(recursive=True)}
        seen: list[str] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.02):
                try:
                    for p in me.children(recursive=True):
                        if p.pid not in before:
                            seen.append(" ".join(p.cmdline()[:4]))
                except psutil.Error:
                    continue

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        yield
        stop.set()
        t.join()
        assert not seen, f"an unmarked test started processes (mark it processes): {sorted(set(seen))[:3]}"
