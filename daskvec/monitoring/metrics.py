"""Figures collected while stepping, on the workers and on the client.

Worker side
    Every :class:`~daskvec.worker.EnvGroup` owns a :class:`GroupStats`. The first
    group on a worker installs callables in ``worker.metrics`` (see
    :func:`install_worker_metrics`); Dask sends their values with every heartbeat, so
    they reach the scheduler's ``WorkerState.metrics`` at no cost to stepping. Names
    are listed in :data:`WORKER_METRICS`.

Client side
    :class:`ClientTimer` splits each vec-step's wall time into the time spent on the
    client (the learner, between steps), in transit and inside the envs.
    :func:`client_message` turns it into the event a ``DaskVecEnv`` logs on the
    scheduler every few seconds under the topic :data:`CLIENT_TOPIC`. Its
    :class:`LearnerTimeline` keeps the last intervals of a learner's collection against
    its learning (fed by :class:`~daskvec.learners.ahead.CollectAhead`), sent with it.

This module is imported on the workers: it must not import Bokeh or the dashboard.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections import deque
from typing import Any

import numpy as np

__all__ = [
    "CLIENT_TOPIC",
    "TIMELINE_ROWS",
    "WORKER_METRICS",
    "ClientTimer",
    "LearnerTimeline",
    "client_message",
    "GroupStats",
    "install_worker_metrics",
    "worker_summary",
]

#: Names (and meaning) of the scalar metrics each worker reports with its heartbeat.
WORKER_METRICS: dict[str, str] = {
    "daskvec_envs": "environments held by the worker",
    "daskvec_steps": "env-steps taken since the worker started (counter)",
    "daskvec_steps_per_s": "env-steps per second over the last few seconds",
    "daskvec_step_p50_ms": "median time of one group step call inside the envs (ms)",
    "daskvec_step_p99_ms": "99th percentile of that time (ms)",
    "daskvec_episodes": "episodes finished (counter)",
    "daskvec_mean_return": "mean return of the last 100 finished episodes",
    "daskvec_errors": "exceptions raised by envs (counter)",
    "daskvec_restarts": "envs rebuilt on this worker after a crash or a move (counter)",
}

#: Topic of the scheduler events in which each DaskVecEnv reports its time split.
CLIENT_TOPIC = "daskvec-client"

#: The kinds of interval of a :class:`LearnerTimeline`, and the row (who) each is about.
TIMELINE_ROWS: dict[str, str] = {
    "collecting": "envs",
    "replaying": "learner",
    "training": "learner",
    "waiting": "learner",
}

_WINDOW = 512
# about 25 rollouts of a learner (an envs' interval and up to three of the learner's each),
# in every event: small enough for the scheduler to keep a thousand events of
_TIMELINE_LEN = 100
_RATE_WINDOW_S = 5.0
_SUMMARY_TTL_S = 0.2  # one heartbeat reads every metric: compute the summary once for all


class GroupStats:
    """Counters of one env group. Updated by the group's serving thread only."""

    def __init__(self, n_envs: int) -> None:
        self.n_envs = n_envs
        self.steps = 0
        self.episodes = 0
        self.errors = 0
        self.restarts = 0
        self.latencies: deque[float] = deque(maxlen=_WINDOW)
        self.returns: deque[float] = deque(maxlen=100)
        self._rate_marks: deque[tuple[float, int]] = deque(maxlen=256)
        #: ``time.monotonic()`` when the step of the envs in progress began; None between steps.
        self.busy_since: float | None = None

    def busy_for(self) -> float:
        """Seconds the step of the envs in progress has taken so far (0 between steps)."""
        since = self.busy_since
        return 0.0 if since is None else time.monotonic() - since

    def record_step(self, n_envs: int, seconds: float) -> None:
        """Record one group step call of ``n_envs`` envs that took ``seconds``."""
        self.steps += n_envs
        self.latencies.append(seconds)
        now = time.monotonic()
        marks = self._rate_marks
        if not marks or now - marks[-1][0] > 0.1:
            marks.append((now, self.steps))

    def record_episode(self, episode_return: float) -> None:
        """Record a finished episode and its return."""
        self.episodes += 1
        self.returns.append(float(episode_return))

    def snapshot(self) -> dict[str, Any]:
        """The counters and windows as plain data, to send to another process."""
        return {
            "steps": self.steps,
            "episodes": self.episodes,
            "errors": self.errors,
            "restarts": self.restarts,
            "latencies": list(self.latencies),
            "returns": list(self.returns),
            "rate_marks": list(self._rate_marks),
        }

    def mirror(self, snap: dict[str, Any]) -> None:
        """Take over a :meth:`snapshot` of the same group taken in its env process.

        The rate marks are ``time.monotonic()`` readings, which every process on a
        host shares, so the rate computed here is the env process's own.
        """
        self.steps = int(snap["steps"])
        self.episodes = int(snap["episodes"])
        self.errors = int(snap["errors"])
        self.restarts = int(snap["restarts"])
        self.latencies = deque(snap["latencies"], maxlen=_WINDOW)
        self.returns = deque(snap["returns"], maxlen=100)
        self._rate_marks = deque(((float(t), int(n)) for t, n in snap["rate_marks"]), maxlen=256)

    def steps_per_second(self) -> float:
        """Env-steps per second over the last few seconds (0 when idle)."""
        # a snapshot: the serving thread appends while the heartbeat reads
        marks = list(self._rate_marks)
        steps = self.steps
        if not marks:
            return 0.0
        now = time.monotonic()
        if now - marks[-1][0] > _RATE_WINDOW_S:
            return 0.0
        first = marks[0]
        for m in marks:
            if now - m[0] <= _RATE_WINDOW_S:
                first = m
                break
        span = now - first[0]
        if span <= 0:
            return 0.0
        return (steps - first[1]) / span


