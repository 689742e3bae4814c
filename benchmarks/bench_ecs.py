"""Benchmark of issue 6: energy-conserving subsampling HMC with Taylor / variational proxies.

Part 1 — synthetic logistic regression (``datasets.default_problem``: d = 21, prior N(0, 10²)),
N = 10^5 and 10^6, subsample m = 1000, 500 warm-up + 1000 draws, in one run:

- ``numpyro.infer.HMCECS`` (NUTS inner kernel, ``taylor_proxy`` at an SVI/AutoDelta MAP,
  100 blocks), as run by ``numpyro-subsample compare``;
- ``EnergyConservingHMC(proxy="laplace")`` (second-order Taylor likelihood proxy at the Laplace
  mode, 10 blocks), with uniform and with Hansen-Hurwitz (``selection="preferential"``)
  subsampling;
- ``EnergyConservingHMC(proxy="variational")`` (second-order hybrid likelihood proxy,
  preferential selection).

Reference: full-data NUTS (500 + 1000 draws), cached on disk under
``benchmarks/results/reference_cache`` by :func:`numpyro_subsample.compare.reference_run`
(keyed by the data's content hash), so only the first run pays for it. Seconds exclude JAX
compilation, which is reported apart. Errors: max over the 21 coordinates of
|mean − ref mean| / ref sd and |sd / ref sd − 1|; with 1000 reference draws these carry
Monte Carlo noise of ~0.05 themselves.

Part 2 — σ̂² of the log-likelihood estimator at posterior draws (40 full-data NUTS draws,
σ̂² averaged over 200 fresh subsamples at each) on two models where the Laplace approximation
is poor, for Taylor-1/2, variational, hybrid-1/2, each with uniform and preferential selection:
a rare-event logistic regression (~0.1 % positives, d = 5) and a quasi-separated one (a binary
feature present in 30 data only, skewed coefficient posterior).

    python benchmarks/bench_ecs.py            # full
    python benchmarks/bench_ecs.py --quick    # N = 10^4 and 5·10^4, m = 500, short chains
    python benchmarks/bench_ecs.py --smoke    # N = 2000, m = 100, tiny chains (a check only)

Prints markdown tables on stdout (progress on stderr); ``--out FILE`` also writes them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_subsample import EnergyConservingHMC, LikelihoodOptions
from numpyro_subsample.compare import (
    CompileTimer,
    Problem,
    Settings,
    fit_shared_proxy,
    reference_run,
    run_hmcecs,
)

# not in numpyro_subsample.compare.__all__: the compare command's warning filter, so that its
# HMCECS rows and these are run alike
from numpyro_subsample.compare.timing import quiet
from numpyro_subsample.datasets import (
    default_problem,
    logistic_regression_model,
    make_quasi_separated,
)

FIELDS = ("sigma2", "index_accept_prob", "accept_prob", "num_steps")
CACHE = Path(__file__).resolve().parent / "results" / "reference_cache"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def nuts_settings(warmup: int, samples: int) -> Settings:
    return Settings(0, 0, warmup, samples, 0)


def nuts_reference(problem: Problem, warmup: int, samples: int) -> tuple[np.ndarray, str]:
    """Full-data NUTS draws of ``beta`` via the comparison's on-disk cache."""
    t0 = time.perf_counter()
    out, cached = reference_run(problem, nuts_settings(warmup, samples), cache_dir=CACHE)
    note = ("cached" if cached else f"computed in {time.perf_counter() - t0:.0f} s")
    return np.asarray(out.samples["beta"], np.float64), note


