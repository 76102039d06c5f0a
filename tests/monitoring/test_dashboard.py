"""The daskvec dashboard page, its Prometheus metrics and the worker-side figures.

Component tests build the page against the in-process scheduler of a real 2-process
``LocalCluster``, drive a ``DaskVecEnv``, wait for the workers' heartbeats and check
``source.data`` per worker against numbers known from the env (``CountingEnv`` pays
the action as reward and ends episodes after ``horizon`` steps).
"""

from __future__ import annotations

import itertools
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from envs import CountingEnv
from scripted_envs import ScriptedEnv
from waiting import wait_until

from daskvec import dashboard
from daskvec.monitoring import metrics
from daskvec.monitoring.metrics import CLIENT_TOPIC, WORKER_METRICS, ClientTimer, GroupStats

pytest.importorskip("bokeh")
pytest.importorskip("prometheus_client")

HORIZON = 10
N_ENVS = 4
MIN_STEPS = 60
INDIVIDUAL = [r for r in dashboard.ROUTES if r.startswith("/individual-")]


def http_get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return r.status, r.read().decode()


def prometheus_samples(text: str) -> dict[str, float]:
    """``{'name{labels}': value}`` for every sample line of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


# --------------------------------------------------------------------------- no cluster
def test_group_stats_counters_survive_forget() -> None:
    before = metrics.worker_summary()
    a, b = GroupStats(2), GroupStats(3)
    metrics.install_worker_metrics(None, a)
    metrics.install_worker_metrics(None, b)
    a.record_step(2, 0.001)
    a.record_episode(5.0)
    a.errors += 1
    b.record_step(3, 0.003)
    b.restarts += 2
    live = metrics.worker_summary()
    assert live["daskvec_envs"] == before["daskvec_envs"] + 5
    assert live["daskvec_steps"] == before["daskvec_steps"] + 5
    metrics.forget(a)
    metrics.forget(a)  # twice: counted once
    metrics.forget(b)
    after = metrics.worker_summary()
    assert after["daskvec_envs"] == before["daskvec_envs"]
    for name, added in (("daskvec_steps", 5), ("daskvec_episodes", 1), ("daskvec_errors", 1), ("daskvec_restarts", 2)):
        assert after[name] == before[name] + added, name


def test_worker_summary_is_computed_once_per_heartbeat() -> None:
    stats = GroupStats(1)
    metrics.install_worker_metrics(None, stats)
    try:
        first = metrics.worker_summary(max_age=60.0)
        stats.record_step(1, 0.001)
        assert metrics.worker_summary(max_age=60.0) is first  # cached within max_age
        assert metrics.worker_summary()["daskvec_steps"] == first["daskvec_steps"] + 1
    finally:
        metrics.forget(stats)


def test_client_message_carries_cumulative_seconds() -> None:
    timer = ClientTimer()
    timer.sent()
    timer.received(0.0)
    msg = metrics.client_message(timer, num_envs=3, restarts=1, closed=True)
    assert msg["id"] == timer.id and msg["num_envs"] == 3 and msg["restarts"] == 1 and msg["closed"] is True
    assert msg["vec_steps"] == 1
    assert set(msg["seconds"]) == {"client", "transit", "env"} == set(msg["shares"])
    assert msg["seconds"]["transit"] > 0 and msg["seconds"]["env"] == 0.0


def _msg(i: str, t: float, client: float, transit: float, env: float, closed: bool = False) -> dict[str, Any]:
    return {"id": i, "time": t, "closed": closed, "seconds": {"client": client, "transit": transit, "env": env}}


def test_time_split_uses_recent_window_and_sums_running_envs() -> None:
    now = 1000.0
    msgs = [
        _msg("a", now - 30, 100.0, 100.0, 100.0),
        _msg("a", now - 12, 101.0, 101.0, 101.0),  # the base: >= 10 s before the latest
        _msg("a", now - 5, 101.5, 101.5, 101.5),
        _msg("a", now - 1, 102.0, 104.0, 107.0),
        _msg("b", now - 1, 1.0, 0.0, 0.0),  # a second vec env, no base: cumulative
        _msg("c", now - 100, 5.0, 5.0, 5.0),
        _msg("c", now - 90, 9.0, 9.0, 9.0, closed=True),
    ]
    seconds, live, last_closed, running = dashboard._time_split(msgs, now)
    assert live and running == 2
    assert seconds == {"client": 1.0 + 1.0, "transit": 3.0, "env": 6.0}
    assert last_closed == now - 90
    # nothing running: the last run's split, marked as not live
    seconds, live, last_closed, running = dashboard._time_split(msgs[-2:], now)
    assert not live and running == 0 and seconds == {"client": 4.0, "transit": 4.0, "env": 4.0}
    assert dashboard._time_split([], now) == ({"client": 0.0, "transit": 0.0, "env": 0.0}, False, None, 0)


def test_install_is_idempotent_and_links_the_navigation() -> None:
    import distributed.dashboard.scheduler as dsched

    assert dashboard.install() and dashboard.install()
    for route, fn in dashboard.ROUTES.items():
        assert dsched.applications[route] is fn
    wrapped = dsched.template_variables
    assert getattr(wrapped, "_daskvec", False)
    dashboard._add_nav(dsched)
    assert dsched.template_variables is wrapped  # not wrapped twice


@pytest.mark.timeout(120)
@pytest.mark.processes
def test_importing_daskvecenv_installs_the_page() -> None:
    import subprocess
    import sys

    code = (
        "import distributed.dashboard.scheduler as d\n"
        "assert '/daskvec' not in d.applications\n"
        "from daskvec import DaskVecEnv\n"
        "assert all(r in d.applications for r in "
        "('/daskvec', '/individual-daskvec', '/individual-daskvec-workers'))\n"
        "import prometheus_client\n"
        "assert 'dask_daskvec_envs' in prometheus_client.generate_latest().decode()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=110)


# --------------------------------------------------------------------------- clusters
def _local_cluster() -> Any:
    from distributed import LocalCluster

    dashboard.install()  # before the scheduler starts, as reaching for daskvec.DaskVecEnv does
    return LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0", silence_logs=40
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """The cluster of the ``stepped`` tests: its DaskVecEnv is never closed by a test."""
    with _local_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: Any) -> Iterator[Any]:
    from distributed import Client

    with Client(cluster, direct_to_workers=True, set_as_default=False) as c:
        yield c


@pytest.fixture
def fresh() -> Iterator[tuple[Any, Any]]:
    """A cluster of the test's own, for figures that must start from zero: ``(cluster, client)``."""
    from distributed import Client

    with _local_cluster() as c, Client(c, direct_to_workers=True, set_as_default=False) as cl:
        yield c, cl


