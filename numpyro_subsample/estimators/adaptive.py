"""Adaptive subsample size: ASGLD-CV and ASGLD-CV-PS (Putcha, Nemeth and Fearnhead 2023,
Sect. 3.3, Algorithm 2).

Under Lipschitz gradients (Assumption 1, ||∇f_i(θ) − ∇f_i(θ')|| ≤ L_i ||θ − θ'||) the
pseudo-variance of the control-variate estimator (Eq. 12; Eq. 5 is p_i = 1/N) is bounded by

    V(g̃) ≤ (1/n) ||θ − θ̂||² Σ_i L_i² / p_i                                   (Eq. 18)

so keeping it below a threshold V0 needs n > ||θ − θ̂||² Σ_i L_i²/p_i / V0 (Eq. 19). At each
step the estimator picks the smallest such n_t, clipped to [n_min, n_max].

It wraps a fixed-size ``"cv"`` or ``"cv-preferential"`` estimator built at n_max
(:func:`adaptive_size`; ``configure_estimator(..., adaptive=True)``). Compute really shrinks
with n_t: the estimator is compiled for a few *bucketed* sizes (powers of two from n_min, plus
n_max; static, so they are part of the cache key of the compiled function) and ``lax.switch``
runs only the smallest bucket ≥ n_t, so a step evaluates about n_t data terms. The bucket size
is what the estimator reports as n (the kernel's ``subsample_size`` field and data passes).
Under ``vmap`` (``chain_method="vectorized"``) ``lax.switch`` with a batched index becomes a
select that runs every bucket: use ``"sequential"`` or ``"parallel"`` chains for the saving.

Lipschitz constants: :mod:`numpyro_subsample.estimators.lipschitz`.

V0: a user value; ``"pilot"`` (default), the recipe of Sect. 5.3.3 automated — a short pilot run
of the fixed-n (n_max) chain, r² = the 95th percentile of ||θ − θ̂||² along it, and
V0 = r² Σ_i L_i²/p_i / n_max (the bound Eq. 18 at that distance) — or ``"proxy"``: the same
with r² from draws of the proxy N(θ̂, Σ̂) (no data cost).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from blackjax.sgmcmc import diffusions

from numpyro_subsample.core.datapass import DEFAULT_CHUNK
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.alias import alias_design
from numpyro_subsample.estimators.base import (
    ControlVariate,
    EstimatorMoments,
    GradientEstimator,
    control_variate_from_proxy,
    weighted_gradient,
)
from numpyro_subsample.estimators.lipschitz import lipschitz_constants
from numpyro_subsample.estimators.noise import whitened_noise
from numpyro_subsample.estimators.selection import uniform_design
from numpyro_subsample.proxies.whitening import proxy_scale, whiten_matvec, whiten_rmatvec

__all__ = [
    "ADAPTIVE_NAMES",
    "AdaptiveOptions",
    "AdaptiveParams",
    "adaptive_options",
    "adaptive_size",
    "bucket_sizes",
    "pilot_step_size",
    "pilot_v0",
]

#: the configurations with a control variate, which Eq. 18-19 need
ADAPTIVE_NAMES = ("cv", "cv-preferential")


class AdaptiveOptions(NamedTuple):
    """The options of the adaptive subsample size (keyword arguments of ``adaptive=True``).

    ``v0``: the pseudo-variance threshold V0 > 0, ``"pilot"`` or ``"proxy"`` (module
    docstring). ``lipschitz``: N constants L_i, ``"auto"`` or ``"autodiff"``
    (:func:`~numpyro_subsample.estimators.lipschitz.lipschitz_constants`);
    ``lipschitz_radius``: R of its Poisson bound. ``n_min`` (default max(1, n_max // 64)) and
    ``n_max`` (default the subsample size): the range of n_t. ``pilot_chains``,
    ``pilot_steps``, ``pilot_quantile``: the V0 pilot run; ``max_variance_inflation``: δ of
    its step size.
    """

    v0: float | str = "pilot"
    lipschitz: Any = "auto"
    lipschitz_radius: float | None = None
    n_min: int | None = None
    n_max: int | None = None
    pilot_chains: int = 4
    pilot_steps: int = 200
    pilot_quantile: float = 0.95
    max_variance_inflation: float = 0.05


class AdaptiveParams(NamedTuple):
    """The arrays of an adaptive estimator: the design params of every bucket, the control
    variate, and S / V0 with S = Σ_i L_i²/p_i."""

    designs: tuple
    cv: ControlVariate
    scale: jax.Array


def _positive_int(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def adaptive_options(
    name: str, potential: Potential, subsample_size: int, base_options: dict, **options: Any
) -> AdaptiveOptions:
    """Validate an ``adaptive=True`` request (cheap checks, before any data pass) and return
    its options with ``n_min`` and ``n_max`` resolved."""
    if name not in ADAPTIVE_NAMES:
        raise ValueError(
            "adaptive=True needs a control variate (Putcha et al. 2023, Eq. 18-19); "
            f"estimator={name!r} has none. Use estimator='cv' or 'cv-preferential'."
        )
    unknown = sorted(set(options) - set(AdaptiveOptions._fields))
    if unknown:
        raise ValueError(
            f"Unknown adaptive option(s) {unknown}; valid: {sorted(AdaptiveOptions._fields)}."
        )
    opts = AdaptiveOptions(**options)
    weights = base_options.get("weights", "approx")
    if isinstance(weights, str) and weights == "exact":
        raise ValueError("adaptive=True works with static weights; drop weights='exact'.")
    N = potential.num_data
    n_max = _positive_int("n_max", opts.n_max or subsample_size)
    if n_max > N:
        raise ValueError(f"n_max must be in [1, N={N}], got {n_max}.")
    n_min = _positive_int("n_min", opts.n_min or max(1, n_max // 64))
    if n_min > n_max:
        raise ValueError(f"n_min must be in [1, n_max={n_max}], got {n_min}.")
    v0 = opts.v0
    if isinstance(v0, str):
        if v0 not in ("pilot", "proxy"):
            raise ValueError(f"v0 must be a positive number, 'pilot' or 'proxy'; got {v0!r}.")
    elif not (isinstance(v0, (int, float, np.number)) and math.isfinite(v0) and v0 > 0):
        raise ValueError(f"v0 must be a positive number, 'pilot' or 'proxy'; got {v0!r}.")
    L = opts.lipschitz
    if isinstance(L, str):
        if L not in ("auto", "autodiff"):
            raise ValueError(f"lipschitz must be 'auto', 'autodiff' or an array, got {L!r}.")
    else:
        L = np.asarray(L, np.float64)
        if L.shape != (N,) or not np.all(np.isfinite(L)) or np.any(L < 0):
            raise ValueError(
                f"lipschitz must be 'auto', 'autodiff' or N={N} finite non-negative "
                f"constants; got shape {L.shape}."
            )
    _positive_int("pilot_chains", opts.pilot_chains)
    _positive_int("pilot_steps", opts.pilot_steps)
    if not 0 < opts.pilot_quantile <= 1:
        raise ValueError(f"pilot_quantile must be in (0, 1], got {opts.pilot_quantile!r}.")
    if not (np.isfinite(opts.max_variance_inflation) and opts.max_variance_inflation > 0):
        raise ValueError(
            f"max_variance_inflation must be > 0, got {opts.max_variance_inflation!r}."
        )
    return opts._replace(n_min=n_min, n_max=n_max, lipschitz=L)


def bucket_sizes(n_min: int, n_max: int) -> tuple[int, ...]:
    """Powers of two in [n_min, n_max), then n_max: the compiled subsample sizes."""
    b = 1
    while b < n_min:
        b *= 2
    sizes = [n_min] if n_min < b else []
    while b < n_max:
        sizes.append(b)
        b *= 2
    sizes.append(n_max)
    return tuple(sorted(set(sizes)))


def _bucket(params: AdaptiveParams, theta: jax.Array, sizes: tuple[int, ...]) -> jax.Array:
    """Index of n_t = the smallest bucket ≥ ||θ − θ̂||² S / V0 (Eq. 19), clipped."""
    need = jnp.sum((theta - params.cv.centre) ** 2) * params.scale
    k = jnp.sum(jnp.asarray(np.asarray(sizes), need.dtype) < need)
    return jnp.clip(k, 0, len(sizes) - 1)


def _adaptive_cv(params: AdaptiveParams) -> ControlVariate:
    return params.cv


@lru_cache(maxsize=64)
def _adaptive_moments(moments: tuple, sizes: tuple[int, ...]) -> Callable:
    """The second moments of the bucket that :func:`_adaptive_estimate` runs at θ, so the
    exact noise at θ is that of the adaptive estimator there (n = n_t(θ))."""

    def design(params: AdaptiveParams, theta, data):
        branches = [lambda ds, j=j: moments[j](ds[j]) for j in range(len(sizes))]
        return jax.lax.switch(_bucket(params, theta, sizes), branches, params.designs)

    return design


@lru_cache(maxsize=64)
def _adaptive_estimate(potential: Potential, draws: tuple, sizes: tuple[int, ...]) -> Callable:
    """Algorithm 2: n_t = the smallest bucket ≥ ||θ − θ̂||² S / V0 (Eq. 19); one ``lax.switch``
    branch per bucket, each evaluating only its own size."""
    sizes_arr = np.asarray(sizes, np.int32)

    def estimate(params: AdaptiveParams, key, theta, data):
        k = _bucket(params, theta, sizes)

        def branch(j, key):
            idx, w = draws[j](params.designs[j], key)
            return weighted_gradient(potential, theta, idx, w, data, params.cv)

        g = jax.lax.switch(k, [partial(branch, j) for j in range(len(sizes))], key)
        return g, jnp.asarray(sizes_arr)[k]

    return estimate


# -- the V0 pilot -------------------------------------------------------------------------------
_LANGEVIN = diffusions.overdamped_langevin()


def pilot_step_size(noise: float, max_variance_inflation: float = 0.05) -> float:
    """h = 2δ / (v + 1 + δ): the Langevin time step (BlackJAX's ``step_size``) that inflates the
    stationary variance of a whitened Gaussian target by at most 1 + δ under gradient noise of
    variance v (the rule of :mod:`numpyro_subsample.sgmcmc.stepsize`)."""
    delta = float(max_variance_inflation)
    return 2.0 * delta / (max(float(noise), 0.0) + 1.0 + delta)


@partial(jax.jit, static_argnames=("estimate", "num_steps"))
def _pilot_sq_distances(estimate, params, centre, tril, w0, keys, data, step_size, num_steps):
    """||θ_t − θ̂||² along SGLD chains in whitened coordinates (one row per chain)."""

    def chain(w, key):
        k0, ks = jax.random.split(key)
        g0, _ = estimate(params, k0, centre + whiten_matvec(tril, w), data)

        def step(carry, k):
            w, grad = carry
            k_dyn, k_est = jax.random.split(k)
            w = _LANGEVIN(k_dyn, w, whiten_rmatvec(tril, grad), step_size)
            theta = centre + whiten_matvec(tril, w)
            g, _ = estimate(params, k_est, theta, data)
            return (w, -g), jnp.sum((theta - centre) ** 2)

        return jax.lax.scan(step, (w, -g0), jax.random.split(ks, num_steps))[1]

    return jax.vmap(chain)(w0, keys)


def pilot_v0(
    fixed: GradientEstimator,
    data: ModelData,
    proxy,
    sum_l2_over_p: float,
    rng_key: jax.Array,
    *,
    num_chains: int = 4,
    num_steps: int = 200,
    quantile: float = 0.95,
    max_variance_inflation: float = 0.05,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[float, dict]:
    """V0 by the recipe of Putcha et al. (2023, Sect. 5.3.3), automated.

    Runs ``num_chains`` short SGLD chains (BlackJAX's overdamped Langevin in whitened
    coordinates, started at proxy draws, step :func:`pilot_step_size` from the exact noise of
    :func:`~numpyro_subsample.estimators.noise.whitened_noise`) with the fixed-n estimator,
    takes the ``quantile`` of ||θ − θ̂||² over the chains' draws and returns the bound Eq. 18
    there: V0 = r² S / n_max. Costs the noise's passes plus
    num_chains · (num_steps + 1) · n_max / N data passes.
    """
    centre, tril = proxy.centre, proxy_scale(proxy)
    k_noise, k_init, k_run = jax.random.split(rng_key, 3)
    noise = whitened_noise(fixed, centre, tril, k_noise, data, chunk_size=chunk_size)
    h = pilot_step_size(noise.largest, max_variance_inflation)
    w0 = jax.random.normal(k_init, (num_chains, centre.shape[0]), centre.dtype)
    dist2 = _pilot_sq_distances(
        fixed.estimate, fixed.params, centre, tril, w0, jax.random.split(k_run, num_chains),
        data, jnp.asarray(h, centre.dtype), int(num_steps),
    )
    dist2 = np.asarray(dist2, np.float64)
    if not np.all(np.isfinite(dist2)):
        raise ValueError("The V0 pilot chain diverged; pass v0=<number> or v0='proxy'.")
    r2 = float(np.quantile(dist2, quantile))
    passes = noise.data_passes + num_chains * (num_steps + 1) * fixed.subsample_size / (
        fixed.num_data)
    return r2 * sum_l2_over_p / fixed.subsample_size, {
        "pilot_step_size": h, "pilot_r2": r2, "pilot_data_passes": passes,
    }


# -- the wrapper --------------------------------------------------------------------------------
def _base_design(base: GradientEstimator, num_data: int, replace: bool, dtype) -> tuple:
    """``(p_i, design of size n)`` of ``base``: its alias table (``"cv-preferential"``) or
    uniform."""
    table = (base.info or {}).get("alias_table")
    if base.name == "cv-preferential":
        if table is None:
            raise ValueError("adaptive=True works with static weights; drop weights='exact'.")
        return np.asarray(table.probs, np.float64), partial(alias_design, table, dtype=dtype)
    return (np.full(num_data, 1.0 / num_data),
            partial(uniform_design, num_data, replace=replace, dtype=dtype))


def _noise_level(base: GradientEstimator, data: ModelData, proxy, S: float, rng_key: jax.Array,
                 options: AdaptiveOptions, chunk_size: int) -> tuple[float, dict, float]:
    """``(v0, facts for info, data passes)`` of the size rule: from pilot chains
    (:func:`pilot_v0`), from the proxy's spread (a quantile of |θ − θ̂|² over 4096 of its
    draws, times S / n_max) or as given."""
    if options.v0 == "pilot":
        v0, facts = pilot_v0(
            base, data, proxy, S, rng_key, num_chains=options.pilot_chains,
            num_steps=options.pilot_steps, quantile=options.pilot_quantile,
            max_variance_inflation=options.max_variance_inflation, chunk_size=chunk_size,
        )
        return v0, facts, facts["pilot_data_passes"]
    if options.v0 == "proxy":
        w = jax.random.normal(rng_key, (4096, proxy.centre.shape[0]), proxy.centre.dtype)
        offsets = whiten_matvec(proxy_scale(proxy), w)
        r2 = float(np.quantile(np.sum(np.asarray(offsets) ** 2, -1), options.pilot_quantile))
        return r2 * S / options.n_max, {"proxy_r2": r2}, 0.0
    return float(options.v0), {}, 0.0


def adaptive_size(
    base: GradientEstimator,
    potential: Potential,
    data: ModelData,
    proxy,
    options: AdaptiveOptions,
    *,
    replace: bool = True,
    rng_key: jax.Array | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> GradientEstimator:
    """ASGLD-CV (``base.name == "cv"``) or ASGLD-CV-PS (``"cv-preferential"``), Putcha et al.
    (2023, Algorithm 2), around a fixed-size estimator ``base`` built at ``options.n_max``.

    ``options`` comes from :func:`adaptive_options`. ``info``: the base estimator's, plus
    ``v0``, ``sum_l2_over_p``, ``lipschitz`` (how the L_i were obtained),
    ``lipschitz_constants``, ``bucket_sizes``, ``n_min``, ``n_max``, the pilot's facts,
    ``seconds`` and ``data_passes`` (all preprocessing). Its second moments are those of the
    bucket it runs at θ, so its exact noise (:mod:`numpyro_subsample.estimators.noise`) is the
    noise at n = n_t(θ).
    """
    t0 = time.perf_counter()
    if proxy is None:
        raise ValueError("adaptive=True needs a proxy (its centre θ̂ and ∇f_i(θ̂)).")
    if base.name not in ADAPTIVE_NAMES or base.subsample_size != options.n_max:
        raise ValueError(
            f"adaptive_size wraps a 'cv' or 'cv-preferential' estimator of size n_max="
            f"{options.n_max}; got {base.name!r} of size {base.subsample_size}."
        )
    k_pilot = jax.random.PRNGKey(0) if rng_key is None else rng_key
    N = potential.num_data
    dtype = potential.init_theta.dtype
    info = dict(base.info or {})
    passes = float(base.data_passes)
    probs, design = _base_design(base, N, replace, dtype)
    if isinstance(options.lipschitz, str):
        L, kind = lipschitz_constants(
            potential, data, proxy, method=options.lipschitz, radius=options.lipschitz_radius,
            chunk_size=chunk_size,
        )
        passes += 1.0 if kind.startswith("closed") else 9.0  # θ̂ + 8 points
    else:
        L, kind = np.asarray(options.lipschitz, np.float64), "user"
    S = float(np.sum(L**2 / probs))
    if not (np.isfinite(S) and S > 0):
        raise ValueError("Σ L_i²/p_i is zero or not finite; check the Lipschitz constants.")
    n_max = options.n_max
    v0, facts, pilot_passes = _noise_level(base, data, proxy, S, k_pilot, options, chunk_size)
    info.update(facts)
    passes += pilot_passes
    sizes = bucket_sizes(options.n_min, n_max)
    designs = [design(b) for b in sizes]
    params = AdaptiveParams(
        designs=tuple(d.params for d in designs), cv=control_variate_from_proxy(proxy),
        scale=jnp.asarray(S / v0, dtype),
    )
    estimate = _adaptive_estimate(potential, tuple(d.draw for d in designs), sizes)
    moments = EstimatorMoments(
        potential=potential, design=_adaptive_moments(tuple(d.moments for d in designs), sizes),
        control_variate=_adaptive_cv,
    )
    info.update({
        "adaptive": True, "v0": v0, "sum_l2_over_p": S, "lipschitz": kind,
        "lipschitz_constants": L, "bucket_sizes": sizes, "n_min": options.n_min,
        "n_max": n_max, "seconds": info.get("seconds", 0.0) + time.perf_counter() - t0,
        "data_passes": passes,
    })
    return GradientEstimator(
        estimate=estimate, params=params, name="adaptive-" + base.name, subsample_size=n_max,
        num_data=N, data_passes=passes, info=info, moments=moments,
    )
