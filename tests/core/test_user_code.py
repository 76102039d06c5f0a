"""Env code where users write it: ``__main__``, a notebook, a test module, a local package.

All tests run against separate ``dask worker`` processes started from a temporary
directory with a ``PYTHONPATH`` holding only the checkout's root (for daskvec itself),
so the workers cannot import the tests' modules:
the code must travel by value (:func:`daskvec.cluster.clients.dumps_factories`).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import DaskProcesses, start_dask_processes
from envs import CountingEnv, assert_same
from stable_baselines3.common.vec_env import DummyVecEnv

from daskvec import DaskVecEnv


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskProcesses]:
    p = start_dask_processes(2, tmp_path_factory.mktemp("dask"))
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def pclient(procs: DaskProcesses) -> Iterator[Any]:
    from distributed import Client

    with Client(procs.address, direct_to_workers=True, set_as_default=False, timeout=60) as c:
        yield c


def workers_can_import(client: Any, module: str) -> list[bool]:
    def probe(name: str) -> bool:
        import importlib.util

        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    return list(client.run(probe, module).values())


def check_against_dummy(env_fns: list[Callable[[], gym.Env[Any, Any]]], client: Any, steps: int = 15) -> None:
    """Step DaskVecEnv on the worker processes and DummyVecEnv locally; require equal outputs."""
    venv = DaskVecEnv(env_fns, client=client, envs_per_actor=1, timeout=60)
    ref = DummyVecEnv(env_fns)
    try:
        assert len({g["worker"] for g in venv.groups}) == 2  # both worker processes hold envs
        rng = np.random.default_rng(0)
        for v in (venv, ref):
            v.seed(11)
        assert_same(venv.reset(), ref.reset())
        for _ in range(steps):
            actions = rng.integers(0, venv.action_space.n, size=len(env_fns))  # type: ignore[attr-defined]
            assert_same(venv.step(actions), ref.step(actions))
    finally:
        venv.close()
        ref.close()


# --------------------------------------------------------------------------- a test module
class TestModuleEnv(CountingEnv):
    """Defined in this test module, which the workers cannot import."""

    __test__ = False  # not a pytest test class

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, rew, term, trunc, info = super().step(action)
        return obs * 2, rew + 0.25, term, trunc, info | {"where": __name__}


def make_test_module_env(horizon: int) -> TestModuleEnv:
    return TestModuleEnv(horizon=horizon)


def test_env_from_a_test_module(pclient: Any) -> None:
    assert workers_can_import(pclient, __name__) == [False, False]
    assert workers_can_import(pclient, "envs") == [False, False]
    check_against_dummy([functools.partial(make_test_module_env, 3 + i) for i in range(4)], pclient)


# --------------------------------------------------------------------------- a local package
def test_env_from_a_local_package(pclient: Any) -> None:
    from localmod.gridworld import GridWorld, make_grid

    assert workers_can_import(pclient, "localmod") == [False, False]
    fns: list[Callable[[], gym.Env[Any, Any]]] = [make_grid, make_grid, GridWorld, functools.partial(GridWorld, 5)]
    check_against_dummy(fns, pclient)
    with DaskVecEnv([make_grid], client=pclient) as venv:
        venv.reset()
        assert venv.reset_infos[0]["module"] == "localmod.gridworld"
    # by-value pickling was temporary: the package is pickled by reference again afterwards
    import cloudpickle

    assert b"localmod.gridworld" in cloudpickle.dumps(GridWorld) and len(cloudpickle.dumps(GridWorld)) < 200


# --------------------------------------------------------------------------- a notebook
NOTEBOOK_CELL = """
import gymnasium as gym
import numpy as np

class NotebookEnv(gym.Env):
    def __init__(self, scale):
        self.observation_space = gym.spaces.Box(-1e6, 1e6, shape=(1,), dtype=np.float64)
        self.action_space = gym.spaces.Discrete(3)
        self.scale = scale
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.np_random.normal() * self.scale]), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t * self.scale + action]), float(action), False, self.t >= 4, {}

