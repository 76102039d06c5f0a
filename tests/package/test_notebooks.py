"""Run every tutorial notebook top to bottom, with small step counts, and check what it shows.

The notebooks read their sizes from ``DASKVEC_NB_*`` environment variables, which the
kernel inherits from this process. Each runs in its own temporary directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from notebook_runs import run_notebook, text_of

#: Every test here starts processes (scripts, `dask` commands, clusters).
pytestmark = pytest.mark.processes

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).parents[2] / "notebooks"


def warnings_in(text: str) -> list[str]:
    """Lines of an executed notebook's outputs that are warnings (Python's, daskvec's, or a logger's).

    Except Dask's nanny killing a worker of the notebook's own LocalCluster that took more
    than 4 s to exit when the cluster is closed: a matter of the machine's load, which
    daskvec changes only for its embedded cluster (see the README's "Troubleshooting").
    """
    return [
        line
        for line in text.splitlines()
        if ("Warning" in line or " WARNING " in line or "python/cpython#106883" in line)
        and "Worker process still alive after 4.0 seconds, killing" not in line
    ]


def images_in(nb: Any) -> int:
    return sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_are_stripped(path: Path) -> None:
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{path.name}: outputs are not stripped"
            assert cell["execution_count"] is None, f"{path.name}: execution counts are not stripped"


@pytest.mark.timeout(300)
def test_quickstart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb = run_notebook(
        "quickstart.ipynb", tmp_path, monkeypatch, envs=4, timesteps=2048, ppo_n_steps=256, bench_steps=60, workers=2
    )
    text = text_of(nb)
    assert "Dask dashboard: http" in text
    assert "daskvec page: http" in text and "/daskvec" in text  # checked with the scheduler
    assert "2048 timesteps" in text
    # both vec envs were measured on both envs, and the two plots were drawn
    for cls in ("SubprocVecEnv", "DaskVecEnv"):
        assert text.count(cls) >= 2
    assert images_in(nb) == 2
    assert warnings_in(text) == [], text


@pytest.mark.timeout(300)
def test_monitoring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb = run_notebook("monitoring.ipynb", tmp_path, monkeypatch, envs=4, seconds=4)
    text = text_of(nb)
    assert "daskvec_steps_per_s" in text
    assert "GET /daskvec -> 200" in text
    assert "individual-daskvec" in text
    assert "4 envs" in text  # the page's status line
    assert images_in(nb) == 1
    assert warnings_in(text) == [], text


# The HPC notebook (hpc.ipynb) runs on the real SLURM: tests/test_slurm.py::test_hpc_notebook,
# beside the other SLURM tests, so that no two of them submit jobs to the single node at once.
