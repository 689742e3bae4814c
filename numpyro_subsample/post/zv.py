"""Zero-variance (ZV) post-processing control variates (paper 002, Sect. 4, Eq. 13-14, Alg. 2).

For a function g of the parameters, the ZV estimate of E_π[g] is the average of

    g̃(θ) = g(θ) − βᵀ u(θ, ŝ),        β = Var(u)⁻¹ Cov(u, g),                      (Eq. 14)

where u are zero-mean control variates built from the stochastic gradient ŝ ≈ ∇ log π(θ) that
the sampler computes anyway (Mira et al. 2013; Friel et al. 2016). With a polynomial Q the
Stein identity E_π[ΔQ + ∇Q·∇log π] = 0 gives them (Eq. 13 with ẑ = ŝ/2; the factor 1/2 and
the sign are absorbed in β, so we use ŝ directly):

- degree 1, Q = aᵀθ: u_k = ŝ_k (d variates);
- degree 2, Q = aᵀθ + θᵀBθ (Papamarkou et al. 2014): additionally u_kk = 1 + θ_k ŝ_k and
  u_kl = θ_l ŝ_k + θ_k ŝ_l for k < l (d(d+3)/2 variates in all).

ŝ is unbiased for ∇ log π at θ and its subsample is drawn independently of θ, so E[u] = 0
still holds (paper 002, Sect. 4). θ and ŝ are the sampler's *unconstrained* flat coordinates
(``ravel_pytree`` of the latent dict): the identity holds in the coordinates the gradient is
taken in, with the log-Jacobian inside log π. It then holds for **any** function of θ,
including functions of the constrained values x = T(θ): the ZV means of constrained sites are
unbiased, but a polynomial in θ removes less variance from a nonlinear T(θ) (e.g. a scale
τ = exp θ) than from a real-valued site. ``unconstrained=True`` targets θ itself instead.

The optimal coefficients are solved from the covariance of standardised covariates with a
least-squares solver (and optional ridge), per chain or on the pooled chains. The same solver
serves the stored draws and the streaming sufficient statistics (Welford co-moments accumulated
inside the sampling loop: :func:`streaming_step`), so both agree to float tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr
from jax.flatten_util import ravel_pytree

from numpyro_subsample.estimators.zv import (
    ZVStats,
    check_degree,
    default_g,
    empty_stats,
    flat_fn,
    welford_update,
    zv_covariates,
)

__all__ = [
    "ZVStats",
    "ZVResult",
    "zv_covariates",
    "zv_fit",
    "zv_mean",
    "zv_summary",
]

ZV_GROUP = "zv_posterior"
_STATS = ("mean", "var", "raw_mean", "raw_var", "mcse_mean", "raw_mcse_mean",
          "variance_reduction")


# --- control variates ---------------------------------------------------------------------------
def _moments(U: np.ndarray, G: np.ndarray) -> ZVStats:
    """The same statistics from stored draws U (M, p), G (M, m), in float64."""
    U = np.asarray(U, np.float64)
    G = np.asarray(G, np.float64)
    mu, mg = U.mean(0), G.mean(0)
    Uc, Gc = U - mu, G - mg
    return ZVStats(float(U.shape[0]), mu, mg, Uc.T @ Uc, Uc.T @ Gc, (Gc * Gc).sum(0))


def _pool(stats: ZVStats) -> ZVStats:
    """Combine per-chain statistics (leading chain axis) into pooled ones (Chan et al.)."""
    s = jax.tree.map(lambda x: np.asarray(x, np.float64), stats)
    out = ZVStats(*(x[0] for x in s))
    for c in range(1, s.count.shape[0]):
        b = ZVStats(*(x[c] for x in s))
        n = out.count + b.count
        if n == 0:
            continue
        du, dg = b.mean_u - out.mean_u, b.mean_g - out.mean_g
        f = out.count * b.count / n
        out = ZVStats(
            n,
            out.mean_u + du * b.count / n,
            out.mean_g + dg * b.count / n,
            out.m_uu + b.m_uu + f * np.outer(du, du),
            out.m_ug + b.m_ug + f * np.outer(du, dg),
            out.m_gg + b.m_gg + f * dg * dg,
        )
    return out


def _solve(stats: ZVStats, ridge: float) -> np.ndarray:
    """β = Var(u)⁻¹ Cov(u, g) (paper 002, after Eq. 14), solved stably.

    Covariates are standardised and the system solved by least squares (``np.linalg.lstsq``,
    small singular values cut), optionally with a ridge ``ridge``·I on the standardised scale.
    """
    c_uu = np.asarray(stats.m_uu, np.float64)
    c_ug = np.asarray(stats.m_ug, np.float64)
    sd = np.sqrt(np.clip(np.diag(c_uu), 0.0, None))
    sd = np.where(sd > 0, sd, 1.0)
    A = c_uu / np.outer(sd, sd)
    A = A + ridge * np.eye(A.shape[0])
    b = c_ug / sd[:, None]
    beta, *_ = np.linalg.lstsq(A, b, rcond=1e-9)
    return beta / sd[:, None]


def _apply(stats: ZVStats, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ZV mean, per-draw variance of g, per-draw variance of g̃) from statistics and β."""
    n = max(float(stats.count), 1.0)
    mean = np.asarray(stats.mean_g, np.float64) - beta.T @ np.asarray(stats.mean_u, np.float64)
    var_g = np.asarray(stats.m_gg, np.float64) / n
    c_uu = np.asarray(stats.m_uu, np.float64) / n
    c_ug = np.asarray(stats.m_ug, np.float64) / n
    var_res = var_g - 2 * np.sum(beta * c_ug, 0) + np.sum(beta * (c_uu @ beta), 0)
    return mean, var_g, np.maximum(var_res, 0.0)


