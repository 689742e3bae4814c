"""benchmarks/bench_scale.py at a tiny size, so that it cannot rot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_scale.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_scale", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_references_are_right(bench, tmp_path):
    """The linear reference is the conjugate posterior; the logistic mode has zero gradient
    and its Laplace check is small."""
    xp, yp = bench.make_data(tmp_path, "linear", 3000, 4)
    X, y = np.load(xp).astype(np.float64), np.load(yp).astype(np.float64)
    assert np.all(X[:, 0] == 1.0)
    ref = bench.reference("linear", np.load(xp, mmap_mode="r"), np.load(yp, mmap_mode="r"))
    cov = np.linalg.inv(X.T @ X / bench.NOISE_SD**2 + np.eye(4) / bench.PRIOR_SD**2)
    np.testing.assert_allclose(ref["mean"], cov @ X.T @ y / bench.NOISE_SD**2, rtol=1e-8)
    np.testing.assert_allclose(ref["sd"], np.sqrt(np.diag(cov)), rtol=1e-8)

    xp, yp = bench.make_data(tmp_path, "logistic", 3000, 4)
    X, y = np.load(xp).astype(np.float64), np.load(yp).astype(np.float64)
    assert set(np.unique(y)) == {0.0, 1.0}
    ref = bench.reference("logistic", X, y)
    p = 1 / (1 + np.exp(-X @ ref["mean"]))
    grad = X.T @ (y - p) - ref["mean"] / bench.PRIOR_SD**2
    assert np.max(np.abs(grad) * ref["sd"]) < 1e-6
    assert float(ref["check"].split("= ")[1].split()[0]) < 0.3


def test_one_run_and_the_table(bench, tmp_path):
    """One memory-mapped SGLD run through the script's worker, and its table row."""
    xp, yp = bench.make_data(tmp_path, "linear", 5000, 3)
    ref = bench.reference("linear", np.load(xp, mmap_mode="r"), np.load(yp, mmap_mode="r"))
    check = ref.pop("check")
    np.savez(tmp_path / "ref.npz", **ref)
    cfg = dict(model="linear", kernel="SGLD", storage="mmap", rows=5000, dim=3, X=str(xp),
               y=str(yp), ref=str(tmp_path / "ref.npz"), subsample=100, warmup=500,
               samples=3000)
    out = bench.run_sg(cfg)
    assert out["mean_err"] < 0.5 and out["logsd_err"] < 0.5, out
    assert out["pre_passes"] > 1 and out["passes"] > out["pre_passes"]
    assert 0 < out["compile_s"] < out["wall_s"] and out["peak_gb"] > 0
    assert out["cpu_s"] > 0 and len(out["load"]) == 2
    nuts = {"linear": {"grad_s": 0.01, "steps": 3.0, "ess_per_draw": 1.0}}
    text = bench.table([out], nuts, {"linear": check}, 5000 * 4 * 4 / 2**30)
    assert "| linear | SGLD | mmap |" in text and "reference: exact" in text
