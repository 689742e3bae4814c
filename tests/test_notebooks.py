"""Execute every notebooks/*.ipynb at reduced size (NUMPYRO_SUBSAMPLE_QUICK=1), one test each."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
TIMEOUT = int(os.environ.get("NUMPYRO_SUBSAMPLE_NOTEBOOK_TIMEOUT", "600"))  # per notebook


# the others are long and marked slow (left out of the default run by pyproject.toml's
# addopts, run by CI after it; README); the quick start is too (tests/conftest.py
# _SLOW_IN_CI: CI's documentation build also executes it)
SLOW = {"bayesian_neural_network", "distributed_shards", "preferential_adaptive",
        "variance_reduced", "zv_postprocessing"}


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p for p in NOTEBOOKS],
    ids=[p.stem for p in NOTEBOOKS],
)
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("NUMPYRO_SUBSAMPLE_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # smoke runs: their programs run briefly, so the kernel compiles them with most XLA
    # optimisations off (as the tests marked fast_compile, conftest.py)
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    # A persistent compilation cache for the kernel, one per notebook (a notebook may simulate
    # another device count, see conftest.py): the programs that several of its runs compile
    # alike (each kernel object traces its own) are compiled once.
    cache = jax.config.jax_compilation_cache_dir
    if cache:
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", f"{cache}-notebook-{path.stem}")
        monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
        monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
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
