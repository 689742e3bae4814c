"""Per-step cost of SGLD(cv) under ``numpyro.infer.MCMC`` versus a hand-written BlackJAX loop.

Synthetic logistic regression (the CLI's default problem), d = 21, n = 1000, at N = 10^4 and
10^6: microseconds per step (best of 3 runs of 12,000 steps, JAX compile time subtracted with
its monitoring events), iterations/s, and the ratio of per-step times 10^6 / 10^4 (foundation
issue: ≥ 10,000 it/s at N = 10^6 and ratio ≤ 1.3). Variants of the kernel:

- ``recompute`` (default): ∇f_i(θ̂) recomputed on the subsample's rows;
- ``table``: ``store_datum_grads=True`` (gather rows of the N×d table of ∇f_i(θ̂)).

BlackJAX: ``blackjax.sgld`` + ``blackjax.sgmcmc.gradients.control_variates`` in ``lax.scan``.

    python benchmarks/bench_step.py            # about 2 minutes
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import jax
import jax.numpy as jnp
from bench_sgld import blackjax_cv_chain  # the same hand-written BlackJAX loop
from numpyro.infer import MCMC

from numpyro_subsample import SGLD
from numpyro_subsample.compare import CompileTimer, make_problem
from numpyro_subsample.datasets import logistic_regression_model

n = 1000


def blackjax_per_step(X, y, centre, steps: int, reps: int) -> float:
    step_size = jnp.asarray(1e-5)
    compiled = blackjax_cv_chain.lower(jax.random.PRNGKey(0), step_size, X, y, centre, n=n,
                                       num_steps=steps).compile()
    best = float("inf")
    for r in range(reps):
        t = time.perf_counter()
        compiled(jax.random.PRNGKey(r), step_size, X, y, centre).block_until_ready()
        best = min(best, (time.perf_counter() - t) / steps)
    return best


def kernel_per_step(X, y, table: bool, steps: int, reps: int) -> tuple[float, jax.Array]:
    kernel = SGLD(logistic_regression_model, estimator="cv", progress_bar=False,
                  store_datum_grads=table)
    kernel.preprocess((X, y), {"subsample_size": n})
    best = float("inf")
    for r in range(reps):
        mcmc = MCMC(kernel, num_warmup=0, num_samples=steps, progress_bar=False)
        with CompileTimer() as ct:
            t = time.perf_counter()
            mcmc.run(jax.random.PRNGKey(r), X, y, subsample_size=n)
            mcmc.get_samples()["beta"].block_until_ready()
            secs = time.perf_counter() - t - ct.seconds
        best = min(best, secs / steps)
    return best, kernel.proxy.centre


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="10000,1000000")
    p.add_argument("--steps", type=int, default=12_000)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    res = {}
    for N in sizes:
        problem = make_problem("synthetic", num_data=N, subsample_size=n)
        X, y = problem.X, problem.y
        for variant in ("recompute", "table"):
            res[N, variant], centre = kernel_per_step(X, y, variant == "table", args.steps,
                                                      args.reps)
            print(f"N={N} {variant}: {1e6 * res[N, variant]:.1f} µs", file=sys.stderr)
        res[N, "blackjax"] = blackjax_per_step(X, y, centre, args.steps, args.reps)
    rows = ["| method | N | µs/step | it/s |", "|---|---|---|---|"]
    names = {"recompute": "SGLD cv (default: recompute ∇f_i(θ̂))",
             "table": "SGLD cv, store_datum_grads=True", "blackjax": "BlackJAX SGLD-CV loop"}
    for (N, v), s in res.items():
        rows.append(f"| {names[v]} | {N:.0e} | {1e6 * s:.1f} | {1 / s:.0f} |")
    if len(sizes) == 2:
        a, b = sizes
        rows.append("")
        for v in names:
            rows.append(f"- {names[v]}: per-step ratio N={b:.0e} / N={a:.0e} = "
                        f"{res[b, v] / res[a, v]:.2f}")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
