"""The dashboard-load measurement: DaskVecEnv's speed with the daskvec page open vs closed.

:func:`bokeh_routes` and :func:`bokeh_connections` run on the scheduler (through
``client.run_on_scheduler``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from daskvec.bench.envs import action_cycle
from daskvec.bench.measure import _median, _run_window, _Stepper
from daskvec.bench.scenarios import _ACTION_CYCLE, BenchOptions, _cases
from daskvec.monitoring.links import served_pages as bokeh_routes  # the Bokeh app routes a scheduler serves

logger = logging.getLogger(__name__)

__all__ = [
    "bokeh_connections",
    "bokeh_routes",
    "dashboard_entry",
    "find_dashboard_route",
    "format_case",
    "measure_dashboard",
]


def _http_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def find_dashboard_route(client: Any, base: str | None, route: str | None = None) -> str | None:
    """The daskvec page's route on a cluster's dashboard, or ``None`` if it is not served.

    ``route`` wins when given. Otherwise the scheduler's Bokeh routes are searched for
    ``/daskvec`` (the page a user opens), then for any route mentioning daskvec; if
    the scheduler cannot be asked, ``/individual-plots.json`` is searched.
    """
    if route:
        return route if route.startswith("/") else "/" + route
    try:
        routes = list(client.run_on_scheduler(bokeh_routes))
    except Exception as e:
        logger.debug("cannot list the scheduler's dashboard routes: %s", e)
        routes = []
        if base:
            try:
                plots = _http_json(base.rstrip("/") + "/individual-plots.json")
                routes = ["/" + str(p).split("://", 1)[-1].split("/", 1)[-1] for p in plots.values()]
            except (OSError, ValueError) as e2:
                logger.warning("cannot read %s/individual-plots.json: %s", base, e2)
    if "/daskvec" in routes:
        return "/daskvec"
    ours = sorted((r for r in routes if "daskvec" in r.lower()), key=len)
    return ours[0] if ours else None


def bokeh_connections(dask_scheduler: Any = None, route: str = "") -> int:
    """Open (websocket-connected) Bokeh sessions on ``route`` of a scheduler's dashboard.

    Run through ``client.run_on_scheduler``; tells whether a browser really has the page open.
    """
    total = 0
    for app in getattr(getattr(dask_scheduler, "http_application", None), "applications", []):
        contexts = getattr(app, "applications", None)
        if not isinstance(contexts, dict):
            continue
        for path, ctx in contexts.items():
            if route and path.rstrip("/") != route.rstrip("/"):
                continue
            for session in getattr(ctx, "sessions", []):
                total += int(getattr(session, "connection_count", 0) > 0)
    return total


@contextlib.contextmanager
def _open_page(url: str, client: Any, route: str, timeout: float = 90.0) -> Iterator[dict[str, Any]]:
    """Keep ``url`` open in headless chromium (or a Bokeh client subprocess) while inside."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    profile = tempfile.mkdtemp(prefix="daskvec-bench-chromium-")
    if chromium:
        cmd = [
            chromium,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--window-size=1280,900",
            f"--user-data-dir={profile}",
            url,
        ]
        method = "chromium"
    else:
        code = (
            "import sys; from bokeh.client import pull_session; "
            "s = pull_session(url=sys.argv[1]); s.loop_until_closed()"
        )
        cmd = [sys.executable, "-c", code, url]
        method = "bokeh.client"
    before = _connections(client, route)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    state: dict[str, Any] = {"method": method, "connected": False}
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _connections(client, route) > before:
                state["connected"] = True
                break
            time.sleep(0.25)
        if not state["connected"]:
            logger.warning("the dashboard page %s did not connect within %.0fs (%s)", url, timeout, method)
        yield state
    finally:
        _stop_process_group(proc)
        shutil.rmtree(profile, ignore_errors=True)


def _stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    import signal

    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _connections(client: Any, route: str) -> int:
    try:
        return int(client.run_on_scheduler(bokeh_connections, route=route))
    except Exception as e:
        logger.debug("cannot count dashboard sessions: %s", e)
        return 0


def _install_dashboard() -> str | None:
    """Register the daskvec dashboard page before a scheduler starts; say why not if impossible."""
    import importlib

    try:
        dashboard = importlib.import_module("daskvec.dashboard")
    except ImportError as e:
        return f"daskvec.dashboard is not available ({e})"
    install = getattr(dashboard, "install", None)
    if callable(install):
        install()
    return None


