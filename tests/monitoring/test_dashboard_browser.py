"""The daskvec page on a standalone ``dask scheduler --preload daskvec.dashboard``, in a real browser.

A separate ``dask scheduler`` process (with the preload) and two ``dask worker``
processes; a ``DaskVecEnv`` steps on them from a background thread while Debian's
headless chromium opens the page. The browser is driven over the DevTools protocol:
the test reads the per-worker data that BokehJS received, and checks the screenshot's
pixels for the per-worker bars. Set ``DASKVEC_SCREENSHOT=path.png`` to keep the
screenshot (``docs/img/dashboard.png`` comes from here). The timeline of collection
against learning is checked the same way while a ``DaskPPO`` with ``collect_ahead=1``
trains; ``DASKVEC_TIMELINE_SCREENSHOT=path.png`` keeps its screenshot
(``docs/img/dashboard-timeline.png``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import DaskProcesses, have_chromium, start_dask_processes

from daskvec import dashboard
from daskvec.cluster.clients import scheduler_workers

pytest.importorskip("bokeh")
pytest.importorskip("prometheus_client")

N_ENVS = 4


def http_get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return r.status, r.read().decode()


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskProcesses]:
    p = start_dask_processes(2, tmp_path_factory.mktemp("dask"), scheduler_args=("--preload", "daskvec.dashboard"))
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def client(procs: DaskProcesses) -> Iterator[Any]:
    from distributed import Client

    with Client(procs.address, direct_to_workers=True, set_as_default=False, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def port(client: Any) -> int:
    return int(client.scheduler_info()["services"]["dashboard"])


class Stepper:
    """Steps a DaskVecEnv in a background thread until stopped (at most ``limit`` seconds)."""

    def __init__(self, env: Any, limit: float = 120.0) -> None:
        self.env = env
        self.steps = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._limit = limit
        self._thread = threading.Thread(target=self._run, name="daskvec-test-stepper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self._limit
        rng = np.random.default_rng(0)
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                self.env.step(rng.integers(0, 2, size=N_ENVS))
                self.steps += 1
        except BaseException as e:  # reported by stop()
            self.error = e

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the stepping thread did not stop"
        if self.error is not None:
            raise self.error


@pytest.fixture(scope="module")
def stepping(client: Any) -> Iterator[Stepper]:
    import gymnasium as gym

    from daskvec import DaskVecEnv

    env = DaskVecEnv([lambda: gym.make("CartPole-v1") for _ in range(N_ENVS)], client=client, timeout=60)
    stepper: Stepper | None = None
    try:
        env.reset()
        stepper = Stepper(env)
        yield stepper
    finally:
        if stepper is not None:
            stepper.stop()
        env.close()


# --------------------------------------------------------------------------- standalone scheduler
def test_preload_serves_the_pages(port: int) -> None:
    for route in dashboard.ROUTES:
        status, _ = http_get(port, route)
        assert status == 200, route
    assert '<a href="daskvec">Daskvec</a>' in http_get(port, "/status")[1]
    plots = json.loads(http_get(port, "/individual-plots.json")[1])
    assert "/individual-daskvec" in plots.values()
    text = http_get(port, "/metrics")[1]
    for name in dashboard.PROMETHEUS_METRICS:
        assert f"# TYPE {name} " in text, name


def test_workers_never_import_the_dashboard(client: Any, stepping: Stepper) -> None:
    def loaded() -> dict[str, bool]:
        return {
            m: m in sys.modules for m in ("daskvec.worker", "daskvec.monitoring.metrics", "daskvec.dashboard", "bokeh")
        }

    deadline = time.monotonic() + 60
    while stepping.steps == 0:
        assert time.monotonic() < deadline, "no step happened"
        time.sleep(0.05)
    for worker, mods in client.run(loaded).items():
        assert mods["daskvec.worker"] and mods["daskvec.monitoring.metrics"], worker
        assert not mods["daskvec.dashboard"] and not mods["bokeh"], (worker, mods)


# --------------------------------------------------------------------------- browser
PAGE_STATE_JS = """
(() => {
  const B = window.Bokeh;
  if (!B || !B.documents || B.documents.length === 0) return JSON.stringify({ready: false});
  const doc = B.documents[0];
  const col = (name, c) => {
    const m = doc.get_model_by_name(name);
    return m ? Array.from(m.get_column(c) || []) : null;
  };
  const status = doc.get_model_by_name("daskvec-status");
  return JSON.stringify({
    ready: true,
    status: status ? status.text : null,
    workers: col("daskvec-workers", "address"),
    envs: col("daskvec-workers", "envs"),
    steps_per_s: col("daskvec-workers", "steps_per_s"),
    episodes: col("daskvec-workers", "episodes"),
    throughput: col("daskvec-throughput", "steps_per_s"),
    shares: col("daskvec-time-split", "share"),
  });
})()
"""


class DevTools:
    """A minimal Chrome DevTools protocol client over tornado's websocket."""

    def __init__(self, conn: Any, timeout: float) -> None:
        self.conn = conn
        self.timeout = timeout
        self._id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        await self.conn.write_message(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            raw = await asyncio.wait_for(self.conn.read_message(), self.timeout)
            if raw is None:
                raise RuntimeError("chromium closed the DevTools connection")
            msg = json.loads(raw)
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg["result"])

    async def evaluate(self, expression: str) -> Any:
        out = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out.get("result", {}).get("value")


