"""Recovery: lost groups, moves, rebalancing, and the ledger of every restart.

:class:`~daskvec.DaskVecEnv` rebuilds env groups in four situations: their worker was
lost or hung (:meth:`Recovery.handle_lost`), their worker is about to leave
(``migrate_before``), workers joined and the envs are spread again
(:meth:`~daskvec.DaskVecEnv.rebalance`), or an env raised and was rebuilt by its own
group (``on_env_error="restart"``, counted here). :class:`Recovery` does the rebuilding
through the pool and returns :class:`Rebuild` records; it never touches the step
buffers, which turn the records into truncations (:mod:`daskvec.sb3.buffers`).
:class:`RestartLedger` is the one owner of restart counts, seeds and the restart log.

The planning of moves is pure (:func:`plan_rebalance`), so that it can be reasoned
about and tested without a cluster: it only sees which envs each group holds and on
which worker. The invariant every plan keeps: the envs of the groups it tears down are
exactly the envs of the groups it creates, each once. :func:`check_plan` enforces it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from daskvec._core import dask_internals as _dask
from daskvec._core.directory import Layout, WorkerDirectory
from daskvec._core.handles import Group, WorkerFrozen
from daskvec._core.options import Options
from daskvec._core.pool import GroupPool
from daskvec.errors import StepTimeoutError, WorkerLostError
from daskvec.protocol.messages import Command, ResetReply, restart_seed, unwrap

logger = logging.getLogger(__name__)

__all__ = ["MovePlan", "Rebuild", "Recovery", "RestartLedger", "check_plan", "plan_rebalance"]


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
    whole_groups: bool = False,
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
    whole_groups : bool
        Groups cannot be split or merged (each is one vectorized env): only whole groups
        move, while a move narrows the gap between the fullest and the emptiest worker
        (see :func:`_plan_whole`).

    Returns
    -------
    MovePlan
        Empty (falsy) when the envs are already balanced (no worker holds more
        than one env above another), or when there is no worker.
    """
    if not workers or not groups:
        return MovePlan()
    if whole_groups:
        return _plan_whole(groups, workers)
    targets = _targets(groups, workers)
    if targets is None:
        return MovePlan()
    load, target = targets
    plan = MovePlan()
    outgoing = _take_surplus(groups, load, target, plan, envs_per_actor)
    _place(outgoing, workers, load, target, plan, envs_per_actor)
    plan.old.sort()
    check_plan(groups, plan)
    return plan


def _targets(
    groups: Sequence[tuple[Sequence[int], str]], workers: Sequence[str]
) -> tuple[dict[str, int], dict[str, int]] | None:
    """Each worker's envs now and its target (:func:`plan_rebalance`); ``None`` when already balanced."""
    n_envs = sum(len(indices) for indices, _ in groups)
    load: dict[str, int] = dict.fromkeys(workers, 0)
    for indices, w in groups:
        load[w] = load.get(w, 0) + len(indices)
    eligible = list(workers)
    if all(w in load for w in eligible) and all(w in eligible for w in load):
        spread = max(load.values()) - min(load.values())
        if spread <= 1:
            return None
    base, extra = divmod(n_envs, len(eligible))
    by_load = sorted(eligible, key=lambda w: (-load[w], eligible.index(w)))
    target = {w: base + (1 if k < extra else 0) for k, w in enumerate(by_load)}
    for w in load:
        target.setdefault(w, 0)
    return load, target


def _take_surplus(
    groups: Sequence[tuple[Sequence[int], str]],
    load: dict[str, int],
    target: dict[str, int],
    plan: MovePlan,
    envs_per_actor: int | None,
) -> list[int]:
    """The envs that leave the workers above their target, the groups they leave added to ``plan``.

    Whole groups leave where they fit in a worker's surplus; otherwise the smallest group
    larger than what is left is split, and its remaining envs are rebuilt in place.
    """
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
    return outgoing


def _place(
    outgoing: list[int],
    workers: Sequence[str],
    load: dict[str, int],
    target: dict[str, int],
    plan: MovePlan,
    envs_per_actor: int | None,
) -> None:
    """Put the ``outgoing`` envs on the workers below their target, as new groups of ``plan``."""
    for w in workers:
        need = target[w] - load.get(w, 0)
        if need <= 0:
            continue
        take, outgoing = outgoing[:need], outgoing[need:]
        if take:
            plan.layout.extend((sorted(chunk), w) for chunk in _chunks(sorted(take), envs_per_actor))
    if outgoing:  # cannot happen when targets add up; keep the envs rather than lose them
        raise RuntimeError(f"daskvec internal error: envs {outgoing} have no destination in a rebalance plan")


