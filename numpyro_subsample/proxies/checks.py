"""Checks of a fitted proxy, from quantities the fit computes, reported by site.

A proxy (θ̂, Σ̂ = LLᵀ) is only useful to the estimators and the step-size rule if θ̂ is a mode
and the Gaussian N(θ̂, Σ̂) describes the posterior over about one proxy sd. The checks here
read the final gradient g = ∇f(θ̂), Σ̂ (or the Hessian) and the optimiser's trace, and name the
sites of the offending flat coordinates (:func:`coordinate_labels`):

* the Newton decrement λ = ‖Lᵀg‖ = √(gᵀΣ̂g): the distance from θ̂ to the mode of the local
  quadratic model in proxy-sd units (Boyd and Vandenberghe 2004, Sect. 9.5.1); ≪ 1 at a mode;
  the remaining step Σ̂g, coordinate k in units of its sd, says where;
* a centre at the boundary of a constrained site's support: |θ̂_k| > :data:`BOUNDARY` in the
  unconstrained coordinate (a scale e^θ of 3·10⁻⁷ or 3·10⁶, a probability within 3·10⁻⁷ of 0
  or 1), or, for a fit that failed, |θ̂_k| > :data:`DRIFT` with the optimiser still moving
  outward: the degenerate joint mode of a centred hierarchical model at τ → 0 among them
  (with the J group effects at their mean, f = (J − 1) log τ + const, unbounded below);
* the Gaussian shape along each coordinate axis (:func:`newton_pass`, one data pass; up to
  :data:`MAX_AXES` axes, :func:`excursion_axes`):
  f(θ̂ ± s_k e_k) − f(θ̂), s_k = Σ̂_kk^{1/2}, against the quadratic model's ±s_k g_k +
  s_k² H_kk / 2. A rise far above it means the posterior is much narrower than the proxy on
  that side (a mode at infinity, e.g. separable data under a weak prior, where the gradient
  noise measured under the proxy, and the step size chosen from it, are meaningless); a fall
  means θ̂ is not a mode along that axis;
* for a Gaussian variational guide N(m, Σ), Stein's identity at guide draws
  (:func:`stein_moments`): a stationary guide has E_q[∇f] = 0 (else its mean is off by the
  Newton step Σ E_q[∇f], :mod:`.fit_checks`) and diag(E_q[∇²f]) = diag(Σ⁻¹); far
  below, its scale has collapsed (too large a learning rate), far above, it is too wide.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.distributions.transforms import IdentityTransform, IndependentTransform

from numpyro_subsample.core.data import device_array
from numpyro_subsample.core.datapass import DEFAULT_CHUNK, full_data_sums
from numpyro_subsample.core.potential import ModelData, Potential, set_plate_indices
from numpyro_subsample.proxies.base import ProxyFitWarning

__all__ = [
    "BOUNDARY",
    "DRIFT",
    "MAX_DECREMENT",
    "NewtonPass",
    "coordinate_labels",
    "transformed_coordinates",
    "describe",
    "newton_offsets",
    "boundary_message",
    "excursion_axes",
    "excursion_points",
    "excursion_messages",
    "scale_message",
    "stein_moments",
    "stein_subsample",
    "newton_pass",
    "newton_point",
    "prior_grad",
    "warn_proxy",
]

BOUNDARY = 15.0  # |unconstrained coordinate| of a constrained site at its support's boundary
DRIFT = 4.0  # |unconstrained coordinate| beyond which a failed fit moving outward is reported
MAX_DECREMENT = 0.1  # largest Newton decrement (proxy sds) of a converged fit
RISE_FACTOR, RISE_SLACK = 20.0, 5.0  # excursion rise > 20 × quadratic + 5 nats: proxy too wide
MAX_DROP = 1.0  # excursion fall (nats) one proxy sd from a mode
MIN_STEIN_RATIO = 0.1  # Stein ratio outside (0.1, 10): the guide's sd > 3 times off
MAX_STEIN_DATA = 4096  # data read per draw by the Stein check
MAX_AXES = 128  # coordinates visited by the axis excursions (2 evaluations of f each)
EXCURSION_BATCH = 64  # most excursion points evaluated together (vmapped) per chunk


def coordinate_labels(potential: Potential) -> tuple[str, ...]:
    """The site (and index) of each flat coordinate of θ, e.g. ``('beta[0]', 'beta[1]', 'tau')``."""
    labels = []
    for name, shape in _layout(potential).items():  # in the order of the flat vector
        if not shape:
            labels.append(name)
            continue
        labels += [f"{name}[{','.join(map(str, multi))}]" for multi in np.ndindex(shape)]
    return tuple(labels)


def _layout(potential: Potential) -> dict:
    """``{site: shape}`` of the unconstrained latent sites, in the order ``unravel`` reads
    the flat θ (found without evaluating anything)."""
    shapes = jax.eval_shape(potential.unravel, potential.init_theta)
    leaves, treedef = jax.tree.flatten(shapes)
    order = jax.tree.unflatten(treedef, list(range(len(leaves))))
    names = sorted(order, key=order.get)
    return {name: tuple(shapes[name].shape) for name in names}


def _identity(transform) -> bool:
    while isinstance(transform, IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, IdentityTransform)


def transformed_coordinates(potential: Potential, data: ModelData) -> np.ndarray:
    """Boolean (d,): coordinates of sites with a constrained support (a non-identity bijection)."""
    constrained = {}

    def run(data):
        args, kwargs = data.args_kwargs()
        one = set_plate_indices(potential.model, name=potential.plate.name, indices=jnp.arange(1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tr = handlers.trace(handlers.seed(one, jax.random.PRNGKey(0))).get_trace(
                *args, **kwargs
            )
        for name in potential.latent_sites:
            constrained[name] = not _identity(biject_to(tr[name]["fn"].support))
        return jnp.zeros(())

    jax.eval_shape(run, data)
    return np.concatenate([np.full(int(np.prod(shape)), constrained[name], bool)
                           for name, shape in _layout(potential).items()] or [np.zeros(0, bool)])


def describe(labels, values, *, top: int = 3, fmt: str = "{:.3g}") -> str:
    """``'beta[1]' (12.3), 'tau' (-4.1)``: the ``top`` coordinates of largest |value|
    (those above 5% of the largest)."""
    values = np.asarray(values, np.float64)
    size = np.nan_to_num(np.abs(values), nan=np.inf)
    order = np.argsort(-size, kind="stable")[:top]
    order = order[size[order] >= 0.05 * size[order[0]]]  # leave out negligible ones
    return ", ".join(f"'{labels[k]}' ({fmt.format(values[k])})" for k in order)


def newton_offsets(grad, cov) -> tuple[float, np.ndarray]:
    """Newton decrement λ = √(gᵀΣ̂g) and the remaining step (Σ̂g)_k / Σ̂_kk^{1/2} (sd units)."""
    g = np.asarray(grad, np.float64)
    cov = np.asarray(cov, np.float64)
    step = cov @ g
    decrement = float(np.sqrt(max(g @ step, 0.0)))
    return decrement, step / np.sqrt(np.diag(cov))


#: The remedy of :func:`boundary_message` (the SG kernels').
BOUNDARY_REMEDY = (
    "The SG kernels' default (AdaptationOptions(proxy=None)) re-estimates the proxy on pilot "
    "chains; otherwise use proxy='variational', or a prior that keeps the site away from the "
    "boundary."
)


def boundary_message(labels, transformed, centre, kind: str, direction=None,
                     remedy: bool = True) -> str | None:
    """Message for a centre at (or, for a failed fit, heading to) a support's boundary, or None.

    A constrained coordinate is at the boundary if |θ̂_k| > :data:`BOUNDARY`; given the
    ``direction`` the optimiser would still move in (−g, or the remaining Newton step, of a
    fit that failed), also if |θ̂_k| > :data:`DRIFT` and that direction points further out.
    With ``remedy`` the message ends with :data:`BOUNDARY_REMEDY`.
    """
    centre = np.asarray(centre, np.float64)
    at = transformed & ~(np.abs(centre) <= BOUNDARY)
    if direction is not None:
        outward = np.nan_to_num(np.asarray(direction, np.float64) * np.sign(centre)) > 0
        at |= transformed & outward & (np.abs(centre) > DRIFT)
    if not at.any():
        return None
    where = describe([labels[k] for k in np.flatnonzero(at)], centre[at])
    return (
        f"The {kind} proxy's centre lies at, or the fit was heading to, the boundary of the "
        f"support of {where} (unconstrained value; for a log-transformed scale, e^θ; beyond "
        f"±{BOUNDARY:g} is at the boundary). The mode is degenerate, as "
        "for a hierarchical scale at zero (the joint mode of a centred hierarchical model) or "
        "a probability at 0 or 1, so a Gaussian at the mode is a poor proxy."
        + (" " + BOUNDARY_REMEDY if remedy else "")
    )


def excursion_axes(sd) -> np.ndarray:
    """The coordinates the excursions visit: all up to :data:`MAX_AXES`, else the
    ``MAX_AXES / 2`` of largest and of smallest sd (where a too wide or a collapsed proxy
    shows first)."""
    d = len(sd)
    if d <= MAX_AXES:
        return np.arange(d)
    order = np.argsort(np.asarray(sd), kind="stable")
    return np.sort(np.concatenate([order[: MAX_AXES // 2], order[-(MAX_AXES // 2):]]))


def _batch(points: int) -> int:
    """Points per vmapped batch: at most :data:`EXCURSION_BATCH`, in equal batches."""
    batches = max(1, -(-points // EXCURSION_BATCH))
    return max(1, -(-points // batches))


class NewtonPass(NamedTuple):
    """What :func:`newton_pass` returns: f(θ), ∇f(θ), ∇²f(θ) (∇²f0(θ) alone in a pass with
    excursions), the prior term's gradient ∇f0(θ) and the axis excursions ``rises`` (2, K)."""

    value: jax.Array
    grad: jax.Array
    hessian: jax.Array
    prior_grad: jax.Array
    rises: jax.Array