def start_chromium(profile: Path) -> tuple[subprocess.Popen[bytes], int]:
    cmd = [
        shutil.which("chromium") or "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--hide-scrollbars",
        "--remote-debugging-port=0",
        "--remote-allow-origins=*",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        "about:blank",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while not (active.exists() and active.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("chromium did not open its DevTools port")
        time.sleep(0.1)
    return proc, int(active.read_text().split()[0])


async def open_page(
    devtools_port: int, url: str, accept: Any, timeout: float, script: str = PAGE_STATE_JS
) -> tuple[dict[str, Any], bytes]:
    """Open ``url``; poll the page's Bokeh data (``script``) until ``accept(state)``; return it and a PNG screenshot."""
    from tornado.websocket import websocket_connect

    with urllib.request.urlopen(f"http://127.0.0.1:{devtools_port}/json/list", timeout=30) as r:
        target = next(t for t in json.loads(r.read()) if t.get("type") == "page")
    conn = await websocket_connect(target["webSocketDebuggerUrl"], max_message_size=64 * 2**20)
    try:
        dt = DevTools(conn, timeout=30)
        await dt.call("Page.enable")
        await dt.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        state: dict[str, Any] = {}
        while True:
            raw = await dt.evaluate(script)
            state = json.loads(raw) if raw else {}
            if state.get("ready") and accept(state):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never showed the expected data; last state: {state}")
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.5)  # let the canvases paint the latest data
        shot = await dt.call("Page.captureScreenshot", format="png")
        return state, base64.b64decode(shot["data"])
    finally:
        conn.close()


def bar_rows(png: bytes, color: str = dashboard.BAR_COLOR) -> list[tuple[int, int, int]]:
    """Horizontal runs of screenshot rows containing ``color``: (first row, last row, pixels)."""
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.int16)
    target = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
    mask = np.all(np.abs(img - target) <= 12, axis=-1)
    per_row = mask.sum(axis=1)
    runs: list[tuple[int, int, int]] = []
    start = None
    for y, count in enumerate([*per_row.tolist(), 0]):
        if count >= 10 and start is None:
            start = y
        elif count < 10 and start is not None:
            runs.append((start, y - 1, int(per_row[start:y].sum())))
            start = None
    return runs


@pytest.mark.browser
@pytest.mark.timeout(240)
@pytest.mark.skipif(not have_chromium(), reason="Debian's chromium is not installed (CI installs it)")
def test_browser_renders_per_worker_data(port: int, client: Any, stepping: Stepper, tmp_path: Path) -> None:
    workers = set(scheduler_workers(client))
    assert len(workers) == 2

    def accept(state: dict[str, Any]) -> bool:
        if not state.get("workers") or set(state["workers"]) != workers:
            return False
        return (
            all(e > 0 for e in state["envs"])
            and all(r > 0 for r in state["steps_per_s"])
            and len(state["throughput"] or []) >= 2
            and abs(sum(state["shares"] or []) - 1.0) < 1e-6
        )

    profile = tmp_path / "chromium"
    profile.mkdir()
    proc, devtools_port = start_chromium(profile)
    try:
        state, png = asyncio.run(open_page(devtools_port, f"http://127.0.0.1:{port}/daskvec", accept, timeout=120))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    assert state["status"].startswith("1 DaskVecEnv running: 4 envs in 2 env groups on 2 workers"), state["status"]
    assert sum(state["envs"]) == N_ENVS
    assert max(state["throughput"]) > 0
    (tmp_path / "dashboard.png").write_bytes(png)
    keep = os.environ.get("DASKVEC_SCREENSHOT")
    if keep:
        Path(keep).write_bytes(png)
    runs = bar_rows(png)
    # one bar per worker, each drawn with a visible length
    assert len(runs) == 2, f"expected a bar per worker in the screenshot, found rows {runs}"
    assert all(pixels > 200 for _, _, pixels in runs), runs