def errors(draws: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    sd = ref.std(0)
    mean_err = np.abs(draws.mean(0) - ref.mean(0)) / sd
    sd_err = np.abs(draws.std(0) / sd - 1)
    return float(mean_err.max()), float(sd_err.max())


def run_numpyro_hmcecs(problem: Problem, warmup: int, samples: int, seed: int = 0) -> dict:
    """numpyro.infer.HMCECS (NUTS, 100 blocks) with taylor_proxy at the Laplace mode (the same
    full-data Newton mode EnergyConservingHMC(proxy="laplace") uses; its time is charged
    here), as run by ``numpyro-subsample compare``."""
    shared = fit_shared_proxy(problem, seed=seed)
    out = run_hmcecs(problem, nuts_settings(warmup, samples), shared, seed=seed)
    return {"beta": np.asarray(out.samples["beta"], np.float64), "pre_s": out.preprocessing_s,
            "run_s": out.sampling_s, "compile_s": out.compile_s + shared.compile_s}


def run_ecs(problem: Problem, warmup: int, samples: int, seed: int = 0, **kw) -> dict:
    kernel = EnergyConservingHMC(problem.model, num_blocks=10, progress_bar=False, seed=seed,
                                 **kw)
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, progress_bar=False)
    with quiet(), CompileTimer() as ct_pre:
        t0 = time.perf_counter()
        pre = kernel.preprocess(problem.args(), problem.kwargs())
        pre_s = time.perf_counter() - t0 - ct_pre.seconds
    with quiet(), CompileTimer() as ct:
        t1 = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed), *problem.args(), **problem.kwargs(),
                 extra_fields=FIELDS)
        beta = np.asarray(mcmc.get_samples()["beta"], np.float64)
        run_s = time.perf_counter() - t1 - ct.seconds
    ex = {k: np.asarray(v) for k, v in mcmc.get_extra_fields().items()}
    return {"kernel": kernel, "beta": beta, "pre_s": pre_s, "run_s": run_s, "extra": ex,
            "passes": pre.data_passes, "compile_s": ct_pre.seconds + ct.seconds}


ECS_VARIANTS = {
    "ECS taylor-2 uniform": dict(proxy="laplace", selection="uniform"),
    "ECS taylor-2 preferential": dict(proxy="laplace", selection="preferential"),
    "ECS hybrid-2 preferential": dict(proxy="variational", likelihood_proxy="hybrid",
                                       likelihood=LikelihoodOptions(hybrid_order=2),
                                       selection="preferential"),
}


