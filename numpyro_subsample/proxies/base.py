"""The proxy of the posterior: a centre θ̂ and a covariance Σ̂ in unconstrained space.

Every proxy (Laplace, variational, user-given) is this closed record; the estimators, the
preconditioner and the step-size rule read nothing else.
"""

from __future__ import annotations

from typing import NamedTuple

import jax

__all__ = ["Proxy", "ProxyFitWarning"]


class ProxyFitWarning(UserWarning):
    """A proxy fit that failed or is unreliable: the message names the sites and a remedy."""


class Proxy(NamedTuple):
    """Centre θ̂ (d,), covariance Σ̂ (d, d), its Cholesky factor L, and the data at θ̂.

    Parameters
    ----------
    centre
        θ̂, shape (d,).
    cov
        Σ̂, shape (d, d).
    scale_tril
        L with Σ̂ = L Lᵀ.
    datum_grads
        ∇f_i(θ̂), shape (N, d), or None (recomputed per subsample).
    sum_grads
        Σ_i ∇f_i(θ̂).
    num_data_passes, seconds
        Cost of the fit.
    kind
        ``"laplace"``, ``"variational"``, ``"user"``, ...
    info
        Facts about the fit.

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Sect. 3 (the centring value θ̂ and its gradients).
    """

    centre: jax.Array
    cov: jax.Array
    scale_tril: jax.Array
    datum_grads: jax.Array | None  # ∇f_i(θ̂), (N, d)
    sum_grads: jax.Array  # Σ_i ∇f_i(θ̂)
    num_data_passes: float
    seconds: float
    kind: str
    info: dict
