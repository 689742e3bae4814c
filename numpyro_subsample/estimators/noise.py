"""The noise of a gradient estimator, measured in coordinates whitened by the proxy.

The step-size rules (``numpyro_subsample.sgmcmc.stepsize``) and the adaptive subsample size
need the covariance of the estimator's noise, Cov[Lᵀĝ(θ)], at typical points θ of the
posterior (Σ̂ = L Lᵀ, the proxy covariance).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.estimators.base import GradientEstimator

__all__ = ["measure_whitened_noise"]


@partial(jax.jit, static_argnames=("estimate", "num_points", "num_draws"))
def _noise_covs(estimate, params, centre, tril, key, data, spread, num_points, num_draws):
    d = centre.shape[0]
    k_pts, k_draws = jax.random.split(key)
    ws = spread * jax.random.normal(k_pts, (num_points, d), centre.dtype)
    keys = jax.random.split(k_draws, num_points * num_draws)
    thetas = jnp.repeat(centre + ws @ tril.T, num_draws, axis=0)
    # a loop over the evaluations (lax.map), not a batch: it compiles in about half the time
    gs = jax.lax.map(lambda a: estimate(params, a[0], a[1], data)[0], (keys, thetas)) @ tril
    gs = gs.reshape(num_points, num_draws, d)
    gs = gs - gs.mean(1, keepdims=True)
    return jnp.einsum("pki,pkj->pij", gs, gs) / (num_draws - 1)


def measure_whitened_noise(
    estimator: GradientEstimator,
    centre: jax.Array,
    scale_tril: jax.Array,
    rng_key: jax.Array,
    data: ModelData,
    *,
    num_points: int = 8,
    num_draws: int = 16,
    spread: float = 1.0,
) -> tuple[float, np.ndarray]:
    """Average noise covariance of Lᵀĝ over ``num_points`` draws θ ~ N(θ̂, spread² Σ̂).

    Returns its largest eigenvalue and the matrix. Costs num_points · num_draws subsamples.
    """
    covs = _noise_covs(
        estimator.estimate, estimator.params, centre, scale_tril, rng_key, data,
        float(spread), int(num_points), int(num_draws),
    )
    cov = np.asarray(covs, np.float64).mean(0)
    return float(np.linalg.eigvalsh(0.5 * (cov + cov.T)).max()), cov
