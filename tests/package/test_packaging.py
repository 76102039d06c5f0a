"""The release artifact: one version, and a wheel that works installed alone in a fresh venv.

The wheel is built from this checkout's sources (never a stale ``dist/``) and installed
with ``--no-deps`` into a new venv, whose ``daskvec`` console script and metadata are
checked. The heavy dependencies (torch, Stable-Baselines3, dask) are not installed
again: the venv gets the running environment's site-packages through a ``.pth`` file
(a ``.pth`` line only appends a directory to ``sys.path``; the ``.pth`` files inside
it, such as an editable install's finder, are not run), and its own site-packages,
with the wheel's ``daskvec``, comes first.

The DaskVecEnv step is run by the running interpreter with the venv's site-packages
first on ``PYTHONPATH``: daskvec sends modules from outside the interpreter's prefix to
the workers by value (to it they are user code), and in the venv the dependencies are
such modules. The test checks that the learner and the Dask worker both import the
wheel's ``daskvec``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

import daskvec

ROOT = Path(__file__).parents[2]

#: Where daskvec comes from, and one DaskVecEnv step on a one-worker LocalCluster.
STEP_SCRIPT = """
import importlib.metadata, json
import gymnasium as gym
import numpy as np
from distributed import Client, LocalCluster

import daskvec
from daskvec import DaskVecEnv

with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \\
        Client(cluster) as client:
    env = DaskVecEnv([lambda: gym.make("CartPole-v1")] * 2, client=client)
    env.seed(0)
    obs = env.reset()
    obs, rewards, dones, infos = env.step(np.array([0, 1]))
    worker_files = list(client.run(lambda: __import__("daskvec").__file__).values())
    env.close()
print(json.dumps({
    "file": daskvec.__file__,
    "metadata_version": importlib.metadata.version("daskvec"),
    "worker_files": worker_files,
    "obs_shape": list(obs.shape),
    "rewards": rewards.tolist(),
}))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return dict(env, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)


def _run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=_clean_env(**env), capture_output=True, text=True, timeout=240)


