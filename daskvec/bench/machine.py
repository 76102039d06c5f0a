"""Describe the machine and the software a benchmark ran on."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["load_average", "machine_info"]


_PACKAGES = (
    "daskvec",
    "dask",
    "distributed",
    "stable-baselines3",
    "gymnasium",
    "numpy",
    "torch",
    "cloudpickle",
    "tornado",
    "bokeh",
    "psutil",
    "matplotlib",
    "ale-py",
    "mujoco",
    "envpool",
)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _autogroup() -> bool | None:
    """Whether Linux shares a busy CPU per session first (``sched_autogroup``: a vec env of many processes
    then gets one session's part), ``None`` if unknown."""
    with contextlib.suppress(OSError, ValueError):
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    return None


def _git_commit() -> str | None:
    git, here = shutil.which("git"), Path(__file__).resolve().parent
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if git is not None:
            out = subprocess.run(
                [git, "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
            )
            return out.stdout.strip() or None if out.returncode == 0 else None
    return None


def wait_idle(max_wait: float, busy_share: float = 0.15) -> tuple[float, bool]:
    """Wait until at most ``busy_share`` of this process's CPUs are busy (0.5 s samples), for at most ``max_wait`` s.

    Run before each vec env is measured, so that none is measured on a busy machine (say, while
    SubprocVecEnv's 64 processes exit). Only the CPUs of this process's affinity count.
    Returns the seconds waited and whether the CPUs were found idle; ``max_wait`` <= 0
    returns ``(0.0, True)`` at once, without a sample.
    """
    import psutil

    if max_wait <= 0:
        return 0.0, True
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    started = time.monotonic()
    while True:
        per_cpu = psutil.cpu_percent(interval=0.5, percpu=True)
        mine = [per_cpu[c] for c in cpus if c < len(per_cpu)] if cpus else per_cpu
        if sum(mine) / max(len(mine), 1) <= busy_share * 100:
            return time.monotonic() - started, True
        if time.monotonic() - started >= max_wait:
            return time.monotonic() - started, False


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages, ``None`` where the OS has none."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def machine_info() -> dict[str, Any]:
    """Describe the machine and software a benchmark ran on.

    Returns
    -------
    dict
        CPU model, logical/physical/usable cores, memory, OS, Python, load average,
        whether the kernel shares the CPU per session (``autogroup``), package
        versions and the daskvec git commit (when run from a checkout).
    """
    import psutil

    versions: dict[str, str | None] = dict.fromkeys(_PACKAGES)
    for name in _PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return {
        "cpu": _cpu_model(),
        "cores_logical": os.cpu_count(),
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_usable": _usable_cores(),
        "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": load_average(),
        "autogroup": _autogroup(),
        "packages": versions,
        "daskvec_commit": _git_commit(),
    }