def make_env(scale):
    return lambda: NotebookEnv(scale)
"""


def test_env_from_a_notebook_namespace(pclient: Any) -> None:
    """Code run the way Jupyter runs a cell: exec'd in a namespace called ``__main__``."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, "<ipython-input-1>", "exec"), namespace)
    assert namespace["NotebookEnv"].__module__ == "__main__"
    check_against_dummy([namespace["make_env"](s) for s in (1.0, 2.0, 3.0)], pclient)


# --------------------------------------------------------------------------- a script's __main__
SCRIPT = """
import sys

import gymnasium as gym
import numpy as np

from daskvec import DaskVecEnv


class ScriptEnv(gym.Env):
    def __init__(self, k):
        self.observation_space = gym.spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.k = k
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.k, 0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.k, self.t], dtype=np.float32), float(self.k * action), False, self.t >= 3, {}


def make_env(k):
    def _init():
        return ScriptEnv(k)
    return _init


if __name__ == "__main__":
    assert ScriptEnv.__module__ == "__main__"
    env = DaskVecEnv([make_env(k) for k in range(4)], client=sys.argv[1], envs_per_actor=2)
    print("workers", len({g["worker"] for g in env.groups}))
    env.reset()
    for _ in range(3):
        obs, rews, dones, infos = env.step(np.ones(4, dtype=np.int64))
    print("rewards", rews.tolist())
    print("dones", dones.tolist())
    print("terminal", [info["terminal_observation"].tolist() for info in infos])
    print("after-reset", obs.tolist())
    env.close()
"""


@pytest.mark.timeout(180)
@pytest.mark.processes
def test_env_from_a_script_main(procs: DaskProcesses, tmp_path: Path) -> None:
    script = tmp_path / "train_script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(script), procs.address], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150
    )
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["workers"] == "2"
    assert lines["rewards"] == "[0.0, 1.0, 2.0, 3.0]"
    assert lines["dones"] == "[True, True, True, True]"
    assert lines["terminal"] == "[[0.0, 3.0], [1.0, 3.0], [2.0, 3.0], [3.0, 3.0]]"
    assert lines["after-reset"] == "[[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]"


def _dist_info(where: Path, name: str, *, top_level: str | None = None, record: str | None = None) -> None:
    info = where / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if top_level is not None:
        (info / "top_level.txt").write_text(top_level + "\n")
    if record is not None:
        (info / "RECORD").write_text(record)


def test_installed_distributions_anywhere_on_the_path_are_not_user_code(tmp_path: Path) -> None:
    """``pip install --target`` on ``PYTHONPATH``, an egg-info install, a zip: by reference; the user's code by value.

    The user's own module stays user code even beside vendored distributions, and so does
    a namespace package of the user's.
    """
    import importlib
    import zipfile

    from daskvec.cluster import clients as cluster

    site = tmp_path / "target"  # pip install --target: packages with their .dist-info
    (site / "fakelib_dv").mkdir(parents=True)
    (site / "fakelib_dv" / "__init__.py").write_text("X = 1\n")
    _dist_info(site, "fakelib_dv", top_level="fakelib_dv")
    (site / "single_dv.py").write_text("Y = 2\n")
    _dist_info(site, "single_dv", record="single_dv.py,,\n")
    eggs = tmp_path / "eggs"  # setup.py install: an .egg-info beside the package
    (eggs / "epkg_dv").mkdir(parents=True)
    (eggs / "epkg_dv" / "__init__.py").write_text("E = 1\n")
    (eggs / "epkg_dv-1.0-py3.11.egg-info").mkdir()
    (eggs / "epkg_dv-1.0-py3.11.egg-info" / "PKG-INFO").write_text(
        "Metadata-Version: 1.1\nName: epkg_dv\nVersion: 1.0\n"
    )
    (eggs / "epkg_dv-1.0-py3.11.egg-info" / "top_level.txt").write_text("epkg_dv\n")
    deps = tmp_path / "deps.zip"  # a zip on the path, metadata inside
    with zipfile.ZipFile(deps, "w") as z:
        z.writestr("zpkg_dv/__init__.py", "Z = 1\n")
        z.writestr("zpkg_dv-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zpkg_dv\nVersion: 1.0\n")
        z.writestr("zpkg_dv-1.0.dist-info/top_level.txt", "zpkg_dv\n")
    project = tmp_path / "project"  # the user's code, with vendored packages beside it
    (project / "my_ns_dv" / "sub").mkdir(parents=True)
    (project / "my_ns_dv" / "sub" / "__init__.py").write_text("N = 1\n")
    (project / "my_envs_dv.py").write_text("Z = 3\n")
    (project / "vendored_dv.py").write_text("V = 4\n")
    _dist_info(project, "vendored_dv", record="vendored_dv.py,,\n")
    names = {
        "fakelib_dv": False,
        "single_dv": False,
        "epkg_dv": False,
        "zpkg_dv": False,
        "vendored_dv": False,
        "my_envs_dv": True,
        "my_ns_dv": True,
    }
    sys.path[:0] = [str(site), str(eggs), str(deps), str(project)]
    try:
        for name, local in names.items():
            mod = importlib.import_module(name)
            assert cluster._is_local_module(mod) is local, name
            assert (mod in cluster._top_local_modules()) is local, name
    finally:
        del sys.path[:4]
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.pop("my_ns_dv.sub", None)


