"""What a new user meets in the first hour, run as a user runs it: a script in a subprocess.

Each test writes a small script, runs it with this venv's Python (as ``python
script.py`` in a terminal would, the terminal being a pipe here), and checks what the
user would read: one clear error where Dask printed hundreds of lines, the error before
anything starts where it came after a cluster had started, no warning lines where
Dask printed some. The subprocesses get the environment a user has: without the
suite's ``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False`` (conftest.py).

Bounds on time are generous (a loaded 2-core machine) and only tell apart "within
seconds" from what the behaviour before took (Dask's 30 s connect timeout).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: Every test here starts processes (scripts, `dask` commands, clusters).
pytestmark = pytest.mark.processes

ROOT = Path(__file__).parents[2]
#: Printed by DaskVecEnv's profiler warning (daskvec._core.pool), whatever its wording.
PROFILER_WARNING = "python/cpython#106883"


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's terminal: the suite's profiler setting removed."""
    env = {k: v for k, v in os.environ.items() if k != "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)
    return env


@dataclass
class Run:
    """A finished script: its exit code, what it printed (stdout and stderr, as a terminal shows them), seconds."""

    returncode: int
    output: str
    seconds: float
    script: Path | None = None

    @property
    def lines(self) -> list[str]:
        return self.output.splitlines()


def run_script(
    tmp_path: Path,
    source: str,
    *,
    timeout: float = 240,
    name: str = "script.py",
    env: dict[str, str] | None = None,
    stdin: bool = False,
) -> Run:
    """Run ``source`` as ``python script.py`` would (``stdin=True``: as ``python - < script.py``)."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-" if stdin else str(script)],
        input=script.read_text() if stdin else None,
        cwd=tmp_path,
        env=env or user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return Run(proc.returncode, proc.stdout, time.monotonic() - start, script)


# --------------------------------------------------------------------------- the main guard
@pytest.mark.timeout(300)
def test_a_script_without_the_main_guard_gets_one_error_before_anything_starts(tmp_path: Path) -> None:
    """Before: after 4-100 s, ~500 lines of RuntimeErrors about bootstrapping from every worker."""
    run = run_script(
        tmp_path,
        """\
        import daskvec

        envs = daskvec.make_vec("CartPole-v1", num_envs=2)
        envs.close()
    """,
    )
    assert run.returncode != 0
    errors = [line for line in run.lines if line.startswith("daskvec.errors.MissingMainGuardError: ")]
    assert len(errors) == 1, run.output
    assert "line 3 of" in errors[0] and 'if __name__ == "__main__":' in errors[0], run.output
    assert "bootstrapping" not in run.output and "Nanny failed" not in run.output, run.output
    assert "distributed." not in run.output, run.output  # no Dask process started, so none logged
    assert len(run.lines) < 40, f"{len(run.lines)} lines:\n{run.output}"  # one traceback, not hundreds of lines


@pytest.mark.timeout(300)
def test_a_script_read_from_standard_input_gets_one_error_before_anything_starts(tmp_path: Path) -> None:
    """``python - < script.py``: spawned workers cannot import ``<stdin>`` again, guard or not.

    Before: 82 lines, two workers' ``FileNotFoundError: .../<stdin>`` and "EmbeddedNanny failed to start".
    """
    run = run_script(
        tmp_path,
        """\
        import gymnasium as gym

        from daskvec import DaskVecEnv

        if __name__ == "__main__":
            env = DaskVecEnv([lambda: gym.make("CartPole-v1")] * 2)
            env.close()
        """,
        stdin=True,
    )
    assert run.returncode != 0
    errors = [line for line in run.lines if line.startswith("daskvec.errors.MissingMainGuardError: ")]
    assert len(errors) == 1, run.output
    assert "'<stdin>'" in errors[0] and "Save the script to a file" in errors[0], run.output
    assert "FileNotFoundError" not in run.output and "Nanny failed" not in run.output, run.output


@pytest.mark.timeout(300)
def test_the_same_script_with_the_guard_runs(tmp_path: Path) -> None:
    run = run_script(
        tmp_path,
        """\
        import daskvec


        def main():
            envs = daskvec.make_vec("CartPole-v1", num_envs=2)
            envs.reset(seed=0)
            print("stepped", envs.step(envs.action_space.sample())[0].shape, flush=True)
            envs.close()


        if __name__ == "__main__":
            main()
    """,
    )
    assert run.returncode == 0, run.output
    assert "stepped (2, 4)" in run.output
    assert "MissingMainGuardError" not in run.output


# --------------------------------------------------------------------------- checks before anything starts
@pytest.mark.timeout(300)
def test_an_unpicklable_factory_is_reported_before_a_cluster_starts(tmp_path: Path) -> None:
    """Before: the embedded cluster started first (~60 s on a busy machine), then the error."""
    run = run_script(
        tmp_path,
        """\
        import threading
        import time

        import gymnasium as gym
        import distributed.deploy.spec as spec

        from daskvec import DaskVecEnv

        started = []  # every Dask cluster this process starts (LocalCluster and daskvec's are SpecClusters)
        _init = spec.SpecCluster.__init__


        def spy(self, *args, **kwargs):
            started.append(type(self).__name__)
            return _init(self, *args, **kwargs)


        spec.SpecCluster.__init__ = spy

        if __name__ == "__main__":
            lock = threading.Lock()
            fns = [lambda: gym.make("CartPole-v1"), lambda: lock and gym.make("CartPole-v1")]
            start = time.monotonic()
            try:
                DaskVecEnv(fns)
            except TypeError as e:
                print(f"TypeError after {time.monotonic() - start:.1f} s: {e}")
            print(f"clusters started: {started}")
    """,
    )
    assert run.returncode == 0, run.output
    assert re.search(r"TypeError after [\d.]+ s: env_fns\[1\] cannot be pickled", run.output), run.output
    assert "clusters started: []" in run.output, run.output


@pytest.mark.timeout(300)
def test_a_scheduler_address_that_does_not_answer_is_named_within_seconds(tmp_path: Path) -> None:
    """Before: Dask's connect timeout, 30 s. Now ``daskvec.connect-timeout``, 5 s by default."""
    source = """\
        import socket
        import time

        import gymnasium as gym

        from daskvec import DaskVecEnv

        if __name__ == "__main__":
            with socket.socket() as s:  # bound, never listening: connections are refused
                s.bind(("127.0.0.1", 0))
                address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
                start = time.monotonic()
                try:
                    DaskVecEnv([lambda: gym.make("CartPole-v1")], client=address)
                except ValueError as e:
                    print(f"ValueError after {time.monotonic() - start:.1f} s: {e}")
                print("address:", address)
    """
    run = run_script(tmp_path, source)
    address = re.search(r"^address: (\S+)$", run.output, re.M)
    found = re.search(r"ValueError after ([\d.]+) s: cannot reach a Dask scheduler at '(\S+)' within 5s", run.output)
    assert address and found and found.group(2) == address.group(1), run.output
    # a behaviour bound, not a speed one: well below the 30 s of Dask's connect timeout
    assert float(found.group(1)) < 20, run.output
    # the config key, as docs/configuration.md says
    run = run_script(tmp_path, source, env=user_env(DASK_DASKVEC__CONNECT_TIMEOUT="1"))
    assert re.search(r"ValueError after [\d.]+ s: cannot reach a Dask scheduler at '\S+' within 1s", run.output), (
        run.output
    )


@pytest.mark.timeout(300)
def test_a_malformed_scheduler_address_is_named_and_leaves_no_broken_default_client(tmp_path: Path) -> None:
    """Before: Dask's bare "missing port number", and the failed Client stayed the default client, so
    every later ``DaskVecEnv(client=None)`` of the process failed with ``SchedulerLostError``."""
    run = run_script(
        tmp_path,
        """\
        import gymnasium as gym

        from daskvec import DaskVecEnv

        if __name__ == "__main__":
            try:
                DaskVecEnv([lambda: gym.make("CartPole-v1")], client="localhost")
            except ValueError as e:
                print(f"ValueError: {e}", flush=True)
                kept = e  # as Jupyter keeps the last error (its traceback holds the failed Client)
            env = DaskVecEnv([lambda: gym.make("CartPole-v1")] * 2)  # an embedded cluster, as if nothing happened
            print("then stepped", env.reset().shape, env.step([0, 1])[0].shape, flush=True)
            env.close()
    """,
    )
    assert run.returncode == 0, run.output
    assert "ValueError: cannot connect to 'localhost': missing port number" in run.output, run.output
    assert "a scheduler address looks like 'tcp://host:8786'" in run.output, run.output
    assert "then stepped (2, 4) (2, 4)" in run.output, run.output


@pytest.mark.timeout(300)
def test_two_embedded_vec_envs_share_one_cluster_that_closes_with_the_last(tmp_path: Path) -> None:
    """A training and an evaluation env, both ``client=None``. Before: the second ran on the first's
    cluster, and closing the first took the second's envs away ("were lost", then SchedulerLostError)."""
    run = run_script(
        tmp_path,
        """\
        import numpy as np
        from stable_baselines3.common.env_util import make_vec_env

        from daskvec import DaskVecEnv

        if __name__ == "__main__":
            train = make_vec_env("CartPole-v1", n_envs=4, vec_env_cls=DaskVecEnv, seed=0)
            evaluation = make_vec_env("CartPole-v1", n_envs=2, vec_env_cls=DaskVecEnv, seed=10)
            cluster = train.client.cluster
            print("one cluster:", evaluation.client is train.client, flush=True)
            train.reset()
            first = evaluation.reset()
            train.close()
            print("after the first close:", cluster.status.name, flush=True)
            # the evaluation env still steps, its own envs: the same as a fresh one with the same seed
            reference = make_vec_env("CartPole-v1", n_envs=2, seed=10)
            assert np.array_equal(first, reference.reset())
            for k in range(300):
                actions = np.array([k % 2, (k // 3) % 2])
                got, want = evaluation.step(actions), reference.step(actions)
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[2], want[2]), k
            print("evaluation stepped 300 times", flush=True)
            evaluation.close()
            print("after the last close:", cluster.status.name, flush=True)
    """,
    )
    assert run.returncode == 0, run.output
    assert "one cluster: True" in run.output, run.output
    assert "after the first close: running" in run.output, run.output
    assert "evaluation stepped 300 times" in run.output, run.output
    assert "after the last close: closed" in run.output, run.output
    assert "were lost" not in run.output and "SchedulerLost" not in run.output, run.output


# --------------------------------------------------------------------------- quiet by default
@pytest.mark.timeout(300)
def test_a_failing_factory_gives_its_error_without_dasks_compute_failed_block(tmp_path: Path) -> None:
    """One factory raises while another is still building (its build is cancelled when the client gives up).

    Before: Dask's "Compute Failed" block, "Async instruction ... ended with
    CancelledError" for the other group, and a nanny warning on close.
    """
    run = run_script(
        tmp_path,
        """\
        import time

        import gymnasium as gym

        from daskvec import DaskVecEnv


        def make():
            raise RuntimeError("no licence for this simulator")


        def slow():
            time.sleep(3)
            return gym.make("CartPole-v1")


        if __name__ == "__main__":
            try:
                DaskVecEnv([make, slow], cluster_kwargs={"n_workers": 2})
            except RuntimeError as e:
                print(f"caught {type(e).__name__}: {e}")
                print("notes:", " | ".join(getattr(e, "__notes__", [])).replace(chr(10), " "))
    """,
    )
    assert run.returncode == 0, run.output
    assert "caught RuntimeError: no licence for this simulator" in run.output, run.output
    assert "daskvec: raised by the factory of env 0 on worker tcp://" in run.output  # where, added by daskvec
    assert "Compute Failed" not in run.output, run.output
    # no Dask log line about daskvec's group tasks (a build cancelled when the client gave up included)
    assert "daskvec-group-" not in run.output, run.output
    assert "still alive" not in run.output, run.output


# --------------------------------------------------------------------------- one cause, one short message
#: The most a user's error may print, traceback header and notes included.
SHORT_ERROR_LINES = 15


def assert_one_short_error(run: Run, error: str, todo: str) -> None:
    """``run`` ended on ``error`` (the exception line, its type as raised) within a few lines, the last saying ``todo``.

    No chained screens, and none of the position markers (``^^^^``) of frames rebuilt
    from another process: the only marker lines left are Python's under the user's own
    line that called daskvec.
    """
    assert run.returncode == 1, run.output
    assert len(run.lines) <= SHORT_ERROR_LINES, f"{len(run.lines)} lines:\n{run.output}"
    assert run.lines[0] == "Traceback (most recent call last):", run.output
    assert sum(line.startswith(error) for line in run.lines) == 1, run.output
    assert todo in run.lines[-1], run.output
    assert "The above exception was the direct cause" not in run.output, run.output
    assert "During handling of the above exception" not in run.output, run.output
    assert "site-packages" not in run.output, run.output  # neither Dask's frames nor Gymnasium's
    markers = [i for i, line in enumerate(run.lines) if line.strip() and set(line.strip()) <= set("^~")]
    assert all(run.lines[i - 2].startswith(f'  File "{run.script}"') for i in markers), run.output


@pytest.mark.timeout(300)
def test_an_env_id_typo_in_a_factory_is_one_short_error_saying_what_to_do(tmp_path: Path) -> None:
    """Before: 57 lines, the worker's frames rebuilt with stray ``^^^^`` lines, then ``NameNotFound``."""
    run = run_script(
        tmp_path,
        """\
        import gymnasium as gym

        from daskvec import DaskVecEnv

        if __name__ == "__main__":
            env = DaskVecEnv([lambda: gym.make("CartPol-v1")] * 2)
            env.close()
        """,
    )
    assert_one_short_error(run, "gymnasium.error.NameNotFound: ", "print(err.remote_traceback)")
    assert "Did you mean: `CartPole`?" in run.output, run.output
    assert re.search(r"raised by the factory of env \d on worker tcp://", run.output), run.output
    assert "fix the factory" in run.lines[-1], run.output


@pytest.mark.timeout(2 * 240 + 60)  # two runs of the script, each bounded by its own 240 s
def test_a_raising_factory_is_one_short_error_whose_traceback_is_on_the_exception(tmp_path: Path) -> None:
    """Before: 45 lines of daskvec's, Dask's and the worker's frames. The user's frame stays one print away."""
    source = """\
        import logging
        import sys

        from daskvec import DaskVecEnv


        def make():
            raise ValueError("no licence for this simulator")


        if __name__ == "__main__":
            if sys.argv[1:] == ["--debug"]:
                logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
            try:
                env = DaskVecEnv([make] * 2)
            except ValueError as err:
                if sys.argv[1:] == ["--show"]:
                    print(err.remote_traceback)
                raise
        """
    run = run_script(tmp_path, source)
    assert_one_short_error(run, "ValueError: no licence for this simulator", "print(err.remote_traceback)")
    assert re.search(r"raised by the factory of env \d on worker tcp://", run.output), run.output
    # what the last line says shows the factory's own frame, without position markers
    script = tmp_path / "script.py"
    shown = subprocess.run(
        [sys.executable, str(script), "--show"],
        cwd=tmp_path,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ", line 8, in make" in shown.stdout, shown.stdout  # the line that raised
    assert "ValueError: no licence for this simulator" in shown.stdout, shown.stdout
    assert not any(line.strip() and set(line.strip()) <= set("^~") for line in shown.stdout.splitlines()), shown.stdout
    # and so does the DEBUG log of the 'daskvec' logger
    debug = subprocess.run(
        [sys.executable, str(script), "--debug"],
        cwd=tmp_path,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert re.search(r"^daskvec\S* DEBUG the full traceback of ValueError", debug.stderr, re.M), debug.stderr
    assert ", line 8, in make" in debug.stderr, debug.stderr


@pytest.mark.timeout(300)
def test_an_unreachable_scheduler_address_is_one_short_error_saying_what_to_do(tmp_path: Path) -> None:
    """Before: 62 lines, four chained exceptions (Dask's connection errors, then daskvec's)."""
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        run = run_script(
            tmp_path,
            f"""\
            import gymnasium as gym

            from daskvec import DaskVecEnv

            if __name__ == "__main__":
                env = DaskVecEnv([lambda: gym.make("CartPole-v1")] * 2, client="{address}", connect_timeout=2)
                env.close()
            """,
        )
    assert_one_short_error(run, f"ValueError: cannot reach a Dask scheduler at '{address}'", "check the address")
    assert "`dask scheduler` is running" in run.lines[-1], run.output


@pytest.mark.timeout(300)
def test_closing_the_embedded_cluster_prints_no_nanny_warning(tmp_path: Path) -> None:
    """A worker process that takes 5 s to exit (as one with torch imported can on a loaded machine).

    Before: "Worker process still alive after 4.0 seconds, killing", once per worker.
    """
    run = run_script(
        tmp_path,
        """\
        import atexit
        import time

        import gymnasium as gym

        from daskvec import DaskVecEnv


        def make():
            # this process (a worker) will take 5 s to tear down, once
            atexit.unregister(time.sleep)
            atexit.register(time.sleep, 5)
            return gym.make("CartPole-v1")


        if __name__ == "__main__":
            env = DaskVecEnv([make, make])
            env.reset()
            start = time.monotonic()
            env.close()
            print(f"closed in {time.monotonic() - start:.1f} s", flush=True)
    """,
    )
    assert run.returncode == 0, run.output
    assert "closed in" in run.output
    assert "still alive" not in run.output and "killed by signal" not in run.output, run.output


@pytest.mark.timeout(300)
def test_closing_the_embedded_cluster_beside_busy_loops_waits_for_workers_still_exiting(tmp_path: Path) -> None:
    """Two busy loops beside the cluster; each worker process works on its exit for 30 s (CPU, as a torch
    interpreter's teardown does at a small share of a core on a loaded machine).

    Before: "Worker process still alive after 24.0 seconds, killing", once per worker.
    """
    run = run_script(
        tmp_path,
        """\
        import atexit
        import multiprocessing
        import time

        import gymnasium as gym

        from daskvec import DaskVecEnv


        def work_until(deadline):
            while time.monotonic() < deadline:
                sum(range(10_000))


        def exit_slowly():
            work_until(time.monotonic() + 30)


        def make():
            # this process (a worker) will spend 30 s working on its exit, once
            atexit.unregister(exit_slowly)
            atexit.register(exit_slowly)
            return gym.make("CartPole-v1")


        if __name__ == "__main__":
            busy = [multiprocessing.Process(target=work_until, args=(time.monotonic() + 600,)) for _ in range(2)]
            for p in busy:
                p.start()
            try:
                env = DaskVecEnv([make, make], cluster_kwargs={"n_workers": 2})
                env.reset()
                env.close()
                print("closed", flush=True)
            finally:
                for p in busy:
                    p.kill()
                    p.join()
    """,
    )
    assert run.returncode == 0, run.output
    assert "closed" in run.lines, run.output
    assert "still alive" not in run.output and "killed" not in run.output, run.output


@pytest.mark.timeout(300)
def test_a_worker_process_stuck_in_its_exit_is_killed_with_one_line_of_daskvecs(tmp_path: Path) -> None:
    """A worker process that makes no progress towards its exit (asleep for good) is killed, saying so once."""
    run = run_script(
        tmp_path,
        """\
        import atexit
        import threading

        import gymnasium as gym

        from daskvec import DaskVecEnv


        def make():
            atexit.register(threading.Event().wait)  # this process (a worker) never ends by itself
            return gym.make("CartPole-v1")


        if __name__ == "__main__":
            env = DaskVecEnv([make], cluster_kwargs={"n_workers": 1})
            env.reset()
            env.close()
            print("closed", flush=True)
    """,
    )
    assert run.returncode == 0, run.output
    assert "closed" in run.lines, run.output
    assert "still alive" not in run.output, run.output
    killed = [line for line in run.lines if "made no progress towards its exit" in line]
    assert len(killed) == 1 and "killed" in killed[0], run.output


def _wait_for_group_to_end(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.timeout(300)
def test_ctrl_c_is_one_keyboard_interrupt_in_the_users_process(tmp_path: Path) -> None:
    """SIGINT to the whole process group, as Ctrl-C in a terminal sends it.

    Before: the user's traceback, then a ~45-line KeyboardInterrupt traceback from every
    embedded worker.
    """
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
        import daskvec

        if __name__ == "__main__":
            envs = daskvec.make_vec("CartPole-v1", num_envs=4)
            envs.reset(seed=0)
            print("stepping", flush=True)
            while True:
                envs.step(envs.action_space.sample())
    """)
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    gone = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # pytest-timeout bounds a script that never steps
            lines.append(line)
            if line.strip() == "stepping":
                break
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
        lines.append(rest)
        gone = _wait_for_group_to_end(proc.pid, 60)  # the workers end with the user's process
    finally:
        if not gone:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    output = "".join(lines)
    assert output.count("KeyboardInterrupt") == 1, output
    assert f'File "{script}"' in output  # the user's own traceback
    assert "Dask Worker process" not in output and "CancelledError" not in output, output
    assert len(output.splitlines()) < 40, output
    assert gone, "processes of the script's group were still running a minute after Ctrl-C"


@pytest.mark.timeout(300)
def test_ctrl_c_while_the_embedded_cluster_starts_is_one_keyboard_interrupt(tmp_path: Path) -> None:
    """Ctrl-C in the first seconds, while the nannies start their workers, at three moments.

    Before: under the user's KeyboardInterrupt, Dask's exit hook tried to close the
    half-started cluster and printed "Exception ignored in atexit callback ...
    AssertionError: Status.init" (and, at times, "Nanny failed to start").
    """
    script = tmp_path / "start.py"
    script.write_text(
        textwrap.dedent("""\
        import gymnasium as gym
        from daskvec import DaskVecEnv

        if __name__ == "__main__":
            print("starting", flush=True)
            env = DaskVecEnv([lambda: gym.make("CartPole-v1")] * 4)
            print("built", flush=True)
            env.close()
    """)
    )
    for delay in (0.8, 1.3, 1.8):  # seconds after the imports: the nannies are starting
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=user_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        gone = False
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            assert first.strip() == "starting", first
            time.sleep(delay)
            os.killpg(proc.pid, signal.SIGINT)
            output, _ = proc.communicate(timeout=120)
            gone = _wait_for_group_to_end(proc.pid, 60)
        finally:
            if not gone:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        if "built" in output:  # the machine was quick: the cluster was up before the signal
            continue
        assert "KeyboardInterrupt" in output, output
        for noise in ("Exception ignored in atexit", "AssertionError", "Nanny failed to start", "Task exception"):
            assert noise not in output, f"after {delay} s: {output}"
        assert gone, f"after {delay} s: processes of the script's group were still running a minute after Ctrl-C"


@pytest.mark.timeout(300)
def test_a_closed_dashboard_tab_prints_nothing_from_the_embedded_cluster(tmp_path: Path) -> None:
    """Bokeh's websocket handler raising as a tab closes (here: its session already gone).

    Before: Tornado's 20-line "Uncaught exception GET /daskvec/ws ... AssertionError".
    The same record of another server (not the embedded cluster's) is still logged.
    """
    run = run_script(
        tmp_path,
        """\
        import asyncio
        import gc
        import logging
        import re
        import urllib.request

        from bokeh.server.connection import ServerConnection
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        import daskvec


        async def open_and_close_tab(base, page):
            html = urllib.request.urlopen(base + page, timeout=30).read().decode()
            token = re.search(r'"token":\\s*"([^"]+)"', html).group(1)
            request = HTTPRequest(base.replace("http", "ws", 1) + page + "/ws", headers={"Origin": base})
            ws = await websocket_connect(request, subprotocols=["bokeh", token])
            await ws.read_message()  # Bokeh's ACK: the session is open
            for conn in [o for o in gc.get_objects() if isinstance(o, ServerConnection)]:
                conn.detach_session()  # the session is discarded before the tab goes
                conn._session = None
            ws.close()
            await asyncio.sleep(2)


        class Request:  # what Tornado logs with an uncaught exception
            host, path = "127.0.0.1:1", "/other/ws"


        if __name__ == "__main__":
            envs = daskvec.make_vec("CartPole-v1", num_envs=2)
            base = envs.dashboard.status.rsplit("/", 1)[0]
            for page in ("/daskvec", "/status"):
                asyncio.run(open_and_close_tab(base, page))
            try:
                raise AssertionError
            except AssertionError:  # another server's record of the same kind: not daskvec's to drop
                logging.getLogger("tornado.application").error(
                    "Uncaught exception %s\\n%r", "GET /other/ws (127.0.0.1)", Request(), exc_info=True)
            envs.close()
            print("filters left:", logging.getLogger("tornado.application").filters)
    """,
    )
    assert run.returncode == 0, run.output
    assert "Uncaught exception GET /daskvec/ws" not in run.output, run.output
    assert "Uncaught exception GET /status/ws" not in run.output, run.output
    assert "Uncaught exception GET /other/ws" in run.output, run.output
    assert "filters left: []" in run.output


# --------------------------------------------------------------------------- profiler
@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Dask's profiler is a hazard on Python 3.11 only")
@pytest.mark.timeout(300)
def test_the_profiler_warning_names_the_line_that_silences_it(tmp_path: Path) -> None:
    """A user's own LocalCluster with Dask's defaults: one warning for two vec envs, and its line, added to the
    script, silences it."""
    source = """\
        import gymnasium as gym
        from distributed import Client, LocalCluster

        from daskvec import DaskVecEnv

        if __name__ == "__main__":
            # LINE
            cluster = LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0")
            client = Client(cluster)
            env = DaskVecEnv([lambda: gym.make("CartPole-v1")] * 2, client=client)
            env.close()
            env = DaskVecEnv([lambda: gym.make("CartPole-v1")] * 2, client=client)  # warned once per process
            env.close()
            client.close()
            cluster.close()
            print("done")
    """
    run = run_script(tmp_path, source)
    warnings = [line for line in run.lines if PROFILER_WARNING in line]
    assert run.returncode == 0 and len(warnings) == 1, run.output
    line = re.search(r"add `([^`]+)` before creating the LocalCluster", warnings[0])
    assert line and line.group(1) == 'dask.config.set({"distributed.worker.profile.enabled": False})', warnings[0]
    run = run_script(tmp_path, source.replace("# LINE", f"import dask; {line.group(1)}"))
    assert run.returncode == 0 and "done" in run.output, run.output
    assert PROFILER_WARNING not in run.output, run.output


def readme_cluster_commands() -> tuple[list[str], dict[str, str], list[str]]:
    """The README's ``dask scheduler`` and ``dask worker`` commands: scheduler argv, worker environment and argv."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### On an existing Dask cluster", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line.split("  #", 1)[0]) for line in section.splitlines() if line.strip()]
    scheduler = next(c for c in commands if c[:2] == ["dask", "scheduler"])
    worker = next(c for c in commands if "worker" in c)
    at = worker.index("dask")
    env = dict(a.split("=", 1) for a in worker[:at])
    return scheduler, env, worker[at:]


@pytest.fixture
def readme_cluster(tmp_path: Path) -> Iterator[str]:
    """A scheduler and two workers started with the README's commands (port 0 and a scheduler file added)."""
    scheduler_cmd, worker_env, worker_cmd = readme_cluster_commands()
    dask = [sys.executable, "-m", "dask"]  # `dask ...` of this venv
    sched_file = tmp_path / "scheduler.json"
    procs = [
        subprocess.Popen(
            [
                *dask,
                *scheduler_cmd[1:],
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                ":0",
                "--scheduler-file",
                str(sched_file),
            ],
            cwd=tmp_path,
            env=user_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        deadline = time.monotonic() + 120
        while not (sched_file.exists() and sched_file.read_text().strip()):
            assert time.monotonic() < deadline and procs[0].poll() is None, "the README's scheduler did not start"
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        argv = [*dask, *[address if a == "tcp://head:8786" else a for a in worker_cmd[1:]]]
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    argv, cwd=tmp_path, env=user_env(**worker_env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        yield address
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(30)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Dask's profiler is a hazard on Python 3.11 only")
@pytest.mark.timeout(300)
def test_the_readmes_cluster_commands_start_workers_without_the_profiler(tmp_path: Path, readme_cluster: str) -> None:
    """Before: ``dask worker ... --nthreads 1`` ran Dask's profiler, and DaskVecEnv warned once per worker."""
    run = run_script(
        tmp_path,
        f"""\
        import gymnasium as gym
        from distributed import Client

        from daskvec import DaskVecEnv

        if __name__ == "__main__":
            with Client("{readme_cluster}") as client:
                client.wait_for_workers(2, timeout=120)
            env = DaskVecEnv([lambda: gym.make("CartPole-v1")] * 2, client="{readme_cluster}")
            print("workers:", len({{g["worker"] for g in env.groups}}))
            env.close()
    """,
    )
    assert run.returncode == 0 and "workers: 2" in run.output, run.output
    assert PROFILER_WARNING not in run.output, run.output


# --------------------------------------------------------------------------- dask-jobqueue and Ctrl-C
@pytest.mark.timeout(300)
def test_ctrl_c_stays_a_keyboard_interrupt_after_importing_dask_jobqueue(tmp_path: Path) -> None:
    """``import dask_jobqueue`` makes SIGINT call ``sys.exit()``; daskvec's HPC path puts the handler back."""
    pytest.importorskip("dask_jobqueue")
    interrupt = """
        def interrupted():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
                return "nothing"
            except KeyboardInterrupt:
                return "KeyboardInterrupt"
            except SystemExit:
                return "SystemExit"
    """
    # the README's order: dask_jobqueue first, then daskvec.jobqueue
    run = run_script(
        tmp_path,
        "import os, signal, time\n"
        + textwrap.dedent(interrupt)
        + textwrap.dedent("""
        from dask_jobqueue import SLURMCluster
        print("after import dask_jobqueue:", interrupted())
        from daskvec.jobqueue import cluster_for_envs
        print("after import daskvec.jobqueue:", interrupted())
    """),
        name="first.py",
    )
    assert "after import dask_jobqueue: SystemExit" in run.output, run.output  # what dask_jobqueue does
    assert "after import daskvec.jobqueue: KeyboardInterrupt" in run.output, run.output
    # daskvec.jobqueue first, then dask_jobqueue: cluster_for_envs puts back the handler that was there
    run = run_script(
        tmp_path,
        "import os, signal, time\n"
        + textwrap.dedent(interrupt)
        + textwrap.dedent("""
        signal.signal(signal.SIGINT, lambda *_: print("the script's own handler", flush=True))
        from daskvec.jobqueue import cluster_for_envs
        from dask_jobqueue.local import LocalCluster

        if __name__ == "__main__":
            cluster, plan = cluster_for_envs(LocalCluster, 2, scaling="none",
                                             scheduler_options={"dashboard_address": ":0"})
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
            cluster.close()
            signal.signal(signal.SIGINT, signal.default_int_handler)
            print("finally:", interrupted())
    """),
        name="second.py",
    )
    assert "the script's own handler" in run.output, run.output
    assert "finally: KeyboardInterrupt" in run.output, run.output


def test_progress_lines_are_plain_text() -> None:
    """Not a subprocess: the line format ``daskvec train`` prints, on a fake clock (test_cli runs the command)."""
    from daskvec.cli import _ProgressLines

    class Timer:
        vec_steps, transit_s, env_s = 0, 0.0, 0.0

    class Env:
        num_envs, timer = 4, Timer()

    now = [100.0]
    progress = _ProgressLines(Env(), 1000, 10.0, clock=lambda: now[0])
    Env.timer.vec_steps, Env.timer.transit_s, Env.timer.env_s = 100, 0.1, 0.1
    now[0] = 110.0
    assert progress.line(400, now[0]) == (
        "progress: 400/1000 env steps (40%), 40 env-steps/s overall, 2000 env-steps/s stepping the envs, ETA 15 s"
    )


def test_an_embedded_vec_env_made_on_another_thread_meanwhile_joins_the_cluster_being_started(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Thread A starts the embedded cluster; while its client is already Dask's default and A still asks the
    scheduler for its dashboard, the main thread resolves ``client=None`` too. It must join A's cluster (and
    keep it up after A closes), not take the client as a user's own (which A's close then closed under it)."""
    import threading

    from distributed import LocalCluster

    from daskvec.cluster import clients as cluster_module

    if cluster_module._default_client() is not None:
        pytest.skip("a default client of the test session is in the way")
    caplog.set_level(
        logging.INFO, logger="daskvec.cluster.clients"
    )  # then A calls check_dashboard, after its Client exists
    asked, release = threading.Event(), threading.Event()

    def in_process_cluster(**kwargs: Any) -> Any:
        return LocalCluster(n_workers=1, processes=False, dashboard_address=":0")

    def slow_dashboard(client: Any) -> Any:
        asked.set()
        assert release.wait(60)
        return check_dashboard(client)

    check_dashboard = cluster_module.check_dashboard
    monkeypatch.setattr(cluster_module, "embedded_cluster", in_process_cluster)
    monkeypatch.setattr(cluster_module, "check_dashboard", slow_dashboard)
    got: dict[str, Any] = {}
    a = threading.Thread(target=lambda: got.update(a=cluster_module.resolve_client(None)))
    a.start()
    try:
        assert asked.wait(60)
        b = cluster_module.resolve_client(None)  # A's client is the default now; A has not returned yet
    finally:
        release.set()
        a.join(60)
    resolved_a = got["a"]
    assert b.client is resolved_a.client and b.shared and resolved_a.shared
    resolved_a.close()
    assert b.client.status == "running"  # A's close left the cluster to B
    b.close()
    assert b.client.status == "closed" and cluster_module._EMBEDDED == {}