def _plan_whole(groups: Sequence[tuple[Sequence[int], str]], workers: Sequence[str]) -> MovePlan:
    """:func:`plan_rebalance` for groups that move whole: greedy, each group at most once.

    Groups on workers absent from ``workers`` go to the emptiest eligible worker. Then,
    as long as moving a group from the fullest worker to the emptiest one leaves the
    emptiest below what the fullest held, the smallest such group moves.
    """
    load: dict[str, int] = dict.fromkeys(workers, 0)
    for indices, w in groups:
        if w in load:
            load[w] += len(indices)
    plan = MovePlan()
    dest: dict[int, str] = {}
    for pos in sorted(range(len(groups)), key=lambda p: -len(groups[p][0])):
        indices, w = groups[pos]
        if w not in load:
            dest[pos] = min(workers, key=lambda x: (load[x], workers.index(x)))
            load[dest[pos]] += len(indices)
    while True:
        full = max(workers, key=lambda x: (load[x], -workers.index(x)))
        empty = min(workers, key=lambda x: (load[x], workers.index(x)))
        movable = [
            p
            for p, (ind, w) in enumerate(groups)
            if p not in dest and w == full and load[empty] + len(ind) < load[full]
        ]
        if not movable:
            break
        pos = min(movable, key=lambda p: len(groups[p][0]))
        dest[pos] = empty
        load[full] -= len(groups[pos][0])
        load[empty] += len(groups[pos][0])
    plan.old = sorted(dest)
    plan.layout = [(sorted(groups[p][0]), dest[p]) for p in plan.old]
    check_plan(groups, plan)
    return plan


# --------------------------------------------------------------------------- restart ledger
class RestartLedger:
    """Every restart of every env: counts, seeds and the log.

    Attributes
    ----------
    restart_counts : numpy.ndarray
        How many times each env was rebuilt (lost worker, hang, move or env error).
    error_restarts : numpy.ndarray
        How many of those were caused by the env's own exceptions (they count against
        ``max_restarts`` wherever the env is rebuilt).
    log : list of dict
        One entry per rebuilt env: index, reason, worker, step (and ``from_worker``).
    base_seeds : list of int or None
        The seed the user last gave each env; restart seeds derive from it.
    """

    def __init__(self, n_envs: int) -> None:
        self.restart_counts = np.zeros(n_envs, dtype=np.int64)
        self.error_restarts = np.zeros(n_envs, dtype=np.int64)
        self.log: list[dict[str, Any]] = []
        self.base_seeds: list[int | None] = [None] * n_envs

    def set_seeds(self, seeds: Sequence[int | None]) -> None:
        """Remember the seeds the user gave (``None``: keep the previous one)."""
        for i, seed in enumerate(seeds):
            if seed is not None:
                self.base_seeds[i] = int(seed)

    def env_errors(self, group: Group, restarted: dict[int, dict[str, Any]], step: int) -> None:
        """Record the envs that ``group`` rebuilt after their errors (positions to markers)."""
        for pos in restarted:
            i = group.env_indices[pos]
            self.restart_counts[i] += 1
            self.error_restarts[i] += 1
            self.log.append({"env": i, "reason": "env_error", "worker": group.worker, "step": step})

    def next_seeds(self, indices: Sequence[int]) -> dict[int, int]:
        """Count one more rebuild of each env in ``indices``; return the seed each is reset with."""
        seeds = {}
        for i in indices:
            self.restart_counts[i] += 1
            seeds[i] = restart_seed(i, int(self.restart_counts[i]), self.base_seeds[i])
        return seeds

    def rebuilt(self, i: int, reason: str, from_worker: str, worker: str, seed: int, step: int) -> dict[str, Any]:
        """Log env ``i``'s rebuild on ``worker``; return the marker its infos carry."""
        self.log.append({"env": i, "reason": reason, "worker": worker, "from_worker": from_worker, "step": step})
        return {
            "restarted": True,
            "reason": reason,
            "from_worker": from_worker,
            "worker": worker,
            "restarts": int(self.restart_counts[i]),
            "seed": seed,
        }


# --------------------------------------------------------------------------- rebuilding
@dataclass
class Rebuild:
    """A group rebuilt in place of lost or moved envs: what the learner must be told.

    Attributes
    ----------
    group : Group
        The new group.
    reply : ResetReply
        Its envs' first observations and reset infos.
    markers : dict of int to dict
        By env index: the ``info["daskvec"]`` marker (reason, workers, seed).
    """

    group: Group
    reply: ResetReply
    markers: dict[int, dict[str, Any]]

    def moved(self, i: int) -> bool:
        """Whether env ``i`` was moved on purpose (its last step happened) rather than lost."""
        return self.markers[i]["reason"] == "moved"


