"""The curvature of the step-size rule for a proxy adapted on pilot chains.

The rules of :mod:`~numpyro_subsample.sgmcmc.stepsize` bound the stationary variance inflation
of a Gaussian coordinate of whitened curvature μ. A whitening by the posterior covariance (the
adapted proxy of :mod:`~numpyro_subsample.sgmcmc.warmup`) makes the mean curvature about 1,
but a hierarchical scale makes it vary over the posterior: the prior curvature of a group
effect is 1/σ², large where σ is small, and there a step chosen for μ = 1 inflates the
variance, and shifts the mean, by much more than δ.
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np

from numpyro_subsample.core.compiling import fast_compile_jit
from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.checks import newton_point

__all__ = ["full_hessian", "measured_curvature"]


@partial(fast_compile_jit, static_argnames=("potential",))
def _prior_hessians(potential: Potential, points: jax.Array, data: ModelData) -> jax.Array:
    return jax.lax.map(jax.hessian(lambda t: potential.prior(t, data)), points)


def full_hessian(potential: Potential, theta: jax.Array, data: ModelData,
                 chunk_size: int) -> np.ndarray:
    """∇²f(θ) of the full potential (float64), in one data pass, by the Laplace fit's compiled
    program (:func:`~numpyro_subsample.proxies.checks.newton_point`)."""
    return np.asarray(newton_point(potential, theta, data, chunk_size).hessian, np.float64)


def measured_curvature(proxy: Proxy, potential: Potential, data: ModelData, *,
                       chunk_size: int) -> tuple[float, float, int]:
    """μ of the step-size rule for an adapted proxy, the data passes it cost (one), and the
    coordinate of θ that the direction of μ moves most, in proxy sds (−1 where μ = 1).

    μ is the largest eigenvalue of Lᵀ(∇²f_data(θ̂) + ∇²f_0(θ_k))L over the pilot's last draws θ_k
    (``proxy.info["draws"]``): the data's Hessian at the centre (one data pass) and the
    prior's, which carries the hierarchical variation, at each draw; at least 1. The data's
    Hessian is ``proxy.info["hessian"]`` (∇²f(θ̂), the pilot's or the Laplace fit's at this
    centre) minus the prior's; then the measurement costs no data pass."""
    info = proxy.info or {}
    draws = info.get("draws")
    if draws is None or len(draws) == 0:
        return 1.0, 0.0, -1
    dtype = proxy.centre.dtype
    total, passes = info.get("hessian"), 0.0
    if total is None:
        total, passes = full_hessian(potential, proxy.centre, data, chunk_size), 1.0
    # the prior's Hessian at the centre, then at the draws (one shape: one program)
    points = np.concatenate([np.asarray(proxy.centre, dtype)[None], np.asarray(draws, dtype)])
    h0 = np.asarray(_prior_hessians(potential, device_array(points), data), np.float64)
    h_data, h0 = np.asarray(total, np.float64) - h0[0], h0[1:]
    L = np.asarray(proxy.scale_tril, np.float64)
    mu, coordinate = 1.0, -1
    for hk in h0:
        m = L.T @ (h_data + hk) @ L
        values, vectors = np.linalg.eigh(0.5 * (m + m.T))
        if values[-1] > mu:  # its direction in θ, in proxy sds: the coordinate it moves most
            mu = float(values[-1])
            coordinate = int(np.argmax(np.abs(L @ vectors[:, -1]) / np.linalg.norm(L, axis=1)))
    return mu, passes, coordinate