@pytest.mark.processes
def test_version_is_written_once() -> None:
    """pyproject.toml reads the version from ``daskvec.__version__``, and ``daskvec --version`` prints it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "daskvec.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+|\.dev\d+|\.post\d+)?", daskvec.__version__)
    out = _run([sys.executable, "-m", "daskvec.cli", "--version"], ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"daskvec {daskvec.__version__}"


#: The wheel's ``daskvec/bench/``: the user-facing scenarios only. A new module here is a
#: decision (does a user run it to compare vec envs on their machine?), not an accident;
#: the test bed's benchmarks live in the repository's ``benchmarks/``.
BENCH_MODULES = {
    f"daskvec/bench/{m}.py"
    for m in (
        "__init__",
        "__main__",
        "command",
        "driver",
        "envs",
        "machine",
        "measure",
        "report",
        "scenarios",
        "source",
    )
}
#: Nothing the wheel installs may need root, a firewall, network namespaces, a browser or mocks.
TEST_BED_WORDS = ("iptables", "netns", "ip netns", "chromium", "unittest.mock", "from unittest import mock")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the checkout's sources (so the checkout gets no build/ or egg-info).

    ``benchmarks/`` is copied too: the wheel must leave it out by its configuration, not by its absence.
    """
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "MANIFEST.in", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("daskvec", "benchmarks"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp / "dist"
    build = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        tmp,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (found,) = dist.glob("daskvec-*.whl")
    return found


def test_the_wheel_carries_the_library_not_the_test_bed(wheel: Path) -> None:
    """The benchmarks/ of the source repository stay out; the bench the wheel has is small and needs no root."""
    with zipfile.ZipFile(wheel) as whl:
        # every file but the README (METADATA's description), whose test instructions name CI's chromium
        texts = {n: whl.read(n).decode("utf-8", "replace") for n in whl.namelist() if not n.endswith("/METADATA")}
        names = set(whl.namelist())
    assert not any(n.startswith(("benchmarks/", "tests/", "docs/", "notebooks/")) for n in names)
    bench = {n for n in texts if n.startswith("daskvec/bench/") and n.endswith(".py")}
    assert bench == BENCH_MODULES, f"daskvec/bench/ in the wheel: {sorted(bench ^ BENCH_MODULES)}"
    found = {(n, w) for n, t in texts.items() for w in TEST_BED_WORDS if w in t.lower()}
    assert not found, f"the wheel names the test bed: {sorted(found)}"


def _venv_with_the_wheel(wheel: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A fresh venv with the wheel alone installed, its dependencies the running environment's: (venv, site dir)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        tmp_path,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path)
    site_dir = Path(site.stdout.strip())
    assert (site_dir / "daskvec" / "__init__.py").is_file(), site.stderr
    # The dependencies: the running environment's site-packages, after the venv's own.
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site_dir / "_running_env_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return venv, site_dir


#: A module that makes the venv's interpreters (the Dask workers' too) see no matplotlib, as
#: if the ``bench`` extra were not installed: the running environment, whose site-packages
#: the venv shares, has it.
HIDE_MATPLOTLIB = """
import sys


class _NoMatplotlib:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoMatplotlib())
"""


@pytest.mark.slow
@pytest.mark.processes
def test_the_docs_bench_command_runs_from_the_wheel_without_matplotlib(wheel: Path, tmp_path: Path) -> None:
    """``daskvec bench`` as docs/benchmark.md shows it (its cheap form), installed without the ``bench`` extra.

    The table is printed and the chart skipped with one line saying how to get it,
    instead of a ``ModuleNotFoundError`` after the whole run.
    """
    venv, site_dir = _venv_with_the_wheel(wheel, tmp_path)
    (site_dir / "_hide_matplotlib.py").write_text(HIDE_MATPLOTLIB)
    (site_dir / "_hide_matplotlib.pth").write_text("import _hide_matplotlib\n")
    hidden = _run([str(venv / "bin" / "python"), "-c", "import matplotlib"], tmp_path)
    assert "No module named 'matplotlib'" in hidden.stderr, "the venv still imports matplotlib"

    out = tmp_path / "out"
    cheap = ["--envs", "2", "--seconds", "0.5", "--warmup", "0", "--settle", "0", "--vec-envs", "dummy,dask"]
    bench = _run([str(venv / "bin" / "daskvec"), "bench", "--scenario", "light", *cheap, "--out", str(out)], tmp_path)
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert "Traceback" not in bench.stdout + bench.stderr, bench.stdout + bench.stderr
    assert "DaskVecEnv" in bench.stdout and "DummyVecEnv" in bench.stdout, bench.stdout
    assert 'no chart: it needs matplotlib (pip install "daskvec[bench]")' in bench.stdout.splitlines()
    assert list(out.glob("bench-*.json")) and not list(out.glob("*.png"))


@pytest.mark.slow
@pytest.mark.processes
def test_wheel_installed_alone_in_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    assert wheel.name == f"daskvec-{daskvec.__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"daskvec/__init__.py", "daskvec/py.typed", "daskvec/daskvec.yaml"} <= names
    # the licence the metadata declares travels with the wheel
    info = f"daskvec-{daskvec.__version__}.dist-info"
    assert f"{info}/licenses/LICENSE" in names
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: BSD-3-Clause" in metadata and "License-File: LICENSE" in metadata

    venv, site_dir = _venv_with_the_wheel(wheel, tmp_path)
    python = venv / "bin" / "python"

    version = _run([str(venv / "bin" / "daskvec"), "--version"], tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"daskvec {daskvec.__version__}"
    where = _run(
        [str(python), "-c", "import importlib.metadata as m, daskvec; print(daskvec.__file__, m.version('daskvec'))"],
        tmp_path,
    )
    assert where.stdout.split() == [str(site_dir / "daskvec" / "__init__.py"), daskvec.__version__], where.stderr

    run = _run([sys.executable, "-c", STEP_SCRIPT], tmp_path, PYTHONPATH=str(site_dir))
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    installed = str(site_dir / "daskvec" / "__init__.py")
    assert result["file"] == installed, "the learner imported another daskvec than the wheel's"
    assert result["worker_files"] == [installed], "the worker imported another daskvec than the wheel's"
    assert result["metadata_version"] == daskvec.__version__
    assert result["obs_shape"] == [2, 4]
    assert result["rewards"] == [1.0, 1.0]

    # a benchmark of the source repository, asked of the wheel: one clear message, exit 2
    moved = _run([str(venv / "bin" / "daskvec"), "bench", "--scenario", "hosts"], tmp_path)
    assert moved.returncode == 2, moved.stdout + moved.stderr
    assert (
        "source repository (benchmarks/across.py)" in moved.stderr and "daskvec bench --scenario hosts" in moved.stderr
    )