class Stepped:
    """A DaskVecEnv of ``N_ENVS`` ``CountingEnv`` stepped ``n`` times with action 1 so far."""

    def __init__(self, env: Any, scheduler: Any) -> None:
        self.env = env
        self.scheduler = scheduler
        self.n = 0
        self.ones = np.ones(env.num_envs, dtype=np.int64)
        self.per_worker: dict[str, int] = {}
        for g in env.groups:
            self.per_worker[g["worker"]] = self.per_worker.get(g["worker"], 0) + len(g["envs"])

    @classmethod
    def start(cls, client: Any, scheduler: Any) -> Stepped:
        """Make the env, step it until it has logged its time split once, and wait for the heartbeats."""
        from daskvec import DaskVecEnv

        env = DaskVecEnv([lambda: CountingEnv(horizon=HORIZON) for _ in range(N_ENVS)], client=client, timeout=60)
        try:
            env.reset()
            s = cls(env, scheduler)
            deadline = time.monotonic() + 60
            # step until the vec env has logged its time split once (every 2 s while stepping)
            while s.n < MIN_STEPS or not s.reported():
                s.step(1)
                assert time.monotonic() < deadline, "the DaskVecEnv never reported to the scheduler"
            s.wait_heartbeats()
        except BaseException:
            env.close()
            raise
        return s

    def step(self, count: int) -> None:
        for _ in range(count):
            self.env.step(self.ones)
            self.n += 1

    def reported(self) -> bool:
        return any(m.get("id") == self.env.timer.id for _, m in self.scheduler.get_events(CLIENT_TOPIC))

    def wait_heartbeats(self) -> None:
        """Block until every worker's heartbeat counts all ``n`` steps."""

        def arrived() -> bool:
            return all(
                self.scheduler.workers[w].metrics.get("daskvec_steps") == k * self.n for w, k in self.per_worker.items()
            )

        wait_until(arrived, 30, "heartbeats with every step")


@pytest.fixture(scope="module")
def stepped(cluster: Any, client: Any) -> Iterator[Stepped]:
    s = Stepped.start(client, cluster.scheduler)
    try:
        yield s
    finally:
        s.env.close()


