"""What a pilot window's draws say about the proxy: moments regularised by their effective
sample size, and the Hessian-based whitening where they are too few for a dense covariance
(the adapted proxy of :mod:`~numpyro_subsample.sgmcmc.warmup`)."""

from __future__ import annotations

import numpy as np

from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.sgmcmc.curvature import full_hessian

__all__ = ["DENSE_ESS_PER_DIM", "effective_sizes", "hessian_whitened", "shrunk_covariance",
           "window_changes", "window_covariance", "window_moments"]

#: A window re-estimates the dense covariance of the whitened coordinates only with a median
#: effective sample size of at least this many per dimension (:func:`window_covariance`).
DENSE_ESS_PER_DIM = 2.0


def window_moments(ws: np.ndarray, trusted: bool) -> tuple[np.ndarray, np.ndarray, bool, bool]:
    """Mean and covariance (:func:`window_covariance`) of a window's draws ``ws`` (steps,
    chains, d) in the current whitened coordinates, and whether each differs from the proxy's
    (0, I) by more than its Monte Carlo error: some |mean_j| above z·se_j, or some |log var_j|
    above z·(2/ESS_j)^(1/2), with z = (2 log 2d)^(1/2) + 1 (a Bonferroni-like bound over the d
    coordinates), ESS_j the draws' effective sample size (NumPyro's estimator over the
    chains) and se_j = (max(var_j, 1) / ESS_j)^(1/2): the proxy's variance 1 is a floor, since
    chains that barely left their start draws have a sample variance with the few degrees of
    freedom of their number, which alone would make a right centre look moved. Both count
    as different for a start that is not ``trusted`` (a fallback or a fit that did not
    converge): chains drifting from a poor start have few effective draws, so their standard
    errors would hide the drift."""
    steps, chains, d = ws.shape
    mean, var, ess, moved, rescaled = _window_tests(ws, trusted)
    cov = window_covariance(ws, ess) if rescaled else np.eye(d)
    return mean, cov, moved, rescaled


def window_changes(ws: np.ndarray, trusted: bool) -> tuple[bool, bool]:
    """Whether a window's draws ``ws`` (steps, chains, d) in whitened coordinates moved the
    centre and changed the scales, by the tests of :func:`window_moments`, in O(d) memory."""
    return _window_tests(ws, trusted)[3:]


def _window_tests(ws: np.ndarray, trusted: bool):
    steps, chains, d = ws.shape
    flat = ws.reshape(-1, d)
    mean = flat.mean(0)
    var = flat.var(0) + 1e-300
    ess = np.clip(effective_sizes(ws), 1.0, steps * chains)
    z = np.sqrt(2.0 * np.log(2.0 * d)) + 1.0
    moved = not trusted or bool(np.any(np.abs(mean) > z * np.sqrt(np.maximum(var, 1.0) / ess)))
    rescaled = not trusted or bool(np.any(np.abs(np.log(var)) > z * np.sqrt(2.0 / ess)))
    return mean, var, ess, moved, rescaled


def window_covariance(ws: np.ndarray, ess: np.ndarray) -> np.ndarray:
    """The covariance of a window's draws ``ws`` (steps, chains, d) in the current whitened
    coordinates, regularised towards the previous fit (the identity) by their effective
    sample sizes ``ess`` (d,).

    With a median ESS of at least :data:`DENSE_ESS_PER_DIM` · d, the Ledoit-Wolf covariance
    (Ledoit and Wolf 2004) of the draws thinned to about one per integrated autocorrelation
    time, so that the shrinkage sees the draws' information rather than their number. Below
    it, too few effective draws for d(d + 1)/2 entries, a diagonal rescaling: each whitened
    coordinate's log variance, shrunk towards 0 with weight ESS_j / (ESS_j + 2) (its sampling
    variance is about 2 / ESS_j)."""
    steps, chains, d = ws.shape
    n_eff = float(np.median(ess))
    if n_eff >= DENSE_ESS_PER_DIM * d:
        thin = max(1, int(np.ceil(steps * chains / n_eff / chains)))
        return shrunk_covariance(ws[::thin].reshape(-1, d))
    return np.diag(_shrunk_variances(ws, ess))


