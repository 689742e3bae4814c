"""Fu and Zhang (2023) Table 2 layout: SGLD vs CP-SGLD and SGHMC vs CP-SGHMC at equal minibatch
size.

Bayesian logistic regression (prior N(0, 10²), intercept + features) on covtype_subset20k
(80/20 train/test split, /work/shared/data) and on synthetic clustered data with N = 10^6.
Each pair runs at the same minibatch size n (k = 10 strata for CP) and under two step-size
settings:

- ``rule``: the package default, chosen per method from its measured gradient noise v (the
  member of a pair with the smaller v gets the larger step);
- ``fixed``: one common step for both members of the pair (the paper compares at equal
  settings): the time step h (``step_size``, whitened units) 0.05 for SGLD (ε = 2h = 0.1 of
  Putcha et al. 2023, Eq. 4) and 0.1 for SGHMC, friction 1.

Every run first does ``--burnin`` burn-in steps (default ``--steps``; the first also compiles),
then ``--steps`` timed sampling steps from where the burn-in stopped. Columns: k-means time
(separately), the rest of the preprocessing, burn-in (the first, incl. compile) and sampling wall
time, Σ|ρ_k| (autocorrelation
summed up to the first negative lag, mean over coordinates), ESS (min over coordinates, ArviZ),
ESS per second of sampling, test log-loss of the posterior predictive, sd/Laplace (mean over
coordinates of the posterior sd in the Laplace proxy's whitened coordinates: 1 for an exact
sampler when the posterior is near Gaussian; >1 is variance inflation by step size and
gradient noise), v (the largest eigenvalue of the whitened gradient-noise covariance averaged
over proxy draws, as the package measures it) and the step.

    python benchmarks/bench_stratified.py [--quick] [--draws-only] [--noise-diagnosis]
        [--steps S] [--burnin B] [--settings rule,fixed] [--datasets covtype,synthetic]
        [--methods SGLD,CP-SGLD,SGHMC,CP-SGHMC] [--cp-features gradients|covariates]
        [--repeats R] [--out NAME]

``--burnin`` sets the burn-in separately (default ``--steps``); ``--settings``, ``--datasets``
and ``--methods`` select rows; ``--cp-features covariates`` makes CP cluster the covariates
x_i, as the paper does (Fu and Zhang 2023, Eq. 13-14), instead of the package default;
``--repeats R`` reruns every chain pair with R seeds (burn-in and sampling each time, one
preprocessing) and reports the mean and the standard deviation of the ESS over the repeats
(the other columns are means). ``--draws-only`` runs the microbenchmark of the within-stratum
without-replacement draw alone (µs per step inside ``lax.scan``, n = 1000, k = 10, N = 10^4
and 10^6). ``--noise-diagnosis`` computes, densely in NumPy on covtype20k, the exact whitened
covariance of the uniform (with replacement) and stratified
estimators at the proxy centre and at ``--noise-points`` draws from the proxy: the package's
strata (and their proportional allocation), and k-means strata of the covariates x.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import scipy.linalg
from numpyro.infer import MCMC

from numpyro_subsample import SGHMC, SGLD, strata_of

# not public: the benchmark times the stratified design's draw and allocation steps alone, and
# (noise_diagnosis) compares the package's noise covariance with its own dense computation
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
    """Σ|ρ_k| up to the first negative autocorrelation (at most half the draws), mean over
    coordinates and chains."""
    out = []
    for c in range(draws.shape[0]):
        for j in range(draws.shape[-1]):
            ac = az.autocorr(draws[c, :, j])[1 : draws.shape[1] // 2]
            stop = np.argmax(ac < 0) if np.any(ac < 0) else len(ac)
            out.append(np.sum(np.abs(ac[:stop])))
    return float(np.mean(out))


def run_chains(burn, sample, seed, data, n):
    """``burn`` (an MCMC of the burn-in length) from a fresh start, then ``sample`` from where
    it stopped: (burn-in s, sampling s, draws (chains, steps, d))."""
    Xj, yj = data
    t0 = time.perf_counter()
    burn.run(jax.random.PRNGKey(seed), Xj, yj, subsample_size=n)
    jax.block_until_ready(burn.get_samples())
    t_burn = time.perf_counter() - t0
    sample.post_warmup_state = burn.last_state
    t0 = time.perf_counter()
    sample.run(burn.last_state.rng_key, Xj, yj, subsample_size=n)
    jax.block_until_ready(sample.get_samples())
    t_run = time.perf_counter() - t0
    return t_burn, t_run, np.asarray(sample.get_samples(group_by_chain=True)["beta"], np.float64)


def run_one(label, cls, est, step, data, n, steps, chains, proxy, burnin=None, repeats=1,
            cp_features="gradients"):
    name, X, y, Xt, yt = data
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    kw = {"proxy": proxy} if proxy is not None else {}
    if est == "stratified":
        kw["num_strata"] = 10
        if cp_features == "covariates":  # the paper's features x_i (no intercept column)
            kw["features"] = X[:, 1:]
    kernel = cls(model, estimator=est, step_size=step, progress_bar=False, **kw)
    t0 = time.perf_counter()
    pre = kernel.preprocess((Xj, yj), {"subsample_size": n})
    t_pre = time.perf_counter() - t0
    st = strata_of(kernel)
    t_km = st.seconds if st is not None else 0.0
    burn, sample = (MCMC(kernel, num_warmup=0, num_samples=s, num_chains=chains,
                         chain_method="vectorized", progress_bar=False)
                    for s in (burnin or steps, steps))
    L = np.asarray(pre.proxy.scale_tril, np.float64)
    per = []
    for r in range(repeats):
        t_burn, t_run, draws = run_chains(burn, sample, r, (Xj, yj), n)
        ess = np.asarray(az.ess(az.convert_to_dataset({"b": draws}))["b"].values)
        flat = draws.reshape(-1, draws.shape[-1])
        w = scipy.linalg.solve_triangular(L, (flat - np.asarray(pre.proxy.centre)).T, lower=True)
        per.append((t_burn, t_run, sum_abs_rho(draws), float(ess.min()),
                    log_loss(flat[:: max(1, flat.shape[0] // 500)], Xt, yt),
                    float(np.mean(w.std(axis=1)))))
    _, t_run, rho, ess_min, loss, sd = np.mean(per, axis=0)
    t_burn = per[0][0]  # the first burn-in compiles; the repeats reuse the program
    row = {
        "dataset": name, "method": label, "steps": "rule" if step is None else "fixed",
        "N": int(X.shape[0]), "n": n, "kmeans_s": t_km, "preproc_s": t_pre - t_km,
        "burnin_s": t_burn, "sample_s": t_run, "sum_abs_rho": rho, "ess_min": ess_min,
        "ess_sd": float(np.std([p[3] for p in per], ddof=1)) if repeats > 1 else None,
        "ess_per_s": float(ess_min / t_run), "test_logloss": loss, "sd_over_laplace": sd,
        "noise_v": float(pre.noise), "step": float(pre.step_size), "repeats": repeats,
    }
    print(fmt(row), flush=True)
    return row, pre.proxy


METHODS = (("SGLD", SGLD, "uniform", "SGLD"), ("CP-SGLD", SGLD, "stratified", "SGLD"),
           ("SGHMC", SGHMC, "uniform", "SGHMC"), ("CP-SGHMC", SGHMC, "stratified", "SGHMC"))


def run(data, n, steps, chains, settings=("rule", "fixed"), burnin=None, repeats=1,
        methods=None, cp_features="gradients"):
    rows, proxy = [], None
    for rule in settings:
        for label, cls, est, fam in METHODS:
            if methods is not None and label not in methods:
                continue
            step = None if rule == "rule" else FIXED[fam]
            row, proxy = run_one(label, cls, est, step, data, n, steps, chains, proxy,
                                 burnin, repeats, cp_features)
            row["cp_features"] = cp_features if est == "stratified" else None
            rows.append(row)
    return rows


COLS = ("dataset", "method", "steps", "N", "n", "kmeans_s", "preproc_s", "burnin_s", "sample_s",
        "sum_abs_rho", "ess_min", "ess_sd", "ess_per_s", "test_logloss", "sd_over_laplace",
        "noise_v", "step", "repeats")


def fmt(row):
    return " | ".join("-" if row[c] is None else str(row[c])
                      if isinstance(row[c], (str, int)) else f"{row[c]:.4g}" for c in COLS)


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


def dense_noise(u, n, labels=None, batch=None):
    """Exact Cov of the whitened estimator from the whitened per-datum gradients u (N, d):
    uniform with replacement (labels None), else b_j of n_j without replacement per stratum
    (Fu and Zhang 2023, Lemma 3.4, with the finite-population factor)."""
    N = u.shape[0]
    if labels is None:
        uc = u - u.mean(0)
        return (N / n) * uc.T @ uc
    cov = np.zeros((u.shape[1],) * 2)
    for j, (nj, bj) in enumerate(zip(np.bincount(labels), batch, strict=True)):
        if nj > 1:
            r = u[labels == j] - u[labels == j].mean(0)
            cov += nj * (nj - bj) / (bj * (nj - 1)) * (r.T @ r)
    return cov


def noise_diagnosis(n=1000, points=64):
    """The whitened noise of uniform and stratified designs at the proxy centre and averaged
    over ``points`` proxy draws, dense (module docstring), against the package's own v."""
    from numpyro_subsample.estimators.noise_covariance import exact_whitened_covs
    from numpyro_subsample.estimators.stratified import make_strata

    _, X, y, _, _ = covtype()
    pres = {}
    for est in ("uniform", "stratified"):
        kernel = SGLD(model, estimator=est, progress_bar=False,
                      **({"num_strata": 10} if est == "stratified" else {}))
        pres[est] = (kernel, kernel.preprocess((jnp.asarray(X), jnp.asarray(y)),
                                               {"subsample_size": n}))
    kernel, pre = pres["stratified"]
    st = strata_of(kernel)
    centre, L = np.asarray(pre.centre, np.float64), np.asarray(pre.scale_tril, np.float64)
    Xd, yd = X.astype(np.float64), y.astype(np.float64)

    def whitened_grads(theta):
        return ((1 / (1 + np.exp(-Xd @ theta)) - yd)[:, None] * Xd) @ L

    sx = make_strata(X[:, 1:], 10, n)
    designs = {
        "uniform (with replacement)": (None, None),
        "CP, package strata and allocation": (st.labels, st.batch_sizes),
        "CP, package strata, proportional b_j": (
            st.labels, allocate_batch_sizes(st.sizes, np.ones(len(st.sizes)), n)),
        "CP, k-means on covariates x (paper), Neyman": (sx.labels, sx.batch_sizes),
    }
    thetas = centre + np.random.default_rng(2024).standard_normal((points, len(centre))) @ L.T
    at_centre = {k: dense_noise(whitened_grads(centre), n, *v) for k, v in designs.items()}
    covs = {k: [] for k in designs}
    for theta in thetas:
        u = whitened_grads(theta)
        for k, v in designs.items():
            covs[k].append(dense_noise(u, n, *v))
    package = exact_whitened_covs(pre.estimator, jnp.asarray(centre[None], jnp.float32),
                                  pre.scale_tril, kernel.preprocessed_data)[0]
    out = {"n": n, "points": points, "sizes": st.sizes.tolist(),
           "batch_sizes": st.batch_sizes.tolist(), "spreads": st.spreads.tolist(),
           "package_v": {k: float(p.noise) for k, (_, p) in pres.items()},
           "package_vs_dense_at_centre": float(
               np.linalg.norm(package - at_centre["CP, package strata and allocation"])
               / np.linalg.norm(at_centre["CP, package strata and allocation"])),
           "designs": {}}
    for k, cs in covs.items():
        lam = [np.linalg.eigvalsh(c)[-1] for c in cs]
        half = points // 2
        out["designs"][k] = {
            "centre_lam_max": float(np.linalg.eigvalsh(at_centre[k])[-1]),
            "centre_trace": float(np.trace(at_centre[k])),
            "mean_lam_max": float(np.linalg.eigvalsh(np.mean(cs, 0))[-1]),
            "mean_trace": float(np.trace(np.mean(cs, 0))),
            "halves_lam_max": [float(np.linalg.eigvalsh(np.mean(c, 0))[-1])
                               for c in (cs[:half], cs[half:])],
            "point_lam_max_q10_50_90_max": np.quantile(lam, [0.1, 0.5, 0.9, 1.0]).tolist(),
        }
        print(k, out["designs"][k], flush=True)
    print({k: out[k] for k in ("sizes", "batch_sizes", "package_v",
                               "package_vs_dense_at_centre")})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="covtype only, 1000 steps")
    ap.add_argument("--draws-only", action="store_true")
    ap.add_argument("--n", type=int, default=1000, help="minibatch size (default 1000)")
    ap.add_argument("--steps", type=int, default=None, help="burn-in = sampling steps")
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--burnin", type=int, default=None, help="burn-in steps (default --steps)")
    ap.add_argument("--settings", default="rule,fixed", help="rule, fixed or both")
    ap.add_argument("--datasets", default=None, help="covtype, synthetic or both")
    ap.add_argument("--repeats", type=int, default=1, help="seeds per chain pair")
    ap.add_argument("--methods", default=None, help="e.g. SGLD,CP-SGLD (default all four)")
    ap.add_argument("--cp-features", choices=("gradients", "covariates"), default="gradients",
                    help="what CP clusters: the package default or the covariates x (paper)")
    ap.add_argument("--out", default=None, help="results/<OUT>.json")
    ap.add_argument("--noise-diagnosis", action="store_true")
    ap.add_argument("--noise-points", type=int, default=64)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(ap)
    args = ap.parse_args()
    os.makedirs(RESULTS, exist_ok=True)
    if args.draws_only or args.noise_diagnosis:
        res = (draws_microbenchmark() if args.draws_only
               else noise_diagnosis(args.n, args.noise_points))
        name = args.out or ("bench_stratified_draws" if args.draws_only
                            else "bench_stratified_noise")
        with open(os.path.join(RESULTS, name + ".json"), "w") as f:
            json.dump(res, f, indent=1)
        return
    steps = args.steps or (1000 if args.quick else 2000)
    sets = tuple(args.settings.split(","))
    names = (args.datasets or ("covtype" if args.quick else "covtype,synthetic")).split(",")
    print(" | ".join(COLS), flush=True)
    rows = []
    for name in names:
        data = {"covtype": covtype, "synthetic": synthetic}[name]()
        rows += run(data, args.n, steps, args.chains, sets, args.burnin, args.repeats,
                    args.methods and args.methods.split(","), args.cp_features)
    out = os.path.join(RESULTS, (args.out or "bench_stratified"
                                 + ("_quick" if args.quick else "")) + ".json")
    with open(out, "w") as f:
        json.dump({"steps": steps, "burnin": args.burnin or steps, "chains": args.chains,
                   "repeats": args.repeats, "rows": rows}, f, indent=1)
    print("\n" + " | ".join(COLS))
    for r in rows:
        print(fmt(r))


if __name__ == "__main__":
    main()