def test_an_app_under_the_interpreters_prefix_is_user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A system Python's prefix is ``/usr``, and a container's app often lives in ``/usr/src/app``:
    being under the prefix does not make a module installed (only the standard library's and the
    site directories, and distributions' metadata, do)."""
    import importlib

    from daskvec.cluster import clients as cluster

    app = tmp_path / "src" / "app"
    app.mkdir(parents=True)
    (app / "app_envs_dv.py").write_text("A = 1\n")
    for attr in ("prefix", "exec_prefix", "base_prefix"):
        monkeypatch.setattr(sys, attr, str(tmp_path))
    cluster._installed_dirs.cache_clear()
    sys.path.insert(0, str(app))
    try:
        mod = importlib.import_module("app_envs_dv")
        assert cluster._is_local_module(mod), cluster._installed_dirs()
        assert importlib.import_module("numpy") not in cluster._top_local_modules()  # installed stays installed
    finally:
        sys.path.remove(str(app))
        sys.modules.pop("app_envs_dv", None)
        monkeypatch.undo()
        cluster._installed_dirs.cache_clear()


PYTHONPATH_SCRIPT = """
import json, sys
import gymnasium as gym
import numpy as np
from distributed import Client, LocalCluster
from daskvec import DaskVecEnv

if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \\
            Client(cluster) as client:
        env = DaskVecEnv([lambda: gym.make("CartPole-v1")] * 2, client=client, timeout=60)
        env.reset()
        _, rewards, _, _ = env.step(np.array([0, 1]))
        env.close()
    print(json.dumps({"numpy": np.__file__, "rewards": rewards.tolist()}))
"""


@pytest.mark.timeout(200)
@pytest.mark.processes
def test_dependencies_from_pythonpath(tmp_path: Path) -> None:
    """The base interpreter with every dependency on ``PYTHONPATH`` (HPC modules, ``pip install --target``).

    Before the fix every factory failed: NumPy, Gymnasium and cloudpickle itself were
    taken for user code and pickled by value ("excessively deep recursion").
    """
    import sysconfig

    base = os.path.realpath(sys.executable)
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs a venv, whose site-packages the base interpreter can take from PYTHONPATH")
    repo = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([sysconfig.get_paths()["purelib"], str(repo)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    script = tmp_path / "train_pythonpath.py"
    script.write_text(PYTHONPATH_SCRIPT)
    proc = subprocess.run(
        [base, "-s", str(script)],
        cwd=tmp_path,
        env=dict(env, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["numpy"].startswith(sysconfig.get_paths()["purelib"])  # NumPy came from PYTHONPATH
    assert out["rewards"] == [1.0, 1.0]
