"""What the daskvec page shows, read from one scheduler: :class:`Snapshot` and :func:`snapshot`.

Pure data preparation from the scheduler's state (``WorkerState.metrics``, the env-group
actors on each worker, the events logged under :data:`~daskvec.monitoring.metrics.CLIENT_TOPIC`),
shared by the Bokeh components and the Prometheus collector. No Bokeh here.
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from daskvec.monitoring.metrics import CLIENT_TOPIC, TIMELINE_ROWS
from daskvec.protocol.messages import group_actors_on
from daskvec.transport.wire import RateLimitedLog

logger = logging.getLogger(__name__)

__all__ = ["TIMELINE_COLUMNS", "WORKER_COLUMNS", "Snapshot", "snapshot"]

#: Columns of the per-worker source, in table order (``worker`` is the row label).
WORKER_COLUMNS: tuple[str, ...] = (
    "worker",
    "address",
    "envs",
    "steps_per_s",
    "step_p50_ms",
    "step_p99_ms",
    "episodes",
    "mean_return",
    "errors",
    "restarts",
)
_FROM_METRIC = {
    "envs": "daskvec_envs",
    "steps": "daskvec_steps",
    "steps_per_s": "daskvec_steps_per_s",
    "step_p50_ms": "daskvec_step_p50_ms",
    "step_p99_ms": "daskvec_step_p99_ms",
    "episodes": "daskvec_episodes",
    "mean_return": "daskvec_mean_return",
    "errors": "daskvec_errors",
    "restarts": "daskvec_restarts",
}
#: Columns of the timeline source: who (``envs`` or ``learner``), what, and when (epoch seconds).
TIMELINE_COLUMNS: tuple[str, ...] = ("row", "kind", "start", "end")
_PARTS = ("client", "transit", "env")
_SPLIT_WINDOW_S = 10.0  # the time split shown covers roughly the last this many seconds
_REPORTING_S = 60.0  # a vec env that logged within this many seconds counts as running
#: The page and ``/metrics`` read the events every second or so: a line about malformed
#: ones goes out only when new ones arrived, and at most once per this many seconds.
_MALFORMED_LOG_S = 60.0
_log = RateLimitedLog(logger, _MALFORMED_LOG_S)
#: Per scheduler, the time of the newest malformed event already reported.
_reported: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


@dataclass
class Snapshot:
    """What the page shows, read from one scheduler at one moment."""

    time: float
    workers: dict[str, list[Any]]
    groups: int
    envs: int
    vec_envs: int
    split: dict[str, float]
    split_seconds: dict[str, float]
    split_live: bool
    last_closed: float | None
    ever_seen: bool
    totals: dict[str, float] = field(default_factory=dict)
    #: the learner's last intervals (:data:`TIMELINE_COLUMNS`), from the newest vec env that sent any
    timeline: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c in TIMELINE_COLUMNS})
    #: whether that vec env still runs (an event within the last minute, and not its last)
    timeline_live: bool = False

    @property
    def running(self) -> bool:
        """Whether any env group lives on the cluster."""
        return self.groups > 0

    def status(self) -> str:
        """One sentence saying whether a DaskVecEnv is running, for the top of the page."""
        if self.running:
            n_workers = sum(1 for e in self.workers["envs"] if e > 0)
            vecs = "a DaskVecEnv"
            if self.vec_envs:
                vecs = f"{self.vec_envs} DaskVecEnv" + ("s" if self.vec_envs != 1 else "")
            return (
                f"{vecs} running: {self.envs} envs in {self.groups} env groups on {n_workers} "
                f"worker{'s' if n_workers != 1 else ''}, {self.totals.get('steps_per_s', 0.0):,.0f} env-steps/s."
            )
        if self.last_closed is not None:
            when = datetime.fromtimestamp(self.last_closed).strftime("%H:%M:%S")
            return (
                f"No DaskVecEnv is running: the last one closed at {when}. The counters below are totals "
                "since the workers started; the time split is that of the last run."
            )
        if self.ever_seen:
            return (
                "No DaskVecEnv is running: the last one stopped without closing. The counters below are "
                "totals since the workers started; the time split is that of the last run."
            )
        return (
            "No DaskVecEnv is running on this cluster yet. Create one with "
            "DaskVecEnv(env_fns, client=...) and this page fills in."
        )


def _label(ws: Any) -> str:
    name = ws.name
    address = str(ws.address)
    short = address.split("://", 1)[-1]
    if name is None or str(name) == address:
        return short
    return f"{name} ({short})"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _well_formed(msg: Any) -> bool:
    """Whether ``msg`` has the fields, of the types, that :func:`_time_split` reads.

    Any client of the cluster can log an event under :data:`CLIENT_TOPIC`, so each is
    checked here, where it is read: one bad event must not break every later read.
    """
    if not isinstance(msg, dict) or not isinstance(msg.get("id"), str) or not _number(msg.get("time")):
        return False
    seconds = msg.get("seconds")
    return (
        isinstance(seconds, dict)
        and all(_number(seconds.get(p, 0.0)) for p in _PARTS)
        and isinstance(msg.get("closed", False), bool)
    )


def _client_messages(scheduler: Any) -> list[dict[str, Any]]:
    """The well-formed events under :data:`CLIENT_TOPIC`; malformed ones are skipped, and logged once."""
    try:
        events = scheduler.get_events(CLIENT_TOPIC)
    except Exception:  # a scheduler without events (closed, or too old)
        return []
    good, bad, newest_bad = [], 0, -math.inf
    for stamp, msg in events:
        if _well_formed(msg):
            good.append(msg)
        else:
            bad, newest_bad = bad + 1, max(newest_bad, float(stamp))
    if bad and newest_bad > _reported.get(scheduler, -math.inf):
        _reported[scheduler] = newest_bad
        _log(
            "malformed",
            logging.WARNING,
            "daskvec dashboard: skipping %d malformed %r events on the scheduler "
            "(logged by some client of the cluster; the page shows the others)",
            bad,
            CLIENT_TOPIC,
        )
    return good


def _time_split(messages: list[dict[str, Any]], now: float) -> tuple[dict[str, float], bool, float | None, int]:
    """Seconds per part over the recent window, whether live, last close time, vec envs reporting."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for msg in messages:
        by_id.setdefault(str(msg["id"]), []).append(msg)
    live_ids = [i for i, ms in by_id.items() if not ms[-1].get("closed") and now - float(ms[-1]["time"]) < _REPORTING_S]
    closed_times = [float(ms[-1]["time"]) for ms in by_id.values() if ms[-1].get("closed")]
    last_closed = max(closed_times) if closed_times else None
    if live_ids:
        chosen, live = live_ids, True
    elif by_id:
        chosen, live = [max(by_id, key=lambda i: float(by_id[i][-1]["time"]))], False
    else:
        return {p: 0.0 for p in _PARTS}, False, last_closed, 0
    seconds = {p: 0.0 for p in _PARTS}
    for i in chosen:
        ms = by_id[i]
        latest = ms[-1]
        base: dict[str, Any] | None = None
        for m in reversed(ms[:-1]):
            if float(latest["time"]) - float(m["time"]) >= _SPLIT_WINDOW_S:
                base = m
                break
        for p in _PARTS:
            now_s = float(latest["seconds"].get(p, 0.0))
            then_s = float(base["seconds"].get(p, 0.0)) if base is not None else 0.0
            seconds[p] += max(now_s - then_s, 0.0)
    return seconds, live, last_closed, len(live_ids)


