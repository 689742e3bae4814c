"""The noise of a gradient estimator in coordinates whitened by the proxy, at proxy draws.

The covariance V(θ) = Cov[Lᵀ g(θ)] of an estimator g at a point θ is computed exactly from
the design's second moments, one chunked data pass per point, or by Monte Carlo for an
estimator without them (:mod:`numpyro_subsample.estimators.noise_covariance`). The points are
the centre and ``num_points − 1`` draws θ ~ N(θ̂, Σ̂). The stationary variance of a
stochastic-gradient chain is inflated by the noise averaged over the states it visits, so the
reported matrix is the mean V̄ = mean_j V(θ_j) over the proxy draws (the centre, where a
control variate has no noise at all, is left out) and the figure its largest eigenvalue. The
adaptive estimator is evaluated at the size n_t(θ) it uses at each point (Putcha et al. 2023,
Eq. 19): its actual noise there.

A control variate's noise is heavy-tailed over θ (rare rows whose residuals change sign in
part of the posterior), so a mean over few points is noisy: :func:`extend_noise` adds draws,
and :func:`direction_errors` gives the standard error of each eigenvalue of V̄ from the spread
over the draws of e_kᵀ V(θ_j) e_k, e_k the eigenvectors of the first measurement's V̄ (the
first-order change of a simple eigenvalue under a perturbation δV is e_kᵀ δV e_k). The
measurement keeps V̄, the e_k and these projections, never the per-draw matrices: O(d² +
draws · d) float64 numbers with a dense L, while a call holds its own points' covariances in
the working dtype (``num_points`` · d² numbers,
:func:`~numpyro_subsample.estimators.noise_covariance.point_covariances`). The directions are
not re-fitted to the V̄ of more draws: the spread along a new direction e needs every
(eᵀ V(θ_j) e)², a quartic form in e that only the d × d matrices of all draws determine.

Structured whitening (L a :class:`~numpyro_subsample.proxies.covariance.StructuredCovariance`,
for large d) forms no d × d matrix: the largest eigenvalue of V̄ comes from Lanczos, one data
pass per iteration and draw (:mod:`numpyro_subsample.estimators.noise_matrix_free`); ``cov``,
the directions and their errors (and the noise correction that needs them) are not available.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.data import device_array
from numpyro_subsample.core.datapass import DEFAULT_CHUNK
from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.core.rng import host_generator
from numpyro_subsample.estimators.base import GradientEstimator
from numpyro_subsample.estimators.noise_covariance import point_covariances
from numpyro_subsample.estimators.noise_matrix_free import matrix_free_noise
from numpyro_subsample.proxies.whitening import Scale, is_structured, whiten_matvec

__all__ = [
    "MIN_USEFUL_STEP",
    "PROXY_MISMATCH_FACTOR",
    "CurvatureLimitedStepWarning",
    "NoiseLimitedStepWarning",
    "WhitenedNoise",
    "noise_points",
    "whitened_noise",
    "extend_noise",
    "direction_errors",
    "measure_whitened_noise",
    "warn_if_noise_limited",
]

#: Below this time step (whitened units) the chain is noise-limited: SGLD on a whitened
#: Gaussian is AR(1) with coefficient 1 − h, integrated autocorrelation time (2 − h)/h ≈ 2/h,
#: so h < 1e-4 costs over 2·10⁴ steps per independent draw, over 10⁶ for 50 of them.
MIN_USEFUL_STEP = 1e-4

#: A minibatch of n from N has noise covariance about (N/n) × the whitened per-datum gradient
#: covariance, which near a Gaussian posterior is about the whitened curvature μ (≈ 1 with a
#: matching proxy). A noise-limited step whose v · n/N exceeds this factor × max(μ, 1) comes
#: from points where the gradients are far larger than the proxy's curvature says: the proxy
#: does not describe the posterior there, and the warning says so instead of suggesting
#: control variates or a larger subsample.
PROXY_MISMATCH_FACTOR = 10.0


class NoiseLimitedStepWarning(UserWarning):
    """The estimator's gradient noise forces a step size too small for the chain to mix."""


class CurvatureLimitedStepWarning(UserWarning):
    """The potential's curvature where the chains went, not the gradient noise, forces a step
    size too small for the chain to mix."""


