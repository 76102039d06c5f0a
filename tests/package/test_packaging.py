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
import shlex
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


# --------------------------------------------------------------------------- the commands the pages show
#: The pages a user reads: their shell code blocks (```bash, and unlabelled blocks that open
#: with a command) show the commands this test knows.
PAGES = ("README.md", "CONTRIBUTING.md", "docs/*.md")

#: Arguments that make a benchmark run cheap: two envs, short windows, no waits, two vec envs, no chart.
CHEAP_BENCH = shlex.split("--envs 2 --seconds 0.3 --warmup 0 --settle 0 --vec-envs dummy,dask --no-plot")
#: A PPO run of 64 steps (2 envs x 32) and one evaluation episode.
CHEAP_TRAIN = shlex.split("--hyperparams n_steps=32 batch_size=32 --eval-episodes 1 --no-progress")

#: Each shown command this test runs from the wheel-installed venv, in a cheap form: the
#: options whose values are replaced (the shown flags all stay, so a renamed flag fails
#: here), and the arguments added. ``...`` in a command stands for the added arguments.
RUN: dict[str, tuple[dict[str, str], list[str]]] = {
    "daskvec train CartPole-v1 --n-envs 8 --timesteps 25000 --save ppo-cartpole": (
        {"--n-envs": "2", "--timesteps": "64"},
        CHEAP_TRAIN,
    ),
    "daskvec zoo --n-workers 2 --algo ppo --env CartPole-v1 -n 50000": ({"-n": "256"}, ["--eval-freq", "-1"]),
    # DummyVecEnv alone (no cluster): the entry points and the scenarios' names and flags; the
    # command after it, and the test above, measure a DaskVecEnv
    "daskvec bench --scenario light heavy": ({}, [*CHEAP_BENCH, "--vec-envs", "dummy"]),
    "daskvec bench --scenario light --envs 8 --seconds 5 --repeat 3": (
        {"--envs": "2", "--seconds": "0.3", "--repeat": "1"},
        CHEAP_BENCH[4:],
    ),
    "daskvec bench --scenario light heavy --repeat 3": ({"--repeat": "1"}, [*CHEAP_BENCH, "--vec-envs", "dummy"]),
    "python -m daskvec.bench ...": ({}, ["--scenario", "light", *CHEAP_BENCH, "--vec-envs", "dummy"]),
}

_CLONE = "a developer's command in a clone (CI runs it: .ci/run)"
_INSTALL = "an install: the test's venv has the wheel installed instead"
_HEAD = "needs a cluster at that address (a scheduler on another host)"
_SOURCE = "a benchmark of the source repository's benchmarks/ (asked of a wheel: tests/cli/test_bench.py)"
_SLURM = "a SLURM cluster (tests/cluster/test_slurm.py, on the single-node SLURM of .ci/slurm.sh)"
_TLS = "needs certificates and the hosts it names (tests/transport/test_security.py runs TLS clusters)"
_JUPYTER = "a JupyterLab server (the notebooks extra; tests/monitoring runs the notebooks)"