_groups_lock = threading.Lock()
_groups: weakref.WeakSet[GroupStats] = weakref.WeakSet()
_installed: weakref.WeakSet[Any] = weakref.WeakSet()
# counters of groups already closed in this process, so that the worker's counters never go back
_retired: dict[str, float] = {"steps": 0.0, "episodes": 0.0, "errors": 0.0, "restarts": 0.0}
_summary_cache: tuple[float, dict[str, float]] | None = None


def _live() -> list[GroupStats]:
    with _groups_lock:
        return list(_groups)


def _compute_summary() -> dict[str, float]:
    groups = _live()
    with _groups_lock:
        retired = dict(_retired)
    active = [g for g in groups if g.n_envs > 0]
    lat = [x for g in active for x in list(g.latencies)]
    rets = [x for g in active for x in list(g.returns)]
    return {
        "daskvec_envs": float(sum(g.n_envs for g in active)),
        "daskvec_steps": retired["steps"] + float(sum(g.steps for g in groups)),
        "daskvec_steps_per_s": float(sum(g.steps_per_second() for g in active)),
        "daskvec_step_p50_ms": float(np.percentile(lat, 50) * 1e3) if lat else 0.0,
        "daskvec_step_p99_ms": float(np.percentile(lat, 99) * 1e3) if lat else 0.0,
        "daskvec_episodes": retired["episodes"] + float(sum(g.episodes for g in groups)),
        "daskvec_mean_return": float(np.mean(rets[-100:])) if rets else 0.0,
        "daskvec_errors": retired["errors"] + float(sum(g.errors for g in groups)),
        "daskvec_restarts": retired["restarts"] + float(sum(g.restarts for g in groups)),
    }


def worker_summary(max_age: float = 0.0) -> dict[str, float]:
    """Aggregate the stats of every group in this process into :data:`WORKER_METRICS`.

    Counters (steps, episodes, errors, restarts) include groups that have closed;
    envs, rate, latency and mean return cover the live groups only.

    Parameters
    ----------
    max_age : float
        Reuse a summary computed less than ``max_age`` seconds ago (the heartbeat
        reads every metric in turn; they share one computation).

    Returns
    -------
    dict
        One float per name of :data:`WORKER_METRICS`.
    """
    global _summary_cache
    now = time.monotonic()
    cached = _summary_cache
    if max_age > 0 and cached is not None and now - cached[0] < max_age:
        return cached[1]
    summary = _compute_summary()
    _summary_cache = (now, summary)
    return summary


def _metric(name: str) -> Any:
    def get(worker: Any) -> float:
        return worker_summary(_SUMMARY_TTL_S)[name]

    get.__name__ = name
    return get


def install_worker_metrics(worker: Any, stats: GroupStats) -> None:
    """Register ``stats`` and, once per worker, the heartbeat metrics callables."""
    with _groups_lock:
        _groups.add(stats)
    if worker is None:
        return
    if worker not in _installed:
        for name in WORKER_METRICS:
            worker.metrics[name] = _metric(name)
        _installed.add(worker)


def forget(stats: GroupStats) -> None:
    """Stop counting a closed group (its envs no longer count on the worker).

    Its counters stay in the worker's totals. Safe to call twice.
    """
    stats.n_envs = 0
    with _groups_lock:
        if stats in _groups:
            _groups.discard(stats)
            _retired["steps"] += stats.steps
            _retired["episodes"] += stats.episodes
            _retired["errors"] += stats.errors
            _retired["restarts"] += stats.restarts


