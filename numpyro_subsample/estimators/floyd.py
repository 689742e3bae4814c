"""Exact simple random sampling without replacement within strata: Floyd's algorithm
(Bentley and Floyd 1987), for the stratified design of Fu and Zhang (2023, Eq. 10).

The strata are contiguous ranges of a stratum-sorted index array (stratum j owns positions
``starts[j] : starts[j] + sizes[j]``). The per-stratum draw counts b_j are static (host
integers: they fix the shapes); ``sizes`` and ``starts`` may be traced. Both forms have a fixed
cost under jit and vmap, independent of N (no O(N) permutation, no redraw rounds).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DRAW_METHODS", "draw_positions", "resolve_method"]

DRAW_METHODS = ("auto", "loop", "sort")


def _floyd_loop(key, b: np.ndarray, sizes, starts):
    """Floyd's algorithm (Bentley and Floyd 1987), exact simple random sampling without
    replacement of b_j from n_j: for s = 0..b_j−1 with m = n_j − b_j + s, draw t ~ U{0..m};
    take t unless it is already chosen, else take m (which cannot be chosen yet). All strata
    run together in one ``lax.fori_loop`` of static length b_max = max_j b_j (strata with
    smaller b_j ignore the extra slots); the membership test compares t with the ≤ b_max values
    already chosen in its stratum. O(k·b_max²) vector work in b_max iterations.
    """
    k, b_max = b.shape[0], int(b.max())
    top = (jnp.asarray(sizes, jnp.int32) - jnp.asarray(b, jnp.int32))[:, None] + jnp.arange(
        b_max, dtype=jnp.int32
    )
    flat = np.flatnonzero((np.arange(b_max)[None, :] < b[:, None]).ravel())
    base = jnp.asarray(starts, jnp.int32)[:, None]
    t = jax.random.randint(key, (k, b_max), 0, top + 1)

    def body(s, chosen):
        cand = t[:, s]
        taken = jnp.any(chosen == cand[:, None], axis=1)
        return chosen.at[:, s].set(jnp.where(taken, top[:, s], cand))

    chosen = jax.lax.fori_loop(0, b_max, body, jnp.full((k, b_max), -1, jnp.int32))
    return (base + chosen).reshape(-1)[flat]


def _floyd_sorted(key, b: np.ndarray, sizes, starts):
    """The law of Floyd's algorithm without its loop: O(n log n) for n = Σ b_j, two sorts.

    With m_0 = n_j − b_j ("low" values 0..m_0−1, "high" values m_0..n_j−1): in Floyd's
    algorithm a low value enters the sample only as an accepted draw t, and a low t is in the
    sample after its step whether or not it was accepted; so the low part of the sample is the
    set of distinct low values among independent draws t_s ~ U{0..m_0+s}. The sample being a
    uniform b_j-subset, its high part given its low part (size b_j − r) is a uniform r-subset
    of the b_j high values. Hence: draw all t_s at once, keep the first occurrence of every
    distinct low value (one sort of the n global positions), and fill the remaining r_j slots
    with the first r_j entries of a uniform permutation of stratum j's high values (one sort
    by (stratum, 64-bit random key); a tie of two keys, probability < b_j²·2⁻⁶⁵, is the only
    departure from the exact law).
    """
    k, n = b.shape[0], int(b.sum())
    slot = np.repeat(np.arange(k), b)
    first = np.concatenate([[0], np.cumsum(b)[:-1]])
    offset = np.arange(n) - first[slot]
    start_s = jnp.asarray(starts, jnp.int32)[slot]
    low_s = (jnp.asarray(sizes, jnp.int32) - jnp.asarray(b, jnp.int32))[slot]
    first_s = jnp.asarray(first[slot], jnp.int32)
    k_t, k_perm = jax.random.split(key)
    t = jax.random.randint(k_t, (n,), 0, low_s + jnp.asarray(offset, jnp.int32) + 1)
    pos = jnp.sort(start_s + t)
    prev = jnp.concatenate([jnp.full((1,), -1, pos.dtype), pos[:-1]])
    keep = (pos - start_s < low_s) & (pos != prev)
    free = (~keep).astype(jnp.int32)
    before = jnp.cumsum(free) - free
    rank = before - before[first_s]  # rank of a free slot among its stratum's free slots
    bits = jax.random.bits(k_perm, (2, n), jnp.uint32)
    perm = jax.lax.sort(
        (jnp.asarray(slot, jnp.int32), bits[0], bits[1], jnp.asarray(offset, jnp.int32)),
        num_keys=3,
    )[3]  # block j: a uniform permutation of 0..b_j−1
    return jnp.where(keep, pos, start_s + low_s + perm[first_s + rank])


def resolve_method(b: np.ndarray, method: str) -> str:
    """``"auto"``: the loop when its cost model b_max·(1 + 5e-4·k·b_max) is below the sort's
    0.08·n·log₂ n (both in µs on a CPU), else the sort."""
    if method not in DRAW_METHODS:
        raise ValueError(f"draw_method must be one of {DRAW_METHODS}, got {method!r}.")
    if method != "auto":
        return method
    k, b_max, n = b.shape[0], int(b.max()), int(b.sum())
    loop = b_max * (1.0 + 5e-4 * k * b_max)
    return "loop" if loop <= 0.08 * n * np.log2(max(n, 2)) else "sort"


def draw_positions(key, b, sizes, starts, method: str = "auto"):
    """Positions in the stratum-sorted index array (stratum j owns positions
    ``starts[j] : starts[j] + sizes[j]``): a uniform b_j-subset of stratum j's range for every
    j, independently over strata, as a flat (Σ b_j,) array, stratum by stratum.

    ``b`` is static (host integers); ``sizes`` and ``starts`` may be traced. Exact simple
    random sampling without replacement by Floyd's algorithm, as a loop (:func:`_floyd_loop`)
    or loop-free (:func:`_floyd_sorted`); both have a fixed cost under jit and vmap,
    independent of N (no O(N) permutation, no redraw rounds).
    """
    b = np.asarray(b, np.int64)
    if resolve_method(b, method) == "loop":
        return _floyd_loop(key, b, sizes, starts)
    return _floyd_sorted(key, b, sizes, starts)
