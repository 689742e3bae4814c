"""Matrix-free proxies of the posterior: a centre θ̂ and a structured covariance Σ̂ = P⁻¹.

For models with many parameters the dense proxy of :mod:`.laplace` (a d × d Hessian, its
inverse and Cholesky factor) costs O(d²) memory and O(d³) time. Here the precision is

    P = diag(D) + U diag(s) Uᵀ,    U ∈ R^{d×k} with orthonormal columns, k ≥ 0,

(:class:`StructuredCovariance`; k = 0 is a diagonal proxy), every operation the samplers need
costs O(d·k), and the curvature it is built from is streamed over the data in chunks with
memory O(chunk·d + d·k) (:mod:`~numpyro_subsample.core.datapass`): the exact diagonal of the
Hessian or of the empirical Fisher, Hessian- and Fisher-vector products, and Lanczos with full
reorthogonalisation for the leading eigenpairs (Golub and Van Loan 2013, Sect. 10.1).

Square root. Let B = D^{-1/2} U and B diag(s) Bᵀ = W diag(γ) Wᵀ (thin QR B = QR, eigh of
the k × k matrix R diag(s) Rᵀ = E diag(γ) Eᵀ, W = QE with orthonormal columns). Then
P = D^{1/2} (I + W Γ Wᵀ) D^{1/2}, positive definite iff D > 0 and γ > −1, and any function of
I + WΓWᵀ acts as 1 on the complement of W and as (1 + γ_j) on its columns, so

    Σ̂ = D^{-1/2} (I + W diag((1 + γ)⁻¹ − 1) Wᵀ) D^{-1/2},
    L  = D^{-1/2} (I + W diag((1 + γ)^{-1/2} − 1) Wᵀ),    L Lᵀ = Σ̂,
    L⁻¹ = (I + W diag((1 + γ)^{1/2} − 1) Wᵀ) D^{1/2},
    log det Σ̂ = −Σ log D − Σ log(1 + γ).

L is not triangular (the dense proxy's Cholesky factor is); θ = θ̂ + L w, Lᵀ∇f and
θ̂ + L ξ ~ N(θ̂, Σ̂) need only a square root of Σ̂.

The fit (:func:`fit_structured`) finds the mode with Adam on minibatches (as :mod:`.laplace`)
and then L-BFGS on full-data passes (Nocedal and Wright 2006, Alg. 7.5; Optax with a zoom line
search), in coordinates scaled by the Fisher diagonal at the start, and builds P from the
curvature C (the Hessian, or the empirical Fisher plus the prior's Hessian) at the mode:

* ``structure="diagonal"``: P = diag(δ), δ the diagonal of C floored (see below);
* ``structure="low-rank"``: with C̃ = δ^{-1/2} C δ^{-1/2} (unit diagonal when nothing is
  floored), Lanczos gives its top-k eigenpairs (μ_j, v_j), and
  P = δ^{1/2} (c I + V diag(μ − c) Vᵀ) δ^{1/2}: exact on span(V), c on the complement, where
  ``complement="trace"`` takes c = (tr C̃ − Σ_j μ_j)/(d − k), the mean of the discarded
  eigenvalues, which minimises KL(N(θ̂, P⁻¹) ‖ N(θ̂, C⁻¹)) over c for exact eigenvectors (as
  the noise variance of probabilistic PCA, Tipping and Bishop 1999), and
  ``complement="next"`` the (k+1)-th Ritz value, so that the whitened curvature LᵀCL is at
  most about 1 on the complement (the assumption of the step-size rules). With converged
  Ritz pairs both are exact (P = C) if the d − k discarded eigenvalues are equal, e.g. for
  k = d − 1; k = 0 is the diagonal proxy.

Curvature floors (never requiring a positive definite Hessian): a diagonal entry h_i is raised
to τ_i = p_i, the prior's Hessian diagonal, where p_i > 0 (in the Gauss-Newton view the data's
curvature is ≥ 0, so this only replaces negative data curvature by 0), else to
``curvature_floor`` · max_j max(h_j, p_j); the eigenvalues μ_j and c of the scaled matrix
are raised to max(``curvature_floor``, min_i p_i⁺/δ_i), a lower bound of the scaled curvature
of a diagonal prior. The counts are in ``info["clipped"]``.

``curvature="gauss-newton"`` is not offered: a potential exposes only the per-datum terms
f_i(θ), not the model's outputs and the likelihood's curvature in them that the generalised
Gauss-Newton matrix needs. The empirical Fisher Σ_i ∇f_i ∇f_iᵀ is positive semi-definite
but only approximates the Hessian for a well-specified model near the mode (Kunstner, Hennig
and Balles 2019).
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from numpyro_subsample.core.datapass import (
    DEFAULT_CHUNK,
    chunk_count,
    datum_values_and_grads,
    scan_chunks,
    value_grad_hessian,
)
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.checks import MAX_DECREMENT, prior_grad, warn_proxy
from numpyro_subsample.proxies.laplace import _adam_phase

__all__ = [
    "StructuredCovariance",
    "StructuredProxy",
    "LanczosResult",
    "CurvatureOperator",
    "structured_covariance",
    "scale_matvec",
    "scale_rmatvec",
    "scale_solve",
    "cov_matvec",
    "precision_matvec",
    "logdet",
    "diag_cov",
    "to_dense",
    "Scale",
    "is_structured",
    "proxy_scale",
    "identity_scale",
    "whiten_matvec",
    "whiten_rmatvec",
    "whiten_solve",
    "cov_norm_bound",
    "hessian_vector_product",
    "fisher_vector_product",
    "hessian_diagonal",
    "hutchinson_diagonal",
    "fisher_diagonal",
    "prior_hessian_diagonal",
    "lanczos_eigh",
    "fit_structured",
]

STRUCTURES = ("diagonal", "low-rank")
CURVATURES = ("hessian", "fisher")
DIAGONALS = ("exact", "hutchinson")
COMPLEMENTS = ("trace", "next")


# ---------------------------------------------------------------------------------------------
# The covariance operator
# ---------------------------------------------------------------------------------------------


class StructuredCovariance(NamedTuple):
    """Σ̂ = P⁻¹ with P = diag(D) + U diag(s) Uᵀ (module docstring), built by
    :func:`structured_covariance`.

    ``diag`` D (d,) > 0, ``basis`` U (d, k) with orthonormal columns, ``coef`` s (k,);
    ``white_basis`` W (d, k) and ``white_eig`` γ (k,) > −1 with D^{-1/2} U diag(s) Uᵀ D^{-1/2}
    = W diag(γ) Wᵀ, from which every operation is O(d·k).
    """

    diag: jax.Array
    basis: jax.Array
    coef: jax.Array
    white_basis: jax.Array
    white_eig: jax.Array


def _concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def structured_covariance(
    diag: jax.Array, basis: jax.Array | None = None, coef: jax.Array | None = None
) -> StructuredCovariance:
    """The covariance with precision diag(``diag``) + ``basis`` diag(``coef``) ``basis``ᵀ.

    O(d·k²) (a thin QR and a k × k eigendecomposition). ``basis`` (d, k) must have orthonormal
    columns; ``None`` (or k = 0) gives the diagonal case. Raises ``ValueError`` naming the
    argument for wrong shapes and, for concrete arrays, for ``diag`` not positive and finite,
    ``basis`` not orthonormal or a precision that is not positive definite.
    """
    diag = jnp.asarray(diag)
    if diag.ndim != 1 or diag.shape[0] < 1:
        raise ValueError(f"diag must be a non-empty vector (d,), got shape {diag.shape}.")
    d, dtype = diag.shape[0], diag.dtype
    basis = jnp.zeros((d, 0), dtype) if basis is None else jnp.asarray(basis, dtype)
    coef = jnp.zeros((basis.shape[-1],), dtype) if coef is None else jnp.asarray(coef, dtype)
    if basis.ndim != 2 or basis.shape[0] != d or basis.shape[1] > d:
        raise ValueError(f"basis must have shape (d, k) with d={d}, k ≤ d, got {basis.shape}.")
    k = basis.shape[1]
    if coef.shape != (k,):
        raise ValueError(f"coef must have shape ({k},) (one per basis column), got {coef.shape}.")
    if _concrete(diag) and not bool(jnp.all(jnp.isfinite(diag) & (diag > 0))):
        raise ValueError(f"diag must be positive and finite; its minimum is {float(diag.min())}.")
    if _concrete(basis) and k:
        err = float(jnp.max(jnp.abs(basis.T @ basis - jnp.eye(k, dtype=dtype))))
        if not err <= 1e-3:
            raise ValueError(f"basis must have orthonormal columns; max |UᵀU − I| = {err:.3g}.")
    if k == 0:
        return StructuredCovariance(diag, basis, coef, basis, coef)
    q, r = jnp.linalg.qr(basis / jnp.sqrt(diag)[:, None])
    gamma, e = jnp.linalg.eigh(r @ (coef[:, None] * r.T))
    op = StructuredCovariance(diag, basis, coef, q @ e, gamma)
    if _concrete(coef) and not bool(jnp.all(1 + gamma > 0)):
        raise ValueError(
            "coef makes the precision diag(D) + U diag(s) Uᵀ not positive definite (smallest "
            f"eigenvalue of D^(-1/2) P D^(-1/2) is {float(1 + gamma.min()):.3g})."
        )
    return op


def _from_whitened(diag: jax.Array, white_basis: jax.Array, white_eig: jax.Array):
    """The covariance with P = D^{1/2}(I + W diag(γ) Wᵀ)D^{1/2}, W orthonormal (its U, s by a
    thin QR of D^{1/2} W and a k × k eigendecomposition)."""
    if white_basis.shape[1] == 0:
        return StructuredCovariance(diag, white_basis, white_eig, white_basis, white_eig)
    q, r = jnp.linalg.qr(jnp.sqrt(diag)[:, None] * white_basis)
    s, e = jnp.linalg.eigh(r @ (white_eig[:, None] * r.T))
    return StructuredCovariance(diag, q @ e, s, white_basis, white_eig)


def _inner(op: StructuredCovariance, x: jax.Array, power: float) -> jax.Array:
    """(I + WΓWᵀ)^power x, for x of shape (..., d)."""
    w = op.white_basis
    return x + ((x @ w) * ((1 + op.white_eig) ** power - 1)) @ w.T


def scale_matvec(op: StructuredCovariance, w: jax.Array) -> jax.Array:
    """L w with L = D^{-1/2}(I + WΓWᵀ)^{-1/2}, L Lᵀ = Σ̂; O(d·k), w of shape (..., d)."""
    return _inner(op, w, -0.5) / jnp.sqrt(op.diag)


def scale_rmatvec(op: StructuredCovariance, g: jax.Array) -> jax.Array:
    """Lᵀ g (the whitened gradient); O(d·k)."""
    return _inner(op, g / jnp.sqrt(op.diag), -0.5)


def scale_solve(op: StructuredCovariance, x: jax.Array) -> jax.Array:
    """L⁻¹ x = (I + WΓWᵀ)^{1/2} D^{1/2} x (whitened coordinates of an offset); O(d·k)."""
    return _inner(op, x * jnp.sqrt(op.diag), 0.5)


def cov_matvec(op: StructuredCovariance, x: jax.Array) -> jax.Array:
    """Σ̂ x = P⁻¹ x (solves P y = x); O(d·k)."""
    r = 1 / jnp.sqrt(op.diag)
    return _inner(op, x * r, -1.0) * r


def precision_matvec(op: StructuredCovariance, x: jax.Array) -> jax.Array:
    """P x = D x + U (s ⊙ Uᵀx); O(d·k)."""
    return op.diag * x + ((x @ op.basis) * op.coef) @ op.basis.T


def logdet(op: StructuredCovariance) -> jax.Array:
    """log det Σ̂ = −Σ log D − Σ log(1 + γ); O(d)."""
    return -jnp.sum(jnp.log(op.diag)) - jnp.sum(jnp.log1p(op.white_eig))


def diag_cov(op: StructuredCovariance) -> jax.Array:
    """The marginal variances diag Σ̂ = D⁻¹ ⊙ (1 + (W ⊙ W)((1 + γ)⁻¹ − 1)); O(d·k)."""
    return (1 + (op.white_basis**2) @ (1 / (1 + op.white_eig) - 1)) / op.diag


def to_dense(op: StructuredCovariance) -> jax.Array:
    """The dense Σ̂ (d × d), for tests and small d only."""
    return cov_matvec(op, jnp.eye(op.diag.shape[0], dtype=op.diag.dtype))


class StructuredProxy(NamedTuple):
    """A proxy like :class:`~numpyro_subsample.proxies.base.Proxy`, with the covariance as an
    operator: centre θ̂ (d,), ``cov_op`` Σ̂, the data at θ̂ (``datum_grads`` ∇f_i(θ̂) (N, d) or
    None, ``sum_grads`` Σ_i ∇f_i(θ̂)), the data passes and seconds spent, ``kind`` and ``info``.
    """

    centre: jax.Array
    cov_op: StructuredCovariance
    datum_grads: jax.Array | None
    sum_grads: jax.Array
    num_data_passes: float
    seconds: float
    kind: str
    info: dict


# ---------------------------------------------------------------------------------------------
# The samplers' whitening: a dense triangular factor or a structured covariance
# ---------------------------------------------------------------------------------------------

#: A square root L of a proxy covariance (L Lᵀ = Σ̂): the dense lower-triangular Cholesky factor
#: (d, d) of :class:`~numpyro_subsample.proxies.base.Proxy`, or a :class:`StructuredCovariance`
#: whose L (:func:`scale_matvec`, not triangular) is never formed. The functions below dispatch
#: on the type at trace time, so one program serves either kind and the dense one is unchanged.
Scale = Any


def is_structured(x: Any) -> bool:
    """Whether ``x`` (a :data:`Scale` or a proxy) is the structured kind."""
    return isinstance(x, (StructuredCovariance, StructuredProxy))


def proxy_scale(proxy: Any) -> Scale:
    """The :data:`Scale` of a proxy: ``cov_op`` of a :class:`StructuredProxy`, else the
    dense ``scale_tril``."""
    return proxy.cov_op if isinstance(proxy, StructuredProxy) else proxy.scale_tril


def identity_scale(dim: int, dtype: Any) -> StructuredCovariance:
    """L = I as a structured operator (D = 1, k = 0): no d × d array."""
    return StructuredCovariance(
        jnp.ones((dim,), dtype), jnp.zeros((dim, 0), dtype), jnp.zeros((0,), dtype),
        jnp.zeros((dim, 0), dtype), jnp.zeros((0,), dtype),
    )


def whiten_matvec(scale: Scale, w: jax.Array) -> jax.Array:
    """L w for w of shape (d,) or (..., d) (the position of whitened coordinates w)."""
    if is_structured(scale):
        return scale_matvec(scale, w)
    return scale @ w if w.ndim == 1 else w @ scale.T


def whiten_rmatvec(scale: Scale, g: jax.Array) -> jax.Array:
    """Lᵀ g for g of shape (d,) or (..., d) (a gradient in whitened coordinates)."""
    if is_structured(scale):
        return scale_rmatvec(scale, g)
    return scale.T @ g if g.ndim == 1 else g @ scale


def whiten_solve(scale: Scale, x: jax.Array) -> jax.Array:
    """L⁻¹ x for x of shape (d,) or (..., d) (whitened coordinates of an offset θ − θ̂)."""
    if is_structured(scale):
        return scale_solve(scale, x)
    if x.ndim == 1:
        return jax.scipy.linalg.solve_triangular(scale, x, lower=True)
    return jax.scipy.linalg.solve_triangular(scale, x.T, lower=True).T


def cov_norm_bound(scale: Scale) -> float:
    """An upper bound of the largest eigenvalue of Σ̂ = L Lᵀ: exact (eigh) for a dense factor,
    max(D⁻¹) · max(1, max (1 + γ)⁻¹) for the structured one (module docstring; O(d))."""
    if is_structured(scale):
        inner = float(jnp.max(1 / (1 + scale.white_eig), initial=1.0))
        return float(jnp.max(1 / scale.diag)) * max(inner, 1.0)
    cov = np.asarray(scale, np.float64)
    return float(np.linalg.eigvalsh(cov @ cov.T).max())


# ---------------------------------------------------------------------------------------------
# Curvature streamed over the data
# ---------------------------------------------------------------------------------------------


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


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def hessian_vector_product(
    potential: Potential,
    theta: jax.Array,
    v: jax.Array,
    data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
) -> jax.Array:
    """∇²f(θ) v of the full potential (prior and data), forward-over-reverse, one data pass."""

    def chunk_fn(idx, mask):
        grad = jax.grad(partial(_chunk_value, potential, data, idx, mask))
        return jax.jvp(grad, (theta,), (v,))[1]

    hv = scan_chunks(chunk_fn, potential.num_data, chunk_size, jnp.zeros_like(theta))
    prior = jax.grad(lambda t: potential.prior(t, data))
    return hv + jax.jvp(prior, (theta,), (v,))[1]


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def fisher_vector_product(
    potential: Potential,
    theta: jax.Array,
    v: jax.Array,
    data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
) -> jax.Array:
    """Σ_i ∇f_i(θ) (∇f_i(θ)ᵀ v), the empirical Fisher of the data terms (no prior) times v;
    a JVP then its transpose per chunk (no chunk × d Jacobian), one data pass."""

    def chunk_fn(idx, mask):
        fvec = lambda t: mask.astype(t.dtype) * potential.data_terms(t, idx, data)  # noqa: E731
        _, lin = jax.linearize(fvec, theta)
        return jax.linear_transpose(lin, theta)(lin(v))[0]

    return scan_chunks(chunk_fn, potential.num_data, chunk_size, jnp.zeros_like(theta))


def _check_block(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or (
        block_size < 1
    ):
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}.")
    return int(block_size)


def hessian_diagonal(
    potential: Potential,
    theta: jax.Array,
    data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
    block_size: int = 16,
) -> jax.Array:
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


# ---------------------------------------------------------------------------------------------
# Lanczos
# ---------------------------------------------------------------------------------------------


class LanczosResult(NamedTuple):
    """Top-k Ritz pairs, largest first: ``eigenvalues`` (k,), ``eigenvectors`` (d, k)
    orthonormal, ``residuals`` (k,) the norms ‖A v − μ v‖ = β_m |s_{m,j}| (Golub and Van Loan
    2013, Sect. 10.1), and ``ritz_values`` (m,), all m Ritz values, largest first."""

    eigenvalues: jax.Array
    eigenvectors: jax.Array
    residuals: jax.Array
    ritz_values: jax.Array


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
    """Top-k eigenpairs of a symmetric operator by m-step Lanczos with full reorthogonalisation.

    ``matvec(operand, v)`` returns A v; it must be hashable (a module-level function or a
    NamedTuple like :class:`CurvatureOperator`): it is a static argument, and the arrays
    (data, θ) enter through ``operand``, an argument of the compiled program. m = ``num_iter``
    (default k + 10) matvecs, capped at ``dim``; every new Lanczos vector is orthogonalised
    twice against all previous ones (classical Gram-Schmidt twice), memory O(m·d). At a
    breakdown (an invariant subspace found, β_j ≈ 0) the next vector is a random one
    orthogonal to the previous ones, with β_j = 0. The Ritz pairs of the m × m tridiagonal
    matrix T = QᵀAQ are returned (Golub and Van Loan 2013, Sect. 10.1).
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
    residuals = jnp.abs(beta[-1] * S[-1, :k])
    return LanczosResult(vals[:k], Q.T @ S[:, :k], residuals, vals)


