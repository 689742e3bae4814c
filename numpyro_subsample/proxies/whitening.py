"""The samplers' whitening θ = θ̂ + L w by a dense triangular factor or a structured covariance.

A :data:`Scale` is either the dense lower-triangular Cholesky factor of
:class:`~numpyro_subsample.proxies.base.Proxy` or a
:class:`~numpyro_subsample.proxies.covariance.StructuredCovariance` (of a
:class:`~numpyro_subsample.proxies.structured.StructuredProxy`) whose L is never formed. The
functions dispatch on the type at trace time, so one program serves either kind and the dense
one is unchanged.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.proxies.covariance import (
    StructuredCovariance,
    scale_matvec,
    scale_rmatvec,
    scale_solve,
)
from numpyro_subsample.proxies.structured import StructuredProxy

__all__ = [
    "Scale",
    "is_structured",
    "proxy_scale",
    "identity_scale",
    "whiten_matvec",
    "whiten_rmatvec",
    "whiten_solve",
    "cov_norm_bound",
]

#: A square root L of a proxy covariance (L Lᵀ = Σ̂): the dense lower-triangular Cholesky factor
#: (d, d) of :class:`~numpyro_subsample.proxies.base.Proxy`, or a
#: :class:`~numpyro_subsample.proxies.covariance.StructuredCovariance` whose L
#: (:func:`~numpyro_subsample.proxies.covariance.scale_matvec`, not triangular) is never formed.
Scale = Any


def is_structured(x: Any) -> bool:
    """Whether ``x`` (a :data:`Scale` or a proxy) is the structured kind."""
    return isinstance(x, (StructuredCovariance, StructuredProxy))


def proxy_scale(proxy: Any) -> Scale:
    """The :data:`Scale` of a proxy: ``cov_op`` of a :class:`StructuredProxy`, else the
    dense ``scale_tril``."""
    return proxy.cov_op if isinstance(proxy, StructuredProxy) else proxy.scale_tril


def identity_scale(dim: int, dtype: Any) -> StructuredCovariance:
    """L = I as a structured operator (D = 1, k = 0): no d × d array."""
    return StructuredCovariance(
        diag=jnp.ones((dim,), dtype), basis=jnp.zeros((dim, 0), dtype), coef=jnp.zeros((0,), dtype),
        white_basis=jnp.zeros((dim, 0), dtype), white_eig=jnp.zeros((0,), dtype),
    )


def whiten_matvec(scale: Scale, w: jax.Array) -> jax.Array:
    """L w for w of shape (d,) or (..., d) (the position of whitened coordinates w)."""
    if is_structured(scale):
        return scale_matvec(scale, w)
    return scale @ w if w.ndim == 1 else w @ scale.T


def whiten_rmatvec(scale: Scale, g: jax.Array) -> jax.Array:
    """Lᵀ g for g of shape (d,) or (..., d) (a gradient in whitened coordinates)."""
    if is_structured(scale):
        return scale_rmatvec(scale, g)
    return scale.T @ g if g.ndim == 1 else g @ scale


def whiten_solve(scale: Scale, x: jax.Array) -> jax.Array:
    """L⁻¹ x for x of shape (d,) or (..., d) (whitened coordinates of an offset θ − θ̂)."""
    if is_structured(scale):
        return scale_solve(scale, x)
    if x.ndim == 1:
        return jax.scipy.linalg.solve_triangular(scale, x, lower=True)
    return jax.scipy.linalg.solve_triangular(scale, x.T, lower=True).T


def cov_norm_bound(scale: Scale) -> float:
    """An upper bound of the largest eigenvalue of Σ̂ = L Lᵀ: exact (eigh) for a dense factor,
    max(D⁻¹) · max(1, max (1 + γ)⁻¹) for the structured one (O(d); the square root in
    :mod:`~numpyro_subsample.proxies.covariance`)."""
    if is_structured(scale):
        inner = float(jnp.max(1 / (1 + scale.white_eig), initial=1.0))
        return float(jnp.max(1 / scale.diag)) * max(inner, 1.0)
    cov = np.asarray(scale, np.float64)
    return float(np.linalg.eigvalsh(cov @ cov.T).max())
