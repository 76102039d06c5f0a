"""The dashboard out of the box, and no dead links.

- The base dependencies alone serve ``/daskvec``: a subprocess that cannot import any
  package outside the closure of daskvec's core dependencies starts the embedded
  cluster and fetches the page over HTTP.
- Without Bokeh (the same subprocess, with Bokeh blocked too), Dask still gives a
  dashboard link, to a stub page: daskvec says the dashboard is not available instead.
- A scheduler whose dashboard is off (``dashboard=False``): ``daskvec train``, the
  notebook view and ``dashboard_link`` show no link, and say why.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import textwrap
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from envs import CountingEnv
from packaging.requirements import Requirement

# DaskVecEnv from the package also installs the daskvec pages on schedulers started afterwards
from daskvec import DaskVecEnv, cli
from daskvec._core import dask_internals as _dask
from daskvec.monitoring import links as dashboard_link

ROOT = Path(__file__).parents[2]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_closure() -> set[str]:
    """Distributions that ``pip install daskvec`` (no extras) brings in, by normalised name."""
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    todo = [Requirement(text) for text in core]
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    while todo:
        req = todo.pop()
        node = (_norm(req.name), frozenset(req.extras))
        if node in seen:
            continue
        seen.add(node)
        names.add(node[0])
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not for this platform
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in {"", *req.extras}):
                todo.append(sub)
    return names


def modules_outside(closure: set[str]) -> list[str]:
    """Top-level modules of installed distributions that are not in ``closure``."""
    out = []
    for module, dists in importlib.metadata.packages_distributions().items():
        if module != "daskvec" and not any(_norm(d) in closure for d in dists):
            out.append(module)
    return sorted(out)


_BLOCKER = """
import json, sys
BLOCKED = set(json.loads(sys.argv[1]))

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not a base dependency)", name=name)
        return None

sys.meta_path.insert(0, Blocker())
"""


def run_with_base_dependencies(code: str, also_blocked: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """Run ``code`` in a subprocess that can import only daskvec's base dependencies.

    Returns the JSON object ``code`` prints last, and the subprocess's stderr.
    """
    blocked = modules_outside(base_closure()) + list(also_blocked)
    script = _BLOCKER + textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(blocked)], capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_the_closure_blocks_what_it_should() -> None:
    closure = base_closure()
    assert {"bokeh", "prometheus-client", "distributed", "stable-baselines3"} <= closure
    outside = modules_outside(closure)
    # extras and test tools are blocked (the test venv has them all)
    assert {"dask_jobqueue", "pytest", "nbclient"} <= set(outside)
    assert "bokeh" not in outside


@pytest.mark.timeout(300)
@pytest.mark.processes
def test_base_dependencies_serve_the_daskvec_page() -> None:
    out, stderr = run_with_base_dependencies("""
        import logging, urllib.request
        logging.basicConfig(level=logging.WARNING)
        logging.getLogger("daskvec").setLevel(logging.INFO)
        import gymnasium as gym
        from daskvec import DaskVecEnv

        env = DaskVecEnv([lambda: gym.make("CartPole-v1")], cluster_kwargs={"n_workers": 1})
        try:
            links = env.dashboard
            out = {"lines": links.lines(), "daskvec": links.daskvec}
            with urllib.request.urlopen(links.daskvec, timeout=30) as r:
                out["status"], out["bokeh_page"] = r.status, b"<script" in r.read()
            with urllib.request.urlopen(links.daskvec.rsplit("/", 1)[0] + "/metrics", timeout=30) as r:
                out["metrics"] = "dask_daskvec_envs" in r.read().decode()
            out["leaked"] = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
        finally:
            env.close()
        print(json.dumps(out))
    """)
    assert out["status"] == 200 and out["bokeh_page"], out
    assert out["metrics"], "the scheduler's /metrics has no daskvec metrics (prometheus-client)"
    assert out["leaked"] == []
    assert out["lines"] == [
        f"Dask dashboard: {out['daskvec'].rsplit('/', 1)[0]}/status",
        f"daskvec page: {out['daskvec']}",
    ]
    # the embedded cluster's log line gives the same, checked, links
    assert f"daskvec page: {out['daskvec']}" in stderr


@pytest.mark.timeout(300)
@pytest.mark.processes
def test_without_bokeh_no_dead_link() -> None:
    out, _ = run_with_base_dependencies(
        """
        import urllib.request
        from distributed import Client, LocalCluster
        from daskvec import DaskVecEnv  # must not need Bokeh
        from daskvec._core import dask_internals as _dask
        from daskvec.monitoring.links import check_dashboard

        def refuse(*args, **kwargs):
            raise ModuleNotFoundError("No module named 'daskvec'")

        with LocalCluster(n_workers=0, dashboard_address=":0") as cluster, Client(cluster) as client:
            raw = client.dashboard_link
            with urllib.request.urlopen(raw, timeout=30) as r:
                stub = r.read().decode()
            links = check_dashboard(client)
            _dask.run_on_scheduler = refuse  # a scheduler that cannot be asked: the pages are fetched
            fetched = check_dashboard(client)
        print(json.dumps({"raw": raw, "stub": stub, "lines": links.lines(), "status": links.status,
                          "fetched": fetched.lines()}))
    """,
        also_blocked=("bokeh",),
    )
    assert "Dask needs bokeh" in out["stub"]  # what Dask's own link leads to: the dead link
    assert out["status"] is None
    assert out["lines"] == out["fetched"] == [f"Dask dashboard: not available: {dashboard_link.NO_PAGES}"]
    assert "http" not in "".join(out["lines"])


# --------------------------------------------------------------------------- dashboard off
@pytest.fixture(scope="module")
def no_dashboard() -> Iterator[Any]:
    """A real 1-worker-process ``LocalCluster`` whose scheduler's dashboard is off (its HTTP server is on)."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",
        scheduler_kwargs={"dashboard": False},
        silence_logs=40,
    ) as cluster:
        yield cluster


