"""Full passes over the data in chunks, with memory O(chunk · d + d²), never O(N · d²).

Every function here visits each datum once (one *data pass*), vmapping over a chunk of plate
indices and scanning over chunks. Chunk indices are generated inside the program (an iota per
chunk), the last chunk is padded with index 0 and masked out, and the data enter as an
argument: the compiled program is the same for every N with the same chunk count structure,
and never embeds the data.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from numpyro_subsample.core.potential import ModelData, Potential

__all__ = [
    "DEFAULT_CHUNK",
    "chunk_count",
    "chunk_at",
    "scan_chunks",
    "map_data",
    "FullDataSums",
    "full_data_sums",
    "value_grad_hessian_of",
    "value_grad_hessian",
    "datum_values_and_grads",
]

DEFAULT_CHUNK = 2048


def chunk_count(num_data: int, chunk_size: int) -> tuple[int, int]:
    """``(chunk, num_chunks)``: the chunk length actually used and how many chunks cover N."""
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}.")
    chunk = int(min(chunk_size, num_data))
    return chunk, -(-num_data // chunk)


def chunk_at(c: jax.Array, chunk: int, num_data: int) -> tuple[jax.Array, jax.Array]:
    """Plate indices of chunk ``c`` (padded with 0) and the validity mask."""
    idx = c * chunk + jax.lax.iota(jnp.int32, chunk)
    mask = idx < num_data
    return jnp.where(mask, idx, 0), mask


def scan_chunks(fn: Callable, num_data: int, chunk_size: int, init):
    """Σ over chunks of ``fn(idx, mask)`` (a pytree like ``init``), one data pass."""
    chunk, num_chunks = chunk_count(num_data, chunk_size)

    def body(acc, c):
        idx, mask = chunk_at(c, chunk, num_data)
        return jax.tree.map(jnp.add, acc, fn(idx, mask)), None

    return jax.lax.scan(body, init, jnp.arange(num_chunks, dtype=jnp.int32))[0]


def map_data(fn: Callable, num_data: int, chunk_size: int = DEFAULT_CHUNK):
    """Stack ``fn(idx)`` (a pytree with leading dimension len(idx)) over all N indices."""
    chunk, num_chunks = chunk_count(num_data, chunk_size)
    out = jax.lax.map(
        lambda c: fn(chunk_at(c, chunk, num_data)[0]), jnp.arange(num_chunks, dtype=jnp.int32)
    )
    return jax.tree.map(
        lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])[:num_data], out
    )


class FullDataSums(NamedTuple):
    """What :func:`full_data_sums` returns."""

    value: jax.Array
    grad: jax.Array
    hessian: jax.Array | None
    extra: Any
    prior_value: jax.Array
    prior_grad: jax.Array


def value_grad_hessian_of(fn: Callable, theta: jax.Array, hessian: bool = True):
    """fn(θ), ∇fn(θ) and (optionally) ∇²fn(θ) from one trace of ``fn``: the Hessian's columns
    are the JVPs of the gradient along the basis vectors (forward over reverse, as
    ``jax.hessian``), whose primal outputs are the value and the gradient."""
    value_grad = jax.value_and_grad(fn)
    if not hessian:
        return (*value_grad(theta), None)
    basis = jnp.eye(theta.shape[0], dtype=theta.dtype)
    (v, g), (_, h) = jax.vmap(lambda e: jax.jvp(value_grad, (theta,), (e,)))(basis)
    return v[0], g[0], h


def full_data_sums(
    potential: Potential,
    theta: jax.Array,
    data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
    hessian: bool = True,
    extra: Callable | None = None,
    extra_init=None,
    hessian_if: jax.Array | None = None,
):
    """f(θ), ∇f(θ), ∇²f(θ) (or None) of the full potential and the sum over chunks of
    ``extra(idx, mask)`` (a pytree like ``extra_init``; None without ``extra``), in one data
    pass, with the prior term's f0(θ) and ∇f0(θ) (:class:`FullDataSums`); traced, to be
    called inside a compiled program (:func:`value_grad_hessian`). With ``hessian`` and a
    traced bool ``hessian_if``, the data terms' Hessian is computed only where it is true
    (else its sum is zero): one compiled program serves passes with and without it."""
    d = theta.shape[0]

    def chunk_value(t, idx, mask):
        return jnp.dot(mask.astype(t.dtype), potential.data_terms(t, idx, data))

    def chunk_fn(idx, mask):
        def with_h():
            return value_grad_hessian_of(lambda t: chunk_value(t, idx, mask), theta, hessian)

        if hessian and hessian_if is not None:
            def without_h():
                v, g, _ = value_grad_hessian_of(lambda t: chunk_value(t, idx, mask), theta,
                                                False)
                return v, g, jnp.zeros((d, d), theta.dtype)

            v, g, h = jax.lax.cond(hessian_if, with_h, without_h)
        else:
            v, g, h = with_h()
        h = h if hessian else jnp.zeros((0, 0), theta.dtype)
        return v, g, h, (extra(idx, mask) if extra is not None else None)

    zero_h = jnp.zeros((d, d) if hessian else (0, 0), theta.dtype)
    init = (jnp.zeros((), theta.dtype), jnp.zeros((d,), theta.dtype), zero_h,
            extra_init if extra is not None else None)
    v, g, h, more = scan_chunks(chunk_fn, potential.num_data, chunk_size, init)
    v0, g0, h0 = value_grad_hessian_of(lambda t: potential.prior(t, data), theta, hessian)
    return FullDataSums(value=v + v0, grad=g + g0, hessian=h + h0 if hessian else None, extra=more,
                        prior_value=v0, prior_grad=g0)


@partial(jax.jit, static_argnames=("potential", "chunk_size", "hessian"))
def value_grad_hessian(
    potential: Potential,
    theta: jax.Array,
    data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
    hessian: bool = True,
):
    """f(θ), ∇f(θ) and (optionally) ∇²f(θ) of the full potential, in one data pass."""
    return full_data_sums(potential, theta, data, chunk_size, hessian)[:3]


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def datum_values_and_grads(
    potential: Potential, theta: jax.Array, data: ModelData, chunk_size: int = DEFAULT_CHUNK
) -> tuple[jax.Array, jax.Array]:
    """Per-datum f_i(θ) (N,) and ∇f_i(θ) (N, d), one data pass."""

    def one(i):
        return jax.value_and_grad(lambda t: potential.data_terms(t, i[None], data)[0])(theta)

    return map_data(jax.vmap(one), potential.num_data, chunk_size)
