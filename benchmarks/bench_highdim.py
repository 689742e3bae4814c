"""High-dimensional experiments (issue): SG kernels with a structured (matrix-free) proxy.

1. Gaussian linear mixed model with J random intercepts, τ and σ known:
   y_ij = x_ijᵀβ + u_j + ε, u_j ~ N(0, τ²), ε ~ N(0, σ²), β ~ N(0, s² I), x_ij = (1, 4
   standard normal covariates), τ = 0.5, σ = 1, s = 2, groups drawn uniformly (N/J rows on
   average). The posterior of θ = (β, u) is Gaussian with precision
   P = [[I/s² + XᵀX/σ², XᵀZ/σ²], [ZᵀX/σ², diag(1/τ² + n_j/σ²)]] (an arrow matrix); the exact
   mean and marginal sds come from the Schur complement of the diagonal u-block (p × p
   solves only; no (p+J)² array), checked against a sparse direct solve (scipy.sparse).
   Rows: SGLD-CV and SGHMC-CV with ``proxy="low-rank"`` and ``"diagonal"`` (Hessian curvature,
   Hutchinson diagonal; the preconditioner adapted during warm-up, the default with a
   structured proxy, and one SGLD-CV row with ``adapt_preconditioner=False``, the measured-noise
   step rule), the structured proxies alone (θ̂ + L ξ, ``scale_matvec``), with ``--lmm-ecs
   WARMUP SAMPLES`` ``EnergyConservingHMC`` with the first structure (first-order Taylor
   likelihood proxy, one chain, its σ̂²), and a
   short NUTS timing (full-data gradients; too slow at this size to be a peer). Metrics over
   the fixed effects and over 200 random effects drawn at random: worst |mean error| and
   worst |log sd ratio| in exact posterior-sd units, min bulk ESS (ArviZ, over the stored
   thinned draws of those coordinates), wall time including compilation and preprocessing,
   data passes.
2. Bayesian neural network on scikit-learn's ``digits`` (binary: digit ≥ 5), one hidden layer
   of 50 tanh units, N(0, 1) priors (``--bnn-prior fan-in``: N(0, 1/fan-in) on the weight
   matrices, N(0, 1) on the biases), Bernoulli-logit output (Chen, Fox and Guestrin 2014,
   Sect. 4; Springenberg et al. 2016); features standardised with the training statistics;
   seeded 60/15/25 train/validation/test split. Rows: SGHMC with ``estimator="uniform"`` and
   ``"stratified"`` (Fu and Zhang 2023) and the low-rank proxy (Fisher curvature, fitted from
   a random start; preconditioner adapted during warm-up, the default), the same without the
   adaptation, and without any proxy (``preconditioning=False``: the adapted diagonal scale
   alone, chains from the model's initial values), the MAP (Optax Adam, full batch), BlackJAX
   SGHMC with its ``grad_estimator`` and a constant step chosen from three by the validation
   log-likelihood (same gradient budget as the package's SGHMC), the low-rank proxy alone (500 draws
   θ̂ + Lξ), and the exact answer: full-data NumPyro
   NUTS started at MAPs (``--bnn-nuts-draws``). Metrics: test accuracy and test
   log-likelihood per point of the posterior predictive (predictive probabilities averaged
   over draws), the mean distance of the predictive probabilities from NUTS's, wall time
   including compilation, iterations per second.
3. ``--experiments prior``: the same BNN's MAP (two Adam seeds) and full-data NUTS for weight
   prior sds c/√fan-in, c in ``--bnn-prior-scan`` (default 1 2 4 8): validation and test
   accuracy and log-likelihood, i.e. whether the exact posterior predictive beats the MAP
   under the prior that validation picks.

    python benchmarks/bench_highdim.py            # J = 2·10^4, N = 4·10^5
    python benchmarks/bench_highdim.py --quick    # J = 2000, N = 4·10^4

Writes ``benchmarks/results/bench_highdim[_quick].json`` and a markdown section (stdout and
``--md``).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from numpyro.infer import MCMC, NUTS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import fmt, write_results  # noqa: E402

from numpyro_subsample import SGHMC, SGLD, ModelData, build_potential  # noqa: E402
from numpyro_subsample.compare import CompileTimer  # noqa: E402
from numpyro_subsample.compare.checks import record_warnings, shorten  # noqa: E402
from numpyro_subsample.post.checks import check_run  # noqa: E402
from numpyro_subsample.proxies.covariance import scale_matvec  # noqa: E402
from numpyro_subsample.proxies.structured import fit_structured  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TAU, SIGMA, PRIOR_SD, P_FIXED = 0.5, 1.0, 2.0, 5


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- 1. the linear mixed model -----------------------------------------------------------------
def make_lmm(J: int, N: int, seed: int) -> dict:
    """Data of the mixed model (module docstring): X (N, p), g (N,), y (N,)."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(N), rng.normal(size=(N, P_FIXED - 1))])
    g = rng.integers(0, J, size=N)
    beta = rng.normal(size=P_FIXED)
    u = TAU * rng.normal(size=J)
    y = X @ beta + u[g] + SIGMA * rng.normal(size=N)
    return {"X": X, "g": g, "y": y, "J": J}


def lmm_exact(X: np.ndarray, g: np.ndarray, y: np.ndarray, J: int):
    """Exact posterior mean and marginal sds of (β, u) by the Schur complement of the diagonal
    u-block: S = P_ββ − B D⁻¹ Bᵀ with B = XᵀZ/σ², D = 1/τ² + n_j/σ²; Cov_ββ = S⁻¹ and
    diag Cov_uu = 1/D + diag(Mᵀ S⁻¹ M), M = B D⁻¹ (float64, O(N p + J p²))."""
    p = X.shape[1]
    B = np.stack([np.bincount(g, X[:, k], J) for k in range(p)]) / SIGMA**2
    D = 1 / TAU**2 + np.bincount(g, None, J) / SIGMA**2
    Pbb = np.eye(p) / PRIOR_SD**2 + X.T @ X / SIGMA**2
    bb, bu = X.T @ y / SIGMA**2, np.bincount(g, y, J) / SIGMA**2
    M = B / D
    S = Pbb - M @ B.T
    Sinv = np.linalg.inv(S)
    mb = Sinv @ (bb - M @ bu)
    mu = (bu - B.T @ mb) / D
    var_u = 1 / D + np.sum(M * (Sinv @ M), 0)
    return np.concatenate([mb, mu]), np.sqrt(np.concatenate([np.diag(Sinv), var_u]))


