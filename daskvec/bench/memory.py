"""Memory probes: the client process, the processes a vec env added, and Dask workers' own.

:func:`process_memory` runs on Dask workers (through ``client.run``), so this module
imports only the standard library at import time (psutil inside the functions).
"""

from __future__ import annotations

import contextlib
import logging
import platform
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["process_memory"]


_MB = 1024.0 * 1024.0


def _proc_memory(proc: Any) -> dict[str, Any]:
    """RSS and USS (MB) of a ``psutil.Process``; USS falls back to RSS when unreadable."""
    import psutil

    try:
        full = proc.memory_full_info()
        rss, uss = full.rss, getattr(full, "uss", full.rss)
    except (psutil.AccessDenied, psutil.ZombieProcess):
        rss = uss = proc.memory_info().rss
    return {"pid": proc.pid, "rss_mb": rss / _MB, "uss_mb": uss / _MB}


def process_memory() -> dict[str, Any]:
    """Memory of the calling process and, under ``"children"``, of its child processes
    (run on Dask workers through ``client.run``: the children are the env processes)."""
    import psutil

    me = psutil.Process()
    out = _proc_memory(me)
    out["host"] = platform.node()
    children = []
    for child in me.children():
        with contextlib.suppress(psutil.Error):
            children.append(_proc_memory(child))
    out["children"] = children
    return out


def _mp_helper_pids() -> set[int]:
    """PIDs of multiprocessing's long-lived helpers (forkserver, resource tracker)."""
    with contextlib.suppress(Exception):
        from multiprocessing import forkserver, resource_tracker

        pids = (forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid)  # type: ignore[attr-defined]
        return {int(pid) for pid in pids if pid}
    return set()


def _descendants() -> dict[int, Any]:
    import psutil

    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


class _MemoryProbe:
    """Client memory before construction and the processes a vec env added."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.before = set(_descendants())
        self.client_before = _proc_memory(self.proc)

    def new_processes(self) -> dict[int, Any]:
        helpers = _mp_helper_pids()
        return {pid: p for pid, p in _descendants().items() if pid not in self.before and pid not in helpers}

    def measure(self, kind: str, env: Any, n_envs: int) -> dict[str, Any]:
        """Memory after stepping: client, env-holding processes and helpers, per env."""
        import psutil

        client = _proc_memory(self.proc)
        env_pids = {int(p.pid) for p in getattr(env, "processes", []) if p.pid} if kind in ("subproc", "async") else ()
        procs: list[dict[str, Any]] = []
        seen: set[int] = set()
        local_host = platform.node()
        if kind in ("dask", "dask-envpool"):
            workers = sorted({g["worker"] for g in env.groups})
            try:
                remote = env.client.run(process_memory, workers=workers)
            except Exception as e:  # memory is a report, not a reason to fail the run
                logger.warning("could not read worker memory: %s", e)
                remote = {}
            for addr, m in sorted(remote.items()):
                children = m.pop("children", [])
                procs.append({**m, "role": "worker", "worker": addr})
                procs.extend({**c, "role": "env process", "worker": addr} for c in children)
                if m.get("host") == local_host:
                    seen.update(int(x["pid"]) for x in [m, *children])
        for pid, p in sorted(self.new_processes().items()):
            with contextlib.suppress(psutil.Error):
                if pid not in seen:
                    procs.append({**_proc_memory(p), "role": "env process" if pid in env_pids else "helper"})
        if kind == "subproc":  # SubprocVecEnv's forkserver is part of its cost
            for pid in _mp_helper_pids():
                with contextlib.suppress(psutil.Error):
                    procs.append({**_proc_memory(psutil.Process(pid)), "role": "helper"})
        holders = [p for p in procs if p["role"] in ("worker", "env process")]
        helpers = [p for p in procs if p["role"] == "helper"]
        delta = client["uss_mb"] - self.client_before["uss_mb"]
        env_uss = sum(p["uss_mb"] for p in holders)
        helper_uss = sum(p["uss_mb"] for p in helpers)
        n = max(1, n_envs)
        return {
            "client_rss_mb": client["rss_mb"],
            "client_uss_mb": client["uss_mb"],
            "client_delta_uss_mb": delta,
            "env_processes": len(holders),
            "env_processes_uss_mb": env_uss,
            "helpers_uss_mb": helper_uss,
            "processes": procs,
            "client_per_env_mb": max(0.0, delta) / n,
            "env_processes_per_env_mb": env_uss / n,
            "per_env_mb": (max(0.0, delta) + env_uss + helper_uss) / n,
        }

    def leftovers(self, timeout: float = 15.0) -> int:
        """Wait up to ``timeout`` for the processes the vec env started to exit; count the rest."""
        import psutil

        procs = list(self.new_processes().values())
        if not procs:
            return 0
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if alive:
            logger.warning("%d processes still running after close: %s", len(alive), [p.pid for p in alive])
        return len(alive)
