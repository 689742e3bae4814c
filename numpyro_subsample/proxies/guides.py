"""Guides of the variational proxy: the default autoguide and a guide's moments.

An ``AutoContinuous`` guide flattens the latent sites in model order,
:class:`~numpyro_subsample.core.potential.Potential` by name; :func:`guide_moments` permutes
the guide's moments by the map read off ``guide._unpack_latent``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.distributions.distribution import validation_enabled
from numpyro.infer.autoguide import (
    AutoContinuous,
    AutoDiagonalNormal,
    AutoGuide,
    AutoLowRankMultivariateNormal,
    AutoMultivariateNormal,
)
from numpyro.infer.initialization import init_to_median, init_to_value

from numpyro_subsample.core.potential import ModelData, Potential

__all__ = [
    "autoguide_params", "default_guide", "gaussian_sampler", "guide_moments", "MAX_FULL_RANK_DIM",
]

MAX_FULL_RANK_DIM = 200


def default_guide(
    model: Callable,
    dim: int,
    *,
    max_full_rank_dim: int = MAX_FULL_RANK_DIM,
    init_values: dict | None = None,
    init_loc_fn: Callable | None = None,
):
    """``AutoMultivariateNormal`` for d ≤ ``max_full_rank_dim``, else low-rank (rank ≈ √d).

    The guide's mean starts at ``init_values`` (constrained site values) or by the init
    strategy ``init_loc_fn``; default: the prior median.
    """
    if init_loc_fn is None:
        init_loc_fn = init_to_median(num_samples=15) if init_values is None else init_to_value(
            values=init_values
        )
    cls = AutoMultivariateNormal if dim <= max_full_rank_dim else AutoLowRankMultivariateNormal
    return cls(model, init_loc_fn=init_loc_fn)


def _init_at_potential_start(site: dict, *, potential: Potential):
    """Init strategy: the potential's starting point (prior mean) for its latent sites."""
    if site["type"] == "sample" and not site["is_observed"] and site["name"] in (
        potential.latent_sites
    ):
        z = potential.unravel(potential.init_theta)[site["name"]]
        return biject_to(site["fn"].support)(z)
    return init_to_median(site, num_samples=15)


@lru_cache(maxsize=8)
def _cached_default_guide(potential: Potential, max_full_rank_dim: int):
    """One default guide per potential, so that compiled SVI programs are reused on refits."""
    init = partial(_init_at_potential_start, potential=potential)
    return default_guide(
        potential.model, potential.dim, max_full_rank_dim=max_full_rank_dim, init_loc_fn=init
    )


@lru_cache(maxsize=8)
def _cached_mean_field_guide(potential: Potential):
    """One ``AutoDiagonalNormal`` per potential (compiled SVI programs reused on refits)."""
    return AutoDiagonalNormal(potential.model,
                              init_loc_fn=partial(_init_at_potential_start, potential=potential))


def _setup_guide(guide: Callable, key: jax.Array, data: ModelData) -> None:
    """Build an autoguide's prototype eagerly, once, so that it never holds tracers; with
    NumPyro's argument validation off, as in the compiled fit (at concrete float32 values a
    product such as LDA's θ β can fail the simplex check by rounding)."""
    if isinstance(guide, AutoGuide) and guide.prototype_trace is None:
        args, kwargs = data.args_kwargs()
        with handlers.block(), validation_enabled(False):
            handlers.seed(guide, key)(*args, **kwargs)



# -- moments of the fitted guide ---------------------------------------------------------------
def _guide_permutation(potential: Potential, guide: AutoContinuous) -> np.ndarray:
    """perm with θ_potential[k] = x_guide[perm[k]] (the guide's flat order vs ravel_pytree)."""
    d = potential.dim
    unpacked = guide._unpack_latent(jnp.arange(d, dtype=jnp.float32))
    expected = potential.unravel(jnp.zeros(d))
    if set(unpacked) != set(expected) or any(
        jnp.shape(unpacked[k]) != jnp.shape(expected[k]) for k in expected
    ):
        raise ValueError(
            f"The guide's latent sites {sorted(unpacked)} do not match the model's "
            f"{sorted(expected)} (names and shapes); pass a guide built for this model."
        )
    flat, _ = ravel_pytree({k: unpacked[k] for k in expected})
    return np.asarray(flat).round().astype(np.int64)


@partial(jax.jit, static_argnames=("guide", "num"))
def _sample_auto(guide, params, perm, key, num):
    """``num`` draws of an ``AutoContinuous`` guide, in the potential's flat order."""
    lat = handlers.substitute(handlers.seed(guide._sample_latent, key), data=params)(
        sample_shape=(num,)
    )
    return lat[:, perm]


