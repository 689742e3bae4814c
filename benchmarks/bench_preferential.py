"""Putcha, Nemeth and Fearnhead (2023) Fig. 2 / Fig. 3 style benchmark: preferential and
adaptive subsampling.

Fig. 2: KSD against data passes for SGLD, SGLD-CV, SGLD-PS, SGLD-CV-PS at a 0.1% subsample
with the paper's protocol (Appendix E: one common step ε ≈ 0.5/N for all four, plain SGLD
without preconditioning, several chains; see ``fig2``), on linear regression (CASP, Fig. 2a)
and logistic regression (covertype, the real 20k-row subset with LIBSVM's [0, 1] scaling,
Fig. 2b; and ijcnn1, d = 23). Fig. 3: SGLD-CV, SGLD-CV-PS and their adaptive versions (ASGLD-CV,
ASGLD-CV-PS) on balanced synthetic logistic data (N = 10^4) and CASP: KSD, average n_t, data
passes and wall time.

Run:  /work/venv/bin/python benchmarks/bench_preferential.py [--quick] [--out results.npz]
(``NUMPYRO_SUBSAMPLE_QUICK=1`` is the same as ``--quick``). Data are read from
/work/shared/data (override with NUMPYRO_SUBSAMPLE_DATA).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_subsample import SGLD, ModelData, ksd

# not public: the full-data scores ∇log π at given draws
from numpyro_subsample.post.diagnostics import full_data_scores

DATA = os.environ.get("NUMPYRO_SUBSAMPLE_DATA", "/work/shared/data")
# SGLD's step_size is the time step h = ε/2 (ε of Putcha et al. 2023, Eq. 4): Fig. 2 states the
# paper's ε and passes ε/2, Fig. 3 reuses a kernel's h. SGLD warns about the old meaning of an
# explicit step_size
warnings.filterwarnings("ignore", message="SGLD's step_size is now", category=DeprecationWarning)
PRIOR_SD = float(np.sqrt(10.0))  # Putcha et al. (2023) Appendix C: N(0, 10) priors


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


def load_covtype(standardise: bool = False):
    """covertype, the real 20k-row subset: numeric columns in [0, 1] and one-hot columns, as
    LIBSVM's ``covtype.binary.scale`` the paper used (``standardise=True``: z-scores, which
    turn the rare one-hot columns into values of ~100 and the gradient noise into ~10^7)."""
    z = np.load(f"{DATA}/covtype_subset20k/covtype_subset20k.npz")
    X = np.asarray(z["X"], np.float64)
    X = X[:, X.std(0) > 0]
    if standardise:
        X = (X - X.mean(0)) / X.std(0)
    return jnp.asarray(_with_intercept(X)), jnp.asarray(z["y"], jnp.float32)


def load_ijcnn1():
    """ijcnn1 (LIBSVM, features already in [-1, 1]): training part, N = 49,990, d = 23."""
    z = np.load(f"{DATA}/ijcnn1/ijcnn1.npz")
    return (jnp.asarray(_with_intercept(np.asarray(z["X_train"], np.float64))),
            jnp.asarray(z["y_train"], jnp.float32))


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
    mcmc.run(jax.random.PRNGKey(seed), X, y, subsample_size=n,
             extra_fields=("data_passes", "subsample_size"))
    jax.block_until_ready(mcmc.get_samples())
    wall = time.perf_counter() - t0
    ex = mcmc.get_extra_fields()
    info = kernel.preprocessed.estimator.info or {}
    return {
        "kernel": kernel, "mcmc": mcmc, "wall": wall, "pre_seconds": t_pre,
        "data": ModelData.from_args((X, y), {"subsample_size": n}),
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
        s = full_data_scores(kernel.potential, th, res["data"])
        out.append(ksd(th, s))
    return np.asarray(out)


FIG2_LABELS = [("uniform", "SGLD"), ("cv", "SGLD-CV"), ("preferential", "SGLD-PS"),
               ("cv-preferential", "SGLD-CV-PS")]


def fig2_datasets():
    """(name, model, data) of Fig. 2: CASP (Fig. 2a), covertype (Fig. 2b), ijcnn1 (extra)."""
    return [("casp", linreg, load_casp()), ("covtype20k", logistic, load_covtype()),
            ("ijcnn1", logistic, load_ijcnn1())]


def run_chains(model, X, y, n, name, steps, step_size, proxy, num_chains, seed=0,
               whitened=False):
    """Putcha et al. (2023) Appendix E protocol: plain (unpreconditioned) SGLD with the given
    common step ε (the time step h = ε/2), ``num_chains`` vectorised chains started at the
    proxy centre θ̂. ``whitened``: the package's preconditioned SGLD instead (the step is then
    in whitened units)."""
    kernel = SGLD(model, estimator=name, proxy=proxy, step_size=0.5 * step_size,
                  preconditioning=whitened, init_strategy="centre", progress_bar=False)
    t0 = time.perf_counter()
    kernel.preprocess((X, y), {"subsample_size": n})
    t_pre = time.perf_counter() - t0
    mcmc = MCMC(kernel, num_warmup=0, num_samples=steps, num_chains=num_chains,
                chain_method="vectorized", progress_bar=False)
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), X, y, subsample_size=n, extra_fields=("data_passes",))
    thetas = np.asarray(mcmc.get_samples(group_by_chain=True)["beta"], np.float64)
    wall = time.perf_counter() - t0
    ex = mcmc.get_extra_fields(group_by_chain=True)
    passes = np.asarray(ex["data_passes"][0] - ex["data_passes"][0, 0], np.float64)
    info = kernel.preprocessed.estimator.info or {}
    return {"kernel": kernel, "thetas": thetas, "passes": passes, "wall": wall,
            "pre_seconds": t_pre, "est_passes": float(info.get("data_passes", 0.0)),
            "est_seconds": float(info.get("seconds", 0.0)),
            "diverging": int(np.sum(np.asarray(ex["diverging"])))}


def chain_ksd(potential, data, runs, checkpoints, max_draws):
    """KSD (Eq. 20-21, full-data scores) per run, checkpoint and chain: the second half of each
    chain's draws up to the checkpoint (first half = burn-in, as the paper), thinned to
    ``max_draws``. All scores in one call, all KSDs of one shape (one compilation each).
    Returns {label: (num_checkpoints, num_chains)}."""
    blocks, where = [], {}
    for lab, res in runs.items():
        for j, c in enumerate(checkpoints):
            upto = int(np.searchsorted(res["passes"], c, side="right"))
            sel = np.linspace(upto // 2, upto - 1, max_draws).round().astype(int)
            for k, chain in enumerate(res["thetas"]):
                where[lab, j, k] = len(blocks)
                blocks.append(chain[sel])
    th = np.stack(blocks)
    ok = np.isfinite(th).all(axis=(1, 2))
    sc = np.full_like(th, np.nan)
    if ok.any():
        sc[ok] = np.asarray(full_data_scores(potential, jnp.asarray(
            th[ok].reshape(-1, th.shape[-1]), potential.init_theta.dtype), data)).reshape(
            th[ok].shape)
    vals = np.array([ksd(th[b], sc[b]) if ok[b] else np.inf for b in range(len(blocks))])
    num_chains = next(iter(runs.values()))["thetas"].shape[0]
    return {lab: np.array([[vals[where[lab, j, k]] for k in range(num_chains)]
                           for j in range(len(checkpoints))]) for lab in runs}


def fig2_dataset(model, X, y, *, passes, step_factor, num_chains, num_checkpoints,
                 max_draws, whitened_step=None):
    """Fig. 2 on one data set; returns (rows, checkpoints, {label: KSD (checkpoints, chains)}).

    ``whitened_step``: instead of the paper's plain SGLD at ε = step_factor/N, the package's
    preconditioned SGLD with this common step (whitened units) for all four samplers."""
    N = X.shape[0]
    n = max(2, round(0.001 * N))
    steps = int(passes * N / n)
    eps = step_factor / N if whitened_step is None else whitened_step
    fit = SGLD(model, estimator="cv", progress_bar=False)
    t0 = time.perf_counter()
    proxy = fit.preprocess((X, y), {"subsample_size": n}).proxy  # shared θ̂, ∇f_i(θ̂)
    t_proxy = time.perf_counter() - t0
    runs = {lab: run_chains(model, X, y, n, name, steps, eps, proxy, num_chains,
                            whitened=whitened_step is not None)
            for name, lab in FIG2_LABELS}
    checkpoints = np.linspace(passes / num_checkpoints, passes, num_checkpoints)
    data = ModelData.from_args((X, y), {"subsample_size": n})
    curves = chain_ksd(runs["SGLD"]["kernel"].potential, data, runs, checkpoints, max_draws)
    rows = []
    for lab, res in runs.items():
        last = curves[lab][-1]
        rows.append({"method": lab, "N": N, "d": X.shape[1], "n": n, "step": eps,
                     "wall": res["wall"], "passes": float(res["passes"][-1]),
                     "proxy_passes": float(proxy.num_data_passes), "proxy_s": t_proxy,
                     "prep_passes": res["est_passes"], "prep_s": res["est_seconds"],
                     "ksd": float(np.mean(last)),
                     "ksd_se": float(np.std(last, ddof=1) / np.sqrt(last.size))
                     if last.size > 1 else np.nan, "diverging": res["diverging"]})
    return rows, checkpoints, curves


def fig2(quick: bool, step_factor: float = 0.5, whitened_step: float | None = None,
         datasets: str | None = None, chains: int = 2):
    """Putcha et al. (2023) Fig. 2 with the paper's protocol (Sect. 5.3.2, Appendix E): 0.1%
    subsample, 10 passes, one common step ε = step_factor/N for all four samplers (paper:
    ε ≈ 1/N; its Table 1 has 1e-5 for CASP, 1e-6 for the 581k covertype ≈ 0.5/N), plain SGLD (no
    preconditioning), several chains, first half of each chain as burn-in. Deviation: the
    chains start at θ̂ (the paper starts at 0), to compare the gradient noise, not the
    transient."""
    rows, curves = [], {}
    passes = 2 if quick else 10
    sets = fig2_datasets()[: 2 if quick else 3]
    if datasets:
        sets = [s for s in sets if s[0] in datasets.split(",")]
    for dname, model, (X, y) in sets:
        r, cp, cv = fig2_dataset(model, X, y, passes=passes, step_factor=step_factor,
                                 num_chains=chains, num_checkpoints=3 if quick else 4,
                                 max_draws=100 if quick else 150, whitened_step=whitened_step)
        rows += [dict(row, data=dname) for row in r]
        for lab, c in cv.items():
            curves[(dname, lab)] = (cp, c)
    how = (f"common step ε = {step_factor}/N, no preconditioning" if whitened_step is None
           else f"preconditioned SGLD, common whitened step ε = {whitened_step}")
    print(f"\nFig. 2: 0.1% subsample, {passes} data passes, {how}, {chains} chains from θ̂; "
          "KSD (mean ± se over chains) of the second half")
    print(f"{'data':<11}{'method':<12}{'N':>7}{'d':>4}{'n':>4}{'ε':>9}{'wall s':>8}"
          f"{'passes':>8}{'prep passes':>12}{'prep s':>8}{'KSD':>11}{'± se':>10}{'div':>6}")
    for r in rows:
        print(f"{r['data']:<11}{r['method']:<12}{r['N']:>7}{r['d']:>4}{r['n']:>4}"
              f"{r['step']:>9.2g}{r['wall']:>8.1f}{r['passes']:>8.2f}{r['prep_passes']:>12.2f}"
              f"{r['prep_s']:>8.1f}{r['ksd']:>11.4g}{r['ksd_se']:>10.3g}{r['diverging']:>6}")
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
    parser.add_argument("--step-factor", type=float, default=0.5,
                        help="Fig. 2 common step size ε = factor/N (paper: ≈ 0.5-1)")
    parser.add_argument("--whitened-step", type=float, default=None,
                        help="Fig. 2 with the package's preconditioned SGLD at this common "
                             "step ε = 2h (whitened units) instead of the paper's plain SGLD")
    parser.add_argument("--datasets", default=None, help="Fig. 2 data sets (comma list)")
    parser.add_argument("--chains", type=int, default=2, help="Fig. 2 chains per sampler")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(parser)
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get("NUMPYRO_SUBSAMPLE_QUICK") == "1"
    saved = {}
    if args.only in (None, "fig2"):
        rows2, curves = fig2(quick, args.step_factor, args.whitened_step, args.datasets,
                             args.chains)
        saved["fig2/rows"] = np.asarray(json.dumps(rows2))
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
