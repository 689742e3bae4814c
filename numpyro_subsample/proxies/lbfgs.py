"""The mode for :func:`~numpyro_subsample.proxies.structured.fit_structured`: Adam on minibatches,
then L-BFGS on full-data passes (Nocedal and Wright 2006, Alg. 7.5; Optax with a zoom line
search) in coordinates scaled by the Fisher diagonal at the Adam point."""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from numpyro_subsample.core.datapass import value_grad_hessian
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.curvature import fisher_diagonal, prior_hessian_diagonal
from numpyro_subsample.proxies.laplace import _adam_phase

__all__ = ["ModeResult", "find_mode"]


class _LbfgsResult(NamedTuple):
    theta: jax.Array
    value: jax.Array
    grad: jax.Array  # ∇f(θ), in θ coordinates
    iterations: jax.Array
    evaluations: jax.Array  # data passes
    grad_rms: jax.Array  # rms of the gradient in the scaled coordinates
    stalled: jax.Array


@partial(jax.jit, static_argnames=("potential", "chunk_size", "memory_size"))
def _lbfgs(potential, chunk_size, memory_size, max_iterations, gtol, theta0, scale, data):
    """L-BFGS on u ↦ f(θ0 + u / scale); each evaluation of f and ∇f is one chunked pass (a
    custom VJP: the gradient comes from the pass, never from reverse mode through the scan)."""

    def value_grad(u):
        v, g, _ = value_grad_hessian(potential, theta0 + u / scale, data, chunk_size, False)
        return v, g / scale

    @jax.custom_vjp
    def fun(u):
        return value_grad(u)[0]

    fun.defvjp(value_grad, lambda g, ct: (ct * g,))
    opt = optax.lbfgs(memory_size=memory_size)
    u0 = jnp.zeros_like(theta0)
    v0, g0 = value_grad(u0)
    state0 = optax.tree.set(opt.init(u0), value=v0, grad=g0)
    rms = lambda g: jnp.sqrt(jnp.mean(g**2))  # noqa: E731

    def cond(c):
        u, state, it, evals, stalled = c
        g = optax.tree.get(state, "grad")
        return (it < max_iterations) & (rms(g) > gtol) & ~stalled

    def body(c):
        u, state, it, evals, _ = c
        value, grad = optax.tree.get(state, "value"), optax.tree.get(state, "grad")
        upd, new_state = opt.update(grad, state, u, value=value, grad=grad, value_fn=fun)
        new_value, new_grad = optax.tree.get(new_state, "value"), optax.tree.get(new_state, "grad")
        finite = jnp.isfinite(new_value) & jnp.all(jnp.isfinite(new_grad))
        stalled = jnp.all(upd == 0) | ~finite
        evals = evals + optax.tree.get(new_state, "num_linesearch_steps")
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        state = jax.tree.map(keep, new_state, state)  # a non-finite point is never accepted
        return keep(u + upd, u), state, it + 1, evals, stalled

    init = (u0, state0, jnp.asarray(0), jnp.asarray(1), jnp.asarray(False))
    u, state, it, evals, stalled = jax.lax.while_loop(cond, body, init)
    g = optax.tree.get(state, "grad")
    return _LbfgsResult(
        theta=theta0 + u / scale, value=optax.tree.get(state, "value"), grad=g * scale,
        iterations=it, evaluations=evals, grad_rms=rms(g), stalled=stalled,
    )


class ModeResult(NamedTuple):
    """The end point θ, f(θ) and ∇f(θ) (float64 numpy), the L-BFGS ``iterations``,
    ``grad_rms`` in the scaled coordinates, ``converged`` (≤ gtol), ``stop`` (why it ended),
    ``adam_steps``, the data ``passes`` by phase, and the Adam point θ_A with the sds σ of
    L-BFGS's scaling there (``adam_theta``, ``adam_sd``; a start that has not run into a
    degenerate mode, which L-BFGS may go on to)."""

    theta: jax.Array
    value: float
    grad: np.ndarray
    iterations: int
    grad_rms: float
    converged: bool
    stop: str
    adam_steps: int
    passes: dict
    adam_theta: jax.Array
    adam_sd: np.ndarray


def find_mode(
    potential: Potential,
    data: ModelData,
    theta: jax.Array,
    rng_key: jax.Array,
    *,
    subsample_size: int | None,
    num_epochs: float,
    learning_rate: float,
    max_iterations: int,
    gtol: float,
    memory_size: int,
    chunk_size: int,
    block: int,
    progress: bool,
) -> ModeResult:
    """``num_epochs`` epochs of Adam on minibatches of ``subsample_size`` (the model's n) from
    ``theta``, then up to ``max_iterations`` L-BFGS iterations on full-data passes in the
    coordinates u = σ⁻¹ ⊙ (θ − θ_A), σ⁻² the diagonal of the empirical Fisher plus the prior's
    Hessian at the Adam point θ_A (one pass), until the rms of ∇_u f is ≤ ``gtol``. Arguments
    as validated by :func:`~numpyro_subsample.proxies.structured.fit_structured`."""
    N = potential.num_data
    passes = {}
    adam_steps = 0
    if num_epochs > 0:
        n = int(subsample_size or potential.plate.subsample_size)
        adam_steps = int(min(max(math.ceil(num_epochs * N / n), 500), 50_000))
        adam_steps = -(-adam_steps // 250) * 250
        theta = _adam_phase(potential, data, theta, n, adam_steps, rng_key, learning_rate,
                            progress)
        passes["adam"] = adam_steps * n / N
    prior_diag = np.asarray(prior_hessian_diagonal(potential, theta, data, block), np.float64)
    fisher_a = np.asarray(fisher_diagonal(potential, theta, data, chunk_size)[0], np.float64)
    passes["scaling"] = 1.0
    scale = fisher_a + np.maximum(prior_diag, 0)
    scale = np.sqrt(np.maximum(scale, 1e-12 * max(float(scale.max()), 1e-30)))
    res = _lbfgs(potential, chunk_size, memory_size, max_iterations, gtol, theta,
                 jnp.asarray(scale, theta.dtype), data)
    passes["lbfgs"] = float(res.evaluations)
    converged = bool(res.grad_rms <= gtol)
    stop = ("converged" if converged else "stalled (no decrease along the search direction)"
            if bool(res.stalled) else f"max_iterations={max_iterations} reached")
    return ModeResult(theta=res.theta, value=float(res.value),
                      grad=np.asarray(res.grad, np.float64), iterations=int(res.iterations),
                      grad_rms=float(res.grad_rms), converged=converged, stop=stop,
                      adam_steps=adam_steps, passes=passes, adam_theta=theta,
                      adam_sd=1.0 / scale)