# --- results ------------------------------------------------------------------------------------
class ZVResult(NamedTuple):
    """ZV estimates for the pytree of functions g (default: ``{"first": x, "second": x²}``).

    Every field is that pytree, each leaf with the shape of g's leaf (a leading chain axis when
    ``by_chain``). ``variance_reduction`` = Var(g)/Var(g̃) per draw (the paper's R); MCSEs use
    ArviZ's ESS (NaN in streaming mode, which has no chain to estimate autocorrelation from).
    """

    mean: Any
    raw_mean: Any
    mcse_mean: Any
    raw_mcse_mean: Any
    variance_reduction: Any
    beta: Any  # (p, m) coefficients, or a list of them per chain / per cross-fit half
    degree: int


class _Draws(NamedTuple):
    U: np.ndarray  # (C, D, p)
    G: np.ndarray  # (C, D, m)
    unflatten: Callable[[np.ndarray], Any]  # (..., m) -> pytree with leading dims


def _eval_fn(fn: Callable, samples: dict) -> tuple[np.ndarray, Callable]:
    """fn over all (chain, draw) samples -> (C, D, m) and the unflattener."""
    example = {k: v[0, 0] for k, v in samples.items()}
    flat, unflatten = flat_fn(fn, example)
    G = jax.jit(jax.vmap(jax.vmap(flat)))({k: jnp.asarray(v) for k, v in samples.items()})
    return np.asarray(G, np.float64), unflatten


def _kernel_of(mcmc):
    from numpyro_subsample.post.arviz import _kernel_of as package_kernel_of

    return package_kernel_of(
        mcmc,
        expects="zv_mean expects an MCMC run with a numpyro_subsample kernel or the "
        "InferenceData of numpyro_subsample.to_arviz.",
        before="ZV post-processing",
    )


