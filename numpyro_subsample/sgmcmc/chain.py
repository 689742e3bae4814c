"""The functional core of the stochastic-gradient kernels: states and pure programs.

The chain moves in coordinates whitened by the proxy, θ = θ̂ + L w with Σ̂ = L Lᵀ. L is a
:data:`~numpyro_subsample.proxies.whitening.Scale`: the dense lower-triangular Cholesky factor
of a :class:`~numpyro_subsample.proxies.base.Proxy`, or a
:class:`~numpyro_subsample.proxies.covariance.StructuredCovariance` whose L w, Lᵀ g and L⁻¹ x
cost O(d·k) and form no d × d array; the step reads it only through
:func:`~numpyro_subsample.proxies.whitening.whiten_matvec`, ``whiten_rmatvec`` and
``whiten_solve``, which dispatch on its type when the program is traced. The arrays of the
preprocessing (θ̂, L, the step size h, the estimator's arrays) travel in the state's ``params``
field, so the compiled loop is reused for new data of the same shapes; the static configuration
(:class:`SGMCMCConfig`) selects one cached pair of pure programs, ``init_one`` and ``step``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.rng import STEP_RNG, host_normals, raw_key, split_step_key
from numpyro_subsample.estimators.zv import (
    ZVPairedStats,
    ZVStats,
    default_g,
    empty_paired_stats,
    empty_stats,
    flat_fn,
    linearised_covariates,
    num_covariates,
    welford_update,
    zv_covariates,
)
from numpyro_subsample.proxies.whitening import whiten_matvec, whiten_rmatvec, whiten_solve
from numpyro_subsample.sgmcmc.adaptation import (
    ScaleAdaptation,
    init_adaptation,
    update_adaptation,
)
from numpyro_subsample.sgmcmc.state import (
    Preprocessed,
    SamplerParams,
    SGMCMCConfig,
    SGMCMCState,
    Whitening,
)

__all__ = [
    "MAX_PROXY_SD",
    "SamplerParams",
    "SGMCMCState",
    "SGMCMCConfig",
    "Preprocessed",
    "Whitening",
    "chain_programs",
    "initial_draws",
    "initial_estimates",
]

#: A proposed state farther than this many proxy standard deviations from the proxy centre (in
#: any whitened coordinate) is treated as an exploding chain: the step is rejected and marked
#: ``diverging``, like a non-finite one.
MAX_PROXY_SD = 1e3


@lru_cache(maxsize=64)
def chain_programs(cfg: SGMCMCConfig) -> tuple[Callable, Callable]:
    """Pure ``init_one(key, init_params, data, params, draws=None)`` and ``step(state, data)``
    of a config.

    ``init_one`` places the chain (at ``init_params``, at θ̂ + L ξ_0 or at θ̂) with momentum
    ξ_1, where ``draws`` = (ξ_0, ξ_1) are standard normal draws of shape (2, d) made by the
    caller (on the host, :func:`initial_draws`), or from ``key`` when None. It evaluates no
    gradient: the state at iteration 0 holds none, and the first ``step`` evaluates the
    estimate at the initial position without moving (so a chain's first draw is its initial
    position, and ``init_one`` compiles no estimator). A stateful estimator's state is made by
    ``init_one`` and advanced by every ``step`` (``update``); the data passes it spends beyond
    the subsample are added to ``data_passes``. With ``params.steps_per_draw`` = k, ``step``
    moves the dynamics k times per draw after the first, whose k steps evaluate the estimate at
    the start without moving (``state.i`` counts draws).
    """
    pot, dynamics = cfg.potential, cfg.dynamics
    inv_n = 1.0 / pot.num_data
    zv_flat = _zv_function(cfg)

    def move(state: SGMCMCState, data: ModelData) -> SGMCMCState:
        """One step of the dynamics; ``state.i`` (the draw's index) is left to ``step``."""
        p = state.params
        key, k_dyn, k_est = split_step_key(state.rng_key, cfg.rng_impl)
        first = state.i == 0  # the initial state holds no gradient: evaluate it, do not move
        w, mom, xi, adapt = _dynamics_step(cfg, state, k_dyn, first)
        theta = p.centre + whiten_matvec(p.scale_tril, w)
        g, n, est_state, extra_passes = _gradient_estimate(cfg, state, k_est, theta, data)
        ok, fail_step, fail_coord = _failure_bookkeeping(cfg, state, w, theta, g)
        keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
        if adapt is not None:
            adapt = _restarted_adaptation(state, adapt, g, first, keep)
        return state._replace(
            z=jax.tree.map(keep, pot.unravel(theta), state.z),
            w=keep(w, state.w), momentum=keep(mom, state.momentum),
            thermostat=keep(xi, state.thermostat), grad=keep(-g, state.grad),
            subsample_size=jnp.asarray(n, jnp.int32), diverging=~ok, fail_step=fail_step,
            fail_coord=fail_coord,
            data_passes=state.data_passes + n * inv_n + extra_passes,
            rng_key=key, est_state=est_state, adapt=adapt,
        )

    def step(state: SGMCMCState, data: ModelData) -> SGMCMCState:
        k = state.params.steps_per_draw
        if k is None:
            new = move(state, data)
        else:  # k steps per draw; at the first draw each of them evaluates the estimate at
            # the start without moving: a trip count shared by vectorized chains, whose loop
            # would otherwise carry (and select) every chain's state, SAGA's table included,
            # at every step
            new = jax.lax.fori_loop(0, k, lambda _, s: move(s, data), state)
        new = new._replace(i=state.i + 1)
        if zv_flat is not None:
            new = new._replace(zv_stats=_zv_accumulate(cfg, zv_flat, state.zv_stats, new, data))
        return new

    def init_one(rng_key, init_params, data, params: SamplerParams,
                 draws: jax.Array | None = None) -> SGMCMCState:
        centre, tril = params.centre, params.scale_tril
        d = centre.shape[0]
        if draws is None:  # in the program (a traced key under pmap)
            key, k_draw, _ = split_step_key(rng_key, cfg.rng_impl)
            draws = jax.random.normal(k_draw, (2, d), centre.dtype)
        else:
            key = raw_key(rng_key)
        draws = draws.astype(centre.dtype)
        w = _initial_position(cfg, init_params, params, draws[0])
        theta = centre + whiten_matvec(tril, w)
        est_state, extra_passes = None, 0.0
        if cfg.init_state is not None:
            est_state, extra_passes = cfg.init_state(params.estimator, data)
        mom, xi = dynamics.init_momentum(draws[1], w)
        adapt = init_adaptation(jnp.zeros_like(w)) if cfg.adapt_window else None
        stats = _empty_zv_stats(cfg, zv_flat, pot.unravel(theta), data, d, centre.dtype)
        zero = jnp.zeros((), jnp.int32)
        return SGMCMCState(
            i=zero, z=pot.unravel(theta), w=w, momentum=mom, thermostat=xi,
            grad=jnp.zeros_like(w), subsample_size=zero, diverging=jnp.zeros((), bool),
            fail_step=jnp.full((), -1, jnp.int32), fail_coord=jnp.full((), -1, jnp.int32),
            data_passes=(params.data_passes + extra_passes).astype(centre.dtype),
            rng_key=key, params=params, zv_stats=stats, est_state=est_state, adapt=adapt,
        )

    return init_one, step


def _zv_function(cfg: SGMCMCConfig) -> Callable | None:
    """The flat g(z, data) whose mean the zero-variance statistics estimate (``cfg.zv_fn``,
    else the constrained parameters), or None without ``cfg.zv_degree``."""
    if not cfg.zv_degree:
        return None
    pot, g_fn = cfg.potential, cfg.zv_fn or default_g

    def zv_flat(z, data):
        return flat_fn(lambda zz: g_fn(pot.constrain(zz, data)), z)[0](z)

    return zv_flat


def _initial_position(cfg: SGMCMCConfig, init_params, params: SamplerParams,
                      draw: jax.Array) -> jax.Array:
    """The chain's whitened start w: the given ``init_params``, else with ``cfg.init_strategy``
    ``"proxy"`` θ ~ N(θ̂, Σ̂) of the proxy from the standard normal ``draw``, else the centre."""
    centre, tril = params.centre, params.scale_tril
    if init_params is not None:
        theta = ravel_pytree(init_params)[0].astype(centre.dtype)
        return whiten_solve(tril, theta - centre)
    if cfg.init_strategy == "proxy":
        return draw if cfg.precondition_draw else whiten_matvec(params.init_tril, draw)
    return jnp.zeros((centre.shape[0],), centre.dtype)


def _empty_zv_stats(cfg: SGMCMCConfig, zv_flat: Callable | None, z, data: ModelData, d: int,
                    dtype) -> ZVStats | ZVPairedStats | None:
    """The zero-variance statistics of a chain before its first draw (None without
    ``cfg.zv_degree``), sized by g's output at ``z``."""
    if not cfg.zv_degree:
        return None
    m = jax.eval_shape(zv_flat, z, data).shape[0]
    return (empty_paired_stats(m, dtype) if cfg.zv_linearised
            else empty_stats(num_covariates(d, cfg.zv_degree), m, dtype))


def _dynamics_step(cfg: SGMCMCConfig, state: SGMCMCState, k_dyn: jax.Array, first: jax.Array,
                   ) -> tuple[jax.Array, jax.Array, jax.Array, ScaleAdaptation | None]:
    """The proposed (w, momentum, thermostat) of one step of the dynamics from the state's
    gradient, and the preconditioner adapted by it: with ``cfg.adapt_window`` the dynamics
    move u = w / s (:mod:`~numpyro_subsample.sgmcmc.adaptation`). The initial state
    (``first``) keeps its position."""
    p = state.params
    grad_w = whiten_rmatvec(p.scale_tril, state.grad)
    adapt = state.adapt
    if cfg.adapt_window:
        adapt = update_adaptation(adapt, grad_w, state.i, cfg.num_warmup, cfg.adapt_window)
        s = adapt.scale
        u, mom, xi = cfg.dynamics.step(k_dyn, state.w / s, state.momentum, state.thermostat,
                                       s * grad_w, p.step_size, p.noise_scale)
        w = s * u
    else:
        w, mom, xi = cfg.dynamics.step(k_dyn, state.w, state.momentum, state.thermostat,
                                       grad_w, p.step_size, p.noise_scale)
    stay = lambda new, old: jnp.where(first, old, new)  # noqa: E731
    return stay(w, state.w), stay(mom, state.momentum), stay(xi, state.thermostat), adapt


def _gradient_estimate(cfg: SGMCMCConfig, state: SGMCMCState, k_est: jax.Array,
                       theta: jax.Array, data: ModelData) -> tuple:
    """``(g, n, est_state, extra_passes)``: the estimator's g ≈ −∇log π(θ) from n data, its
    next state and the data passes it spent beyond the subsample (for a stateless estimator
    ``state.est_state`` and 0)."""
    p = state.params
    if cfg.update is None:
        g, n = cfg.estimate(p.estimator, k_est, theta, data)
        return g, n, state.est_state, 0.0
    return cfg.update(p.estimator, state.est_state, k_est, theta, data)


def _failure_bookkeeping(cfg: SGMCMCConfig, state: SGMCMCState, w: jax.Array,
                         theta: jax.Array, g: jax.Array) -> tuple[jax.Array, ...]:
    """``(ok, fail_step, fail_coord)``: whether the proposed step is taken (the chain is
    healthy and θ, the gradient and w are finite, w within :data:`MAX_PROXY_SD` proxy
    standard deviations of the centre), and the iteration and flat coordinate of a failure,
    recorded when it first happens."""
    p = state.params
    # distance from the proxy centre in proxy standard deviations (w itself when whitened)
    z_sd = w if cfg.precondition_draw else whiten_solve(p.init_tril, w)
    bad = ~jnp.isfinite(theta) | ~jnp.isfinite(g) | (jnp.abs(z_sd) >= MAX_PROXY_SD)
    healthy = state.fail_step < 0
    ok = healthy & ~jnp.any(bad)
    newly_failed = healthy & ~ok
    fail_step = jnp.where(newly_failed, state.i + 1, state.fail_step)
    fail_coord = jnp.where(newly_failed, jnp.argmax(bad).astype(jnp.int32), state.fail_coord)
    return ok, fail_step, fail_coord


def _restarted_adaptation(state: SGMCMCState, adapt: ScaleAdaptation, g: jax.Array,
                          first: jax.Array, keep: Callable) -> ScaleAdaptation:
    """The adapted preconditioner after the step: started from the first gradient at the
    initial state (``first``), the state's own where the step is not taken (``keep``)."""
    started = init_adaptation(whiten_rmatvec(state.params.scale_tril, -g))
    stay = lambda new, old: jnp.where(first, old, new)  # noqa: E731
    return jax.tree.map(keep, jax.tree.map(stay, adapt, started), state.adapt)


def _zv_accumulate(cfg: SGMCMCConfig, zv_flat: Callable, stats: ZVStats | ZVPairedStats,
                   new: SGMCMCState, data: ModelData) -> ZVStats | ZVPairedStats:
    """The zero-variance statistics (Baker et al. 2019, Sect. 4) with the new state's draw
    added after warm-up: covariates from its gradient, or with ``cfg.zv_linearised`` the
    linearised u = J_g(θ̂) L Lᵀ ŝ (:mod:`~numpyro_subsample.estimators.zv`)."""
    p, pot = new.params, cfg.potential
    theta_z = ravel_pytree(new.z)[0]
    if cfg.zv_linearised:
        v = whiten_matvec(p.scale_tril, whiten_rmatvec(p.scale_tril, new.grad))
        u = linearised_covariates(
            lambda th: zv_flat(pot.unravel(th), data).astype(th.dtype), p.centre, v)
    else:
        u = zv_covariates(theta_z, new.grad, cfg.zv_degree)
    gv = zv_flat(new.z, data).astype(theta_z.dtype)
    return welford_update(stats, u, gv, new.i > cfg.num_warmup)


def initial_draws(rng_key: jax.Array, params: SamplerParams) -> tuple:
    """``(draws,)``: ξ_0, ξ_1 of ``init_one`` (:func:`chain_programs`), (2, d) per chain, by
    NumPy from the bits of each chain's key (a batch of keys gives a leading axis); ``()`` for
    a traced key (under pmap: ``init_one`` draws them in the program)."""
    if isinstance(rng_key, jax.core.Tracer):
        return ()
    return (host_normals(rng_key, (2, params.centre.shape[0]), params.centre.dtype),)


@partial(jax.jit, static_argnums=0)
def initial_estimates(estimate: Callable, params: SamplerParams, w: jax.Array,
                      data: ModelData) -> jax.Array:
    """The gradient estimates (P, d) at the whitened positions ``w`` (P, d), with a fixed key
    and ``params.estimator`` the arrays of ``estimate``: the check of given ``init_params``
    before sampling (the chains' first step evaluates the estimate there again)."""
    key = jax.random.key(0, impl=STEP_RNG)

    def one(wp):
        theta = params.centre + whiten_matvec(params.scale_tril, wp)
        return estimate(params.estimator, key, theta, data)[0]

    return jax.vmap(one)(w)