def dashboard_entry(opts: BenchOptions, n_envs: int, route: str | None) -> dict[str, Any]:
    """``daskvec bench --dashboard``: :func:`measure_dashboard`, or its error, as the results' ``dashboard``."""
    try:
        return measure_dashboard(opts, n_envs=n_envs, route=route)
    except Exception as e:
        logger.exception("bench: the dashboard measurement failed")
        return {"available": False, "error": f"{type(e).__name__}: {e}"}


def format_case(dash: dict[str, Any]) -> list[str]:
    """The dashboard's line of ``daskvec bench``'s table."""
    if not dash.get("available"):
        return [f"dashboard: not measured ({dash.get('reason') or dash.get('error')})"]
    return [
        f"dashboard ({dash['method']}, {dash['route']}): DaskVecEnv {dash['closed_steps_per_s']:,.0f} env-steps/s "
        f"page closed, {dash['open_steps_per_s']:,.0f} open ({dash['ratio_open_to_closed']:.2f}x)"
        + ("" if dash.get("page_connected") else " [page never connected]")
    ]


def measure_dashboard(opts: BenchOptions, n_envs: int = 8, route: str | None = None) -> dict[str, Any]:
    """DaskVecEnv env-steps/s on CartPole-v1 with the daskvec dashboard page open vs closed.

    Alternates ``opts.repeat`` windows closed/open on one DaskVecEnv and reports the
    medians. The page is opened in headless chromium (a Bokeh client subprocess when
    chromium is missing), and counted as open once its Bokeh session is connected.

    Returns
    -------
    dict
        ``available`` and, when the page was found, ``closed_steps_per_s``,
        ``open_steps_per_s``, ``ratio_open_to_closed``, the route and the method used.
    """
    reason = _install_dashboard()
    from daskvec.sb3.vec_env import DaskVecEnv

    case = _cases("light", [n_envs], opts.heavy_step_s)[0]
    actions = action_cycle(gym.make("CartPole-v1").action_space, n_envs, _ACTION_CYCLE, opts.seed)
    env = DaskVecEnv([case.make for _ in range(n_envs)], **opts.dask_kwargs())
    stepper = _Stepper("dask", env, opts.seed)
    try:
        link = env.dashboard_link
        base = link.rsplit("/", 1)[0] if link else None
        found = find_dashboard_route(env.client, base, route)
        if not found:
            why = reason or (
                f"the scheduler's dashboard at {base} does not serve the daskvec page (a scheduler "
                "must start after `import daskvec.dashboard`, or with `--preload daskvec.dashboard`)"
            )
            return {"available": False, "reason": why, "dashboard_link": link}
        if not base:
            return {"available": False, "reason": "the cluster has no dashboard", "dashboard_link": link}
        url = base.rstrip("/") + found
        stepper.reset()
        pos = _run_window(stepper, actions, 0, opts.warmup, None if opts.steps is None else max(1, opts.steps // 10))[0]
        closed, opened, methods, connected = _alternate_windows(stepper, actions, pos, url, found, opts, n_envs)
        closed_med, open_med = _median(closed), _median(opened)
        return {
            "available": True,
            "url": url,
            "route": found,
            "method": ", ".join(sorted(methods)),
            "page_connected": all(connected),
            "n_envs": n_envs,
            "transport": env.transport_summary(),
            "closed_steps_per_s": closed_med,
            "open_steps_per_s": open_med,
            "closed_runs": closed,
            "open_runs": opened,
            "ratio_open_to_closed": open_med / closed_med if closed_med > 0 else float("nan"),
        }
    finally:
        env.close()


def _alternate_windows(
    stepper: _Stepper, actions: np.ndarray, pos: int, url: str, route: str, opts: BenchOptions, n_envs: int
) -> tuple[list[float], list[float], set[str], list[bool]]:
    """``opts.repeat`` timed windows with the page closed, each followed by one with the page open.

    Returns
    -------
    tuple
        Env-steps/s of the closed and of the open windows, the methods that opened the
        page, and whether each opened page connected.
    """
    closed: list[float] = []
    opened: list[float] = []
    methods: set[str] = set()
    connected: list[bool] = []
    for _ in range(opts.repeat):
        n, el = _run_window(stepper, actions, pos, opts.seconds, opts.steps)
        pos += n
        closed.append(n * n_envs / el)
        with _open_page(url, stepper.env.client, route) as state:
            time.sleep(1.0)  # let the page's first full render pass before timing
            n, el = _run_window(stepper, actions, pos, opts.seconds, opts.steps)
            pos += n
            opened.append(n * n_envs / el)
            methods.add(state["method"])
            connected.append(bool(state["connected"]))
    return closed, opened, methods, connected
