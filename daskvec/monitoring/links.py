"""Dashboard links that are checked before they are shown.

A Dask scheduler always answers HTTP on its dashboard port, but it serves Dask's pages
(``/status``...) only when Bokeh is installed where it runs and its dashboard is on,
and the daskvec page (``/daskvec``) only when daskvec's pages were installed before it
started (see :mod:`daskvec.dashboard`). Otherwise ``client.dashboard_link`` still gives
a link, to a stub page or a 404. :func:`check_dashboard` asks the scheduler which pages
it serves, so that ``daskvec train``, the embedded cluster's log line and the notebook
view of a :class:`~daskvec.DaskVecEnv` show a link only to a page that exists, and say
why otherwise.

This module imports neither Bokeh nor :mod:`daskvec.dashboard`: it must work where they
are missing, which is what it reports on.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from daskvec._core import dask_internals as _dask

logger = logging.getLogger(__name__)

__all__ = ["DashboardLinks", "check_dashboard", "served_pages"]

#: What is missing, and what to do about it.
NO_PAGES = (
    "the scheduler's dashboard serves no pages: Bokeh is missing (or too old for Dask) where the "
    "scheduler runs, or its dashboard is turned off (dashboard_address=None, `dask scheduler "
    "--no-dashboard`); install daskvec, which depends on Bokeh, in the scheduler's environment"
)
NO_DASKVEC_PAGE = (
    "the scheduler does not serve the daskvec page: it started before daskvec's pages were installed; "
    "start it with `dask scheduler --preload daskvec.dashboard`, or after `import daskvec.dashboard`"
)


def served_pages(dask_scheduler: Any = None) -> list[str]:
    """The Bokeh pages a scheduler's dashboard serves, e.g. ``["/daskvec", "/status", ...]``.

    Run on the scheduler (``client.run_on_scheduler``). Dask's pages are Bokeh
    applications in the scheduler's HTTP application; the stub ``/status`` Dask
    serves without Bokeh is not one of them.
    """
    routes: list[str] = []
    for app in getattr(getattr(dask_scheduler, "http_application", None), "applications", []):
        contexts = getattr(app, "applications", None)
        if isinstance(contexts, dict):
            routes.extend(str(path) for path in contexts)
    return sorted(routes)


@dataclass(frozen=True)
class DashboardLinks:
    """The dashboard links of a cluster that can be shown, and why others cannot.

    Attributes
    ----------
    status : str or None
        Dask's dashboard (its ``/status`` page), when the scheduler serves it.
    daskvec : str or None
        The daskvec page, when the scheduler serves it.
    problem : str or None
        Why a page is missing, or why it could not be checked.
    checked : bool
        Whether the scheduler's pages could be listed; when not, ``status`` is the
        link Dask gives, unchecked.
    """

    status: str | None
    daskvec: str | None = None
    problem: str | None = None
    checked: bool = True

    def lines(self) -> list[str]:
        """What to print: the dashboard line, and the daskvec page line when the dashboard is there."""
        if self.status is None:
            return [f"Dask dashboard: not available: {self.problem}"]
        if not self.checked:
            return [f"Dask dashboard: {self.status} (not checked: {self.problem})"]
        page = self.daskvec if self.daskvec else f"not served: {self.problem}"
        return [f"Dask dashboard: {self.status}", f"daskvec page: {page}"]

    def describe(self) -> str:
        """The same in one line, for log messages."""
        return "; ".join(self.lines())


def _base(link: str) -> str:
    link = link.rstrip("/")
    return link[: -len("/status")] if link.endswith("/status") else link


def _pages_over_http(base: str, timeout: float) -> set[str]:
    """Which of ``/daskvec`` and ``/status`` answer with a Bokeh page, fetched over HTTP.

    Without Bokeh, Dask answers ``/status`` with a short stub and no script; a Bokeh
    page always embeds scripts.

    Raises
    ------
    OSError
        The dashboard cannot be reached from here.
    """
    served = set()
    for page in ("/daskvec", "/status"):
        try:
            with urllib.request.urlopen(f"{base}{page}", timeout=timeout) as resp:
                if resp.status == 200 and b"<script" in resp.read():
                    served.add(page)
        except urllib.error.HTTPError as e:  # 404 and the like: the page is not there
            logger.debug("GET %s%s: %s", base, page, e)
    return served


def check_dashboard(client: Any, timeout: float = 10.0) -> DashboardLinks:
    """Which dashboard pages the client's scheduler serves, as links to show.

    The scheduler is asked for its Bokeh pages; if it cannot be (it cannot import
    daskvec, say), the pages are fetched over HTTP instead. Each request takes at most
    ``timeout`` seconds.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.
    timeout : float
        Seconds each way of asking may take.

    Returns
    -------
    DashboardLinks
    """
    try:
        link = client.dashboard_link
    except Exception as e:  # Dask formats the link from config templates, which can fail
        return DashboardLinks(None, problem=f"Dask could not give the dashboard's address ({e})")
    if not link:
        return DashboardLinks(None, problem="the scheduler runs no dashboard server")
    link = str(link)
    base = _base(link)
    try:
        pages = set(_dask.run_on_scheduler(client, served_pages, timeout=timeout))
    except Exception as e:
        logger.debug("cannot ask the scheduler for its dashboard pages (%s); fetching them from %s", e, base)
        try:
            pages = _pages_over_http(base, timeout)
        except Exception as e2:
            return DashboardLinks(link, problem=f"the scheduler's pages could not be listed ({e2})", checked=False)
    if "/status" not in pages:
        return DashboardLinks(None, problem=NO_PAGES)
    if "/daskvec" not in pages:
        return DashboardLinks(link, problem=NO_DASKVEC_PAGE)
    return DashboardLinks(link, f"{base}/daskvec")
