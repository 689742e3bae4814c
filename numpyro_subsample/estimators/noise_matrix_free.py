"""The noise of a gradient estimator under a structured whitening, without a d × d matrix.

With L a :class:`~numpyro_subsample.proxies.covariance.StructuredCovariance` (large d) the
largest eigenvalue v of the mean noise covariance V̄ = mean_p V_p over the proxy draws
(:mod:`numpyro_subsample.estimators.noise`) comes from Lanczos
(:func:`~numpyro_subsample.proxies.lanczos.lanczos_eigh`, :data:`NOISE_LANCZOS_ITERATIONS`
iterations). A product V̄ x = mean_p [Σ_i a_i u_i (u_iᵀ x) − Σ_g c_g U_g (U_gᵀ x)] (u_i = Lᵀ r_i,
the formula of :mod:`numpyro_subsample.estimators.noise_covariance`) costs two chunked passes
over the data at every draw and never forms a per-datum gradient vector
(:class:`NoiseOperator`): time O(N · cost_i + d·k), memory O(N + chunk + d·k). The Ritz value is
a lower bound of v that is close to it when the top of the spectrum is separated (Golub and
Van Loan 2013, Sect. 10.1). The Monte Carlo fallback takes v from the Gram matrix of the
centred whitened draws (size P·num_draws, not d).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, chunk_at, chunk_count, scan_chunks
from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.estimators.base import EstimatorMoments, GradientEstimator
from numpyro_subsample.proxies.lanczos import lanczos_eigh
from numpyro_subsample.proxies.whitening import Scale, whiten_matvec, whiten_rmatvec

__all__ = ["NOISE_LANCZOS_ITERATIONS", "NoiseOperator", "matrix_free_noise"]

#: Lanczos iterations (two data passes each, per proxy draw) for the largest eigenvalue of the
#: noise covariance under a structured whitening (module docstring); capped at d.
NOISE_LANCZOS_ITERATIONS = 10


@partial(jax.jit, static_argnames=("moments",))
def _designs_at(moments: EstimatorMoments, params, thetas, data):
    """The design's second moments at every point, stacked ((P,) leading axis)."""
    return jax.lax.map(lambda t: moments.design(params, t, data), thetas)