def _intervals(msg: dict[str, Any]) -> list[tuple[str, float, float]]:
    """The well-formed intervals of an event's ``timeline``; none when it has none (an older client's)."""
    raw = msg.get("timeline")
    if not isinstance(raw, (list, tuple)):  # msgpack hands lists back as tuples
        return []
    out = []
    for item in raw:
        # each interval is checked alone: one bad interval leaves the rest of the picture
        if (
            isinstance(item, (list, tuple))
            and len(item) == 3
            and item[0] in TIMELINE_ROWS
            and _number(item[1])
            and _number(item[2])
            and item[2] >= item[1]
        ):
            out.append((str(item[0]), float(item[1]), float(item[2])))
    return out


def _timeline(messages: list[dict[str, Any]], now: float) -> tuple[dict[str, list[Any]], bool]:
    """The timeline of the vec env whose latest event is the newest of those that carry one, and whether it runs."""
    latest: dict[str, dict[str, Any]] = {}
    for msg in messages:
        latest[str(msg["id"])] = msg
    best: list[tuple[str, float, float]] = []
    best_time, live = -math.inf, False
    for msg in latest.values():
        intervals = _intervals(msg)
        if intervals and float(msg["time"]) > best_time:
            best, best_time = intervals, float(msg["time"])
            live = not msg.get("closed") and now - best_time < _REPORTING_S
    columns: dict[str, list[Any]] = {
        "row": [TIMELINE_ROWS[kind] for kind, _, _ in best],
        "kind": [kind for kind, _, _ in best],
        "start": [start for _, start, _ in best],
        "end": [end for _, _, end in best],
    }
    return columns, live


def snapshot(scheduler: Any) -> Snapshot:
    """Read everything the page shows from ``scheduler`` (cheap: no communication).

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The scheduler, in this process.

    Returns
    -------
    Snapshot
        Per-worker columns (:data:`WORKER_COLUMNS`, one row per worker, sorted by
        name), env-group and env counts, the client time split and whether a
        DaskVecEnv is running, and the learner's timeline (:data:`TIMELINE_COLUMNS`).
    """
    now = time.time()
    rows: dict[str, list[Any]] = {c: [] for c in (*WORKER_COLUMNS, "steps", "groups")}
    groups = 0
    for ws in sorted(scheduler.workers.values(), key=lambda w: str(w.name)):
        m = ws.metrics
        n_groups = group_actors_on(ws)
        groups += n_groups
        rows["worker"].append(_label(ws))
        rows["address"].append(str(ws.address))
        rows["groups"].append(n_groups)
        for col, name in _FROM_METRIC.items():
            value = m.get(name, 0.0)
            rows[col].append(float(value) if isinstance(value, (int, float)) else 0.0)
    messages = _client_messages(scheduler)
    seconds, live, last_closed, vec_envs = _time_split(messages, now)
    timeline, timeline_live = _timeline(messages, now)
    total = sum(seconds.values())
    split = {p: (seconds[p] / total if total > 0 else 0.0) for p in _PARTS}
    envs = int(sum(e for e, g in zip(rows["envs"], rows["groups"], strict=True) if g > 0))
    totals = {col: float(sum(rows[col])) for col in ("steps_per_s", "steps", "episodes", "errors", "restarts")}
    return Snapshot(
        time=now,
        workers=rows,
        groups=groups,
        envs=envs,
        vec_envs=vec_envs,
        split=split,
        split_seconds=seconds,
        split_live=live,
        last_closed=last_closed,
        ever_seen=bool(total) or last_closed is not None or any(rows["steps"]),
        totals=totals,
        timeline=timeline,
        timeline_live=timeline_live,
    )
