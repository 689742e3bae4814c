"""The default step size: from the measured gradient noise, not a constant.

For a Gaussian target with curvature μ (in whitened coordinates μ = 1) and gradient noise of
variance v, the Euler-Maruyama Langevin step x' = x − hμx − h·noise + sqrt(2h)ξ is an AR(1)
process with stationary variance (2 + h v) / (μ (2 − h μ)): the exact 1/μ inflated by the
factor (2 + h v)/(2 − h μ). Asking that factor to be at most 1 + δ gives

    h = 2δ / (v + μ (1 + δ)),        ε = 2h (paper 000 step-size convention).

v is the largest eigenvalue of the estimator's noise covariance in whitened coordinates,
measured at points drawn from the proxy (so heavy-tailed per-datum gradients, which make v
large, automatically shrink the step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .estimators import GradientEstimator

__all__ = ["measure_whitened_noise", "sgld_step_size"]


def measure_whitened_noise(
    estimator: GradientEstimator,
    centre: jax.Array,
    scale_tril: jax.Array,
    rng_key: jax.Array,
    *,
    num_points: int = 8,
    num_draws: int = 16,
    spread: float = 1.5,
) -> tuple[float, np.ndarray]:
    """Average noise covariance of Lᵀĝ over ``num_points`` draws θ ~ N(θ̂, spread² Σ̂).

    Returns its largest eigenvalue and the matrix. Costs num_points · num_draws subsamples.
    """
    d = centre.shape[0]
    k_pts, k_draws = jax.random.split(rng_key)
    ws = spread * jax.random.normal(k_pts, (num_points, d), centre.dtype)

    def noise_cov(w, key):
        theta = centre + scale_tril @ w
        keys = jax.random.split(key, num_draws)
        gs = jax.vmap(lambda k: estimator.estimate(k, theta)[0])(keys) @ scale_tril
        gs = gs - gs.mean(0)
        return gs.T @ gs / (num_draws - 1)

    covs = jax.jit(jax.vmap(noise_cov))(ws, jax.random.split(k_draws, num_points))
    cov = np.asarray(covs, np.float64).mean(0)
    return float(np.linalg.eigvalsh(0.5 * (cov + cov.T)).max()), cov


def sgld_step_size(noise: float, max_variance_inflation: float = 0.05, curvature: float = 1.0) -> float:
    """ε = 2h with h = 2δ / (v + μ(1 + δ)) (module docstring); δ = ``max_variance_inflation``."""
    delta = float(max_variance_inflation)
    if not delta > 0:
        raise ValueError(f"max_variance_inflation must be > 0, got {max_variance_inflation}.")
    h = 2 * delta / (max(noise, 0.0) + curvature * (1 + delta))
    return 2 * h