#: Groups to tear down, and where their envs go.
Moves = tuple[list[Group], Layout]

#: Rebuild attempts before the envs count as lost for good.
_ATTEMPTS = 4

#: Seconds between two probes of the quarantined workers (:meth:`WorkerDirectory.probe_quarantined`).
PROBE_INTERVAL = 5.0

#: Seconds beyond ``timeout`` after which a worker list asked for a rebalance and never
#: answered (the client's event loop never ran the question) counts as a lost scheduler.
_CENSUS_GRACE = 5.0


class Recovery:
    """Rebuilds groups that were lost, hung or moved, and plans the moves.

    Parameters
    ----------
    pool : GroupPool
        The vec env's groups.
    directory : WorkerDirectory
        Where envs may go.
    ledger : RestartLedger
        Where the restarts are counted.
    options : Options
        Reads ``on_worker_lost``, the timeouts, ``env_process``, ``envs_per_actor``,
        ``auto_rebalance`` and ``rebalance_interval``.
    """

    def __init__(self, pool: GroupPool, directory: WorkerDirectory, ledger: RestartLedger, options: Options) -> None:
        self.pool = pool
        self.directory = directory
        self.ledger = ledger
        self.options = options
        self.steps = 0  # the vec env's step count, for the log
        self._moves: Moves | None = None
        self._next_migrate_check = 0.0
        self._last_rebalance_check = time.monotonic()
        # the scheduler's worker list, asked for the periodic rebalance and not read yet,
        # and by when it must have come (the stepping thread never waits for it)
        self._census: concurrent.futures.Future[dict[str, Any]] | None = None
        self._census_deadline = 0.0
        self._next_probe = 0.0  # when the quarantined workers are probed next
        # a quarantine ended: one rebalance is due, whatever auto_rebalance says (the envs were
        # taken off that worker by daskvec, not by the user)
        self._healed = False

    # ------------------------------------------------------------------ lost groups
    def handle_lost(self, lost: dict[Group, BaseException], waited: float) -> list[Rebuild]:
        """Rebuild the envs of ``lost`` groups elsewhere (``on_worker_lost="restart"``).

        Parameters
        ----------
        lost : dict of Group to exception
            Each lost group, and what its channel raised (``TimeoutError``: it hung).
        waited : float
            The timeout that expired, for the messages.

        Raises
        ------
        WorkerLostError, StepTimeoutError
            With ``on_worker_lost="raise"`` (the groups are torn down first), or when
            the envs could not be rebuilt anywhere.
        """
        reasons = {g: "timeout" if isinstance(exc, TimeoutError) else "worker_lost" for g, exc in lost.items()}
        if self.options.on_worker_lost == "raise":
            g, exc = next(iter(lost.items()))
            indices = sorted(i for x in lost for i in x.env_indices)
            self.pool.teardown(list(lost), graceful=False)
            cls = StepTimeoutError if reasons[g] == "timeout" else WorkerLostError
            what = f"did not answer within {waited:.1f}s" if cls is StepTimeoutError else f"was lost ({exc})"
            err = cls(f"the worker {g.worker} holding envs {indices} {what}", env_indices=indices, worker=g.worker)
            raise err from exc
        frozen: dict[str, str] = {}
        for g, exc in lost.items():
            if reasons[g] == "timeout" and not self.options.env_process:
                # the step is still running in that worker (a hung env holds a thread there)
                self.directory.quarantine(g.worker, f"left a step unanswered for {waited:.3g}s")
                if not isinstance(exc, WorkerFrozen):  # a real timeout, not one of the groups given up below
                    frozen.setdefault(g.worker, f"another env group on {g.worker} left a request unanswered")
            # the message, not the exception: a handler that keeps records (a notebook's, pytest's) would
            # keep its traceback's frames, and the replies and shared windows they hold
            if isinstance(exc, WorkerFrozen):
                why = "were given up (their worker left another group's request unanswered)"
            elif reasons[g] == "timeout":
                why = f"did not answer within {waited:.3g}s"
            else:
                why = f"were lost ({exc})"
            logger.warning("envs %s on worker %s %s; rebuilding them", g.env_indices, g.worker, why)
        for worker, why in frozen.items():
            # A frozen worker's other groups are frozen too: given up now, each costs nothing more
            # (its next request counts as lost at once and it is rebuilt then), where waiting for
            # each in turn would cost one step_timeout per group. With env_process=True a timeout
            # is one env process's, killed, and the worker's other groups go on.
            others = self.pool.doom(worker, why, spare=lost)
            if others:
                logger.warning(
                    "envs %s on worker %s are given up too: it left a step unanswered",
                    sorted(i for g in others for i in g.env_indices),
                    worker,
                )
        return self.relocate(list(lost), reasons)

    def relocate(self, old: list[Group], reasons: dict[Group, str], layout: Layout | None = None) -> list[Rebuild]:
        """Replace the ``old`` groups by new ones holding the same envs, reset with restart seeds.

        Parameters
        ----------
        old : list of Group
            Groups to tear down (gracefully when all of them are being moved).
        reasons : dict of Group to str
            ``"worker_lost"``, ``"timeout"`` or ``"moved"`` per group.
        layout : list of (env indices, worker), optional
            Where the envs go (must hold exactly the envs of ``old``); by default the
            old groups are placed again on the least-loaded live workers.
        """
        reason_of = {i: reasons[g] for g in old for i in g.env_indices}
        worker_of = {i: g.worker for g in old for i in g.env_indices}
        lost_workers = {g.worker for g in old if reasons[g] != "moved"}
        self.pool.teardown(old, graceful=all(reasons[g] == "moved" for g in old))
        if layout is not None and sorted(i for ind, _ in layout for i in ind) != sorted(reason_of):
            raise RuntimeError(f"daskvec internal error: relocating envs {sorted(reason_of)} with layout {layout}")
        if layout is None:
            env_groups = [list(g.env_indices) for g in old]
            # a worker that hung, or whose env process died, may be the only one left: then it is used again
            layout = self.directory.place(env_groups, self.pool.load(), lost_workers, lost_workers)
        seeds = self.ledger.next_seeds(sorted(reason_of))
        rebuilds: list[Rebuild] = []
        bad = set(lost_workers)
        for attempt in range(_ATTEMPTS):
            spawned = self.pool.spawn(layout, self.ledger, exclude=sorted(bad))
            requests: dict[Group, Any] = {}
            for g in spawned:  # restart seeds, which do not replace the user's seeds
                requests[g] = (Command.RESET, ([seeds[i] for i in g.env_indices], [None] * len(g.env_indices), False))
            replies = self.pool.call(requests, self.options.timeout)
            failed = [g for g in spawned if isinstance(replies[g], BaseException)]
            for g in spawned:
                if g not in failed:
                    markers = {
                        i: self.ledger.rebuilt(i, reason_of[i], worker_of[i], g.worker, seeds[i], self.steps)
                        for i in g.env_indices
                    }
                    rebuilds.append(Rebuild(g, unwrap(replies[g]), markers))
            if not failed:
                break
            lost_again = sorted(i for g in failed for i in g.env_indices)
            self.pool.teardown(failed, graceful=False)
            if attempt == _ATTEMPTS - 1:
                raise WorkerLostError(
                    f"the envs {lost_again} were lost again each time they were rebuilt ({_ATTEMPTS} times; the "
                    f"last time: {replies[failed[0]]}). An env that ends its process at reset (a simulator's "
                    "assertion, a window where there is no display) is lost wherever it goes: reset one in a "
                    "process of your own to see why",
                    env_indices=lost_again,
                    worker=failed[0].worker,
                )
            # the worker died again while the envs were being rebuilt: place them once more
            logger.warning(
                "envs %s were lost again while being rebuilt on %s; retrying",
                lost_again,
                sorted({g.worker for g in failed}),
            )
            bad |= {g.worker for g in failed}
            # as for the first placement: workers still alive (only an env process died) are used again
            # when no other is left, rather than waiting worker_wait_timeout for a new one
            layout = self.directory.place([list(g.env_indices) for g in failed], self.pool.load(), bad, bad)
        self.pool.groups.sort(key=lambda g: g.env_indices[0])
        logger.info("rebuilt envs %s on %s", sorted(reason_of), sorted({r.group.worker for r in rebuilds}))
        return rebuilds

    # ------------------------------------------------------------------ moves
    @property
    def moves_planned(self) -> bool:
        """Whether a rebalance was planned and not carried out yet."""
        return self._moves is not None

    @property
    def migration_due(self) -> bool:
        """Whether :meth:`migrate` may have something to do now (cheap: no scan of the groups, no scheduler call)."""
        if self._moves is not None:
            return True
        now = time.monotonic()
        if (self.options.auto_rebalance or self._healed) and self._rebalance_due(now):
            return True
        if self.directory.any_quarantined and now >= self._next_probe:
            return True
        return self.directory.any_deadline and now >= self._next_migrate_check

    def _rebalance_due(self, now: float) -> bool:
        """Whether the periodic rebalance should ask for the workers, or has their answer (or waited too long)."""
        if self._census is None:
            return now - self._last_rebalance_check > self.options.rebalance_interval
        return self._census.done() or now >= self._census_deadline

    def migrate(self, only: Collection[Group] | None = None) -> list[Rebuild]:
        """Carry out due moves: a planned rebalance, or groups near their worker's end.

        ``only``: move none but these groups (a partial batch moves only the groups it
        hands out, since others may have a step in flight); a planned rebalance that
        needs others waits.
        """
        now = time.monotonic()
        if self.directory.any_quarantined and now >= self._next_probe:
            self._next_probe = now + PROBE_INTERVAL
            if self.directory.probe_quarantined():
                # a healed worker is idle: spread the envs back onto it at the next census
                self._healed = True
                if self._census is None:
                    self._last_rebalance_check = -float("inf")
        if (self.options.auto_rebalance or self._healed) and self._rebalance_due(now):
            self._auto_rebalance()
        moves = self._moves
        if moves is not None and any(g not in self.pool.groups for g in moves[0]):
            moves = self._moves = None  # groups changed since the plan was made (e.g. a worker was lost): replan later
        if moves is not None and only is not None and any(g not in only for g in moves[0]):
            moves = None  # kept for a call that may move them all
        elif moves is not None:
            self._moves = None
        if moves is None and self.directory.any_deadline and time.monotonic() >= self._next_migrate_check:
            # scanned at most once a second: a deadline is learned when a group is placed
            self._next_migrate_check = time.monotonic() + 1.0
            now = time.time()
            candidates = self.pool.groups if only is None else [g for g in self.pool.groups if g in only]
            leaving = [g for g in candidates if self.directory.leaving(g.worker, now)]
            moves = self._plan_migration(leaving) if leaving else None
        if moves is None:
            return []
        old, layout = moves
        logger.info(
            "moving envs %s off %s", sorted(i for g in old for i in g.env_indices), sorted({g.worker for g in old})
        )
        return self.relocate(old, dict.fromkeys(old, "moved"), layout=layout)

    def _plan_migration(self, leaving: list[Group]) -> Moves | None:
        """Where to move groups whose worker leaves soon; ``None`` if no worker can take them yet."""
        staying = self.directory.receivers()
        if not staying:
            self._next_migrate_check = time.monotonic() + 5.0
            logger.warning(
                "envs %s are on workers that leave within %.0fs, and no other worker can take them yet",
                sorted(i for g in leaving for i in g.env_indices),
                self.options.migrate_before,
            )
            return None
        return leaving, self.directory.assign([list(g.env_indices) for g in leaving], staying, self.pool.load())

    def _auto_rebalance(self) -> None:
        """The periodic rebalance, in two steps that never wait for the scheduler.

        First ask for the scheduler's workers (the answer comes on the client's event
        loop); at a later step, once it is in, plan from it. A question unanswered
        past ``timeout`` (the scheduler frozen or gone) raises
        :class:`~daskvec.errors.SchedulerLostError`, as a blocking call would have.
        """
        census, self._census = self._census, None
        if census is None:
            self._last_rebalance_check = time.monotonic()
            self._census = self.directory.ask_workers()
            self._census_deadline = self._last_rebalance_check + self.options.timeout + _CENSUS_GRACE
            return
        if not census.done():
            census.cancel()
            raise _dask.scheduler_lost(self.pool.client, TimeoutError(), self.options.timeout + _CENSUS_GRACE)
        self._healed = False
        self.plan_rebalance(census.result())  # the SchedulerLostError of a failed question, if it failed

    def plan_rebalance(self, workers: Mapping[str, Any] | None = None) -> int:
        """Plan the moves that even out envs over the receiving workers; return how many envs move.

        ``workers``: the scheduler's worker list already in hand
        (:meth:`WorkerDirectory.ask_workers`); by default the scheduler is asked now.
        """
        groups = list(self.pool.groups)
        plan = plan_rebalance(
            [(g.env_indices, g.worker) for g in groups],
            self.directory.receivers(workers),
            self.options.envs_per_actor,
            whole_groups=self.pool.vector,
        )
        self._moves = ([groups[p] for p in plan.old], plan.layout) if plan else None
        return plan.moved_envs
