"""SVI of the variational proxy: compiled Adam blocks and the plateau rule.

The model and the guide are static arguments of every compiled program and the data a traced
one, so a refit on new data of the same shapes compiles nothing. The stopping rule (blocks of
iterate-averaged Adam steps compared by an ELBO with common random numbers, learning rate
divided by 4 on a plateau) is described in :mod:`~numpyro_subsample.proxies.variational`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from numpyro.infer import SVI, Trace_ELBO

from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.proxies.progress import finish_bar, progress_bar

_ELBO = Trace_ELBO()
# Adam's direction with the learning rate applied by hand, so that the rate can be lowered on
# a plateau without recompiling (optax has no plateau schedule for a noisy subsampled ELBO).
_ADAM = optax.scale_by_adam()


# -- compiled SVI programs (model and guide static, data traced) ---------------------------------
def _svi(model: Callable, guide: Callable, key: jax.Array, data: ModelData):
    """NumPyro's SVI of ``model`` on ``data``, initialised (its ``constrain_fn`` is set)."""
    args, kwargs = data.args_kwargs()
    svi = SVI(model, guide, optax.sgd(1.0), _ELBO)
    return svi, svi.init(key, *args, **kwargs)


def _loss(svi: SVI, params: dict, key: jax.Array, data: ModelData) -> jax.Array:
    args, kwargs = data.args_kwargs()
    return svi.loss.loss(key, svi.constrain_fn(params), svi.model, svi.guide, *args, **kwargs)


@partial(jax.jit, static_argnames=("model", "guide"))
def _init_params(model, guide, key, data):
    """Unconstrained initial parameters and Adam's state."""
    svi, state = _svi(model, guide, key, data)
    params = svi.optim.get_params(state.optim_state)
    return params, _ADAM.init(params)


@partial(jax.jit, static_argnames=("model", "guide"))
def _constrain(model, guide, params, key, data):
    """The guide's parameters in their constrained space (as NumPyro's guides read them)."""
    return _svi(model, guide, key, data)[0].constrain_fn(params)


@partial(jax.jit, static_argnames=("model", "guide"))
def _crn_loss(model, guide, params, keys, data):
    """−ELBO averaged over fixed keys (common random numbers)."""
    svi = _svi(model, guide, keys[0], data)[0]
    return jnp.mean(jax.lax.map(lambda k: _loss(svi, params, k, data), keys))


@partial(jax.jit, static_argnames=("model", "guide", "block_size"))
def _run_block(model, guide, block_size, params, opt_state, key, lr, data):
    """``block_size`` Adam steps (non-finite steps skipped) and the block's iterate average."""
    svi = _svi(model, guide, key, data)[0]

    def step(c, k):
        p, s, avg, i = c
        loss, g = jax.value_and_grad(lambda q: _loss(svi, q, k, data))(p)
        upd, s = _ADAM.update(g, s, p)
        finite = jnp.isfinite(loss) & jnp.all(jnp.isfinite(ravel_pytree(g)[0]))
        p = jax.tree.map(lambda a, u: jnp.where(finite, a - lr * u, a), p, upd)
        avg = jax.tree.map(lambda a, x: a + (x - a) / (i + 1), avg, p)
        return (p, s, avg, i + 1), loss

    init = (params, opt_state, params, jnp.zeros((), jnp.float32))
    (params, opt_state, avg, _), losses = jax.lax.scan(
        step, init, jax.random.split(key, block_size)
    )
    return params, opt_state, avg, losses


def _fit_svi(
    model, guide, data, rng_key, *, learning_rate, block_size, patience, num_decays, max_steps,
    tol, num_eval_particles, progress,
):
    k_init, k_run, k_eval = jax.random.split(rng_key, 3)
    params, opt_state = _init_params(model, guide, k_init, data)
    eval_keys = jax.random.split(k_eval, num_eval_particles)
    lr = float(learning_rate)
    losses_all, trace = [], []
    best = float(_crn_loss(model, guide, params, eval_keys, data))
    initial = -best
    stale, decays, steps, converged = 0, 0, 0, False
    avg = params
    bar = progress_bar(max_steps, "proxy: SVI (variational)", progress)
    key = k_run
    while steps < max_steps:
        key, sub = jax.random.split(key)
        params, opt_state, avg, losses = _run_block(
            model, guide, block_size, params, opt_state, sub, lr, data
        )
        steps += block_size
        losses_all.append(np.asarray(losses, np.float64))
        value = float(_crn_loss(model, guide, avg, eval_keys, data))
        if not np.isfinite(value):
            raise ValueError(
                "The ELBO is not finite during SVI; check the model and data, or pass a smaller "
                "variational learning_rate (proxy_kwargs={'learning_rate': ...})."
            )
        trace.append(-value)
        bar.update(block_size)
        bar.set_postfix(elbo=f"{-value:.6g}", lr=f"{lr:.2g}")
        if value < best - tol:
            best, stale = value, 0
        else:
            best, stale = min(best, value), stale + 1
        if stale >= patience:
            if decays >= num_decays:
                converged = True
                break
            decays += 1
            lr /= 4.0
            stale = 0
    finish_bar(bar, f"converged at step {steps}" if converged else None)
    return _constrain(model, guide, avg, k_init, data), {
        "losses": np.concatenate(losses_all),
        "elbo_trace": np.asarray(trace),
        "initial_elbo": initial,
        "svi_steps": steps,
        "converged": converged,
        "final_learning_rate": lr,
        "crn_evaluations": (len(trace) + 1) * num_eval_particles,
    }
