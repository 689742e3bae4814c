"""The low-rank precision of :func:`~numpyro_subsample.proxies.structured.fit_structured`: which
converged Ritz pairs of the scaled curvature C̃ = δ^{-1/2} C δ^{-1/2} to keep, and the value c
on the complement of their span.

With kept eigenpairs S (|S| = k) and P̃ = c I + V_S diag(μ_S − c) V_Sᵀ, the Gaussian KL is a
sum over the eigendirections of C̃,

    KL(N(θ̂, P⁻¹) ‖ N(θ̂, C⁻¹)) = ½ Σ_{j∉S} φ(μ_j / c),    φ(r) = r − 1 − log r,

minimised over c by c_S = (tr C̃ − Σ_S μ_j)/(d − k), the mean of the discarded eigenvalues (as
the noise variance of probabilistic PCA, Tipping and Bishop 1999). There it equals
½[(d − k) log c_S + Σ_S log μ_j − log det C̃], so the best S minimises

    F(S) = (d − k) log c_S + Σ_S log μ_j,

which needs only the kept values and the trace. F is concave in each kept μ_j, so a minimiser
keeps the i largest and the k − i smallest candidates for some i: the k + 1 splits are
compared exactly (an eigenvalue far below c costs φ ≈ −log(μ/c), one far above ≈ μ/c;
discarding either misstates the variance along it). Lanczos converges at both ends of the
spectrum (Golub and Van Loan 2013, Sect. 10.1); only pairs with residual
‖C̃v − μv‖ ≤ ``ritz_tol`` · |μ| are candidates: μ is then within ``ritz_tol`` · |μ| of an
eigenvalue (the residual of a unit vector bounds its Rayleigh quotient's distance to the
spectrum of a symmetric matrix; Parlett 1998, Ch. 4).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.covariance import StructuredCovariance, from_whitened
from numpyro_subsample.proxies.curvature import CurvatureOperator
from numpyro_subsample.proxies.lanczos import lanczos_eigh

__all__ = ["RitzSelection", "select_ritz_pairs", "low_rank_precision"]

COMPLEMENTS = ("trace", "next")


class RitzSelection(NamedTuple):
    """The kept Ritz pairs: ``kept`` their indices in the Lanczos order (largest first),
    ``top`` and ``bottom`` how many of their values lie above c and how many not (from the
    top and the bottom of the spectrum), ``complement`` c before the floor, ``objective`` the
    criterion's value and ``converged`` (m,) the mask of candidates."""

    kept: np.ndarray
    top: int
    bottom: int
    complement: float
    objective: float
    converged: np.ndarray


def select_ritz_pairs(
    values: np.ndarray,
    residuals: np.ndarray,
    trace: float,
    dim: int,
    rank: int,
    complement: str = "trace",
    floor: float = 0.0,
    ritz_tol: float = 0.1,
) -> RitzSelection:
    """At most ``rank`` of the m Ritz pairs (``values`` largest first, ``residuals``) of a d × d
    matrix with trace ``trace``: the converged ones (module docstring) that minimise

    * ``complement="trace"``: F(S) with c_S the mean of the discarded eigenvalues;
    * ``complement="next"``: log(c_S / min_{j∉S} μ_j) with c_S = max_{j∉S} μ_j over the
      discarded Ritz values, the condition number of the whitened curvature, which is then
      at most 1 off span(V_S);

    among the splits into the i largest and the k − i smallest candidates (k = min(``rank``,
    number converged)). Values are raised to ``floor`` (> 0 for the logarithms).
    """
    values, residuals = np.asarray(values, np.float64), np.asarray(residuals, np.float64)
    converged = residuals <= ritz_tol * np.abs(values)
    cand = np.flatnonzero(converged)
    k = min(rank, cand.size)
    lo = max(floor, np.finfo(np.float64).tiny)
    best = None
    for i in range(k + 1):
        kept = np.concatenate([cand[:i], cand[cand.size - (k - i):]]).astype(int)
        mu = values[kept]
        rest = np.delete(values, kept)
        if complement == "trace":
            c = (trace - float(np.sum(mu))) / (dim - k)
            obj = (dim - k) * np.log(max(c, lo)) + float(np.sum(np.log(np.maximum(mu, lo))))
        else:
            c = float(rest.max()) if rest.size else float(values.min())
            obj = np.log(max(c, lo)) - np.log(max(float(rest.min(initial=c)), lo))
        if best is None or obj < best[0] - 1e-12 * abs(best[0]):
            best = (obj, i, kept, c)
    obj, _, kept, c = best
    top = int(np.sum(values[kept] > c))
    return RitzSelection(kept=kept, top=top, bottom=k - top, complement=float(c),
                         objective=float(obj), converged=converged)


def low_rank_precision(
    potential: Potential,
    data: ModelData,
    theta: jax.Array,
    rng_key: jax.Array,
    delta: np.ndarray,
    trace: float,
    eig_floor: float,
    *,
    rank: int,
    num_iter: int,
    complement: str,
    ritz_tol: float,
    curvature: str,
    chunk_size: int,
) -> tuple[StructuredCovariance, dict[str, Any], dict[str, int]]:
    """P = δ^{1/2}(c I + V_S diag(μ_S − c) V_Sᵀ)δ^{1/2} from ``num_iter`` Lanczos iterations on
    C̃ (one data pass each) and :func:`select_ritz_pairs`; μ_S and c raised to ``eig_floor``.
    Returns the covariance, the low-rank entries of ``info`` (documented in
    :func:`~numpyro_subsample.proxies.structured.fit_structured`) and the clipped counts."""
    d, dtype = delta.shape[0], theta.dtype
    lz = lanczos_eigh(
        CurvatureOperator(potential=potential, curvature=curvature, chunk_size=chunk_size),
        (theta, data, jnp.asarray(1 / np.sqrt(delta), dtype)), rng_key, d, rank, num_iter, dtype,
    )
    ritz = np.asarray(lz.ritz_values, np.float64)
    resid = np.asarray(lz.ritz_residuals, np.float64)
    sel = select_ritz_pairs(ritz, resid, trace, d, rank, complement, eig_floor, ritz_tol)
    mu = ritz[sel.kept]
    mu_f, c_f = np.maximum(mu, eig_floor), max(sel.complement, eig_floor)
    op = from_whitened(
        jnp.asarray(c_f * delta, dtype), lz.ritz_vectors[:, sel.kept].astype(dtype),
        jnp.asarray(mu_f / c_f - 1, dtype),
    )
    order = np.concatenate([sel.kept, np.delete(np.arange(ritz.size), sel.kept)])
    info = {
        "rank": int(sel.kept.size),
        "rank_requested": rank,
        "lanczos_iterations": num_iter,
        "ritz_values": ritz[order],
        "ritz_residuals": resid[order],
        "ritz_converged": sel.converged[order],
        "kept_top": sel.top,
        "kept_bottom": sel.bottom,
        "complement_curvature": sel.complement,
        "eigenvalue_floor": eig_floor,
    }
    clipped = {"eigenvalues": int(np.sum(mu < eig_floor)),
               "complement": int(sel.complement < eig_floor)}
    return op, info, clipped
