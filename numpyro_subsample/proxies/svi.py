"""SVI of the variational proxy: the full-rank Gaussian fit, NumPyro's SVI, the plateau rule.

* :func:`expansion_start`, :func:`fit_gaussian_cv`: the default full-rank family fitted in
  the potential's flat space from the Laplace start, on a minibatch ELBO with second-order
  control variates (:func:`_cv_neg_elbo`);
* :func:`_fit_svi`: NumPyro's SVI of any guide on the model's own subsampled ELBO, compared
  across blocks by an ELBO with common random numbers;
* :func:`plateau_step`: the stopping rule both use.

The model, the guide and the potential are static arguments of every compiled program and
the data a traced one, so a refit on new data of the same shapes compiles nothing. The rules
are described in :mod:`~numpyro_subsample.proxies.variational`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from numpyro.infer import SVI, Trace_ELBO

from numpyro_subsample.core.data import device_array
from numpyro_subsample.core.datapass import value_grad_hessian_of
from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.core.rng import host_generator
from numpyro_subsample.proxies.checks import coordinate_labels, newton_point
from numpyro_subsample.proxies.laplace import _adam_phase, _cholesky_of_inverse
from numpyro_subsample.proxies.progress import finish_bar, progress_bar

_ELBO = Trace_ELBO()
# Adam's direction with the learning rate applied by hand, so that the rate can be lowered on
# a plateau without recompiling (optax has no plateau schedule for a noisy subsampled ELBO).
_ADAM = optax.scale_by_adam()
MAX_START_STEP = 3.0  # longest first step of q's mean from the mode (whitened units)
MAX_NEWTON_STEPS = 20  # full-data Newton steps of the start


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
    tol, num_eval_particles, progress, init_loc=None,
):
    """NumPyro's SVI of ``guide`` under the plateau rule on a common-random-number ELBO;
    ``init_loc``: the start of an ``AutoContinuous`` guide's ``<prefix>_loc`` (guide order)."""
    k_init, k_run, k_eval = jax.random.split(rng_key, 3)
    params, opt_state = _init_params(model, guide, k_init, data)
    if init_loc is not None:
        params = dict(params, **{f"{guide.prefix}_loc": jnp.asarray(init_loc)})
        opt_state = _ADAM.init(params)
    eval_keys = jax.random.split(k_eval, num_eval_particles)
    lr = float(learning_rate)
    losses_all, trace = [], []
    initial = -float(_crn_loss(model, guide, params, eval_keys, data))
    rule = Plateau(best=initial, stale=0, decays=0)
    action, steps, avg, key = "continue", 0, params, k_run
    bar = progress_bar(max_steps, "proxy: SVI (variational)", progress)
    while steps < max_steps and action != "stop":
        key, sub = jax.random.split(key)
        params, opt_state, avg, losses = _run_block(
            model, guide, block_size, params, opt_state, sub, lr, data
        )
        steps += block_size
        losses_all.append(np.asarray(losses, np.float64))
        value = -float(_crn_loss(model, guide, avg, eval_keys, data))
        if not np.isfinite(value):
            raise ValueError(
                "The ELBO is not finite during SVI; check the model and data, or pass a smaller "
                "variational learning_rate (proxy_kwargs={'learning_rate': ...})."
            )
        trace.append(value)
        bar.update(block_size)
        bar.set_postfix(elbo=f"{value:.6g}", lr=f"{lr:.2g}")
        rule, action = plateau_step(rule, value, tol, patience, num_decays)
        lr = lr / 4.0 if action == "decay" else lr
    finish_bar(bar, f"converged at step {steps}" if action == "stop" else None)
    return _constrain(model, guide, avg, k_init, data), {
        "losses": np.concatenate(losses_all),
        "elbo_trace": np.asarray(trace),
        "initial_elbo": initial,
        "svi_steps": steps,
        "converged": action == "stop",
        "elbo_trend": elbo_trend(np.asarray(trace), block_size, patience),
        "final_learning_rate": lr,
        "crn_evaluations": (len(trace) + 1) * num_eval_particles,
    }


# -- the plateau rule (both fits) ---------------------------------------------------------------
class Plateau(NamedTuple):
    """State of the stopping rule: best smoothed ELBO, blocks since it rose, rate decays."""

    best: float
    stale: int
    decays: int


