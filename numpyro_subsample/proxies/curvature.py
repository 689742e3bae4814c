"""Curvature of a potential streamed over the data in chunks (memory O(chunk·d), no d × d array).

Hessian- and empirical-Fisher-vector products, the exact diagonal of the Hessian (d
Hessian-vector products per datum in one pass) or a Hutchinson estimate of it, the empirical
Fisher's diagonal, and :class:`CurvatureOperator`, the Jacobi-scaled curvature as a matvec for
:func:`~numpyro_subsample.proxies.lanczos.lanczos_eigh`. Every function is one data pass
(:mod:`~numpyro_subsample.core.datapass`) except the prior's diagonal, which needs none.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, scan_chunks
from numpyro_subsample.core.potential import ModelData, Potential

__all__ = [
    "CurvatureOperator",
    "hessian_vector_product",
    "fisher_vector_product",
    "hessian_diagonal",
    "hutchinson_diagonal",
    "fisher_diagonal",
    "prior_hessian_diagonal",
]

CURVATURES = ("hessian", "fisher")


def _chunk_value(potential: Potential, data: ModelData, idx, mask, t):
    return jnp.dot(mask.astype(t.dtype), potential.data_terms(t, idx, data))


def _probe_blocks(lin_fn, d: int, dtype, block: int, num_blocks: int, key=None) -> jax.Array:
    """Σ over ``num_blocks`` blocks of ``block`` probe vectors z of z ⊙ (lin_fn z): unit
    vectors e_j (``key`` None; the diagonal, exactly) or Rademacher vectors (Hutchinson)."""

    def one(b):
        if key is None:
            rows = b * block + jnp.arange(block)
            z = (rows[:, None] == jnp.arange(d)[None, :]).astype(dtype)
        else:
            z = jax.random.rademacher(jax.random.fold_in(key, b), (block, d), dtype)
        return jnp.sum(jax.vmap(lin_fn)(z) * z, axis=0 if key is not None else 1)

    out = jax.lax.map(one, jnp.arange(num_blocks))
    return jnp.sum(out, 0) if key is not None else out.reshape(-1)[:d]


@partial(jax.jit, static_argnames=("potential", "curvature", "with_prior", "chunk_size"))
def _curvature_product(potential, curvature, with_prior, chunk_size, theta, v, data):
    """C v, one data pass: C the data terms' Hessian (forward-over-reverse) or empirical
    Fisher Σ_i ∇f_i ∇f_iᵀ (a JVP then its transpose per chunk, no chunk × d Jacobian), plus
    the prior's Hessian if ``with_prior``."""

    def chunk_fn(idx, mask):
        if curvature == "hessian":
            grad = jax.grad(partial(_chunk_value, potential, data, idx, mask))
            return jax.jvp(grad, (theta,), (v,))[1]
        fvec = lambda t: mask.astype(t.dtype) * potential.data_terms(t, idx, data)  # noqa: E731
        _, lin = jax.linearize(fvec, theta)
        return jax.linear_transpose(lin, theta)(lin(v))[0]

    cv = scan_chunks(chunk_fn, potential.num_data, chunk_size, jnp.zeros_like(theta))
    if not with_prior:
        return cv
    prior = jax.grad(lambda t: potential.prior(t, data))
    return cv + jax.jvp(prior, (theta,), (v,))[1]


def hessian_vector_product(potential: Potential, theta: jax.Array, v: jax.Array,
                           data: ModelData, chunk_size: int = DEFAULT_CHUNK) -> jax.Array:
    """∇²f(θ) v of the full potential (prior and data), forward-over-reverse, one data pass."""
    return _curvature_product(potential, "hessian", True, int(chunk_size), theta, v, data)


def fisher_vector_product(potential: Potential, theta: jax.Array, v: jax.Array,
                          data: ModelData, chunk_size: int = DEFAULT_CHUNK) -> jax.Array:
    """Σ_i ∇f_i(θ) (∇f_i(θ)ᵀ v), the empirical Fisher of the data terms (no prior) times v;
    one data pass."""
    return _curvature_product(potential, "fisher", False, int(chunk_size), theta, v, data)


def _check_block(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or (
        block_size < 1
    ):
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}.")
    return int(block_size)


def hessian_diagonal(potential: Potential, theta: jax.Array, data: ModelData,
                     chunk_size: int = DEFAULT_CHUNK, block_size: int = 16) -> jax.Array:
    """The exact diagonal of ∇²f(θ) (prior and data), one data pass.

    Per chunk, the gradient of the chunk's sum is linearised once and its JVPs along the unit
    vectors e_j, ``block_size`` at a time (vmapped), give e_jᵀ∇²f e_j: the cost is that of d
    Hessian-vector products (about 4d gradients) per datum, the memory O(block_size · chunk)
    model evaluations; no d × d array is formed. The prior's part is
    :func:`prior_hessian_diagonal`.
    """
    block = min(_check_block(block_size), potential.dim)
    return _hessian_diagonal(potential, theta, data, chunk_size, block) + prior_hessian_diagonal(
        potential, theta, data, block
    )


