"""Zero-variance control variates: the covariates and their streaming statistics.

The ZV estimate of E_π[g] (Baker, Fearnhead, Fox and Nemeth 2019, Sect. 4, Eq. 13-14;
Mira et al. 2013) averages g̃(θ) = g(θ) − βᵀu(θ, ŝ), with u zero-mean covariates built from
the stochastic gradient ŝ ≈ ∇ log π(θ) the sampler computes anyway. This module holds the
pieces the sampling loop needs (covariates, Welford sufficient statistics); the fit of β and
the ArviZ output are in :mod:`numpyro_subsample.post.zv`.

Two sets of degree-1 covariates:

- ``"gradient"``: the d coordinates of ŝ, every function g_i regressed on all of them
  (Eq. 14 as written): a p × p co-moment matrix, refused above :data:`MAX_ZV_COVARIATES`;
- ``"linearised"``: one covariate per function, u_i = ∇g_i(θ̄)ᵀ Σ̂ ŝ, with θ̄ and Σ̂ fixed
  before sampling (the sampler's centre and proxy covariance), and a scalar β_i per
  function: O(d·k + m) per draw for m functions. Each u_i is a fixed linear combination of
  ŝ, so a degree-1 ZV variate (Q = β_i (Σ̂∇g_i(θ̄))ᵀθ, Eq. 13) with E[u_i] = 0.
  It is our reduction, not the paper's: for a Gaussian posterior N(μ, Σ̂) and the exact
  gradient, Σ̂ŝ = −(θ − μ) and a g linear in θ is corrected to zero variance; otherwise it
  removes the part of g's fluctuation that is linear about θ̄ along Σ̂ŝ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ZVStats", "ZVPairedStats", "zv_covariates", "linearised_covariates",
           "empty_stats", "empty_paired_stats", "welford_update", "flat_fn", "default_g",
           "check_degree", "num_covariates", "check_covariates", "covariate_choice",
           "check_covariate_name",
           "COVARIATES", "MAX_ZV_COVARIATES"]

#: Most covariates a ZV fit regresses on: its p × p co-moment matrix and O(p³) solve are dense.
MAX_ZV_COVARIATES = 2000

#: The covariate sets of degree 1 (module docstring), and ``"auto"``.
COVARIATES = ("auto", "gradient", "linearised")


def zv_covariates(theta: Any, grad: Any, degree: int = 1, xp: Any = jnp) -> Any:
    """Zero-mean ZV covariates u(θ, ŝ) (module docstring; Baker et al. 2019, Eq. 13).

    ``theta``, ``grad``: (..., d) unconstrained position and estimate of ∇ log π at it.
    Returns (..., d) for degree 1 and (..., d(d+3)/2) for degree 2.
    """
    check_degree(degree)
    if degree == 1:
        return grad
    d = theta.shape[-1]
    k, j = np.triu_indices(d, 1)
    diag = 1.0 + theta * grad
    cross = theta[..., j] * grad[..., k] + theta[..., k] * grad[..., j]
    return xp.concatenate([grad, diag, cross], axis=-1)


def linearised_covariates(g_flat: Callable, centre: Any, direction: Any) -> Any:
    """u = J_g(θ̄) v for directions v = Σ̂ŝ of shape (..., d) (module docstring).

    ``g_flat``: θ ↦ g as a flat (m,) vector; ``centre``: θ̄ (d,). Returns (..., m).
    """
    _, lin = jax.linearize(g_flat, centre)
    flat_dirs = direction.reshape((-1, direction.shape[-1])).astype(centre.dtype)
    out = jax.vmap(lin)(flat_dirs)
    return out.reshape(direction.shape[:-1] + out.shape[-1:])


def check_covariate_name(covariates: str) -> None:
    """Raise a ``ValueError`` unless ``covariates`` is one of :data:`COVARIATES`."""
    if covariates not in COVARIATES:
        raise ValueError(f"covariates must be one of {COVARIATES}, got {covariates!r}.")


def covariate_choice(covariates: str, degree: int, dim: int) -> str:
    """``"gradient"`` or ``"linearised"`` for ``covariates`` (``"auto"``: gradient up to
    :data:`MAX_ZV_COVARIATES` parameters, else linearised) at ``degree`` and ``dim``."""
    check_covariate_name(covariates)
    if degree == 2:
        if covariates == "linearised":
            raise ValueError(
                "covariates='linearised' is a reduction of degree 1 (one covariate per "
                "function); degree=2 regresses on the d(d+3)/2 covariates of Eq. 13. Pass "
                "degree=1."
            )
        return "gradient"
    if covariates == "auto":
        return "gradient" if dim <= MAX_ZV_COVARIATES else "linearised"
    return covariates


def check_degree(degree: int) -> None:
    if degree not in (1, 2):
        raise ValueError(f"degree must be 1 or 2 (polynomial Q of Eq. 13), got {degree!r}.")


def default_g(sample: dict) -> dict:
    """Every coordinate of every site and its square (for ZV means and variances)."""
    return {"first": dict(sample), "second": {k: v * v for k, v in sample.items()}}


class ZVStats(NamedTuple):
    """Welford sufficient statistics of (u, g): count, means and co-moments Σ(x − x̄)(y − ȳ).

    ``m_gg`` keeps only the diagonal (variances of g). O(p² + p·m) memory for p covariates and
    m functions; a leading chain axis when stacked.
    """

    count: Any
    mean_u: Any
    mean_g: Any
    m_uu: Any
    m_ug: Any
    m_gg: Any


class ZVPairedStats(ZVStats):
    """The fields of :class:`ZVStats` for m pairs (u_i, g_i), one covariate per function (the
    linearised covariates): every field but ``count`` of shape (m,), the co-moments
    elementwise, Σ(u_i − ū_i)², Σ(u_i − ū_i)(g_i − ḡ_i), Σ(g_i − ḡ_i)². O(m) memory.
    """


def empty_stats(p: int, m: int, dtype) -> ZVStats:
    z = lambda *s: jnp.zeros(s, dtype)  # noqa: E731
    return ZVStats(count=z(), mean_u=z(p), mean_g=z(m), m_uu=z(p, p), m_ug=z(p, m), m_gg=z(m))


def empty_paired_stats(m: int, dtype) -> ZVPairedStats:
    z = lambda *s: jnp.zeros(s, dtype)  # noqa: E731
    return ZVPairedStats(count=z(), mean_u=z(m), mean_g=z(m), m_uu=z(m), m_ug=z(m), m_gg=z(m))


def welford_update(stats: ZVStats | ZVPairedStats, u, g, active):
    """One masked Welford step (active=False leaves the statistics unchanged); elementwise
    co-moments for :class:`ZVPairedStats`."""
    a = active.astype(stats.count.dtype)
    count = stats.count + a
    w = a / jnp.maximum(count, 1.0)
    du, dg = u - stats.mean_u, g - stats.mean_g
    mean_u, mean_g = stats.mean_u + w * du, stats.mean_g + w * dg
    du2, dg2 = a * (u - mean_u), a * (g - mean_g)
    prod = jnp.multiply if isinstance(stats, ZVPairedStats) else jnp.outer
    return type(stats)(
        count, mean_u, mean_g,
        stats.m_uu + prod(du, du2), stats.m_ug + prod(du, dg2), stats.m_gg + dg * dg2,
    )


def flat_fn(fn: Callable, example: dict) -> tuple[Callable, Callable]:
    """Flatten a pytree-valued fn to a vector and return its inverse for leading-dim arrays."""
    out = jax.eval_shape(fn, example)
    leaves, treedef = jax.tree.flatten(out)
    shapes = [tuple(x.shape) for x in leaves]
    sizes = [int(np.prod(s)) for s in shapes]

    def flat(sample):
        vals = jax.tree.leaves(fn(sample))
        return jnp.concatenate([jnp.ravel(v).astype(jnp.result_type(float)) for v in vals])

    def unflatten(arr):
        arr = np.asarray(arr)
        lead = arr.shape[:-1]
        parts, start = [], 0
        for s, k in zip(shapes, sizes, strict=True):
            parts.append(arr[..., start:start + k].reshape(lead + s))
            start += k
        return jax.tree.unflatten(treedef, parts)

    return flat, unflatten


def check_covariates(p: int, degree: int) -> None:
    """Raise if the fit of β would form a dense p × p matrix with p > :data:`MAX_ZV_COVARIATES`
    (degree 1 regresses on all d gradient coordinates)."""
    if p > MAX_ZV_COVARIATES:
        raise ValueError(
            f"ZV of degree {degree} regresses g on p = {p} covariates (the gradient "
            f"coordinates{'' if degree == 1 else ' and their products with θ'}): a dense p × p "
            f"co-moment matrix ({p * p * 8 / 2**30:.2g} GiB in float64) and an O(p³) solve, "
            f"beyond MAX_ZV_COVARIATES={MAX_ZV_COVARIATES} "
            "(numpyro_subsample.estimators.zv). "
            + ("Use covariates='linearised' (one covariate per function, O(d) per draw)."
               if degree == 1 else "Use degree=1 (its linearised covariates are O(d) per draw).")
        )


def num_covariates(d: int, degree: int) -> int:
    """Number of ZV covariates: d (degree 1) or d(d+3)/2 (degree 2)."""
    check_degree(degree)
    return d if degree == 1 else d * (d + 3) // 2
