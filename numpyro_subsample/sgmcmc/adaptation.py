"""A diagonal preconditioner adapted during warm-up, on top of the proxy's whitening.

The chain moves u with w = s ⊙ u, θ = θ̂ + L w (L the proxy's whitening, or I without
preconditioning); s is per coordinate and per chain. During the ``num_warmup`` steps the state
keeps V, a running mean of the squared gradient estimate in w coordinates, ĝ_w = Lᵀ ĝ_θ (the
estimate the chain computes anyway: no extra data), and sets s = (V + V_min)^(-1/2); after
warm-up s is frozen, so the sampling phase is a stochastic-gradient diffusion with a constant
preconditioner. Because the state stores w, a change of s during warm-up leaves θ where it is.

The scale V^(-1/2) is the square root of the inverse diagonal Fisher information that
stochastic gradient Fisher scoring preconditions with (Ahn, Korattikara and Welling 2012);
pSGLD (Li et al. 2016) and the scale-adapted SGHMC of Springenberg et al. (2016) use the
RMSprop scale V^(-1/4), which leaves u with variances ∝ posterior sd instead of 1. For a
stationary chain, E[ĝ_j²] = E_π[(∂_j log π)²] + v_j = E_π[−∂²_j log π] + v_j, the mean
curvature plus the estimator's noise variance of coordinate j. In u coordinates both are
scaled by s_j², so

    μ_j + v_j ≤ 1     (u coordinates, every j),

and the default time step is the step-size rule of the dynamic
(:mod:`~numpyro_subsample.sgmcmc.stepsize`) at its worst split of that unit budget between
curvature and noise (:func:`adaptive_step_size`): the stationary variance of a Gaussian
coordinate is then inflated by at most ``max_variance_inflation``, for coordinates that are
weakly correlated in w. Transient gradients of the first warm-up steps only make V larger (a
smaller, safe s). The mean starts from V₀ = 1 + ĝ_w(θ₀)² (weight one draw) and, after
``window`` gradients, forgets the oldest ones with weight 1/``window``
(:func:`adaptation_window`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "MIN_ADAPT_WARMUP",
    "MIN_MOMENT",
    "ScaleAdaptation",
    "adaptation_window",
    "adaptive_step_size",
    "check_adaptation_warmup",
    "init_adaptation",
    "update_adaptation",
]

#: V_min: s = (V + V_min)^(-1/2) is at most 10³ (a coordinate whose gradient estimates vanish
#: has no scale to learn; with the proxy's whitening, 10³ proxy sds is also where the chain is
#: declared exploding, :data:`~numpyro_subsample.sgmcmc.chain.MAX_PROXY_SD`).
MIN_MOMENT = 1e-6


#: The fewest warm-up steps the adaptation accepts: below this the scale would rest on a few
#: gradients of a chain that has not yet left its start.
MIN_ADAPT_WARMUP = 100


class ScaleAdaptation(NamedTuple):
    """Per chain: ``moment`` V, the running mean of ĝ_w² (shape (d,)); ``scale`` is
    s = (V + V_min)^(-1/2)."""

    moment: jax.Array

    @property
    def scale(self) -> jax.Array:
        return jax.lax.rsqrt(self.moment + MIN_MOMENT)


def adaptation_window(num_warmup: int) -> int:
    """The number of recent gradients the running mean weighs once it is full: a fifth of the
    warm-up, at least 50 (so that s carries a relative error of about (2/window)^(1/2) / 2)."""
    return max(50, int(num_warmup) // 5)


def check_adaptation_warmup(label: str, num_warmup: int) -> None:
    """Raise a ``ValueError`` naming ``label`` (the kernel) when ``num_warmup`` is below
    :data:`MIN_ADAPT_WARMUP`."""
    if int(num_warmup) < MIN_ADAPT_WARMUP:
        raise ValueError(
            f"{label} adapts a diagonal preconditioner during warm-up (AdaptationOptions("
            f"preconditioner=True, or None with a structured proxy or local latent sites), but "
            f"num_warmup={num_warmup} < "
            f"{MIN_ADAPT_WARMUP}; pass MCMC(..., num_warmup=1000) or more, or "
            "AdaptationOptions(preconditioner=False)."
        )


def init_adaptation(grad_w: jax.Array) -> ScaleAdaptation:
    """The state before the first step, from the gradient estimate ``grad_w`` at the start."""
    return ScaleAdaptation(moment=1.0 + grad_w * grad_w)


def update_adaptation(state: ScaleAdaptation, grad_w: jax.Array, i: jax.Array,
                      num_warmup: int, window: int) -> ScaleAdaptation:
    """Step ``i`` (0-based): during warm-up (i < ``num_warmup``), V ← V + ρ(ĝ_w² − V) with
    ρ = max(1/(i + 2), 1/``window``) and s = (V + V_min)^(-1/2); afterwards unchanged."""
    rho = jnp.maximum(1.0 / (i + 2.0), 1.0 / window).astype(grad_w.dtype)
    moment = state.moment + rho * (grad_w * grad_w - state.moment)
    return ScaleAdaptation(moment=jnp.where(i < num_warmup, moment, state.moment))


def adaptive_step_size(rule: Callable[[float, float], float], points: int = 101) -> float:
    """The time step for adapted coordinates: the smallest ``rule(noise, curvature)`` over
    splits noise + curvature = 1 (module docstring), on a grid of ``points`` splits."""
    return float(min(rule(1.0 - mu, mu) for mu in np.linspace(1e-3, 1.0, points)))
