"""O(n) draws from a fixed law on the data: Walker's alias table, and the with-replacement
importance design it gives (Putcha, Nemeth and Fearnhead 2023, Eq. 8).

n i.i.d. indices cost O(n) per step with the alias table (Walker 1977, Vose 1991), built
once on the host; its arrays are the design's ``params``. Every drawn term is reweighted by
1/(n p_i), p the law the table realises, so that the weighted sum is unbiased.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.estimators.selection import DesignMoments, SamplingDesign

__all__ = [
    "AliasTable",
    "build_alias_table",
    "alias_draw",
    "alias_design",
    "importance_moments",
]


class AliasTable(NamedTuple):
    """Alias table (Walker 1977, Vose 1991) of a law on {0..N−1}.

    ``threshold[j]``: probability of keeping column j (else take ``alias[j]``); ``probs``: the
    law the table *realises*, recomputed from the stored float32 thresholds so that the
    importance weights 1/(n p_i) match the draws exactly.
    """

    threshold: jax.Array
    alias: jax.Array
    probs: jax.Array


def build_alias_table(p: np.ndarray) -> AliasTable:
    """Vose's O(N) construction, in NumPy on the host (once per data set).

    An alias table rather than a float32 CDF with ``searchsorted``: a float32 CDF cannot
    resolve probabilities below ~1e-7 of the total, which at N ~ 10^6 would drop or double
    data and bias the estimator, whereas the law realised by the table is recomputed exactly.
    """
    p = np.asarray(p, np.float64)
    N = p.shape[0]
    if p.ndim != 1 or N == 0 or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError(
            f"The selection weights must be a non-empty, finite, non-negative vector; got "
            f"shape {p.shape}. Pass N finite weights, not all zero."
        )
    scaled = p * (N / p.sum())
    threshold = np.ones(N)
    alias = np.arange(N)
    small = list(np.flatnonzero(scaled < 1.0))
    large = list(np.flatnonzero(scaled >= 1.0))
    while small and large:
        s, g = small.pop(), large.pop()
        threshold[s] = scaled[s]
        alias[s] = g
        scaled[g] = (scaled[g] + scaled[s]) - 1.0
        (small if scaled[g] < 1.0 else large).append(g)
    # leftovers are 1 up to round-off
    thr32 = threshold.astype(np.float32)
    realised = thr32.astype(np.float64).copy()
    np.add.at(realised, alias, 1.0 - thr32.astype(np.float64))
    realised /= N
    return AliasTable(
        threshold=jnp.asarray(thr32), alias=jnp.asarray(alias, jnp.int32),
        probs=jnp.asarray(realised, jnp.float32),
    )


def alias_draw(table: AliasTable, key: jax.Array, n: int) -> jax.Array:
    """n i.i.d. indices from the table's law, O(n): a uniform column, then keep or alias."""
    N = table.threshold.shape[0]
    k_col, k_u = jax.random.split(key)
    col = jax.random.randint(k_col, (n,), 0, N)
    u = jax.random.uniform(k_u, (n,), jnp.float32)
    return jnp.where(u < table.threshold[col], col, table.alias[col])


@lru_cache(maxsize=256)
def _alias_draw(n: int, dtype: np.dtype) -> Callable:
    def draw(table: AliasTable, key: jax.Array):
        idx = alias_draw(table, key, n)
        return idx, (1.0 / (n * table.probs[idx])).astype(dtype)

    return draw


def importance_moments(probs: jax.Array, n: int) -> DesignMoments:
    """Second moments of n i.i.d. draws from p with weights 1/(n p_i):
    Cov = (1/n)[Σ_i h_i h_iᵀ/p_i − H Hᵀ], H = Σ_i h_i (Putcha et al. 2023, Appendix A.2, as a
    matrix); a datum with p_i = 0 is never drawn and contributes nothing."""
    a = jnp.where(probs > 0, 1.0 / (n * jnp.where(probs > 0, probs, 1.0)), 0.0)
    return DesignMoments(datum_weight=a, group_weight=jnp.asarray(1.0 / n, a.dtype))


@lru_cache(maxsize=256)
def _alias_moments(n: int) -> Callable:
    def moments(table: AliasTable) -> DesignMoments:
        return importance_moments(table.probs, n)

    return moments


def alias_design(table: AliasTable, n: int, dtype=None) -> SamplingDesign:
    """With-replacement design from an alias table, weights 1/(n p_i) (Putcha et al. 2023,
    Eq. 8); the table is the design's ``params``."""
    if int(n) < 1:
        raise ValueError(f"The subsample size must be a positive integer, got {n!r}.")
    dtype = np.dtype(dtype or jnp.result_type(float))
    return SamplingDesign(
        draw=_alias_draw(int(n), dtype), size=int(n), num_data=int(table.threshold.shape[0]),
        params=table, moments=_alias_moments(int(n)),
    )
