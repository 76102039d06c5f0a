"""Describe the machine and the software a benchmark ran on."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["machine_info"]


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
    """Whether Linux shares the CPU between sessions first (``sched_autogroup``), ``None`` if unknown.

    With it, every process of one terminal session (a benchmark and all the workers and
    subprocesses it starts) shares one session's part of a busy machine: a vec env of
    many processes then gets no more CPU than a single process would.
    """
    with contextlib.suppress(OSError, ValueError):
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    return None


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    git = shutil.which("git")
    if git is None:
        return None
    try:
        out = subprocess.run([git, "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


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

    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "cpu": _cpu_model(),
        "cores_logical": os.cpu_count(),
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_usable": _usable_cores(),
        "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": load,
        "autogroup": _autogroup(),
        "packages": versions,
        "daskvec_commit": _git_commit(),
    }