def unconstrained_draws(mcmc) -> np.ndarray:
    """Flat unconstrained θ (chain, draw, d) of a run (inverse transforms of the stored draws)."""
    from numpyro.infer.util import unconstrain_fn

    from numpyro_subsample.core.potential import _set_plate_indices

    kernel = _kernel_of(mcmc)
    pot = kernel.potential
    samples = mcmc.get_samples(group_by_chain=True)
    latent = {k: samples[k] for k in pot.latent_sites}
    # The model with a one-datum plate: transforms depend on latent values only, not the data.
    model = _set_plate_indices(kernel.user_model, name=pot.plate.name, indices=jnp.arange(1))
    args, kwargs = mcmc._args, mcmc._kwargs  # noqa: SLF001

    def one(p):
        return ravel_pytree(unconstrain_fn(model, args, kwargs, p))[0]

    return np.asarray(jax.jit(jax.vmap(jax.vmap(one)))(latent))


def _draws_from_mcmc(mcmc, fn, degree, unconstrained) -> _Draws | None:
    _kernel_of(mcmc)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    if "grad" not in extra:
        return None
    grad = np.asarray(extra["grad"], np.float64)
    need_theta = degree == 2 or unconstrained
    theta = unconstrained_draws(mcmc) if need_theta else None
    if unconstrained:
        samples = {"theta": theta}
        if fn is not None:
            raise ValueError("Pass either fn or unconstrained=True, not both.")
    else:
        samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    G, unflatten = _eval_fn(fn or default_g, samples)
    U = zv_covariates(theta, grad, degree, np) if degree == 2 else grad
    return _Draws(np.asarray(U, np.float64), G, unflatten)


def _draws_from_idata(idata, fn, degree, unconstrained) -> _Draws:
    if "sample_stats" not in idata.groups() or "grad" not in idata.sample_stats:
        raise ValueError(
            "The InferenceData has no sample_stats.grad: run MCMC with "
            "extra_fields=('grad',) before to_arviz (or use the kernel's zv_stream=True and "
            "read idata.zv_posterior)."
        )
    grad = np.asarray(idata.sample_stats["grad"].values, np.float64)
    theta = None
    if degree == 2 or unconstrained:
        if "unconstrained_posterior" not in idata.groups():
            raise ValueError(
                "degree=2 / unconstrained=True need the unconstrained draws: create the "
                "InferenceData with to_arviz(mcmc, zv=True), which adds unconstrained_posterior."
            )
        up = idata.unconstrained_posterior
        C, D = grad.shape[:2]
        theta = np.concatenate(
            [np.asarray(up[k].values).reshape(C, D, -1) for k in sorted(up.data_vars)], -1
        )
        if theta.shape[-1] != grad.shape[-1]:
            raise ValueError(
                f"unconstrained_posterior has {theta.shape[-1]} coordinates, grad has "
                f"{grad.shape[-1]}."
            )
    if unconstrained:
        if fn is not None:
            raise ValueError("Pass either fn or unconstrained=True, not both.")
        samples = {"theta": theta}
    else:
        samples = {k: np.asarray(v.values) for k, v in idata.posterior.data_vars.items()}
    G, unflatten = _eval_fn(fn or default_g, samples)
    U = zv_covariates(theta, grad, degree, np) if degree == 2 else grad
    return _Draws(np.asarray(U, np.float64), G, unflatten)


def _mcse(series: np.ndarray) -> np.ndarray:
    """ArviZ MCSE of the mean of each column of (C, D, m) series."""
    C, D, m = series.shape
    if D < 4:
        return np.full(m, np.nan)
    ds = xr.Dataset({"g": (("chain", "draw", "k"), series)})
    return np.asarray(az.mcse(ds, method="mean")["g"].values)


