"""The precision P = Σ̂⁻¹ of a structured proxy at the mode (:mod:`.structured`): the
diagonal h of the curvature C, its floors, and the diagonal or low-rank operator.

Curvature floors (never requiring a positive definite Hessian): a diagonal entry h_i is raised
to τ_i = p_i, the prior's Hessian diagonal, where p_i > 0 (in the Gauss-Newton view the data's
curvature is ≥ 0, so this only replaces negative data curvature by 0), else to
``curvature_floor`` · max_j max(h_j, p_j); the eigenvalues μ_j and c of the scaled matrix
are raised to max(``curvature_floor``, min_i p_i⁺/δ_i), a lower bound of the scaled curvature
of a diagonal prior. The counts are in ``info["clipped"]``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import datum_values_and_grads
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.checks import prior_grad
from numpyro_subsample.proxies.covariance import StructuredCovariance, structured_covariance
from numpyro_subsample.proxies.curvature import (
    fisher_diagonal,
    hessian_diagonal,
    hutchinson_diagonal,
    prior_hessian_diagonal,
)
from numpyro_subsample.proxies.lowrank import low_rank_precision
from numpyro_subsample.proxies.structured_args import StructuredArguments

__all__ = ["Precision", "precision_at_mode"]


class Precision(NamedTuple):
    """What :func:`precision_at_mode` returns: the operator ``cov_op`` Σ̂, the curvature
    diagonal ``h``, Σ_i ∇f_i(θ̂) and the (N, d) table or None, the ``clipped`` counts, the
    low-rank ``info`` and the warnings."""

    cov_op: StructuredCovariance
    curvature_diagonal: np.ndarray
    sum_grads: jax.Array
    datum_grads: jax.Array | None
    clipped: dict
    info: dict
    messages: list


def precision_at_mode(potential: Potential, data: ModelData, theta: jax.Array, g: np.ndarray,
                      key_probe: jax.Array, key_lanczos: jax.Array, a: StructuredArguments,
                      block: int, store_datum_grads: bool, passes: dict) -> Precision:
    """The curvature diagonal at θ̂ (and the sums of ∇f_i), floored, then Σ̂ from it: diagonal
    or low-rank (module docstring). ``key_probe``: Hutchinson's probes; ``key_lanczos``: the
    Lanczos start. The data passes are added to ``passes``."""
    h, prior_diag, sum_grads, datum_grads = _curvature_diagonal(
        potential, data, theta, g, key_probe, a.curvature, a.diagonal, a.num_probes,
        a.chunk_size, block, store_datum_grads, passes,
    )
    delta, clipped_diag = _floored_diagonal(h, prior_diag, a.curvature_floor)
    op, info, clipped, messages = _covariance_operator(
        potential, data, theta, key_lanczos, a, h, prior_diag, delta, passes)
    return Precision(cov_op=op, curvature_diagonal=h, sum_grads=sum_grads,
                     datum_grads=datum_grads, clipped={"diagonal": clipped_diag, **clipped},
                     info=info, messages=messages)


def _floored_diagonal(h: np.ndarray, p: np.ndarray, floor: float):
    """δ = max(h, τ), τ_i = p_i where p_i > 0, else ``floor`` · max(h, p) (module docstring)."""
    top = max(float(np.max(h, initial=0.0)), float(np.max(p, initial=0.0)))
    if not top > 0:
        raise ValueError(
            "The curvature has no positive diagonal entry at the mode (its largest is "
            f"{float(np.max(h)):.3g}) and the prior none either: the posterior is flat or the "
            "optimiser stopped at a maximum. Check the model, or pass init_theta."
        )
    tau = np.where(p > 0, p, floor * top)
    return np.maximum(h, tau), int(np.sum(h < tau))


def _curvature_diagonal(potential, data, theta, g, key, curvature, diagonal, num_probes,
                        chunk_size, block, store_datum_grads, passes):
    """The diagonal h of C at θ̂, Σ_i ∇f_i(θ̂) and the (N, d) per-datum gradients or None."""
    datum_grads = fisher_sum = None
    if store_datum_grads:
        _, datum_grads = datum_values_and_grads(potential, theta, data, chunk_size)
        passes["datum_grads"] = 1.0
        sum_grads = jnp.sum(datum_grads, axis=0)
        if curvature == "fisher":
            fisher_sum = jnp.sum(datum_grads**2, axis=0)
    prior_diag = np.asarray(prior_hessian_diagonal(potential, theta, data, block), np.float64)
    if curvature == "fisher":
        if fisher_sum is None:
            fisher_sum, sum_grads = fisher_diagonal(potential, theta, data, chunk_size)
            passes["diagonal"] = 1.0
        return np.asarray(fisher_sum, np.float64) + prior_diag, prior_diag, sum_grads, datum_grads
    if diagonal == "exact":
        h = hessian_diagonal(potential, theta, data, chunk_size, block)
    else:
        h = hutchinson_diagonal(potential, theta, data, key, num_probes, chunk_size, block)
    passes["diagonal"] = 1.0
    if not store_datum_grads:  # Σ_i ∇f_i(θ̂) = ∇f(θ̂) − ∇f0(θ̂), no further pass
        g0 = np.asarray(prior_grad(potential, theta, data), np.float64)
        sum_grads = jnp.asarray((g - g0).astype(theta.dtype))
    return np.asarray(h, np.float64), prior_diag, sum_grads, datum_grads


def _covariance_operator(potential: Potential, data: ModelData, theta: jax.Array, key,
                         a: StructuredArguments, h: np.ndarray, prior_diag: np.ndarray,
                         delta: np.ndarray, passes: dict) -> tuple:
    """``(Σ̂, low-rank info, clipped counts, warnings)``: the diagonal Σ̂ = diag(δ), or the
    low-rank precision from m = min(2k + oversample, d) Lanczos iterations (m data passes,
    added to ``passes``), with a warning when fewer than k Ritz pairs converged."""
    dtype, k, d = theta.dtype, a.rank, potential.dim
    if k == 0:
        return (structured_covariance(jnp.asarray(delta, dtype)), {},
                {"eigenvalues": 0, "complement": 0}, [])
    m = min(2 * k + a.oversample, d)
    eig_floor = max(a.curvature_floor, float(np.min(np.maximum(prior_diag, 0) / delta)))
    op, info_lr, clipped_lr = low_rank_precision(
        potential, data, theta, key, delta, float(np.sum(h / delta)), eig_floor,
        rank=k, num_iter=m, complement=a.complement, ritz_tol=a.ritz_tol,
        curvature=a.curvature, chunk_size=a.chunk_size,
    )
    passes["lanczos"] = float(m)
    messages = []
    if info_lr["rank"] < k:
        messages.append(
            f"Only {info_lr['rank']} of the rank={k} Ritz pairs of the scaled curvature "
            f"converged (residual ≤ ritz_tol={a.ritz_tol:g} · |μ|) in {m} Lanczos "
            "iterations; the proxy keeps those. Pass a larger oversample or ritz_tol."
        )
    return op, info_lr, clipped_lr, messages
