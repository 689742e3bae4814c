"""Lanczos with full reorthogonalisation for a symmetric operator given by matrix-vector products
(Golub and Van Loan 2013, Sect. 10.1): all m Ritz pairs and their residual norms."""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["LanczosResult", "lanczos_eigh"]


class LanczosResult(NamedTuple):
    """The Ritz pairs of m-step Lanczos, largest first.

    ``ritz_values`` (m,), ``ritz_vectors`` (d, m) orthonormal and ``ritz_residuals`` (m,) the
    norms ‖A v_j − μ_j v_j‖ = β_m |s_{m,j}| (Golub and Van Loan 2013, Sect. 10.1): Lanczos
    converges at both ends of the spectrum, so small residuals mark the largest and the
    smallest eigenpairs found. ``eigenvalues`` (k,), ``eigenvectors`` (d, k) and ``residuals``
    (k,) are the top k of them.
    """

    eigenvalues: jax.Array
    eigenvectors: jax.Array
    residuals: jax.Array
    ritz_values: jax.Array
    ritz_vectors: jax.Array
    ritz_residuals: jax.Array


@partial(jax.jit, static_argnames=("matvec", "dim", "k", "num_iter", "dtype"))
def lanczos_eigh(
    matvec: Any,
    operand: Any,
    rng_key: jax.Array,
    dim: int,
    k: int,
    num_iter: int | None = None,
    dtype: Any = None,
) -> LanczosResult:
    """Ritz pairs of a symmetric operator by m-step Lanczos with full reorthogonalisation.

    ``matvec(operand, v)`` returns A v; it must be hashable (a module-level function or a
    NamedTuple like :class:`~numpyro_subsample.proxies.curvature.CurvatureOperator`): it is a
    static argument, and the arrays (data, θ) enter through ``operand``, an argument of the
    compiled program. m = ``num_iter`` (default k + 10) matvecs, capped at ``dim``; every new
    Lanczos vector is orthogonalised twice against all previous ones (classical Gram-Schmidt
    twice), memory O(m·d). At a breakdown (an invariant subspace found, β_j ≈ 0) the next
    vector is a random one orthogonal to the previous ones, with β_j = 0. The Ritz pairs of
    the m × m tridiagonal matrix T = QᵀAQ are returned, all m and the top k
    (:class:`LanczosResult`; Golub and Van Loan 2013, Sect. 10.1).
    """
    if not 1 <= k <= dim:
        raise ValueError(f"k must be between 1 and dim={dim}, got {k!r}.")
    m = min(int(num_iter if num_iter is not None else k + 10), dim)
    if m < k:
        raise ValueError(f"num_iter must be at least k={k}, got {num_iter!r}.")
    dtype = dtype or jnp.zeros(()).dtype
    eps = jnp.finfo(dtype).eps
    key0, key_restart = jax.random.split(rng_key)
    q0 = jax.random.normal(key0, (dim,), dtype)

    def orthogonalise(Q, w):
        for _ in range(2):
            w = w - Q.T @ (Q @ w)
        return w

    def body(j, carry):
        Q, alpha, beta, q, scale = carry
        Q = Q.at[j].set(q)
        w = matvec(operand, q).astype(dtype)
        a = jnp.dot(q, w)
        w = orthogonalise(Q, w)
        b = jnp.linalg.norm(w)
        scale = jnp.maximum(scale, jnp.abs(a) + b + beta[jnp.maximum(j - 1, 0)])
        broken = b <= 100 * eps * scale
        r = orthogonalise(Q, jax.random.normal(jax.random.fold_in(key_restart, j), (dim,), dtype))
        q_next = jnp.where(broken, r / jnp.linalg.norm(r), w / jnp.where(broken, 1, b))
        return Q, alpha.at[j].set(a), beta.at[j].set(jnp.where(broken, 0, b)), q_next, scale

    init = (
        jnp.zeros((m, dim), dtype), jnp.zeros((m,), dtype), jnp.zeros((m,), dtype),
        q0 / jnp.linalg.norm(q0), jnp.zeros((), dtype),
    )
    Q, alpha, beta, _, _ = jax.lax.fori_loop(0, m, body, init)
    T = jnp.diag(alpha) + jnp.diag(beta[:-1], 1) + jnp.diag(beta[:-1], -1)
    vals, S = jnp.linalg.eigh(T)
    vals, S = vals[::-1], S[:, ::-1]
    residuals = jnp.abs(beta[-1] * S[-1, :])
    vecs = Q.T @ S
    return LanczosResult(eigenvalues=vals[:k], eigenvectors=vecs[:, :k], residuals=residuals[:k],
                         ritz_values=vals, ritz_vectors=vecs, ritz_residuals=residuals)
