"""Selection laws: how the subsample S of plate indices is drawn, and how it is reweighted.

A :class:`SamplingDesign` draws ``(idx, weights)`` such that, for any per-datum quantity h_i,
E[Σ_j weights_j · h_{idx_j}] = Σ_{i=1}^N h_i. All estimators of the package are this sum
applied to control-variate residuals (see :mod:`numpyro_subsample.estimators.base`), so a new
selection law is a new design, nothing else.

A design may also state its second moments (:class:`DesignMoments`): the covariance of that
sum for any h, as a function of the design's arrays. The exact noise of every estimator built
on the design follows from it in one chunked data pass
(:mod:`numpyro_subsample.estimators.noise`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from numpyro_subsample.core.data import device_array

__all__ = ["DesignMoments", "SamplingDesign", "first_occurrences", "sample_without_replacement",
           "uniform_design"]


class DesignMoments(NamedTuple):
    """The second moments of a design: for any per-datum vectors h_i,

        Cov[Σ_j w_j h_{i_j}] = Σ_i a_i h_i h_iᵀ − Σ_g c_g H_g H_gᵀ,    H_g = Σ_{i∈g} h_i,

    over a partition of the data into groups g. ``datum_weight`` a: a scalar or (N,);
    ``group_weight`` c: a scalar (one group, ``labels=None``) or (G,) with ``labels`` the (N,)
    group of every datum in 0..G−1.
    """

    datum_weight: jax.Array
    group_weight: jax.Array
    labels: jax.Array | None = None


class SamplingDesign(NamedTuple):
    """``draw(params, key) -> (idx (n,), weights (n,))`` with n = ``size`` fixed (static).

    ``moments(params) -> DesignMoments``: the design's second moments, or None if unknown
    (the noise is then measured by Monte Carlo).

    Parameters
    ----------
    draw
        ``draw(params, key) -> (idx, weights)``.
    size
        n.
    num_data
        N.
    params
        The arrays ``draw`` reads.
    moments
        ``moments(params)``, or None.

    References
    ----------
    Putcha, Nemeth and Fearnhead (2023), Eq. 3 and 8 (uniform and preferential laws); Fu and
    Zhang (2023), Eq. 10 (stratified).
    """

    draw: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]
    size: int
    num_data: int
    params: Any = None
    moments: Callable[[Any], DesignMoments] | None = None


def sample_without_replacement(key: jax.Array, population: int, n: int) -> jax.Array:
    """n distinct indices, uniformly distributed over the n-subsets of range(population).

    Draw n indices with replacement, then redraw every repeated one (keeping the first
    occurrence) until all are distinct. The procedure commutes with any relabelling of the
    population, so the final set is a uniform n-subset. Each round costs O(n log n) (a sort);
    for n ≪ N almost always one or two rounds, never an O(N) permutation.

    Parameters
    ----------
    key
        JAX random key.
    population
        Size of the population.
    n
        Number of indices, at most ``population``.

    Returns
    -------
    jax.Array
        n distinct integer indices.

    References
    ----------
    Knuth (1997), Sect. 3.4.2 (random sampling; here by redrawing repeats).
    """
    if n > population:
        raise ValueError(f"Cannot draw {n} distinct indices from {population}.")

    def duplicated(idx):
        return ~first_occurrences(idx)

    def body(carry):
        key, idx, dup = carry
        key, sub = jax.random.split(key)
        idx = jnp.where(dup, jax.random.randint(sub, (n,), 0, population), idx)
        return key, idx, duplicated(idx)

    key, sub = jax.random.split(key)
    idx = jax.random.randint(sub, (n,), 0, population)
    _, idx, _ = jax.lax.while_loop(lambda c: jnp.any(c[2]), body, (key, idx, duplicated(idx)))
    return idx


@lru_cache(maxsize=256)
def _uniform_draw(num_data: int, n: int, replace: bool) -> Callable:
    def draw(weight, key):
        if replace:
            idx = jax.random.randint(key, (n,), 0, num_data)
        else:
            idx = sample_without_replacement(key, num_data, n)
        return idx, jnp.broadcast_to(weight, (n,))

    return draw


@lru_cache(maxsize=256)
def _uniform_moments(num_data: int, n: int, replace: bool) -> Callable:
    """Simple random sampling of n from N with weight w (≈ N/n): with replacement,
    Cov = n w² [(1/N) Σ h hᵀ − h̄ h̄ᵀ]; without, times (N − n)/(N − 1) (the finite-population
    correction, Cochran 1977, Thm 2.2)."""
    N = num_data
    fpc = 1.0 if replace else (N - n) / (N - 1) if N > 1 else 0.0

    def moments(weight):
        a = weight * weight * (n * fpc / N)
        return DesignMoments(datum_weight=a, group_weight=a / N)

    return moments


def uniform_design(num_data: int, n: int, replace: bool = True, dtype=None) -> SamplingDesign:
    """Simple random sampling, weights N/n (Putcha et al. 2023, Eq. 3), with or without
    replacement.

    Parameters
    ----------
    num_data
        N.
    n
        Subsample size.
    replace
        With replacement (default) or without.
    dtype
        Float dtype of the weights.

    Returns
    -------
    SamplingDesign
        The uniform law with weights N/n.

    References
    ----------
    Putcha, Nemeth and Fearnhead (2023), Eq. 3; Welling and Teh (2011).
    """
    if not 1 <= int(n) <= int(num_data):
        raise ValueError(
            f"The subsample size must be between 1 and N={num_data}, got {n!r}."
        )
    dtype = dtype or jnp.result_type(float)
    weight = device_array(num_data / n, jnp.dtype(dtype))
    key = (int(num_data), int(n), bool(replace))
    return SamplingDesign(draw=_uniform_draw(*key), size=int(n), num_data=int(num_data),
                          params=weight, moments=_uniform_moments(*key))


def first_occurrences(idx: jax.Array) -> jax.Array:
    """Boolean mask (n,): True at the first occurrence of each value of ``idx``."""
    order = jnp.argsort(idx, stable=True)
    s = idx[order]
    first_sorted = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    return jnp.zeros(idx.shape, bool).at[order].set(first_sorted)

