"""The daskvec page of the Dask dashboard, and its Prometheus metrics.

Dask shows nothing about actors: their method calls never reach the scheduler. This
page fills the gap from two cheap sources that already travel to the scheduler:

- the ``daskvec_*`` scalar metrics that every worker holding envs sends with its
  heartbeat (see :mod:`daskvec.metrics`), found in ``WorkerState.metrics``;
- the event each :class:`~daskvec.DaskVecEnv` logs every few seconds under the topic
  :data:`~daskvec.metrics.CLIENT_TOPIC` with its time split (client / transit / envs).

Pages (Bokeh apps on the scheduler's dashboard)
    ``/daskvec``
        the whole page, with the dashboard's navigation bar (a "Daskvec" link is added
        to it);
    ``/individual-daskvec``
        the same without the navigation, listed in ``/individual-plots.json`` (so
        dask-labextension can open it in JupyterLab);
    ``/individual-daskvec-workers``, ``/individual-daskvec-throughput``, ``/individual-daskvec-time-split``
        each plot on its own.

Registration
    :func:`install` adds the pages to ``distributed.dashboard.scheduler.applications``;
    a scheduler started afterwards in this process serves them (``LocalCluster``,
    dask-jobqueue clusters, the cluster ``DaskVecEnv`` starts itself).
    ``import daskvec.vec_env`` calls it. For a standalone scheduler use the preload:
    ``dask scheduler --preload daskvec.dashboard``.

This module imports Bokeh: it is imported on the client and the scheduler only, never
on workers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, DataRange1d, FactorRange, HoverTool, Range1d
from bokeh.models.widgets import DataTable, NumberFormatter, TableColumn
from bokeh.models.widgets.markups import Div
from bokeh.plotting import figure
from distributed.dashboard.components import DashboardComponent, add_periodic_callback

from daskvec.cluster import GROUP_KEY_PREFIX
from daskvec.metrics import CLIENT_TOPIC

logger = logging.getLogger(__name__)

__all__ = [
    "ROUTES",
    "DaskvecDashboard",
    "Throughput",
    "TimeSplit",
    "WorkerLoad",
    "dask_setup",
    "install",
    "snapshot",
]

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
_PARTS = ("client", "transit", "env")
_PART_LABELS = {"client": "on the client", "transit": "in transit", "env": "inside the envs"}
_PART_COLORS = {"client": "#8c564b", "transit": "#ff7f0e", "env": "#1f77b4"}
#: Fill colour of the per-worker bars (the browser test looks for it in a screenshot).
BAR_COLOR = "#2ca02c"
_SPLIT_WINDOW_S = 10.0  # the time split shown covers roughly the last this many seconds
_REPORTING_S = 60.0  # a vec env that logged within this many seconds counts as running
_HISTORY = 1200  # points kept in the throughput timeseries


# --------------------------------------------------------------------------- data
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
            return (f"No DaskVecEnv is running: the last one closed at {when}. The counters below are totals "
                    "since the workers started; the time split is that of the last run.")
        if self.ever_seen:
            return ("No DaskVecEnv is running: the last one stopped without closing. The counters below are "
                    "totals since the workers started; the time split is that of the last run.")
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


def _groups_on(ws: Any) -> int:
    return sum(1 for ts in getattr(ws, "actors", ()) if str(ts.key).startswith(GROUP_KEY_PREFIX))


def _client_messages(scheduler: Any) -> list[dict[str, Any]]:
    try:
        events = scheduler.get_events(CLIENT_TOPIC)
    except Exception:  # a scheduler without events (closed, or too old)
        return []
    return [msg for _, msg in events if isinstance(msg, dict) and "id" in msg and "seconds" in msg]


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
        DaskVecEnv is running.
    """
    now = time.time()
    rows: dict[str, list[Any]] = {c: [] for c in (*WORKER_COLUMNS, "steps", "groups")}
    groups = 0
    for ws in sorted(scheduler.workers.values(), key=lambda w: str(w.name)):
        m = ws.metrics
        n_groups = _groups_on(ws)
        groups += n_groups
        rows["worker"].append(_label(ws))
        rows["address"].append(str(ws.address))
        rows["groups"].append(n_groups)
        for col, name in _FROM_METRIC.items():
            value = m.get(name, 0.0)
            rows[col].append(float(value) if isinstance(value, (int, float)) else 0.0)
    seconds, live, last_closed, vec_envs = _time_split(_client_messages(scheduler), now)
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
    )


