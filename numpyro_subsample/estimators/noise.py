"""The noise of a gradient estimator in coordinates whitened by the proxy, computed exactly.

Every estimator is g(θ) = ∇f0(θ) + Σ_i ∇c_i(θ) + Σ_{j∈S} w_j r_{i_j}(θ) with residuals
r_i = ∇f_i(θ) − ∇c_i(θ) (:mod:`numpyro_subsample.estimators.base`), so its noise is the
design's sum applied to the residuals, and the design's second moments
(:class:`~numpyro_subsample.estimators.selection.DesignMoments`) give its covariance exactly:

    Cov[Lᵀ g(θ)] = Σ_i a_i u_i u_iᵀ − Σ_g c_g U_g U_gᵀ,    u_i = Lᵀ r_i(θ),  U_g = Σ_{i∈g} u_i,

with Σ̂ = L Lᵀ the proxy covariance. Uniform sampling with replacement has a = N/n, c = 1/n
(times (N − n)/(N − 1) without replacement); importance sampling with replacement a_i =
1/(n p_i), c = 1/n (Putcha et al. 2023, Eq. 8 and 12, Appendix A.2); the stratified design the
sum of its strata's terms (Fu and Zhang 2023, Lemma 3.4, without replacement).

One chunked pass over the data per point θ accumulates Σ_i a_i u_i u_iᵀ and the group sums U_g
(memory O(chunk · d + d² + G · d), never N · d²). Unlike a Monte Carlo estimate from a few
subsamples, it counts every datum, including rare ones with large residuals, which can
dominate the noise of an estimator without control variate.

The points are the centre and ``num_points − 1`` draws θ ~ N(θ̂, Σ̂). The stationary
variance of a stochastic-gradient chain is inflated by the noise averaged over the states it
visits, so the reported matrix is the mean covariance over the proxy draws (the centre, where a
control variate has no noise at all, is left out) and the figure its largest eigenvalue. The
per-point covariances are kept: a control variate's noise is heavy-tailed over θ (rare rows
whose residuals change sign in part of the posterior), so a mean over few points is noisy;
eight draws cost nine data passes. The adaptive estimator is evaluated at the size n_t(θ) it
uses at each point (Putcha et al. 2023, Eq. 19): its actual noise there.

An estimator without second moments (``GradientEstimator.moments is None``, e.g. a user
registration) falls back to a Monte Carlo estimate from ``num_draws`` subsamples per point.

Structured whitening (L a :class:`~numpyro_subsample.proxies.structured.StructuredCovariance`,
for large d): no d × d matrix is formed. The largest eigenvalue v of the mean covariance
V̄ = mean_p V_p over the proxy draws comes from Lanczos
(:func:`~numpyro_subsample.proxies.structured.lanczos_eigh`, :data:`NOISE_LANCZOS_ITERATIONS`
iterations), each product V̄ x = mean_p [Σ_i a_i u_i (u_iᵀ x) − Σ_g c_g U_g (U_gᵀ x)] one chunked
pass over the data at every draw (u_i = Lᵀ r_i recomputed, O(chunk · d + G · d) memory). The
Ritz value is a lower bound of v that is close to it when the top of the spectrum is separated
(Golub and Van Loan 2013, Sect. 10.1); ``cov``, ``covs`` (and the noise correction that needs
them) are not available. The Monte Carlo fallback then takes v from the Gram matrix of the
centred whitened draws (size P·num_draws, not d).
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, scan_chunks
from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.estimators.base import EstimatorMoments, GradientEstimator
from numpyro_subsample.proxies.structured import (
    Scale,
    is_structured,
    lanczos_eigh,
    whiten_matvec,
    whiten_rmatvec,
)

__all__ = [
    "MIN_USEFUL_STEP",
    "NOISE_LANCZOS_ITERATIONS",
    "NoiseLimitedStepWarning",
    "WhitenedNoise",
    "noise_points",
    "NoiseOperator",
    "exact_whitened_covs",
    "monte_carlo_whitened_covs",
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

#: Lanczos iterations (data passes per proxy draw) for the largest eigenvalue of the noise
#: covariance under a structured whitening (module docstring); capped at d.
NOISE_LANCZOS_ITERATIONS = 20


class NoiseLimitedStepWarning(UserWarning):
    """The estimator's gradient noise forces a step size too small for the chain to mix."""


class WhitenedNoise(NamedTuple):
    """The noise of an estimator in whitened coordinates at a few points.

    ``largest``: the largest eigenvalue of ``cov`` (the v of the step-size rules);
    ``cov``: the (d, d) covariance averaged over the proxy draws (module docstring);
    ``covs``: (P, d, d) at every
    point; ``points``: the (P, d) θ's; ``data_passes``: data passes spent; ``exact``: False
    for the Monte Carlo fallback. Under a structured whitening ``cov`` and ``covs`` are None
    and ``ritz_values`` holds the Ritz values of the mean covariance, largest first (for the
    Monte Carlo fallback, its nonzero eigenvalues).
    """

    largest: float
    cov: np.ndarray | None
    covs: np.ndarray | None
    points: np.ndarray
    data_passes: float
    exact: bool
    ritz_values: np.ndarray | None = None