def plateau_step(rule: Plateau, value: float, threshold: float, patience: int,
                 num_decays: int) -> tuple[Plateau, str]:
    """One block of the plateau rule: ``"continue"``, ``"decay"`` (divide the rate) or ``"stop"``.

    The block improves if its smoothed ELBO ``value`` exceeds the best so far by more than
    ``threshold`` (nats); the best moves only on an improvement, so a slow rise accumulates.
    """
    if value > rule.best + threshold:
        return Plateau(best=value, stale=0, decays=rule.decays), "continue"
    stale = rule.stale + 1
    if stale < patience:
        return Plateau(best=rule.best, stale=stale, decays=rule.decays), "continue"
    if rule.decays >= num_decays:
        return Plateau(best=rule.best, stale=stale, decays=rule.decays), "stop"
    return Plateau(best=rule.best, stale=0, decays=rule.decays + 1), "decay"


def elbo_trend(trace: np.ndarray, block_size: int, blocks: int) -> float:
    """Least-squares slope of the last ``blocks`` + 1 block ELBOs, in nats per 1000 steps."""
    y = np.asarray(trace, np.float64)[-(blocks + 1):]
    if y.size < 2:
        return float("nan")
    x = np.arange(y.size) * block_size / 1000.0
    return float(np.polyfit(x, y, 1)[0])


# -- Gaussian SVI with second-order control variates (the default guide) ------------------------
class Expansion(NamedTuple):
    """Expansion point θ̂ of the control variates and the whitening L0 of the Gaussian family:
    θ = θ̂ + L0 w, w ~ N(u, T Tᵀ). ``lik_*`` are Σ_i f_i, L0ᵀ Σ_i ∇f_i and L0ᵀ Σ_i ∇²f_i L0
    at θ̂ (the data terms only)."""

    centre: jax.Array
    whiten: jax.Array
    lik_value: jax.Array
    lik_grad_w: jax.Array
    lik_hess_w: jax.Array


@partial(jax.jit, static_argnames=("potential",))
def _prior_derivatives(potential, theta, data):
    return value_grad_hessian_of(lambda t: potential.prior(t, data), theta)


def full_data_expansion(potential, theta, data, chunk_size):
    """f, ∇f, ∇²f of the potential and f0, ∇f0, ∇²f0 of its prior term at θ (one data pass,
    by the Laplace fit's compiled Newton pass)."""
    f, g, h = newton_point(potential, theta, data, chunk_size)[:3]
    return (f, g, h, *_prior_derivatives(potential, theta, data))


def gaussian_factor(params: dict) -> jax.Array:
    """T = strict lower part of ``off`` + diag(exp(``log_diag``))."""
    return jnp.tril(params["off"], -1) + jnp.diag(jnp.exp(params["log_diag"]))


def _cv_neg_elbo(potential, exp: Expansion, params, idx, eps, data):
    """−ELBO + const of q = N(θ̂ + L0 u, L0 T Tᵀ L0ᵀ), unbiased over the minibatch ``idx``.

    f(θ) = f0(θ) + Σ_i f_i(θ), and each f_i is split into its second-order Taylor expansion
    t_i at θ̂ and the remainder r_i = f_i − t_i. E_q[Σ_i t_i] is exact (Σ_i t_i is quadratic,
    its coefficients summed in one data pass); f0 and (N/n) Σ_{i∈S} r_i are averaged over the
    draws ``eps``. The remainder is small where the posterior is near Gaussian, so the
    estimator's variance is far below that of (N/n) Σ_{i∈S} f_i (the second-order control
    variate of Baker et al. 2019 applied to the ELBO). t_i's derivative terms are
    forward-mode directional derivatives: no per-datum d × d Hessian.
    """
    N, n = potential.num_data, idx.shape[0]
    u, T, K = params["u"], gaussian_factor(params), exp.lik_hess_w
    quad = exp.lik_grad_w @ u + 0.5 * u @ (K @ u) + 0.5 * jnp.sum((K @ T) * T)

    def taylor(t, delta):  # f_i(t) and ∇f_i(t)·δ
        return jax.jvp(lambda s: potential.data_terms(s, idx, data), (t,), (delta,))

    def one(delta):
        (at_centre, first), (_, second) = jax.jvp(lambda t: taylor(t, delta), (exp.centre,),
                                                  (delta,))
        f0, fi = potential.terms(exp.centre + delta, idx, data)
        return f0 + (N / n) * jnp.sum(fi - at_centre - first - 0.5 * second)

    deltas = (u + eps @ T.T) @ exp.whiten.T
    return exp.lik_value + quad + jnp.mean(jax.vmap(one)(deltas)) - jnp.sum(params["log_diag"])