def _fit_draws(draws: _Draws, by_chain: bool, cross_fit: bool, ridge: float):
    U, G = draws.U, draws.G
    C, D, _ = U.shape
    groups = [slice(c, c + 1) for c in range(C)] if by_chain else [slice(0, C)]
    out = {k: [] for k in ("mean", "raw", "mcse", "raw_mcse", "vr", "beta")}
    for sl in groups:
        u, g = U[sl], G[sl]
        c = u.shape[0]
        if cross_fit:
            if D < 4:
                raise ValueError("cross_fit needs at least 4 draws per chain.")
            h = D // 2
            halves = [slice(0, h), slice(h, 2 * h)]
            stats = [_moments(u[:, s].reshape(-1, u.shape[-1]), g[:, s].reshape(-1, g.shape[-1]))
                     for s in halves]
            betas = [_solve(st, ridge) for st in stats]
            # β fitted on one half, applied to the other (E[u] = 0 is known, so no intercept).
            means = [st.mean_g - betas[1 - i].T @ st.mean_u for i, st in enumerate(stats)]
            mean = 0.5 * (means[0] + means[1])
            series = np.concatenate(
                [g[:, s] - u[:, s] @ betas[1 - i] for i, s in enumerate(halves)], 1
            )
            raw_series = g[:, : 2 * h]
            beta = betas
        else:
            st = _moments(u.reshape(-1, u.shape[-1]), g.reshape(-1, g.shape[-1]))
            beta = _solve(st, ridge)
            mean, *_ = _apply(st, beta)
            series = g - u @ beta
            raw_series = g
        var_raw = raw_series.reshape(-1, g.shape[-1]).var(0)
        var_zv = series.reshape(-1, g.shape[-1]).var(0)
        out["mean"].append(mean)
        out["raw"].append(raw_series.reshape(c * raw_series.shape[1], -1).mean(0))
        out["mcse"].append(_mcse(series))
        out["raw_mcse"].append(_mcse(raw_series))
        out["vr"].append(var_raw / np.where(var_zv > 0, var_zv, np.nan))
        out["beta"].append(beta)
    return out


def _fit_stats(stats: ZVStats, by_chain: bool, ridge: float):
    s = jax.tree.map(lambda x: np.asarray(x, np.float64), stats)
    if s.count.ndim == 0:
        s = jax.tree.map(lambda x: x[None], s)
    if not np.all(s.count > 1):
        raise ValueError("The streaming statistics hold fewer than 2 post-warmup draws.")
    groups = [ZVStats(*(x[c] for x in s)) for c in range(s.count.shape[0])] if by_chain else [
        _pool(s)]
    out = {k: [] for k in ("mean", "raw", "mcse", "raw_mcse", "vr", "beta")}
    for st in groups:
        beta = _solve(st, ridge)
        mean, var_g, var_res = _apply(st, beta)
        out["mean"].append(mean)
        out["raw"].append(np.asarray(st.mean_g))
        out["mcse"].append(np.full_like(mean, np.nan))
        out["raw_mcse"].append(np.full_like(mean, np.nan))
        out["vr"].append(var_g / np.where(var_res > 0, var_res, np.nan))
        out["beta"].append(beta)
    return out


def _result(out, unflatten, by_chain, degree) -> ZVResult:
    def pick(key):
        arr = np.stack(out[key]) if by_chain else out[key][0]
        return unflatten(arr)

    beta = out["beta"] if by_chain else out["beta"][0]
    return ZVResult(pick("mean"), pick("raw"), pick("mcse"), pick("raw_mcse"), pick("vr"),
                    beta, degree)


