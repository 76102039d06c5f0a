"""The Bokeh components of the daskvec page: per-worker load, throughput, time split, timeline, the whole page.

Each is a Dask ``DashboardComponent`` (``update()`` refreshes it, called periodically
by the Bokeh document); they read the scheduler through :func:`~daskvec.dashboard.data.snapshot`.
"""

from __future__ import annotations

from typing import Any

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, DataRange1d, FactorRange, HoverTool, Range1d
from bokeh.models.widgets import DataTable, NumberFormatter, TableColumn
from bokeh.models.widgets.markups import Div
from bokeh.plotting import figure
from distributed.dashboard.components import DashboardComponent

from daskvec.dashboard.data import _PARTS, WORKER_COLUMNS, Snapshot, snapshot
from daskvec.monitoring.metrics import TIMELINE_ROWS

__all__ = ["BAR_COLOR", "TIMELINE_COLORS", "DaskvecDashboard", "Throughput", "TimeSplit", "Timeline", "WorkerLoad"]

_PART_LABELS = {"client": "on the client", "transit": "in transit", "env": "inside the envs"}
_PART_COLORS = {"client": "#8c564b", "transit": "#ff7f0e", "env": "#1f77b4"}
#: Fill colour of the per-worker bars (the browser test looks for it in a screenshot).
BAR_COLOR = "#2ca02c"
_HISTORY = 1200  # points kept in the throughput timeseries
_TIMELINE_LABELS = {
    "collecting": "envs collecting",
    "replaying": "learner replaying",
    "training": "learner training",
    "waiting": "learner waiting",
}
#: Fill colour of each kind of the timeline's bars: waiting in red, to stand out (the
#: browser test looks for them in a screenshot; none is :data:`BAR_COLOR`).
TIMELINE_COLORS: dict[str, str] = {
    "collecting": "#1f77b4",
    "replaying": "#c5b0d5",
    "training": "#9467bd",
    "waiting": "#d62728",
}


def _set(source: ColumnDataSource, data: dict[str, list[Any]]) -> None:
    if dict(source.data) != data:
        source.data = data


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


class Timeline(DashboardComponent):
    """Collection against learning: when the envs collected, and when the learner trained or waited.

    Two rows, ``envs`` and ``learner``, of bars over time: a gap in the envs' row is the
    envs standing still (the learner is busy), red in the learner's is the learner waiting
    for the envs. From the timeline the newest vec env fed by a daskvec learner sent (see
    :class:`~daskvec.monitoring.metrics.LearnerTimeline`); empty otherwise.

    ``source`` has one row per interval: ``row``, ``kind``, ``label``, ``start`` and
    ``end`` (epoch milliseconds), ``seconds`` and ``color``.
    """

    source: ColumnDataSource
    root: Any

    def __init__(self, scheduler: Any, **kwargs: Any) -> None:
        self.scheduler = scheduler
        self.source = ColumnDataSource(
            {"row": [], "kind": [], "label": [], "start": [], "end": [], "seconds": [], "color": []},
            name="daskvec-timeline",
        )
        # a categorical axis lists its factors upwards: the learner at the bottom, the envs above
        rows = sorted(set(TIMELINE_ROWS.values()), reverse=True)
        self.root = figure(
            title="Collection against learning",
            x_axis_type="datetime",
            y_range=FactorRange(factors=rows),
            tools="",
            toolbar_location=None,
            height=200,
            name="daskvec-timeline-plot",
            **kwargs,
        )
        self.root.hbar(
            y="row", left="start", right="end", height=0.7, color="color", legend_field="label", source=self.source
        )
        self.root.ygrid.visible = False
        legend = self.root.legend[0]
        legend.orientation = "horizontal"
        legend.border_line_alpha = 0
        self.root.add_layout(legend, "below")  # beside the bars, not over them
        self.root.add_tools(HoverTool(tooltips=[("", "@label"), ("seconds", "@seconds{0.000}")]))

    def update(self, snap: Snapshot | None = None) -> None:
        """Refresh from the latest client events."""
        snap = snap or snapshot(self.scheduler)
        self.root.title.text = "Collection against learning" + ("" if snap.timeline_live else " (last run)")
        t = snap.timeline
        _set(
            self.source,
            {
                "row": list(t["row"]),
                "kind": list(t["kind"]),
                "label": [_TIMELINE_LABELS[k] for k in t["kind"]],
                "start": [s * 1000.0 for s in t["start"]],
                "end": [e * 1000.0 for e in t["end"]],
                "seconds": [e - s for s, e in zip(t["start"], t["end"], strict=True)],
                "color": [TIMELINE_COLORS[k] for k in t["kind"]],
            },
        )


class DaskvecDashboard(DashboardComponent):
    """The whole daskvec page: a status line, per-worker load, throughput, time split and timeline.

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
        self.timeline = Timeline(scheduler, **kwargs)
        self.status = Div(text="", name="daskvec-status", styles={"font-size": "14px", "padding": "4px 8px"})
        self.source = self.workers.source
        sizing = {k: v for k, v in kwargs.items() if k == "sizing_mode"}
        self.root = column(
            self.status,
            row(self.workers.bars, column(self.throughput.root, self.time_split.root, **sizing), **sizing),
            self.timeline.root,
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
        self.timeline.update(snap)