def lmm_sparse_check(X, g, y, J, mean, sd, cols) -> float:
    """Largest relative disagreement of a sparse direct solve (mean, and the variances of
    ``cols``) with :func:`lmm_exact`."""
    N, p = X.shape
    A = sp.hstack([sp.csr_matrix(X), sp.csr_matrix((np.ones(N), (np.arange(N), g)),
                                                   shape=(N, J))]).tocsc()
    prior = np.concatenate([np.full(p, PRIOR_SD**-2), np.full(J, TAU**-2)])
    P = (sp.diags(prior) + A.T @ A / SIGMA**2).tocsc()
    lu = spla.splu(P)
    m = lu.solve(A.T @ y / SIGMA**2)
    err = np.max(np.abs(m - mean) / sd)
    for c in cols:
        e = np.zeros(p + J)
        e[c] = 1.0
        err = max(err, abs(np.sqrt(lu.solve(e)[c]) / sd[c] - 1))
    return float(err)


def lmm_model(X, g, y=None, subsample_size: int = 1000, num_groups: int = 100) -> None:
    """The mixed model with τ, σ fixed; the data plate subsampled, groups indexed by g[idx]."""
    beta = numpyro.sample("beta", dist.Normal(0.0, PRIOR_SD).expand([X.shape[1]]).to_event(1))
    u = numpyro.sample("u", dist.Normal(0.0, TAU).expand([num_groups]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta + u[g[idx]], SIGMA),
                       obs=None if y is None else y[idx])


def _flat(samples: dict) -> np.ndarray:
    """(C, S, p + J) from the beta and u sites."""
    return np.concatenate([samples["beta"], samples["u"]], -1)


def lmm_metrics(chains: np.ndarray, mean, sd, cols_u) -> dict:
    """Worst errors over the fixed effects and over ``cols_u``, min ESS over both."""
    out = {}
    for name, cols in (("fixed", np.arange(P_FIXED)), ("random", cols_u)):
        x = chains[..., cols].reshape(-1, len(cols)).astype(np.float64)
        out[f"mean_err_{name}"] = float(np.max(np.abs(x.mean(0) - mean[cols]) / sd[cols]))
        out[f"sd_log_ratio_{name}"] = float(np.max(np.abs(np.log(x.std(0) / sd[cols]))))
    cols = np.concatenate([np.arange(P_FIXED), cols_u])
    if chains.shape[1] >= 4:
        e = az.ess(az.convert_to_dataset({"x": chains[..., cols]}), method="bulk")["x"].values
        out["min_ess"] = float(np.nanmin(e))
    return out


@contextmanager
def row_guard(row: dict):
    """The block's warnings into ``row["warnings"]``; an exception into ``row["error"]`` and
    ``row["traceback"]`` instead of raising (one row failing must not stop the others)."""
    with record_warnings() as rec:
        try:
            yield
        except Exception as err:  # noqa: BLE001
            row["error"] = f"{type(err).__name__}: {shorten(str(err), 300)}"
            row["traceback"] = traceback.format_exc()
    row["warnings"] = [f"{c}: {' '.join(str(m).split())}" for c, m, _ in rec]


def timed_mcmc(row: dict, make_kernel, args: tuple, kwargs: dict, *, seed: int,
               extra_fields: tuple, **mcmc_kw):
    """Kernel construction, preprocessing and ``MCMC.run``, timed together with compilation
    (``row``: prep_s, wall_s, compile_s), then the package's own verdict on the run
    (``check_run``, not timed). Returns the kernel, the ``MCMC`` and the draws ``(C, S, ...)``
    in NumPy."""
    with CompileTimer() as ct:
        t0 = time.perf_counter()
        kernel = make_kernel()
        kernel.preprocess(args, kwargs)
        row["prep_s"] = time.perf_counter() - t0
        mcmc = MCMC(kernel, progress_bar=False, **mcmc_kw)
        mcmc.run(jax.random.PRNGKey(seed), *args, extra_fields=extra_fields, **kwargs)
        draws = {k: np.asarray(v) for k, v in mcmc.get_samples(True).items()}
        row["wall_s"] = time.perf_counter() - t0
    row["compile_s"] = ct.seconds
    check_run(mcmc, warn=True)
    return kernel, mcmc, draws


def run_sg(name: str, cls, kw: dict, args: tuple, kwargs: dict, *, warmup: int, samples: int,
           chains: int, thinning: int, seed: int) -> dict:
    """An SG kernel (vectorized chains) by :func:`timed_mcmc`; draws ``(C, S, ...)`` (thinned),
    None when the row failed."""
    row, draws = {"method": name}, None
    with row_guard(row):
        kernel, mcmc, draws = timed_mcmc(
            row, lambda: cls(kw.get("model", lmm_model), progress_bar=False,
                             **{k: v for k, v in kw.items() if k != "model"}),
            args, kwargs, seed=seed, extra_fields=("data_passes",), num_warmup=warmup,
            num_samples=samples, num_chains=chains, thinning=thinning,
            chain_method="vectorized")
        ef = mcmc.get_extra_fields(group_by_chain=True)
        row["data_passes"] = float(np.max(np.asarray(ef["data_passes"])[..., -1]))
        row["step_size"] = float(kernel.step_size)
        row["noise"] = float(getattr(kernel.preprocessed, "noise", float("nan")))
        row["steps_per_s"] = chains * (warmup + samples) / (row["wall_s"] - row["prep_s"])
        row["adapted"] = mcmc.last_state.adapt is not None
        info = getattr(kernel.preprocessed.proxy, "info", None) or {}
        row["proxy_info"] = {k: info[k] for k in ("structure", "rank", "curvature",
                                                  "converged", "clipped") if k in info}
    return row, (None if "error" in row else draws)


