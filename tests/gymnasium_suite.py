"""Gymnasium's own vector tests, with DaskVectorEnv in place of AsyncVectorEnv.

Gymnasium's tests are not in its sdist: give this script a checkout of Gymnasium's
repository at the installed version. It copies the tests, runs ``tests/vector``,
``tests/envs/registration/test_make_vec.py`` and ``tests/wrappers/vector`` twice (as they
are, then with ``gymnasium.vector.AsyncVectorEnv`` replaced by a ``DaskVectorEnv`` on a
2-process ``LocalCluster``: the test modules import the name, and
``gymnasium.make_vec(vectorization_mode="async")`` looks it up), and prints the tests
that fail only with DaskVectorEnv. Those failing in both runs lack optional
dependencies (pygame, Box2D, MuJoCo, moviepy). docs/gymnasium.md reports the result.

Usage::

    python tests/gymnasium_suite.py /path/to/Gymnasium [extra pytest arguments]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SUITE = ["tests/vector", "tests/envs/registration/test_make_vec.py", "tests/wrappers/vector"]

CONFTEST = '''
import os

os.environ["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] = "False"

import gymnasium as gym
from gymnasium.vector import AutoresetMode

_CLUSTER = []

if os.environ.get("DASKVEC_AS_ASYNC") == "1":
    from daskvec import DaskVectorEnv

    class DaskAsyncVectorEnv(DaskVectorEnv):
        """AsyncVectorEnv's signature, DaskVectorEnv's body."""

        def __init__(self, env_fns, shared_memory=True, copy=True, context=None, daemon=True, worker=None,
                     observation_mode="same", autoreset_mode=AutoresetMode.NEXT_STEP, max_concurrency=None):
            super().__init__(list(env_fns), _client(), autoreset_mode=autoreset_mode,
                             observation_mode=observation_mode, copy=copy, shared_memory=shared_memory,
                             context=context, daemon=daemon, worker=worker, max_concurrency=max_concurrency)

    gym.vector.AsyncVectorEnv = DaskAsyncVectorEnv


def _client():
    if not _CLUSTER:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                               silence_logs=40)
        _CLUSTER.extend([cluster, Client(cluster, set_as_default=False)])
    return _CLUSTER[1]


def pytest_unconfigure(config):
    for obj in reversed(_CLUSTER):
        obj.close()
'''


def failures(root: Path, dask: bool, extra: list[str]) -> tuple[set[str], str]:
    """The ids of the failing tests, and pytest's summary line."""
    env = {**os.environ, "DASKVEC_AS_ASYNC": "1" if dask else "0"}
    cmd = [sys.executable, "-m", "pytest", *SUITE, "-q", "-rfE", "-p", "no:cacheprovider", *extra]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False).stdout
    failed = {m.group(1) for m in re.finditer(r"^(?:FAILED|ERROR) (\S+)", out, re.MULTILINE)}
    summary = next((line for line in reversed(out.splitlines()) if " in " in line and "passed" in line), "")
    return failed, summary


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    checkout, extra = Path(argv[0]), argv[1:]
    with tempfile.TemporaryDirectory(prefix="gymnasium-suite-") as tmp:
        root = Path(tmp)
        shutil.copytree(checkout / "tests", root / "tests")
        (root / "conftest.py").write_text(CONFTEST)
        alone, alone_summary = failures(root, False, extra)
        dask, dask_summary = failures(root, True, extra)
    print(f"Gymnasium alone:                 {alone_summary}")
    print(f"DaskVectorEnv as AsyncVectorEnv: {dask_summary}")
    only = sorted(dask - alone)
    print(f"failing only with DaskVectorEnv ({len(only)}):")
    for test in only:
        print(f"  {test}")
    return 1 if only else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