@partial(jax.jit, static_argnames=("potential",))
def _cv_block(potential, exp, params, opt_state, idxs, eps, lr, data):
    """Adam steps on the control-variate ELBO, one per row of ``idxs`` (non-finite steps
    skipped), and the block's iterate average."""

    def step(c, x):
        p, s, avg, i = c
        loss, g = jax.value_and_grad(lambda q: _cv_neg_elbo(potential, exp, q, *x, data))(p)
        upd, s = _ADAM.update(g, s, p)
        finite = jnp.isfinite(loss) & jnp.all(jnp.isfinite(ravel_pytree(g)[0]))
        p = jax.tree.map(lambda a, v: jnp.where(finite, a - lr * v, a), p, upd)
        avg = jax.tree.map(lambda a, v: a + (v - a) / (i + 1), avg, p)
        return (p, s, avg, i + 1), loss

    init = (params, opt_state, params, jnp.zeros((), exp.centre.dtype))
    (params, opt_state, avg, _), losses = jax.lax.scan(step, init, (idxs, eps))
    return params, opt_state, avg, losses


def minibatch_mode(potential, data, rng_key, progress):
    """The Laplace fit's Adam phase (2 epochs, at least 500 steps, learning rate 0.05, one
    compiled program shared with it) from the potential's start: ``(θ, steps)``."""
    N, n = potential.num_data, potential.plate.subsample_size
    num_steps = -(-int(min(max(math.ceil(2.0 * N / n), 500), 50_000)) // 250) * 250
    theta = _adam_phase(potential, data, potential.init_theta, n, num_steps, rng_key, 0.05,
                        progress)
    return theta, num_steps


def expansion_start(potential, data, rng_key, *, chunk_size, progress):
    """Step 1 of the default fit (:mod:`~numpyro_subsample.proxies.variational`):
    ``(Expansion, u0, record)``; u0 = −L0ᵀ∇f(θ̂) is the last Newton step in whitened units
    (at most :data:`MAX_START_STEP` long)."""
    N, n = potential.num_data, potential.plate.subsample_size
    theta, num_steps = minibatch_mode(potential, data, rng_key, progress)
    theta, (f, g, h, f0, g0, h0), passes = _newton(potential, data, theta, chunk_size)
    gn, hn = np.asarray(g, np.float64), np.asarray(h, np.float64)
    if not (np.isfinite(float(f)) and np.all(np.isfinite(gn)) and np.all(np.isfinite(hn))):
        labels = coordinate_labels(potential)
        bad = np.flatnonzero(~(np.isfinite(hn).all(1) & np.isfinite(gn)))
        raise ValueError(
            "The potential or its derivatives are not finite at the start of the variational "
            f"fit (the minibatch mode, along {', '.join(repr(labels[k]) for k in bad[:5])}); "
            "check the model's support and the data, or pass a guide=."
        )
    try:
        whiten = _cholesky_of_inverse(hn)[1]
        u0 = -whiten.T @ gn
        u0 *= min(1.0, MAX_START_STEP / max(float(np.linalg.norm(u0)), 1e-300))
        definite = True
    except np.linalg.LinAlgError:
        diag = np.abs(np.diag(hn))
        floor = max(1e-2 * float(np.median(diag)), 1e-8)
        whiten, u0 = np.diag(1.0 / np.sqrt(np.maximum(diag, floor))), np.zeros_like(gn)
        definite = False
    dtype = theta.dtype
    lik_grad, lik_hess = gn - np.asarray(g0, np.float64), hn - np.asarray(h0, np.float64)
    exp = Expansion(
        centre=theta, whiten=device_array(whiten, dtype),
        lik_value=device_array(float(f) - float(f0), dtype),
        lik_grad_w=device_array(whiten.T @ lik_grad, dtype),
        lik_hess_w=device_array(whiten.T @ lik_hess @ whiten, dtype),
    )
    return exp, u0, {"adam_steps": num_steps, "newton_passes": passes,
                     "hessian_definite": definite,
                     "num_data_passes": num_steps * n / N + passes}


def _newton(potential, data, theta, chunk_size):
    """Damped Newton steps on the full potential from ``theta`` while its Hessian is positive
    definite and the Newton decrement exceeds 10⁻⁶·d; the point, its
    :func:`~.svi.full_data_expansion` and the data passes used."""
    sums = full_data_expansion(potential, theta, data, int(chunk_size))
    passes = 1
    for _ in range(MAX_NEWTON_STEPS):
        f, g, h = (np.asarray(a, np.float64) for a in sums[:3])
        try:
            chol = np.linalg.cholesky(0.5 * (h + h.T))
        except np.linalg.LinAlgError:
            break
        step = np.linalg.solve(chol.T, np.linalg.solve(chol, g))
        if not (np.all(np.isfinite(step)) and g @ step > 1e-6 * theta.shape[0]):
            break
        t, moved = 1.0, False
        while t > 1e-3 and not moved:
            cand = device_array(np.asarray(theta, np.float64) - t * step, theta.dtype)
            new = full_data_expansion(potential, cand, data, int(chunk_size))
            passes, t = passes + 1, 0.5 * t
            moved = bool(np.isfinite(float(new[0])) and float(new[0]) <= float(f))
            theta, sums = (cand, new) if moved else (theta, sums)
        if not moved:
            break
    return theta, sums, passes


def fit_gaussian_cv(
    potential, data, exp: Expansion, u0, rng_key, *, learning_rate, block_size, patience,
    num_decays, max_steps, tol, num_draws, progress,
):
    """Adam on :func:`_cv_neg_elbo` until the plateau rule stops it (module docstring of
    :mod:`~numpyro_subsample.proxies.variational`). Returns the mean, the Cholesky factor of
    the covariance (potential's flat order) and the fit's record."""
    d, dtype = potential.dim, exp.centre.dtype
    N, n = potential.num_data, potential.plate.subsample_size
    params = {"u": jnp.asarray(u0, dtype), "off": jnp.zeros((d, d), dtype),
              "log_diag": jnp.zeros((d,), dtype)}
    opt_state = _ADAM.init(params)
    rng, lr, steps = host_generator(rng_key), float(learning_rate), 0
    losses_all, trace, ses = [], [], []
    rule, action, avg = Plateau(best=-np.inf, stale=0, decays=0), "continue", params
    const = 0.5 * d * (1.0 + np.log(2 * np.pi)) + float(
        np.sum(np.log(np.abs(np.diag(np.asarray(exp.whiten, np.float64))))))
    bar = progress_bar(max_steps, "proxy: SVI (variational)", progress)
    while steps < max_steps and action != "stop":
        b = min(block_size, max_steps - steps)
        idxs = device_array(rng.integers(0, N, size=(b, n), dtype=np.int32))
        eps = device_array(rng.standard_normal((b, num_draws, d)), dtype)
        params, opt_state, avg, losses = _cv_block(potential, exp, params, opt_state, idxs, eps,
                                                   device_array(lr, dtype), data)
        steps += b
        elbo = const - np.asarray(losses, np.float64)
        losses_all.append(-elbo)
        finite = elbo[np.isfinite(elbo)]
        if finite.size < 2:
            raise ValueError(
                "The ELBO is not finite during SVI; check the model and data, or pass a smaller "
                "variational learning_rate (proxy_kwargs={'learning_rate': ...})."
            )
        value, se = float(finite.mean()), float(finite.std() / np.sqrt(finite.size))
        trace.append(value)
        ses.append(se)
        rule, action = plateau_step(rule, value, max(tol, 2.0 * se), patience, num_decays)
        if action == "decay":
            lr /= 4.0
        bar.update(b)
        bar.set_postfix(elbo=f"{value:.6g}", lr=f"{lr:.2g}")
    finish_bar(bar, f"converged at step {steps}" if action == "stop" else None)
    T = np.asarray(gaussian_factor(avg), np.float64)
    L0 = np.asarray(exp.whiten, np.float64)
    mean = np.asarray(exp.centre, np.float64) + L0 @ np.asarray(avg["u"], np.float64)
    trace = np.asarray(trace)
    return mean, L0 @ T, {
        "losses": np.concatenate(losses_all), "elbo_trace": trace, "elbo_se": np.asarray(ses),
        "svi_steps": steps, "converged": action == "stop", "final_learning_rate": lr,
        "elbo_trend": elbo_trend(trace, block_size, patience),
        "num_data_passes": steps * n / N,
    }