def run_ecs(name: str, kw: dict, args: tuple, kwargs: dict, *, warmup: int, samples: int,
            thinning: int, seed: int) -> tuple[dict, dict | None]:
    """``EnergyConservingHMC`` on the mixed model (one chain) by :func:`timed_mcmc`; its
    median σ̂² at proxy draws and along the chain; draws ``(1, S, ...)``."""
    from numpyro_subsample import EnergyConservingHMC

    row, draws = {"method": name}, None
    with row_guard(row):
        kernel, mcmc, draws = timed_mcmc(
            row, lambda: EnergyConservingHMC(lmm_model, progress_bar=False, **kw), args,
            kwargs, seed=seed, extra_fields=("sigma2", "num_steps"), num_warmup=warmup,
            num_samples=samples, thinning=thinning)
        ef = mcmc.get_extra_fields()
        row["sigma2_chain"] = float(np.median(np.asarray(ef["sigma2"])))
        row["sigma2_proxy"] = float(np.median(kernel.preprocessed.info["sigma2_at_proxy_draws"]))
        row["leapfrog"] = float(np.mean(np.asarray(ef["num_steps"])))
        row["steps_per_s"] = (warmup + samples) / (row["wall_s"] - row["prep_s"])
    return row, (None if "error" in row else draws)


def run_structured_proxy(name: str, model, args, kwargs, fit_kw: dict, num_draws: int,
                         seed: int):
    """The structured proxy alone: fit, then θ̂ + L ξ (``scale_matvec``), timed with
    compilation; returns the row and the unravelled draws (1, S, ...)."""
    row, draws = {"method": name}, None
    k_model, k_fit, k_draw = jax.random.split(jax.random.PRNGKey(seed), 3)
    with row_guard(row):
        with CompileTimer() as ct:
            t0 = time.perf_counter()
            data = ModelData.from_args(args, kwargs)
            pot = build_potential(model, data, k_model)
            prox = fit_structured(pot, data, k_fit, **fit_kw)
            jax.block_until_ready(prox.centre)
            row["prep_s"] = time.perf_counter() - t0
            xi = jax.random.normal(k_draw, (num_draws, pot.dim), prox.centre.dtype)
            flat = jax.jit(jax.vmap(lambda c, op, x: c + scale_matvec(op, x),
                                    (None, None, 0)))(prox.centre, prox.cov_op, xi)
            draws = jax.vmap(pot.unravel)(flat)
            draws = {k: np.asarray(v)[None] for k, v in draws.items()}
            row["wall_s"] = time.perf_counter() - t0
        row["compile_s"] = ct.seconds
        row["data_passes"] = float(prox.num_data_passes)
        row["proxy_info"] = {k: prox.info[k] for k in ("structure", "rank", "curvature",
                                                       "converged", "clipped")
                             if k in prox.info}
    return row, (None if "error" in row else draws)


def nuts_timing(args, kwargs, num: int) -> dict:
    """NUTS on the full data (the plate not subsampled): ``num`` warm-up + ``num`` draws."""
    kwargs = dict(kwargs, subsample_size=None)
    row = {"method": f"NUTS ({num} warm-up + {num} draws, full data)"}
    try:
        with CompileTimer() as ct:
            t0 = time.perf_counter()
            mcmc = MCMC(NUTS(lmm_model), num_warmup=num, num_samples=num, progress_bar=False)
            mcmc.run(jax.random.PRNGKey(0), *args, extra_fields=("num_steps",), **kwargs)
            jax.block_until_ready(mcmc.get_samples()["u"])
            row["wall_s"] = time.perf_counter() - t0
        row["compile_s"] = ct.seconds
        steps = np.asarray(mcmc.get_extra_fields()["num_steps"])
        row["mean_leapfrog_steps"] = float(steps.mean())
        row["s_per_draw"] = (row["wall_s"] - ct.seconds) / (2 * num)
    except Exception as err:  # noqa: BLE001
        row["error"] = f"{type(err).__name__}: {shorten(str(err), 300)}"
    return row


