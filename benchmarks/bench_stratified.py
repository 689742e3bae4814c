"""Paper 001 Table 2 layout: SGLD vs CP-SGLD and SGHMC vs CP-SGHMC at equal minibatch size.

Bayesian logistic regression (prior N(0, 10²)) on covtype_subset20k (80/20 train/test split)
and on synthetic data with N = 10^6. Columns: k-means time (separately), preprocessing and
sampling wall time, Σ|ρ_k| (integrated autocorrelation, mean over coordinates), ESS (min over
coordinates, ArviZ), ESS/s of sampling, test log-loss of the posterior predictive, data passes.

    /work/venv/bin/python benchmarks/bench_stratified.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_subsample import SGHMC, SGLD, strata_of

DATA = "/work/shared/data/covtype_subset20k/covtype_subset20k.npz"


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
    centres = rng.normal(0, 2, size=(20, d - 1))
    Xc = centres[rng.integers(0, 20, N + 20_000)] + rng.normal(size=(N + 20_000, d - 1))
    X = np.concatenate([np.ones((N + 20_000, 1)), Xc], 1).astype(np.float32)
    beta = rng.normal(size=d) / np.sqrt(d)
    y = (rng.uniform(size=N + 20_000) < 1 / (1 + np.exp(-X @ beta))).astype(np.float32)
    return f"synthetic N={N:.0e}", X[:N], y[:N], X[N:], y[N:]


def log_loss(beta, X, y):
    logits = np.asarray(X, np.float64) @ np.asarray(beta, np.float64).T  # (n_test, draws)
    p = np.mean(1 / (1 + np.exp(-logits)), axis=1)
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def run(name, X, y, Xt, yt, n, num_samples, chains):
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    rows = []
    shared_proxy = None
    for label, cls, est in (("SGLD", SGLD, "uniform"), ("CP-SGLD", SGLD, "stratified"),
                            ("SGHMC", SGHMC, "uniform"), ("CP-SGHMC", SGHMC, "stratified")):
        kw = {} if shared_proxy is None else {"proxy": shared_proxy}
        kernel = cls(model, estimator=est, progress_bar=False, **kw)
        t0 = time.perf_counter()
        pre = kernel.preprocess((Xj, yj), {"subsample_size": n})
        t_pre = time.perf_counter() - t0
        shared_proxy = pre.proxy
        st = strata_of(kernel)
        mcmc = MCMC(kernel, num_warmup=0, num_samples=num_samples, num_chains=chains,
                    chain_method="vectorized", progress_bar=False)
        t0 = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(0), Xj, yj, subsample_size=n)
        jax.block_until_ready(mcmc.get_samples())
        t_run = time.perf_counter() - t0
        draws = np.asarray(mcmc.get_samples(group_by_chain=True)["beta"])
        ds = az.convert_to_dataset({"b": draws})
        ess = np.asarray(az.ess(ds)["b"].values)
        # Σ|ρ_k| over lags until the first negative autocorrelation, averaged over coordinates
        acs = []
        for j in range(draws.shape[-1]):
            ac = az.autocorr(draws[0, :, j])[1:200]
            stop = np.argmax(ac < 0) if np.any(ac < 0) else len(ac)
            acs.append(np.sum(np.abs(ac[:stop])))
        passes = pre.data_passes + chains * num_samples * n / X.shape[0]
        rows.append((name, label, X.shape[0], n, st.seconds if st else float("nan"), t_pre,
                     t_run, float(np.mean(acs)), float(ess.min()), float(ess.min() / t_run),
                     log_loss(draws.reshape(-1, draws.shape[-1])[::10], Xt, yt), passes,
                     pre.step_size))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="covtype only, shorter runs")
    args = ap.parse_args()
    ns = 2000 if args.quick else 10_000
    rows = run(*covtype(), n=100, num_samples=ns, chains=2)
    if not args.quick:
        rows += run(*synthetic(), n=100, num_samples=ns, chains=2)
    hdr = ("dataset", "method", "N", "n", "kmeans s", "preproc s", "sample s", "sum|rho|",
           "ESS(min)", "ESS/s", "test logloss", "passes", "step")
    print(" | ".join(hdr))
    for r in rows:
        print(" | ".join([r[0], r[1], str(r[2]), str(r[3])] + [f"{v:.4g}" for v in r[4:]]))


if __name__ == "__main__":
    main()
