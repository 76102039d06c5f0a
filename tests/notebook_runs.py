"""Running the repository's notebooks in a kernel, and reading their outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


def run_notebook(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **params: Any) -> Any:
    """Execute ``notebooks/<name>`` in ``tmp_path`` with ``DASKVEC_NB_*`` parameters; return it."""
    for key, value in params.items():
        monkeypatch.setenv(f"DASKVEC_NB_{key.upper()}", str(value))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # the kernel runs as a user's would: the notebook alone decides about Dask's profiler
    monkeypatch.delenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", raising=False)
    # nor of what an import in this process left behind: importing envpool (the vector-group
    # and workload tests) sets MPLBACKEND=Agg in os.environ, which would keep the kernel's
    # plots from showing inline
    monkeypatch.delenv("MPLBACKEND", raising=False)
    monkeypatch.delenv("MPLCONFIGDIR", raising=False)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    return nb


def text_of(nb: Any) -> str:
    """All stream and text/plain outputs of an executed notebook."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out["text"])
            elif "data" in out and "text/plain" in out["data"]:
                parts.append(out["data"]["text/plain"])
    return "\n".join(parts)