def _set(source: ColumnDataSource, data: dict[str, list[Any]]) -> None:
    if dict(source.data) != data:
        source.data = data


# --------------------------------------------------------------------------- components
class WorkerLoad(DashboardComponent):
    """Per-worker env load: env-steps/s per worker as bars, and a table of every figure.

    ``source`` has one row per worker and the columns :data:`WORKER_COLUMNS`.
    """

    source: ColumnDataSource
    root: Any

    def __init__(self, scheduler: Any, **kwargs: Any) -> None:
        self.scheduler = scheduler
        self.source = ColumnDataSource({c: [] for c in WORKER_COLUMNS}, name="daskvec-workers")
        self._workers_range = FactorRange(factors=[])
        self.bars = figure(
            title="Env-steps/s per worker",
            y_range=self._workers_range,
            x_range=DataRange1d(start=0),
            x_axis_label="env-steps/s",
            tools="",
            toolbar_location=None,
            height=max(160, 60 + 28 * len(scheduler.workers)),
            name="daskvec-workers-bars",
            **kwargs,
        )
        self.bars.hbar(y="worker", right="steps_per_s", height=0.8, color=BAR_COLOR, source=self.source)
        self.bars.ygrid.visible = False
        self.bars.add_tools(
            HoverTool(
                tooltips=[
                    ("worker", "@worker"),
                    ("envs", "@envs{0}"),
                    ("env-steps/s", "@steps_per_s{0,0.0}"),
                    ("step p50 / p99", "@step_p50_ms{0.000} / @step_p99_ms{0.000} ms"),
                ]
            )
        )
        fmt = NumberFormatter(format="0,0.0")
        ms = NumberFormatter(format="0.000")
        integer = NumberFormatter(format="0,0")
        columns = [
            TableColumn(field="worker", title="worker", width=220),
            TableColumn(field="envs", title="envs", formatter=integer),
            TableColumn(field="steps_per_s", title="env-steps/s", formatter=fmt),
            TableColumn(field="step_p50_ms", title="step p50 (ms)", formatter=ms),
            TableColumn(field="step_p99_ms", title="step p99 (ms)", formatter=ms),
            TableColumn(field="episodes", title="episodes", formatter=integer),
            TableColumn(field="mean_return", title="mean return", formatter=NumberFormatter(format="0,0.00")),
            TableColumn(field="errors", title="errors", formatter=integer),
            TableColumn(field="restarts", title="restarts", formatter=integer),
        ]
        table_kwargs = {k: v for k, v in kwargs.items() if k == "sizing_mode"}
        self.table = DataTable(
            source=self.source,
            columns=columns,
            index_position=None,
            height=200,
            name="daskvec-workers-table",
            **table_kwargs,
        )
        self.root = column(self.bars, self.table, **table_kwargs)

    def update(self, snap: Snapshot | None = None) -> None:
        """Refresh from the scheduler (or from ``snap``, when a caller already read it)."""
        snap = snap or snapshot(self.scheduler)
        data = {c: list(snap.workers[c]) for c in WORKER_COLUMNS}
        factors = list(reversed(data["worker"]))
        if list(self._workers_range.factors) != factors:
            self._workers_range.factors = factors
            self.bars.height = max(160, 60 + 28 * len(factors))
        _set(self.source, data)


class Throughput(DashboardComponent):
    """Total env-steps/s of the cluster over time (sum of the workers' rates)."""

    source: ColumnDataSource
    root: Any

    def __init__(self, scheduler: Any, **kwargs: Any) -> None:
        self.scheduler = scheduler
        self.source = ColumnDataSource({"time": [], "steps_per_s": []}, name="daskvec-throughput")
        self.root = figure(
            title="Total env-steps/s",
            x_axis_type="datetime",
            y_range=DataRange1d(start=0),
            tools="",
            toolbar_location=None,
            height=220,
            name="daskvec-throughput-plot",
            **kwargs,
        )
        self.root.line(x="time", y="steps_per_s", source=self.source, line_width=2, color="#1f77b4")
        self.root.add_tools(HoverTool(tooltips=[("env-steps/s", "@steps_per_s{0,0.0}")], mode="vline"))

    def update(self, snap: Snapshot | None = None) -> None:
        """Append the current total rate."""
        snap = snap or snapshot(self.scheduler)
        self.source.stream(
            {"time": [snap.time * 1000.0], "steps_per_s": [snap.totals.get("steps_per_s", 0.0)]}, rollover=_HISTORY
        )