class CurvatureOperator(NamedTuple):
    """The scaled curvature v ↦ σ ⊙ C(θ)(σ ⊙ v) as a hashable matvec for :func:`lanczos_eigh`,
    with ``operand = (theta, data, sigma)``; one data pass per product.

    C is the Hessian ∇²f (``curvature="hessian"``) or the empirical Fisher of the data plus
    the prior's Hessian (``"fisher"``).
    """

    potential: Potential
    curvature: str = "hessian"
    chunk_size: int = DEFAULT_CHUNK

    def __call__(self, operand, v: jax.Array) -> jax.Array:
        theta, data, sigma = operand
        u = sigma * v
        if self.curvature == "hessian":
            cu = hessian_vector_product(self.potential, theta, u, data, self.chunk_size)
        else:
            prior = jax.grad(lambda t: self.potential.prior(t, data))
            cu = fisher_vector_product(self.potential, theta, u, data, self.chunk_size)
            cu = cu + jax.jvp(prior, (theta,), (u,))[1]
        return sigma * cu


# ---------------------------------------------------------------------------------------------
# Mode: L-BFGS on full-data passes
# ---------------------------------------------------------------------------------------------


class _LbfgsResult(NamedTuple):
    theta: jax.Array
    value: jax.Array
    grad: jax.Array  # ∇f(θ), in θ coordinates
    iterations: jax.Array
    evaluations: jax.Array  # data passes
    grad_rms: jax.Array  # rms of the gradient in the scaled coordinates
    stalled: jax.Array