@pytest.mark.processes
def test_page_before_any_env_says_so(fresh: tuple[Any, Any]) -> None:
    cluster, _ = fresh
    page = dashboard.DaskvecDashboard(cluster.scheduler)
    page.update()
    assert "No DaskVecEnv is running on this cluster yet" in page.status.text
    data = page.source.data
    assert sorted(data["address"]) == sorted(cluster.scheduler.workers)
    assert list(data["envs"]) == [0.0, 0.0] and list(data["steps_per_s"]) == [0.0, 0.0]
    assert list(page.time_split.source.data["share"]) == [0.0, 0.0, 0.0]
    assert list(page.throughput.source.data["steps_per_s"]) == [0.0]


def test_page_per_worker_figures_while_running(cluster: Any, stepped: Stepped) -> None:
    scheduler = cluster.scheduler
    page = dashboard.DaskvecDashboard(scheduler)
    assert len(stepped.per_worker) == 2, "the envs should be spread over both workers"

    def rate_shown() -> bool:
        # a rate covers the last 5 s: step while polling, so that it never depends on
        # how long ago (or in which order) the other tests stepped the shared env
        stepped.step(1)
        page.update()
        rates = dict(zip(page.source.data["address"], page.source.data["steps_per_s"], strict=True))
        return all(rates[w] > 0 for w in stepped.per_worker)

    wait_until(rate_shown, 60, "a positive env-steps/s on every worker while stepping")
    assert page.throughput.source.data["steps_per_s"][-1] == pytest.approx(sum(page.source.data["steps_per_s"]))
    stepped.wait_heartbeats()  # stopped: the counters settle on the steps taken
    page.update()
    n = stepped.n
    assert page.status.text.startswith("1 DaskVecEnv running: 4 envs in 2 env groups on 2 workers")
    data = page.source.data
    rows = {a: i for i, a in enumerate(data["address"])}
    assert set(rows) == set(stepped.per_worker)
    for w, k in stepped.per_worker.items():
        i = rows[w]
        assert data["envs"][i] == k
        assert 0 < data["step_p50_ms"][i] <= data["step_p99_ms"][i]
        assert data["episodes"][i] == k * (n // HORIZON)
        assert data["mean_return"][i] == pytest.approx(float(HORIZON))  # reward = action = 1 per step
        assert data["errors"][i] == 0 and data["restarts"][i] == 0
        # the same figures as the heartbeat brought to the scheduler
        m = scheduler.workers[w].metrics
        for col, name in dashboard._FROM_METRIC.items():
            if col in data and col != "steps_per_s":  # a rate: a heartbeat may have come in between
                assert data[col][i] == m[name], col
    # the bars draw the table's source; the throughput line is the sum of the workers' rates
    assert page.workers.bars.renderers[0].data_source is page.source
    assert page.throughput.source.data["steps_per_s"][-1] == pytest.approx(sum(data["steps_per_s"]))
    split = dict(zip(page.time_split.source.data["part"], page.time_split.source.data["share"], strict=True))
    assert sum(split.values()) == pytest.approx(1.0)
    assert split["transit"] > 0 and split["env"] > 0 and split["client"] >= 0
    assert page.time_split.root.title.text == "Where step time goes"
    # the individual components agree with the whole page
    for cls, attr in ((dashboard.WorkerLoad, "workers"), (dashboard.TimeSplit, "time_split")):
        part = cls(scheduler)
        part.update()
        same = getattr(page, attr).source.data
        for col in part.source.data:
            if col != "steps_per_s":  # a rate: may move with a heartbeat in between
                assert list(part.source.data[col]) == list(same[col]), col


def test_workers_page_shows_the_figures_as_columns(cluster: Any, stepped: Stepped) -> None:
    stepped.wait_heartbeats()  # settled, whatever the tests before it stepped
    from distributed.dashboard.components.scheduler import WorkerTable

    table = WorkerTable(cluster.scheduler)
    assert set(WORKER_METRICS) <= set(table.extra_names)
    table.update()
    data = table.source.data
    for w, k in stepped.per_worker.items():
        i = list(data["address"]).index(w)
        assert data["daskvec_envs"][i] == k
        assert data["daskvec_steps"][i] == k * stepped.n


def test_prometheus_collector_per_worker(cluster: Any, stepped: Stepped) -> None:
    stepped.wait_heartbeats()  # settled, whatever the tests before it stepped
    collector = dashboard.PrometheusCollector(lambda: [cluster.scheduler])
    families = {f.name: f for f in collector.collect()}
    assert {f.name + ("_total" if f.type == "counter" else "") for f in families.values()} == set(
        dashboard.PROMETHEUS_METRICS
    )
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    for w, k in stepped.per_worker.items():
        assert samples[("dask_daskvec_envs", (("worker", w),))] == k
        assert samples[("dask_daskvec_env_steps_total", (("worker", w),))] == k * stepped.n
        assert samples[("dask_daskvec_episodes_total", (("worker", w),))] == k * (stepped.n // HORIZON)
        assert samples[("dask_daskvec_mean_episode_return", (("worker", w),))] == pytest.approx(HORIZON)
        p50 = samples[("dask_daskvec_step_latency_seconds", (("quantile", "0.5"), ("worker", w)))]
        p99 = samples[("dask_daskvec_step_latency_seconds", (("quantile", "0.99"), ("worker", w)))]
        assert 0 < p50 <= p99
    assert samples[("dask_daskvec_env_groups", ())] == 2
    assert samples[("dask_daskvec_vec_envs", ())] == 1
    shares = [samples[("dask_daskvec_client_time_share", (("part", p),))] for p in ("client", "transit", "env")]
    assert sum(shares) == pytest.approx(1.0)


@pytest.mark.timeout(120)
def test_http_every_route_and_metric(cluster: Any, stepped: Stepped) -> None:
    stepped.wait_heartbeats()  # settled, whatever the tests before it stepped
    port = cluster.scheduler.http_server.port
    for route in dashboard.ROUTES:
        status, body = http_get(port, route)
        assert status == 200, route
        assert "bokeh" in body.lower(), route
        if route.startswith("/individual-"):  # the page itself, no template
            assert "<title>Dask: daskvec" in body, route
    # the navigation links the page, on daskvec's page and on Dask's own
    for route in ("/daskvec", "/status"):
        assert '<a href="daskvec">Daskvec</a>' in http_get(port, route)[1], route
    plots = json.loads(http_get(port, "/individual-plots.json")[1])
    assert set(INDIVIDUAL) <= set(plots.values())
    text = http_get(port, "/metrics")[1]
    for name in dashboard.PROMETHEUS_METRICS:
        assert f"\n{name}" in text, name
    samples = prometheus_samples(text)
    for w, k in stepped.per_worker.items():
        assert samples[f'dask_daskvec_envs{{worker="{w}"}}'] == k
        assert samples[f'dask_daskvec_env_steps_total{{worker="{w}"}}'] == k * stepped.n
        assert samples[f'dask_daskvec_env_errors_total{{worker="{w}"}}'] == 0
    assert samples["dask_daskvec_env_groups"] == 2
    assert samples["dask_daskvec_vec_envs"] == 1


@pytest.mark.processes
def test_each_schedulers_metrics_count_only_its_own_envs(
    cluster: Any, stepped: Stepped, fresh: tuple[Any, Any]
) -> None:
    """Two schedulers in one process (a notebook, a test session): each ``/metrics`` is its own.

    The collector sits in the process-wide ``prometheus_client`` registry; it once summed
    every running scheduler, so a page counted another cluster's groups (seen in CI as 3
    groups where the env had 2, a group of an earlier test's cluster still running).
    """
    from daskvec import DaskVecEnv

    other, other_client = fresh
    env = DaskVecEnv([lambda: CountingEnv(horizon=HORIZON)], client=other_client, timeout=60)
    try:
        env.reset()
        held = lambda: sum(ws.metrics.get("daskvec_envs", 0) for ws in other.scheduler.workers.values())  # noqa: E731
        wait_until(lambda: held() == 1, 30, "a heartbeat with the other cluster's env")
        ports = {"stepped": cluster.scheduler.http_server.port, "other": other.scheduler.http_server.port}
        expected = {"stepped": (2, N_ENVS), "other": (1, 1)}
        for name in ("stepped", "other", "stepped", "other"):  # alternated: no page follows the last one served
            samples = prometheus_samples(http_get(ports[name], "/metrics")[1])
            envs = sum(v for k, v in samples.items() if k.startswith("dask_daskvec_envs{"))
            assert (samples["dask_daskvec_env_groups"], envs) == expected[name], name
    finally:
        env.close()


@pytest.mark.processes
def test_a_malformed_client_event_is_skipped_with_one_log_line(
    fresh: tuple[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Any Dask client can log under the daskvec topic: garbage there breaks neither the page nor ``/metrics``."""
    import logging

    cluster, client = fresh
    scheduler = cluster.scheduler
    s = Stepped.start(client, scheduler)
    try:
        garbage: list[Any] = [
            {"id": "a", "time": "yesterday", "seconds": {"client": 1.0}},
            {"id": "b", "time": time.time(), "seconds": "lots"},
            {"id": "c", "seconds": {}},
            {"id": s.env.timer.id, "time": time.time(), "seconds": {"client": None}},  # posing as the real env
            "not even a dict",
        ]
        for msg in garbage:
            client.log_event(CLIENT_TOPIC, msg)
        wait_until(lambda: len(scheduler.get_events(CLIENT_TOPIC)) >= 1 + len(garbage), 30, "the events logged")
        s.wait_heartbeats()
        page = dashboard.DaskvecDashboard(scheduler)
        port = scheduler.http_server.port
        with caplog.at_level(logging.WARNING, logger="daskvec.dashboard"):
            for _ in range(3):  # the page refreshes every second; Prometheus scrapes too
                page.update()
                text = http_get(port, "/metrics")[1]
        status = page.status.text
        assert status.startswith("1 DaskVecEnv running: 4 envs in 2 env groups on 2 workers"), status
        split = dict(zip(page.time_split.source.data["part"], page.time_split.source.data["share"], strict=True))
        assert sum(split.values()) == pytest.approx(1.0) and split["env"] > 0  # the real env's split
        for name in dashboard.PROMETHEUS_METRICS:
            assert f"\n{name}" in text, name
        samples = prometheus_samples(text)
        for w, k in s.per_worker.items():
            assert samples[f'dask_daskvec_envs{{worker="{w}"}}'] == k
            assert samples[f'dask_daskvec_env_steps_total{{worker="{w}"}}'] == k * s.n
        # /metrics sums every scheduler of this process (the module's cluster too): count this one's alone
        ours = {f.name: f for f in dashboard.PrometheusCollector(lambda: [scheduler]).collect()}
        assert ours["dask_daskvec_vec_envs"].samples[0].value == 1  # the real env, the impostor skipped
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("daskvec.dashboard")]
        assert len(lines) == 1 and "malformed" in lines[0], lines
    finally:
        s.env.close()


def test_every_bokeh_document_builds(cluster: Any, stepped: Stepped) -> None:
    from bokeh.document import Document

    extra = {"prefix": "/", "pages": ["status", "daskvec"], "plots": [], "jupyter": False}
    for route, fn in dashboard.ROUTES.items():
        doc = Document()
        fn(cluster.scheduler, dict(extra), doc)
        assert len(doc.roots) == 1, route
        assert doc.session_callbacks, f"{route} is not live-updating"
        names = {m.name for m in doc.roots[0].references() if m.name}
        if route in ("/daskvec", "/individual-daskvec", "/individual-daskvec-workers"):
            assert "daskvec-workers" in names, route


def test_repr_html_lists_workers_and_envs(stepped: Stepped) -> None:
    html = stepped.env._repr_html_()
    link = stepped.env.dashboard_link
    assert link and link in html
    assert "/daskvec" in html
    assert f"{N_ENVS} envs in 2 groups on 2 workers" in html
    for g in stepped.env.groups:
        assert g["worker"] in html
        assert f"{g['envs'][0]}-{g['envs'][-1]}" in html


@pytest.mark.processes
def test_page_after_close_says_so(fresh: tuple[Any, Any]) -> None:
    cluster, client = fresh
    scheduler = cluster.scheduler
    stepped = Stepped.start(client, scheduler)  # its own env: closing it leaves the other tests alone
    try:
        page = dashboard.DaskvecDashboard(scheduler)
        page.update()
        assert page.last is not None and page.last.running
    finally:
        stepped.env.close()
    assert "closed" in stepped.env._repr_html_()

    def emptied() -> bool:
        return all(scheduler.workers[w].metrics.get("daskvec_envs") == 0 for w in stepped.per_worker)

    wait_until(emptied, 30, "heartbeats without envs")
    page.update()
    assert page.status.text.startswith("No DaskVecEnv is running: the last one closed at")
    data = page.source.data
    rows = {a: i for i, a in enumerate(data["address"])}
    for w, k in stepped.per_worker.items():
        i = rows[w]
        assert data["envs"][i] == 0 and data["steps_per_s"][i] == 0
        assert data["episodes"][i] == k * (stepped.n // HORIZON)  # counters survive the close
    assert page.time_split.root.title.text.endswith("(last run)")
    assert sum(page.time_split.source.data["share"]) == pytest.approx(1.0)
    assert page.throughput.source.data["steps_per_s"][-1] == 0.0
    status, _ = http_get(scheduler.http_server.port, "/individual-daskvec")
    assert status == 200


# --------------------------------------------------------------------------- known figures, end to end
def prometheus_labelled(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``{(name, labels): value}`` for every sample line of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if m and not line.startswith("#"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def per_worker_envs(env: Any) -> dict[str, list[int]]:
    """``{worker address: [env indices]}`` of a DaskVecEnv."""
    out: dict[str, list[int]] = {}
    for g in env.groups:
        out.setdefault(g["worker"], []).extend(g["envs"])
    return out


FAIL_AT = 3  # env 0 raises on its 3rd step


@pytest.mark.parametrize("env_process", [False, True], ids=["in-worker", "env-process"])
@pytest.mark.processes
def test_env_error_and_restart_reach_heartbeat_page_and_prometheus(fresh: tuple[Any, Any], env_process: bool) -> None:
    """One real env error, handled by one restart, counted once on every path to the user."""
    from daskvec import DaskVecEnv

    cluster, client = fresh
    scheduler = cluster.scheduler
    fns = [lambda: ScriptedEnv(fail_at=FAIL_AT)] + [lambda: ScriptedEnv() for _ in range(N_ENVS - 1)]
    env = DaskVecEnv(fns, client=client, on_env_error="restart", env_process=env_process, timeout=60)
    try:
        env.reset()
        placement = per_worker_envs(env)
        assert len(placement) == 2, "the envs should be spread over both workers"
        for _ in range(FAIL_AT):  # the rebuilt env would fail only FAIL_AT steps later
            _, _, dones, infos = env.step(np.zeros(N_ENVS, dtype=np.int64))
        assert dones[0] and infos[0]["daskvec"]["reason"] == "env_error"
        expected = {w: (1 if 0 in idx else 0) for w, idx in placement.items()}

        def arrived() -> bool:
            return all(
                scheduler.workers[w].metrics.get("daskvec_steps") == len(idx) * FAIL_AT for w, idx in placement.items()
            )

        wait_until(arrived, 30, "heartbeats with every step")
        # 1. the heartbeat brought them to the scheduler
        for w, k in expected.items():
            m = scheduler.workers[w].metrics
            assert (m["daskvec_errors"], m["daskvec_restarts"]) == (k, k), (w, m)
        # 2. the daskvec page shows them
        page = dashboard.DaskvecDashboard(scheduler)
        page.update()
        data = page.source.data
        rows = {a: i for i, a in enumerate(data["address"])}
        for w, k in expected.items():
            assert (data["errors"][rows[w]], data["restarts"][rows[w]]) == (k, k), w
        # 3. and so does /metrics
        samples = prometheus_labelled(http_get(scheduler.http_server.port, "/metrics")[1])
        for w, k in expected.items():
            assert samples[("dask_daskvec_env_errors_total", frozenset({("worker", w)}))] == k, w
            assert samples[("dask_daskvec_env_restarts_total", frozenset({("worker", w)}))] == k, w
    finally:
        env.close()


SCRIPT = (1.0, 2.0, 3.0, 10.0)  # episode returns: mean 4, max 10
SLOW_EVERY, SLOW_S = 4, 0.05  # every 4th step of each env sleeps 50 ms first


@pytest.mark.processes
def test_known_returns_and_step_times_reach_page_and_prometheus(fresh: tuple[Any, Any]) -> None:
    """Mean return and step-time percentiles on the page and /metrics equal the ones computed here."""
    from daskvec import DaskVecEnv

    cluster, client = fresh
    scheduler = cluster.scheduler
    fns = [lambda: ScriptedEnv(returns=SCRIPT, slow_every=SLOW_EVERY, slow_s=SLOW_S) for _ in range(N_ENVS)]
    env = DaskVecEnv(fns, client=client, timeout=60)
    try:
        env.reset()
        placement = per_worker_envs(env)
        steps = 2 * len(SCRIPT)  # one-step episodes: each env runs the script twice
        for _ in range(steps):
            env.step(np.zeros(N_ENVS, dtype=np.int64))

        def arrived() -> bool:
            return all(
                scheduler.workers[w].metrics.get("daskvec_steps") == len(idx) * steps for w, idx in placement.items()
            )

        wait_until(arrived, 30, "heartbeats with every step")

        def live_latencies() -> list[float]:  # the step times the worker recorded (pickled by value)
            return [x for g in metrics._live() if g.n_envs > 0 for x in g.latencies]

        recorded = client.run(live_latencies)
        page = dashboard.DaskvecDashboard(scheduler)
        page.update()
        data = page.source.data
        rows = {a: i for i, a in enumerate(data["address"])}
        samples = prometheus_labelled(http_get(scheduler.http_server.port, "/metrics")[1])
        for w in placement:
            lat = recorded[w]
            assert len(lat) == steps
            p50, p99 = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
            assert p99 >= SLOW_S and p50 < p99  # a quarter of the calls slept: p99 is one of them
            i = rows[w]
            assert data["mean_return"][i] == pytest.approx(float(np.mean(SCRIPT)))
            assert data["episodes"][i] == len(placement[w]) * steps
            assert data["step_p50_ms"][i] == pytest.approx(p50 * 1e3)
            assert data["step_p99_ms"][i] == pytest.approx(p99 * 1e3)
            label = ("worker", w)
            assert samples[("dask_daskvec_mean_episode_return", frozenset({label}))] == pytest.approx(4.0)
            q = "dask_daskvec_step_latency_seconds"
            assert samples[(q, frozenset({label, ("quantile", "0.5")}))] == pytest.approx(p50)
            assert samples[(q, frozenset({label, ("quantile", "0.99")}))] == pytest.approx(p99)
    finally:
        env.close()


@pytest.mark.processes
def test_an_actor_released_before_it_was_made_is_not_counted(fresh: tuple[Any, Any]) -> None:
    """Dask's scheduler keeps a group actor released while still processing in ``ws.actors``
    for good; the page, ``/metrics`` and the scale-down plugin counted it as a live group."""
    from distributed import Event

    from daskvec.cluster.clients import KeepEnvWorkers

    cluster, client = fresh
    scheduler = cluster.scheduler
    started = Event("daskvec-test-build-started", client=client)

    class SlowGroup:  # a group whose build takes long: local, so it travels by value
        def __init__(self) -> None:
            Event("daskvec-test-build-started").set()
            time.sleep(5)

    fut = client.submit(SlowGroup, actor=True, key="daskvec-group-released-while-building")
    started.wait(60)
    fut.release()  # what a vec env closed, or a placement given up, during a build does
    del fut
    wait_until(lambda: "daskvec-group-released-while-building" not in scheduler.tasks, 30, "the task forgotten")
    stale = [ts for ws in scheduler.workers.values() for ts in ws.actors]
    page = dashboard.DaskvecDashboard(scheduler)
    page.update()
    snap = dashboard.snapshot(scheduler)
    collector = dashboard.PrometheusCollector(lambda: [scheduler])
    groups = {f.name: f for f in collector.collect()}["dask_daskvec_env_groups"].samples[0].value
    assert (snap.groups, groups) == (0, 0), f"counted {snap.groups} groups; ws.actors holds {stale}"
    assert not any(KeepEnvWorkers.holds_envs(ws) for ws in scheduler.workers.values())
    assert "No DaskVecEnv is running" in page.status.text


# --------------------------------------------------------------------------- the learner's timeline
def test_learner_timeline_is_bounded_and_in_epoch_seconds() -> None:
    timeline = metrics.LearnerTimeline(maxlen=3)
    base = time.perf_counter()
    for i in range(5):
        timeline.add("training", base + i, base + i + 0.5)
    timeline.add("waiting", base + 9, base + 9)  # empty: draws nothing, kept out
    with pytest.raises(ValueError, match="napping"):
        timeline.add("napping", base, base + 1)
    before = time.time()
    intervals = timeline.intervals()
    assert [i[0] for i in intervals] == ["training"] * 3  # the last three
    # perf_counter readings from now on come out as the epoch seconds of now on
    assert intervals[0][1] == pytest.approx(before + 2, abs=0.05) and intervals[-1][2] - intervals[-1][1] == 0.5
    timer = ClientTimer()
    assert metrics.client_message(timer, num_envs=1)["timeline"] == []
    timer.timeline.add("collecting", base, base + 1)
    (msg,) = metrics.client_message(timer, num_envs=1)["timeline"]
    assert msg[0] == "collecting" and json.loads(json.dumps(msg)) == msg


def test_timeline_reads_old_and_malformed_events_without_error() -> None:
    now = 1000.0
    good = [["collecting", now - 3, now - 2], ["training", now - 3, now - 1], ["waiting", now - 1, now - 0.5]]
    msgs = [
        {**_msg("old", now, 1.0, 1.0, 1.0)},  # a client from before the timeline: none
        {**_msg("learner", now - 5, 1.0, 1.0, 1.0), "timeline": good},
        {**_msg("bad", now - 1, 1.0, 1.0, 1.0), "timeline": "garbage"},
        {
            **_msg("half", now - 2, 1.0, 1.0, 1.0),
            "timeline": [["waiting", "x", 1.0], ["napping", 1.0, 2.0], ["training", 5.0, 4.0], ["waiting"], 7],
        },
    ]
    assert all(dashboard.data._well_formed(m) for m in msgs)  # the time split still reads every one
    t, live = dashboard.data._timeline(msgs, now)
    assert live and t == {
        "row": ["envs", "learner", "learner"],
        "kind": ["collecting", "training", "waiting"],
        "start": [now - 3, now - 3, now - 1],
        "end": [now - 2, now - 1, now - 0.5],
    }
    # a newer event of the same learner replaces its picture; no learner at all: an empty one
    newer = {**_msg("learner", now - 4, 1.0, 1.0, 1.0), "timeline": good[:1]}
    assert dashboard.data._timeline([*msgs, newer], now)[0]["kind"] == ["collecting"]
    assert dashboard.data._timeline(msgs[:1], now) == ({c: [] for c in dashboard.TIMELINE_COLUMNS}, False)
    closed = {**newer, "closed": True}
    assert dashboard.data._timeline([*msgs, closed], now)[1] is False  # its last run


def _intervals_of(timeline: dict[str, list[Any]], kind: str) -> list[tuple[float, float]]:
    return [(s, e) for k, s, e in zip(timeline["kind"], timeline["start"], timeline["end"], strict=True) if k == kind]


@pytest.mark.processes
@pytest.mark.parametrize("ahead", [1, 0], ids=["collect-ahead", "in-turn"])
def test_a_learners_timeline_reaches_the_page(fresh: tuple[Any, Any], ahead: int) -> None:
    """A real DaskPPO's intervals reach the snapshot and the page; collecting ahead, the envs collect as it trains."""
    import torch

    from daskvec import DaskVecEnv
    from daskvec.sb3 import DaskPPO

    cluster, client = fresh
    scheduler = cluster.scheduler
    rollouts = 6
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    env = DaskVecEnv([lambda: CountingEnv(horizon=HORIZON) for _ in range(N_ENVS)], client=client, timeout=60)
    try:
        started = time.time()
        model = DaskPPO(
            "MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=2, seed=0, device="cpu", collect_ahead=ahead
        )
        model.learn(16 * N_ENVS * rollouts)
        assert len(env.timer.timeline) > 0
    finally:
        torch.set_num_threads(threads)
        env.close()  # its last event carries the whole run
    ended = time.time()
    # a client from before the timeline logs after it: the picture stays the learner's
    client.log_event(CLIENT_TOPIC, _msg("old", time.time(), 1.0, 1.0, 1.0))
    wait_until(lambda: any(m.get("id") == "old" for _, m in scheduler.get_events(CLIENT_TOPIC)), 30, "the old event")
    snap = dashboard.snapshot(scheduler)
    t = snap.timeline
    assert snap.split_live and not snap.timeline_live  # the old client runs, the learner closed
    assert set(t) == set(dashboard.TIMELINE_COLUMNS)
    collecting, training = _intervals_of(t, "collecting"), _intervals_of(t, "training")
    waiting, replaying = _intervals_of(t, "waiting"), _intervals_of(t, "replaying")
    assert len(collecting) == len(waiting) == rollouts, t["kind"]
    assert len(training) == len(replaying) == rollouts - 1, t["kind"]
    for kind, row in zip(t["kind"], t["row"], strict=True):
        assert row == ("envs" if kind == "collecting" else "learner")
    for start, end in zip(t["start"], t["end"], strict=True):
        assert started - 1 <= start <= end <= ended + 1
    # the learner's row is one interval after the other: replay, train, wait, and again
    learner = sorted(i for i in zip(t["start"], t["end"], t["kind"], strict=True) if i[2] != "collecting")
    assert [k for _, _, k in learner] == ["waiting", *["replaying", "training", "waiting"] * (rollouts - 1)]
    assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(learner))
    for (c_start, _), (t_start, t_end) in zip(collecting[1:], training, strict=True):
        if ahead:  # sent before the training began: the envs collect while the learner trains
            assert c_start < t_start
        else:  # sent when the learner asked for it, after training
            assert c_start >= t_end
    page = dashboard.DaskvecDashboard(scheduler)
    page.update()
    data = page.timeline.source.data
    assert list(data["kind"]) == t["kind"] and list(data["start"]) == [s * 1000.0 for s in t["start"]]
    assert list(data["color"]) == [dashboard.TIMELINE_COLORS[k] for k in t["kind"]]
    assert page.timeline.root.title.text.endswith("(last run)")