#: Each shown command this test does not run, and why.
NOT_RUN: dict[str, str] = {
    "python3 -m venv .venv": "the test's own fresh venv stands in for it",
    ". .venv/bin/activate": "the test runs the venv's own executables",
    "pip install torch==2.13.0": _INSTALL,
    "pip install -q torch==2.13.0": _INSTALL,
    "pip install -e .": _INSTALL,
    'pip install -q -e ".[test]"': _INSTALL,
    'pip install -e ".[test]"': _INSTALL,
    'pip install -e ".[zoo]"': _INSTALL,
    'pip install -e ".[docs]"': _INSTALL,
    'pip install -e ".[release]"': _INSTALL,
    'pip install -e ".[jobqueue]"': _INSTALL,
    'pip install -e ".[notebooks]"': _INSTALL,
    'pip install "daskvec[bench]"': _INSTALL,
    'pip install -e ".[bench]"': _INSTALL,
    'pip install -e ".[docs,release]"': _INSTALL,
    'pip install "daskvec[zoo]"': _INSTALL,
    "python -m pytest": _CLONE,
    'python -m pytest -m "not processes"': _CLONE,
    'python -m pytest -m "not slow"': _CLONE,
    "python -m pytest tests/core/test_errors.py -k timeout -x": _CLONE,
    "python -m pytest -n 0 tests/faults/test_faults.py --pdb": _CLONE,
    "ruff check daskvec benchmarks tests": _CLONE,
    "python -m mypy": _CLONE,
    "sphinx-build -W -b html docs docs/_build/html": _CLONE + "; tests/package/test_docs_build.py builds the docs",
    "python -m build": _CLONE,
    "twine check --strict dist/*": _CLONE,
    "daskvec train CartPole-v1 --n-envs 8 --timesteps 25000": "the command above it without --save, which runs",
    "dask scheduler --preload daskvec.dashboard": (
        "a server that runs until stopped: tests/monitoring/test_dashboard_browser.py starts it with this preload"
    ),
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False dask worker tcp://head:8786 --nthreads 1": _HEAD,
    "daskvec train CartPole-v1 --n-envs 64 --scheduler tcp://head:8786": _HEAD,
    "daskvec zoo --scheduler tcp://head:8786 --envs-per-actor 4 --algo sac --env Pendulum-v1": _HEAD,
    "daskvec bench --scheduler tcp://10.0.0.1:8786 --transport direct": _HEAD,
    "daskvec bench": "every scenario: minutes; its scenarios light and heavy run in the cheap forms above",
    "daskvec bench --scenario gym-faces straggler groups": _SOURCE,
    "daskvec bench --scenario learning learning-offpolicy": _SOURCE,
    "daskvec bench --scenario ceiling": _SOURCE,
    "daskvec bench --scenario none --dashboard": _SOURCE + "; needs Debian's chromium",
    "daskvec bench --tls --seconds 8": _SOURCE,
    "daskvec bench --tls": _SOURCE,
    "daskvec bench --scenario learning learning-offpolicy ceiling": _SOURCE,
    "python -m benchmarks.masks --n-envs 8": _SOURCE,
    "python -m benchmarks.soak --minutes 30 --seed 0 --json benchmarks/results/soak-30min.json": _SOURCE
    + "; a minute of it runs in tests/faults/test_soak.py",
    "sudo .venv/bin/daskvec bench --scenario hosts --rtt 0,2,10": _SOURCE + "; needs root",
    'python -c "from daskvec.cli import main; import sys; sys.exit(main())" '
    "bench --scenario hosts --rtt 0,2,10 --seconds 3 --repeat 2": _SOURCE + "; needs root",
    "export DASK_DASKVEC__STEP_TIMEOUT=60": "sets a variable (tests/core/test_config.py reads such variables)",
    "export DASK_DASKVEC__ON_ENV_ERROR=restart": "sets a variable (tests/core/test_config.py reads such variables)",
    "dask scheduler --protocol tls --tls-ca-file ca.pem --tls-cert scheduler.pem --tls-key scheduler.key": _TLS,
    "dask worker tls://scheduler-host:8786 --tls-ca-file ca.pem --tls-cert worker.pem --tls-key worker.key": _TLS,
    "dask scheduler --protocol tls --tls-ca-file ca.pem --tls-cert scheduler.pem --tls-key scheduler-key.pem": _TLS,
    "dask worker tls://scheduler-host:8786 --tls-ca-file ca.pem --tls-cert worker.pem --tls-key worker-key.pem": _TLS,
    "sinfo": _SLURM,
    "squeue": _SLURM,
    "scancel 12": _SLURM,
    "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge": _SLURM + "; needs root",
    ".ci/slurm.sh start": _SLURM,
    ".ci/slurm.sh status": _SLURM,
    "srun hostname": _SLURM,
    ".ci/slurm.sh stop": _SLURM,
    "jupyter server extension list": _JUPYTER,
    "jupyter lab --no-browser --ip 127.0.0.1 --port 8888": _JUPYTER,
    "jupyter server list": _JUPYTER,
}

