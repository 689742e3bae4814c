"""Benchmark of issue 6: energy-conserving subsampling HMC with Taylor / variational proxies.

Part 1 — synthetic logistic regression (``datasets.default_problem``: d = 21, prior N(0, 10²)),
N = 10^5 and 10^6, subsample m = 1000, 500 warm-up + 1000 draws, in one run:

- ``numpyro.infer.HMCECS`` (NUTS inner kernel, ``taylor_proxy`` at an SVI/AutoDelta MAP,
  100 blocks), as run by ``numpyro-subsample compare``;
- ``EnergyConservingHMC(proxy="taylor")`` (second order, Laplace mode, 10 blocks);
- ``EnergyConservingHMC(proxy="hybrid")`` (SVI guide: E_q[ℓ_i] + first-order correction).

Reference: the Laplace approximation from full-data Newton (mode, inverse Hessian), 20,000
exact Gaussian draws. At N ≥ 10^5 with d = 21 this posterior is Gaussian to O(N^-1/2) in sd
units (skewness of a logistic-regression posterior), far below the errors measured; full-data
NUTS at N = 10^6 would take longer than everything else here together.

Part 2 — σ̂² of the log-likelihood estimator at posterior draws on a model whose Laplace
approximation is poor: a rare-event logistic regression (N = 10^5, d = 5, ~0.3 % positives;
skewed intercept posterior). Draws come from a Taylor-2 ECS run; at each of 40 draws,
σ̂² is averaged over 200 fresh subsamples, for Taylor-1, Taylor-2, variational and hybrid
proxies. Median over draws reported.

    python benchmarks/bench_ecs.py            # full (several minutes on an idle machine)
    python benchmarks/bench_ecs.py --quick    # N = 10^4 and 5·10^4, m = 500, short chains

Prints markdown tables on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_subsample import EnergyConservingHMC, build_potential, fit_laplace
from numpyro_subsample.cli import Problem, Settings, run_hmcecs
from numpyro_subsample.datasets import default_problem, logistic_regression_model

FIELDS = ("sigma2", "index_accept_prob", "accept_prob", "num_steps")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _block(tree):
    jax.tree.map(lambda x: x.block_until_ready() if hasattr(x, "block_until_ready") else x, tree)


def laplace_reference(problem: Problem, num_draws: int = 20_000) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    pot = build_potential(problem.model, problem.args(), problem.kwargs(), jax.random.PRNGKey(0))
    proxy = fit_laplace(pot, jax.random.PRNGKey(0), store_datum_grads=False)
    eps = np.random.default_rng(0).normal(size=(num_draws, pot.dim))
    draws = np.asarray(proxy.centre, np.float64) + eps @ np.asarray(proxy.scale_tril, np.float64).T
    return draws, time.perf_counter() - t0


def errors(draws: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    sd = ref.std(0)
    mean_err = np.abs(draws.mean(0) - ref.mean(0)) / sd
    sd_err = np.abs(draws.std(0) / sd - 1)
    return float(mean_err.max()), float(sd_err.max())


def run_ecs(problem: Problem, proxy: str, warmup: int, samples: int, seed: int = 0) -> dict:
    kernel = EnergyConservingHMC(problem.model, proxy=proxy, num_blocks=10, progress_bar=False,
                                 seed=seed)
    t0 = time.perf_counter()
    pre = kernel.preprocess(problem.args(), problem.kwargs())
    pre_s = time.perf_counter() - t0
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, progress_bar=False)
    t1 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), *problem.args(), **problem.kwargs(), extra_fields=FIELDS)
    beta = np.asarray(mcmc.get_samples()["beta"], np.float64)
    run_s = time.perf_counter() - t1
    ex = {k: np.asarray(v) for k, v in mcmc.get_extra_fields().items()}
    return {"kernel": kernel, "beta": beta, "pre_s": pre_s, "run_s": run_s, "extra": ex,
            "passes": pre.data_passes}


def part1(Ns, m, warmup, samples) -> list[str]:
    rows = ["| method | N | preprocess s | sampling s (incl. compile) | total s | median σ̂² | "
            "index acc. | HMC acc. | mean err (max, sd units) | sd err (max, rel.) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for N in Ns:
        ds = default_problem(N)
        problem = Problem(ds.name, logistic_regression_model, jnp.asarray(ds.X_train),
                          jnp.asarray(ds.y_train), m, "logistic", ds.info)
        log(f"N={N}: Laplace reference")
        ref, ref_s = laplace_reference(problem)
        log(f"N={N}: numpyro HMCECS")
        res = run_hmcecs(problem, Settings(0, 0, warmup, samples, 0), 0, False)
        beta = np.asarray(res["samples"]["beta"], np.float64)
        me, se = errors(beta, ref)
        total = res["preprocessing_s"] + res["sampling_s"] + res["compile_s"]
        rows.append(f"| numpyro HMCECS (taylor_proxy) | {N:.0e} | {res['preprocessing_s']:.1f} | "
                    f"{res['sampling_s'] + res['compile_s']:.1f} | {total:.1f} | – | – | – | "
                    f"{me:.3f} | {se:.3f} |")
        for proxy in ("taylor", "hybrid"):
            log(f"N={N}: EnergyConservingHMC({proxy})")
            r = run_ecs(problem, proxy, warmup, samples)
            me, se = errors(r["beta"], ref)
            ex = r["extra"]
            rows.append(
                f"| EnergyConservingHMC({proxy}) | {N:.0e} | {r['pre_s']:.1f} | {r['run_s']:.1f} "
                f"| {r['pre_s'] + r['run_s']:.1f} | {np.median(ex['sigma2']):.3g} | "
                f"{ex['index_accept_prob'].mean():.2f} | {ex['accept_prob'].mean():.2f} | "
                f"{me:.3f} | {se:.3f} |")
        print("\n".join(rows[-3:]) if N != Ns[0] else "\n".join(rows), flush=True)
    return rows


def rare_event_model(X, y=None, subsample_size=1000):
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def rare_event_data(N, d=5, seed=0):
    rng = np.random.default_rng(seed)
    X = np.concatenate([np.ones((N, 1)), rng.normal(size=(N, d - 1))], 1).astype(np.float32)
    beta = np.concatenate([[-7.0], 0.8 * rng.normal(size=d - 1)])
    y = (rng.uniform(size=N) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)


def part2(N, m, warmup, samples, num_draws=40, num_sub=200) -> list[str]:
    X, y = rare_event_data(N)
    problem = Problem("rare_event", rare_event_model, X, y, m, "logistic", {})
    log(f"rare-event logistic regression: N={N}, {int(np.asarray(y).sum())} positives")
    base = run_ecs(problem, "taylor", warmup, samples)
    draws = base["beta"][:: max(1, base["beta"].shape[0] // num_draws)][:num_draws]
    kernels = {"taylor (order 2)": base["kernel"]}
    k1 = EnergyConservingHMC(rare_event_model, proxy="taylor", taylor_order=1,
                             progress_bar=False)
    k1.preprocess(problem.args(), problem.kwargs())
    kernels["taylor (order 1)"] = k1
    kh = EnergyConservingHMC(rare_event_model, proxy="hybrid", progress_bar=False)
    kh.preprocess(problem.args(), problem.kwargs())
    kernels["hybrid"] = kh
    info = kh.proxy.info
    kv = EnergyConservingHMC(rare_event_model, proxy="variational", progress_bar=False,
                             proxy_kwargs={"guide": info["guide"],
                                           "guide_params": info["guide_params"]})
    kv.preprocess(problem.args(), problem.kwargs())
    kernels["variational (paper 003)"] = kv
    rows = [f"\nσ̂² at {len(draws)} posterior draws, rare-event logistic regression "
            f"(N={N}, m={m}, {int(np.asarray(y).sum())} positives); mean over {num_sub} "
            "subsamples per draw", "",
            "| proxy | median σ̂² | 90% quantile σ̂² | σ̂² at proxy centre |", "|---|---|---|---|"]
    for name, k in kernels.items():
        fn = jax.jit(lambda t, key, k=k: k.loglik_estimates(t, key, num_sub)[1].mean())
        vals = np.asarray([float(fn(jnp.asarray(t), jax.random.PRNGKey(i)))
                           for i, t in enumerate(draws)])
        at_centre = float(fn(k.preprocessed.ref, jax.random.PRNGKey(99)))
        rows.append(f"| {name} | {np.median(vals):.3g} | {np.quantile(vals, 0.9):.3g} | "
                    f"{at_centre:.3g} |")
    print("\n".join(rows), flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        Ns, m, warmup, samples, N2 = (10_000, 50_000), 500, 300, 500, 20_000
    else:
        Ns, m, warmup, samples, N2 = (100_000, 1_000_000), 1000, 500, 1000, 100_000
    print("## Energy-conserving subsampling HMC (issue 6)\n")
    part1(Ns, m, warmup, samples)
    part2(N2, m, warmup, samples)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
