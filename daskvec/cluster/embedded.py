"""The embedded cluster: the ``LocalCluster`` daskvec starts when it is given none.

It runs in the user's terminal, for the user's process alone, so it is made to behave
like part of that process:

- :func:`check_main_guard` refuses to start it from the top level of a script outside
  ``if __name__ == "__main__":`` (every worker process would import the script again
  and run that line), with one error naming the line, before any process starts;
- its workers are preloaded with :mod:`daskvec.worker.preload`: they ignore Ctrl-C,
  which is the user's process's to handle, and leave an env factory's error to the
  client, which reports it once;
- its nannies (:class:`EmbeddedNanny`) wait for a worker process to exit as long as it
  makes progress (up to a bound), so that closing it prints no warning, even on a loaded
  machine;
- while it runs, Tornado's tracebacks of its dashboard's closed browser tabs are dropped
  from the user's log (:class:`EmbeddedCluster`).

A cluster of the user's own is left as Dask makes it.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
from typing import Any

from distributed import LocalCluster, Nanny
from distributed.deploy.spec import SpecCluster

from daskvec.errors import MissingMainGuardError

logger = logging.getLogger(__name__)

__all__ = [
    "EMBEDDED_PRELOAD",
    "EMBEDDED_WORKER_CONFIG",
    "WORKER_EXIT_S",
    "WORKER_STALL_S",
    "EmbeddedCluster",
    "EmbeddedNanny",
    "check_main_guard",
    "embedded_cluster",
]


def _dashboard_address(preferred: int = 8787) -> str:
    """Dask's usual dashboard port when it is free, else any free port (without Dask's warning)."""
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("", preferred))
        except OSError:
            return ":0"
    return f":{preferred}"


def embedded_cluster(n_workers: int | None = None, **kwargs: Any) -> Any:
    """Start the multi-process ``LocalCluster`` daskvec uses when given no cluster.

    One single-threaded worker process per core: env groups on one worker share its
    GIL, so processes, not threads, give parallel stepping. The cluster is daskvec's
    own, running in the user's terminal, so it is kept quiet (see :class:`EmbeddedCluster`).

    Raises
    ------
    daskvec.errors.MissingMainGuardError
        Called from the top level of a script that the worker processes would run
        again (:func:`check_main_guard`); nothing is started.
    """
    import dask

    from daskvec.cluster.clients import install_dashboard_page  # here: daskvec.cluster.clients imports this module

    check_main_guard()
    n = n_workers or max(os.cpu_count() or 1, 1)
    opts: dict[str, Any] = {
        "n_workers": n,
        "threads_per_worker": 1,
        "processes": True,
        "dashboard_address": _dashboard_address(),
        "silence_logs": logging.WARNING,
    }
    opts.update(kwargs)
    if opts["processes"]:
        opts.setdefault("worker_class", EmbeddedNanny)
    # The workers are handed this config when they start. It quiets the periodic work
    # of their event loops, which competes for the GIL with the envs' stepping thread
    # (what an idle worker's loop costs with and without it: docs/benchmark.md), and
    # preloads the set-up that keeps them quiet in the user's terminal.
    preload = [*(dask.config.get("distributed.worker.preload", None) or []), EMBEDDED_PRELOAD]
    install_dashboard_page()  # the scheduler about to start serves the daskvec page
    before = set(SpecCluster._instances)
    try:
        with dask.config.set({**EMBEDDED_WORKER_CONFIG, "distributed.worker.preload": preload}):
            cluster = EmbeddedCluster(**opts)
    except BaseException:  # Ctrl-C in the first seconds, or a start that failed
        _stop_half_started([c for c in list(SpecCluster._instances) if c not in before])
        raise
    cluster.quiet_dashboard()
    return cluster


def _stop_half_started(clusters: list[Any], grace: float = 5.0) -> None:
    """Stop clusters whose start was interrupted, and take them from Dask's exit hook.

    Dask's ``close_clusters`` (at interpreter exit) would close them again and, with a
    nanny still starting, print an ``AssertionError: Status.init`` traceback under the
    user's ``KeyboardInterrupt``; a worker process spawned as the start was cut could
    outlive the script. So: close within ``grace`` seconds if the cluster lets itself be
    closed, then kill whatever worker process is left.
    """
    for cluster in clusters:
        SpecCluster._instances.discard(cluster)
        _drop_failed_starts(cluster)
        with contextlib.suppress(BaseException):
            cluster.close(timeout=grace)
        for nanny in list(getattr(cluster, "workers", {}).values()):
            pid = getattr(getattr(getattr(nanny, "process", None), "process", None), "pid", None)
            if pid:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def _drop_failed_starts(cluster: Any) -> None:
    """Keep a nanny's start, failed because Ctrl-C reached its worker process too, out of the user's terminal.

    The cluster's start awaits its nannies' starts; cut short, it never retrieves their
    outcome, and asyncio prints each failed one ("Task exception was never retrieved ...
    Nanny failed to start worker process") when the task is collected, under the user's
    ``KeyboardInterrupt``. Only those records of this cluster's event loop are dropped
    (one DEBUG line each); anything else goes to the loop's default handler.
    """
    loop = getattr(getattr(cluster, "loop", None), "asyncio_loop", None)
    if loop is None:
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") == "Task exception was never retrieved" and "failed to start" in str(exc):
            logger.debug("a worker's start cut short by Ctrl-C: %s", exc)
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


#: The longest the embedded cluster's nanny waits for its worker process to exit on close
#: before killing it. The wait ends as soon as the process exits (1-2 s on a quiet
#: machine); a process that is still working on its exit (an interpreter with torch
#: imported tears down for seconds of CPU) is waited for up to this bound, however
#: loaded the machine: on a loaded one, its share of a CPU is what makes it slow, and
#: Dask's fixed wait (0.8 of its close timeout) then kills it with a warning in the
#: user's terminal. A process that makes no progress is killed sooner (:data:`WORKER_STALL_S`).
WORKER_EXIT_S = 120.0
#: Seconds without CPU time spent by a closing worker process after which it counts as
#: stuck (a deadlock, a wait on something gone) and is killed before :data:`WORKER_EXIT_S`.
#: It is long enough for a process that sleeps a little while it exits (a flush, a
#: join with a timeout) not to count as stuck.
WORKER_STALL_S = 20.0
#: Seconds between two reads of a closing worker process's CPU time.
_STALL_POLL_S = 1.0


class EmbeddedNanny(Nanny):
    """The embedded cluster's nanny: it waits for its worker process to exit as long as it makes progress.

    Dask's nanny kills a worker process still alive after 0.8 of its close timeout, with
    a warning; this one waits up to :data:`WORKER_EXIT_S` for a process that is still
    working on its exit, and kills one that has made no progress (spent no CPU time) for
    :data:`WORKER_STALL_S`, with one line of its own saying so.
    """

    async def close(self, timeout: float | None = None, reason: str = "nanny-close") -> Any:
        """Close the worker process: ``Nanny.close`` with a wait of :data:`WORKER_EXIT_S` (``timeout`` is ignored)."""
        # Dask waits 0.8 * timeout before its kill: that wait is the bound, the stall watch (kill) ends it sooner
        return await super().close(timeout=WORKER_EXIT_S / 0.8, reason=reason)

    async def kill(self, timeout: float = WORKER_EXIT_S / 0.8, reason: str = "nanny-kill") -> None:
        """``Nanny.kill``, while a watch kills a worker process that makes no progress towards its exit."""
        pid = self.pid
        watch = asyncio.create_task(_kill_when_stalled(pid, str(self.worker_address))) if pid else None
        try:
            await super().kill(timeout=timeout, reason=reason)
        finally:
            if watch is not None:
                watch.cancel()


async def _kill_when_stalled(pid: int, worker: str, stall_s: float = WORKER_STALL_S) -> None:
    """SIGKILL process ``pid`` once it has spent no CPU time for ``stall_s`` seconds (it then counts as stuck)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        spent = sum(proc.cpu_times()[:2])
        idle_since = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(_STALL_POLL_S)
            now, cpu = asyncio.get_running_loop().time(), sum(proc.cpu_times()[:2])
            if cpu > spent:
                spent, idle_since = cpu, now
            elif now - idle_since >= stall_s:
                logger.warning(
                    "the worker process of %s made no progress towards its exit for %.0f s: killed", worker, stall_s
                )
                proc.kill()
                return
    except psutil.Error:  # it exited (or is a zombie the nanny is about to reap): nothing to watch
        return


class _ClosedTabNoise(logging.Filter):
    """Drops the tracebacks Tornado logs when a browser tab of one dashboard closes its websocket.

    Bokeh's websocket handler (``/status/ws``, ``/daskvec/ws``, ...) can raise while its
    connection closes, e.g. an ``AssertionError`` when its session is already gone;
    Tornado logs each as a 20-line "Uncaught exception GET .../ws" error, in the
    process that runs the scheduler: for the embedded cluster, the user's. Only those
    records of the dashboard on ``port`` are dropped (one DEBUG line of daskvec's each).
    """

    def __init__(self, port: int) -> None:
        from tornado.iostream import StreamClosedError
        from tornado.websocket import WebSocketClosedError

        super().__init__()
        self.port = port
        self.exceptions = (AssertionError, StreamClosedError, WebSocketClosedError)

    def filter(self, record: logging.LogRecord) -> bool:
        """``False`` for a closed-tab record of this dashboard's websockets, ``True`` for anything else."""
        request = record.args[1] if isinstance(record.args, tuple) and len(record.args) > 1 else None
        exc = record.exc_info[1] if record.exc_info else None
        if (
            not str(record.msg).startswith("Uncaught exception")
            or not isinstance(exc, self.exceptions)
            or not str(getattr(request, "path", "")).endswith("/ws")
            or not str(getattr(request, "host", "")).endswith(f":{self.port}")
        ):
            return True
        logger.debug("a dashboard tab closed its websocket %s (%s)", getattr(request, "path", ""), type(exc).__name__)
        return False


class EmbeddedCluster(LocalCluster):
    """The ``LocalCluster`` that daskvec starts itself (:func:`embedded_cluster`).

    Its workers are :class:`EmbeddedNanny` processes preloaded with
    :mod:`daskvec.worker.preload` (they ignore Ctrl-C, which is the user's process's
    to handle, and leave an env factory's error to the client to report). While it
    runs, the tracebacks of closed dashboard tabs are dropped from the user's log
    (:meth:`quiet_dashboard`).
    """

    _tab_noise: _ClosedTabNoise | None = None

    def quiet_dashboard(self) -> None:
        """Drop Tornado's closed-tab tracebacks of this cluster's dashboard until it closes."""
        port = (self.scheduler_info.get("services") or {}).get("dashboard")
        if port and self._tab_noise is None:
            self._tab_noise = _ClosedTabNoise(int(port))
            logging.getLogger("tornado.application").addFilter(self._tab_noise)

    async def _close(self) -> None:
        try:
            await super()._close()
        finally:
            if self._tab_noise is not None:
                logging.getLogger("tornado.application").removeFilter(self._tab_noise)


#: The Dask preload module of the embedded cluster's workers.
EMBEDDED_PRELOAD = "daskvec.worker.preload"


def check_main_guard() -> None:
    """Refuse to start worker processes from code that every worker process would run again.

    Dask starts worker processes with multiprocessing's ``spawn`` (its default; also
    ``forkserver``), which imports the main script again in each of them. Started from
    the top level of that script, outside ``if __name__ == "__main__":``, every worker
    would run the same line and try to start a cluster of its own; multiprocessing
    refuses that, and the user gets several hundred lines of ``RuntimeError`` from
    every worker instead of one line saying what to add. This check reads the script
    (the line being run at its top level) before anything starts.

    Raises
    ------
    daskvec.errors.MissingMainGuardError
        Called from unguarded top-level code of the main script, or from a main script
        that has no file to import again (read from standard input).
    SystemExit
        In a spawned process importing the main script again, where the check in the
        user's process could not tell (e.g. a guard it took for one): the same message,
        once per worker, without a traceback.
    """
    import dask

    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return  # a forked worker does not import the script again
    path, child = _rerun_main_path(), getattr(multiprocessing.current_process(), "_inheriting", False)
    if path is not None and not os.path.isfile(path) and not child:
        raise MissingMainGuardError(  # a script read from standard input: spawn would import a file that is not there
            f"daskvec cannot start its embedded Dask cluster from a main script with no file ({path!r}, e.g. read from "
            "standard input): Dask starts its worker processes with spawn, which imports the main script again from "
            "its file. Save the script to a file and run that, or pass client= a cluster started elsewhere"
        )
    where = _unguarded_main_line()
    if child:
        # this process is a spawned child importing the main script: the guard is missing
        raise SystemExit(_main_guard_message(where or (_rerun_main_path() or "the main script", 0)))
    if where is not None:
        raise MissingMainGuardError(_main_guard_message(where))


def _main_guard_message(where: tuple[str, int]) -> str:
    script, line = where
    at = f"line {line} of {script}" if line else script
    return (
        f"daskvec would start its embedded Dask cluster from {at}, at the top level of the script: "
        "Dask's worker processes import the script again when they start, and would each run that line too. "
        'Put the code that creates the vec env under `if __name__ == "__main__":` (as multiprocessing and '
        "SubprocVecEnv require), or pass client= a cluster started elsewhere"
    )


def _rerun_main_path() -> str | None:
    """The file that multiprocessing's ``spawn`` imports again in a child (``spawn.get_preparation_data``)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path:
        return None  # an interactive session, a notebook, ``python -c``: nothing is imported again
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return None  # ``python -m package``: the package's __main__ is not run again
    if os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None
    return str(path)


def _unguarded_main_line() -> tuple[str, int] | None:
    """``(script, line)`` when this call comes from a top-level line of the main script outside ``if __name__ ...``.

    ``None`` when it does not, or when that cannot be told (no such frame on this
    thread's stack, a script that cannot be read or parsed). An ``if`` whose test
    names ``__name__`` counts as the guard.
    """
    path = _rerun_main_path()
    main = sys.modules.get("__main__")
    if path is None or main is None:
        return None
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    for stmt in tree.body:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            guarded = isinstance(stmt, ast.If) and any(
                isinstance(node, ast.Name) and node.id == "__name__" for node in ast.walk(stmt.test)
            )
            return None if guarded else (path, line)
    return None


#: Dask config of the embedded cluster's workers (see :func:`embedded_cluster`). Actor
#: methods never appear in Dask's profiles, so sampling them every 10 ms buys nothing;
#: on CPython 3.11 the sampling can also deadlock a worker while an env group starts its
#: threads (see :func:`daskvec.worker.profiler_hazard`).
EMBEDDED_WORKER_CONFIG: dict[str, Any] = {
    "distributed.worker.profile.enabled": False,
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.admin.tick.interval": "200ms",
}
