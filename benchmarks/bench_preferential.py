"""Paper 000 Fig. 2 / Fig. 3 style benchmark: preferential and adaptive subsampling.

Fig. 2: KSD against data passes for SGLD, SGLD-CV, SGLD-PS, SGLD-CV-PS at a 0.1% subsample,
all with the same step size (the paper's protocol; here: the default step of SGLD-CV in the
proxy-whitened coordinates), on linear regression (CASP) and logistic regression (covertype,
the 20k-row real subset). Fig. 3: SGLD-CV, SGLD-CV-PS and their adaptive versions (ASGLD-CV,
ASGLD-CV-PS) on balanced synthetic logistic data (N = 10^4) and CASP: KSD, average n_t, data
passes and wall time.

Run:  /work/venv/bin/python benchmarks/bench_preferential.py [--quick] [--out results.npz]
(``NUMPYRO_SUBSAMPLE_QUICK=1`` is the same as ``--quick``). Data are read from
/work/shared/data (override with NUMPYRO_SUBSAMPLE_DATA).
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_subsample import SGLD
from numpyro_subsample.diagnostics import full_data_scores, ksd

DATA = os.environ.get("NUMPYRO_SUBSAMPLE_DATA", "/work/shared/data")
PRIOR_SD = float(np.sqrt(10.0))  # paper 000 Appendix C: N(0, 10) priors


def linreg(X, y=None, subsample_size=46):
    beta = numpyro.sample("beta", dist.Normal(0.0, PRIOR_SD).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, 1.0), obs=y[idx])


def logistic(X, y=None, subsample_size=20):
    beta = numpyro.sample("beta", dist.Normal(0.0, PRIOR_SD).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def _with_intercept(X):
    return np.concatenate([np.ones((X.shape[0], 1)), X], 1).astype(np.float32)


def load_casp():
    z = np.load(f"{DATA}/casp/casp.npz")
    X, y = np.asarray(z["X"], np.float64), np.asarray(z["y"], np.float64)
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    return jnp.asarray(_with_intercept(X)), jnp.asarray(y, jnp.float32)


def load_covtype():
    z = np.load(f"{DATA}/covtype_subset20k/covtype_subset20k.npz")
    X = np.asarray(z["X"], np.float64)
    keep = X.std(0) > 0
    X = (X[:, keep] - X[:, keep].mean(0)) / X[:, keep].std(0)
    return jnp.asarray(_with_intercept(X)), jnp.asarray(z["y"], jnp.float32)


def synthetic_logistic(N=10_000, seed=0):
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=N, n_features=4, n_informative=3, n_redundant=1,
                               random_state=seed)
    X = (X - X.mean(0)) / X.std(0)
    return jnp.asarray(_with_intercept(X)), jnp.asarray(y, jnp.float32)


def _thetas(mcmc, kernel):
    """Unconstrained draws (the models here have only unconstrained β)."""
    return jnp.asarray(mcmc.get_samples()["beta"], kernel.preprocessed.centre.dtype)


def run_method(model, X, y, n, name, steps, *, step_size=None, proxy=None, seed=0, **opts):
    kernel = SGLD(model, estimator=name, proxy=proxy or "laplace", step_size=step_size, **opts)
    t0 = time.perf_counter()
    kernel.preprocess((X, y), {"subsample_size": n})
    t_pre = time.perf_counter() - t0
    mcmc = MCMC(kernel, num_warmup=0, num_samples=steps, progress_bar=False)
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), X, y, subsample_size=n)
    jax.block_until_ready(mcmc.get_samples())
    wall = time.perf_counter() - t0
    ex = mcmc.get_extra_fields()
    info = getattr(kernel.preprocessed.estimator, "info", {})
    return {
        "kernel": kernel, "mcmc": mcmc, "wall": wall, "pre_seconds": t_pre,
        "passes": np.asarray(ex["data_passes"] - ex["data_passes"][0], np.float64),
        "n_t": np.asarray(ex["subsample_size"]),
        "est_passes": float(info.get("data_passes", 0.0)),
        "est_seconds": float(info.get("seconds", 0.0)),
        "diverging": int(np.sum(np.asarray(ex["diverging"]))),
    }


def ksd_curve(res, checkpoints, max_draws):
    """KSD of the draws up to each pass checkpoint, full-data scores, ≤ max_draws per point."""
    kernel = res["kernel"]
    thetas = _thetas(res["mcmc"], kernel)
    out = []
    for c in checkpoints:
        upto = int(np.searchsorted(res["passes"], c, side="right"))
        if upto < 10:
            out.append(np.nan)
            continue
        sel = np.unique(np.linspace(upto // 2, upto - 1, max_draws).round().astype(int))
        th = thetas[sel]  # second half as the sample, first half as burn-in (paper: equal)
        if not bool(jnp.all(jnp.isfinite(th))):
            out.append(np.inf)
            continue
        s = full_data_scores(kernel.potential, th)
        out.append(ksd(th, s))
    return np.asarray(out)


def fig2(quick: bool):
    rows, curves = [], {}
    passes = 3 if quick else 10
    checkpoints = np.linspace(passes / 5, passes, 5)
    max_draws = 150 if quick else 500
    sets = [("casp", linreg, load_casp()), ("covtype20k", logistic, load_covtype())]
    for dname, model, (X, y) in sets:
        N = X.shape[0]
        n = max(2, round(0.001 * N))
        steps = int(passes * N / n)
        ref = run_method(model, X, y, n, "cv", 10)  # proxy + the common step size
        proxy, eps = ref["kernel"].proxy, ref["kernel"].step_size
        for name, label in [("uniform", "SGLD"), ("cv", "SGLD-CV"), ("preferential", "SGLD-PS"),
                            ("cv-preferential", "SGLD-CV-PS")]:
            res = run_method(model, X, y, n, name, steps, step_size=eps, proxy=proxy)
            curve = ksd_curve(res, checkpoints, max_draws)
            curves[(dname, label)] = (checkpoints, curve)
            rows.append((dname, label, N, n, res["wall"], res["passes"][-1], res["est_passes"],
                         res["est_seconds"], curve[-1], res["diverging"]))
    print(f"\nFig. 2: 0.1% subsample, {passes} data passes, common step size")
    print(f"{'data':<11}{'method':<12}{'N':>7}{'n':>4}{'wall s':>8}{'passes':>8}"
          f"{'prep passes':>12}{'prep s':>8}{'KSD':>10}{'div':>6}")
    for r in rows:
        print(f"{r[0]:<11}{r[1]:<12}{r[2]:>7}{r[3]:>4}{r[4]:>8.1f}{r[5]:>8.2f}{r[6]:>12.2f}"
              f"{r[7]:>8.1f}{r[8]:>10.3g}{r[9]:>6}")
    return rows, curves


def fig3(quick: bool):
    rows, traces = [], {}
    steps = 2000 if quick else 10_000
    max_draws = 150 if quick else 500
    sets = [("logistic-synth", logistic, synthetic_logistic(10_000), 10),
            ("casp", linreg, load_casp(), 46)]
    for dname, model, (X, y), n in sets:
        N = X.shape[0]
        ref = run_method(model, X, y, n, "cv", 10)
        proxy, eps = ref["kernel"].proxy, ref["kernel"].step_size
        for name, adaptive, label in [("cv", False, "SGLD-CV"), ("cv-preferential", False,
                                      "SGLD-CV-PS"), ("cv", True, "ASGLD-CV"),
                                      ("cv-preferential", True, "ASGLD-CV-PS")]:
            opts = {"adaptive": True, "v0": "pilot"} if adaptive else {}
            res = run_method(model, X, y, n, name, steps, step_size=eps, proxy=proxy, **opts)
            k = ksd_curve(res, [res["passes"][-1]], max_draws)[-1]
            traces[(dname, label)] = (res["n_t"], res["passes"])
            rows.append((dname, label, N, n, res["wall"], res["passes"][-1], res["est_passes"],
                         float(res["n_t"].mean()), k))
    print(f"\nFig. 3: adaptive subsample size, {steps} iterations, n_max = fixed n, common step")
    print(f"{'data':<15}{'method':<13}{'N':>7}{'n':>4}{'wall s':>8}{'passes':>8}"
          f"{'prep passes':>12}{'mean n_t':>9}{'KSD':>10}")
    for r in rows:
        print(f"{r[0]:<15}{r[1]:<13}{r[2]:>7}{r[3]:>4}{r[4]:>8.1f}{r[5]:>8.2f}{r[6]:>12.2f}"
              f"{r[7]:>9.1f}{r[8]:>10.3g}")
    return rows, traces


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["fig2", "fig3"], default=None)
    parser.add_argument("--out", default=None, help="save curves/traces to this .npz")
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get("NUMPYRO_SUBSAMPLE_QUICK") == "1"
    saved = {}
    if args.only in (None, "fig2"):
        _, curves = fig2(quick)
        for (d, m), (x, c) in curves.items():
            saved[f"fig2/{d}/{m}/passes"], saved[f"fig2/{d}/{m}/ksd"] = x, c
    if args.only in (None, "fig3"):
        _, traces = fig3(quick)
        for (d, m), (nt, p) in traces.items():
            saved[f"fig3/{d}/{m}/n_t"], saved[f"fig3/{d}/{m}/passes"] = nt, p
    if args.out:
        np.savez(args.out, **saved)


if __name__ == "__main__":
    main()