def excursion_points(sd, axes) -> tuple[np.ndarray, np.ndarray]:
    """``(coords, steps)``, each (2K,), of the excursions θ̂ + s_k e_k, then θ̂ − s_k e_k, for
    the K coordinates ``axes`` with sds ``sd`` (all coordinates' sds)."""
    axes = np.asarray(axes, np.int32)
    step = np.asarray(sd)[axes]
    return np.concatenate([axes, axes]), np.concatenate([step, -step])


def newton_point(potential: Potential, theta: jax.Array, data: ModelData,
                 chunk_size: int = DEFAULT_CHUNK) -> NewtonPass:
    """:func:`newton_pass` without excursions: f(θ), ∇f(θ), ∇²f(θ) and ∇f0(θ) in one data pass,
    by the program of a Laplace fit's Newton steps (excursion points of the same shape), so
    that every full-data expansion of a potential shares one compiled program."""
    num_points = 2 * excursion_axes(np.ones(potential.dim)).size
    return newton_pass(potential, theta, device_array(np.zeros(num_points, np.int32)),
                       device_array(np.zeros(num_points), theta.dtype), device_array(False),
                       data, chunk_size)


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def newton_pass(
    potential: Potential,
    theta: jax.Array,
    coords: jax.Array,
    steps: jax.Array,
    with_excursions: jax.Array,
    data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
) -> NewtonPass:
    """f(θ), ∇f(θ), ∇f0(θ) and either ∇²f(θ) or, if ``with_excursions`` (a traced bool), the
    axis excursions f(θ + s_j e_{k_j}) − f(θ) for ``coords`` k and ``steps`` s
    (:func:`excursion_points`), shape (2, K), in one data pass (the other is zeros: the
    Hessian part is ∇²f0 alone): the Newton steps of a Laplace fit and its excursion check
    share one compiled program, and the check, made at the Newton phase's last point, does
    not compute its Hessian again.

    The differences are taken per datum before summing, so they keep their precision when f
    itself is a large sum. The points are evaluated :data:`EXCURSION_BATCH` at a time
    (vmapped), so that a linear predictor becomes one matrix product per chunk.
    """
    zero = jnp.zeros(steps.shape, theta.dtype)

    def data_rises(idx, mask):
        def rises():
            base = potential.data_terms(theta, idx, data)

            def one(args):
                k, step = args
                diff = potential.data_terms(theta.at[k].add(step), idx, data) - base
                return jnp.sum(jnp.where(mask, diff, 0.0))

            return jax.lax.map(one, (coords, steps), batch_size=_batch(int(steps.shape[0])))

        return jax.lax.cond(with_excursions, rises, lambda: zero)

    sums = full_data_sums(potential, theta, data, chunk_size, True, data_rises, zero,
                          hessian_if=jnp.logical_not(with_excursions))
    prior = jax.vmap(lambda k, step: potential.prior(theta.at[k].add(step), data))(
        coords, steps
    )
    rises = jnp.where(with_excursions, sums.extra + prior - sums.prior_value, zero)
    return NewtonPass(value=sums.value, grad=sums.grad, hessian=sums.hessian,
                      prior_grad=sums.prior_grad, rises=rises.reshape(2, -1))


