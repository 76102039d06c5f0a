"""Worker-side probes: what a group learns about the worker process it runs in.

The current Dask worker, the interface and directory its direct channel should use,
when the worker is expected to leave (``--lifetime``, a SLURM job's end), whether
Dask's profiler can deadlock it, and whether it still holds a group's actor.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Hashable
from datetime import datetime
from typing import Any

__all__ = [
    "WORKER_LOCAL_DIR",
    "WorkerLocalDir",
    "actor_key",
    "current_worker",
    "holds_actor",
    "listen_host",
    "listen_ssl_context",
    "profiler_hazard",
    "unix_dir",
    "worker_deadline",
]


def current_worker() -> Any:
    """The Dask worker this code runs in, or ``None`` outside a worker."""
    try:
        from distributed import get_worker

        return get_worker()
    except ValueError:
        return None


def actor_key(worker: Any) -> Hashable | None:
    """The key of the task running on this thread of ``worker`` (an actor being built); ``None`` outside a task."""
    if worker is None:
        return None
    try:
        key: Hashable = worker.get_current_task()
    except (AttributeError, KeyError):  # not a task's thread
        return None
    return key


def holds_actor(worker: Any, key: Hashable) -> bool:
    """Whether ``worker`` still holds the actor ``key`` (from the start of its constructor on).

    Dask forgets an actor's key when its future is released: its client cancelled it
    (after giving the group up) or is gone. A worker without ``state.actors`` (another
    Dask) is taken to hold it, so that nothing is released by mistake. A dict lookup:
    cheap enough to ask every second.
    """
    try:
        return key in worker.state.actors
    except AttributeError:
        return True


def profiler_hazard(worker: Any) -> bool:
    """Whether ``worker`` samples thread stacks on a Python that can deadlock doing so.

    On CPython 3.11 ``sys._current_frames()``, which Dask's worker profiler calls every
    few milliseconds while a task runs, can deadlock the whole process against a thread
    that starts or ends at the same moment (python/cpython#106883; not seen on 3.12).
    An env group starts threads when it is created, so such a worker can freeze while
    envs are placed on it or moved to it.
    """
    callbacks = getattr(worker, "periodic_callbacks", None) or {}
    return sys.version_info < (3, 12) and "profile" in callbacks


def _slurm_end_time() -> float | None:
    job = os.environ.get("SLURM_JOB_ID")
    squeue = shutil.which("squeue")
    if not job or not squeue:
        return None
    try:
        out = subprocess.run(
            [squeue, "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        if not out or out in ("N/A", "NONE", "Unknown"):
            return None
        return datetime.fromisoformat(out).timestamp()
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def worker_deadline(worker: Any) -> float | None:
    """Wall-clock time (epoch seconds) at which this worker is expected to go away.

    The earlier of the worker's ``--lifetime`` (counted from the process start) and,
    inside a SLURM job, the job's end time. ``None`` when neither is known.
    """
    deadlines: list[float] = []
    lifetime = getattr(worker, "lifetime", None)
    if lifetime:
        try:
            import psutil

            started = psutil.Process().create_time()
        except Exception:  # psutil missing or process gone: fall back to now
            started = time.time()
        deadlines.append(started + float(lifetime))
    slurm = _slurm_end_time()
    if slurm is not None:
        deadlines.append(slurm)
    return min(deadlines) if deadlines else None


def listen_host(worker: Any) -> str:
    """Host of the worker's own listening address; loopback for in-process workers."""
    address = getattr(worker, "address", None)
    if not address or "://" not in address:
        return "127.0.0.1"
    from distributed.comm import get_address_host

    scheme = address.split("://", 1)[0]
    if scheme not in ("tcp", "tls", "ws", "wss"):
        return "127.0.0.1"
    return str(get_address_host(address))


class WorkerLocalDir:
    """Default of ``EnvGroup(unix_dir=...)``: the worker's local directory (see :func:`unix_dir`)."""

    def __repr__(self) -> str:
        return "<the worker's local directory>"


WORKER_LOCAL_DIR = WorkerLocalDir()


def unix_dir(worker: Any) -> str:
    """The worker's local directory (Dask removes it after the worker), else the temp dir."""
    directory = getattr(worker, "local_directory", None)
    return str(directory) if directory and os.path.isdir(directory) else tempfile.gettempdir()


# --------------------------------------------------------------------------- env process
#: Seconds the env process gets to close its envs when asked to stop, before it is killed.
_STOP_GRACE_S = 5.0
#: Seconds between two reads of the env process's step figures, for the worker's metrics.
_STATS_INTERVAL_S = 1.0


def listen_ssl_context(worker: Any, security: Any = None) -> Any:
    """A server-side TLS context for a group's channel, from the worker's own certificates.

    Parameters
    ----------
    worker : distributed.Worker or None
        The worker whose ``security`` to use (``get_listen_args("worker")``, mutual TLS
        as Dask's own comms).
    security : distributed.security.Security, optional
        Use this instead (an env process has no worker of its own).

    Raises
    ------
    RuntimeError
        When there is no certificate to listen with.
    """
    security = security if security is not None else getattr(worker, "security", None)
    context = None if security is None else security.get_listen_args("worker").get("ssl_context")
    if context is None:
        where = getattr(worker, "address", "this process")
        raise RuntimeError(
            f"the client asked for an encrypted direct channel, but worker {where} has no TLS certificate "
            "(start it with --tls-ca-file, --tls-cert and --tls-key, or set distributed.comm.tls in its "
            "Dask config); or pass transport='actor'"
        )
    return context
