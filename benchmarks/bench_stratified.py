"""Fu and Zhang (2023) Table 2 layout: SGLD vs CP-SGLD and SGHMC vs CP-SGHMC at equal minibatch
size.

Bayesian logistic regression (prior N(0, 10²), intercept + features) on covtype_subset20k
(80/20 train/test split, /work/shared/data) and on synthetic clustered data with N = 10^6.
Each pair runs at the same minibatch size n (k = 10 strata for CP) and under two step-size
settings:

- ``rule``: the package default, chosen per method from its measured gradient noise v (so the
  CP member, with smaller v, gets a larger step);
- ``fixed``: one common step for both members of the pair (the paper compares at equal
  settings): the time step h (``step_size``, whitened units) 0.05 for SGLD (ε = 2h = 0.1 of
  Putcha et al. 2023, Eq. 4) and 0.1 for SGHMC, friction 1.

Every run first does ``--steps`` burn-in steps (this also compiles), then ``--steps`` timed
sampling steps from where the burn-in stopped. Columns: k-means time (separately), the rest of
the preprocessing, burn-in (incl. compile) and sampling wall time, Σ|ρ_k| (autocorrelation
summed up to the first negative lag, mean over coordinates), ESS (min over coordinates, ArviZ),
ESS per second of sampling, test log-loss of the posterior predictive, sd/Laplace (mean over
coordinates of the posterior sd in the Laplace proxy's whitened coordinates: 1 for an exact
sampler when the posterior is near Gaussian; >1 is variance inflation by step size and
gradient noise), v (measured whitened gradient-noise eigenvalue) and the step.

    /work/venv/bin/python benchmarks/bench_stratified.py [--quick] [--draws-only] [--steps S]

``--draws-only`` runs the microbenchmark of the within-stratum without-replacement draw alone
(µs per step inside ``lax.scan``, n = 1000, k = 10, N = 10^4 and 10^6).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import scipy.linalg
from numpyro.infer import MCMC

from numpyro_subsample import SGHMC, SGLD, strata_of
from numpyro_subsample.estimators.floyd import draw_positions
from numpyro_subsample.estimators.stratified import allocate_batch_sizes

DATA = "/work/shared/data/covtype_subset20k/covtype_subset20k.npz"
RESULTS = os.path.join(os.path.dirname(__file__), "results")
FIXED = {"SGLD": 0.05, "SGHMC": 0.1}  # the time step h of every dynamic
# the fixed steps above are already h (SGLD's explicit step_size warns about the old ε)
warnings.filterwarnings("ignore", message="SGLD's step_size is now", category=DeprecationWarning)


def model(X, y=None, subsample_size=100):
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def covtype():
    d = np.load(DATA)
    X, y = d["X"].astype(np.float32), d["y"].astype(np.float32)
    X = np.concatenate([np.ones((X.shape[0], 1), np.float32), X], 1)
    perm = np.random.default_rng(0).permutation(X.shape[0])
    tr, te = perm[: int(0.8 * len(perm))], perm[int(0.8 * len(perm)) :]
    return "covtype20k", X[tr], y[tr], X[te], y[te]


def synthetic(N=10**6, d=10):
    rng = np.random.default_rng(1)
    M = N + 20_000
    centres = rng.normal(0, 2, size=(20, d - 1))
    Xc = centres[rng.integers(0, 20, M)] + rng.normal(size=(M, d - 1))
    X = np.concatenate([np.ones((M, 1)), Xc], 1).astype(np.float32)
    beta = rng.normal(size=d) / np.sqrt(d)
    y = (rng.uniform(size=M) < 1 / (1 + np.exp(-X @ beta))).astype(np.float32)
    return f"synthetic N={N:.0e}", X[:N], y[:N], X[N:], y[N:]


def log_loss(beta, X, y):
    logits = np.asarray(X, np.float64) @ np.asarray(beta, np.float64).T  # (n_test, draws)
    p = np.mean(1 / (1 + np.exp(-logits)), axis=1)
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def sum_abs_rho(draws):
    """Σ|ρ_k| up to the first negative autocorrelation, mean over coordinates and chains."""
    out = []
    for c in range(draws.shape[0]):
        for j in range(draws.shape[-1]):
            ac = az.autocorr(draws[c, :, j])[1:1000]
            stop = np.argmax(ac < 0) if np.any(ac < 0) else len(ac)
            out.append(np.sum(np.abs(ac[:stop])))
    return float(np.mean(out))


def run_one(label, cls, est, step, data, n, steps, chains, proxy):
    name, X, y, Xt, yt = data
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    kw = {"proxy": proxy} if proxy is not None else {}
    if est == "stratified":
        kw["num_strata"] = 10
    kernel = cls(model, estimator=est, step_size=step, progress_bar=False, **kw)
    t0 = time.perf_counter()
    pre = kernel.preprocess((Xj, yj), {"subsample_size": n})
    t_pre = time.perf_counter() - t0
    st = strata_of(kernel)
    t_km = st.seconds if st is not None else 0.0
    mcmc = MCMC(kernel, num_warmup=0, num_samples=steps, num_chains=chains,
                chain_method="vectorized", progress_bar=False)
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), Xj, yj, subsample_size=n)
    jax.block_until_ready(mcmc.get_samples())
    t_burn = time.perf_counter() - t0
    mcmc.post_warmup_state = mcmc.last_state
    t0 = time.perf_counter()
    mcmc.run(mcmc.post_warmup_state.rng_key, Xj, yj, subsample_size=n)
    jax.block_until_ready(mcmc.get_samples())
    t_run = time.perf_counter() - t0
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["beta"], np.float64)
    ess = np.asarray(az.ess(az.convert_to_dataset({"b": draws}))["b"].values)
    L = np.asarray(pre.proxy.scale_tril, np.float64)
    w = scipy.linalg.solve_triangular(
        L, (draws.reshape(-1, draws.shape[-1]) - np.asarray(pre.proxy.centre)).T, lower=True
    )
    flat = draws.reshape(-1, draws.shape[-1])
    row = {
        "dataset": name, "method": label, "steps": "rule" if step is None else "fixed",
        "N": int(X.shape[0]), "n": n, "kmeans_s": t_km, "preproc_s": t_pre - t_km,
        "burnin_s": t_burn, "sample_s": t_run, "sum_abs_rho": sum_abs_rho(draws),
        "ess_min": float(ess.min()), "ess_per_s": float(ess.min() / t_run),
        "test_logloss": log_loss(flat[:: max(1, flat.shape[0] // 500)], Xt, yt),
        "sd_over_laplace": float(np.mean(w.std(axis=1))), "noise_v": float(pre.noise),
        "step": float(pre.step_size),
    }
    print(fmt(row), flush=True)
    return row, pre.proxy


def run(data, n, steps, chains):
    rows, proxy = [], None
    for rule in ("rule", "fixed"):
        for label, cls, est, fam in (("SGLD", SGLD, "uniform", "SGLD"),
                                     ("CP-SGLD", SGLD, "stratified", "SGLD"),
                                     ("SGHMC", SGHMC, "uniform", "SGHMC"),
                                     ("CP-SGHMC", SGHMC, "stratified", "SGHMC")):
            step = None if rule == "rule" else FIXED[fam]
            row, proxy = run_one(label, cls, est, step, data, n, steps, chains, proxy)
            rows.append(row)
    return rows


COLS = ("dataset", "method", "steps", "N", "n", "kmeans_s", "preproc_s", "burnin_s", "sample_s",
        "sum_abs_rho", "ess_min", "ess_per_s", "test_logloss", "sd_over_laplace", "noise_v",
        "step")


def fmt(row):
    return " | ".join(str(row[c]) if isinstance(row[c], (str, int)) else f"{row[c]:.4g}"
                      for c in COLS)


def draws_microbenchmark(steps=1000):
    """µs per step of the stratified without-replacement draw (n = 1000, k = 10) in lax.scan."""
    out = []
    for N in (10**4, 10**6):
        rng = np.random.default_rng(0)
        sizes = np.maximum(1, np.round(rng.dirichlet(np.full(10, 2.0)) * N)).astype(np.int64)
        sizes[-1] = N - sizes[:-1].sum()
        b = allocate_batch_sizes(sizes, rng.gamma(2.0, 1.0, 10), 1000)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])

        def draw(key, b=b, sizes=sizes, starts=starts):
            return draw_positions(key, b, sizes, starts)

        def uniform(key, N=N):
            return jax.random.randint(key, (1000,), 0, N)

        for label, fn in (("stratified w/o replacement (Floyd)", draw),
                          ("uniform with replacement (reference)", uniform)):
            def scan(key, fn=fn):
                def body(c, k):
                    return c + fn(k).sum(), None
                return jax.lax.scan(body, jnp.int32(0), jax.random.split(key, steps))[0]

            f = jax.jit(scan)
            jax.block_until_ready(f(jax.random.PRNGKey(0)))
            best = np.inf
            for r in range(3):
                t0 = time.perf_counter()
                jax.block_until_ready(f(jax.random.PRNGKey(r)))
                best = min(best, time.perf_counter() - t0)
            out.append({"N": N, "draw": label, "b_max": int(b.max()),
                        "us_per_step": best / steps * 1e6})
            print(out[-1], flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="covtype only, 1000 steps")
    ap.add_argument("--draws-only", action="store_true")
    ap.add_argument("--n", type=int, default=1000, help="minibatch size (default 1000)")
    ap.add_argument("--steps", type=int, default=None, help="burn-in = sampling steps")
    ap.add_argument("--chains", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(RESULTS, exist_ok=True)
    if args.draws_only:
        res = draws_microbenchmark()
        with open(os.path.join(RESULTS, "bench_stratified_draws.json"), "w") as f:
            json.dump(res, f, indent=1)
        return
    steps = args.steps or (1000 if args.quick else 2000)
    print(" | ".join(COLS), flush=True)
    rows = run(covtype(), args.n, steps, args.chains)
    if not args.quick:
        rows += run(synthetic(), args.n, steps, args.chains)
    out = os.path.join(RESULTS, "bench_stratified" + ("_quick" if args.quick else "") + ".json")
    with open(out, "w") as f:
        json.dump({"steps": steps, "chains": args.chains, "rows": rows}, f, indent=1)
    print("\n" + " | ".join(COLS))
    for r in rows:
        print(fmt(r))


if __name__ == "__main__":
    main()