def zv_fit(
    source: Any,
    fn: Callable[[dict], Any] | None = None,
    degree: int = 1,
    *,
    by_chain: bool = False,
    cross_fit: bool = False,
    ridge: float = 0.0,
    unconstrained: bool = False,
    mode: str = "auto",
) -> ZVResult:
    """ZV-corrected estimates of E[g] (paper 002 Eq. 14, Algorithm 2) with diagnostics.

    :param source: an ``MCMC`` run of a package kernel (with ``extra_fields=("grad",)``, or a
        kernel built with ``zv_stream=True``), or the InferenceData of ``to_arviz``.
    :param fn: g as a function of one constrained sample (dict site → value, including
        deterministic sites), returning an array or pytree; jittable. Default: every site's
        coordinates and their squares, ``{"first": x, "second": x²}``.
    :param degree: 1 (Q linear) or 2 (Q quadratic, needs the unconstrained draws).
    :param by_chain: fit β and estimate per chain (leading chain axis); otherwise pooled.
    :param cross_fit: fit β on one half of each chain's draws and apply it to the other, then
        average: removes the O(1/M) bias of fitting on the same draws (worth it for short runs
        or many covariates, e.g. degree 2 with large d); costs some variance.
    :param ridge: ridge penalty on the standardised covariates (0: plain least squares).
    :param unconstrained: g = the flat unconstrained θ and θ² instead of the constrained sites.
    :param mode: ``"stored"`` (draws + gradients), ``"stream"`` (the kernel's accumulated
        statistics) or ``"auto"`` (stored if the gradients were collected).
    """
    check_degree(degree)
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}.")
    if mode not in ("auto", "stored", "stream"):
        raise ValueError(f"mode must be 'auto', 'stored' or 'stream', got {mode!r}.")
    if isinstance(source, az.InferenceData):
        if mode == "stream":
            raise ValueError("mode='stream' needs the MCMC object (the kernel's statistics).")
        draws = _draws_from_idata(source, fn, degree, unconstrained)
        return _result(_fit_draws(draws, by_chain, cross_fit, ridge), draws.unflatten,
                       by_chain, degree)
    kernel = _kernel_of(source)
    draws = None
    if mode in ("auto", "stored"):
        draws = _draws_from_mcmc(source, fn, degree, unconstrained)
        if draws is None and mode == "stored":
            raise ValueError("mode='stored' needs MCMC(..).run(..., extra_fields=('grad',)).")
    if draws is not None:
        return _result(_fit_draws(draws, by_chain, cross_fit, ridge), draws.unflatten,
                       by_chain, degree)
    stats = getattr(source.last_state, "zv_stats", None)
    if stats is None:
        raise ValueError(
            "No gradients for ZV: run MCMC with extra_fields=('grad',), or build the kernel "
            "with zv_stream=True to accumulate the statistics without storing the chain."
        )
    if fn is not None or unconstrained:
        raise ValueError(
            "In streaming mode g is fixed when sampling: pass zv_fn=... to the kernel instead "
            "of fn (unconstrained=True is not available in streaming mode)."
        )
    if cross_fit:
        raise ValueError("cross_fit needs the stored draws (extra_fields=('grad',)).")
    if kernel.zv_degree != degree:
        raise ValueError(
            f"The streaming statistics were accumulated for degree={kernel.zv_degree}; pass "
            f"degree={kernel.zv_degree} or build the kernel with zv_degree={degree}."
        )
    _, unflatten = _stream_functions(kernel)
    return _result(_fit_stats(stats, by_chain, ridge), unflatten, by_chain, degree)


def zv_mean(
    source: Any,
    fn: Callable[[dict], Any] | None = None,
    degree: int = 1,
    **kwargs: Any,
) -> Any:
    """ZV-corrected posterior means (paper 002 Eq. 14): dict site → mean by default.

    With ``fn`` the result has fn's output structure. Keyword arguments as :func:`zv_fit`
    (``by_chain``, ``cross_fit``, ``ridge``, ``unconstrained``, ``mode``).
    """
    res = zv_fit(source, fn, degree, **kwargs)
    if fn is None:
        return dict(res.mean["first"])
    return res.mean


# --- streaming mode -----------------------------------------------------------------------------
# --- ArviZ --------------------------------------------------------------------------------------
def _flat_names(name: str, shape: tuple) -> list[str]:
    if not shape:
        return [name]
    return [f"{name}[{', '.join(map(str, ix))}]" for ix in np.ndindex(*shape)]


