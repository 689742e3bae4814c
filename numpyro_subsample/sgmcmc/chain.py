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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.core.rng import STEP_RNG, host_normals, raw_key, split_step_key
from numpyro_subsample.estimators.base import GradientEstimator
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
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.structured import StructuredProxy
from numpyro_subsample.proxies.whitening import Scale, whiten_matvec, whiten_rmatvec, whiten_solve
from numpyro_subsample.sgmcmc.adaptation import (
    ScaleAdaptation,
    init_adaptation,
    update_adaptation,
)
from numpyro_subsample.sgmcmc.dynamics import Dynamics

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


class SamplerParams(NamedTuple):
    """The arrays of the preprocessing that the step reads: the whitening θ = θ̂ + L w
    (``scale_tril``: a :data:`~numpyro_subsample.proxies.whitening.Scale`, dense triangular or
    structured), the step size h, the estimator's arrays and, for a noise-corrected dynamic,
    the matrix S of the injected noise S ξ
    (:func:`~numpyro_subsample.sgmcmc.dynamics.injected_noise_scale`)."""

    centre: jax.Array
    scale_tril: Scale
    step_size: jax.Array
    estimator: Any
    init_tril: Scale  # square root of the proxy covariance, for initial draws
    data_passes: jax.Array  # data passes spent on the preprocessing
    noise_scale: jax.Array | None = None


class SGMCMCState(NamedTuple):
    """State of a stochastic-gradient chain.

    ``z``: unconstrained latent values (dict); ``w``: whitened position (θ = θ̂ + L w);
    ``grad``: the estimate of ∇ log π(θ) at ``z`` (unconstrained, flat), used by the next step
    (zeros in the initial state, ``i`` = 0, whose step evaluates it without moving);
    ``subsample_size``: data used for ``grad``; ``diverging``: the chain has failed: a
    proposed step was non-finite or farther than :data:`MAX_PROXY_SD` proxy sds from the
    centre; the chain then stops at its last valid state and every later draw is marked;
    ``fail_step``, ``fail_coord``: the iteration of the failure and the flat unconstrained
    coordinate that failed (−1 while the chain is healthy); ``data_passes``: cumulative data
    evaluations / N, including preprocessing; ``params``: the preprocessing's arrays (shared
    by vectorized chains);
    ``zv_stats``: streamed zero-variance statistics (``zv_stream=True``; paired ones with
    the linearised covariates);
    ``est_state``: the estimator's own state (None for a stateless estimator; SAGA's table,
    SVRG's anchor: :mod:`numpyro_subsample.estimators.variance_reduced`), updated by every
    gradient estimate of the steps, also after a failure (the chain is frozen then and its
    state no longer used); ``adapt``: the diagonal preconditioner adapted during warm-up
    (:class:`~numpyro_subsample.sgmcmc.adaptation.ScaleAdaptation`, with
    ``adapt_preconditioner=True``): the dynamics then move u = w / ``adapt.scale``, and
    ``momentum`` is in u's units.

    Parameters
    ----------
    i
        Iteration counter.
    z
        Unconstrained latent values (dict site → array).
    w
        Whitened position, θ = θ̂ + L w.
    momentum
        Momentum of SGHMC and SGNHT (zeros for SGLD).
    thermostat
        SGNHT's thermostat ξ.
    grad
        Estimate of ∇log π at ``z`` (flat, unconstrained), used by the next step.
    subsample_size
        Data used for ``grad``.
    diverging
        True once the chain has failed.
    fail_step, fail_coord
        Iteration and flat coordinate of the failure (−1 while healthy).
    data_passes
        Cumulative data evaluations / N, preprocessing included.
    rng_key
        The chain's random key.
    params
        The preprocessing's arrays, shared by vectorized chains.
    zv_stats
        Streamed zero-variance statistics, or None.
    est_state
        The estimator's state (SAGA's table, SVRG's anchor), or None.
    adapt
        The adapted diagonal preconditioner, or None.

    References
    ----------
    Welling and Teh (2011); Chen, Fox and Guestrin (2014); Ding et al. (2014) (the dynamics
    whose state this is).
    """

    i: jax.Array
    z: dict
    w: jax.Array
    momentum: jax.Array
    thermostat: jax.Array
    grad: jax.Array
    subsample_size: jax.Array
    diverging: jax.Array
    fail_step: jax.Array
    fail_coord: jax.Array
    data_passes: jax.Array
    rng_key: jax.Array
    params: SamplerParams
    zv_stats: ZVStats | ZVPairedStats | None = None
    est_state: Any = None
    adapt: ScaleAdaptation | None = None


