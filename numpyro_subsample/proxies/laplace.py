"""The Laplace proxy: a centre θ̂ and a covariance Σ̂ in unconstrained space.

As in Baker, Fearnhead, Fox and Nemeth (2019, Sect. 3: the centring value replaces burn-in),
the mode is found by stochastic optimisation (Optax Adam on the model's own minibatches, a
couple of epochs), then polished with damped Newton steps on the full data, each one chunked
data pass that also yields the Hessian; Σ̂ is the inverse Hessian at the mode. A last pass at
θ̂, in the same compiled program, measures the axis excursions of :mod:`.checks` and gives the
sum of the per-datum gradients Σ_i ∇f_i(θ̂); the (N, d) table of ∇f_i(θ̂) is computed only on
request. A failed fit is reported by site (:mod:`.checks`).
"""

from __future__ import annotations

import math
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from numpyro_subsample.core.compiling import fast_compile_jit
from numpyro_subsample.core.data import device_array
from numpyro_subsample.core.datapass import (
    DEFAULT_CHUNK,
    datum_values_and_grads,
    value_grad_hessian,
)
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.core.rng import host_generator
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.chain_check import CHAIN_PASSES, chain_check, runs_chain_check
from numpyro_subsample.proxies.checks import (
    BOUNDARY_REMEDY,
    MAX_DECREMENT,
    boundary_message,
    coordinate_labels,
    describe,
    excursion_axes,
    excursion_messages,
    excursion_points,
    newton_offsets,
    newton_pass,
    prior_grad,
    transformed_coordinates,
    warn_proxy,
)
from numpyro_subsample.proxies.newton import newton_phase
from numpyro_subsample.proxies.progress import finish_bar, progress_bar

__all__ = ["LaplaceFitError", "fit_laplace", "proxy_from_moments"]


class LaplaceFitError(ValueError):
    """The Laplace fit has no usable Gaussian: the potential or its derivatives are not finite
    at the optimiser's mode, or the Hessian there is not positive definite (the message names
    the sites).

    The message joins ``finding`` (what failed, where), ``remedy`` (what to do: the SG kernels'
    remedies), ``boundary`` (a centre at a support's boundary, or "") and its remedy; a kernel
    whose remedies differ re-raises :meth:`with_remedy`."""

    def __init__(self, finding: str, remedy: str = "", boundary: str = "",
                 boundary_remedy: str = BOUNDARY_REMEDY) -> None:
        self.finding, self.remedy, self.boundary = finding, remedy, boundary
        super().__init__(" ".join(p for p in (
            finding, remedy, boundary, boundary_remedy if boundary else "") if p))

    def with_remedy(self, remedy: str, prefix: str = "") -> LaplaceFitError:
        """The same finding (after ``prefix``) and boundary with ``remedy`` in place of the SG
        kernels' remedies."""
        return LaplaceFitError(prefix + self.finding, remedy, self.boundary, boundary_remedy="")


