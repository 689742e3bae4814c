"""Execute every notebooks/*.ipynb at reduced size (NUMPYRO_SUBSAMPLE_QUICK=1), one test each."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
TIMEOUT = int(os.environ.get("NUMPYRO_SUBSAMPLE_NOTEBOOK_TIMEOUT", "600"))  # per notebook


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("NUMPYRO_SUBSAMPLE_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=TIMEOUT, kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},  # outputs written by it go here
    )
    client.execute()  # raises CellExecutionError (with the cell and traceback) on failure
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


def test_notebooks_are_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        dirty = [i for i, c in enumerate(nb.cells)
                 if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
        assert not dirty, f"{path.name}: cells {dirty} have stored outputs; strip them"