class Preprocessed(NamedTuple):
    """Everything computed once per data set before sampling.

    Parameters
    ----------
    potential
        The model's :class:`~numpyro_subsample.core.potential.Potential`.
    proxy
        The fitted proxy N(θ̂, Σ̂), or None without one.
    estimator
        The configured :class:`~numpyro_subsample.estimators.base.GradientEstimator`.
    step_size
        The time step h.
    noise
        Largest eigenvalue v of the whitened gradient-noise covariance.
    centre
        θ̂, the centre of the whitening.
    scale_tril
        L (Σ̂ = L Lᵀ), dense or structured.
    seconds, data_passes
        Cost of the preprocessing.
    params
        The arrays the compiled step reads.
    noise_cov
        The measured whitened noise covariance V, or None.
    noise_draws
        Number of proxy draws the noise was averaged over.
    noise_errors
        Standard errors of the noise eigenvalues, or None.
    noise_corrected
        Whether the injected noise is N(0, 2h I − h²V).
    bias_probe
        The default probe of the step's bias
        (:class:`~numpyro_subsample.sgmcmc.bias_probe.BiasProbe`), or None where it did not run.

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Sect. 3 (the centring value); Ahn, Korattikara and
    Welling (2012) (the noise correction).
    """

    potential: Potential
    proxy: Proxy | StructuredProxy | None
    estimator: GradientEstimator
    step_size: float
    noise: float
    centre: jax.Array
    scale_tril: Scale
    seconds: float
    data_passes: float
    params: SamplerParams
    noise_cov: Any = None  # the estimator's whitened noise covariance (NumPy), if measured
    noise_draws: int = 0  # proxy draws that noise (and noise_cov) average
    noise_errors: Any = None  # standard errors of its eigenvalues (NumPy, ascending order)
    noise_corrected: bool = False  # the dynamics inject N(0, 2ch I − h²V)
    bias_probe: Any = None  # sgmcmc.bias_probe.BiasProbe of the step, if it ran


class Whitening(NamedTuple):
    """The proxy and the whitening θ = θ̂ + L w (``init_tril``: the proxy's square root, for
    initial draws; both :data:`~numpyro_subsample.proxies.whitening.Scale`, of one kind);
    ``data_passes`` spent on the proxy."""

    proxy: Proxy | StructuredProxy | None
    centre: jax.Array
    scale_tril: Scale
    init_tril: Scale
    data_passes: float