def _zv_dataset(res: ZVResult) -> xr.Dataset:
    """Per-site statistics (mean, var, ... over the ``zv_stat`` axis) from a default-g result."""
    data = {}
    for k in res.mean["first"]:
        m1, m2 = np.asarray(res.mean["first"][k]), np.asarray(res.mean["second"][k])
        r1, r2 = np.asarray(res.raw_mean["first"][k]), np.asarray(res.raw_mean["second"][k])
        rows = [m1, np.maximum(m2 - m1**2, 0.0), r1, np.maximum(r2 - r1**2, 0.0),
                np.asarray(res.mcse_mean["first"][k]), np.asarray(res.raw_mcse_mean["first"][k]),
                np.asarray(res.variance_reduction["first"][k])]
        arr = np.stack(rows)
        dims = ["zv_stat"] + [f"{k}_dim_{j}" for j in range(arr.ndim - 1)]
        data[k] = (dims, arr)
    ds = xr.Dataset(data, coords={"zv_stat": list(_STATS)})
    ds.attrs["zv_degree"] = int(res.degree)
    return ds


def add_zv_groups(idata: az.InferenceData, mcmc, degree: int = 1) -> az.InferenceData:
    """Add ``zv_posterior`` (ZV means/variances) and ``unconstrained_posterior`` to idata.

    ``zv_posterior`` holds, per site, the statistics ``zv_stat`` = mean, var (ZV-corrected, from
    the ZV means of x and x²), raw_mean, raw_var, mcse_mean, raw_mcse_mean and
    variance_reduction (Var g / Var g̃ per draw, for g = x).
    """
    kernel = _kernel_of(mcmc)
    extra = mcmc.get_extra_fields()
    if "grad" in extra:
        theta = unconstrained_draws(mcmc)
        C, D = theta.shape[:2]
        unc = jax.vmap(kernel.potential.unravel)(jnp.asarray(theta.reshape(C * D, -1)))
        ds = xr.Dataset({
            k: (["chain", "draw"] + [f"{k}_unc_dim_{j}" for j in range(v.ndim - 1)],
                np.asarray(v).reshape((C, D) + v.shape[1:]))
            for k, v in unc.items()
        })
        if "unconstrained_posterior" not in idata.groups():
            idata.add_groups(unconstrained_posterior=ds)
        res = zv_fit(idata, degree=degree)
    else:
        res = zv_fit(mcmc, degree=degree, mode="stream")
    if ZV_GROUP in idata.groups():
        del idata[ZV_GROUP]
    idata.add_groups({ZV_GROUP: _zv_dataset(res)})
    return idata


def zv_summary(idata: az.InferenceData, degree: int | None = None, **kwargs: Any) -> pd.DataFrame:
    """A table like ``az.summary``: raw and ZV means, their MCSEs, sds, variance reduction.

    Computed from ``sample_stats.grad`` when present (keyword arguments as :func:`zv_fit`),
    else read from the ``zv_posterior`` group (streaming mode: no MCSEs).
    """
    has_grad = "sample_stats" in idata.groups() and "grad" in idata.sample_stats
    if has_grad:
        if degree is None:
            degree = int(idata[ZV_GROUP].attrs.get("zv_degree", 1)) if ZV_GROUP in \
                idata.groups() else 1
        ds = _zv_dataset(zv_fit(idata, degree=degree, **kwargs))
    elif ZV_GROUP in idata.groups():
        ds = idata[ZV_GROUP]
    else:
        raise ValueError(
            "No ZV information: collect extra_fields=('grad',) or use to_arviz(mcmc, zv=True)."
        )
    rows, index = [], []
    for k in ds.data_vars:
        arr = np.asarray(ds[k].values)
        shape = arr.shape[1:]
        stat = {s: arr[i].reshape(-1) for i, s in enumerate(ds.zv_stat.values)}
        for j, name in enumerate(_flat_names(k, shape)):
            index.append(name)
            rows.append({
                "mean": stat["raw_mean"][j],
                "zv_mean": stat["mean"][j],
                "mcse_mean": stat["raw_mcse_mean"][j],
                "zv_mcse_mean": stat["mcse_mean"][j],
                "sd": np.sqrt(stat["raw_var"][j]),
                "zv_sd": np.sqrt(stat["var"][j]),
                "variance_reduction": stat["variance_reduction"][j],
            })
    return pd.DataFrame(rows, index=index)