def _cholesky_of_inverse(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = 0.5 * (h + h.T)
    cov = np.linalg.inv(h)
    cov = 0.5 * (cov + cov.T)
    return cov, np.linalg.cholesky(cov)


@partial(fast_compile_jit, static_argnames=("potential", "num_steps", "lr"))
def _adam_block(potential, num_steps, lr, carry, idxs, data):
    """Adam steps on the minibatches ``idxs`` (steps, n), one per row (cosine schedule over
    ``num_steps``, continued from the optimiser state in ``carry``)."""
    N, n = potential.num_data, idxs.shape[1]
    opt = optax.adam(optax.cosine_decay_schedule(lr, num_steps, alpha=0.05))

    def loss(t, idx):
        f0, fi = potential.terms(t, idx, data)
        return f0 + (N / n) * jnp.sum(fi)

    def step(c, idx):
        t, s = c
        upd, s = opt.update(jax.grad(loss)(t, idx), s, t)
        return (optax.apply_updates(t, upd), s), None

    return jax.lax.scan(step, carry, idxs)[0]


@partial(fast_compile_jit, static_argnames=("num_steps", "lr"))
def _adam_init(theta, num_steps, lr):
    return theta, optax.adam(optax.cosine_decay_schedule(lr, num_steps, alpha=0.05)).init(theta)


#: Most minibatch indices drawn per block of Adam steps (4 MB of int32).
_MAX_BLOCK_INDICES = 1 << 20


def _adam_phase(potential, data, theta, n, num_steps, key, lr, progress):
    """``num_steps`` Adam steps (a multiple of 250) on uniform minibatches of size n, drawn
    with replacement by NumPy's generator seeded with the bits of ``key`` (the same key gives
    the same steps; a draw site of JAX's generator would be compiled into the block program,
    ``benchmarks/bench_rng_compile.py``)."""
    carry = _adam_init(theta, num_steps, float(lr))
    block = next(b for b in (250, 125, 50, 25, 10, 5, 2, 1)
                 if b * n <= _MAX_BLOCK_INDICES or b == 1)
    block = min(block, num_steps)
    rng = host_generator(key)
    N = potential.num_data
    bar = progress_bar(num_steps, "proxy: Adam on minibatches", progress)
    for start in range(0, num_steps, block):
        idxs = rng.integers(0, N, size=(min(block, num_steps - start), n), dtype=np.int32)
        carry = _adam_block(potential, num_steps, float(lr), carry, device_array(idxs), data)
        bar.update(idxs.shape[0])
    finish_bar(bar)
    return carry[0]


def fit_laplace(
    potential: Potential,
    data: ModelData,
    rng_key: jax.Array,
    *,
    subsample_size: int | None = None,
    num_epochs: float = 2.0,
    learning_rate: float = 0.05,
    max_newton_steps: int = 25,
    chunk_size: int = DEFAULT_CHUNK,
    store_datum_grads: bool = True,
    check_chain: bool | None = None,
    progress: bool = False,
) -> Proxy:
    """Laplace proxy: mode by Adam + full-data Newton, Σ̂ = (∇²f(θ̂))⁻¹ (Baker et al. 2019, Sect. 3).

    The data passes used are counted in ``num_data_passes`` (Adam epochs + one per Newton
    evaluation + one for the axis excursions of :mod:`.checks` + one for the per-datum
    gradients + 202 for the chain check). Raises ``ValueError`` naming the sites if the
    potential is not finite at the mode, or the Hessian there is not positive definite (the
    sites its non-positive directions load on). Warns
    (:class:`~numpyro_subsample.proxies.base.ProxyFitWarning`, naming sites and a remedy) if
    the fit stopped short of the mode, the centre is at a support's boundary, the
    Gaussian is far wider than the posterior along a coordinate (:mod:`.checks`), or short
    full-data MALA chains started at its draws move away from it (:mod:`.chain_check`: the
    joint mode of a hierarchical model far from the posterior's mass).
    ``proxy.info`` holds ``adam_steps``, ``newton_steps``, ``potential`` f(θ̂), ``converged``
    (Newton's criterion met), ``newton_decrement``, ``axis_excursions`` (2, K, on the
    coordinates of :func:`~.checks.excursion_axes`), the chain check's ``chain_sd_ratio`` and
    ``chain_shift`` (None without it), the ``warnings`` issued and ``hessian`` ∇²f(θ̂)
    (float64, d × d, whose inverse is Σ̂).

    Parameters
    ----------
    potential
        The model's :class:`~numpyro_subsample.core.potential.Potential`.
    data
        The model's data (:class:`~numpyro_subsample.core.data.ModelData`).
    rng_key
        Key of Adam's minibatches.
    subsample_size
        Adam's minibatch size (default: the plate's n).
    num_epochs, learning_rate
        Adam's epochs and learning rate.
    max_newton_steps
        Most damped Newton steps on the full data.
    chunk_size
        Data per vmapped evaluation in full-data passes.
    store_datum_grads
        Keep the (N, d) table of ∇f_i(θ̂).
    check_chain
        Run the chain check (:mod:`~.chain_check`, 202 full-data passes); None (default): up
        to :data:`~.chain_check.MAX_CHAIN_CHECK_ROWS` rows. The package's kernels turn it
        off: their warm-up is such a chain, and adapts the proxy to it.
    progress
        Show progress bars.

    Returns
    -------
    Proxy
        N(θ̂, Σ̂) with Σ̂ = (∇²f(θ̂))⁻¹.

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Sect. 3.2 (the centring value from an optimiser).
    """
    t0 = time.perf_counter()
    N = potential.num_data
    n = int(subsample_size or potential.plate.subsample_size)
    num_steps = int(min(max(math.ceil(num_epochs * N / n), 500), 50_000))
    num_steps = -(-num_steps // 250) * 250  # whole blocks: one compiled block program
    theta = _adam_phase(
        potential, data, potential.init_theta, n, num_steps, rng_key, learning_rate, progress
    )
    newton = newton_phase(potential, data, theta, chunk_size, max_newton_steps, progress,
                           passes=num_steps * n / N)
    theta, f, g, h, passes = newton.theta, newton.f, newton.g, newton.h, newton.passes
    hn = np.asarray(h, np.float64)
    gn = np.asarray(g, np.float64)
    labels = coordinate_labels(potential)
    transformed = transformed_coordinates(potential, data)
    _check_finite_at_mode(f, gn, hn, theta, labels, transformed)
    cov, chol = _laplace_covariance(hn, gn, theta, labels, transformed)
    messages, decrement, final = _fit_messages(
        potential, data, theta, cov, gn, hn, labels, transformed, newton.stop, chunk_size
    )
    passes += 1  # the axis excursions
    figures = {"chain_sd_ratio": None, "chain_shift": None, "chain_acceptance": None}
    if runs_chain_check(check_chain, N):
        message, figures = chain_check(potential, data, theta, device_array(chol, theta.dtype),
                                       cov, labels, chunk_size, "Laplace")
        messages += [message] if message else []
        passes += CHAIN_PASSES
    for message in messages:
        warn_proxy(message)
    datum_grads, sum_grads, grad_passes = _datum_gradients(
        potential, data, theta, g, final, chunk_size, store_datum_grads)
    dtype = theta.dtype
    return Proxy(
        centre=theta,
        cov=device_array(cov, dtype),
        scale_tril=device_array(chol, dtype),
        datum_grads=datum_grads,
        sum_grads=sum_grads,
        num_data_passes=float(passes + grad_passes),
        seconds=time.perf_counter() - t0,
        kind="laplace",
        info={
            "adam_steps": num_steps,
            "newton_steps": newton.steps,
            "potential": float(f),
            "converged": newton.stop is None,
            "newton_decrement": decrement,
            "axis_excursions": np.asarray(final.rises),
            "warnings": messages,
            "hessian": hn,
            **figures,
        },
    )


def _check_finite_at_mode(f, gn: np.ndarray, hn: np.ndarray, theta: jax.Array, labels,
                          transformed) -> None:
    """Raise :class:`LaplaceFitError` naming the coordinates where f, ∇f or ∇²f is not finite
    at the mode."""
    if np.all(np.isfinite(hn)) and np.all(np.isfinite(gn)) and np.isfinite(f):
        return
    bad = np.flatnonzero(~(np.isfinite(hn).all(1) & np.isfinite(gn)))
    where = ", ".join(f"'{labels[k]}'" for k in bad[:5]) or "the value itself"
    raise LaplaceFitError(
        f"The potential or its derivatives are not finite at the optimiser's mode (along "
        f"{where}); check the model's support and the data, or pass a smaller proxy "
        "learning rate.",
        boundary=boundary_message(labels, transformed, theta, "Laplace", -gn,
                                  remedy=False) or "",
    )


def _laplace_covariance(hn: np.ndarray, gn: np.ndarray, theta: jax.Array, labels,
                        transformed) -> tuple[np.ndarray, np.ndarray]:
    """Σ̂ = (∇²f)⁻¹ and its Cholesky factor; :class:`LaplaceFitError` naming the sites that
    the directions of non-positive curvature load on when ∇²f is not positive definite."""
    try:
        return _cholesky_of_inverse(hn)
    except np.linalg.LinAlgError as err:
        eig, vec = np.linalg.eigh(0.5 * (hn + hn.T))
        negative = vec[:, eig <= 0]
        load = np.sum(negative**2, axis=1) if negative.size else vec[:, 0] ** 2
        # only the coordinates the degenerate directions load on can be heading out: the
        # gradient of the others at a failed fit says nothing about their support
        degenerate = load > 0.1 * load.max()
        boundary = boundary_message(labels, transformed & degenerate, theta, "Laplace",
                                    -gn * degenerate, remedy=False)
        raise LaplaceFitError(
            f"The Hessian of the potential at the mode is not positive definite (smallest "
            f"eigenvalue {eig.min():.3g}, {int((eig <= 0).sum())} non-positive); the directions "
            f"of negative curvature load on {describe(labels, load, fmt='{:.2f}')}. The "
            "posterior may be improper or multimodal along these sites (e.g. a saddle between "
            "symmetric modes), its joint mode may be degenerate (a hierarchical scale at zero), "
            "or the optimisation did not converge.",
            "The SG kernels' default (AdaptationOptions(proxy=None)) starts such a model from a "
            "variational fit and adapts the proxy on pilot chains; otherwise use stronger "
            "priors on these sites, proxy='variational', or a given proxy.",
            boundary or "",
        ) from err


def _datum_gradients(potential: Potential, data: ModelData, theta: jax.Array, g, final,
                     chunk_size: int, store: bool) -> tuple[jax.Array | None, jax.Array, int]:
    """``(table, Σ_i ∇f_i(θ̂), data passes)``: the (N, d) table of ∇f_i(θ̂) when ``store``
    (or when ∇f is not finite, to check the terms), else the sum from the excursions' pass
    at θ̂ (``final``: ∇f(θ̂) − ∇f0(θ̂)) and no table."""
    if store or not bool(np.all(np.isfinite(np.asarray(g)))):
        values, grads = datum_values_and_grads(potential, theta, data, chunk_size)
        _check_datum_terms(potential, values, grads)
        return (grads if store else None), jnp.sum(grads, axis=0), 1
    return None, device_array(np.asarray(final.grad) - np.asarray(final.prior_grad)), 0


def _fit_messages(potential, data, theta, cov, gn, hn, labels, transformed, stop, chunk_size):
    """Warnings of a Laplace fit with a positive definite Hessian (:mod:`.checks`): not at the
    mode, at a support's boundary, far wider than the posterior along an axis; with the Newton
    decrement and the pass at θ̂ that measured the axis excursions (a :class:`.NewtonPass`)."""
    decrement, offsets = newton_offsets(gn, cov)
    messages = []
    if decrement > MAX_DECREMENT:
        messages.append(
            f"The Laplace fit did not reach the mode: {stop or 'it stopped'}, and the Newton "
            f"decrement (distance to the mode of the local quadratic, in proxy sds) is still "
            f"{decrement:.3g}; the remaining step, in sds, is largest along "
            f"{describe(labels, -offsets)}. Pass more optimiser steps (proxy_kwargs="
            "{'max_newton_steps': ..., 'num_epochs': ...}), a smaller 'learning_rate', or use "
            "proxy='variational'."
        )
    outward = -offsets * (np.abs(offsets) > MAX_DECREMENT) if messages else None
    boundary = boundary_message(labels, transformed, theta, "Laplace", outward)
    messages += [boundary] if boundary else []
    sd = np.sqrt(np.diag(cov))
    axes = excursion_axes(sd)
    coords, steps = excursion_points(sd, axes)
    final = newton_pass(potential, theta, device_array(coords), device_array(steps, theta.dtype),
                        device_array(True), data, chunk_size)
    rises = np.asarray(final.rises)
    found = excursion_messages(
        [labels[k] for k in axes], sd[axes], gn[axes], np.diag(hn)[axes], rises
    )
    if decrement > MAX_DECREMENT:  # a fall away from the centre repeats the message above
        found = [m for m in found if "not a mode" not in m]
    return messages + found, decrement, final


def _check_datum_terms(potential: Potential, values, grads) -> None:
    bad = ~np.asarray(jnp.isfinite(values) & jnp.all(jnp.isfinite(grads), axis=-1))
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"Datum {first} of plate '{potential.plate.name}' (and {int(bad.sum()) - 1} others) "
            "has a non-finite log-likelihood or gradient at the mode; check those rows of the "
            "data for NaN/inf or values outside the likelihood's support."
        )


def proxy_from_moments(
    potential: Potential,
    data: ModelData,
    centre: jax.Array,
    cov: jax.Array,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    store_datum_grads: bool = True,
    kind: str = "user",
    num_data_passes: float = 0.0,
) -> Proxy:
    """A proxy from a given centre and covariance (e.g. a fitted variational guide).

    Parameters
    ----------
    potential, data
        The model's potential and data.
    centre
        θ̂, shape (d,).
    cov
        Σ̂, shape (d, d), positive definite.
    chunk_size
        Data per vmapped evaluation in the pass for ∇f_i(θ̂).
    store_datum_grads
        Keep the (N, d) table of ∇f_i(θ̂); without it only their sum is formed, and
        ``info["potential"]`` holds f(θ̂).
    kind
        Label stored in ``proxy.kind``.
    num_data_passes
        Passes already spent (added to the one of this function).

    Returns
    -------
    Proxy
        The proxy with θ̂, Σ̂ and the per-datum gradients at θ̂.

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Eq. 4 (what the centre's gradients feed).
    """
    t0 = time.perf_counter()
    centre = jnp.asarray(centre)
    cov = 0.5 * (jnp.asarray(cov) + jnp.asarray(cov).T)
    grads, info = None, {}
    if store_datum_grads:
        grads = datum_values_and_grads(potential, centre, data, chunk_size)[1]
        sum_grads = jnp.sum(grads, axis=0)
    else:  # Σ_i ∇f_i(θ̂) = ∇f(θ̂) − ∇f0(θ̂) from one chunked pass: no (N, d) table
        value, grad = value_grad_hessian(potential, centre, data, chunk_size, hessian=False)[:2]
        sum_grads = grad - prior_grad(potential, centre, data)
        info = {"potential": float(value)}
    return Proxy(
        centre=centre,
        cov=cov,
        scale_tril=jnp.linalg.cholesky(cov),
        datum_grads=grads,
        sum_grads=sum_grads,
        num_data_passes=num_data_passes + 1.0,
        seconds=time.perf_counter() - t0,
        kind=kind,
        info=info,
    )
