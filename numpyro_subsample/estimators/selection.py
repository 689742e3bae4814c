"""Selection laws: how the subsample S of plate indices is drawn, and how it is reweighted.

A :class:`SamplingDesign` draws ``(idx, weights)`` such that, for any per-datum quantity h_i,
E[Σ_j weights_j · h_{idx_j}] = Σ_{i=1}^N h_i. All estimators of the package are this sum
applied to control-variate residuals (see :mod:`numpyro_subsample.estimators.base`), so a new
selection law is a new design, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["SamplingDesign", "uniform_design", "sample_without_replacement"]


class SamplingDesign(NamedTuple):
    """``draw(params, key) -> (idx (n,), weights (n,))`` with n = ``size`` fixed (static)."""

    draw: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]
    size: int
    num_data: int
    params: Any = None


def sample_without_replacement(key: jax.Array, population: int, n: int) -> jax.Array:
    """n distinct indices, uniformly distributed over the n-subsets of range(population).

    Draw n indices with replacement, then redraw every repeated one (keeping the first
    occurrence) until all are distinct. The procedure commutes with any relabelling of the
    population, so the final set is a uniform n-subset. Each round costs O(n log n) (a sort);
    for n ≪ N almost always one or two rounds, never an O(N) permutation.
    """
    if n > population:
        raise ValueError(f"Cannot draw {n} distinct indices from {population}.")

    def duplicated(idx):
        order = jnp.argsort(idx, stable=True)
        s = idx[order]
        dup_sorted = jnp.concatenate([jnp.zeros((1,), bool), s[1:] == s[:-1]])
        return jnp.zeros((n,), bool).at[order].set(dup_sorted)

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


def uniform_design(num_data: int, n: int, replace: bool = True, dtype=None) -> SamplingDesign:
    """Simple random sampling, weights N/n (Putcha et al. 2023, Eq. 3)."""
    if not 1 <= int(n) <= int(num_data):
        raise ValueError(
            f"The subsample size must be between 1 and N={num_data}, got {n!r}."
        )
    dtype = dtype or jnp.result_type(float)
    weight = jnp.asarray(np.asarray(num_data / n, dtype=jnp.dtype(dtype)))
    draw = _uniform_draw(int(num_data), int(n), bool(replace))
    return SamplingDesign(draw, int(n), int(num_data), weight)