def noise_points(
    centre: jax.Array, point_tril: Scale, rng_key: jax.Array, num_points: int = 4
) -> jax.Array:
    """The centre and ``num_points − 1`` draws from N(centre, L Lᵀ), L = ``point_tril``."""
    z = jax.random.normal(rng_key, (int(num_points) - 1, centre.shape[0]), centre.dtype)
    return jnp.concatenate([centre[None], centre + whiten_matvec(point_tril, z)])


@partial(jax.jit, static_argnames=("moments", "chunk_size"))
def _moment_sums(moments: EstimatorMoments, params, thetas, tril, data, chunk_size):
    """Per point: Σ_i a_i u_i u_iᵀ (d, d), the group sums U_g (G, d) and c (G,); one data pass
    each (plus ``moments.passes_per_point``)."""
    potential = moments.potential
    d = thetas.shape[1]

    def datum_grads(theta, idx):
        one = lambda i: jax.grad(lambda t: potential.data_terms(t, i[None], data)[0])(theta)  # noqa: E731
        return jax.vmap(one)(idx)

    def at_point(theta):
        m = moments.design(params, theta, data)
        cv = moments.control_variate(params)
        c = jnp.atleast_1d(m.group_weight).astype(theta.dtype)
        num_groups = c.shape[0]

        def chunk_fn(idx, mask):
            r = datum_grads(theta, idx)
            if cv is not None:
                r = r - (cv.datum_grads[idx] if cv.datum_grads is not None
                         else datum_grads(cv.centre, idx))
            u = jnp.where(mask[:, None], r @ tril, 0.0)
            a = m.datum_weight if jnp.ndim(m.datum_weight) == 0 else m.datum_weight[idx]
            au = u * jnp.reshape(a, (-1, 1)).astype(u.dtype)
            if m.labels is None:
                sums = u.sum(0)[None]
            else:
                sums = jax.ops.segment_sum(u, m.labels[idx], num_groups)
            return au.T @ u, sums

        init = (jnp.zeros((d, d), theta.dtype), jnp.zeros((num_groups, d), theta.dtype))
        second, sums = scan_chunks(chunk_fn, potential.num_data, chunk_size, init)
        return second, sums, c

    return jax.lax.map(at_point, thetas)


def exact_whitened_covs(
    estimator: GradientEstimator,
    thetas: jax.Array,
    scale_tril: jax.Array,
    data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
) -> np.ndarray:
    """Cov[Lᵀ g(θ)] (module docstring) at every row of ``thetas`` (P, d), float64 (P, d, d).

    Costs P · (1 + ``estimator.moments.passes_per_point``) data passes.
    """
    if estimator.moments is None:
        raise ValueError(
            f"estimator {estimator.name!r} has no second moments (GradientEstimator.moments is "
            "None); build it with make_estimator from a SamplingDesign with moments, or use "
            "monte_carlo_whitened_covs."
        )
    second, sums, c = _moment_sums(
        estimator.moments, estimator.params, thetas, scale_tril, data, int(chunk_size)
    )
    second = np.asarray(second, np.float64)
    sums = np.asarray(sums, np.float64)
    covs = second - np.einsum("pg,pgi,pgj->pij", np.asarray(c, np.float64), sums, sums)
    return 0.5 * (covs + np.swapaxes(covs, 1, 2))


@partial(jax.jit, static_argnames=("estimate", "num_draws"))
def _monte_carlo_covs(estimate, params, thetas, tril, key, data, num_draws):
    num_points, d = thetas.shape
    keys = jax.random.split(key, num_points * num_draws)
    reps = jnp.repeat(thetas, num_draws, axis=0)
    # a loop over the evaluations (lax.map), not a batch: it compiles in about half the time
    gs = jax.lax.map(lambda a: estimate(params, a[0], a[1], data)[0], (keys, reps)) @ tril
    gs = gs.reshape(num_points, num_draws, d)
    gs = gs - gs.mean(1, keepdims=True)
    return jnp.einsum("pki,pkj->pij", gs, gs) / (num_draws - 1)


def monte_carlo_whitened_covs(
    estimator: GradientEstimator,
    thetas: jax.Array,
    scale_tril: jax.Array,
    rng_key: jax.Array,
    data: ModelData,
    num_draws: int = 16,
) -> np.ndarray:
    """Sample covariance of Lᵀ g(θ) over ``num_draws`` subsamples at every row of ``thetas``
    (P, d): the fallback for estimators without second moments. It misses data too rare to
    appear in the draws; costs P · num_draws · n / N data passes."""
    covs = _monte_carlo_covs(
        estimator.estimate, estimator.params, thetas, scale_tril, rng_key, data, int(num_draws)
    )
    return np.asarray(covs, np.float64)


