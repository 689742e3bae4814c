"""The shards of :class:`~numpyro_subsample.sgmcmc.distributed.DistributedSGLD` (Ahn,
Shahbaba and Welling 2014): their sizes, frequencies and trajectory lengths (Prop. 1.1,
Cor. 1.2-1.3), and the two-stage selection law (shard s ~ q, then n indices within it,
weights (N_s/n)/q_s, Eq. 1), on one device. The sharded programs are
:mod:`numpyro_subsample.sgmcmc.shards`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.estimators.selection import SamplingDesign, uniform_design

__all__ = ["ShardLayout", "shard_layout", "shard_design", "local_draw", "shard_weights"]


class ShardLayout(NamedTuple):
    """Sizes N_s, row offsets, realised frequencies q_s and trajectory lengths τ_s per shard.

    Parameters
    ----------
    sizes, offsets, frequencies, trajectory_lengths
        N_s, first plate row, realised q_s and τ_s of each shard.

    References
    ----------
    Ahn, Shahbaba and Welling (2014), supplement Prop. 1.1, Cor. 1.2-1.3.
    """

    sizes: np.ndarray
    offsets: np.ndarray
    frequencies: np.ndarray
    trajectory_lengths: np.ndarray

    @property
    def num_shards(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def max_size(self) -> int:
        return int(self.sizes.max())

    @property
    def cycle_length(self) -> int:
        """SGLD steps per chain in one cycle (one MCMC draw): Σ_s τ_s."""
        return int(self.trajectory_lengths.sum())


def shard_layout(
    num_data: int,
    num_shards: int,
    *,
    shard_sizes: Sequence[int] | None = None,
    shard_frequencies: Sequence[float] | None = None,
    trajectory_length: int = 1,
    adaptive: bool = True,
) -> ShardLayout:
    """Shard sizes, frequencies and trajectory lengths (Ahn et al. 2014, Prop. 1.1, Cor. 1.2-1.3).

    ``adaptive=False``: τ_s = ``trajectory_length`` and q_s = 1/S (what a ring scheduler with
    equal trajectories realises). ``adaptive=True``: τ_s = max(1, round(τ̄ S q_s)) with
    τ̄ = ``trajectory_length`` and q_s = ``shard_frequencies`` (default N_s/N); the returned
    frequencies are the realised ones, τ_s / Σ_t τ_t.

    Parameters
    ----------
    num_data, num_shards, shard_sizes, shard_frequencies
        N, S, N_s (default: as equal as possible) and q_s (default N_s/N).
    trajectory_length, adaptive
        τ (fixed, Cor. 1.2) or τ̄ (``adaptive=True``, Cor. 1.3).

    Returns
    -------
    ShardLayout
        The layout.

    References
    ----------
    Ahn et al. (2014), Prop. 1.1.
    """
    S = int(num_shards)
    if S < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}.")
    if shard_sizes is None:
        sizes = np.array([len(a) for a in np.array_split(np.arange(num_data), S)])
    else:
        sizes = np.asarray(shard_sizes, dtype=np.int64)
        if sizes.shape != (S,) or sizes.sum() != num_data or (sizes <= 0).any():
            raise ValueError(
                f"shard_sizes must be {S} positive integers summing to N={num_data}, got "
                f"{list(np.asarray(shard_sizes))}."
            )
    if int(trajectory_length) != trajectory_length or trajectory_length < 1:
        raise ValueError(f"trajectory_length must be an integer >= 1, got {trajectory_length}.")
    if shard_frequencies is None:
        q = sizes / sizes.sum() if adaptive else np.full(S, 1.0 / S)
    else:
        q = np.asarray(shard_frequencies, dtype=np.float64)
        if q.shape != (S,) or not np.all(q > 0) or not np.isclose(q.sum(), 1.0):
            raise ValueError(
                f"shard_frequencies must be {S} positive numbers summing to 1, got "
                f"{list(np.asarray(shard_frequencies))}."
            )
        if not adaptive and not np.allclose(q, 1.0 / S):
            raise ValueError(
                "Non-uniform shard_frequencies need adaptive trajectory lengths: with equal "
                "trajectories every device serves the same number of chains per round, so the "
                "realised frequencies are 1/S. Pass adaptive_trajectory=True (Cor. 1.3, "
                "τ_s = τ̄ S q_s)."
            )
    if adaptive:
        taus = np.maximum(1, np.rint(trajectory_length * S * q)).astype(np.int64)
        q = taus / taus.sum()
    else:
        taus = np.full(S, int(trajectory_length), np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return ShardLayout(sizes=sizes, offsets=offsets, frequencies=q, trajectory_lengths=taus)


# -- selection laws ---------------------------------------------------------------------------
@lru_cache(maxsize=64)
def local_draw(sizes: tuple[int, ...], n: int, replace: bool) -> Callable:
    """``draw((s, weights), key)``: n uniform local indices of shard s, weights ``weights[s]``
    = (N_s/n)/q_s (Eq. 1)."""
    base = tuple(uniform_design(size, n, replace).draw for size in sizes)

    def draw(params, key):
        s, weights = params
        return jax.lax.switch(s, base, weights[s], key)

    return draw


@lru_cache(maxsize=64)
def _two_stage_draw(sizes: tuple[int, ...], n: int, replace: bool) -> Callable:
    local = local_draw(sizes, n, replace)

    def draw(params, key):
        log_q, offsets, weights = params
        k_s, k_i = jax.random.split(key)
        s = jax.random.categorical(k_s, log_q)
        idx, w = local((s, weights), k_i)
        return idx + offsets[s], w

    return draw


def shard_weights(layout: ShardLayout, n: int, dtype) -> jax.Array:
    """(N_s/n)/q_s per shard s: the weight of the n indices drawn in shard s (Eq. 1)."""
    return jnp.asarray(layout.sizes / (n * layout.frequencies), dtype)


def shard_design(layout: ShardLayout, n: int, replace: bool = True, dtype=None) -> SamplingDesign:
    """The two-stage law of Prop. 1.1 on global plate indices: shard s ~ q, then n uniform
    indices within shard s, weights (N_s/n)/q_s, so E[Σ_j w_j h_{i_j}] = Σ_i h_i.

    A single-device reference of what :class:`DistributedSGLD` computes shard-locally.

    Parameters
    ----------
    layout, n, replace, dtype
        The layout, the subsample size in a shard, with replacement or not, the weights' dtype.

    Returns
    -------
    SamplingDesign
        The two-stage law.

    References
    ----------
    Ahn et al. (2014), Eq. 1.
    """
    dtype = dtype or jnp.result_type(float)
    sizes = tuple(int(x) for x in layout.sizes)
    params = (
        jnp.log(jnp.asarray(layout.frequencies, dtype)),
        jnp.asarray(layout.offsets, jnp.int32),
        shard_weights(layout, n, dtype),
    )
    return SamplingDesign(draw=_two_stage_draw(sizes, int(n), bool(replace)), size=int(n),
                          num_data=sum(sizes), params=params)