@partial(jax.jit, static_argnames=("potential", "chunk_size", "block"))
def _hessian_diagonal(potential, theta, data, chunk_size, block):
    d = theta.shape[0]

    def chunk_fn(idx, mask):
        grad = jax.grad(partial(_chunk_value, potential, data, idx, mask))
        lin = jax.linearize(grad, theta)[1]
        return _probe_blocks(lin, d, theta.dtype, block, -(-d // block))

    return scan_chunks(chunk_fn, potential.num_data, chunk_size, jnp.zeros_like(theta))


def hutchinson_diagonal(
    potential: Potential,
    theta: jax.Array,
    data: ModelData,
    rng_key: jax.Array,
    num_probes: int = 64,
    chunk_size: int = DEFAULT_CHUNK,
    block_size: int = 16,
) -> jax.Array:
    """Unbiased estimate of the diagonal of ∇²f(θ)'s data part, one data pass, plus the
    prior's exact diagonal.

    (1/M) Σ_m z_m ⊙ ∇²f z_m with Rademacher probes (Bekas, Kokiopoulou and Saad 2007);
    M = ``num_probes`` rounded up to a multiple of ``block_size``, the same probes for every
    chunk. Entry i has variance Σ_{j≠i} H_ij² / M: cheaper than :func:`hessian_diagonal`
    when M ≪ d, but poor for strongly correlated parameters, and an entry can come out
    negative.
    """
    if isinstance(num_probes, bool) or not isinstance(num_probes, (int, np.integer)) or (
        num_probes < 1
    ):
        raise ValueError(f"num_probes must be a positive integer, got {num_probes!r}.")
    block = min(_check_block(block_size), int(num_probes))
    num_blocks = -(-int(num_probes) // block)
    est = _hutchinson(potential, theta, data, rng_key, chunk_size, block, num_blocks)
    d_block = min(block, potential.dim)
    return est / (block * num_blocks) + prior_hessian_diagonal(potential, theta, data, d_block)


@partial(jax.jit, static_argnames=("potential", "chunk_size", "block", "num_blocks"))
def _hutchinson(potential, theta, data, key, chunk_size, block, num_blocks):
    d = theta.shape[0]

    def chunk_fn(idx, mask):
        grad = jax.grad(partial(_chunk_value, potential, data, idx, mask))
        lin = jax.linearize(grad, theta)[1]
        return _probe_blocks(lin, d, theta.dtype, block, num_blocks, key)

    return scan_chunks(chunk_fn, potential.num_data, chunk_size, jnp.zeros_like(theta))


def prior_hessian_diagonal(
    potential: Potential, theta: jax.Array, data: ModelData, block_size: int = 16
) -> jax.Array:
    """The exact diagonal of ∇²f0(θ), the prior term's Hessian (no data pass; d prior HVPs)."""
    block = min(_check_block(block_size), potential.dim)
    return _prior_hessian_diagonal(potential, theta, data, block)


@partial(jax.jit, static_argnames=("potential", "block"))
def _prior_hessian_diagonal(potential, theta, data, block):
    d = theta.shape[0]
    lin = jax.linearize(jax.grad(lambda t: potential.prior(t, data)), theta)[1]
    return _probe_blocks(lin, d, theta.dtype, block, -(-d // block))


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def fisher_diagonal(
    potential: Potential,
    theta: jax.Array,
    data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[jax.Array, jax.Array]:
    """``(Σ_i ∇f_i(θ)², Σ_i ∇f_i(θ))``: the exact diagonal of the empirical Fisher of the data
    terms (no prior) and the sum of the per-datum gradients, one data pass (per-datum
    gradients of one chunk at a time, memory O(chunk · d))."""

    def one(i):
        return jax.grad(lambda t: potential.data_terms(t, i[None], data)[0])(theta)

    def chunk_fn(idx, mask):
        g = jax.vmap(one)(idx) * mask.astype(theta.dtype)[:, None]
        return jnp.sum(g**2, 0), jnp.sum(g, 0)

    zero = jnp.zeros_like(theta)
    return scan_chunks(chunk_fn, potential.num_data, chunk_size, (zero, zero))


class CurvatureOperator(NamedTuple):
    """The scaled curvature v ↦ σ ⊙ C(θ)(σ ⊙ v) as a hashable matvec for
    :func:`~numpyro_subsample.proxies.lanczos.lanczos_eigh`, with ``operand = (theta, data,
    sigma)``; one data pass per product.

    C is the Hessian ∇²f (``curvature="hessian"``) or the empirical Fisher of the data plus
    the prior's Hessian (``"fisher"``).
    """

    potential: Potential
    curvature: str = "hessian"
    chunk_size: int = DEFAULT_CHUNK

    def __call__(self, operand, v: jax.Array) -> jax.Array:
        theta, data, sigma = operand
        cu = _curvature_product(self.potential, self.curvature, True, self.chunk_size, theta,
                                sigma * v, data)
        return sigma * cu