def dask_link_is_dead(link: str) -> bool:
    try:
        with urllib.request.urlopen(link, timeout=30):
            return False
    except urllib.error.HTTPError as e:
        return e.code == 404


@pytest.mark.timeout(300)
def test_train_prints_no_dead_link(
    no_dashboard: Any, capsys: pytest.CaptureFixture[str], restore_daskvec_logger: None
) -> None:
    from distributed import Client

    with Client(no_dashboard, set_as_default=False) as c:
        assert dask_link_is_dead(c.dashboard_link)  # Dask gives a link all the same
    code = cli.main(
        [
            "train",
            "CartPole-v1",
            "--scheduler",
            no_dashboard.scheduler_address,
            "--n-envs",
            "2",
            "--timesteps",
            "64",
            "--eval-episodes",
            "0",
            "--no-progress",
            "--hyperparams",
            "n_steps=32",
            "batch_size=32",
            "n_epochs=1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"Dask dashboard: not available: {dashboard_link.NO_PAGES}" in out
    assert not re.search(r"https?://", out), out


def test_notebook_view_and_property_show_no_dead_link(no_dashboard: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed import Client

    with Client(no_dashboard, set_as_default=False) as c, DaskVecEnv([CountingEnv], client=c) as venv:
        assert venv.dashboard_link is None
        html = venv._repr_html_()
        assert "http" not in html and "not available" in html and "1 envs in 1 groups" in html
        # a scheduler that cannot be asked (e.g. without daskvec): the pages are fetched over HTTP
        with monkeypatch.context() as m:
            m.setattr(_dask, "run_on_scheduler", _refuse)
            assert venv.dashboard == dashboard_link.DashboardLinks(None, problem=dashboard_link.NO_PAGES)


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise ModuleNotFoundError("No module named 'daskvec'")


def test_served_pages_are_linked_over_either_path(client2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session cluster started after daskvec's pages were installed: both links, asked or fetched."""
    asked = dashboard_link.check_dashboard(client2)
    assert asked.status and asked.daskvec and asked.daskvec.endswith("/daskvec"), asked
    with urllib.request.urlopen(asked.daskvec, timeout=30) as r:
        assert r.status == 200
    monkeypatch.setattr(_dask, "run_on_scheduler", _refuse)
    assert dashboard_link.check_dashboard(client2) == asked
