"""Per-step cost of SGLD(cv) under ``numpyro.infer.MCMC`` versus a hand-written BlackJAX loop.

Synthetic logistic regression (the CLI's default problem), d = 21, n = 1000, at N = 10^4 and
10^6: microseconds per step (runs of 12,000 steps, JAX compile time subtracted with its
monitoring events), iterations/s, and the ratio of per-step times 10^6 / 10^4 (foundation
issue: ≥ 10,000 it/s at N = 10^6 and ratio ≤ 1.3). The repetitions interleave the sizes
(every repetition times each method at each N back to back), so a drift of the machine's
speed between repetitions does not enter the ratios: the table gives the best time over the
repetitions, and the ratio line the median over repetitions of that repetition's ratio.

Methods:

- ``recompute`` (default): ∇f_i(θ̂) recomputed on the subsample's rows;
- ``table``: ``store_datum_grads=True`` (gather rows of the N×d table of ∇f_i(θ̂));
- BlackJAX: ``blackjax.sgld`` + ``blackjax.sgmcmc.gradients.control_variates`` in ``lax.scan``;
- ``rows only``: a ``lax.scan`` that draws the 1000 indices (Philox, as the kernels) and sums
  the rows ``X[idx]``, ``y[idx]``, nothing else: the part of any subsampling step whose cost
  depends on N through the memory hierarchy.

    python benchmarks/bench_step.py            # about 3 minutes
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
from bench_sgld import blackjax_cv_chain  # the same hand-written BlackJAX loop
from numpyro.infer import MCMC

from numpyro_subsample import SGLD
from numpyro_subsample.compare import CompileTimer, make_problem
from numpyro_subsample.datasets import logistic_regression_model

n = 1000
SEEDS = itertools.count(1)  # a new key for every kernel run
NAMES = {"recompute": "SGLD cv (default: recompute ∇f_i(θ̂))",
         "table": "SGLD cv, store_datum_grads=True", "blackjax": "BlackJAX SGLD-CV loop",
         "rows": "rows only: draw 1000 indices, read X[idx], y[idx]"}


@partial(jax.jit, static_argnames="num_steps")
def rows_only(key, X, y, *, num_steps: int):
    """Sum of the rows read by ``num_steps`` uniform subsamples of size n."""
    N = X.shape[0]

    def one(acc, k):
        idx = jax.random.randint(jax.random.wrap_key_data(k, impl="philox4x32"), (n,), 0, N)
        return acc + jnp.sum(X[idx], axis=0) + jnp.sum(y[idx]), None

    keys = jax.random.split(key, num_steps)
    return jax.lax.scan(one, jnp.zeros(X.shape[1], X.dtype), keys)[0]


def timed(fn) -> float:
    """Seconds of ``fn()`` with JAX compilation subtracted."""
    with CompileTimer() as ct:
        t = time.perf_counter()
        fn()
        secs = time.perf_counter() - t
    return secs - ct.seconds


def runners(X, y, steps: int) -> dict:
    """One no-argument callable per method, each timing ``steps`` steps at this data set."""
    out = {}
    for variant in ("recompute", "table"):
        kernel = SGLD(logistic_regression_model, estimator="cv", progress_bar=False,
                      store_datum_grads=variant == "table")
        kernel.preprocess((X, y), {"subsample_size": n})

        def run(kernel=kernel):
            mcmc = MCMC(kernel, num_warmup=0, num_samples=steps, progress_bar=False)
            mcmc.run(jax.random.PRNGKey(next(SEEDS)), X, y, subsample_size=n)
            mcmc.get_samples()["beta"].block_until_ready()

        out[variant] = run
        centre = kernel.proxy.centre  # the same fit for both variants (same seed and data)
    step_size = jnp.asarray(1e-5)
    bj = blackjax_cv_chain.lower(jax.random.PRNGKey(0), step_size, X, y, centre, n=n,
                                 num_steps=steps).compile()
    out["blackjax"] = lambda: bj(jax.random.PRNGKey(1), step_size, X, y,
                                 centre).block_until_ready()
    rows = rows_only.lower(jax.random.PRNGKey(0), X, y, num_steps=steps).compile()
    out["rows"] = lambda: rows(jax.random.PRNGKey(1), X, y).block_until_ready()
    for run in out.values():  # warm: the kernels' loop compiles on its first run
        run()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="10000,1000000")
    p.add_argument("--steps", type=int, default=12_000)
    p.add_argument("--reps", type=int, default=5)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(p)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    run = {}
    for N in sizes:
        problem = make_problem("synthetic", num_data=N, subsample_size=n)
        run[N] = runners(problem.X, problem.y, args.steps)
    times = {(N, v): [] for N in sizes for v in NAMES}
    for r in range(args.reps):
        for N in sizes:
            for v in NAMES:
                times[N, v].append(timed(run[N][v]) / args.steps)
        print(f"rep {r}: " + ", ".join(f"{v} {N:.0e} {1e6 * times[N, v][-1]:.1f} µs"
                                       for N in sizes for v in NAMES), file=sys.stderr)
    rows = ["| method | N | µs/step (best) | it/s |", "|---|---|---|---|"]
    for v in NAMES:
        for N in sizes:
            s = min(times[N, v])
            rows.append(f"| {NAMES[v]} | {N:.0e} | {1e6 * s:.1f} | {1 / s:.0f} |")
    if len(sizes) == 2:
        a, b = sizes
        rows.append("")
        for v in NAMES:
            pairs = list(zip(times[a, v], times[b, v], strict=True))
            ratios = [tb / ta for ta, tb in pairs]
            gap = statistics.median(tb - ta for ta, tb in pairs)
            rows.append(f"- {NAMES[v]}: per-step ratio N={b:.0e} / N={a:.0e} = "
                        f"{statistics.median(ratios):.2f} (median over {len(ratios)} "
                        f"repetitions; range {min(ratios):.2f}-{max(ratios):.2f}); "
                        f"difference {1e6 * gap:.1f} µs")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