# -- structured whitening: matrix-free ------------------------------------------------------
def _datum_grads(potential, theta, idx, data):
    one = lambda i: jax.grad(lambda t: potential.data_terms(t, i[None], data)[0])(theta)  # noqa: E731
    return jax.vmap(one)(idx)


@partial(jax.jit, static_argnames=("moments",))
def _designs_at(moments: EstimatorMoments, params, thetas, data):
    """The design's second moments at every point, stacked ((P,) leading axis)."""
    return jax.lax.map(lambda t: moments.design(params, t, data), thetas)


class NoiseOperator(NamedTuple):
    """x ↦ V̄ x = mean over the points of Cov[Lᵀ g(θ_p)] x, one data pass per point (module
    docstring), as a hashable matvec for
    :func:`~numpyro_subsample.proxies.structured.lanczos_eigh`; ``operand = (params, thetas,
    designs, scale, data)`` with ``designs`` the stacked :class:`DesignMoments` at the
    points."""

    moments: EstimatorMoments
    chunk_size: int = DEFAULT_CHUNK

    def __call__(self, operand, x: jax.Array) -> jax.Array:
        params, thetas, designs, scale, data = operand
        potential = self.moments.potential
        cv = self.moments.control_variate(params)

        def at_point(args):
            theta, m = args
            c = jnp.atleast_1d(m.group_weight).astype(theta.dtype)
            num_groups = c.shape[0]

            def chunk_fn(idx, mask):
                r = _datum_grads(potential, theta, idx, data)
                if cv is not None:
                    r = r - (cv.datum_grads[idx] if cv.datum_grads is not None
                             else _datum_grads(potential, cv.centre, idx, data))
                u = jnp.where(mask[:, None], whiten_rmatvec(scale, r), 0.0)
                a = m.datum_weight if jnp.ndim(m.datum_weight) == 0 else m.datum_weight[idx]
                au = jnp.reshape(a, (-1,)).astype(u.dtype) * (u @ x)
                if m.labels is None:
                    sums = u.sum(0)[None]
                else:
                    sums = jax.ops.segment_sum(u, m.labels[idx], num_groups)
                return au @ u, sums

            init = (jnp.zeros_like(x), jnp.zeros((num_groups, x.shape[0]), x.dtype))
            first, sums = scan_chunks(chunk_fn, potential.num_data, self.chunk_size, init)
            return first - (c * (sums @ x)) @ sums

        return jnp.mean(jax.lax.map(at_point, (thetas, designs)), axis=0)


def _structured_exact(estimator, thetas, scale, key, data, chunk_size, num_iter):
    """Ritz values of V̄ over ``thetas`` (module docstring) and the data passes."""
    moments = estimator.moments
    designs = _designs_at(moments, estimator.params, thetas, data)
    d = thetas.shape[1]
    m = min(int(num_iter), d)
    res = lanczos_eigh(
        NoiseOperator(moments, int(chunk_size)),
        (estimator.params, thetas, designs, scale, data), key, d, 1, m, thetas.dtype,
    )
    P = thetas.shape[0]
    passes = P * (m + float(moments.passes_per_point))
    return np.asarray(res.ritz_values, np.float64), passes


@partial(jax.jit, static_argnames=("estimate", "num_draws"))
def _monte_carlo_gram(estimate, params, thetas, scale, key, data, num_draws):
    """Eigenvalues (largest first) of the mean sample covariance of Lᵀ g over the points, from
    the Gram matrix of the centred draws (P·num_draws square, never d × d)."""
    num_points, d = thetas.shape
    keys = jax.random.split(key, num_points * num_draws)
    reps = jnp.repeat(thetas, num_draws, axis=0)
    gs = jax.lax.map(lambda a: estimate(params, a[0], a[1], data)[0], (keys, reps))
    gs = whiten_rmatvec(scale, gs).reshape(num_points, num_draws, d)
    gs = gs - gs.mean(1, keepdims=True)
    rows = gs.reshape(-1, d) / jnp.sqrt((num_draws - 1) * num_points).astype(gs.dtype)
    return jnp.linalg.eigvalsh(rows @ rows.T)[::-1]


