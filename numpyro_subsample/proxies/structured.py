"""Matrix-free proxies of the posterior: a centre θ̂ and a structured covariance Σ̂ = P⁻¹.

For models with many parameters the dense proxy of :mod:`.laplace` (a d × d Hessian, its
inverse and Cholesky factor) costs O(d²) memory and O(d³) time. Here P = diag(D) + U diag(s)
Uᵀ with k orthonormal columns (:mod:`.covariance`; k = 0 is a diagonal proxy), every
operation the samplers need costs O(d·k) (:mod:`.whitening`), and the curvature it is built
from is streamed over the data in chunks with memory O(chunk·d + m·d) (:mod:`.curvature`,
:mod:`.lanczos`).

The fit (:func:`fit_structured`) finds the mode with Adam and L-BFGS (:mod:`.lbfgs`) and
builds P from the curvature C (the Hessian, or the empirical Fisher plus the prior's Hessian)
at the mode:

* ``structure="diagonal"``: P = diag(δ), δ the diagonal of C floored (see below);
* ``structure="low-rank"``: with C̃ = δ^{-1/2} C δ^{-1/2} (unit diagonal when nothing is
  floored), m = min(2k + ``oversample``, d) Lanczos iterations (a data pass each) give Ritz
  pairs (μ_j, v_j) that converge at both ends of the spectrum (Golub and Van Loan 2013,
  Sect. 10.1), and P = δ^{1/2} (c I + V_S diag(μ_S − c)
  V_Sᵀ) δ^{1/2}: exact on the span of k kept converged pairs S, c on the complement. The
  posterior variance along an eigenvector is 1/μ_j, so a small eigenvalue (a weakly
  identified combination, e.g. a fixed intercept against the mean of random intercepts)
  matters as much as a large one. ``complement="trace"`` keeps the pairs that minimise
  KL(N(θ̂, P⁻¹) ‖ N(θ̂, C⁻¹)) = ½ Σ_{j∉S} φ(μ_j/c), φ(r) = r − 1 − log r, with
  c = (tr C̃ − Σ_S μ_j)/(d − k), the mean of the discarded eigenvalues, which minimises it
  over c (as the noise variance of probabilistic PCA, Tipping and Bishop 1999);
  ``complement="next"`` takes c the largest discarded Ritz value, so that the whitened
  curvature LᵀCL is at most 1 on the complement (the assumption of the step-size rules), and
  keeps the pairs that minimise its condition number; the variance 1/c along discarded
  directions of smaller curvature is then too small. Both keep the i largest and the k − i
  smallest converged pairs for the best i (:mod:`.lowrank`), and both are exact (P = C) if
  the discarded eigenvalues are equal, e.g. for k = d − 1. The whitened curvature on the
  complement reaches μ_max/c, μ_max the largest discarded Ritz value
  (``info["ritz_values"][info["rank"]]``), the μ of the kernels' step-size rules.

Curvature floors: :mod:`.structured_precision`.

``curvature="gauss-newton"`` is not offered: a potential exposes only the per-datum terms
f_i(θ), not the model's outputs and the likelihood's curvature in them that the generalised
Gauss-Newton matrix needs. The empirical Fisher Σ_i ∇f_i ∇f_iᵀ is positive semi-definite
but only approximates the Hessian for a well-specified model near the mode (Kunstner, Hennig
and Balles 2019).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import (
    DEFAULT_CHUNK,
    datum_values_and_grads,
    value_grad_hessian,
)
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.checks import MAX_DECREMENT, prior_grad, warn_proxy
from numpyro_subsample.proxies.covariance import StructuredCovariance, cov_matvec
from numpyro_subsample.proxies.lbfgs import ModeResult, find_mode
from numpyro_subsample.proxies.structured_args import (
    StructuredArguments,
    checked_arguments,
)
from numpyro_subsample.proxies.structured_precision import precision_at_mode

__all__ = ["StructuredProxy", "fit_structured"]


class StructuredProxy(NamedTuple):
    """A proxy like :class:`~numpyro_subsample.proxies.base.Proxy`, with the covariance as an
    operator: centre θ̂ (d,), ``cov_op`` Σ̂, the data at θ̂ (``datum_grads`` ∇f_i(θ̂) (N, d) or
    None, ``sum_grads`` Σ_i ∇f_i(θ̂)), the data passes and seconds spent, ``kind`` and ``info``.

    Parameters
    ----------
    centre, cov_op, datum_grads, sum_grads, num_data_passes, seconds, kind, info
        As above.

    References
    ----------
    Baker et al. (2019), Sect. 3.
    """

    centre: jax.Array
    cov_op: StructuredCovariance
    datum_grads: jax.Array | None
    sum_grads: jax.Array
    num_data_passes: float
    seconds: float
    kind: str
    info: dict


MAX_POLISH = 3  # quasi-Newton steps with the fitted Σ̂ after the optimiser


def _decrement(op: StructuredCovariance, g: np.ndarray, dtype) -> float:
    """The Newton decrement √(gᵀΣ̂g)."""
    gs = np.asarray(cov_matvec(op, jnp.asarray(g, dtype)), np.float64)
    return float(np.sqrt(max(float(g @ gs), 0.0)))


def _polish(potential, data, theta, f, g, op, chunk_size, passes):
    """Up to :data:`MAX_POLISH` steps θ ← θ − Σ̂∇f(θ) while the Newton decrement exceeds
    MAX_DECREMENT / 2, one data pass each. A step is kept if f or the decrement decreases
    (the decrement keeps its precision where float32 rounding of the full-data sum hides the
    change of f near the mode). Returns θ, f, ∇f and whether θ moved."""
    dtype, moved = theta.dtype, False
    dec = _decrement(op, g, dtype)
    for _ in range(MAX_POLISH):
        if dec <= MAX_DECREMENT / 2:
            break
        step = np.asarray(cov_matvec(op, jnp.asarray(g, dtype)), np.float64)
        cand = jnp.asarray((np.asarray(theta, np.float64) - step).astype(dtype))
        fc, gc, _ = value_grad_hessian(potential, cand, data, chunk_size, False)
        passes["polish"] = passes.get("polish", 0.0) + 1.0
        fc, gc = float(fc), np.asarray(gc, np.float64)
        if not (np.isfinite(fc) and np.all(np.isfinite(gc))):
            break
        dec_c = _decrement(op, gc, dtype)
        if not (fc < f or dec_c < dec):
            break
        theta, f, g, dec, moved = cand, fc, gc, dec_c, True
    return theta, f, g, moved


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
    ritz_tol: float = 0.1,
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
    from ``init_theta`` (default the prior mean plus a small jitter; pass a random point of a
    suitable scale for a neural network, whose prior mean is a saddle), as
    :func:`~numpyro_subsample.proxies.laplace.fit_laplace`, then
    up to ``max_iterations`` L-BFGS iterations (``memory_size`` pairs) on full-data passes in
    the coordinates u = σ⁻¹ ⊙ (θ − θ_A), σ⁻² the diagonal of the empirical Fisher plus the
    prior's Hessian at the Adam point θ_A (one pass): they stop when the rms of ∇_u f, the
    gradient in those approximate posterior sds, is ≤ ``gtol`` (``info["converged"]``).

    Covariance: ``structure`` "diagonal" or "low-rank" (``rank`` k, 1 ≤ k < d, from
    m = min(2k + ``oversample``, d) Lanczos iterations, so that both ends of the spectrum
    converge; pairs with residual ≤ ``ritz_tol`` · |μ| count as converged, their μ within
    that of an eigenvalue, and at most k of them are kept as ``complement`` "trace" or "next"
    decides), from ``curvature`` "hessian" or "fisher"; the Hessian diagonal is exact
    (``diagonal="exact"``, d Hessian-vector products per datum in one pass, ``block_size`` at
    a time) or a Hutchinson estimate (``"hutchinson"``, ``num_probes`` probes); curvature
    below the floors of the module docstring (``curvature_floor``) is raised and counted.

    Data passes (``num_data_passes``): Adam's epochs, one for the scaling, one per L-BFGS
    evaluation, one for the diagonal, m for Lanczos, one for the per-datum gradients if
    ``store_datum_grads`` (then ``datum_grads`` is (N, d)), and up to :data:`MAX_POLISH`
    quasi-Newton steps θ̂ ← θ̂ − Σ̂∇f(θ̂) with the fitted Σ̂ while the Newton decrement
    √(gᵀΣ̂g) exceeds half its limit (one pass each, plus the per-datum gradients again if
    stored; the curvature stays the optimiser's end point's). Low-rank ``info``: ``rank`` (pairs
    kept; fewer than ``rank_requested`` if fewer converged), ``kept_top`` and ``kept_bottom``
    (kept values above c and not), ``ritz_values``, ``ritz_residuals`` and ``ritz_converged``
    (m,) with the kept pairs first, then the discarded, each largest first
    (``ritz_values[rank]`` is the largest discarded one), ``complement_curvature`` c before
    its floor and ``eigenvalue_floor``.

    Raises ``ValueError`` naming the argument for a bad argument, if f or ∇f is not finite at
    the mode, and if the curvature has no positive diagonal entry (nor the prior's Hessian)
    there. Warns (:class:`~numpyro_subsample.proxies.base.ProxyFitWarning`) if the Newton
    decrement √(gᵀΣ̂g) at θ̂ exceeds :data:`~numpyro_subsample.proxies.checks.MAX_DECREMENT`
    and if fewer than k Ritz pairs converged.

    Parameters
    ----------
    potential, data, rng_key
        The model's potential and data; key of Adam's minibatches and the probes.
    structure, rank, curvature, diagonal, num_probes, complement, oversample, ritz_tol
        The covariance (above).
    curvature_floor, init_theta, subsample_size, num_epochs, learning_rate, max_iterations
        The curvature's floor and the mode search (above).
    gtol, memory_size, chunk_size, block_size, store_datum_grads, progress
        L-BFGS's tolerance and memory; data per evaluation; HVPs at a time; (N, d) table; bars.

    Returns
    -------
    StructuredProxy
        N(θ̂, Σ̂).

    References
    ----------
    Baker et al. (2019), Sect. 3.2.
    """
    t0 = time.perf_counter()
    a = checked_arguments(
        potential, structure=structure, rank=rank, curvature=curvature, diagonal=diagonal,
        num_probes=num_probes, complement=complement, oversample=oversample,
        ritz_tol=ritz_tol, curvature_floor=curvature_floor, init_theta=init_theta,
        num_epochs=num_epochs, learning_rate=learning_rate, max_iterations=max_iterations,
        gtol=gtol, memory_size=memory_size, chunk_size=chunk_size, block_size=block_size)
    key_adam, key_lanczos, key_probe = jax.random.split(rng_key, 3)
    block = min(a.block_size, potential.dim)
    mode = _finite_mode(potential, data, a, key_adam, subsample_size, block, progress)
    passes = mode.passes
    pre = precision_at_mode(potential, data, mode.theta, mode.grad, key_probe, key_lanczos, a,
                            block, store_datum_grads, passes)
    op, datum_grads, sum_grads = pre.cov_op, pre.datum_grads, pre.sum_grads
    theta, f, g, moved = _polish(potential, data, mode.theta, mode.value, mode.grad, op,
                                 a.chunk_size, passes)
    if moved:  # Σ_i ∇f_i at the new centre (the curvature is kept from the optimiser's end)
        datum_grads, sum_grads = _recentred_sums(potential, data, theta, g, datum_grads,
                                                 a.chunk_size, passes)
    decrement = _decrement(op, g, theta.dtype)
    messages = _mode_warning(mode.stop, decrement) + pre.messages
    for message in messages:
        warn_proxy(message)
    info = _fit_info(a, mode, f, decrement, pre.curvature_diagonal, pre.clipped, passes,
                     messages, pre.info)
    return StructuredProxy(centre=theta, cov_op=op, datum_grads=datum_grads, sum_grads=sum_grads,
                           num_data_passes=float(sum(passes.values())),
                           seconds=time.perf_counter() - t0, kind="structured", info=info)