def excursion_messages(labels, sd, grad, hess_diag, rises) -> list[str]:
    """Messages for the axis excursions ``rises`` (2, K): rows θ̂ + s e_k, θ̂ − s e_k, for the
    K coordinates ``labels`` with sds ``sd``, gradient ``grad`` and Hessian diagonal
    ``hess_diag``."""
    sd = np.asarray(sd, np.float64)
    g = np.asarray(grad, np.float64)
    quad = np.stack([sd * g, -sd * g]) + 0.5 * sd**2 * np.asarray(hess_diag, np.float64)
    rises = np.asarray(rises, np.float64)
    rises = np.where(np.isnan(rises), np.inf, rises)
    messages = []
    excess = rises - (RISE_FACTOR * np.maximum(quad, 0.0) + RISE_SLACK)
    wide = np.flatnonzero((excess > 0).any(0))
    if wide.size:
        side = np.argmax(excess[:, wide], 0)
        worst = rises[side, wide]
        items = ", ".join(
            f"'{labels[k]}' ({'+-'[s]}1 sd: {r:.3g} nats, quadratic {quad[s, k]:.3g})"
            for k, s, r in sorted(zip(wide, side, worst, strict=True), key=lambda t: -t[2])[:3]
        )
        messages.append(
            f"The Gaussian proxy is much wider than the posterior along {items}: one proxy sd "
            "from the centre the potential rises far above the proxy's quadratic. The mode is "
            "probably at infinity and held by the prior only (for a classifier: separable "
            "data under a weak prior), so the gradient noise measured under the proxy, and the "
            "default step size chosen from it, are meaningless. Use a stronger prior, "
            "proxy='variational', or check the data for separation (a predictor that splits "
            "the outcomes perfectly)."
        )
    falls = np.flatnonzero((rises < -MAX_DROP).any(0))
    if falls.size:
        where = describe([labels[k] for k in falls], rises[:, falls].min(0))
        messages.append(
            f"The proxy's centre is not a mode along {where} (the potential, in nats, one "
            "proxy sd away along that coordinate, relative to the centre): the optimiser "
            "stopped early or the posterior is multimodal. Pass more "
            "optimiser steps (proxy_kwargs={'num_epochs': ..., 'max_newton_steps': ...}) or "
            "use proxy='variational'."
        )
    return messages


