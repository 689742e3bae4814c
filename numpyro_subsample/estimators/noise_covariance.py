"""The covariance of an estimator's noise in coordinates whitened by the proxy, at given points.

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
dominate the noise of an estimator without control variate. Above 2 · :data:`NOISE_ROWS` rows
(without strata) the pass runs over a uniform sample of :data:`NOISE_ROWS` rows, its sums
scaled by N/M (:func:`noise_rows`): the noise is measured at many points, and a full pass per
point made the measurement the preprocessing's largest cost at 10^6 rows; rows rarer than 1/M
are then counted only in expectation. An estimator without second
moments (``GradientEstimator.moments is None``, e.g. a user registration) falls back to a
Monte Carlo estimate from ``num_draws`` subsamples per point.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.compiling import fast_compile_jit
from numpyro_subsample.core.data import device_array
from numpyro_subsample.core.datapass import DEFAULT_CHUNK, scan_chunks
from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.core.rng import host_generator
from numpyro_subsample.estimators.base import EstimatorMoments, GradientEstimator

__all__ = ["NOISE_ROWS", "exact_whitened_covs", "monte_carlo_whitened_covs", "noise_rows",
           "point_covariances"]

#: Above 2 × this many rows the exact noise covariance sums over a uniform sample of this many
#: (:func:`noise_rows`): each point costs M/N of a data pass instead of one.
NOISE_ROWS = 100_000


def noise_rows(estimator: GradientEstimator, thetas, data: ModelData, rng_key: jax.Array,
               max_rows: int | None = None) -> jax.Array | None:
    """The rows whose moment sums, scaled by N/M, estimate the exact noise covariance: None
    (every row) where N ≤ 2 M, M = ``max_rows`` (default :data:`NOISE_ROWS`), or where the
    design has groups (a stratified design: a small stratum's sums would rest on few rows);
    else M rows drawn uniformly without replacement by NumPy from ``rng_key`` (stream 2 of
    :func:`~numpyro_subsample.core.rng.host_generator`), sorted (int32, (M,)).

    The sums Σ_i a_i u_i u_iᵀ and U_g are then unbiased; the product U Uᵀ is biased by
    Var(Û), a fraction of about 1/M of the first term under a uniform or importance design. A
    row rarer than 1/M is missed by most samples: its share of the noise is then left out."""
    m = NOISE_ROWS if max_rows is None else int(max_rows)
    num_data = int(estimator.num_data)
    if num_data <= 2 * m:
        return None
    design = jax.eval_shape(estimator.moments.design, estimator.params, thetas[0], data)
    if design.labels is not None:
        return None
    rows = host_generator(rng_key, stream=2).choice(num_data, size=m, replace=False)
    return device_array(np.sort(rows), np.int32)


@partial(fast_compile_jit, static_argnames=("moments", "chunk_size"))
def _moment_sums(moments: EstimatorMoments, params, theta, tril, data, chunk_size, rows=None):
    """At one point θ: Σ_i a_i u_i u_iᵀ (d, d), the group sums U_g (G, d) and c (G,); one data
    pass (plus ``moments.passes_per_point``), or, with ``rows`` (M,) a uniform sample of the
    rows without replacement, their sums scaled by N/M (M/N of a pass). One program serves any
    number of points."""
    potential = moments.potential
    d = theta.shape[0]
    num_rows = potential.num_data if rows is None else rows.shape[0]

    def datum_grads(theta, idx):
        one = lambda i: jax.grad(lambda t: potential.data_terms(t, i[None], data)[0])(theta)  # noqa: E731
        return jax.vmap(one)(idx)

    def at_point(theta):
        m = moments.design(params, theta, data)
        cv = moments.control_variate(params)
        c = jnp.atleast_1d(m.group_weight).astype(theta.dtype)
        num_groups = c.shape[0]

        def chunk_fn(idx, mask):
            if rows is not None:
                idx = rows[idx]
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
        second, sums = scan_chunks(chunk_fn, num_rows, chunk_size, init)
        if rows is not None:
            scale = jnp.asarray(potential.num_data / num_rows, theta.dtype)
            second, sums = second * scale, sums * scale
        return second, sums, c

    return at_point(theta)


def _exact_cov_at(estimator, thetas, scale_tril, data, chunk_size,
                  rows=None) -> Callable[[int], np.ndarray]:
    """p ↦ Cov[Lᵀ g(θ_p)] (module docstring), float64, from the moment sums of all points (kept
    in the working dtype) over every row or over ``rows`` (:func:`noise_rows`); each call forms
    one (d, d) matrix."""
    if estimator.moments is None:
        raise ValueError(
            f"estimator {estimator.name!r} has no second moments (GradientEstimator.moments is "
            "None); build it with make_estimator from a SamplingDesign with moments, or use "
            "monte_carlo_whitened_covs."
        )
    points = np.asarray(thetas)  # a row of a device array would be a compiled slice each
    per_point = [_moment_sums(estimator.moments, estimator.params, points[p], scale_tril, data,
                              int(chunk_size), rows) for p in range(points.shape[0])]
    second, sums, c = (np.stack([np.asarray(r[k]) for r in per_point]) for k in range(3))

    def cov_at(p: int) -> np.ndarray:
        s = sums[p].astype(np.float64)
        cov = second[p].astype(np.float64)
        cov -= np.einsum("g,gi,gj->ij", c[p].astype(np.float64), s, s)
        return 0.5 * (cov + cov.T)

    return cov_at


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
    cov_at = _exact_cov_at(estimator, thetas, scale_tril, data, chunk_size)
    return np.stack([cov_at(p) for p in range(thetas.shape[0])])


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


def point_covariances(
    estimator: GradientEstimator,
    thetas: jax.Array,
    scale_tril: jax.Array,
    rng_key: jax.Array,
    data: ModelData,
    *,
    exact: bool,
    chunk_size: int = DEFAULT_CHUNK,
    num_draws: int = 16,
) -> tuple[Callable[[int], np.ndarray], float]:
    """``(p ↦ Cov[Lᵀ g(θ_p)] as float64 (d, d), data passes)`` at the rows of ``thetas`` (P, d):
    :func:`exact_whitened_covs` if ``exact``, else :func:`monte_carlo_whitened_covs` from
    ``fold_in(rng_key, 1)``. The points' results stay in the working dtype (P · d² numbers)
    and each call converts one matrix, so a caller that reduces them one at a time holds
    O(d²) float64 numbers, not P · d²."""
    P = int(thetas.shape[0])
    if exact:
        rows = noise_rows(estimator, thetas, data, rng_key)
        cov_at = _exact_cov_at(estimator, thetas, scale_tril, data, chunk_size, rows)
        share = 1.0 if rows is None else rows.shape[0] / estimator.num_data
        return cov_at, P * (share + float(estimator.moments.passes_per_point))
    covs = np.asarray(_monte_carlo_covs(
        estimator.estimate, estimator.params, thetas, scale_tril, jax.random.fold_in(rng_key, 1),
        data, int(num_draws),
    ))
    passes = P * int(num_draws) * estimator.subsample_size / estimator.num_data
    return (lambda p: covs[p].astype(np.float64)), passes