def _finite_mode(potential: Potential, data: ModelData, a: StructuredArguments, key: jax.Array,
                 subsample_size: int | None, block: int, progress: bool) -> ModeResult:
    """The mode by Adam and L-BFGS (:func:`~numpyro_subsample.proxies.lbfgs.find_mode`); a
    ``ValueError`` if f or ∇f is not finite there."""
    mode = find_mode(potential, data, a.init_theta, key, subsample_size=subsample_size,
                     num_epochs=a.num_epochs, learning_rate=a.learning_rate,
                     max_iterations=a.max_iterations, gtol=a.gtol,
                     memory_size=a.memory_size, chunk_size=a.chunk_size, block=block,
                     progress=progress)
    if not (np.isfinite(mode.value) and np.all(np.isfinite(mode.grad))):
        raise ValueError(
            "The potential or its gradient is not finite at the optimiser's end point; check "
            "the model's support and the data, pass a smaller learning_rate or an init_theta."
        )
    return mode


def _mode_warning(stop: str, decrement: float) -> list[str]:
    """The warning (a one-item list) when the Newton decrement √(gᵀΣ̂g) at the centre exceeds
    :data:`~numpyro_subsample.proxies.checks.MAX_DECREMENT` proxy sds, else none."""
    if decrement <= MAX_DECREMENT:
        return []
    return [
        f"The structured proxy's fit did not reach the mode: L-BFGS {stop}, and the "
        f"Newton decrement √(gᵀΣ̂g) is {decrement:.3g} proxy sds (> {MAX_DECREMENT}). Pass "
        "more max_iterations or num_epochs, a smaller gtol, or another init_theta."
    ]