class TimeSplit(DashboardComponent):
    """Share of the vec-env step time spent on the client, in transit and inside the envs.

    From the events the DaskVecEnvs log (over about the last ten seconds, summed over
    running vec envs; the last run's when none is running).
    """

    source: ColumnDataSource
    root: Any

    def __init__(self, scheduler: Any, **kwargs: Any) -> None:
        self.scheduler = scheduler
        self.source = ColumnDataSource(
            {"part": [], "label": [], "share": [], "seconds": [], "color": []}, name="daskvec-time-split"
        )
        labels = [_PART_LABELS[p] for p in reversed(_PARTS)]
        self.root = figure(
            title="Where step time goes",
            y_range=FactorRange(factors=labels),
            x_range=Range1d(start=0, end=1),
            x_axis_label="share of the step time",
            tools="",
            toolbar_location=None,
            height=180,
            name="daskvec-time-split-plot",
            **kwargs,
        )
        self.root.hbar(y="label", right="share", height=0.7, color="color", source=self.source)
        self.root.ygrid.visible = False
        self.root.add_tools(
            HoverTool(tooltips=[("", "@label"), ("share", "@share{0.0%}"), ("seconds", "@seconds{0.00}")])
        )

    def update(self, snap: Snapshot | None = None) -> None:
        """Refresh from the latest client events."""
        snap = snap or snapshot(self.scheduler)
        self.root.title.text = "Where step time goes" + ("" if snap.split_live else " (last run)")
        _set(
            self.source,
            {
                "part": list(_PARTS),
                "label": [_PART_LABELS[p] for p in _PARTS],
                "share": [snap.split[p] for p in _PARTS],
                "seconds": [snap.split_seconds[p] for p in _PARTS],
                "color": [_PART_COLORS[p] for p in _PARTS],
            },
        )


class DaskvecDashboard(DashboardComponent):
    """The whole daskvec page: a status line, per-worker load, throughput and time split.

    ``source`` is the per-worker source of :class:`WorkerLoad`.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The scheduler to read, in this process.
    **kwargs
        Passed to the figures (e.g. ``sizing_mode``).
    """

    source: ColumnDataSource
    root: Any

    def __init__(self, scheduler: Any, **kwargs: Any) -> None:
        self.scheduler = scheduler
        self.workers = WorkerLoad(scheduler, **kwargs)
        self.throughput = Throughput(scheduler, **kwargs)
        self.time_split = TimeSplit(scheduler, **kwargs)
        self.status = Div(text="", name="daskvec-status", styles={"font-size": "14px", "padding": "4px 8px"})
        self.source = self.workers.source
        sizing = {k: v for k, v in kwargs.items() if k == "sizing_mode"}
        self.root = column(
            self.status,
            row(self.workers.bars, column(self.throughput.root, self.time_split.root, **sizing), **sizing),
            self.workers.table,
            **sizing,
        )
        self.last: Snapshot | None = None

    def update(self, snap: Snapshot | None = None) -> None:
        """Read the scheduler once (unless given ``snap``) and refresh every part."""
        snap = snap or snapshot(self.scheduler)
        self.last = snap
        text = snap.status()
        if self.status.text != text:
            self.status.text = text
        self.workers.update(snap)
        self.throughput.update(snap)
        self.time_split.update(snap)


# --------------------------------------------------------------------------- Bokeh docs
_INTERVAL_MS = 1000  # worker heartbeats arrive about once a second


def _theme() -> Any:
    from distributed.dashboard.components.scheduler import BOKEH_THEME

    return BOKEH_THEME


def daskvec_doc(scheduler: Any, extra: dict[str, Any], doc: Any) -> None:
    """Bokeh document of ``/daskvec``: the page with the dashboard's navigation."""
    from distributed.dashboard.components.scheduler import env

    page = DaskvecDashboard(scheduler, sizing_mode="stretch_width")
    page.update()
    add_periodic_callback(doc, page, _INTERVAL_MS)
    doc.title = "Dask: daskvec"
    doc.add_root(page.root)
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = _theme()


