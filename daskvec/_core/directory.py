"""The worker directory: which workers may take envs, and where envs go.

:class:`WorkerDirectory` is the client's one view of the cluster's workers: which are
eligible (``workers=``/``resources=`` options), which are quarantined (frozen once, so
placing envs on them costs a full timeout), when each is expected to leave (its
``--lifetime`` or batch-job walltime, learned when a group is created on it), and where
a set of new groups should go given the envs each worker already holds.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from daskvec._core import dask_internals as _dask
from daskvec._core.options import Options
from daskvec.cluster import clients as _cluster
from daskvec.errors import SchedulerLostError, WorkerLostError

logger = logging.getLogger(__name__)

__all__ = ["QUARANTINE_S", "HeartbeatWatch", "Layout", "WorkerDirectory"]

#: Seconds a worker that failed to create an env group in time, or left a step
#: unanswered, gets no new envs while other workers can take them: placing on a frozen
#: worker costs a full ``timeout`` every time.
QUARANTINE_S = 600.0

#: Probes a quarantined worker must answer in a row, each sent after the one before came
#: back, before it takes envs again: one answer may come from a worker that froze again.
PROBES_TO_HEAL = 2

#: Where groups go: (env indices, worker) per group.
Layout = list[tuple[list[int], str]]


class WorkerDirectory:
    """Eligibility, quarantine, deadlines and placement of the cluster's workers.

    Parameters
    ----------
    client : distributed.Client
        The client of the cluster.
    options : Options
        Reads ``workers``, ``resources``, ``worker_wait_timeout`` and ``migrate_before``.
    """

    def __init__(self, client: Any, options: Options, fixed: bool = False) -> None:
        self.client = client
        self.options = options
        self.fixed = fixed  # the cluster's workers are all it will have (the embedded one)
        self._deadlines: dict[str, float | None] = {}
        self._any_deadline = False
        self._quarantine: dict[str, float] = {}  # worker -> time.monotonic() it may take envs again
        # quarantined workers' proofs of life: the probe in flight, and the answers in a row so far
        self._probes: dict[str, concurrent.futures.Future[None]] = {}
        self._answers: dict[str, int] = {}

    # ------------------------------------------------------------------ what is known
    def eligible(self, known: Mapping[str, Any] | None = None) -> list[str]:
        """Live workers that match the placement options, sorted by address.

        ``known``: the scheduler's answer already in hand (:meth:`ask_workers`); by
        default the scheduler is asked now, waiting at most ``timeout``.
        """
        workers = _cluster.scheduler_workers(self.client, self.options.timeout) if known is None else known
        return _cluster.eligible_workers({"workers": workers}, self.options.workers, self.options.resources)

    def ask_workers(self) -> concurrent.futures.Future[dict[str, Any]]:
        """Ask the scheduler for its workers without waiting; the answer is for :meth:`eligible`.

        The future holds ``{address: worker info}`` or a
        :class:`~daskvec.errors.SchedulerLostError` within ``timeout`` seconds of the
        client's event loop asking (see :func:`daskvec._core.dask_internals.scheduler_workers_soon`).
        """
        return _dask.scheduler_workers_soon(self.client, self.options.timeout)

    def alive(self, worker: str) -> bool:
        """Whether the scheduler still knows ``worker``."""
        return worker in _cluster.scheduler_workers(self.client, self.options.timeout)

    def learn_deadline(self, worker: str, deadline: float | None) -> None:
        """Record when ``worker`` is expected to leave (epoch seconds, or ``None``)."""
        self._deadlines[worker] = deadline
        self._any_deadline = any(d is not None for d in self._deadlines.values())

    @property
    def any_deadline(self) -> bool:
        """Whether any known worker has a deadline (if none has, no group can be leaving)."""
        return self._any_deadline

    def deadline(self, worker: str) -> float | None:
        """When ``worker`` is expected to leave (epoch seconds), if known."""
        return self._deadlines.get(worker)

    def leaving(self, worker: str, now: float | None = None) -> bool:
        """Whether ``worker`` is expected to leave within ``migrate_before`` seconds."""
        deadline = self._deadlines.get(worker)
        now = time.time() if now is None else now
        return deadline is not None and deadline - now < self.options.migrate_before

    def quarantine(self, worker: str, why: str) -> None:
        """Place no envs on ``worker`` for :data:`QUARANTINE_S` while other workers can take them."""
        if worker not in self.quarantined():
            logger.warning(
                "worker %s %s; placing no envs on it for the next %.0f s unless no other worker is left",
                worker,
                why,
                QUARANTINE_S,
            )
        self._quarantine[worker] = time.monotonic() + QUARANTINE_S
        # answers to probes sent before this quarantine prove nothing about the worker now
        self._probes.pop(worker, None)
        self._answers.pop(worker, None)

    @property
    def any_quarantined(self) -> bool:
        """Whether a worker is (or was until lately) in quarantine: cheap, for a check at every step."""
        return bool(self._quarantine)

    def probe_quarantined(self) -> list[str]:
        """Lift the quarantine of the workers that proved alive since; return them. Never waits.

        A worker is quarantined because it froze (a stopped process, a stalled VM) or left
        a step unanswered; it may run again a minute later, and keeping it out for
        :data:`QUARANTINE_S` would leave it idle while the run goes at the others' speed.
        Each call reads the answer of the probe sent at the call before
        (:func:`daskvec._core.dask_internals.worker_answers_soon`: the worker's own event
        loop must answer) and sends the next; :data:`PROBES_TO_HEAL` answers in a row end
        the quarantine. With ``transport="actor"`` no quarantine is lifted early: a step
        hung there holds the worker's one actor thread, which its event loop answering
        does not show.
        """
        healed: list[str] = []
        if self.options.transport == "actor":
            return healed
        for worker in sorted(self.quarantined()):
            probe = self._probes.pop(worker, None)
            if probe is not None and not probe.done():
                self._probes[worker] = probe  # still on its way
                continue
            if probe is not None:
                answered = probe.exception() is None
                self._answers[worker] = self._answers.get(worker, 0) + 1 if answered else 0
                if self._answers[worker] >= PROBES_TO_HEAL:
                    del self._quarantine[worker]
                    self._answers.pop(worker, None)
                    logger.warning("worker %s answers again; it may take envs again", worker)
                    healed.append(worker)
                    continue
            self._probes[worker] = _dask.worker_answers_soon(self.client, worker, self.options.timeout)
        return healed

    def quarantined(self) -> set[str]:
        """Workers currently in quarantine."""
        now = time.monotonic()
        for worker, until in list(self._quarantine.items()):
            if until <= now:
                del self._quarantine[worker]
        return set(self._quarantine)

    def receivers(self, known: Mapping[str, Any] | None = None) -> list[str]:
        """Eligible workers that may take envs moved on purpose: neither leaving soon nor quarantined.

        ``known``: the scheduler's workers already in hand, as for :meth:`eligible`.
        """
        now = time.time()
        quarantined = self.quarantined()
        return [w for w in self.eligible(known) if not self.leaving(w, now) and w not in quarantined]

    # ------------------------------------------------------------------ placement
    def wait_for_workers(self, exclude: Sequence[str] = ()) -> list[str]:
        """Eligible workers not in ``exclude``, waiting up to ``worker_wait_timeout`` for one.

        Quarantined workers come back only when no other worker is found.

        Raises
        ------
        WorkerLostError
            When no such worker appeared in time.
        """
        deadline = time.monotonic() + self.options.worker_wait_timeout
        opts = self.options
        while True:
            workers = _cluster.scheduler_workers(self.client, opts.timeout)
            found = [w for w in self.eligible(workers) if w not in exclude]
            if found:
                quarantined = self.quarantined()
                return [w for w in found if w not in quarantined] or found
            # on a cluster that gets no new workers, a placement no worker matches never will
            mismatch = (
                self.fixed and bool(workers) and bool(opts.workers or opts.resources) and not self.eligible(workers)
            )
            if mismatch or time.monotonic() > deadline:
                raise WorkerLostError(self._none_eligible(workers, mismatch), env_indices=[], worker="")
            time.sleep(0.2)

    def _none_eligible(self, workers: Mapping[str, Any], at_once: bool) -> str:
        """Why no worker can take envs: the placement options and the workers there are."""
        opts = self.options
        wanted = [
            f"{k}={v!r}"
            for k, v in (("workers", opts.workers and list(opts.workers)), ("resources", opts.resources))
            if v
        ]
        what = f"workers matching {' '.join(wanted)}" if wanted else "workers"
        there = ", ".join(
            f"{info.get('name', addr)!s} ({addr}, resources {info.get('resources') or {}})"
            for addr, info in sorted(workers.items())[:5]
        )
        there = (
            f"the cluster has {len(workers)}: {there}{', ...' if len(workers) > 5 else ''}"
            if workers
            else "the cluster has none"
        )
        when = (
            "the embedded cluster gets no other workers"
            if at_once
            else (f"none appeared within worker_wait_timeout={opts.worker_wait_timeout:.0f}s")
        )
        return f"no eligible {what}: {there}; {when}. Start such workers, or relax the placement options"

    def place(
        self,
        env_groups: list[list[int]],
        load: dict[str, int],
        avoid: AbstractSet[str] = frozenset(),
        fallback: AbstractSet[str] = frozenset(),
    ) -> Layout:
        """Choose live workers for ``env_groups``, avoiding ``avoid`` (workers that failed).

        Workers about to leave are avoided too when others exist. If only workers in
        ``fallback`` (a worker that merely hung, or whose env process died) are left,
        they are used at once, without waiting for others to join. Among the
        candidates, each group goes to the one holding the fewest envs (``load``).
        """
        workers = _cluster.scheduler_workers(self.client, self.options.timeout)
        eligible = self.eligible(workers)
        if fallback and not [w for w in eligible if w not in avoid]:
            usable = [w for w in eligible if w in fallback]
            if usable:
                logger.info("no other worker can take envs %s: using %s again", env_groups, usable)
        else:
            usable = []
        candidates = usable or self.wait_for_workers(exclude=sorted(avoid))
        now = time.time()
        candidates = [w for w in candidates if not self.leaving(w, now)] or candidates
        return self.assign(env_groups, candidates, load)

    @staticmethod
    def assign(env_groups: list[list[int]], workers: list[str], load: dict[str, int]) -> Layout:
        """Each group on the least-loaded of ``workers`` (see :func:`daskvec.cluster.clients.assign_workers`)."""
        held = {w: k for w, k in load.items() if w in workers}
        return list(zip(env_groups, _cluster.assign_workers(env_groups, workers, held), strict=True))


#: Heartbeat intervals a worker must miss to count as frozen (the scheduler's own
#: ``worker-ttl`` is never less than 10 of them).
_HEARTBEATS = 10


class HeartbeatWatch:
    """Which workers have sent the scheduler no heartbeat for ``quiet`` seconds.

    A long wait (a rollout of ``n_steps`` steps, bounded by ``step_timeout * n_steps``)
    cannot tell a frozen worker from a busy one by its reply alone. A worker's process
    that is stopped (SIGSTOP, a stalled VM, a partition) also stops its heartbeats to
    the scheduler, while a busy one goes on sending them from its event loop. Each
    :meth:`silent` reads the scheduler's last answer on its workers' ``last_seen`` and
    compares it with the answers before on the client's clock, so the clocks of the
    machines never meet.

    Parameters
    ----------
    directory : WorkerDirectory
        The directory whose client and ``timeout`` are used.
    quiet : float
        Seconds without a new heartbeat after which a worker counts as frozen; at
        least 10 heartbeat intervals (5 s up to 10 workers, 10 s up to 50, 20 s up to 200).
    """

    def __init__(self, directory: WorkerDirectory, quiet: float) -> None:
        self._directory = directory
        self.quiet = quiet
        self._seen: dict[str, tuple[Any, float]] = {}  # worker -> (its last_seen, when that was first seen)
        self._asked: concurrent.futures.Future[dict[str, Any]] | None = None

    def silent(self, workers: Collection[str]) -> set[str]:
        """Those of ``workers`` whose heartbeat has not changed for ``quiet`` seconds, or that the scheduler lost.

        Never waits: the scheduler is asked in the background
        (:func:`daskvec._core.dask_internals.scheduler_workers_soon`) and its answer is read at the
        next call. Until an answer is in, or when the scheduler does not answer (frozen:
        the direct channels go on without it), no worker is judged.
        """
        asked = self._asked
        if asked is not None and not asked.done():
            return set()  # still on its way
        self._asked = _dask.scheduler_workers_soon(self._directory.client, self._directory.options.timeout)
        if asked is None:
            return set()
        try:
            known = asked.result()
        except SchedulerLostError:
            return set()
        now = time.monotonic()
        # as the scheduler's own time-to-live: never less than 10 heartbeats
        quiet = max(self.quiet, _HEARTBEATS * _dask.heartbeat_interval(len(known)))
        out = set()
        for w in workers:
            info = known.get(w)
            if info is None:
                out.add(w)
                continue
            beat = info.get("last_seen")
            if beat is None:  # a Dask that does not say: never judged silent
                continue
            first = self._seen.get(w)
            if first is None or first[0] != beat:
                self._seen[w] = (beat, now)
            elif now - first[1] >= quiet:
                out.add(w)
        return out
