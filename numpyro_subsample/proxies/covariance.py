"""A structured covariance Σ̂ = P⁻¹ with P = diag(D) + U diag(s) Uᵀ, every operation O(d·k).

U ∈ R^{d×k} has orthonormal columns, k ≥ 0 (k = 0 is a diagonal proxy).

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
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "StructuredCovariance",
    "structured_covariance",
    "from_whitened",
    "scale_matvec",
    "scale_rmatvec",
    "scale_solve",
    "cov_matvec",
    "precision_matvec",
    "logdet",
    "diag_cov",
    "diag_precision",
    "rescaled",
    "to_dense",
]


class StructuredCovariance(NamedTuple):
    """Σ̂ = P⁻¹ with P = diag(D) + U diag(s) Uᵀ (module docstring), built by
    :func:`structured_covariance`.

    ``diag`` D (d,) > 0, ``basis`` U (d, k) with orthonormal columns, ``coef`` s (k,);
    ``white_basis`` W (d, k) and ``white_eig`` γ (k,) > −1 with D^{-1/2} U diag(s) Uᵀ D^{-1/2}
    = W diag(γ) Wᵀ, from which every operation is O(d·k).

    Parameters
    ----------
    diag
        D, shape (d,), positive.
    basis
        U, shape (d, k), orthonormal columns.
    coef
        s, shape (k,).
    white_basis
        W, shape (d, k).
    white_eig
        γ, shape (k,), each > −1.

    References
    ----------
    Golub and Van Loan (2013) (the Woodbury identity behind the O(d·k)
    operations).
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
        return StructuredCovariance(diag=diag, basis=basis, coef=coef, white_basis=basis,
                                    white_eig=coef)
    q, r = jnp.linalg.qr(basis / jnp.sqrt(diag)[:, None])
    gamma, e = jnp.linalg.eigh(r @ (coef[:, None] * r.T))
    op = StructuredCovariance(diag=diag, basis=basis, coef=coef, white_basis=q @ e, white_eig=gamma)
    if _concrete(coef) and not bool(jnp.all(1 + gamma > 0)):
        raise ValueError(
            "coef makes the precision diag(D) + U diag(s) Uᵀ not positive definite (smallest "
            f"eigenvalue of D^(-1/2) P D^(-1/2) is {float(1 + gamma.min()):.3g})."
        )
    return op


def from_whitened(
    diag: jax.Array, white_basis: jax.Array, white_eig: jax.Array
) -> StructuredCovariance:
    """The covariance with P = D^{1/2}(I + W diag(γ) Wᵀ)D^{1/2}, W (d, k) orthonormal and
    γ > −1 (its U, s by a thin QR of D^{1/2} W and a k × k eigendecomposition; no checks)."""
    if white_basis.shape[1] == 0:
        return StructuredCovariance(diag=diag, basis=white_basis, coef=white_eig,
                                    white_basis=white_basis, white_eig=white_eig)
    q, r = jnp.linalg.qr(jnp.sqrt(diag)[:, None] * white_basis)
    s, e = jnp.linalg.eigh(r @ (white_eig[:, None] * r.T))
    return StructuredCovariance(diag=diag, basis=q @ e, coef=s, white_basis=white_basis,
                                white_eig=white_eig)


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


def diag_precision(op: StructuredCovariance) -> jax.Array:
    """The diagonal of the precision P = diag(D) + U diag(s) Uᵀ: D + (U ⊙ U) s; O(d·k)."""
    return op.diag + (op.basis**2) @ op.coef


def rescaled(op: StructuredCovariance, r: jax.Array) -> StructuredCovariance:
    """diag(r) Σ̂ diag(r) for r > 0 (d,): the correlations of Σ̂ with the marginal sds times r.

    Its precision is diag(D / r²) + (U / r) diag(s) (U / r)ᵀ, brought back to orthonormal
    columns by :func:`structured_covariance` after a thin QR of U / r (U / r = Q T gives the
    basis Q E and coefficients λ with T diag(s) Tᵀ = E diag(λ) Eᵀ); O(d·k²)."""
    r = jnp.asarray(r, op.diag.dtype)
    if op.basis.shape[1] == 0:
        return structured_covariance(op.diag / r**2)
    q, t = jnp.linalg.qr(op.basis / r[:, None])
    lam, e = jnp.linalg.eigh(t @ (op.coef[:, None] * t.T))
    return structured_covariance(op.diag / r**2, q @ e, lam)


def to_dense(op: StructuredCovariance) -> jax.Array:
    """The dense Σ̂ (d × d), for tests and small d only."""
    return cov_matvec(op, jnp.eye(op.diag.shape[0], dtype=op.diag.dtype))
