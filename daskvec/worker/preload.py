"""Set-up of the embedded cluster's worker processes: a Dask preload module.

:func:`daskvec.cluster.clients.embedded_cluster` lists this module in its workers'
``distributed.worker.preload``, so that Dask calls :func:`dask_setup` in each worker
process as it starts (and again in any worker its nanny restarts). The embedded
cluster runs in the user's terminal, for the user's process alone, so its workers:

- ignore SIGINT. Ctrl-C sends it to the whole process group; the user's process is
  the one to handle it (one ``KeyboardInterrupt``), and the workers end when their
  nanny closes them or the user's process is gone. Without this, each worker prints a
  traceback of its own ``KeyboardInterrupt``. Env processes started by a worker
  (``env_process=True``) inherit the ignored signal.
- leave an env factory's error to the client. Dask logs every task that raises as a
  "Compute Failed" block with the repr'd traceback; for an env group's actor that is
  the factory's error, which the client raises itself, with its own type, the envs
  it concerns and the remote traceback. When the client then closes the cluster while
  another group is still being built, Dask warns that the group's task was cancelled;
  that is dropped too. Other tasks are still logged.
- say nothing of a heartbeat cut short by their own close. When the user's process ends
  (Ctrl-C, a crash), its workers close; a heartbeat in flight then fails with
  "ConnectionPool closing", which Dask logs as an error with three chained tracebacks
  in the user's terminal. A heartbeat that fails while the worker runs is still logged.

A cluster of the user's own is left as it is: this module is only preloaded by the
embedded cluster.
"""

from __future__ import annotations

import logging
import signal
import threading
import weakref
from typing import Any

from daskvec.protocol.messages import GROUP_KEY_PREFIX

__all__ = ["ClosingHeartbeat", "GroupBuildFailures", "dask_setup"]


class GroupBuildFailures(logging.Filter):
    """Drops Dask's records of env-group actors that failed or were cancelled while being built.

    The client reports a factory's error itself, and cancels the other groups' builds
    when it gives up; Dask's "Compute Failed" block (``distributed.worker``) and its
    "Async instruction ... ended with CancelledError" (``distributed.worker.state_machine``,
    a build cancelled by the worker's close) say nothing more.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """``False`` for those records of a daskvec env group, ``True`` for any other record."""
        message = str(record.msg)
        if message.startswith("Compute Failed"):
            key = record.args[0] if isinstance(record.args, tuple) and record.args else None
            return not str(key).startswith(GROUP_KEY_PREFIX)
        if message.startswith("Async instruction for") and message.endswith("ended with CancelledError"):
            return f"execute('{GROUP_KEY_PREFIX}" not in message
        return True


class ClosingHeartbeat(logging.Filter):
    """Drops Dask's "Failed to communicate with scheduler during heartbeat" once its worker is closing.

    Parameters
    ----------
    worker : distributed.Worker
        The worker of this process (held weakly: the filter outlives it on the logger).
    """

    def __init__(self, worker: Any) -> None:
        super().__init__()
        self._worker = weakref.ref(worker)

    def filter(self, record: logging.LogRecord) -> bool:
        """``False`` for a failed heartbeat of a worker that is closing or closed, ``True`` otherwise."""
        if not str(record.msg).startswith("Failed to communicate with scheduler during heartbeat"):
            return True
        from distributed.core import Status

        worker = self._worker()
        return worker is not None and worker.status in (Status.running, Status.paused)


#: The loggers whose records of env-group builds :class:`GroupBuildFailures` drops.
_LOGGERS = ("distributed.worker", "distributed.worker.state_machine")


def dask_setup(worker: Any) -> None:
    """Called by Dask in each embedded worker process as it starts (see the module's docstring)."""
    if threading.current_thread() is threading.main_thread():  # where Python handles signals
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in _LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, GroupBuildFailures) for f in log.filters):
            log.addFilter(GroupBuildFailures())
    heartbeats = logging.getLogger("distributed.worker")
    for old in [f for f in heartbeats.filters if isinstance(f, ClosingHeartbeat)]:
        heartbeats.removeFilter(old)  # a worker this process ran before (the filter holds one worker)
    heartbeats.addFilter(ClosingHeartbeat(worker))