def experiment_lmm(a) -> dict:
    J, N = (2000, 40_000) if a.quick else (20_000, 400_000)
    log(f"[lmm] J={J} N={N} p={P_FIXED}: data and exact posterior")
    d = make_lmm(J, N, a.seed)
    t0 = time.perf_counter()
    mean, sd = lmm_exact(d["X"], d["g"], d["y"], J)
    exact_s = time.perf_counter() - t0
    rng = np.random.default_rng(a.seed + 1)
    cols_u = P_FIXED + np.sort(rng.choice(J, 200, replace=False))
    check = lmm_sparse_check(d["X"], d["g"], d["y"], J, mean, sd,
                             [0, 1, int(cols_u[0]), int(cols_u[-1])])
    log(f"[lmm] exact posterior {exact_s:.2f} s; sparse-solve check {check:.1e}")
    f32 = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    args = (jnp.asarray(d["X"], f32), jnp.asarray(d["g"], jnp.int32), jnp.asarray(d["y"], f32))
    kwargs = {"subsample_size": a.subsample_size, "num_groups": J}
    fit_kw = {"curvature": "hessian", "diagonal": "hutchinson"}
    warm, samp = (1000, 10_000) if a.quick else (2000, 20_000)
    warm, samp = a.lmm_warmup or warm, a.lmm_samples or samp
    thin = max(samp // 1000, 1)
    rows = []
    structures = [s.strip() for s in a.lmm_proxies.split(",") if s.strip()]
    for structure in structures:
        pk = dict(fit_kw, **({"rank": a.rank} if structure == "low-rank" else {}))
        variants = [("SGLD-CV", SGLD, {}), ("SGHMC-CV", SGHMC, {})]
        if structure == structures[0]:  # the measured-noise step rule, for comparison
            variants.append(("SGLD-CV", SGLD, {"adapt_preconditioner": False}))
        for label, cls, extra in variants:
            name = f"{label}, {structure}" + "".join(f", {k}={v}" for k, v in extra.items())
            log(f"[lmm] {name}: {a.chains} chains x ({warm} + {samp}), thinning {thin}")
            row, draws = run_sg(name, cls, {"estimator": "cv", "proxy": structure,
                                            "proxy_kwargs": pk, **extra}, args, kwargs,
                                warmup=warm, samples=samp, chains=a.chains, thinning=thin,
                                seed=a.seed)
            if draws is not None:
                row.update(lmm_metrics(_flat(draws), mean, sd, cols_u))
            log(f"    {_brief(row)}")
            rows.append(row)
        name = f"{structure} proxy alone (θ̂ + Lξ)"
        fk = dict(pk, structure=structure, subsample_size=a.subsample_size)
        row, draws = run_structured_proxy(name, lmm_model, args, kwargs, fk, 2000, a.seed)
        if draws is not None:
            row.update(lmm_metrics(_flat(draws), mean, sd, cols_u))
        log(f"    {_brief(row)}")
        rows.append(row)
    if a.lmm_ecs:
        structure = structures[0]
        pk = dict(fit_kw, **({"rank": a.rank} if structure == "low-rank" else {}))
        name = f"EnergyConservingHMC, {structure} (first-order Taylor), 1 chain"
        log(f"[lmm] {name}: ({a.lmm_ecs[0]} + {a.lmm_ecs[1]})")
        row, draws = run_ecs(name, {"proxy": structure, "proxy_kwargs": pk}, args, kwargs,
                             warmup=a.lmm_ecs[0], samples=a.lmm_ecs[1],
                             thinning=max(a.lmm_ecs[1] // 1000, 1), seed=a.seed)
        if draws is not None:
            row.update(lmm_metrics(_flat(draws), mean, sd, cols_u))
        log(f"    {_brief(row)}")
        rows.append(row)
    if a.nuts_draws > 0:
        log(f"[lmm] NUTS timing ({a.nuts_draws} + {a.nuts_draws})")
        rows.append(nuts_timing(args, kwargs, a.nuts_draws))
        log(f"    {_brief(rows[-1])}")
    return {"J": J, "N": N, "p": P_FIXED, "d": P_FIXED + J, "tau": TAU, "sigma": SIGMA,
            "prior_sd": PRIOR_SD, "subsample_size": a.subsample_size, "chains": a.chains,
            "num_warmup": warm, "num_samples": samp, "thinning": thin, "rank": a.rank,
            "proxy_kwargs": fit_kw, "exact_s": exact_s, "sparse_check": check, "rows": rows}


# -- 2. the Bayesian neural network --------------------------------------------------------------
HIDDEN = 50


def digits_data(seed: int) -> dict:
    """Binary digits (≥ 5), standardised by the training statistics, 60/15/25 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, t = load_digits(return_X_y=True)
    y = (t >= 5).astype(np.float64)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=seed, stratify=t)
    Xtr, Xva, ytr, yva = train_test_split(Xtr, ytr, test_size=0.2, random_state=seed)
    mu, s = Xtr.mean(0), Xtr.std(0)
    s = np.where(s > 0, s, 1.0)
    return {k: v for k, v in (("Xtr", (Xtr - mu) / s), ("ytr", ytr), ("Xva", (Xva - mu) / s),
                              ("yva", yva), ("Xte", (Xte - mu) / s), ("yte", yte))}


#: Prior sd of the weights: ``scale`` None gives N(0, 1) on every weight ("unit"); a number c
#: gives N(0, c²/fan-in) on the weight matrices (c/√64, c/√50) and N(0, 1) on the biases;
#: c = 1 ("fan-in") keeps the prior's pre-activations O(1) instead of saturating the tanh
#: units (set by ``--bnn-prior``).
BNN_PRIOR: dict = {"scale": None}


def prior_sd(name: str, shape: tuple) -> float:
    """The prior sd of the weight ``name`` of shape ``shape`` under :data:`BNN_PRIOR`."""
    c = BNN_PRIOR["scale"]
    if c is None or name in ("b1", "b2"):
        return 1.0
    return c * float(shape[0]) ** -0.5


def _prior_name(c) -> str:
    return "unit" if c is None else "fan-in" if c == 1 else f"{c:g}/√fan-in"


def bnn_model(X, y=None, subsample_size: int = 100) -> None:
    """One hidden layer of tanh units, Gaussian priors (:data:`BNN_PRIOR`), Bernoulli-logit
    output."""
    D = X.shape[1]
    W1 = numpyro.sample("W1", dist.Normal(0.0, prior_sd("W1", (D, HIDDEN)))
                        .expand([D, HIDDEN]).to_event(2))
    b1 = numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([HIDDEN]).to_event(1))
    W2 = numpyro.sample("W2", dist.Normal(0.0, prior_sd("W2", (HIDDEN,)))
                        .expand([HIDDEN]).to_event(1))
    b2 = numpyro.sample("b2", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        logits = jnp.tanh(X[idx] @ W1 + b1) @ W2 + b2
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=None if y is None else y[idx])


def _logits(params: dict, X):
    return jnp.tanh(X @ params["W1"] + params["b1"]) @ params["W2"] + params["b2"]


@jax.jit
def predictive_probs(draws: dict, X):
    """Posterior predictive probabilities (averaged over the leading axis of ``draws``)."""
    return jnp.mean(jax.nn.sigmoid(jax.vmap(_logits, (0, None))(draws, X)), 0)


@jax.jit
def predictive(draws: dict, X, y) -> tuple:
    """Accuracy and mean log-likelihood of the posterior predictive (probabilities averaged
    over the draws, the leading axis of ``draws``)."""
    p = jnp.clip(predictive_probs(draws, X), 1e-7, 1 - 1e-7)
    return jnp.mean((p > 0.5) == (y > 0.5)), jnp.mean(y * jnp.log(p) + (1 - y) * jnp.log1p(-p))


def _log_prior(params: dict):
    return sum(jnp.sum(dist.Normal(0.0, prior_sd(k, v.shape)).log_prob(v))
               for k, v in params.items())


def _log_lik(params: dict, x, y):
    return dist.Bernoulli(logits=_logits(params, x)).log_prob(y)


def init_params(key, D: int, dtype) -> dict:
    k1, k2 = jax.random.split(key)
    return {"W1": 0.1 * jax.random.normal(k1, (D, HIDDEN), dtype),
            "b1": jnp.zeros(HIDDEN, dtype),
            "W2": 0.1 * jax.random.normal(k2, (HIDDEN,), dtype), "b2": jnp.zeros((), dtype)}


def _thin(draws: dict, keep: int) -> dict:
    """Pool chains and keep ``keep`` evenly spaced draws."""
    pooled = {k: v.reshape(-1, *v.shape[2:]) for k, v in draws.items()}
    S = next(iter(pooled.values())).shape[0]
    idx = np.linspace(0, S - 1, min(keep, S)).astype(int)
    return {k: jnp.asarray(v[idx]) for k, v in pooled.items()}


def _score(row: dict, draws: dict, dd: dict, split: str = "te", ref=None) -> None:
    """Accuracy and log-likelihood of the posterior predictive on a split; with ``ref`` (the
    NUTS reference's test probabilities) also the mean |p̄ − p̄_NUTS| over the test points."""
    acc, ll = predictive(draws, dd["X" + split], dd["y" + split])
    row["test_acc" if split == "te" else "val_acc"] = float(acc)
    row["test_ll" if split == "te" else "val_ll"] = float(ll)
    if ref is not None and split == "te":
        row["dp_nuts"] = float(jnp.mean(jnp.abs(predictive_probs(draws, dd["Xte"]) - ref)))


@jax.jit
def draw_loglik(draws: dict, X, y):
    """Mean log-likelihood of (X, y) under each draw, for draws of shape (C, S, ...)."""
    return jax.vmap(jax.vmap(lambda d: jnp.mean(_log_lik(d, X, y))))(draws)


def nuts_reference(dd: dict, maps: list[dict], warmup: int, samples: int, depth: int,
                   seed: int) -> tuple[dict, dict]:
    """Full-data NumPyro NUTS on ``bnn_model``, chain c started at ``maps[c]`` (distinct MAPs:
    a short warm-up suffices, and R-hat is meaningful). Returns the row (test metrics,
    divergences, leapfrog steps, ESS and R-hat of the per-draw test log-likelihood: the weights
    themselves are not identified) and the draws."""
    X, y = dd["Xtr"], dd["ytr"]
    chains = len(maps)
    init = jax.tree.map(lambda *v: jnp.stack(v), *maps)
    t0 = time.perf_counter()
    mcmc = MCMC(NUTS(bnn_model, max_tree_depth=depth), num_warmup=warmup, num_samples=samples,
                num_chains=chains, chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed + 1), X, y, subsample_size=X.shape[0], init_params=init,
             extra_fields=("diverging", "num_steps"))
    draws = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    wall = time.perf_counter() - t0
    ef = {k: np.asarray(v) for k, v in mcmc.get_extra_fields(group_by_chain=True).items()}
    lls = np.asarray(draw_loglik(draws, dd["Xte"], dd["yte"]))
    ds = az.convert_to_dataset({"ll": lls})
    row = {"method": f"NUTS, full data ({chains} × ({warmup} + {samples}), depth {depth}, "
                     "from MAPs; reference)", "wall_s": wall,
           "steps_per_s": chains * (warmup + samples) / wall,
           "data_passes": float(ef["num_steps"].sum()),
           "divergences": int(ef["diverging"].sum()),
           "mean_leapfrog_steps": float(ef["num_steps"].mean()),
           "ess_draw_ll": float(az.ess(ds)["ll"]), "rhat_draw_ll": float(az.rhat(ds)["ll"]),
           "draw_ll_mean": float(lls.mean())}
    return row, (None if "error" in row else draws)


def map_adam(dd: dict, f, steps: int, lr: float, seed: int) -> tuple[dict, dict]:
    """MAP by Optax Adam on the full-batch log posterior."""
    X, y = dd["Xtr"], dd["ytr"]
    t0 = time.perf_counter()
    params = init_params(jax.random.PRNGKey(seed), X.shape[1], f)
    opt = optax.adam(lr)

    @jax.jit
    def fit(params, X, y):
        def loss(p):
            return -(_log_prior(p) + jnp.sum(_log_lik(p, X, y)))

        def body(carry, _):
            p, s = carry
            val, gr = jax.value_and_grad(loss)(p)
            upd, s = opt.update(gr, s, p)
            return (optax.apply_updates(p, upd), s), val

        (p, _), vals = jax.lax.scan(body, (params, opt.init(params)), None, steps)
        return p, vals[-1]

    params, last = fit(params, X, y)
    jax.block_until_ready(params)
    wall = time.perf_counter() - t0
    row = {"method": f"MAP (Optax Adam, full batch, {steps} steps, lr {lr})", "wall_s": wall,
           "steps_per_s": steps / wall, "data_passes": float(steps), "final_loss": float(last)}
    _score(row, jax.tree.map(lambda v: v[None], params), dd)
    return row, params


def blackjax_sghmc(dd: dict, f, step_size: float, num_iter: int, batch: int, chains: int,
                   seed: int, num_integration_steps: int) -> tuple[dict, dict]:
    """BlackJAX SGHMC (``blackjax.sghmc`` with ``sgmcmc.gradients.grad_estimator``), constant
    step, minibatches drawn with replacement, ``chains`` chains (vmapped), from the same random
    start as the MAP. Keeps the second half of the iterations."""
    import blackjax

    X, y = dd["Xtr"], dd["ytr"]
    N = X.shape[0]
    grad_est = blackjax.sgmcmc.gradients.grad_estimator(
        _log_prior, lambda p, xy: _log_lik(p, xy[0], xy[1]), N)
    sghmc = blackjax.sghmc(grad_est, num_integration_steps=num_integration_steps)
    t0 = time.perf_counter()

    @jax.jit
    def run(key, X, y, h):
        def one_chain(k):
            k0, ks = jax.random.split(k)
            pos = init_params(jax.random.PRNGKey(seed), X.shape[1], f)

            def body(pos, k):
                kb, kstep = jax.random.split(k)
                idx = jax.random.randint(kb, (batch,), 0, N)
                pos = sghmc.step(kstep, pos, (X[idx], y[idx]), h)
                return pos, pos

            _, trace = jax.lax.scan(body, pos, jax.random.split(ks, num_iter))
            return jax.tree.map(lambda v: v[num_iter // 2:], trace)

        return jax.vmap(one_chain)(jax.random.split(key, chains))

    draws = run(jax.random.PRNGKey(seed + 7), X, y, jnp.asarray(step_size, f))
    jax.block_until_ready(draws)
    wall = time.perf_counter() - t0
    row = {"method": f"BlackJAX SGHMC (h = {step_size:g})", "step_size": step_size,
           "wall_s": wall, "steps_per_s": chains * num_iter / wall,
           "data_passes": float(num_iter * num_integration_steps * batch / N),
           "num_integration_steps": num_integration_steps}
    return row, {k: np.asarray(v) for k, v in draws.items()}


def experiment_bnn(a) -> dict:
    dd = digits_data(a.seed)
    f = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    dd = {k: jnp.asarray(v, f) for k, v in dd.items()}
    N, D = dd["Xtr"].shape
    dim = D * HIDDEN + 2 * HIDDEN + 1
    log(f"[bnn] digits: N_train={N}, val={len(dd['yva'])}, test={len(dd['yte'])}, d={dim}")
    n = a.bnn_batch
    warm, samp = (1000, 4000) if a.quick else (2000, 20_000)
    thin = max(samp // 500, 1)
    map_row, map_params = map_adam(dd, f, 3000, 1e-2, a.seed)
    rows, ref = [map_row], None
    if a.bnn_nuts_draws:  # chain c from the MAP of seed + c (chain 0: the MAP row's)
        maps = [map_params] + [map_adam(dd, f, 3000, 1e-2, a.seed + c)[1]
                               for c in range(1, a.chains)]
        row, draws = nuts_reference(dd, maps, a.bnn_nuts_draws // 2, a.bnn_nuts_draws, 10,
                                    a.seed)
        thinned = _thin(draws, 500)
        ref = predictive_probs(thinned, dd["Xte"])
        _score(row, thinned, dd, ref=ref)
        log(f"    {_brief(row)}")
        rows.insert(0, row)
        _score(map_row, jax.tree.map(lambda v: v[None], map_params), dd, ref=ref)
    log(f"    {_brief(map_row)}")
    theta0 = 0.1 * jax.random.normal(jax.random.PRNGKey(a.seed), (dim,), f)
    pk = {"rank": a.rank, "curvature": "fisher", "init_theta": theta0}
    args, kwargs = (dd["Xtr"], dd["ytr"]), {"subsample_size": n}
    low_rank = {"proxy": "low-rank", "proxy_kwargs": pk}
    variants = (  # (name, options): defaults unless named
        ("SGHMC-uniform, low-rank", {"estimator": "uniform", **low_rank}),
        ("SGHMC-stratified, low-rank", {"estimator": "stratified", **low_rank}),
        ("SGHMC-uniform, low-rank, init at θ̂",
         {"estimator": "uniform", "init_strategy": "centre", **low_rank}),
        ("SGHMC-uniform, no proxy (preconditioning=False)",
         {"estimator": "uniform", "preconditioning": False}),
        ("SGHMC-uniform, low-rank, adapt_preconditioner=False",
         {"estimator": "uniform", "adapt_preconditioner": False, **low_rank}),
    )
    for name, opts in variants:
        log(f"[bnn] {name}: {a.chains} chains x ({warm} + {samp})")
        row, draws = run_sg(name, SGHMC, {"model": bnn_model, **opts},
                            args, kwargs, warmup=warm, samples=samp, chains=a.chains,
                            thinning=thin, seed=a.seed)
        if draws is not None:
            _score(row, _thin(draws, 500), dd, ref=ref)
        log(f"    {_brief(row)}")
        rows.append(row)
    # the proxy alone (no MCMC), fitted with the SGHMC rows' settings
    row, draws = run_structured_proxy("low-rank proxy alone (θ̂ + Lξ, no MCMC)", bnn_model,
                                      args, kwargs, dict(pk, structure="low-rank"), 500, a.seed)
    if draws is not None:
        _score(row, _thin(draws, 500), dd, ref=ref)
    log(f"    {_brief(row)}")
    rows.append(row)
    # BlackJAX: the same number of minibatch gradients per chain as the package's SGHMC
    L = 10
    num_iter = (warm + samp) // L
    tried = []
    for h in a.bjx_steps:
        row, draws = blackjax_sghmc(dd, f, h, num_iter, n, a.chains, a.seed, L)
        thinned = _thin(draws, 500)
        _score(row, thinned, dd, "va")
        _score(row, thinned, dd, ref=ref)
        log(f"    {_brief(row)} val_ll={row['val_ll']:.3f}")
        tried.append(row)
    ok = [r for r in tried if np.isfinite(r["val_ll"])]
    best = max(ok, key=lambda r: r["val_ll"]) if ok else tried[0]
    best = dict(best, chosen_from=[r["step_size"] for r in tried],
                how="largest validation log-likelihood")
    rows.append(best)
    return {"N_train": N, "N_val": int(len(dd["yva"])), "N_test": int(len(dd["yte"])),
            "d": dim, "hidden": HIDDEN,
            "prior": _prior_name(BNN_PRIOR["scale"]), "subsample_size": n, "chains": a.chains,
            "num_warmup": warm, "num_samples": samp, "thinning": thin, "rank": a.rank,
            "blackjax_iterations": num_iter, "blackjax_integration_steps": L,
            "blackjax_tried": tried, "rows": rows}


# -- report ---------------------------------------------------------------------------------------
def _brief(row: dict) -> str:
    if row.get("error"):
        return f"{row['method']}: FAILED {row['error']}"
    keys = ("wall_s", "mean_err_fixed", "sd_log_ratio_fixed", "mean_err_random",
            "sd_log_ratio_random", "min_ess", "data_passes", "step_size", "test_acc", "test_ll",
            "dp_nuts")
    return row["method"] + ": " + ", ".join(f"{k}={row[k]:.4g}" for k in keys if k in row)


def _warn(row: dict) -> str:
    if row.get("error"):
        return f"**failed**: {row['error']}"[:200]
    # every warning's class, then the start of each message
    ws = [w.replace("|", "/") for w in row.get("warnings", [])]
    return "; ".join(w[:90] + "…" if len(w) > 90 else w for w in ws) or "none"


def _prior_text(bn: dict) -> str:
    prior = bn.get("prior", "unit")
    if prior == "unit":
        return "N(0, 1) priors"
    sd = "1" if prior == "fan-in" else prior.split("/")[0] + "²"
    return f"N(0, {sd}/fan-in) priors on the weight matrices, N(0, 1) on the biases"


def prior_scan(a) -> dict:
    """MAP (two Adam seeds) and full-data NUTS for each prior scale of ``--bnn-prior-scan``:
    validation and test accuracy and log-likelihood, to see which prior validation picks and
    whether the exact posterior predictive beats the MAP under it."""
    dd = {k: jnp.asarray(v, jnp.float32) for k, v in digits_data(a.seed).items()}
    rows = []
    for c in a.bnn_prior_scan:
        BNN_PRIOR["scale"] = c
        maps = []
        for seed in (a.seed, a.seed + 1):
            row, params = map_adam(dd, jnp.float32, 3000, 0.01, seed)
            _score(row, jax.tree.map(lambda v: v[None], params), dd, "va")
            rows.append({"scale": c, **row})
            maps.append(params)
        row, draws = nuts_reference(dd, maps, a.bnn_nuts_draws // 2, a.bnn_nuts_draws, 10,
                                    a.seed)
        pooled = _thin(draws, 2 * a.bnn_nuts_draws)
        _score(row, pooled, dd)
        _score(row, pooled, dd, "va")
        rows.append({"scale": c, **row})
        log(f"[prior {c:g}/√fan-in] MAP test ll {rows[-3]['test_ll']:.4f}, "
            f"NUTS {row['test_ll']:.4f}")
    BNN_PRIOR["scale"] = None
    return {"rows": rows}


def markdown(res: dict, cmd: str) -> str:
    lm, bn = res.get("lmm"), res.get("bnn")
    out = ["## High-dimensional experiments (`bench_highdim.py`)", "",
           f"Command: `{cmd}` ({res['date']}). Machine: {res['machine']}.", ""]
    if lm:
        out += [f"### Linear mixed model, J = {lm['J']} random intercepts, N = {lm['N']}, "
                f"d = {lm['d']} (exact Gaussian posterior)", "",
                f"τ = {lm['tau']}, σ = {lm['sigma']} known, β ~ N(0, {lm['prior_sd']}² I), "
                f"p = {lm['p']}; n = {lm['subsample_size']} per step; {lm['chains']} chains × "
                f"({lm['num_warmup']} + {lm['num_samples']}) steps, thinned by "
                f"{lm['thinning']} (ESS is of the stored draws); low-rank k = {lm['rank']}; "
                f"proxy fit: {lm['proxy_kwargs']}. Exact posterior (Schur complement) in "
                f"{lm['exact_s']:.2f} s, agreeing with a sparse LU solve to "
                f"{lm['sparse_check']:.1e}. Errors: worst coordinate, |mean error| in exact "
                "posterior sds and |log(sd / exact sd)|, over the fixed effects (β) and over "
                "200 random effects chosen at random (u).", "",
                "| method | mean err β | log sd β | mean err u | log sd u | min ESS | "
                "wall s | prep s | data passes | step h | warnings |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in lm["rows"]:
            if "s_per_draw" in r or (r.get("error") and r["method"].startswith("NUTS")):
                continue
            out.append(
                f"| {r['method']} | {fmt(r.get('mean_err_fixed'))} | "
                f"{fmt(r.get('sd_log_ratio_fixed'))} | {fmt(r.get('mean_err_random'))} | "
                f"{fmt(r.get('sd_log_ratio_random'))} | {fmt(r.get('min_ess'), '.0f')} | "
                f"{fmt(r.get('wall_s'), '.1f')} | {fmt(r.get('prep_s'), '.1f')} | "
                f"{fmt(r.get('data_passes'), '.1f')} | {fmt(r.get('step_size'), '.2e')} | "
                f"{_warn(r)} |")
        for r in lm["rows"]:
            if "sigma2_chain" in r:
                out += ["", f"{r['method']}: median σ̂² {r['sigma2_chain']:.3g} along the chain, "
                            f"{r['sigma2_proxy']:.3g} at proxy draws; "
                            f"{r['leapfrog']:.0f} leapfrog steps per iteration."]
            if r["method"].startswith("NUTS"):
                out += ["", (f"NUTS (peer): {r['method']}: failed, {r['error']}"
                             if r.get("error") else
                             f"NUTS (peer): {r['method']}: {r['wall_s']:.1f} s, "
                             f"{r['compile_s']:.1f} s of it compilation, "
                             f"{r['s_per_draw']:.2f} s per iteration without it, "
                             f"{r['mean_leapfrog_steps']:.0f} leapfrog steps (full-data "
                             "gradients) per post-warm-up draw on average (a short warm-up: "
                             "an adapted run takes more); 1000 + 1000 iterations would "
                             f"take ≈ {2000 * r['s_per_draw'] / 60:.0f} min. The exact "
                             "posterior is the reference.")]
        out.append("")
    if bn:
        out += [f"### Bayesian neural network, digits (≥ 5 vs < 5), d = {bn['d']}", "",
                f"One hidden layer of {bn['hidden']} tanh units, {_prior_text(bn)}; "
                f"N_train = {bn['N_train']}, validation {bn['N_val']}, test {bn['N_test']}; "
                f"minibatch n = {bn['subsample_size']}; package SGHMC: {bn['chains']} chains × "
                f"({bn['num_warmup']} + {bn['num_samples']}) steps, low-rank proxy k = "
                f"{bn['rank']} (Fisher curvature, random start), 500 draws kept; BlackJAX "
                f"SGHMC: {bn['chains']} chains × {bn['blackjax_iterations']} iterations of "
                f"{bn['blackjax_integration_steps']} leapfrog steps (the same minibatch "
                "gradients), second half kept, 500 draws; step chosen from "
                f"{[r['step_size'] for r in bn['blackjax_tried']]} by the validation "
                "log-likelihood (validation log-lik: "
                + ", ".join(f"{r['step_size']:g}: {r['val_ll']:.3f}"
                            for r in bn["blackjax_tried"]) + "). Test metrics: accuracy and "
                "mean log-likelihood per point of the posterior predictive.", "",
                "| method | test acc | test log-lik | mean abs Δp vs NUTS | wall s | it/s | "
                "data passes | step h | warnings |", "|---|---|---|---|---|---|---|---|---|"]
        for r in bn["rows"]:
            out.append(
                f"| {r['method']} | {fmt(r.get('test_acc'), '.4f')} | "
                f"{fmt(r.get('test_ll'), '.4f')} | {fmt(r.get('dp_nuts'), '.4f')} | "
                f"{fmt(r.get('wall_s'), '.1f')} | "
                f"{fmt(r.get('steps_per_s'), '.0f')} | {fmt(r.get('data_passes'), '.0f')} | "
                f"{fmt(r.get('step_size'), '.2e')} | {_warn(r)} |")
        for r in bn["rows"]:
            if r["method"].startswith("NUTS"):
                out += ["", f"NUTS reference: {r['divergences']} divergences, "
                        f"{r['mean_leapfrog_steps']:.0f} leapfrog steps per iteration, per-draw "
                        f"test log-lik {r['draw_ll_mean']:.3f} (bulk ESS "
                        f"{r['ess_draw_ll']:.0f}, R-hat {r['rhat_draw_ll']:.3f}); data passes: "
                        "full-data gradients after the warm-up. Mean abs Δp: mean over "
                        "the test points of |p̄ − p̄_NUTS|, the predictive probabilities' "
                        "distance from the reference's."]
        out += ["", "it/s: iterations (summed over chains) per second after preprocessing for "
                "the package kernels, over the whole run for MAP and BlackJAX (one BlackJAX "
                "iteration is "
                f"{bn['blackjax_integration_steps']} leapfrog steps)."]
    pr = res.get("prior")
    if pr:
        out += ["### BNN: MAP against the exact posterior predictive, by prior scale", "",
                "Weight prior sd c/√fan-in on W1 (fan-in 64) and W2 (50), N(0, 1) on the "
                "biases; c = 8 is close to the N(0, 1) prior of the main table. MAP: Optax "
                "Adam, two seeds; NUTS: full data, started at the two MAPs.", "",
                "| c | method | val acc | val log-lik | test acc | test log-lik | wall s |",
                "|---|---|---|---|---|---|---|"]
        for r in pr["rows"]:
            out.append(f"| {r['scale']:g} | {r['method']} | {r['val_acc']:.4f} | "
                       f"{r['val_ll']:.4f} | {r['test_acc']:.4f} | {r['test_ll']:.4f} | "
                       f"{r['wall_s']:.1f} |")
        out.append("")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--experiments", default="lmm,bnn")
    p.add_argument("--lmm-proxies", default="low-rank,diagonal")
    p.add_argument("--lmm-warmup", type=int, default=None)
    p.add_argument("--lmm-samples", type=int, default=None)
    p.add_argument("--subsample-size", type=int, default=1000)
    p.add_argument("--lmm-ecs", type=int, nargs=2, default=None, metavar=("WARMUP", "SAMPLES"),
                   help="add an EnergyConservingHMC row (first structure, one chain)")
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--chains", type=int, default=2)
    p.add_argument("--nuts-draws", type=int, default=20, help="0: no NUTS timing")
    p.add_argument("--bnn-batch", type=int, default=100)
    p.add_argument("--bnn-nuts-draws", type=int, default=400,
                   help="NUTS reference draws per chain (warm-up half that); 0: none")
    p.add_argument("--bjx-steps", type=float, nargs=3, default=[3e-3, 1e-2, 3e-2])
    p.add_argument("--bnn-prior", choices=("unit", "fan-in"), default="unit",
                   help="BNN weight prior sd: 1 (default) or 1/sqrt(fan-in)")
    p.add_argument("--bnn-prior-scan", type=float, nargs="*", default=None,
                   help="experiment 'prior': MAP and NUTS with weight prior sd c/sqrt(fan-in) "
                        "for each c")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--md", default="/tmp/scratch/highdim_results.md")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(p)
    a = p.parse_args(argv)
    exps = [s.strip() for s in a.experiments.split(",")]
    BNN_PRIOR["scale"] = None if a.bnn_prior == "unit" else 1.0
    res = {"date": time.strftime("%Y-%m-%d %H:%M"),
           "device": a.device,
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
                      f"(load average at start {os.getloadavg()[0]:.1f}), JAX {jax.__version__} on "
                      f"{jax.default_backend()}, float"
                      f"{64 if jax.config.jax_enable_x64 else 32}",
           "args": vars(a)}
    t0 = time.perf_counter()
    if "lmm" in exps:
        res["lmm"] = experiment_lmm(a)
    if "bnn" in exps:
        res["bnn"] = experiment_bnn(a)
    if "prior" in exps:
        a.bnn_prior_scan = a.bnn_prior_scan or [1.0, 2.0, 4.0, 8.0]
        res["prior"] = prior_scan(a)
    res["total_s"] = time.perf_counter() - t0
    out = write_results(res, "bench_highdim", markdown, quick=a.quick, out=a.out, md=a.md,
                        argv=argv, folder=RESULTS)
    log(f"wrote {out} ({res['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
