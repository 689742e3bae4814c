"""Compilation, preprocessing and sampling time of a cold default run, and of a rerun on new data.

For a logistic regression with d = 21 at each N, in a fresh process per N (cold in-memory
caches, an empty persistent compilation cache):

1. ``SGLD(model)`` with every default, under NumPyro's ``MCMC(num_warmup=1000,
   num_samples=10_000, jit_model_args=True)`` and under the package's ``MCMC`` at its defaults
   (its own loop, with the data an argument of its programs): wall time of the first ``run``
   (everything a user waits for), its CPU seconds and the load average before it (the
   machine may be shared), the seconds JAX spent tracing, lowering and compiling (its own
   monitoring events), the preprocessing seconds (proxy fit, estimator, step size) and the
   sampling seconds;
2. a second ``run`` of the same MCMC object on new data of the same shapes: wall time and the
   number of XLA compilations (cache hits of the persistent cache excluded);
3. NumPyro NUTS on the full data (500 warm-up + 1000 draws), wall time including compilation.

    python benchmarks/bench_compile.py                 # N = 10^4, 10^5, 10^6, both MCMCs
    python benchmarks/bench_compile.py --sizes 10000 --nuts-sizes 10000 --mcmc package
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r'''
import json, os, sys, time, warnings
warnings.simplefilter("ignore")
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[3])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS
from numpyro_subsample import SGLD
from numpyro_subsample import MCMC as PackageMCMC
from numpyro_subsample.compare import CompileTimer

N, run_nuts, which = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[4]

def model(X, y=None):
    beta = numpyro.sample("beta", dist.Normal(0, 10).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=1000) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])

def data(seed):
    rng = np.random.default_rng(seed)
    X = np.concatenate([np.ones((N, 1)), rng.normal(size=(N, 20))], 1).astype(np.float32)
    beta = rng.normal(size=21) * 0.5
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ beta))).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)

out = {"N": N, "mcmc": which}
X, y = data(0)
jax.block_until_ready((X, y))
kernel = SGLD(model, progress_bar=False)
if which == "numpyro":
    mcmc = MCMC(kernel, num_warmup=1000, num_samples=10_000, progress_bar=False,
                jit_model_args=True)
else:
    mcmc = PackageMCMC(kernel, num_warmup=1000, num_samples=10_000, progress_bar=False)
out["load"] = os.getloadavg()[0]
with CompileTimer() as ct:
    t0, c0 = time.perf_counter(), time.process_time()
    mcmc.run(jax.random.PRNGKey(0), X, y)
    draws = jax.block_until_ready(mcmc.get_samples()["beta"])
    out["cold_total_s"] = time.perf_counter() - t0
    out["cold_cpu_s"] = time.process_time() - c0
out["cold_compile_s"] = ct.seconds
out["cold_programs"] = len(ct.per_program)
out["cold_top_programs"] = sorted(ct.per_program.items(), key=lambda kv: -kv[1])[:8]
out["preprocess_s"] = kernel.preprocessed.seconds
out["sampling_s"] = out["cold_total_s"] - out["preprocess_s"]
out["step_size"] = kernel.step_size
X2, y2 = data(1)
jax.block_until_ready((X2, y2))
with CompileTimer() as ct:
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(1), X2, y2)
    jax.block_until_ready(mcmc.get_samples()["beta"])
    out["rerun_total_s"] = time.perf_counter() - t0
out["rerun_compilations"] = ct.compiled
out["rerun_programs"] = ct.programs
out["rerun_trace_lower_s"] = ct.seconds
if run_nuts:
    def full(X, y=None):
        beta = numpyro.sample("beta", dist.Normal(0, 10).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)
    t0 = time.perf_counter()
    nuts = MCMC(NUTS(full), num_warmup=500, num_samples=1000, progress_bar=False)
    nuts.run(jax.random.PRNGKey(2), X, y)
    jax.block_until_ready(nuts.get_samples()["beta"])
    out["nuts_total_s"] = time.perf_counter() - t0
print("RESULT " + json.dumps(out))
'''


def run_one(N: int, nuts: bool, mcmc: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        proc = subprocess.run(
            [sys.executable, "-c", WORKER, str(N), "1" if nuts else "0", cache, mcmc],
            capture_output=True, text=True, env={**os.environ, "CI": "1"},
        )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"worker for N={N} failed:\n{proc.stderr[-3000:]}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--nuts-sizes", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--mcmc", nargs="+", choices=["numpyro", "package"],
                    default=["numpyro", "package"],
                    help="NumPyro's MCMC (jit_model_args=True) and/or the package's MCMC")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(ap)
    args = ap.parse_args(argv)
    rows = []
    t0 = time.perf_counter()
    for N in args.sizes:
        for i, which in enumerate(args.mcmc):
            rows.append(run_one(N, i == 0 and N in args.nuts_sizes, which))
            print(json.dumps(rows[-1]), flush=True)
    head = ("| N | MCMC | cold run total (s) | its CPU s | load | of which compile (s) "
            "| preprocessing (s) | sampling (s) | rerun on new data (s) | rerun XLA compilations "
            "| NUTS 500+1000 (s) | cold / NUTS |")
    print("\n" + head + "\n|" + "---|" * 12)
    for r in rows:
        nuts = r.get("nuts_total_s")
        ratio = f"{r['cold_total_s'] / nuts:.3f}" if nuts else "–"
        print(f"| {r['N']:,} | {r['mcmc']} | {r['cold_total_s']:.2f} | {r['cold_cpu_s']:.2f} "
              f"| {r['load']:.1f} "
              f"| {r['cold_compile_s']:.2f} | {r['preprocess_s']:.2f} | {r['sampling_s']:.2f} | "
              f"{r['rerun_total_s']:.2f} | {r['rerun_compilations']} | "
              + (f"{nuts:.1f} | {ratio} |" if nuts else "– | – |"))
    for r in rows:
        top = ", ".join(f"{k} {v:.2f}" for k, v in r["cold_top_programs"])
        print(f"N={r['N']:,} ({r['mcmc']}): {r['cold_programs']} programs traced/compiled; "
              f"slowest (s): {top}")
    for which in args.mcmc:
        c = {r["N"]: r["cold_compile_s"] for r in rows if r["mcmc"] == which}
        if len(c) > 1:
            lo, hi = min(c), max(c)
            print(f"compile seconds ({which}) N={hi:,} / N={lo:,}: {c[hi] / c[lo]:.2f}")
    print(f"benchmark wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
