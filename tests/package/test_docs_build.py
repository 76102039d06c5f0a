"""The docs site builds as CONTRIBUTING.md says, from the ``docs`` extra alone.

A fresh venv with the ``docs`` extra takes a long install. What that venv lacks against
the test venv is the packages of the other extras; the build runs, with the command
CONTRIBUTING.md gives (``sphinx-build -W -b html docs ...``), in a child interpreter that
cannot import any of them (``docs/conf.py`` imports each ``daskvec`` module a page names,
and autodoc the modules it documents).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).parents[2]

#: The import names of the packages of the extras other than ``docs`` (and of the ``test`` extra's own).
OTHER_EXTRAS = (
    "rl_zoo3",
    "dask_jobqueue",
    "matplotlib",
    "tensorboard",
    "ale_py",
    "cv2",
    "mujoco",
    "envpool",
    "sb3_contrib",
    "dask_gateway",
    "moviepy",
    "torchrl",
    "pygame",
)

#: ``sphinx-build`` in an interpreter where the other extras are not installed, as far as imports can tell.
WITHOUT_OTHER_EXTRAS = f"""
import sys


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {OTHER_EXTRAS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
from sphinx.cmd.build import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(300)
def test_the_docs_build_with_the_docs_extra_alone(tmp_path: Path) -> None:
    pytest.importorskip("sphinx", reason="the docs extra (sphinx) is not installed")
    out, doctrees = tmp_path / "html", tmp_path / "doctrees"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    sphinx_build = ["-W", "-q", "-E", "-d", str(doctrees), "-b", "html", "docs", str(out)]
    build = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTHER_EXTRAS, *sphinx_build],
        cwd=ROOT,
        env=dict(env, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert (out / "index.html").is_file()


@pytest.mark.timeout(60)
def test_the_zoo_module_imports_without_rl_zoo3_and_says_what_to_install() -> None:
    """``daskvec.learners.zoo`` imports without rl_zoo3; running the zoo then names the extra."""
    script = WITHOUT_OTHER_EXTRAS.split("from sphinx")[0] + (
        "import daskvec.learners.zoo as zoo\n"
        "try:\n"
        "    zoo.train_zoo(['--algo', 'ppo'])\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert run.returncode == 0, run.stderr
    assert 'pip install "daskvec[zoo]"' in run.stdout, run.stdout
