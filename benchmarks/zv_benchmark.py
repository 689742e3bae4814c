"""ZV post-processing (Baker, Fearnhead, Fox and Nemeth 2019, Sect. 4): raw vs ZV posterior
means, uniform vs CV gradients, stored draws vs statistics streamed in the sampling loop.

Conjugate linear regression (exact posterior), several N at fixed n, 10 chains as seeds.
Prints a markdown table: method, N, wall time, data passes, max error of the mean over seeds
(posterior-sd units) raw and ZV, spread of the mean over seeds raw and ZV, and the median
variance reduction Var g / Var g̃. Run: ``python benchmarks/zv_benchmark.py [--quick|--smoke]``
(``--smoke``: one tiny size, seconds).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np
from numpyro.infer import MCMC

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from models import linreg_data, linreg_exact, linreg_model  # noqa: E402

from numpyro_subsample import SGLD, ZVOptions, zv_fit  # noqa: E402

HEAD = ("method", "N", "wall_s", "passes", "err_raw", "err_zv", "spread_raw", "spread_zv", "vr")


def run(N: int, estimator: str, num_samples: int, chains: int = 10, stream: bool = False,
        num_warmup: int = 500) -> dict:
    X, y = linreg_data(N=N, d=5, seed=0)
    mean, sd = linreg_exact(X, y)
    kernel = SGLD(linreg_model, estimator=estimator, progress_bar=False,
                  zv=ZVOptions() if stream else None)
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=chains,
                chain_method="vectorized", progress_bar=False)
    fields = ("data_passes",) if stream else ("grad", "data_passes")
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=fields)
    jax.block_until_ready(mcmc.get_samples())
    wall = time.perf_counter() - t0
    res = zv_fit(mcmc, by_chain=True, mode="stream" if stream else "stored")
    zv, raw = res.mean["first"]["beta"], res.raw_mean["first"]["beta"]
    passes = float(np.asarray(mcmc.get_extra_fields(group_by_chain=True)["data_passes"])[:, -1]
                   .mean())
    return {
        "method": f"SGLD {estimator} + ZV1" + (" (stream)" if stream else ""),
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
    ap.add_argument("--smoke", action="store_true", help="one tiny size (a check, not a result)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(ap)
    args = ap.parse_args()
    if args.smoke:
        sizes, num_samples, chains, num_warmup = (2_000,), 200, 3, 50
    elif args.quick:
        sizes, num_samples, chains, num_warmup = (10_000, 100_000), 1_000, 10, 500
    else:
        sizes, num_samples, chains, num_warmup = (10_000, 100_000, 1_000_000), 5_000, 10, 500
    configs = (("uniform", False), ("cv", False), ("cv", True))
    rows = [run(N, est, num_samples, chains, stream, num_warmup)
            for N in sizes for est, stream in configs]
    print("## ZV post-processing (zv_benchmark.py)\n")
    print("| " + " | ".join(HEAD) + " |")
    print("|" + "---|" * len(HEAD))
    for r in rows:
        print("| " + " | ".join(r[h] if isinstance(r[h], str) else f"{r[h]:.4g}" for h in HEAD)
              + " |")


if __name__ == "__main__":
    main()
