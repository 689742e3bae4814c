"""ZV post-processing (paper 002 Sect. 4): raw vs ZV posterior means, uniform vs CV gradients.

Conjugate linear regression (exact posterior), several N at fixed n, 10 chains as seeds.
Prints: method, N, wall time, data passes, max error of the mean over seeds (posterior-sd
units) raw and ZV, spread of the mean over seeds raw and ZV, and the median variance
reduction Var g / Var g̃. Run: ``python benchmarks/zv_benchmark.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np
from numpyro.infer import MCMC

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from models import linreg_data, linreg_exact, linreg_model  # noqa: E402

from numpyro_subsample import SGLD, zv_fit  # noqa: E402


def run(N: int, estimator: str, num_samples: int, chains: int = 10) -> dict:
    X, y = linreg_data(N=N, d=5, seed=0)
    mean, sd = linreg_exact(X, y)
    kernel = SGLD(linreg_model, estimator=estimator, progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=500, num_samples=num_samples, num_chains=chains,
                chain_method="vectorized", progress_bar=False)
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("grad", "data_passes"))
    jax.block_until_ready(mcmc.get_samples())
    wall = time.perf_counter() - t0
    res = zv_fit(mcmc, by_chain=True)
    zv, raw = res.mean["first"]["beta"], res.raw_mean["first"]["beta"]
    passes = float(np.asarray(mcmc.get_extra_fields(group_by_chain=True)["data_passes"])[:, -1]
                   .mean())
    return {
        "method": f"SGLD {estimator} + ZV1",
        "N": N,
        "wall_s": wall,
        "passes": passes,
        "err_raw": float(np.max(np.abs(raw - mean) / sd)),
        "err_zv": float(np.max(np.abs(zv - mean) / sd)),
        "spread_raw": float(np.max(raw.std(0) / sd)),
        "spread_zv": float(np.max(zv.std(0) / sd)),
        "vr": float(np.median(res.variance_reduction["first"]["beta"])),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sizes = (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000)
    num_samples = 1_000 if args.quick else 5_000
    rows = [run(N, est, num_samples) for N in sizes for est in ("uniform", "cv")]
    head = ("method", "N", "wall_s", "passes", "err_raw", "err_zv", "spread_raw", "spread_zv",
            "vr")
    print(" | ".join(f"{h:>16}" for h in head))
    for r in rows:
        print(" | ".join(f"{r[h]:>16.4g}" if not isinstance(r[h], str) else f"{r[h]:>16}"
                         for h in head))


if __name__ == "__main__":
    main()