class NoiseOperator(NamedTuple):
    """x ↦ V̄ x = mean over the points of Cov[Lᵀ g(θ_p)] x (module docstring), as a hashable
    matvec for :func:`~numpyro_subsample.proxies.lanczos.lanczos_eigh`; ``operand = (params,
    thetas, designs, scale, data)`` with ``designs`` the stacked :class:`DesignMoments` at the
    points.

    Two data passes per point and no per-datum gradient vector: with y = L x the projections
    u_iᵀ x = r_iᵀ y are per-datum directional derivatives (one forward-mode pass), and
    Σ_i a_i u_i (u_iᵀ x) − Σ_g c_g U_g (U_gᵀ x) = Lᵀ ∇_θ Σ_i w_i f_i, with the fixed weights
    w_i = a_i s_i − c_g t_g (s_i = r_iᵀ y, t_g = Σ_{i∈g} s_i), is one gradient of a weighted
    sum (the second pass). The control variate's part (at the centre θ̂) does not depend on the
    point: its slopes are taken once per product, and its gradient once with the weights
    averaged over the points.
    """

    moments: EstimatorMoments
    chunk_size: int = DEFAULT_CHUNK

    def __call__(self, operand, x: jax.Array) -> jax.Array:
        params, thetas, designs, scale, data = operand
        potential = self.moments.potential
        cv = self.moments.control_variate(params)
        num_data = potential.num_data
        chunk, num_chunks = chunk_count(num_data, self.chunk_size)
        y = whiten_matvec(scale, x)

        def slopes(theta, idx):  # r_iᵀ y for the chunk (without the control variate's part)
            return jax.jvp(lambda t: potential.data_terms(t, idx, data), (theta,), (y,))[1]

        def weighted_grad(theta, idx, w):  # Σ_chunk w_i ∇f_i(θ)
            return jax.grad(lambda t: jnp.dot(w, potential.data_terms(t, idx, data)))(theta)

        def over_data(fn):  # (N,): fn(idx) of every chunk, the padding zeroed
            def one(c):
                idx, mask = chunk_at(c, chunk, num_data)
                return jnp.where(mask, fn(idx), 0.0)

            out = jax.lax.map(one, jnp.arange(num_chunks, dtype=jnp.int32))
            return out.reshape(-1)[:num_data]

        def sum_grads(fn, w):  # Σ_i w_i g_i over the data, fn(idx, w_chunk) per chunk
            def g_chunk(idx, mask):
                return fn(idx, jnp.where(mask, w[idx], 0.0))

            return scan_chunks(g_chunk, num_data, self.chunk_size, jnp.zeros_like(x))

        # the control variate's part does not depend on the point: once per product
        if cv is None:
            s_centre = 0.0
        elif cv.datum_grads is not None:
            s_centre = over_data(lambda idx: cv.datum_grads[idx] @ y)
        else:
            s_centre = over_data(lambda idx: slopes(cv.centre, idx))

        def at_point(args):
            theta, m = args
            s = over_data(lambda idx: slopes(theta, idx)) - s_centre
            a = jnp.broadcast_to(jnp.asarray(m.datum_weight, s.dtype), s.shape)
            c = jnp.atleast_1d(m.group_weight).astype(s.dtype)
            if m.labels is None:
                w = a * s - c[0] * jnp.sum(s)
            else:
                t = jax.ops.segment_sum(s, m.labels, c.shape[0])
                w = a * s - (c * t)[m.labels]
            return sum_grads(lambda idx, wi: weighted_grad(theta, idx, wi), w), w

        grads, weights = jax.lax.map(at_point, (thetas, designs))
        total = jnp.mean(grads, axis=0)
        if cv is not None:  # mean_p Σ_i w_pi ∇f_i(θ̂) = Σ_i (mean_p w_pi) ∇f_i(θ̂)
            w_mean = jnp.mean(weights, axis=0)
            total = total - (sum_grads(lambda idx, wi: wi @ cv.datum_grads[idx], w_mean)
                             if cv.datum_grads is not None
                             else sum_grads(lambda idx, wi: weighted_grad(cv.centre, idx, wi),
                                            w_mean))
        return whiten_rmatvec(scale, total)


def _structured_exact(estimator, thetas, scale, key, data, chunk_size, num_iter):
    """Ritz values of V̄ over ``thetas`` (module docstring) and the data passes."""
    moments = estimator.moments
    designs = _designs_at(moments, estimator.params, thetas, data)
    d = thetas.shape[1]
    m = min(int(num_iter), d)
    res = lanczos_eigh(
        NoiseOperator(moments=moments, chunk_size=int(chunk_size)),
        (estimator.params, thetas, designs, scale, data), key, d, 1, m, thetas.dtype,
    )
    P = thetas.shape[0]
    passes = P * (2 * m + float(moments.passes_per_point))
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


def matrix_free_noise(
    estimator: GradientEstimator,
    draws: jax.Array,
    scale: Scale,
    rng_key: jax.Array,
    data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
    num_draws: int = 16,
    num_iter: int | None = None,
) -> tuple[np.ndarray, float, bool]:
    """``(values, data passes, exact)`` for the proxy ``draws`` (P, d) under the structured
    whitening ``scale`` (module docstring): the Ritz values of V̄ (``num_iter`` Lanczos
    iterations, default :data:`NOISE_LANCZOS_ITERATIONS`, from ``fold_in(rng_key, 2)``), or
    without second moments the eigenvalues of the Monte Carlo estimate from ``num_draws``
    subsamples per draw (``fold_in(rng_key, 1)``); largest first."""
    if estimator.moments is not None:
        ritz, passes = _structured_exact(
            estimator, draws, scale, jax.random.fold_in(rng_key, 2), data, chunk_size,
            NOISE_LANCZOS_ITERATIONS if num_iter is None else num_iter,
        )
        return ritz, passes, True
    ritz = np.asarray(_monte_carlo_gram(
        estimator.estimate, estimator.params, draws, scale, jax.random.fold_in(rng_key, 1),
        data, int(num_draws),
    ), np.float64)
    passes = draws.shape[0] * int(num_draws) * estimator.subsample_size / estimator.num_data
    return ritz, passes, False