class LearnerTimeline:
    """The last intervals of a learner's collection against its learning, for the dashboard.

    Each interval is a kind of :data:`TIMELINE_ROWS` and its start and end, read from
    ``time.perf_counter()`` where it happened; :meth:`intervals` gives them in epoch
    seconds, the clock the page lays out. Bounded: only the last ``maxlen`` are kept.

    Parameters
    ----------
    maxlen : int
        How many intervals to keep.
    """

    def __init__(self, maxlen: int = _TIMELINE_LEN) -> None:
        self._intervals: deque[tuple[str, float, float]] = deque(maxlen=maxlen)

    def __len__(self) -> int:
        return len(self._intervals)

    def add(self, kind: str, start: float, end: float) -> None:
        """Record an interval of ``kind`` from ``start`` to ``end`` (``time.perf_counter()`` readings).

        Raises
        ------
        ValueError
            If ``kind`` is not one of :data:`TIMELINE_ROWS`.
        """
        if kind not in TIMELINE_ROWS:
            raise ValueError(f"an interval is one of {sorted(TIMELINE_ROWS)}, not {kind!r}")
        if end > start:  # an empty interval draws nothing
            self._intervals.append((kind, float(start), float(end)))

    def intervals(self) -> list[list[Any]]:
        """The intervals as ``[kind, start, end]``, oldest first, in epoch seconds (msgpack-serialisable)."""
        # perf_counter has no epoch: shift by the two clocks' offset now (their drift over
        # a hundred intervals is far below what a page can show)
        offset = time.time() - time.perf_counter()
        return [[kind, start + offset, end + offset] for kind, start, end in list(self._intervals)]


class ClientTimer:
    """Split the client's wall time per vec-step into client, transit and env time.

    ``client`` is the time between the end of one ``step_wait`` and the next
    ``step_async`` (the learner's work); ``transit`` is the time waiting for replies
    minus the slowest group's time inside its envs; ``env`` is that slowest time.
    :attr:`timeline` is the learner's timeline, which the learners feed.
    """

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex[:12]
        #: the learner's collection against its learning (empty without a daskvec learner)
        self.timeline = LearnerTimeline()
        self.client_s = 0.0
        self.transit_s = 0.0
        self.env_s = 0.0
        self.vec_steps = 0
        self._last_end: float | None = None
        self._sent: float | None = None

    def sent(self) -> None:
        """Mark ``step_async`` having sent the requests."""
        now = time.perf_counter()
        if self._last_end is not None:
            self.client_s += now - self._last_end
        self._sent = now

    def received(self, env_seconds: float) -> None:
        """Mark ``step_wait`` having all replies; ``env_seconds`` is the slowest group's env time."""
        now = time.perf_counter()
        if self._sent is not None:
            wait = now - self._sent
            env = min(env_seconds, wait)
            self.env_s += env
            self.transit_s += wait - env
            self.vec_steps += 1
        self._last_end = now
        self._sent = None

    def rollout(self, vec_steps: int, wait_s: float, worker_s: float) -> None:
        """Count a rollout collected on the workers (:meth:`DaskVecEnv.collect_rollout`) as ``vec_steps`` steps.

        ``wait_s`` is the collection's wall time and ``worker_s`` the slowest group's time
        in its envs and its policy copy: that counts as env time, the rest of the wait as
        transit, and the time since the previous step or rollout (the learner's update) as
        client time.
        """
        now = time.perf_counter()
        if self._last_end is not None:
            self.client_s += max(now - wait_s - self._last_end, 0.0)
        worker = min(worker_s, wait_s)
        self.env_s += worker
        self.transit_s += wait_s - worker
        self.vec_steps += vec_steps
        self._last_end = now
        self._sent = None

    def shares(self) -> dict[str, float]:
        """Fractions of the total time spent on the client, in transit and in envs."""
        total = self.client_s + self.transit_s + self.env_s
        if total <= 0:
            return {"client": 0.0, "transit": 0.0, "env": 0.0}
        return {
            "client": self.client_s / total,
            "transit": self.transit_s / total,
            "env": self.env_s / total,
        }

    def totals(self) -> dict[str, float]:
        """Seconds spent so far on the client, in transit and in envs."""
        return {"client": self.client_s, "transit": self.transit_s, "env": self.env_s}


def client_message(timer: ClientTimer, num_envs: int, restarts: int = 0, closed: bool = False) -> dict[str, Any]:
    """The event a DaskVecEnv logs on the scheduler under :data:`CLIENT_TOPIC`.

    Parameters
    ----------
    timer : ClientTimer
        The vec env's timer; its ``id`` tells vec envs apart.
    num_envs : int
        Envs in the vec env.
    restarts : int
        Envs rebuilt so far.
    closed : bool
        Whether this is the last message, sent by ``close()``.

    Returns
    -------
    dict
        msgpack-serialisable: ``id``, ``time`` (epoch seconds), ``num_envs``,
        ``vec_steps``, ``restarts``, ``closed``, ``seconds`` (cumulative client,
        transit and env seconds), ``shares`` (the same as fractions) and ``timeline``
        (the learner's last intervals, ``[kind, start, end]`` in epoch seconds; see
        :class:`LearnerTimeline`).
    """
    return {
        "id": timer.id,
        "time": time.time(),
        "num_envs": int(num_envs),
        "vec_steps": int(timer.vec_steps),
        "restarts": int(restarts),
        "closed": bool(closed),
        "seconds": timer.totals(),
        "shares": timer.shares(),
        "timeline": timer.timeline.intervals(),
    }