def stein_subsample(num_data: int, num_draws: int) -> np.ndarray:
    """Plate indices for :func:`stein_moments`: (num_draws + 1)·m ≤ max(N, 512·(S + 1))
    datum gradients, i.e. at most one data pass for N ≥ 512·(S + 1); uniform, fixed seed."""
    m = int(min(num_data, MAX_STEIN_DATA, max(512, num_data // (num_draws + 1))))
    return np.sort(np.random.default_rng(0).choice(num_data, m, replace=False)).astype(np.int32)


@partial(jax.jit, static_argnames=("potential",))
def stein_moments(
    potential: Potential,
    centre: jax.Array,
    scale_tril: jax.Array,
    z: jax.Array,
    idx: jax.Array,
    data: ModelData,
) -> tuple[jax.Array, jax.Array]:
    """E_q[∇f(θ)] − ∇f(m) and diag(Σ⁻¹ E_q[(θ − m)∇f(θ)ᵀ]) for q = N(m, Σ = LLᵀ), from the
    draws θ_s = m + L z_s (pass antithetic pairs z, −z: the first then has no linear term).

    A stationary Gaussian guide has E_q[∇f] = 0 and, by Stein's lemma E_q[(θ − m)∇f(θ)ᵀ] =
    Σ E_q[∇²f], E_q[∇²f] = Σ⁻¹ for a full-rank guide, diag(E_q[∇²f]) = diag(Σ⁻¹) for a
    diagonal or low-rank-plus-diagonal one (the fixed-point conditions of the Gaussian
    variational approximation, Opper and Archambeau 2009); both are Stein identities of the
    posterior, E_p[∇f] = 0 and E_p[(θ − m)∇fᵀ] = I, read under q. ∇f(θ_s) enters as its
    change since m, ∇f(θ_s) − ∇f(m) (a control variate), and the data part of that change is
    the subsample ``idx``'s, scaled by N / len(idx) (unbiased; exact when idx holds every
    datum).
    """
    scale = potential.num_data / idx.shape[0]
    sub_grad = jax.grad(lambda t: jnp.sum(potential.data_terms(t, idx, data)))
    prior = jax.grad(lambda t: potential.prior(t, data))
    g0, p0 = sub_grad(centre), prior(centre)

    def one(zs):
        theta = centre + scale_tril @ zs
        change = scale * (sub_grad(theta) - g0) + (prior(theta) - p0)
        w = jax.scipy.linalg.solve_triangular(scale_tril.T, zs, lower=False)  # Σ⁻¹(θ − m)
        return change, w * change

    change, curvature = jax.lax.map(one, z)
    return jnp.mean(change, axis=0), jnp.mean(curvature, axis=0)


def scale_message(labels, ratio) -> str | None:
    """Message for a guide whose variances are far from the posterior's, or None.

    ``ratio`` is the curvature of :func:`stein_moments` over diag(Σ⁻¹): 1 for a stationary
    Gaussian guide, about c⁻² for a guide whose sd along coordinate k is c times too small.
    """
    ratio = np.asarray(ratio, np.float64)
    bad = ~((ratio > MIN_STEIN_RATIO) & (ratio < 1.0 / MIN_STEIN_RATIO))
    if not bad.any():
        return None
    size = np.abs(np.log(np.clip(ratio[bad], 1e-300, None)))  # the worst first
    order = np.flatnonzero(bad)[np.argsort(-size, kind="stable")][:3]
    where = ", ".join(f"'{labels[k]}' ({ratio[k]:.2g})" for k in order)
    return (
        f"The guide's variances are far from the posterior's along {where}: the ratio of "
        "diag E_q[∇²f] (Stein's identity at guide draws) to diag Σ⁻¹ of the guide is 1 for a "
        "stationary Gaussian guide, ≪ 1 for a collapsed guide scale, ≫ 1 for one too wide. "
        "SVI has not converged or diverged, as with too large a learning rate or too noisy "
        "an ELBO gradient: pass a smaller learning_rate (proxy_kwargs={'learning_rate': ...}) "
        "and more max_steps, or a larger subsample_size (the noise grows as N/n)."
    )


@partial(jax.jit, static_argnames=("potential",))
def prior_grad(potential: Potential, theta: jax.Array, data: ModelData) -> jax.Array:
    """∇f0(θ), the prior term's gradient (no data pass)."""
    return jax.grad(potential.prior)(theta, data)


def warn_proxy(message: str) -> None:
    """Issue ``message`` as a :class:`ProxyFitWarning`."""
    warnings.warn(message, ProxyFitWarning, stacklevel=3)