@partial(jax.jit, static_argnames=("potential", "chunk_size", "memory_size"))
def _lbfgs(potential, chunk_size, memory_size, max_iterations, gtol, theta0, scale, data):
    """L-BFGS on u ↦ f(θ0 + u / scale); each evaluation of f and ∇f is one chunked pass (a
    custom VJP: the gradient comes from the pass, never from reverse mode through the scan)."""

    def value_grad(u):
        v, g, _ = value_grad_hessian(potential, theta0 + u / scale, data, chunk_size, False)
        return v, g / scale

    @jax.custom_vjp
    def fun(u):
        return value_grad(u)[0]

    fun.defvjp(value_grad, lambda g, ct: (ct * g,))
    opt = optax.lbfgs(memory_size=memory_size)
    u0 = jnp.zeros_like(theta0)
    v0, g0 = value_grad(u0)
    state0 = optax.tree.set(opt.init(u0), value=v0, grad=g0)
    rms = lambda g: jnp.sqrt(jnp.mean(g**2))  # noqa: E731

    def cond(c):
        u, state, it, evals, stalled = c
        g = optax.tree.get(state, "grad")
        return (it < max_iterations) & (rms(g) > gtol) & ~stalled

    def body(c):
        u, state, it, evals, _ = c
        value, grad = optax.tree.get(state, "value"), optax.tree.get(state, "grad")
        upd, new_state = opt.update(grad, state, u, value=value, grad=grad, value_fn=fun)
        new_value, new_grad = optax.tree.get(new_state, "value"), optax.tree.get(new_state, "grad")
        finite = jnp.isfinite(new_value) & jnp.all(jnp.isfinite(new_grad))
        stalled = jnp.all(upd == 0) | ~finite
        evals = evals + optax.tree.get(new_state, "num_linesearch_steps")
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        state = jax.tree.map(keep, new_state, state)  # a non-finite point is never accepted
        return keep(u + upd, u), state, it + 1, evals, stalled

    init = (u0, state0, jnp.asarray(0), jnp.asarray(1), jnp.asarray(False))
    u, state, it, evals, stalled = jax.lax.while_loop(cond, body, init)
    g = optax.tree.get(state, "grad")
    return _LbfgsResult(
        theta0 + u / scale, optax.tree.get(state, "value"), g * scale, it, evals, rms(g), stalled
    )