_COMMAND_START = re.compile(r"(daskvec|dask|python3?|pip|sudo)\s")


def shown_commands() -> dict[str, list[str]]:
    """Every shell command the pages show, each with the pages that show it.

    A line continued with ``\\`` is joined, a comment after ``#`` dropped, runs of spaces
    made one, and ``a && b`` counts as two commands.
    """
    found: dict[str, list[str]] = {}
    pages = sorted({p for pattern in PAGES for p in ROOT.glob(pattern)})
    for page in pages:
        text = page.read_text()
        for block in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            lang, body = block.group(1).strip(), re.sub(r"\\\n\s*", " ", block.group(2))
            if lang not in ("bash", "sh", "shell", "console") and not (lang == "" and _COMMAND_START.match(body)):
                continue
            for line in body.splitlines():
                line = re.sub(r"(^|\s)#.*$", "", line).strip().removeprefix("$ ")
                for part in filter(None, (p.strip() for p in line.split("&&"))):
                    found.setdefault(" ".join(part.split()), []).append(str(page.relative_to(ROOT)))
    return found


def test_every_shown_command_is_run_or_skipped_with_a_reason() -> None:
    """A command new on a page (or changed) must be added to ``RUN`` (a cheap form) or to ``NOT_RUN`` (why not)."""
    shown = shown_commands()
    assert "daskvec bench --scenario light heavy" in shown, "the extraction found none of the bench commands"
    unknown = {c: pages for c, pages in shown.items() if c not in RUN and c not in NOT_RUN}
    assert not unknown, f"commands the pages show that this test neither runs nor skips with a reason: {unknown}"
    assert not set(RUN) & set(NOT_RUN)
    stale = sorted(c for c in [*RUN, *NOT_RUN] if c not in shown)
    assert not stale, f"commands no page shows any more: {stale}"


def cheap_form(command: str) -> list[str]:
    """The argv of ``command`` in its cheap form (see ``RUN``)."""
    values, extra = RUN[command]
    argv = shlex.split(command)
    for i, token in enumerate(argv[:-1]):
        if token in values:
            argv[i + 1] = values[token]
    assert not set(values) - set(argv), f"{command}: options to replace that it does not have"
    if "..." not in argv:
        return argv + extra
    at = argv.index("...")
    return argv[:at] + extra + argv[at + 1 :]


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(600)
def test_the_commands_the_pages_show_run_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    """Each command of ``RUN``, in its cheap form, from a fresh venv with the wheel installed: exit 0, no traceback."""
    venv, _ = _venv_with_the_wheel(wheel, tmp_path)
    path = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    failed = []
    for n, command in enumerate(RUN):
        argv = cheap_form(command)
        if "bench" in argv or "daskvec.bench" in argv:
            argv += ["--out", str(tmp_path / f"bench-{n}")]
        cwd = tmp_path / f"run-{n}"
        cwd.mkdir()
        out = subprocess.run(
            argv, cwd=cwd, env=_clean_env(PATH=path), capture_output=True, text=True, timeout=240, check=False
        )
        text = out.stdout + out.stderr
        if out.returncode != 0 or "Traceback" in text:
            failed.append(f"$ {shlex.join(argv)}\n(exit {out.returncode})\n{text[-3000:]}")
    assert not failed, "\n\n".join(failed)
    train = next(n for n, command in enumerate(RUN) if "--save ppo-cartpole" in command)
    assert (tmp_path / f"run-{train}" / "ppo-cartpole.zip").is_file(), "daskvec train --save saved no model"
