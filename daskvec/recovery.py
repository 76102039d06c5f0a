"""Planning for fault tolerance: where envs go when groups are rebalanced or moved.

:class:`~daskvec.DaskVecEnv` rebuilds env groups in three situations: their worker
was lost or hung (see ``DaskVecEnv._handle_lost``), their worker is about to leave
(``migrate_before``), or workers joined and the envs are spread again
(:meth:`~daskvec.DaskVecEnv.rebalance`). This module holds the pure planning part of
the last two, so that it can be reasoned about (and tested) without a cluster: it
only sees which envs each group holds and on which worker.

The invariant every plan keeps: the envs of the groups it tears down are exactly the
envs of the groups it creates, each once. :func:`check_plan` enforces it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

__all__ = ["MovePlan", "check_plan", "plan_rebalance"]


@dataclass
class MovePlan:
    """Which groups to tear down and which groups to create in their place.

    Attributes
    ----------
    old : list of int
        Positions (in the list given to the planner) of the groups to tear down.
    layout : list of (list of int, str)
        The groups to create: env indices and the worker for each.
    """

    old: list[int] = field(default_factory=list)
    layout: list[tuple[list[int], str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.old)

    @property
    def moved_envs(self) -> int:
        """How many envs the plan rebuilds."""
        return sum(len(indices) for indices, _ in self.layout)


def check_plan(groups: Sequence[tuple[Sequence[int], str]], plan: MovePlan) -> None:
    """Raise ``RuntimeError`` if ``plan`` would lose or duplicate an env.

    Parameters
    ----------
    groups : sequence of (env indices, worker)
        The current groups, as given to the planner.
    plan : MovePlan
        The plan to check.
    """
    before = sorted(i for pos in plan.old for i in groups[pos][0])
    after = sorted(i for indices, _ in plan.layout for i in indices)
    if before != after or len(set(after)) != len(after):
        raise RuntimeError(f"daskvec internal error: a move plan would turn envs {before} into {after}")


def _chunks(indices: list[int], size: int | None) -> list[list[int]]:
    if not size:
        return [indices]
    return [indices[k : k + size] for k in range(0, len(indices), size)]


def plan_rebalance(
    groups: Sequence[tuple[Sequence[int], str]],
    workers: Sequence[str],
    envs_per_actor: int | None = None,
) -> MovePlan:
    """Plan the moves that spread envs as evenly as possible over ``workers``.

    Each worker's target is ``n_envs // len(workers)`` envs, plus one for the
    ``n_envs % len(workers)`` workers that hold the most envs now (so that as few
    envs as possible move). Workers holding groups but absent from ``workers`` (for
    instance about to reach their walltime) get a target of zero. Whole groups are
    moved when they fit in a worker's surplus; otherwise one group is split, and its
    remaining envs are rebuilt in place.

    Parameters
    ----------
    groups : sequence of (env indices, worker)
        The current groups.
    workers : sequence of str
        Workers that may hold envs.
    envs_per_actor : int, optional
        Maximum size of a created group; ``None`` makes one group per destination.

    Returns
    -------
    MovePlan
        Empty (falsy) when the envs are already balanced (no worker holds more
        than one env above another), or when there is no worker.
    """
    if not workers or not groups:
        return MovePlan()
    n_envs = sum(len(indices) for indices, _ in groups)
    load: dict[str, int] = dict.fromkeys(workers, 0)
    for indices, w in groups:
        load[w] = load.get(w, 0) + len(indices)
    eligible = list(workers)
    if all(w in load for w in eligible) and all(w in eligible for w in load):
        spread = max(load.values()) - min(load.values())
        if spread <= 1:
            return MovePlan()
    base, extra = divmod(n_envs, len(eligible))
    by_load = sorted(eligible, key=lambda w: (-load[w], eligible.index(w)))
    target = {w: base + (1 if k < extra else 0) for k, w in enumerate(by_load)}
    for w in load:
        target.setdefault(w, 0)

    plan = MovePlan()
    outgoing: list[int] = []
    for w in sorted(load, key=lambda a: -load[a]):
        surplus = load[w] - target[w]
        if surplus <= 0:
            continue
        mine = sorted((pos for pos, (_, gw) in enumerate(groups) if gw == w), key=lambda p: -len(groups[p][0]))
        for pos in mine:
            size = len(groups[pos][0])
            if size <= surplus:
                plan.old.append(pos)
                outgoing.extend(groups[pos][0])
                surplus -= size
        if surplus > 0:
            # split the smallest group larger than the remaining surplus
            pos = min((p for p in mine if p not in plan.old), key=lambda p: len(groups[p][0]))
            indices = list(groups[pos][0])
            keep, move = indices[:-surplus], indices[-surplus:]
            plan.old.append(pos)
            plan.layout.extend((chunk, w) for chunk in _chunks(keep, envs_per_actor))
            outgoing.extend(move)
    for w in eligible:
        need = target[w] - load.get(w, 0)
        if need <= 0:
            continue
        take, outgoing = outgoing[:need], outgoing[need:]
        if take:
            plan.layout.extend((sorted(chunk), w) for chunk in _chunks(sorted(take), envs_per_actor))
    if outgoing:  # cannot happen when targets add up; keep the envs rather than lose them
        raise RuntimeError(f"daskvec internal error: envs {outgoing} have no destination in a rebalance plan")
    plan.old.sort()
    check_plan(groups, plan)
    return plan
