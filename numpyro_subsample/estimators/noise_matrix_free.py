"""The noise of a gradient estimator under a structured whitening, without a d × d matrix.

With L a :class:`~numpyro_subsample.proxies.covariance.StructuredCovariance` (large d) the
largest eigenvalue v of the mean noise covariance V̄ = mean_p V_p over the proxy draws
(:mod:`numpyro_subsample.estimators.noise`) comes from Lanczos
(:func:`~numpyro_subsample.proxies.lanczos.lanczos_eigh`, :data:`NOISE_LANCZOS_ITERATIONS`
iterations), each product V̄ x = mean_p [Σ_i a_i u_i (u_iᵀ x) − Σ_g c_g U_g (U_gᵀ x)] one chunked
pass over the data at every draw (u_i = Lᵀ r_i recomputed, O(chunk · d + G · d) memory; the
formula is that of :mod:`numpyro_subsample.estimators.noise_covariance`). The Ritz value is a
lower bound of v that is close to it when the top of the spectrum is separated (Golub and Van
Loan 2013, Sect. 10.1). The Monte Carlo fallback takes v from the Gram matrix of the centred
whitened draws (size P·num_draws, not d).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, scan_chunks
from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.estimators.base import EstimatorMoments, GradientEstimator
from numpyro_subsample.proxies.lanczos import lanczos_eigh
from numpyro_subsample.proxies.whitening import Scale, whiten_rmatvec

__all__ = ["NOISE_LANCZOS_ITERATIONS", "NoiseOperator", "matrix_free_noise"]

#: Lanczos iterations (data passes per proxy draw) for the largest eigenvalue of the noise
#: covariance under a structured whitening (module docstring); capped at d.
NOISE_LANCZOS_ITERATIONS = 20


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
    :func:`~numpyro_subsample.proxies.lanczos.lanczos_eigh`; ``operand = (params, thetas,
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