# --------------------------------------------------------------------------- the learner's timeline
ROLLOUT_STEPS = 128
TIMELINE_STATE_JS = """
(() => {
  const B = window.Bokeh;
  if (!B || !B.documents || B.documents.length === 0) return JSON.stringify({ready: false});
  const doc = B.documents[0];
  const source = doc.get_model_by_name("daskvec-timeline");
  const plot = doc.get_model_by_name("daskvec-timeline-plot");
  if (!source || !plot) return JSON.stringify({ready: false});
  const col = (c) => Array.from(source.get_column(c) || []);
  return JSON.stringify({
    ready: true,
    title: plot.title.text,
    row: col("row"),
    kind: col("kind"),
    start: col("start"),
    end: col("end"),
    color: col("color"),
  });
})()
"""


class Training:
    """A DaskPPO with ``collect_ahead=1`` learning in a background thread until stopped (at most ``limit`` s)."""

    def __init__(self, client: Any, limit: float = 150.0) -> None:
        import gymnasium as gym
        from stable_baselines3.common.callbacks import BaseCallback

        from daskvec import DaskVecEnv
        from daskvec.sb3 import DaskPPO

        self.env = DaskVecEnv([lambda: gym.make("CartPole-v1") for _ in range(N_ENVS)], client=client, timeout=60)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        deadline = time.monotonic() + limit
        stop = self._stop

        class Until(BaseCallback):
            def _on_step(self) -> bool:
                return not stop.is_set() and time.monotonic() < deadline

        self._until = Until()
        # rollouts and training of comparable length on this machine, so that both rows show
        self.model = DaskPPO(
            "MlpPolicy",
            self.env,
            n_steps=ROLLOUT_STEPS,
            batch_size=128,
            n_epochs=4,
            seed=0,
            device="cpu",
            collect_ahead=1,
        )
        self._thread = threading.Thread(target=self._run, name="daskvec-test-learner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.model.learn(10**9, callback=self._until)
        except BaseException as e:  # reported by stop()
            self.error = e

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the learning thread did not stop"
        self.env.close()
        if self.error is not None:
            raise self.error


def tallest_band(png: bytes, color: str) -> tuple[int, int]:
    """The tallest run of screenshot rows drawn in ``color`` (a bar, not a legend swatch): (first row, last row)."""
    runs = bar_rows(png, color)
    assert runs, f"nothing drawn in {color}"
    first, last, _ = max(runs, key=lambda r: r[1] - r[0])
    return first, last


@pytest.mark.browser
@pytest.mark.timeout(300)
@pytest.mark.skipif(not have_chromium(), reason="Debian's chromium is not installed (CI installs it)")
def test_browser_draws_the_learners_timeline(port: int, client: Any, tmp_path: Path, one_torch_thread: None) -> None:
    """While a DaskPPO collects ahead, the timeline page shows both rows: the envs collecting, the learner training."""
    training = Training(client)
    profile = tmp_path / "chromium"
    profile.mkdir()
    proc, devtools_port = start_chromium(profile)

    def accept(state: dict[str, Any]) -> bool:
        kinds = state["kind"]
        # well into the run (the first rollout, which waits for the workers' policy, out of
        # the picture), and every kind of interval on the page
        rollouts = training.model.num_timesteps // (ROLLOUT_STEPS * N_ENVS)
        return rollouts >= 32 and kinds.count("collecting") >= 20 and {"training", "waiting", "replaying"} <= set(kinds)

    try:
        url = f"http://127.0.0.1:{port}/individual-daskvec-timeline"
        state, png = asyncio.run(open_page(devtools_port, url, accept, timeout=150, script=TIMELINE_STATE_JS))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        training.stop()
    (tmp_path / "dashboard-timeline.png").write_bytes(png)
    keep = os.environ.get("DASKVEC_TIMELINE_SCREENSHOT")
    if keep:
        Path(keep).write_bytes(png)
    assert state["title"] == "Collection against learning", state["title"]
    for kind, row, color, start, end in zip(
        state["kind"], state["row"], state["color"], state["start"], state["end"], strict=True
    ):
        assert row == ("envs" if kind == "collecting" else "learner"), (kind, row)
        assert color == dashboard.TIMELINE_COLORS[kind] and end >= start
    # drawn: the envs' bars in a band above the learner's training bars, each a bar's height
    envs = tallest_band(png, dashboard.TIMELINE_COLORS["collecting"])
    learner = tallest_band(png, dashboard.TIMELINE_COLORS["training"])
    assert envs[1] < learner[0], (envs, learner)
    assert min(envs[1] - envs[0], learner[1] - learner[0]) > 50, (envs, learner)