class SGMCMCConfig(NamedTuple):
    """Static configuration of the compiled step (hashable; equal configs share code)."""

    potential: Potential
    estimate: Callable
    dynamics: Dynamics
    rng_impl: str
    init_strategy: str  # "proxy", "centre"
    precondition_draw: bool  # w is whitened by the proxy (True) or raw θ − θ̂ (False)
    zv_degree: int  # 0: no ZV streaming
    zv_fn: Callable | None
    num_warmup: int  # with zv_degree or adapt_window, else 0
    # a stateful estimator's init_state and update (GradientEstimator), or None
    init_state: Callable | None = None
    update: Callable | None = None
    adapt_window: int = 0  # > 0: the diagonal preconditioner adapts (sgmcmc.adaptation)
    zv_linearised: bool = False  # degree-1 ZV with one linearised covariate per function


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
    the subsample are added to ``data_passes``.
    """
    pot, estimate, dynamics = cfg.potential, cfg.estimate, cfg.dynamics
    inv_n = 1.0 / pot.num_data
    zv_flat = None
    if cfg.zv_degree:
        g_fn = cfg.zv_fn or default_g

        def zv_flat(z, data):
            return flat_fn(lambda zz: g_fn(pot.constrain(zz, data)), z)[0](z)

    def step(state: SGMCMCState, data: ModelData) -> SGMCMCState:
        p = state.params
        key, k_dyn, k_est = split_step_key(state.rng_key, cfg.rng_impl)
        grad_w = whiten_rmatvec(p.scale_tril, state.grad)
        adapt = state.adapt
        if cfg.adapt_window:  # move u = w / s (sgmcmc.adaptation)
            adapt = update_adaptation(adapt, grad_w, state.i, cfg.num_warmup, cfg.adapt_window)
            s = adapt.scale
            u, mom, xi = dynamics.step(k_dyn, state.w / s, state.momentum, state.thermostat,
                                       s * grad_w, p.step_size, p.noise_scale)
            w = s * u
        else:
            w, mom, xi = dynamics.step(k_dyn, state.w, state.momentum, state.thermostat, grad_w,
                                       p.step_size, p.noise_scale)
        first = state.i == 0  # the initial state holds no gradient: evaluate it, do not move
        stay = lambda new, old: jnp.where(first, old, new)  # noqa: E731
        w, mom, xi = stay(w, state.w), stay(mom, state.momentum), stay(xi, state.thermostat)
        theta = p.centre + whiten_matvec(p.scale_tril, w)
        est_state, extra_passes = state.est_state, 0.0
        if cfg.update is None:
            g, n = estimate(p.estimator, k_est, theta, data)
        else:
            g, n, est_state, extra_passes = cfg.update(
                p.estimator, state.est_state, k_est, theta, data
            )
        # distance from the proxy centre in proxy standard deviations (w itself when whitened)
        z_sd = w if cfg.precondition_draw else whiten_solve(p.init_tril, w)
        bad = ~jnp.isfinite(theta) | ~jnp.isfinite(g) | (jnp.abs(z_sd) >= MAX_PROXY_SD)
        healthy = state.fail_step < 0
        ok = healthy & ~jnp.any(bad)
        newly_failed = healthy & ~ok
        keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
        w, mom, xi = keep(w, state.w), keep(mom, state.momentum), keep(xi, state.thermostat)
        grad = keep(-g, state.grad)
        z = jax.tree.map(keep, pot.unravel(theta), state.z)
        if adapt is not None:
            started = init_adaptation(whiten_rmatvec(p.scale_tril, -g))
            adapt = jax.tree.map(keep, jax.tree.map(stay, adapt, started), state.adapt)
        fail_step = jnp.where(newly_failed, state.i + 1, state.fail_step)
        fail_coord = jnp.where(newly_failed, jnp.argmax(bad).astype(jnp.int32), state.fail_coord)
        new = SGMCMCState(
            state.i + 1, z, w, mom, xi, grad, jnp.asarray(n, jnp.int32), ~ok,
            fail_step, fail_coord, state.data_passes + n * inv_n + extra_passes, key, p,
            state.zv_stats, est_state, adapt,
        )
        if zv_flat is not None:  # Baker et al. (2019, Sect. 4), accumulated in the loop
            theta_z = ravel_pytree(new.z)[0]
            if cfg.zv_linearised:  # u = J_g(θ̂) L Lᵀ ŝ (estimators.zv)
                v = whiten_matvec(p.scale_tril, whiten_rmatvec(p.scale_tril, new.grad))
                u = linearised_covariates(
                    lambda th: zv_flat(pot.unravel(th), data).astype(th.dtype), p.centre, v)
            else:
                u = zv_covariates(theta_z, new.grad, cfg.zv_degree)
            gv = zv_flat(new.z, data).astype(theta_z.dtype)
            stats = welford_update(state.zv_stats, u, gv, new.i > cfg.num_warmup)
            new = new._replace(zv_stats=stats)
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
        if init_params is not None:
            theta = ravel_pytree(init_params)[0].astype(centre.dtype)
            w = whiten_solve(tril, theta - centre)
        elif cfg.init_strategy == "proxy":  # θ ~ N(θ̂, Σ̂) of the proxy
            w = draws[0] if cfg.precondition_draw else whiten_matvec(params.init_tril, draws[0])
        else:
            w = jnp.zeros((d,), centre.dtype)
        theta = centre + whiten_matvec(tril, w)
        est_state, extra_passes = None, 0.0
        if cfg.init_state is not None:
            est_state, extra_passes = cfg.init_state(params.estimator, data)
        mom, xi = dynamics.init_momentum(draws[1], w)
        adapt = init_adaptation(jnp.zeros_like(w)) if cfg.adapt_window else None
        stats = None
        if cfg.zv_degree:
            m = jax.eval_shape(zv_flat, pot.unravel(theta), data).shape[0]
            stats = (empty_paired_stats(m, centre.dtype) if cfg.zv_linearised
                     else empty_stats(num_covariates(d, cfg.zv_degree), m, centre.dtype))
        zero = jnp.zeros((), jnp.int32)
        return SGMCMCState(
            zero, pot.unravel(theta), w, mom, xi, jnp.zeros_like(w), zero, jnp.zeros((), bool),
            jnp.full((), -1, jnp.int32), jnp.full((), -1, jnp.int32),
            (params.data_passes + extra_passes).astype(centre.dtype),
            key, params, stats, est_state, adapt,
        )

    return init_one, step


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
