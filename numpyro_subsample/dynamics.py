"""Stochastic-gradient dynamics on whitened coordinates, using BlackJAX's SGMCMC diffusions.

The sampler moves w, with θ = θ̂ + L w and Σ̂ = L Lᵀ the proxy covariance (or L = I without
preconditioning); the gradient of log π with respect to w is Lᵀ ∇_θ log π.

Step-size convention (SGLD): ``step_size`` is ε of paper 000 Eq. (4),
θ ← θ − (ε/2) ĝ + N(0, ε), applied to w. BlackJAX's ``overdamped_langevin`` computes
x + h ∇log π + sqrt(2h) ξ, so it is called with h = ε/2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from blackjax.sgmcmc import diffusions

__all__ = ["Dynamics", "sgld_dynamics"]


class Dynamics(NamedTuple):
    """``step(key, w, momentum, thermostat, grad_logpost_w, step_size) -> (w, momentum, thermostat)``.

    ``init_momentum(key, w)`` gives the auxiliary variables' starting values; SGLD has none and
    carries a zero-length momentum.
    """

    name: str
    init_momentum: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
    step: Callable


def sgld_dynamics() -> Dynamics:
    """Langevin dynamics, paper 000 Eq. (4), via ``blackjax.sgmcmc.diffusions.overdamped_langevin``."""
    integrator = diffusions.overdamped_langevin()

    def init_momentum(key, w):
        return jnp.zeros((0,), w.dtype), jnp.zeros((), w.dtype)

    def step(key, w, momentum, thermostat, grad_w, step_size):
        return integrator(key, w, grad_w, 0.5 * step_size), momentum, thermostat

    return Dynamics("sgld", init_momentum, step)