def _individual(cls: type[DashboardComponent], attr: str = "root") -> Any:
    def doc_function(scheduler: Any, extra: dict[str, Any], doc: Any) -> None:
        component: Any = cls(scheduler, sizing_mode="stretch_both")  # type: ignore[call-arg]
        component.update()
        add_periodic_callback(doc, component, _INTERVAL_MS)
        doc.add_root(getattr(component, attr))
        doc.theme = _theme()
        doc.title = f"Dask: daskvec {cls.__name__}"

    doc_function.__name__ = f"individual_{cls.__name__.lower()}_doc"
    return doc_function


#: The dashboard routes daskvec adds, and their Bokeh document functions.
ROUTES: dict[str, Any] = {
    "/daskvec": daskvec_doc,
    "/individual-daskvec": _individual(DaskvecDashboard),
    "/individual-daskvec-workers": _individual(WorkerLoad),
    "/individual-daskvec-throughput": _individual(Throughput),
    "/individual-daskvec-time-split": _individual(TimeSplit),
}
_NAV_PAGE = "daskvec"


# --------------------------------------------------------------------------- Prometheus
def _running_schedulers() -> list[Any]:
    from distributed.core import Status
    from distributed.scheduler import Scheduler

    return [s for s in list(Scheduler._instances) if s.status in (Status.running, Status.init)]


class PrometheusCollector:
    """``prometheus_client`` collector of the daskvec figures of the schedulers in this process.

    Served on the scheduler's ``/metrics`` with the names listed in
    :data:`PROMETHEUS_METRICS` (``dask`` is the ``distributed.dashboard.prometheus.namespace``).
    """

    def __init__(self, schedulers: Any = _running_schedulers) -> None:
        self._schedulers = schedulers

    @staticmethod
    def _name(name: str) -> str:
        import dask.config

        namespace = dask.config.get("distributed.dashboard.prometheus.namespace", "dask")
        return f"{namespace}_daskvec_{name}" if namespace else f"daskvec_{name}"

    def collect(self) -> Iterator[Any]:
        """Yield one metric family per figure (see :data:`PROMETHEUS_METRICS`)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snaps = []
        for s in self._schedulers():
            try:
                snaps.append(snapshot(s))
            except Exception:  # a scheduler shutting down while we read it
                logger.debug("daskvec metrics: could not read a scheduler", exc_info=True)
        gauges = {
            "envs": ("envs", "Environments held by the worker"),
            "env_steps_per_second": ("steps_per_s", "Env-steps per second over the last few seconds"),
            "mean_episode_return": ("mean_return", "Mean return of the last 100 episodes finished on the worker"),
        }
        counters = {
            "env_steps": ("steps", "Env-steps taken on the worker"),
            "episodes": ("episodes", "Episodes finished on the worker"),
            "env_errors": ("errors", "Exceptions raised by envs on the worker"),
            "env_restarts": ("restarts", "Envs rebuilt on the worker"),
        }
        families: tuple[tuple[Any, dict[str, tuple[str, str]]], ...] = (
            (GaugeMetricFamily, gauges),
            (CounterMetricFamily, counters),
        )
        for family, specs in families:
            for name, (col, doc) in specs.items():
                fam = family(self._name(name), doc, labels=["worker"])
                for snap in snaps:
                    for addr, v in zip(snap.workers["address"], snap.workers[col], strict=True):
                        fam.add_metric([addr], float(v))
                yield fam
        lat = GaugeMetricFamily(
            self._name("step_latency_seconds"),
            "Time of one env-group step inside the envs, by quantile over a recent window",
            labels=["worker", "quantile"],
        )
        for snap in snaps:
            for addr, p50, p99 in zip(
                snap.workers["address"], snap.workers["step_p50_ms"], snap.workers["step_p99_ms"], strict=True
            ):
                lat.add_metric([addr, "0.5"], p50 / 1e3)
                lat.add_metric([addr, "0.99"], p99 / 1e3)
        yield lat
        yield GaugeMetricFamily(self._name("env_groups"), "Env-group actors alive on the cluster",
                                value=float(sum(s.groups for s in snaps)))
        yield GaugeMetricFamily(self._name("vec_envs"), "DaskVecEnvs reporting to the scheduler",
                                value=float(sum(s.vec_envs for s in snaps)))
        share = GaugeMetricFamily(
            self._name("client_time_share"),
            "Share of the vec-env step time spent on the client, in transit and inside the envs (recent)",
            labels=["part"],
        )
        if snaps:
            seconds = {p: sum(s.split_seconds[p] for s in snaps) for p in _PARTS}
            total = sum(seconds.values())
            for p in _PARTS:
                share.add_metric([p], seconds[p] / total if total > 0 else 0.0)
        yield share


#: Names daskvec serves on the scheduler's ``/metrics`` (default namespace ``dask``).
PROMETHEUS_METRICS: tuple[str, ...] = (
    "dask_daskvec_envs",
    "dask_daskvec_env_steps_per_second",
    "dask_daskvec_mean_episode_return",
    "dask_daskvec_env_steps_total",
    "dask_daskvec_episodes_total",
    "dask_daskvec_env_errors_total",
    "dask_daskvec_env_restarts_total",
    "dask_daskvec_step_latency_seconds",
    "dask_daskvec_env_groups",
    "dask_daskvec_vec_envs",
    "dask_daskvec_client_time_share",
)


# --------------------------------------------------------------------------- installation
_install_lock = threading.Lock()
_state: dict[str, Any] = {"pages": False, "nav": False, "collector": None}


def _add_nav(dashboard_scheduler: Any) -> None:
    """Wrap Dask's (memoized) ``template_variables`` so the navigation links our page."""
    original = dashboard_scheduler.template_variables
    if getattr(original, "_daskvec", False):
        return

    def template_variables(scheduler: Any) -> Any:
        out = original(scheduler)
        pages = out.get("pages")
        if isinstance(pages, list) and _NAV_PAGE not in pages:
            pages.insert(pages.index("info") if "info" in pages else len(pages), _NAV_PAGE)
        return out

    template_variables._daskvec = True  # type: ignore[attr-defined]
    template_variables.__wrapped__ = original  # type: ignore[attr-defined]
    dashboard_scheduler.template_variables = template_variables