class WhitenedNoise(NamedTuple):
    """The noise of an estimator in whitened coordinates at a few points.

    ``largest``: the largest eigenvalue of ``cov`` (the v of the step-size rules);
    ``cov``: the (d, d) covariance averaged over the proxy draws (module docstring);
    ``points``: the (P, d) θ's, the centre first; ``data_passes``: data passes spent;
    ``exact``: False for the Monte Carlo fallback; ``basis``: (d, d) orthonormal directions
    e_k, the eigenvectors of the first measurement's ``cov`` (ascending eigenvalues; after
    :func:`extend_noise`, ordered by e_kᵀ ``cov`` e_k); ``along``: (draws, d) the projections
    e_kᵀ V(θ_j) e_k at every proxy draw (at the centre for P = 1). Under a structured
    whitening ``cov``, ``basis`` and ``along`` are None and ``ritz_values`` holds the Ritz
    values of the mean covariance, largest first (for the Monte Carlo fallback, its nonzero
    eigenvalues).
    """

    largest: float
    cov: np.ndarray | None
    points: np.ndarray
    data_passes: float
    exact: bool
    ritz_values: np.ndarray | None = None
    basis: np.ndarray | None = None
    along: np.ndarray | None = None


@jax.jit
def _shifted(centre: jax.Array, point_tril: Scale, z: jax.Array) -> jax.Array:
    return jnp.concatenate([centre[None], centre + whiten_matvec(point_tril, z)])


def noise_points(
    centre: jax.Array, point_tril: Scale, rng_key: jax.Array, num_points: int = 4
) -> jax.Array:
    """The centre and ``num_points − 1`` draws from N(centre, L Lᵀ), L = ``point_tril``.

    The standard normals come from NumPy's generator seeded with the bits of ``rng_key`` (the
    same key gives the same points): a one-off draw that needs no compiled program, nor does
    the shift by a dense L (made by NumPy; a structured L by its own products).
    """
    z = host_generator(rng_key).standard_normal((int(num_points) - 1, centre.shape[0]))
    if is_structured(point_tril):
        return _shifted(centre, point_tril, device_array(z, centre.dtype))
    c = np.asarray(centre, np.float64)
    points = np.concatenate([c[None], c + z @ np.asarray(point_tril, np.float64).T])
    return device_array(points, centre.dtype)


