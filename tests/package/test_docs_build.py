"""The docs site builds as CONTRIBUTING.md says, from the ``docs`` extra alone.

A fresh venv with the ``docs`` extra takes a long install; what that venv lacks against
the test venv is the other extras, of which only ``rl_zoo3`` (the ``zoo`` extra) is
imported by the docs' reference check (``docs/conf.py`` imports each ``daskvec`` module a
page names). So the build runs in a child interpreter that cannot import ``rl_zoo3``,
with the command CONTRIBUTING.md gives (``sphinx-build -W -b html docs ...``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).parents[2]

#: ``sphinx-build`` in an interpreter where ``rl_zoo3`` is not installed, as far as imports can tell.
WITHOUT_THE_ZOO = """
import sys


class _NoZoo:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "rl_zoo3":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoZoo())
from sphinx.cmd.build import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(300)
def test_the_docs_build_without_the_zoo_extra(tmp_path: Path) -> None:
    pytest.importorskip("sphinx", reason="the docs extra (sphinx) is not installed")
    out, doctrees = tmp_path / "html", tmp_path / "doctrees"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    build = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_ZOO, "-W", "-q", "-E", "-d", str(doctrees), "-b", "html", "docs", str(out)],
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
    script = WITHOUT_THE_ZOO.split("from sphinx")[0] + (
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