def effective_sizes(ws: np.ndarray) -> np.ndarray:
    """Each coordinate's effective sample size of draws ``ws`` (steps, chains, d) (NumPyro's
    estimator over the chains), 1 where it is undefined."""
    from numpyro.diagnostics import effective_sample_size

    ess = effective_sample_size(np.transpose(ws, (1, 0, 2)))
    return np.nan_to_num(np.asarray(ess, np.float64), nan=1.0)


def _shrunk_variances(ws: np.ndarray, ess: np.ndarray) -> np.ndarray:
    """Each coordinate's variance of draws ``ws`` (..., d), its log shrunk towards 0 with weight
    ESS_j / (ESS_j + 2) (the sampling variance of a log variance is about 2 / ESS_j)."""
    log_var = np.log(ws.reshape(-1, ws.shape[-1]).var(0) + 1e-300)
    return np.exp(ess / (ess + 2.0) * log_var)


def shrunk_covariance(draws: np.ndarray) -> np.ndarray:
    """Ledoit-Wolf shrinkage of the covariance of ``draws`` (m, d) towards a multiple of the
    identity (scikit-learn's :func:`~sklearn.covariance.ledoit_wolf`)."""
    from sklearn.covariance import ledoit_wolf

    cov, _ = ledoit_wolf(draws.astype(np.float64))
    return cov


def hessian_whitened(proxy: Proxy, potential: Potential, data: ModelData,
                      draws: np.ndarray, *, chunk_size: int) -> tuple[Proxy, float]:
    """The adapted proxy with the correlations of the potential's Hessian at its centre and
    the scales of the pilot's last window, where its draws are too few for a dense covariance.

    With H = ∇²f(θ̂) positive definite and H⁻¹ = L_H L_Hᵀ, the draws ``draws`` (steps, chains,
    d) are whitened, w = L_H⁻¹(θ − θ̂), and Σ̂ = L_H D L_Hᵀ, with D the diagonal of their
    variances shrunk as in :func:`window_covariance`: the Laplace approximation at the
    pilot's mean rather than at the joint mode, rescaled to the spread of the draws. The pilot's
    own covariance is kept where the window resolved it (a median ESS of at least
    :data:`DENSE_ESS_PER_DIM` · d) or where H is not positive definite. H is
    ``proxy.info["hessian"]`` where the proxy holds it at its centre (recentred by
    :func:`~numpyro_subsample.sgmcmc.warmup.proxy_at`, or a Laplace fit), else one data
    pass; the proxy returned holds it there, for
    :func:`~numpyro_subsample.sgmcmc.curvature.measured_curvature`. Also returns the data
    passes spent (0 or 1)."""
    steps, chains, d = draws.shape
    centre = np.asarray(proxy.centre, np.float64)
    w_old = np.linalg.solve(np.asarray(proxy.scale_tril, np.float64),
                            (draws - centre).reshape(-1, d).T).T.reshape(draws.shape)
    if np.median(effective_sizes(w_old)) >= DENSE_ESS_PER_DIM * d:
        return proxy, 0.0
    info = dict(proxy.info or {})
    total, spent = info.get("hessian"), 0.0
    if total is None:
        total, spent = full_hessian(potential, proxy.centre, data, chunk_size), 1.0
    total = np.asarray(total, np.float64)
    proxy = proxy._replace(info={**info, "hessian": total})
    try:
        chol_h = np.linalg.cholesky(0.5 * (total + total.T))
    except np.linalg.LinAlgError:
        return proxy, spent
    l_h = np.linalg.inv(chol_h).T  # H = C Cᵀ: L_H = C⁻ᵀ, L_H⁻¹ = Cᵀ
    w = ((draws - centre).reshape(-1, d) @ chol_h).reshape(draws.shape)
    ess = np.clip(effective_sizes(w), 1.0, steps * chains)
    cov = (l_h * _shrunk_variances(w, ess)) @ l_h.T
    chol = np.linalg.cholesky(0.5 * (cov + cov.T))
    dtype = proxy.centre.dtype
    return proxy._replace(cov=device_array(cov.astype(dtype)),
                          scale_tril=device_array(chol.astype(dtype))), spent