def _structured_noise(estimator, centre, scale, rng_key, data, point_tril, num_points,
                      chunk_size, num_draws, num_iter) -> WhitenedNoise:
    P = int(num_points)
    thetas = noise_points(centre, point_tril, rng_key, P)
    draws = thetas[1:] if P > 1 else thetas  # the mean is over the proxy draws (as dense)
    if estimator.moments is not None:
        ritz, passes = _structured_exact(
            estimator, draws, scale, jax.random.fold_in(rng_key, 2), data, chunk_size,
            NOISE_LANCZOS_ITERATIONS if num_iter is None else num_iter,
        )
        exact = True
    else:
        ritz = np.asarray(_monte_carlo_gram(
            estimator.estimate, estimator.params, draws, scale, jax.random.fold_in(rng_key, 1),
            data, int(num_draws),
        ), np.float64)
        passes = draws.shape[0] * int(num_draws) * estimator.subsample_size / estimator.num_data
        exact = False
    return WhitenedNoise(float(max(ritz[0], 0.0)), None, None, np.asarray(thetas),
                         float(passes), exact, ritz)


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
    Carlo estimate from ``num_draws`` subsamples per point. With a structured L (and Lp) the
    figure is matrix-free (module docstring; ``lanczos_iterations``, default
    :data:`NOISE_LANCZOS_ITERATIONS`, data passes per draw) and the centre is not evaluated.
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
    thetas = noise_points(centre, tril_p, rng_key, int(num_points))
    P = int(num_points)
    if estimator.moments is not None:
        covs = exact_whitened_covs(estimator, thetas, scale_tril, data, chunk_size)
        passes = P * (1.0 + float(estimator.moments.passes_per_point))
        exact = True
    else:
        key = jax.random.fold_in(rng_key, 1)
        covs = monte_carlo_whitened_covs(estimator, thetas, scale_tril, key, data, num_draws)
        passes = P * int(num_draws) * estimator.subsample_size / estimator.num_data
        exact = False
    cov = covs[1:].mean(0) if P > 1 else covs[0]
    return WhitenedNoise(
        float(np.linalg.eigvalsh(cov).max()), cov, covs, np.asarray(thetas), float(passes), exact
    )


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
    and its largest eigenvalue are recomputed over all draws. With the default ``num_points``
    the compiled pass of :func:`whitened_noise` is reused. Dense whitening only (a structured
    measurement keeps no covariances to extend)."""
    if measured.covs is None:
        raise ValueError(
            "extend_noise needs the per-point covariances of a dense measurement; a structured "
            "(matrix-free) measurement has none."
        )
    centre = jnp.asarray(measured.points[0])
    tril_p = scale_tril if point_tril is None else point_tril
    z = jax.random.normal(rng_key, (int(num_points), centre.shape[0]), centre.dtype)
    thetas = centre + z @ tril_p.T
    if measured.exact:
        covs = exact_whitened_covs(estimator, thetas, scale_tril, data, chunk_size)
        passes = num_points * (1.0 + float(estimator.moments.passes_per_point))
    else:
        key = jax.random.fold_in(rng_key, 1)
        covs = monte_carlo_whitened_covs(estimator, thetas, scale_tril, key, data, num_draws)
        passes = num_points * int(num_draws) * estimator.subsample_size / estimator.num_data
    covs = np.concatenate([measured.covs, covs])
    cov = covs[1:].mean(0)
    return WhitenedNoise(
        float(np.linalg.eigvalsh(cov).max()), cov, covs,
        np.concatenate([measured.points, np.asarray(thetas)]),
        measured.data_passes + float(passes), measured.exact,
    )


def direction_errors(measured: WhitenedNoise) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues λ_k of the mean covariance over the proxy draws and the standard error of
    each: the spread over the draws of e_kᵀ V(θ) e_k (e_k the eigenvectors), / sqrt(draws).

    The noise correction injects 2ch − h²λ̂_k along e_k, so an error λ̂_k − λ_k changes the
    stationary variance there by the fraction h(λ_k − λ̂_k)/(2c) (whitened curvature 1).
    Returns zeros for the standard errors with fewer than two draws, and the Ritz values
    with no standard errors (None) for a structured measurement.
    """
    if measured.cov is None:
        return np.sort(np.asarray(measured.ritz_values, np.float64)), None
    draws = measured.covs[1:] if measured.covs.shape[0] > 1 else measured.covs
    lam, q = np.linalg.eigh(measured.cov)
    along = np.einsum("pij,ik,jk->pk", draws, q, q)
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
    estimator: GradientEstimator, noise: float, step_size: float, *, stacklevel: int = 2
) -> None:
    """Warn (:class:`NoiseLimitedStepWarning`) when the step size chosen from the noise is
    below :data:`MIN_USEFUL_STEP`; name the estimator, the noise, the step and the remedy."""
    if not step_size < MIN_USEFUL_STEP:
        return
    name = estimator.name
    if estimator.update is not None or name in ("saga", "svrg"):
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
        f"{2.0 / max(step_size, 1e-300):.1e} steps per independent draw. {remedy}",
        NoiseLimitedStepWarning,
        stacklevel=stacklevel + 1,
    )