def _fit_info(a: StructuredArguments, mode, f: float, decrement: float, h: np.ndarray,
              clipped: dict, passes: dict, messages: list, info_lr: dict) -> dict:
    """``proxy.info`` of :func:`fit_structured` (its docstring)."""
    k = a.rank
    return {
        "structure": a.structure,
        "rank": k,
        "curvature": a.curvature,
        "diagonal": a.diagonal if a.curvature == "hessian" else "fisher",
        "complement": a.complement if k else None,
        "adam_steps": mode.adam_steps,
        "adam_theta": mode.adam_theta,
        "adam_sd": mode.adam_sd,
        "lbfgs_iterations": mode.iterations,
        "lbfgs_stop": mode.stop,
        "converged": mode.converged,
        "grad_rms": mode.grad_rms,
        "gtol": a.gtol,
        "potential": f,
        "newton_decrement": decrement,
        "curvature_diagonal": h,
        "clipped": clipped,
        "num_clipped": sum(clipped.values()),
        "curvature_floor": a.curvature_floor,
        "passes": passes,
        "warnings": messages,
        **info_lr,
    }


def _recentred_sums(potential: Potential, data: ModelData, theta: jax.Array, g: np.ndarray,
                    datum_grads: jax.Array | None, chunk_size: int, passes: dict) -> tuple:
    """``(table, Σ_i ∇f_i)`` at the polished centre: the (N, d) table again if it is kept (one
    data pass, added to ``passes``), else the sum ∇f(θ̂) − ∇f0(θ̂) from the polish's ∇f."""
    if datum_grads is not None:
        _, datum_grads = datum_values_and_grads(potential, theta, data, chunk_size)
        passes["datum_grads"] += 1.0
        return datum_grads, jnp.sum(datum_grads, axis=0)
    g0 = np.asarray(prior_grad(potential, theta, data), np.float64)
    return None, jnp.asarray((g - g0).astype(theta.dtype))