@partial(jax.jit, static_argnames=("potential", "guide", "num"))
def _sample_guide(potential, guide, params, key, num, data):
    """``num`` draws of any guide, unconstrained with the model's supports, flattened."""
    args, kwargs = data.args_kwargs()
    tr = handlers.trace(handlers.seed(potential.model, jax.random.PRNGKey(0))).get_trace(
        *args, **kwargs
    )
    supports = {k: tr[k]["fn"].support for k in potential.latent_sites}

    def one(k):
        gtr = handlers.trace(
            handlers.substitute(handlers.seed(guide, k), data=params)
        ).get_trace(*args, **kwargs)
        return ravel_pytree({s: biject_to(supports[s]).inv(gtr[s]["value"]) for s in supports})[0]

    return jax.vmap(one)(jax.random.split(key, num))


def guide_moments(
    potential: Potential,
    data: ModelData,
    guide: Callable,
    params: dict,
    *,
    rng_key: jax.Array | None = None,
    num_samples: int = 4000,
) -> tuple[jax.Array, jax.Array, bool, Callable[[jax.Array, int], jax.Array]]:
    """Mean and covariance of the guide in the potential's flat unconstrained space.

    Returns ``(mean, cov, gaussian, sample)``, where ``sample(key, S) -> (S, d)`` draws from
    the guide in that space. Gaussian autoguides (``AutoMultivariateNormal``,
    ``AutoLowRankMultivariateNormal``, ``AutoDiagonalNormal``) give exact moments; any other
    guide is sampled ``num_samples`` times (each site unconstrained with the model's support).
    """
    rng_key = jax.random.PRNGKey(1) if rng_key is None else rng_key
    _setup_guide(guide, jax.random.PRNGKey(0), data)
    d = potential.dim
    if isinstance(guide, AutoContinuous):
        perm = _guide_permutation(potential, guide)
        sample = partial(_sample_auto, guide, params, jnp.asarray(perm))
        try:
            post = guide.get_posterior(params)
        except (NotImplementedError, AssertionError, TypeError):
            post = None
        if post is not None and hasattr(post, "covariance_matrix"):
            mean, cov = post.mean, post.covariance_matrix
            return mean[perm], cov[np.ix_(perm, perm)], True, sample
        if post is not None and hasattr(post, "scale") and jnp.shape(post.loc) == (d,):
            mean, cov = post.mean, jnp.diag(post.scale**2)
            return mean[perm], cov[np.ix_(perm, perm)], True, sample
    else:
        sample = partial(_sample_guide, potential, guide, params, data=data)
    draws = sample(rng_key, num_samples)
    mean = draws.mean(0)
    cov = jnp.cov(draws, rowvar=False).reshape(d, d)
    return mean, cov, False, sample


# -- the default Gaussian fit as an autoguide ----------------------------------------------------
@partial(jax.jit, static_argnames=("num",))
def _sample_gaussian(mean, tril, key, num):
    """``num`` draws of N(mean, L Lᵀ) in the potential's flat order."""
    return mean + jax.random.normal(key, (num, mean.shape[0]), mean.dtype) @ tril.T


def gaussian_sampler(mean: jax.Array, tril: jax.Array) -> Callable[[jax.Array, int], jax.Array]:
    """``sample(key, S) -> (S, d)``: draws of N(mean, L Lᵀ)."""
    return partial(_sample_gaussian, mean, tril)


def guide_order(potential: Potential) -> np.ndarray:
    """order with x_guide[j] = θ_potential[order[j]] for an ``AutoContinuous`` guide of the
    potential's model, which flattens the latent sites in model order
    (``potential.latent_sites``), the potential by name."""
    positions = potential.unravel(jnp.arange(potential.dim, dtype=jnp.float32))
    return np.concatenate([np.asarray(positions[name]).ravel().round().astype(np.int64)
                           for name in potential.latent_sites])


def autoguide_params(potential: Potential, guide: AutoMultivariateNormal, mean: np.ndarray,
                     cov: np.ndarray) -> dict:
    """Parameters of ``guide``, an ``AutoMultivariateNormal`` of the potential's model, whose
    distribution is N(mean, cov) in the potential's flat order (:func:`guide_order`). The
    guide is not set up here (that traces and compiles the model); :func:`guide_moments`
    checks the order against the set-up guide when the parameters are used."""
    order = guide_order(potential)
    cov_g = np.asarray(cov, np.float64)[np.ix_(order, order)]
    dtype = potential.init_theta.dtype
    return {f"{guide.prefix}_loc": jnp.asarray(np.asarray(mean)[order], dtype),
            f"{guide.prefix}_scale_tril": jnp.asarray(np.linalg.cholesky(cov_g), dtype)}