def _projections(cov: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """e_kᵀ V e_k for every column e_k of ``basis``, (d,)."""
    return np.einsum("ik,ik->k", basis, cov @ basis)


class NonFiniteNoiseError(ValueError):
    """The gradient estimator was not finite at any proxy draw where its noise was measured;
    ``passes``: the data passes its preprocessing had spent."""

    def __init__(self, message: str, passes: float = 0.0) -> None:
        super().__init__(message)
        self.passes = float(passes)


def _non_finite_error(count: int) -> NonFiniteNoiseError:
    return NonFiniteNoiseError(
        f"The gradient estimator's noise is not finite at any of the {count} proxy draws "
        "where it was measured: the proxy puts its draws where the model's log density or "
        "its gradient overflows (e.g. a group scale near 0 in a hierarchical model written "
        "centred, whose joint mode degenerates). Write the group effects non-centred, "
        "reparam(model, {'a': LocScaleReparam(0)}), or pass proxy='variational' or a "
        "step_size.")


def _summarise(cov_at: Callable[[int], np.ndarray], points: Sequence[int]):
    """``(mean, its eigenvalues, eigenvectors, projections (len(kept), d))`` of the
    covariances ``cov_at(p)`` over the ``points`` where they are finite (a proxy draw
    where the model's density overflows tells nothing of the noise where the chain runs),
    each formed twice and never all at once; :class:`NonFiniteNoiseError` where none is."""
    total, kept = None, []
    for p in points:
        v = cov_at(p)
        if np.all(np.isfinite(v)):
            total = v if total is None else total + v
            kept.append(p)
    if not kept:
        raise _non_finite_error(len(points))
    cov = total / len(kept)
    lam, basis = np.linalg.eigh(cov)
    along = np.stack([_projections(cov_at(p), basis) for p in kept])
    return cov, lam, basis, along


def _structured_noise(estimator, centre, scale, rng_key, data, point_tril, num_points,
                      chunk_size, num_draws, num_iter) -> WhitenedNoise:
    P = int(num_points)
    thetas = noise_points(centre, point_tril, rng_key, P)
    draws = thetas[1:] if P > 1 else thetas  # the mean is over the proxy draws (as dense)
    ritz, passes, exact = matrix_free_noise(
        estimator, draws, scale, rng_key, data, chunk_size, num_draws, num_iter
    )
    return WhitenedNoise(largest=float(max(ritz[0], 0.0)), cov=None, points=np.asarray(thetas),
                         data_passes=float(passes), exact=exact, ritz_values=ritz)


def whitened_noise(
    estimator: GradientEstimator,
    centre: jax.Array,
    scale_tril: Scale,
    rng_key: jax.Array,
    data: ModelData,
    *,
    point_tril: Scale | None = None,
    num_points: int = 9,
    chunk_size: int = DEFAULT_CHUNK,
    num_draws: int = 16,
    lanczos_iterations: int | None = None,
) -> WhitenedNoise:
    """The noise of ``estimator`` in coordinates θ = centre + L w (L = ``scale_tril``) at the
    centre and ``num_points − 1`` draws θ ~ N(centre, Lp Lpᵀ), Lp = ``point_tril`` (default
    L; pass the proxy's factor when the chain is not whitened).

    Exact (module docstring) when the estimator states its second moments, else a Monte
    Carlo estimate from ``num_draws`` subsamples per point; the exact figure does not
    evaluate the centre, left out of the mean, unless it is the only point. With a structured
    L (and Lp) the figure is matrix-free (module docstring; ``lanczos_iterations``, default
    :data:`~numpyro_subsample.estimators.noise_matrix_free.NOISE_LANCZOS_ITERATIONS`, two
    data passes each per draw). Memory: O(d² + num_points · d)
    float64 numbers kept, and ``num_points`` · d² in the working dtype while it runs (dense);
    no d × d array (structured).
    """
    if int(num_points) < 1:
        raise ValueError(f"num_points must be a positive integer, got {num_points!r}.")
    tril_p = scale_tril if point_tril is None else point_tril
    if is_structured(scale_tril) or is_structured(tril_p):
        if not (is_structured(scale_tril) and is_structured(tril_p)):
            raise ValueError(
                "scale_tril and point_tril must be of one kind (both dense factors or both "
                "StructuredCovariance)."
            )
        return _structured_noise(estimator, centre, scale_tril, rng_key, data, tril_p,
                                 num_points, chunk_size, num_draws, lanczos_iterations)
    P = int(num_points)
    thetas = np.asarray(noise_points(centre, tril_p, rng_key, P))  # sliced on the host
    exact = estimator.moments is not None
    skip = int(P > 1 and exact)  # the centre, left out of the mean, is not evaluated
    cov_at, passes = point_covariances(estimator, thetas[skip:], scale_tril, rng_key, data,
                                       exact=exact, chunk_size=chunk_size, num_draws=num_draws)
    cov, lam, basis, along = _summarise(
        lambda p: cov_at(p - skip), range(1, P) if P > 1 else range(1))
    return WhitenedNoise(largest=float(lam[-1]), cov=cov, points=thetas,
                         data_passes=float(passes), exact=exact, ritz_values=None, basis=basis,
                         along=along)


def extend_noise(
    estimator: GradientEstimator,
    measured: WhitenedNoise,
    scale_tril: jax.Array,
    rng_key: jax.Array,
    data: ModelData,
    *,
    point_tril: jax.Array | None = None,
    num_points: int = 9,
    chunk_size: int = DEFAULT_CHUNK,
    num_draws: int = 16,
) -> WhitenedNoise:
    """``measured`` with ``num_points`` more proxy draws (the same law as
    :func:`whitened_noise`, whose centre ``measured.points[0]`` it keeps); the mean covariance
    and its largest eigenvalue are recomputed over all draws, and the new draws' projections
    on ``measured.basis`` are appended (a measurement of the centre alone is replaced by the
    new draws, as the mean leaves the centre out). With the default ``num_points`` the
    compiled pass of :func:`whitened_noise` is reused. Dense whitening only (a structured
    measurement keeps no covariances to extend); memory as there."""
    if measured.along is None:
        raise ValueError(
            "extend_noise needs the per-point covariances of a dense measurement; a structured "
            "(matrix-free) measurement has none."
        )
    centre = jnp.asarray(measured.points[0])
    tril_p = scale_tril if point_tril is None else point_tril
    z = jax.random.normal(rng_key, (int(num_points), centre.shape[0]), centre.dtype)
    thetas = centre + z @ tril_p.T
    cov_at, passes = point_covariances(estimator, thetas, scale_tril, rng_key, data,
                                       exact=measured.exact, chunk_size=chunk_size,
                                       num_draws=num_draws)
    points = np.concatenate([measured.points, np.asarray(thetas)])
    passes = measured.data_passes + float(passes)
    if measured.points.shape[0] == 1:  # the centre alone: the mean is over the new draws
        cov, lam, basis, along = _summarise(cov_at, range(int(num_points)))
        return WhitenedNoise(largest=float(lam[-1]), cov=cov, points=points, data_passes=passes,
                             exact=measured.exact, ritz_values=None, basis=basis, along=along)
    total = measured.cov * measured.along.shape[0]
    rows = []
    for p in range(int(num_points)):
        v = cov_at(p)
        if not np.all(np.isfinite(v)):
            continue  # a draw where the model overflows (as in _summarise)
        total = total + v
        rows.append(_projections(v, measured.basis))
    if not rows:
        return measured._replace(points=points, data_passes=passes)
    along = np.concatenate([measured.along, np.stack(rows)])
    cov = total / along.shape[0]
    order = np.argsort(along.mean(0), kind="stable")
    return WhitenedNoise(largest=float(np.linalg.eigvalsh(cov).max()), cov=cov, points=points,
                         data_passes=passes, exact=measured.exact, ritz_values=None,
                         basis=measured.basis[:, order], along=along[:, order])


def direction_errors(measured: WhitenedNoise) -> tuple[np.ndarray, np.ndarray | None]:
    """Eigenvalues λ_k of the mean covariance over the proxy draws (ascending) and the
    standard error of each: the spread over the draws of e_kᵀ V(θ_j) e_k, / sqrt(draws), e_k
    the directions ``measured.basis`` (module docstring: the eigenvectors of the mean for a
    measurement that was not extended, else those of the first measurement's, paired with the
    λ_k by the order of e_kᵀ V̄ e_k).

    The noise correction injects 2ch − h²λ̂_k along e_k, so an error λ̂_k − λ_k changes the
    stationary variance there by the fraction h(λ_k − λ̂_k)/(2c) (whitened curvature 1).
    Returns zeros for the standard errors with fewer than two draws, and the Ritz values
    with no standard errors (None) for a structured measurement.
    """
    if measured.cov is None:
        return np.sort(np.asarray(measured.ritz_values, np.float64)), None
    lam = np.linalg.eigvalsh(measured.cov)
    along = measured.along
    if along.shape[0] < 2:
        return lam, np.zeros_like(lam)
    return lam, along.std(0, ddof=1) / np.sqrt(along.shape[0])


def measure_whitened_noise(
    estimator: GradientEstimator,
    centre: jax.Array,
    scale_tril: jax.Array,
    rng_key: jax.Array,
    data: ModelData,
    **kwargs,
) -> tuple[float, np.ndarray]:
    """``(largest eigenvalue, covariance)`` of :func:`whitened_noise` (same arguments)."""
    noise = whitened_noise(estimator, centre, scale_tril, rng_key, data, **kwargs)
    return noise.largest, noise.cov


def warn_if_noise_limited(
    estimator: GradientEstimator,
    noise: float,
    step_size: float,
    *,
    curvature: float = 1.0,
    model_remedy: Callable[[], str] | None = None,
    noise_free_step: float | None = None,
    curvature_site: str = "",
    stacklevel: int = 2,
) -> None:
    """Warn when the step size chosen from the noise is below :data:`MIN_USEFUL_STEP`.

    Where the rule's step without noise, ``noise_free_step``, is itself below it and the noise
    lowers the step by less than half, the curvature μ = ``curvature`` (the whitened
    curvature the step rule used, largest along ``curvature_site``) sets the step: a
    :class:`CurvatureLimitedStepWarning` says so, and that neither a larger subsample nor
    control variates raise it. Otherwise a :class:`NoiseLimitedStepWarning` names the
    estimator, the noise, the step and the remedy (a proxy far from the posterior when
    v·n/N > :data:`PROXY_MISMATCH_FACTOR` × max(μ, 1); there the remedy ``model_remedy()``
    gives, if any: a way of writing the model that the kernels sample better)."""
    if not step_size < MIN_USEFUL_STEP:
        return
    name = estimator.name
    free = math.nan if noise_free_step is None else float(noise_free_step)
    if free < MIN_USEFUL_STEP and step_size >= 0.5 * free:
        _warn_curvature_limited(estimator, noise, step_size, free, float(curvature),
                                curvature_site, stacklevel=stacklevel + 1)
        return
    implied = noise * estimator.subsample_size / max(estimator.num_data, 1)
    mismatch = implied > PROXY_MISMATCH_FACTOR * max(float(curvature), 1.0)
    written = model_remedy() if mismatch and model_remedy is not None else ""
    implied_text = (
        f"At the proxy's draws this noise implies a whitened curvature of about "
        f"v·n/N = {implied:.3g}, against μ = {float(curvature):.3g} that the proxy assumes: "
    )
    if written:
        remedy = (implied_text + "the posterior is far from Gaussian in the coordinates "
                  f"sampled. {written[0].upper()}{written[1:]}.")
    elif mismatch:
        remedy = implied_text + (
            "the proxy is far from the posterior there (a posterior that is not "
            "nearly Gaussian, such as a neural network's, or a failed proxy fit), so neither "
            "control variates nor a larger subsample make the rule's step useful. Pass "
            "adaptation=AdaptationOptions(preconditioner=True) (a diagonal scale adapted "
            "during warm-up, with its own step rule), or check the proxy fit's warnings and "
            "fit a closer proxy "
            "(proxy='variational', or a larger proxy_kwargs={'rank': k})."
        )
    elif estimator.update is not None or name in ("saga", "svrg"):
        remedy = (
            "It already uses control variates, and its step is chosen from the noise of the "
            "fixed control variate at the proxy centre (where its state starts): use a larger "
            "subsample_size, or a proxy closer to the posterior."
        )
    elif "cv" in name.split("-"):
        remedy = (
            "Use a larger subsample_size, or a proxy closer to the posterior (the control "
            "variate's residuals grow with the distance to its centre)."
        )
    else:
        remedy = (
            "Use estimator='cv' or 'cv-preferential' (control variates), or a larger "
            "subsample_size."
        )
    warnings.warn(
        f"estimator={name!r} (subsample size {estimator.subsample_size} of "
        f"{estimator.num_data}): its gradient noise, largest eigenvalue v = {noise:.3g} of the "
        f"covariance in whitened coordinates (mean over proxy draws), limits the step size to "
        f"h = {step_size:.2e} < {MIN_USEFUL_STEP:g}: the chain needs about 2/h = "
        f"{2.0 / max(step_size, 1e-300):.1e} steps per independent draw. {remedy}"
        + (f" Without the noise the curvature μ = {float(curvature):.3g} would still hold "
           f"it to {free:.2e}." if free < MIN_USEFUL_STEP else ""),
        NoiseLimitedStepWarning,
        stacklevel=stacklevel + 1,
    )


def _warn_curvature_limited(estimator: GradientEstimator, noise: float, step_size: float,
                            noise_free_step: float, curvature: float, site: str, *,
                            stacklevel: int) -> None:
    where = f" along {site}" if site else ""
    lowered = (f"the gradient noise, v = {noise:.3g}, lowers it to {step_size:.2e}"
               if step_size < 0.99 * noise_free_step else
               f"the gradient noise, v = {noise:.3g}, does not lower it")
    warnings.warn(
        f"The step size h = {step_size:.2e} < {MIN_USEFUL_STEP:g} is set by the posterior's "
        f"curvature, not by the gradient noise of estimator={estimator.name!r}: at the "
        f"pilot chains' last draws the potential's curvature in the proxy's whitened "
        f"coordinates reaches μ = {curvature:.3g}{where}, and even an exact gradient allows "
        f"only h = {noise_free_step:.2e} ({lowered}); the chain needs about 2/h = "
        f"{2.0 / max(step_size, 1e-300):.1e} "
        "steps per independent draw. The curvature varies by orders of magnitude over "
        "where the chains went, as in a funnel (a scale whose posterior reaches towards "
        "zero, with effects that depend on it): a larger subsample_size, control variates or "
        f"another proxy do not raise this step. Expect this run not to have mixed{where}, "
        "and compare it with a sampler that adapts its step along the trajectory (NUTS) on "
        "the model or on a subset of the data.",
        CurvatureLimitedStepWarning,
        stacklevel=stacklevel + 1,
    )