# ---------------------------------------------------------------------------------------------
# The fit
# ---------------------------------------------------------------------------------------------


def _int_arg(name: str, value, low: int, high: int | None = None, what: str = "") -> int:
    ok = not isinstance(value, bool) and isinstance(value, (int, np.integer))
    if not ok or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"≥ {low}"
        raise ValueError(f"{name} must be an integer {bound}{what}, got {value!r}.")
    return int(value)


def _choice(name: str, value, options: tuple[str, ...], extra: str = "") -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}.{extra}")
    return value


def _positive(name: str, value, upper: float | None = None) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = float("nan")
    if not (x > 0 and math.isfinite(x)) or (upper is not None and not x < upper):
        bound = f" and < {upper}" if upper is not None else ""
        raise ValueError(f"{name} must be a finite number > 0{bound}, got {value!r}.")
    return x


def _floored_diagonal(h: np.ndarray, p: np.ndarray, floor: float):
    """δ = max(h, τ), τ_i = p_i where p_i > 0, else ``floor`` · max(h, p) (module docstring)."""
    top = max(float(np.max(h, initial=0.0)), float(np.max(p, initial=0.0)))
    if not top > 0:
        raise ValueError(
            "The curvature has no positive diagonal entry at the mode (its largest is "
            f"{float(np.max(h)):.3g}) and the prior none either: the posterior is flat or the "
            "optimiser stopped at a maximum. Check the model, or pass init_theta."
        )
    tau = np.where(p > 0, p, floor * top)
    return np.maximum(h, tau), int(np.sum(h < tau))


