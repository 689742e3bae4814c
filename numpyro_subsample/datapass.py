"""Full passes over the data in chunks, with memory O(chunk · d + d²), never O(N · d²).

Every function here visits each datum once (one *data pass*), vmapping over a chunk of plate
indices and scanning over chunks. The last chunk is padded with index 0 and masked out.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .potential import Potential

__all__ = [
    "chunk_indices",
    "value_grad_hessian",
    "datum_values_and_grads",
    "map_data",
]

DEFAULT_CHUNK = 2048


def chunk_indices(num_data: int, chunk_size: int) -> tuple[jax.Array, jax.Array]:
    """Plate indices as a (num_chunks, chunk) array and the matching validity mask."""
    chunk = int(min(chunk_size, num_data))
    num_chunks = -(-num_data // chunk)
    flat = np.arange(num_chunks * chunk)
    mask = flat < num_data
    flat = np.where(mask, flat, 0)
    return jnp.asarray(flat.reshape(num_chunks, chunk), jnp.int32), jnp.asarray(
        mask.reshape(num_chunks, chunk)
    )


def _sum_over_chunks(fn: Callable, num_data: int, chunk_size: int, init):
    idx, mask = chunk_indices(num_data, chunk_size)

    def body(acc, xs):
        out = fn(*xs)
        return jax.tree.map(jnp.add, acc, out), None

    return jax.lax.scan(body, init, (idx, mask))[0]


def value_grad_hessian(
    potential: Potential, theta: jax.Array, chunk_size: int = DEFAULT_CHUNK, hessian: bool = True
):
    """f(θ), ∇f(θ) and (optionally) ∇²f(θ) of the full potential, in one data pass."""
    d = theta.shape[0]
    f0_fn = potential.prior

    def chunk_value(t, idx, mask):
        return jnp.dot(mask.astype(t.dtype), potential.data_terms(t, idx))

    def chunk_fn(idx, mask):
        v, g = jax.value_and_grad(chunk_value)(theta, idx, mask)
        h = jax.hessian(chunk_value)(theta, idx, mask) if hessian else jnp.zeros((0, 0))
        return v, g, h

    zero_h = jnp.zeros((d, d), theta.dtype) if hessian else jnp.zeros((0, 0), theta.dtype)
    init = (jnp.zeros((), theta.dtype), jnp.zeros((d,), theta.dtype), zero_h)
    v, g, h = _sum_over_chunks(chunk_fn, potential.num_data, chunk_size, init)
    v0, g0 = jax.value_and_grad(f0_fn)(theta)
    out_h = h + jax.hessian(f0_fn)(theta) if hessian else None
    return v + v0, g + g0, out_h


def map_data(fn: Callable, num_data: int, chunk_size: int = DEFAULT_CHUNK):
    """Stack ``fn(idx)`` (a pytree with leading dimension len(idx)) over all N indices."""
    idx, _ = chunk_indices(num_data, chunk_size)
    out = jax.lax.map(fn, idx)
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:])[:num_data], out)


def datum_values_and_grads(
    potential: Potential, theta: jax.Array, chunk_size: int = DEFAULT_CHUNK
) -> tuple[jax.Array, jax.Array]:
    """Per-datum f_i(θ) (N,) and ∇f_i(θ) (N, d), one data pass."""

    def one(i):
        return jax.value_and_grad(lambda t: potential.data_terms(t, i[None])[0])(theta)

    return map_data(jax.vmap(one), potential.num_data, chunk_size)
