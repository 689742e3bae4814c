"""Stochastic-gradient dynamics on whitened coordinates, using BlackJAX's SGMCMC diffusions.

The sampler moves w, with θ = θ̂ + L w and Σ̂ = L Lᵀ the proxy covariance (or L = I without
preconditioning); the gradient of log π with respect to w is Lᵀ ∇_θ log π.

Step-size convention, the same for every dynamic: ``step_size`` is the time step h of the
diffusion, BlackJAX's ``step_size``. For SGLD, BlackJAX's ``overdamped_langevin`` computes
w + h ∇log π + sqrt(2h) ξ, which is Putcha et al. (2023, Eq. 4) with ε = 2h. The constructors
are cached, so equal settings give the same object and compiled code is shared.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from blackjax.sgmcmc import diffusions

__all__ = [
    "Dynamics",
    "corrected_dynamics",
    "injected_noise_scale",
    "sgld_dynamics",
    "sghmc_dynamics",
    "sgnht_dynamics",
]


class Dynamics(NamedTuple):
    """``step(key, w, momentum, thermostat, grad_logpost_w, step_size, noise_scale=None)``
    returns ``(w, momentum, thermostat)``; ``noise_scale`` is the matrix S of the injected noise
    S ξ of a noise-corrected dynamic (:func:`injected_noise_scale`), ignored by the others.

    ``init_momentum(xi, w)`` gives the auxiliary variables' starting values from a standard
    normal draw ``xi`` of w's shape; SGLD has none and carries a zero-length momentum.

    ``step_noise(noise, w, momentum, thermostat, grad_w, step_size, noise_scale=None)`` is
    ``step`` with its standard normal draw ξ given as ``noise`` (w's shape) instead of drawn
    from a key: ``step(key, ...)`` equals ``step_noise(jax.random.normal(key, w.shape), ...)``.
    Coupled chains share their draws through it (the Richardson-Romberg probe,
    :mod:`~numpyro_subsample.sgmcmc.step_bias`).
    """

    name: str
    init_momentum: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
    step: Callable
    step_noise: Callable | None = None


@cache
def sgld_dynamics() -> Dynamics:
    """Langevin dynamics (Welling and Teh 2011) via BlackJAX's ``overdamped_langevin``."""
    integrator = diffusions.overdamped_langevin()

    def init_momentum(xi, w):
        return jnp.zeros((0,), w.dtype), jnp.zeros((), w.dtype)

    def step(key, w, momentum, thermostat, grad_w, step_size, noise_scale=None):
        return integrator(key, w, grad_w, step_size), momentum, thermostat

    def step_noise(noise, w, momentum, thermostat, grad_w, step_size, noise_scale=None):
        w = w + step_size * grad_w + jnp.sqrt(2.0 * step_size) * noise
        return w, momentum, thermostat

    return Dynamics(name="sgld", init_momentum=init_momentum, step=step,
                    step_noise=step_noise)


# -- SGHMC / SGNHT ------------------------------------------------------------------------------
# Step-size convention (SGHMC, SGNHT): ``step_size`` is the time step h of BlackJAX's
# diffusions (Ma et al. 2015 scaling, unit mass, temperature 1):
#     p' = (1 − αh) p + h ∇_w log π(w) + sqrt(2αh) ξ,        w' = w + h p',
# a discretisation of dw = p dt, dp = ∇log π dt − α p dt + sqrt(2α) dW (α = ``friction``; for
# SGNHT the friction of the drift is the thermostat ξ_t and α sets the injected noise).
# The momentum update is BlackJAX's; the position update uses the *new* momentum
# (symplectic Euler, as in Chen et al. 2014 Eq. 15), whereas BlackJAX's solver moves the
# position with the old momentum (explicit Euler), which for a Gaussian target is stable only
# when h < α. The gradient the kernel passes is at the current w, so the momentum update must
# come first: w' = w + h p' recomputes the position from BlackJAX's p'.
# BlackJAX's noise correction β is 0: a scalar β cannot correct an anisotropic gradient-noise
# covariance and an over-correction would shrink the posterior; the step-size rule of
# :func:`numpyro_subsample.stepsize.sghmc_step_size` bounds the noise's effect instead.


@cache
def sghmc_dynamics(friction: float = 1.0) -> Dynamics:
    """SGHMC (Chen et al. 2014) via ``blackjax.sgmcmc.diffusions.sghmc`` (convention above).

    Momentum starts at N(0, I) (the stationary law of p); the thermostat slot is unused.
    """
    if not friction > 0:
        raise ValueError(f"friction must be > 0, got {friction}.")
    integrator = diffusions.sghmc(alpha=friction, beta=0.0)

    def init_momentum(xi, w):
        return xi.astype(w.dtype), jnp.zeros((), w.dtype)

    def step(key, w, momentum, thermostat, grad_w, step_size, noise_scale=None):
        _, p = integrator(key, w, momentum, grad_w, step_size)
        return w + step_size * p, p, thermostat

    def step_noise(noise, w, momentum, thermostat, grad_w, step_size, noise_scale=None):
        p = ((1.0 - friction * step_size) * momentum + step_size * grad_w
             + jnp.sqrt(2.0 * friction * step_size) * noise)
        return w + step_size * p, p, thermostat

    return Dynamics(name="sghmc", init_momentum=init_momentum, step=step,
                    step_noise=step_noise)


@cache
def sgnht_dynamics(friction: float = 1.0) -> Dynamics:
    """SGNHT (Ding et al. 2014) via ``blackjax.sgmcmc.diffusions.sgnht`` (convention above).

    ``friction`` is the diffusion A of the injected noise sqrt(2Ah)ξ; the thermostat ξ_t
    starts at A and follows ξ' = ξ + h(|p'|²/d − 1), absorbing the unknown gradient noise.
    """
    if not friction > 0:
        raise ValueError(f"friction must be > 0, got {friction}.")
    integrator = diffusions.sgnht(alpha=friction, beta=0.0)

    def init_momentum(xi, w):
        return xi.astype(w.dtype), jnp.asarray(friction, w.dtype)

    def step(key, w, momentum, thermostat, grad_w, step_size, noise_scale=None):
        _, p, xi = integrator(key, w, momentum, thermostat, grad_w, step_size)
        return w + step_size * p, p, xi

    def step_noise(noise, w, momentum, thermostat, grad_w, step_size, noise_scale=None):
        p = ((1.0 - thermostat * step_size) * momentum + step_size * grad_w
             + jnp.sqrt(2.0 * friction * step_size) * noise)
        xi = thermostat + step_size * (jnp.vdot(p, p) / p.shape[0] - 1.0)
        return w + step_size * p, p, xi

    return Dynamics(name="sgnht", init_momentum=init_momentum, step=step,
                    step_noise=step_noise)


# -- noise-corrected dynamics -------------------------------------------------------------------
# The gradient estimate ĝ = ∇log π + e carries noise e of covariance V (whitened), so one step
# adds h²V to the variance of the position (SGLD) or of the momentum (SGHMC, SGNHT) on top of
# the injected 2ch I (c = 1 for SGLD, the friction α or the diffusion A otherwise). Injecting
# N(0, 2ch I − h²V) instead keeps the total at 2ch I: the correction of stochastic-gradient
# Fisher scoring (Ahn, Korattikara and Welling 2012, Eq. 12) and of SGHMC's B̂ = hV/2 (Chen,
# Fox and Guestrin 2014, Eq. 9). BlackJAX's diffusions inject isotropic noise (a scalar β
# correction at most), so the corrected updates are written here, with the same conventions.


def injected_noise_scale(noise_cov, step_size: float, diffusion: float = 1.0):
    """S with S Sᵀ = 2ch I − h²V, eigenvalues clipped at 0 (NumPy, host side).

    Returns ``(S, clipped)``: ``clipped`` counts the directions where the gradient noise alone
    exceeds the diffusion (h²λ > 2ch); there the step is too large for the correction.
    """
    v = np.asarray(noise_cov, np.float64)
    lam, q = np.linalg.eigh(0.5 * (v + v.T))
    h, c = float(step_size), float(diffusion)
    target = 2 * c * h - h * h * np.maximum(lam, 0.0)
    clipped = int(np.sum(target < 0))
    return (q * np.sqrt(np.maximum(target, 0.0))) @ q.T, clipped


@cache
def corrected_dynamics(name: str, friction: float = 1.0) -> Dynamics:
    """SGLD, SGHMC or SGNHT (``name``) injecting S ξ with S Sᵀ = 2ch I − h²V (see above).

    With V = 0 the updates are those of :func:`sgld_dynamics`, :func:`sghmc_dynamics` and
    :func:`sgnht_dynamics` (symplectic Euler for the momentum dynamics).
    """
    if name not in ("sgld", "sghmc", "sgnht"):
        raise ValueError(f"name must be 'sgld', 'sghmc' or 'sgnht', got {name!r}.")
    if not friction > 0:
        raise ValueError(f"friction must be > 0, got {friction}.")
    base = {"sgld": sgld_dynamics, "sghmc": sghmc_dynamics, "sgnht": sgnht_dynamics}[name]
    init_momentum = base().init_momentum if name == "sgld" else base(friction).init_momentum

    def step(key, w, momentum, thermostat, grad_w, step_size, noise_scale=None):
        return step_noise(jax.random.normal(key, w.shape, w.dtype), w, momentum, thermostat,
                          grad_w, step_size, noise_scale)

    def step_noise(xi, w, momentum, thermostat, grad_w, step_size, noise_scale=None):
        noise = noise_scale @ xi
        if name == "sgld":
            return w + step_size * grad_w + noise, momentum, thermostat
        damping = friction if name == "sghmc" else thermostat
        p = (1.0 - damping * step_size) * momentum + step_size * grad_w + noise
        if name == "sgnht":
            thermostat = thermostat + step_size * (jnp.vdot(p, p) / p.shape[0] - 1.0)
        return w + step_size * p, p, thermostat

    return Dynamics(name=f"{name}-corrected", init_momentum=init_momentum, step=step,
                    step_noise=step_noise)
