"""The ZV coefficient fit (Baker, Fearnhead, Fox and Nemeth 2019, Eq. 14, Algorithm 2) and
its estimates, from stored draws or from sufficient statistics.

Pure NumPy on the host, in float64: the covariates U and function values G of the draws, or the
Welford statistics :class:`~numpyro_subsample.estimators.zv.ZVStats` accumulated in the
sampling loop, in; β, the ZV means, their MCSEs and the variance reductions out. The same
solver serves both sources, so they agree to float tolerance. With the linearised covariates
(one per function, :class:`~numpyro_subsample.estimators.zv.ZVPairedStats`) every regression
is a scalar one and every array has g's length m.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import arviz as az
import jax
import numpy as np
import xarray as xr

from numpyro_subsample.estimators.zv import ZVPairedStats, ZVStats

__all__ = ["ZVResult", "Draws", "fit_draws", "fit_stats", "make_result"]


def _moments(U: np.ndarray, G: np.ndarray, paired: bool = False) -> ZVStats | ZVPairedStats:
    """The same statistics from stored draws U (M, p), G (M, m), in float64 (``paired``: U
    (M, m), one covariate per column of G)."""
    U = np.asarray(U, np.float64)
    G = np.asarray(G, np.float64)
    mu, mg = U.mean(0), G.mean(0)
    Uc, Gc = U - mu, G - mg
    if paired:
        return ZVPairedStats(count=float(U.shape[0]), mean_u=mu, mean_g=mg, m_uu=(Uc * Uc).sum(0),
                             m_ug=(Uc * Gc).sum(0), m_gg=(Gc * Gc).sum(0))
    return ZVStats(count=float(U.shape[0]), mean_u=mu, mean_g=mg, m_uu=Uc.T @ Uc, m_ug=Uc.T @ Gc,
                   m_gg=(Gc * Gc).sum(0))


def _prod(stats, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The co-moment increment of a pair of deviations: outer, or elementwise when paired."""
    return a * b if isinstance(stats, ZVPairedStats) else np.outer(a, b)


def _pool(stats: ZVStats | ZVPairedStats) -> ZVStats | ZVPairedStats:
    """Combine per-chain statistics (leading chain axis) into pooled ones (Chan et al.)."""
    kind = type(stats)
    s = jax.tree.map(lambda x: np.asarray(x, np.float64), stats)
    out = kind(*(x[0] for x in s))
    for c in range(1, s.count.shape[0]):
        b = kind(*(x[c] for x in s))
        n = out.count + b.count
        if n == 0:
            continue
        du, dg = b.mean_u - out.mean_u, b.mean_g - out.mean_g
        f = out.count * b.count / n
        out = kind(
            n,
            out.mean_u + du * b.count / n,
            out.mean_g + dg * b.count / n,
            out.m_uu + b.m_uu + f * _prod(out, du, du),
            out.m_ug + b.m_ug + f * _prod(out, du, dg),
            out.m_gg + b.m_gg + f * dg * dg,
        )
    return out


def _solve(stats: ZVStats | ZVPairedStats, ridge: float) -> np.ndarray:
    """β = Var(u)⁻¹ Cov(u, g) (Baker et al. 2019, after Eq. 14), solved stably.

    Covariates are standardised and the system solved by least squares (``np.linalg.lstsq``,
    small singular values cut), optionally with a ridge ``ridge``·I on the standardised scale.
    Paired statistics: β_i = Cov(u_i, g_i) / ((1 + ridge) Var u_i), 0 where u_i is constant
    (m,).
    """
    c_uu = np.asarray(stats.m_uu, np.float64)
    c_ug = np.asarray(stats.m_ug, np.float64)
    if isinstance(stats, ZVPairedStats):
        ok = c_uu > 0
        return np.where(ok, c_ug / np.where(ok, (1 + ridge) * c_uu, 1.0), 0.0)
    sd = np.sqrt(np.clip(np.diag(c_uu), 0.0, None))
    sd = np.where(sd > 0, sd, 1.0)
    A = c_uu / np.outer(sd, sd)
    A = A + ridge * np.eye(A.shape[0])
    b = c_ug / sd[:, None]
    beta, *_ = np.linalg.lstsq(A, b, rcond=1e-9)
    return beta / sd[:, None]