def _register_collector() -> None:
    try:
        import prometheus_client
    except ImportError:
        logger.debug("prometheus_client is not installed; no daskvec metrics on /metrics")
        return
    collector = PrometheusCollector()
    prometheus_client.REGISTRY.register(collector)
    _state["collector"] = collector


def install() -> bool:
    """Add the daskvec pages to the Dask dashboard and its metrics to ``/metrics``.

    Schedulers started in this process afterwards serve the pages listed in
    :data:`ROUTES` and link ``/daskvec`` from the navigation bar; the metrics in
    :data:`PROMETHEUS_METRICS` are added to this process's ``prometheus_client``
    registry. Safe to call many times.

    Returns
    -------
    bool
        Whether the pages are installed (``False`` when Dask's dashboard cannot be
        imported, e.g. without a suitable Bokeh).

    Examples
    --------
    >>> import daskvec.dashboard
    >>> daskvec.dashboard.install()  # doctest: +SKIP
    True
    >>> from distributed import LocalCluster
    >>> cluster = LocalCluster()  # its dashboard has /daskvec  # doctest: +SKIP
    """
    with _install_lock:
        if _state["pages"]:
            return True
        try:
            import distributed.dashboard.scheduler as dashboard_scheduler
        except ImportError as e:
            logger.info("the Dask dashboard is not available (%s); no daskvec page", e)
            return False
        for route, doc_function in ROUTES.items():
            dashboard_scheduler.applications.setdefault(route, doc_function)
        _add_nav(dashboard_scheduler)
        _register_collector()
        _state["pages"] = True
        return True


def dask_setup(scheduler: Any) -> None:
    """Preload hook: ``dask scheduler --preload daskvec.dashboard``.

    Importing the module (which the preload does before the scheduler builds its
    dashboard) installs the pages; this hook only checks and logs.
    """
    installed = install()
    logger.info("daskvec dashboard pages %s on scheduler %s",
                "installed" if installed else "unavailable", getattr(scheduler, "address", "?"))


# A preload imports this module before the scheduler builds its dashboard: install now.
install()