def part1(Ns, m, warmup, samples, variants) -> list[str]:
    head = ["| method | N | preprocess s | sampling s | compile s | total s (no compile) | "
            "time / HMCECS | median σ̂² | index acc. | HMC acc. | mean err (max, sd units) | "
            "sd err (max) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for N in Ns:
        ds = default_problem(N)
        problem = Problem(ds.name, logistic_regression_model, jnp.asarray(ds.X_train),
                          jnp.asarray(ds.y_train), m, "logistic", ds.info)
        log(f"N={N}: NUTS reference")
        ref, note = nuts_reference(problem, warmup, samples)
        log(f"N={N}: reference {note}")
        log(f"N={N}: numpyro HMCECS")
        res = run_numpyro_hmcecs(problem, warmup, samples)
        me, se = errors(res["beta"], ref)
        t_ref = res["pre_s"] + res["run_s"]
        rows.append(f"| numpyro HMCECS (taylor_proxy) | {N:.0e} | {res['pre_s']:.1f} "
                    f"| {res['run_s']:.1f} | {res['compile_s']:.1f} | {t_ref:.1f} | 1.00 | – "
                    f"| – | – | {me:.3f} | {se:.3f} |")
        for name in variants:
            log(f"N={N}: {name}")
            r = run_ecs(problem, warmup, samples, **ECS_VARIANTS[name])
            me, se = errors(r["beta"], ref)
            ex = r["extra"]
            total = r["pre_s"] + r["run_s"]
            rows.append(
                f"| {name} | {N:.0e} | {r['pre_s']:.1f} | {r['run_s']:.1f} | "
                f"{r['compile_s']:.1f} | {total:.1f} | {total / t_ref:.2f} | "
                f"{np.median(ex['sigma2']):.3g} | {ex['index_accept_prob'].mean():.2f} | "
                f"{ex['accept_prob'].mean():.2f} | {me:.3f} | {se:.3f} |")
        rows.append(f"| (reference: full-data NUTS, {note}) | {N:.0e} | | | | | | | | | | |")
        print("\n".join(head + rows), flush=True)
    return head + rows


def logit_model(X, y=None, subsample_size=1000):
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def rare_event_data(N, d=5, seed=0):
    """~0.1 % positives: intercept −7."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([np.ones((N, 1)), rng.normal(size=(N, d - 1))], 1).astype(np.float32)
    beta = np.concatenate([[-7.0], 0.8 * rng.normal(size=d - 1)])
    y = (rng.uniform(size=N) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)


def quasi_separated_data(N):
    """``datasets.make_quasi_separated``: a rare binary feature (30 data, true coefficient 5),
    nearly all of them y = 1, so its coefficient's posterior is wide and right-skewed."""
    ds = make_quasi_separated(N)
    return jnp.asarray(ds.X_train), jnp.asarray(ds.y_train)


def sigma2_table(name, X, y, m, warmup, samples, num_draws=40, num_sub=200) -> list[str]:
    from scipy.stats import skew

    problem = Problem(name, logit_model, X, y, m, "logistic", {})
    ref, note = nuts_reference(problem, warmup, samples)
    draws = ref[:: max(1, ref.shape[0] // num_draws)][:num_draws]
    log(f"{name}: N={X.shape[0]}, reference {note}")

    def make(**kw):
        kw.setdefault("selection", "uniform")
        k = EnergyConservingHMC(logit_model, progress_bar=False, **kw)
        k.preprocess(problem.args(), problem.kwargs())
        return k

    kernels = {"taylor-1": make(proxy="laplace", likelihood=LikelihoodOptions(taylor_order=1))}
    kernels["taylor-2"] = make(proxy="laplace")
    kernels["hybrid-1"] = make(proxy="variational", likelihood_proxy="hybrid",
                               likelihood=LikelihoodOptions(hybrid_order=1))
    info = kernels["hybrid-1"].proxy.info
    gk = {"guide": info["guide"], "guide_params": info["guide_params"]}
    kernels["hybrid-2"] = make(proxy="variational", proxy_kwargs=gk)
    kernels["variational (Rønning and Hamelryck 2021)"] = make(
        proxy="variational", likelihood_proxy="variational", proxy_kwargs=gk)
    kernels["taylor-1, preferential"] = make(proxy="laplace",
                                             likelihood=LikelihoodOptions(taylor_order=1),
                                             selection="preferential")
    kernels["taylor-2, preferential"] = make(proxy="laplace", selection="preferential")
    kernels["hybrid-2, preferential"] = make(proxy="variational", proxy_kwargs=gk,
                                             selection="preferential")
    rows = [f"\n**{name}**: N={X.shape[0]}, m={m}, {int(np.asarray(y).sum())} positives; "
            f"posterior skewness per coordinate {np.round(skew(ref, 0), 2).tolist()}; σ̂² = mean "
            f"over {num_sub} subsamples at each of {len(draws)} full-data NUTS draws", "",
            "| proxy, selection | median σ̂² | mean σ̂² | 90% quantile σ̂² |", "|---|---|---|---|"]
    for label, k in kernels.items():
        vals = np.asarray([
            float(k.loglik_estimates(jnp.asarray(t, jnp.float32), jax.random.PRNGKey(i),
                                     num_sub)[1].mean())
            for i, t in enumerate(draws)])
        rows.append(f"| {label} | {np.median(vals):.3g} | {vals.mean():.3g} | "
                    f"{np.quantile(vals, 0.9):.3g} |")
        log(rows[-1])
    print("\n".join(rows), flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs")
    p.add_argument("--out", default=None, help="also write the tables to this markdown file")
    p.add_argument("--skip-part1", action="store_true")
    p.add_argument("--skip-part2", action="store_true")
    p.add_argument("--variants", default=",".join(ECS_VARIANTS),
                   help="comma-separated ECS variants of part 1")
    p.add_argument("--sizes", default=None, help="comma-separated N of part 1 (override)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(p)
    args = p.parse_args(argv)
    draws2 = (40, 200)  # part 2: NUTS draws and subsamples per draw
    if args.smoke:
        Ns, m, warmup, samples, N2, draws2 = (2000,), 100, 100, 200, 2000, (4, 20)
    elif args.quick:
        Ns, m, warmup, samples, N2 = (10_000, 50_000), 500, 300, 500, 10_000
    else:
        Ns, m, warmup, samples, N2 = (100_000, 1_000_000), 1000, 500, 1000, 20_000
    if args.sizes:
        Ns = tuple(int(float(v)) for v in args.sizes.split(","))
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    out = ["## Energy-conserving subsampling HMC (issue 6)", "",
           f"jax {jax.__version__}, numpyro {numpyro.__version__}, {jax.device_count()} CPU "
           "device(s); shared machine, timings under load — compare ratios within one run.", ""]
    print("\n".join(out), flush=True)
    if not args.skip_part1:
        out += part1(Ns, m, warmup, samples, variants)
    if not args.skip_part2:
        out += sigma2_table("rare-event logistic", *rare_event_data(N2), m, warmup, samples,
                            *draws2)
        out += sigma2_table("quasi-separated logistic", *quasi_separated_data(N2), m, warmup,
                            samples, *draws2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