def _apply(stats: ZVStats | ZVPairedStats, beta: np.ndarray,
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ZV mean, per-draw variance of g, per-draw variance of g̃) from statistics and β."""
    n = max(float(stats.count), 1.0)
    mean = np.asarray(stats.mean_g, np.float64) - _correction(beta,
                                                             np.asarray(stats.mean_u, np.float64))
    var_g = np.asarray(stats.m_gg, np.float64) / n
    c_uu = np.asarray(stats.m_uu, np.float64) / n
    c_ug = np.asarray(stats.m_ug, np.float64) / n
    if isinstance(stats, ZVPairedStats):
        var_res = var_g - 2 * beta * c_ug + beta * beta * c_uu
    else:
        var_res = var_g - 2 * np.sum(beta * c_ug, 0) + np.sum(beta * (c_uu @ beta), 0)
    return mean, var_g, np.maximum(var_res, 0.0)


def _correction(beta: np.ndarray, u: np.ndarray) -> np.ndarray:
    """βᵀu for u (..., p) and β (p, m), or β ⊙ u for paired β (m,) and u (..., m)."""
    return u * beta if beta.ndim == 1 else u @ beta


class ZVResult(NamedTuple):
    """ZV estimates for the pytree of functions g (default: ``{"first": x, "second": x²}``).

    Every field is that pytree, each leaf with the shape of g's leaf (a leading chain axis when
    ``by_chain``). ``variance_reduction`` = Var(g)/Var(g̃) per draw (R of Baker et al. 2019);
    MCSEs use ArviZ's ESS (NaN in streaming mode, which has no chain to estimate
    autocorrelation from).

    Parameters
    ----------
    mean, raw_mean
        ZV and plain estimates.
    mcse_mean, raw_mcse_mean
        Their Monte Carlo standard errors.
    variance_reduction
        Var(g) / Var(g̃).
    beta
        The fitted coefficients.
    degree
        1 or 2.

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Eq. 14 and Sect. 4 (R).
    """

    mean: Any
    raw_mean: Any
    mcse_mean: Any
    raw_mcse_mean: Any
    variance_reduction: Any
    beta: Any  # (p, m) coefficients ((m,) linearised), or a list per chain / cross-fit half
    degree: int


class Draws(NamedTuple):
    """Covariates U and function values G of the stored draws, and G's unflattener."""

    U: np.ndarray  # (C, D, p), or (C, D, m) when paired
    G: np.ndarray  # (C, D, m)
    unflatten: Callable[[np.ndarray], Any]  # (..., m) -> pytree with leading dims
    paired: bool = False  # one covariate per function (the linearised covariates)


def _mcse(series: np.ndarray) -> np.ndarray:
    """ArviZ MCSE of the mean of each column of (C, D, m) series."""
    C, D, m = series.shape
    if D < 4:
        return np.full(m, np.nan)
    ds = xr.Dataset({"g": (("chain", "draw", "k"), series)})
    return np.asarray(az.mcse(ds, method="mean")["g"].values)


def fit_draws(draws: Draws, by_chain: bool, cross_fit: bool, ridge: float) -> dict:
    """β and the estimates from stored draws, per chain or pooled, optionally cross-fitted."""
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
            stats = [_moments(u[:, s].reshape(-1, u.shape[-1]), g[:, s].reshape(-1, g.shape[-1]),
                              draws.paired) for s in halves]
            betas = [_solve(st, ridge) for st in stats]
            # β fitted on one half, applied to the other (E[u] = 0 is known, so no intercept).
            means = [st.mean_g - _correction(betas[1 - i], st.mean_u)
                     for i, st in enumerate(stats)]
            mean = 0.5 * (means[0] + means[1])
            series = np.concatenate(
                [g[:, s] - _correction(betas[1 - i], u[:, s]) for i, s in enumerate(halves)], 1
            )
            raw_series = g[:, : 2 * h]
            beta = betas
        else:
            st = _moments(u.reshape(-1, u.shape[-1]), g.reshape(-1, g.shape[-1]), draws.paired)
            beta = _solve(st, ridge)
            mean, *_ = _apply(st, beta)
            series = g - _correction(beta, u)
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


def fit_stats(stats: ZVStats | ZVPairedStats, by_chain: bool, ridge: float) -> dict:
    """β and the estimates from Welford statistics (a leading chain axis), per chain or pooled.
    """
    kind = type(stats)
    s = jax.tree.map(lambda x: np.asarray(x, np.float64), stats)
    if s.count.ndim == 0:
        s = jax.tree.map(lambda x: x[None], s)
    if not np.all(s.count > 1):
        raise ValueError("The streaming statistics hold fewer than 2 post-warmup draws.")
    groups = [kind(*(x[c] for x in s)) for c in range(s.count.shape[0])] if by_chain else [
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


def make_result(out: dict, unflatten: Callable, by_chain: bool, degree: int) -> ZVResult:
    """The :class:`ZVResult` of :func:`fit_draws` or :func:`fit_stats`, in g's structure."""
    def pick(key):
        arr = np.stack(out[key]) if by_chain else out[key][0]
        return unflatten(arr)

    beta = out["beta"] if by_chain else out["beta"][0]
    return ZVResult(mean=pick("mean"), raw_mean=pick("raw"), mcse_mean=pick("mcse"),
                    raw_mcse_mean=pick("raw_mcse"), variance_reduction=pick("vr"), beta=beta,
                    degree=degree)
