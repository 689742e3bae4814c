"""The linear mixed model of ``bench_highdim.py`` and the row runners both experiments use.

The model, its exact posterior (Schur complement, checked by a sparse direct solve), the
timed runs of SG kernels, ``EnergyConservingHMC``, the structured proxy alone and a short
NUTS timing, each into one row of the table; the experiment itself is
:func:`experiment_lmm` (description in ``bench_highdim.py``).
"""

from __future__ import annotations

import sys
import time
import traceback
from contextlib import contextmanager

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from numpyro.infer import MCMC, NUTS

from numpyro_subsample import (
    SGHMC,
    SGLD,
    AdaptationOptions,
    ModelData,
    build_potential,
    check_run,
    fit_structured,
)
from numpyro_subsample.compare import CompileTimer

# not in numpyro_subsample.__all__: the CLI's warning recorder and the structured
# covariance's matrix-free L ξ (no public equivalent)
from numpyro_subsample.compare.checks import record_warnings, shorten
from numpyro_subsample.proxies.covariance import scale_matvec

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


def _brief(row: dict) -> str:
    if row.get("error"):
        return f"{row['method']}: FAILED {row['error']}"
    keys = ("wall_s", "mean_err_fixed", "sd_log_ratio_fixed", "mean_err_random",
            "sd_log_ratio_random", "min_ess", "data_passes", "step_size", "test_acc", "test_ll",
            "dp_nuts")
    return row["method"] + ": " + ", ".join(f"{k}={row[k]:.4g}" for k in keys if k in row)


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
            fixed = AdaptationOptions(preconditioner=False)
            variants.append(("SGLD-CV", SGLD, {"adaptation": fixed}))
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
