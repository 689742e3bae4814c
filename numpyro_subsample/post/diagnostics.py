"""Diagnostics: pseudo-variance of a gradient estimator, kernel Stein discrepancy.

- :func:`pseudo_variance`: E||g̃ − ∇f||² = tr Cov(g̃) (Putcha, Nemeth and Fearnhead 2023,
  Eq. 6) of a kernel's gradient estimator at given parameter values, by Monte Carlo against the
  exact full-data gradient.
- :func:`ksd`: kernel Stein discrepancy (Putcha et al. 2023, Eq. 20-21) with the inverse
  multi-quadric kernel K(x, y) = (c² + ||x − y||²)^β, c = 1, β = −1/2 (Gorham and Mackey
  2017), jitted and chunked over rows so K = 10^4 draws run in bounded memory.
- :func:`mcmc_ksd`: the KSD of an MCMC run of a package kernel in its unconstrained space, with
  full-data scores (one data pass per draw) or, when asked, the kernel's stochastic ones.

Every pass over the data takes them as an argument (``data``, a
:class:`~numpyro_subsample.core.potential.ModelData`) and is compiled once per potential.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, value_grad_hessian
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.base import GradientEstimator
from numpyro_subsample.post.protocol import (
    check_kernel,
    kernel_data,
    kernel_of,
    run_data,
    unconstrain,
)

__all__ = [
    "estimator_pseudo_variance",
    "pseudo_variance",
    "ksd",
    "full_data_scores",
    "mcmc_ksd",
]


def _thetas(potential: Potential, latent: dict, data: ModelData, batched: bool) -> jax.Array:
    """Flat unconstrained θ of constrained latent values (one draw, or a batch of draws)."""
    missing = [s for s in potential.latent_sites if s not in latent]
    if missing:
        raise ValueError(f"params lacks the latent site(s) {missing}; pass one draw of each.")
    arrays = {k: jnp.asarray(latent[k]) for k in potential.latent_sites}
    if not batched:
        arrays = {k: v[None] for k, v in arrays.items()}
    num = next(iter(arrays.values())).shape[0]
    theta = unconstrain(potential, arrays, data)
    if theta.shape != (num, potential.dim):
        raise ValueError(
            f"params gives unconstrained values of shape {theta.shape[1:]}, the model has "
            f"({potential.dim},); pass a single draw (no chain/draw dimensions)."
        )
    return theta if batched else theta[0]


def _estimator(kernel, purpose: str) -> GradientEstimator:
    estimator = getattr(kernel.preprocessed, "estimator", None)
    if estimator is None:
        raise ValueError(
            f"{purpose} needs the kernel's gradient estimator; {type(kernel).__name__} has none "
            "(use a stochastic-gradient kernel such as SGLD)."
        )
    return estimator


@partial(jax.jit, static_argnames=("potential", "estimate", "chunk_size"))
def _sq_errors(potential, estimate, params, thetas, keys, data, chunk_size):
    def at(args):
        t, ks = args
        full = value_grad_hessian(potential, t, data, chunk_size, hessian=False)[1]

        def one_batch(kb):
            g = jax.vmap(lambda k: estimate(params, k, t, data)[0])(kb)
            return jnp.sum((g - full) ** 2, -1)

        return jax.lax.map(one_batch, ks).reshape(-1)

    return jax.lax.map(at, (thetas, keys))


def estimator_pseudo_variance(
    estimator: GradientEstimator,
    potential: Potential,
    theta: jax.Array,
    data: ModelData,
    *,
    num_draws: int = 1000,
    rng_key: jax.Array,
    chunk_size: int = DEFAULT_CHUNK,
    batch: int = 250,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error of ||g̃(θ) − ∇f(θ)||² over ``num_draws`` estimator draws, the
    empirical pseudo-variance (Putcha et al. 2023, Eq. 6), against the exact full-data gradient.

    ``theta`` (d,) or (M, d); ``data``: the model's data. Returns arrays of shape () or (M,).
    One compilation for all θ.
    """
    theta = jnp.asarray(theta)
    single = theta.ndim == 1
    thetas = theta[None] if single else theta
    nb = -(-int(num_draws) // batch)
    keys = jax.random.split(rng_key, thetas.shape[0] * nb * batch).reshape(
        thetas.shape[0], nb, batch, -1)
    err = _sq_errors(potential, estimator.estimate, estimator.params, thetas, keys, data,
                     int(chunk_size))
    err = np.asarray(err, np.float64)[:, :num_draws]
    mean, se = err.mean(1), err.std(1, ddof=1) / np.sqrt(err.shape[1])
    return (mean[0], se[0]) if single else (mean, se)


def pseudo_variance(
    kernel,
    params: dict,
    *,
    num_draws: int = 1000,
    rng_key: jax.Array | None = None,
    data: ModelData | None = None,
) -> float:
    """Empirical pseudo-variance (Putcha et al. 2023, Eq. 6) of ``kernel``'s gradient estimator
    at the constrained parameter values ``params`` (one draw, a dict like ``get_samples()``
    entries), in the kernel's unconstrained coordinates θ.

    The kernel must have been run or preprocessed; ``data`` defaults to the data it was
    preprocessed on.

    Parameters
    ----------
    kernel
        A run or preprocessed package SG kernel.
    params
        Constrained parameter values (one draw).
    num_draws
        Subsamples drawn.
    rng_key
        Key of the draws.
    data
        The model's data (default: the preprocessing's).

    Returns
    -------
    float
        The pseudo-variance.

    References
    ----------
    Putcha, Nemeth and Fearnhead (2023), Eq. 6.
    """
    kernel = check_kernel(kernel, "pseudo_variance")
    if rng_key is None:
        rng_key = jax.random.PRNGKey(0)
    data = kernel_data(kernel) if data is None else data
    estimator = _estimator(kernel, "pseudo_variance")
    pot = kernel.potential
    theta = _thetas(pot, params, data, batched=False)
    return float(estimator_pseudo_variance(
        estimator, pot, theta, data, num_draws=num_draws, rng_key=rng_key,
        chunk_size=getattr(kernel, "chunk_size", DEFAULT_CHUNK),
    )[0])


# -- kernel Stein discrepancy -------------------------------------------------------------------
def _row_block(K: int, d: int, budget: int = 2**22) -> int:
    return int(max(1, min(K, budget // max(1, K * d))))


def ksd(
    samples: Any,
    grads: Any,
    *,
    c: float = 1.0,
    beta: float = -0.5,
    block: int | None = None,
) -> float:
    """Kernel Stein discrepancy (Putcha et al. 2023, Eq. 20-21), IMQ kernel (c² + ||x − y||²)^β.

    ``samples`` (K, d) and ``grads`` (K, d): the draws and the score ∇log π at each draw (the
    *log-density* gradient, i.e. −∇f). KSD = Σ_j sqrt(Σ_{k,k'} k_j^0(θ_k, θ_k') / K²) with
    k_j^0(x, y) = s_j(x)s_j(y)K + s_j(x)∂_{y_j}K + s_j(y)∂_{x_j}K + ∂_{x_j}∂_{y_j}K.
    Rows are processed in blocks (``lax.map``) so memory is O(block · K · d).

    Parameters
    ----------
    samples
        Draws, shape (K, d).
    grads
        ∇log π at the draws, shape (K, d).
    c, beta
        The IMQ kernel's parameters.
    block
        Rows per block (memory O(block · K · d)).

    Returns
    -------
    float
        The KSD.

    References
    ----------
    Putcha, Nemeth and Fearnhead (2023), Eq. 20-21; Gorham and Mackey (2017) (IMQ kernel).
    """
    x = jnp.asarray(samples)
    s = jnp.asarray(grads, x.dtype)
    if x.ndim != 2 or s.shape != x.shape:
        raise ValueError(
            f"samples and grads must both have shape (K, d); got {x.shape} and {s.shape}."
        )
    if not (c > 0 and -1 < beta < 0):
        raise ValueError(f"The IMQ kernel needs c > 0 and β in (−1, 0); got c={c}, β={beta}.")
    K, d = x.shape
    b = int(block or _row_block(K, d))
    nb = -(-K // b)
    pad = nb * b - K
    xr = jnp.concatenate([x, jnp.zeros((pad, d), x.dtype)]).reshape(nb, b, d)
    sr = jnp.concatenate([s, jnp.zeros((pad, d), x.dtype)]).reshape(nb, b, d)
    mr = (jnp.arange(nb * b) < K).reshape(nb, b).astype(x.dtype)
    per_coord = _ksd_sum(xr, sr, mr, x, s, c, beta)  # Σ_{k,k'} k_j^0, (d,)
    return float(jnp.sum(jnp.sqrt(jnp.maximum(per_coord, 0.0))) / K)


@jax.jit
def _ksd_sum_impl(xr, sr, mr, x, s, c, beta):
    def block(args):
        xb, sb, mb = args
        r = xb[:, None, :] - x[None, :, :]  # (b, K, d)
        u = c**2 + jnp.sum(r**2, -1)  # (b, K)
        k = u**beta
        du = beta * u ** (beta - 1)  # ∂K/∂(||r||²)
        dx = 2.0 * du[..., None] * r  # ∂K/∂x_j
        dxy = (-2.0 * du)[..., None] - 4.0 * beta * (beta - 1) * (u ** (beta - 2))[..., None] * r**2
        k0 = (
            sb[:, None, :] * s[None, :, :] * k[..., None]
            - sb[:, None, :] * dx  # s_j(x) ∂_{y_j}K, ∂_{y_j}K = −∂_{x_j}K
            + s[None, :, :] * dx
            + dxy
        )
        return jnp.sum(k0 * mb[:, None, None], (0, 1))

    return jnp.sum(jax.lax.map(block, (xr, sr, mr)), 0)


def _ksd_sum(xr, sr, mr, x, s, c, beta):
    return _ksd_sum_impl(xr, sr, mr, x, s, jnp.asarray(c, x.dtype), jnp.asarray(beta, x.dtype))


@partial(jax.jit, static_argnames=("potential", "chunk_size", "draw_block"))
def _scores(potential, thetas, data, chunk_size, draw_block):
    def score(t):
        return -value_grad_hessian(potential, t, data, chunk_size, hessian=False)[1]

    return jax.lax.map(score, thetas, batch_size=draw_block)


def full_data_scores(
    potential: Potential,
    thetas: jax.Array,
    data: ModelData,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    draw_block: int = 16,
) -> jax.Array:
    """∇log π(θ) = −∇f(θ) with the full data ``data`` at each row of ``thetas`` (K, d): K data
    passes, memory O(draw_block · chunk · d)."""
    thetas = jnp.asarray(thetas)
    if thetas.ndim != 2 or thetas.shape[1] != potential.dim:
        raise ValueError(
            f"thetas must have shape (K, {potential.dim}) (flat unconstrained draws), got "
            f"{thetas.shape}."
        )
    return _scores(potential, thetas, data, int(chunk_size), int(draw_block))


@partial(jax.jit, static_argnames=("estimate",))
def _estimator_scores(estimate, params, keys, thetas, data):
    return -jax.vmap(lambda k, t: estimate(params, k, t, data)[0])(keys, thetas)


def mcmc_ksd(
    mcmc,
    *,
    stochastic: bool = False,
    max_draws: int | None = 2000,
    rng_key: jax.Array | None = None,
    data: ModelData | None = None,
    **ksd_kwargs,
) -> float:
    """KSD (Putcha et al. 2023, Eq. 20-21) of the draws of an ``MCMC`` run of a package kernel,
    in unconstrained θ.

    Chains are pooled, then thinned evenly to at most ``max_draws``. Scores are full-data
    gradients (one data pass per draw), or with ``stochastic=True`` the kernel's own estimator
    (noisy but unbiased, as Putcha et al. 2023, Sect. 5.2.3 allow). ``data`` defaults to the
    run's data; ``ksd_kwargs`` go to :func:`ksd`.

    Parameters
    ----------
    mcmc
        A finished ``MCMC`` run of a package kernel.
    stochastic
        Use the kernel's estimator for the scores.
    max_draws
        Thin to at most this many draws.
    rng_key
        Key of the stochastic scores.
    data
        The model's data (default: the run's).
    **ksd_kwargs
        Passed to :func:`ksd`.

    Returns
    -------
    float
        The KSD of the pooled, thinned draws.

    References
    ----------
    Putcha, Nemeth and Fearnhead (2023), Eq. 20-21, Sect. 5.2.3.
    """
    kernel = kernel_of(mcmc, "mcmc_ksd")
    data = run_data(mcmc) if data is None else data
    pot = kernel.potential
    z = mcmc.get_samples(group_by_chain=False)
    missing = [k for k in pot.latent_sites if k not in z]
    if missing:
        raise ValueError(
            f"The run did not collect the latent sites {missing}; keep 'z' in extra_fields "
            "or use the default fields."
        )
    S = np.shape(z[pot.latent_sites[0]])[0]
    sel = np.arange(S) if max_draws is None or S <= max_draws else np.linspace(
        0, S - 1, max_draws).round().astype(int)
    thetas = _thetas(pot, {k: jnp.asarray(z[k])[sel] for k in pot.latent_sites}, data,
                     batched=True)
    if stochastic:
        estimator = _estimator(kernel, "mcmc_ksd(stochastic=True)")
        keys = jax.random.split(rng_key if rng_key is not None else jax.random.PRNGKey(0),
                                thetas.shape[0])
        scores = _estimator_scores(estimator.estimate, estimator.params, keys, thetas, data)
    else:
        scores = full_data_scores(pot, thetas, data,
                                  chunk_size=getattr(kernel, "chunk_size", DEFAULT_CHUNK))
    return ksd(thetas, scores, **ksd_kwargs)
