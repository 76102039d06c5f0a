"""The daskvec page of the Dask dashboard, and its Prometheus metrics.

Dask shows nothing about actors: their method calls never reach the scheduler. This
page fills the gap from two cheap sources that already travel to the scheduler:

- the ``daskvec_*`` scalar metrics that every worker holding envs sends with its
  heartbeat (see :mod:`daskvec.monitoring.metrics`), found in ``WorkerState.metrics``;
- the event each :class:`~daskvec.DaskVecEnv` logs every few seconds under the topic
  :data:`~daskvec.monitoring.metrics.CLIENT_TOPIC` with its time split (client / transit / envs)
  and, when a daskvec learner drives it, the learner's timeline (collection against learning).

Pages (Bokeh apps on the scheduler's dashboard)
    ``/daskvec``
        the whole page, with the dashboard's navigation bar (a "Daskvec" link is added
        to it);
    ``/individual-daskvec``
        the same without the navigation, listed in ``/individual-plots.json`` (so
        dask-labextension can open it in JupyterLab);
    ``/individual-daskvec-workers``, ``/individual-daskvec-throughput``, ``/individual-daskvec-time-split``,
    ``/individual-daskvec-timeline``
        each plot on its own.

Registration
    :func:`install` adds the pages to ``distributed.dashboard.scheduler.applications``;
    a scheduler started afterwards in this process serves them (``LocalCluster``,
    dask-jobqueue clusters, the cluster ``DaskVecEnv`` starts itself).
    ``from daskvec import DaskVecEnv`` calls it (through
    :func:`daskvec.cluster.clients.install_dashboard_page`), and so does the cluster
    ``DaskVecEnv`` starts itself. For a standalone scheduler use the preload:
    ``dask scheduler --preload daskvec.dashboard``.

Modules
    :mod:`~daskvec.dashboard.data`
        :class:`Snapshot` and :func:`snapshot`: what the page shows, read from a scheduler;
    :mod:`~daskvec.dashboard.components`
        the Bokeh components (:class:`WorkerLoad`, :class:`Throughput`, :class:`TimeSplit`,
        :class:`Timeline`, :class:`DaskvecDashboard`);
    :mod:`~daskvec.dashboard.prometheus`
        :class:`PrometheusCollector` and :data:`PROMETHEUS_METRICS`;
    this package
        the Bokeh documents, :data:`ROUTES`, :func:`install` and the preload hook
        :func:`dask_setup`. Every name above is importable from ``daskvec.dashboard``.

Dask internals used (no public API extends the scheduler's Bokeh application)
    ``distributed.dashboard.scheduler.applications``
        where the pages are registered (:func:`install`), as Dask's own docs describe
        for preloads;
    ``distributed.dashboard.scheduler.template_variables``
        the (memoized) Jinja template variables of the dashboard, wrapped to add the
        "Daskvec" navigation link;
    ``distributed.dashboard.components``
        ``DashboardComponent`` and ``add_periodic_callback`` (the component base class
        and refresh Dask's own pages use), and from ``.scheduler`` the ``BOKEH_THEME``
        and the Jinja ``env`` whose ``simple.html`` template frames ``/daskvec``;
    ``distributed.scheduler.Scheduler._instances``
        the schedulers of this process, which the Prometheus collector reads.

This package imports Bokeh: it is imported on the client and the scheduler only, never
on workers.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from distributed.dashboard.components import DashboardComponent, add_periodic_callback

# the private _FROM_METRIC and _time_split are re-exported for tests/test_dashboard.py
from daskvec.dashboard.components import (
    BAR_COLOR,
    TIMELINE_COLORS,
    DaskvecDashboard,
    Throughput,
    Timeline,
    TimeSplit,
    WorkerLoad,
)
from daskvec.dashboard.data import _FROM_METRIC as _FROM_METRIC
from daskvec.dashboard.data import TIMELINE_COLUMNS, WORKER_COLUMNS, Snapshot, snapshot
from daskvec.dashboard.data import _time_split as _time_split
from daskvec.dashboard.prometheus import PROMETHEUS_METRICS, PrometheusCollector

logger = logging.getLogger(__name__)

__all__ = [
    "BAR_COLOR",
    "PROMETHEUS_METRICS",
    "ROUTES",
    "TIMELINE_COLORS",
    "TIMELINE_COLUMNS",
    "WORKER_COLUMNS",
    "DaskvecDashboard",
    "PrometheusCollector",
    "Snapshot",
    "Throughput",
    "TimeSplit",
    "Timeline",
    "WorkerLoad",
    "dask_setup",
    "daskvec_doc",
    "install",
    "snapshot",
]


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
    "/individual-daskvec-timeline": _individual(Timeline),
}
_NAV_PAGE = "daskvec"


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
    logger.info(
        "daskvec dashboard pages %s on scheduler %s",
        "installed" if installed else "unavailable",
        getattr(scheduler, "address", "?"),
    )


# A preload imports this package before the scheduler builds its dashboard: install now.
install()
