"""Which processes hold a vec env's groups, for tests that kill or inspect them."""

from __future__ import annotations

from typing import Any

from daskvec import DaskVecEnv


def group_pids(env: DaskVecEnv) -> dict[int, list[int]]:
    """Process id of the worker holding each group -> env indices held there."""
    out: dict[int, list[int]] = {}
    for g in env._groups:
        out.setdefault(g.desc.pid, []).extend(g.env_indices)
    return out


def process_of(procs: Any, pid: int) -> Any:
    (p,) = [p for p in procs.workers if p.pid == pid]
    return p