def fit_structured(
    potential: Potential,
    data: ModelData,
    rng_key: jax.Array,
    *,
    structure: str = "diagonal",
    rank: int = 10,
    curvature: str = "hessian",
    diagonal: str = "exact",
    num_probes: int = 64,
    complement: str = "trace",
    oversample: int = 10,
    curvature_floor: float = 1e-4,
    init_theta: jax.Array | None = None,
    subsample_size: int | None = None,
    num_epochs: float = 2.0,
    learning_rate: float = 0.05,
    max_iterations: int = 200,
    gtol: float = 1e-3,
    memory_size: int = 10,
    chunk_size: int = DEFAULT_CHUNK,
    block_size: int = 16,
    store_datum_grads: bool = False,
    progress: bool = False,
) -> StructuredProxy:
    """A matrix-free proxy N(θ̂, Σ̂): mode by Adam and L-BFGS, structured Σ̂ (module docstring).

    Mode: ``num_epochs`` epochs of Adam on minibatches of ``subsample_size`` (the model's n)
    from ``init_theta`` (default the prior median; pass a random point for a neural network,
    whose median is a saddle), as :func:`~numpyro_subsample.proxies.laplace.fit_laplace`, then
    up to ``max_iterations`` L-BFGS iterations (``memory_size`` pairs) on full-data passes in
    the coordinates u = σ⁻¹ ⊙ (θ − θ_A), σ⁻² the diagonal of the empirical Fisher plus the
    prior's Hessian at the Adam point θ_A (one pass): they stop when the rms of ∇_u f, the
    gradient in those approximate posterior sds, is ≤ ``gtol`` (``info["converged"]``).

    Covariance: ``structure`` "diagonal" or "low-rank" (``rank`` k, 1 ≤ k < d, with ``k +
    oversample`` Lanczos iterations, capped at d, and ``complement`` "trace" or "next"), from
    ``curvature`` "hessian" or "fisher"; the Hessian diagonal is exact (``diagonal="exact"``,
    d Hessian-vector products per datum in one pass, ``block_size`` at a time) or a
    Hutchinson estimate (``"hutchinson"``, ``num_probes`` probes); curvature below the floors
    of the module docstring (``curvature_floor``) is raised and counted.

    Data passes (``num_data_passes``): Adam's epochs, one for the scaling, one per L-BFGS
    evaluation, one for the diagonal, one per Lanczos iteration, one for the per-datum
    gradients if ``store_datum_grads`` (then ``datum_grads`` is (N, d)). Raises ``ValueError``
    naming the argument for a bad argument, if f or ∇f is not finite at the mode, and if the
    curvature has no positive diagonal entry (nor the prior's Hessian) there. Warns
    (:class:`~numpyro_subsample.proxies.base.ProxyFitWarning`) if the Newton decrement
    √(gᵀΣ̂g) at θ̂ exceeds :data:`~numpyro_subsample.proxies.checks.MAX_DECREMENT`.
    """
    t0 = time.perf_counter()
    d, N = potential.dim, potential.num_data
    structure = _choice("structure", structure, STRUCTURES)
    gn_note = (
        " The generalised Gauss-Newton matrix needs the model's outputs and the likelihood's "
        "curvature in them, which a potential does not expose; use 'fisher' (positive "
        "semi-definite) or 'hessian'." if curvature == "gauss-newton" else ""
    )
    curvature = _choice("curvature", curvature, CURVATURES, gn_note)
    diagonal = _choice("diagonal", diagonal, DIAGONALS)
    complement = _choice("complement", complement, COMPLEMENTS)
    k = 0
    if structure == "low-rank":
        if d < 2:
            raise ValueError(f"structure='low-rank' needs d ≥ 2 parameters; this model has {d}.")
        k = _int_arg("rank", rank, 1, d - 1, f" (the model has d={d} parameters)")
        oversample = _int_arg("oversample", oversample, 1 if complement == "next" else 0,
                              what=" (complement='next' needs ≥ 1)" if complement == "next"
                              else "")
    num_probes = _int_arg("num_probes", num_probes, 1)
    block_size = _int_arg("block_size", block_size, 1)
    max_iterations = _int_arg("max_iterations", max_iterations, 0)
    memory_size = _int_arg("memory_size", memory_size, 1)
    chunk_count(N, chunk_size)
    chunk_size = int(chunk_size)
    floor = _positive("curvature_floor", curvature_floor, 1.0)
    gtol = _positive("gtol", gtol)
    learning_rate = _positive("learning_rate", learning_rate)
    num_epochs = float(num_epochs)
    if not (num_epochs >= 0 and math.isfinite(num_epochs)):
        raise ValueError(f"num_epochs must be a finite number ≥ 0, got {num_epochs!r}.")
    theta = potential.init_theta if init_theta is None else jnp.asarray(init_theta)
    if theta.shape != (d,):
        raise ValueError(f"init_theta must have shape ({d},), got {tuple(theta.shape)}.")
    theta = theta.astype(potential.init_theta.dtype)
    dtype = theta.dtype
    key_adam, key_lanczos, key_probe = jax.random.split(rng_key, 3)
    passes = {}

    # Mode: Adam on minibatches, then L-BFGS on full-data passes in Fisher-scaled coordinates.
    adam_steps = 0
    if num_epochs > 0:
        n = int(subsample_size or potential.plate.subsample_size)
        adam_steps = int(min(max(math.ceil(num_epochs * N / n), 500), 50_000))
        adam_steps = -(-adam_steps // 250) * 250
        theta = _adam_phase(potential, data, theta, n, adam_steps, key_adam, learning_rate,
                            progress)
        passes["adam"] = adam_steps * n / N
    block = min(block_size, d)
    prior_diag = np.asarray(prior_hessian_diagonal(potential, theta, data, block), np.float64)
    fisher_a = np.asarray(fisher_diagonal(potential, theta, data, chunk_size)[0], np.float64)
    passes["scaling"] = 1.0
    scale = fisher_a + np.maximum(prior_diag, 0)
    scale = np.sqrt(np.maximum(scale, 1e-12 * max(float(scale.max()), 1e-30)))
    res = _lbfgs(potential, chunk_size, memory_size, max_iterations, gtol, theta,
                 jnp.asarray(scale, dtype), data)
    theta, f, g = res.theta, float(res.value), np.asarray(res.grad, np.float64)
    passes["lbfgs"] = float(res.evaluations)
    if not (np.isfinite(f) and np.all(np.isfinite(g))):
        raise ValueError(
            "The potential or its gradient is not finite at the optimiser's end point; check "
            "the model's support and the data, pass a smaller learning_rate or an init_theta."
        )
    converged = bool(res.grad_rms <= gtol)
    stop = ("converged" if converged else "stalled (no decrease along the search direction)"
            if bool(res.stalled) else f"max_iterations={max_iterations} reached")

    # Curvature at the mode.
    prior_diag = np.asarray(prior_hessian_diagonal(potential, theta, data, block), np.float64)
    datum_grads = None
    fisher_sum = None
    if store_datum_grads:
        _, grads = datum_values_and_grads(potential, theta, data, chunk_size)
        passes["datum_grads"] = 1.0
        datum_grads, sum_grads = grads, jnp.sum(grads, axis=0)
        if curvature == "fisher":
            fisher_sum = jnp.sum(grads**2, axis=0)
    if curvature == "fisher":
        if fisher_sum is None:
            fisher_sum, sum_grads = fisher_diagonal(potential, theta, data, chunk_size)
            passes["diagonal"] = 1.0
        h = np.asarray(fisher_sum, np.float64) + prior_diag
    else:
        if diagonal == "exact":
            h = hessian_diagonal(potential, theta, data, chunk_size, block)
        else:
            h = hutchinson_diagonal(potential, theta, data, key_probe, num_probes, chunk_size,
                                    block)
        h = np.asarray(h, np.float64)
        passes["diagonal"] = 1.0
        if not store_datum_grads:  # Σ_i ∇f_i(θ̂) = ∇f(θ̂) − ∇f0(θ̂), no further pass
            g0 = np.asarray(prior_grad(potential, theta, data), np.float64)
            sum_grads = jnp.asarray((g - g0).astype(dtype))
    delta, clipped_diag = _floored_diagonal(h, prior_diag, floor)
    info_lr = {}
    clipped_eig = clipped_c = 0
    if k == 0:
        op = structured_covariance(jnp.asarray(delta, dtype))
    else:
        sigma = 1 / np.sqrt(delta)
        m = min(k + oversample, d)
        lz = lanczos_eigh(
            CurvatureOperator(potential, curvature, chunk_size),
            (theta, data, jnp.asarray(sigma, dtype)), key_lanczos, d, k, m, dtype,
        )
        passes["lanczos"] = float(m)
        ritz = np.asarray(lz.ritz_values, np.float64)
        mu = ritz[:k]
        if complement == "trace":
            c = (float(np.sum(h / delta)) - float(np.sum(mu))) / (d - k)
        else:
            c = float(ritz[k])
        eig_floor = max(floor, float(np.min(np.maximum(prior_diag, 0) / delta)))
        clipped_eig, clipped_c = int(np.sum(mu < eig_floor)), int(c < eig_floor)
        mu_f, c_f = np.maximum(mu, eig_floor), max(c, eig_floor)
        op = _from_whitened(
            jnp.asarray(c_f * delta, dtype), lz.eigenvectors.astype(dtype),
            jnp.asarray(mu_f / c_f - 1, dtype),
        )
        info_lr = {
            "lanczos_iterations": m,
            "ritz_values": ritz,
            "ritz_residuals": np.asarray(lz.residuals, np.float64),
            "complement_curvature": c,
            "eigenvalue_floor": eig_floor,
        }
    decrement = float(np.sqrt(max(float(g @ np.asarray(cov_matvec(op, jnp.asarray(g, dtype)),
                                                         np.float64)), 0.0)))
    messages = []
    if decrement > MAX_DECREMENT:
        messages.append(
            f"The structured proxy's fit did not reach the mode: L-BFGS {stop}, and the Newton "
            f"decrement √(gᵀΣ̂g) is {decrement:.3g} proxy sds (> {MAX_DECREMENT}). Pass more "
            "max_iterations or num_epochs, a smaller gtol, or another init_theta."
        )
    for message in messages:
        warn_proxy(message)
    clipped = {"diagonal": clipped_diag, "eigenvalues": clipped_eig, "complement": clipped_c}
    return StructuredProxy(
        centre=theta,
        cov_op=op,
        datum_grads=datum_grads,
        sum_grads=sum_grads,
        num_data_passes=float(sum(passes.values())),
        seconds=time.perf_counter() - t0,
        kind="structured",
        info={
            "structure": structure,
            "rank": k,
            "curvature": curvature,
            "diagonal": diagonal if curvature == "hessian" else "fisher",
            "complement": complement if k else None,
            "adam_steps": adam_steps,
            "lbfgs_iterations": int(res.iterations),
            "lbfgs_stop": stop,
            "converged": converged,
            "grad_rms": float(res.grad_rms),
            "gtol": gtol,
            "potential": f,
            "newton_decrement": decrement,
            "curvature_diagonal": h,
            "clipped": clipped,
            "num_clipped": sum(clipped.values()),
            "curvature_floor": floor,
            "passes": passes,
            "warnings": messages,
            **info_lr,
        },
    )
