"""Diagnostics: pseudo-variance of a gradient estimator, kernel Stein discrepancy.

- :func:`pseudo_variance`: E||g̃ − ∇f||² = tr Cov(g̃) (paper 000 Eq. 6) of a kernel's gradient
  estimator at given parameter values, by Monte Carlo against the exact full-data gradient.
- :func:`ksd`: kernel Stein discrepancy (paper 000 Eq. 20-21) with the inverse multi-quadric
  kernel K(x, y) = (c² + ||x − y||²)^β, c = 1, β = −1/2 (Gorham & Mackey 2017), jitted and
  chunked over rows so K = 10^4 draws run in bounded memory.
- :func:`mcmc_ksd`: the KSD of an MCMC run of a package kernel in its unconstrained space, with
  full-data scores (one data pass per draw) or, when asked, the kernel's stochastic ones.

Written by hand: ArviZ/NumPyro/BlackJAX provide no Stein discrepancy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import get_transforms, transform_fn

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, value_grad_hessian
from numpyro_subsample.estimators.base import GradientEstimator
from numpyro_subsample.core.potential import Potential, _set_plate_indices

__all__ = [
    "estimator_pseudo_variance",
    "pseudo_variance",
    "ksd",
    "full_data_scores",
    "mcmc_ksd",
]


def _unconstrain(kernel, latent: dict, batched: bool) -> jax.Array:
    """Flat unconstrained θ of constrained latent values (one draw, or a batch of draws)."""
    pre = kernel.preprocessed
    pot: Potential = pre.potential
    missing = [s for s in pot.latent_sites if s not in latent]
    if missing:
        raise ValueError(f"params lacks the latent site(s) {missing}; pass one draw of each.")
    latent = {k: jnp.asarray(latent[k]) for k in pot.latent_sites}
    model_args, model_kwargs = kernel._pre_args  # noqa: SLF001
    # the plate is fixed to one index: the transforms do not depend on the data
    model = _set_plate_indices(kernel.user_model, name=pot.plate.name, indices=jnp.arange(1))
    first = {k: v[0] for k, v in latent.items()} if batched else latent
    transforms = get_transforms(model, model_args, model_kwargs, first)

    def flat(p):
        return ravel_pytree(transform_fn(transforms, p, invert=True))[0]

    theta = (jax.vmap(flat)(latent) if batched else flat(latent)).astype(pre.centre.dtype)
    if theta.shape[-1] != pre.centre.shape[0] or theta.ndim != (2 if batched else 1):
        raise ValueError(
            f"params gives unconstrained values of shape {theta.shape}, the model has "
            f"{pre.centre.shape[0]}; pass a single draw (no chain/draw dimensions)."
        )
    return theta


def estimator_pseudo_variance(
    estimator: GradientEstimator,
    potential: Potential,
    theta: jax.Array,
    *,
    num_draws: int = 1000,
    rng_key: jax.Array,
    chunk_size: int = DEFAULT_CHUNK,
    batch: int = 250,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error of ||g̃(θ) − ∇f(θ)||² over ``num_draws`` estimator draws, the
    empirical pseudo-variance (paper 000 Eq. 6), against the exact full-data gradient.

    ``theta`` (d,) or (M, d); returns arrays of shape () or (M,). One compilation for all θ.
    """
    theta = jnp.asarray(theta)
    single = theta.ndim == 1
    thetas = theta[None] if single else theta
    nb = -(-int(num_draws) // batch)
    keys = jax.random.split(rng_key, thetas.shape[0] * nb * batch).reshape(
        thetas.shape[0], nb, batch, -1)

    @jax.jit
    def sq_errors(thetas, keys):
        def at(args):
            t, ks = args
            full = value_grad_hessian(potential, t, chunk_size, hessian=False)[1]

            def one_batch(kb):
                g = jax.vmap(lambda k: estimator.estimate(k, t)[0])(kb)
                return jnp.sum((g - full) ** 2, -1)

            return jax.lax.map(one_batch, ks).reshape(-1)

        return jax.lax.map(at, (thetas, keys))

    err = np.asarray(sq_errors(thetas, keys), np.float64)[:, :num_draws]
    mean, se = err.mean(1), err.std(1, ddof=1) / np.sqrt(err.shape[1])
    return (mean[0], se[0]) if single else (mean, se)


def pseudo_variance(
    kernel, params: dict, *, num_draws: int = 1000, rng_key: jax.Array | None = None
) -> float:
    """Empirical pseudo-variance (paper 000 Eq. 6) of ``kernel``'s gradient estimator at the
    constrained parameter values ``params`` (one draw, a dict like ``get_samples()`` entries),
    in the kernel's unconstrained coordinates θ. The kernel must have been run or initialised.
    """
    if rng_key is None:
        rng_key = jax.random.PRNGKey(0)
    pre = kernel.preprocessed
    theta = _unconstrain(kernel, params, batched=False)
    return float(estimator_pseudo_variance(
        pre.estimator, pre.potential, theta, num_draws=num_draws, rng_key=rng_key,
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
    """Kernel Stein discrepancy (paper 000 Eq. 20-21), IMQ kernel (c² + ||x − y||²)^β.

    ``samples`` (K, d) and ``grads`` (K, d): the draws and the score ∇log π at each draw (the
    *log-density* gradient, i.e. −∇f). KSD = Σ_j sqrt(Σ_{k,k'} k_j^0(θ_k, θ_k') / K²) with
    k_j^0(x, y) = s_j(x)s_j(y)K + s_j(x)∂_{y_j}K + s_j(y)∂_{x_j}K + ∂_{x_j}∂_{y_j}K.
    Rows are processed in blocks (``lax.map``) so memory is O(block · K · d).
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


def full_data_scores(
    potential: Potential, thetas: jax.Array, *, chunk_size: int = DEFAULT_CHUNK,
    draw_block: int = 16,
) -> jax.Array:
    """∇log π(θ) = −∇f(θ) with the full data at each row of ``thetas`` (K, d): K data passes,
    memory O(draw_block · chunk · d)."""
    thetas = jnp.asarray(thetas)
    K, d = thetas.shape
    nb = -(-K // draw_block)
    padded = jnp.concatenate([thetas, jnp.repeat(thetas[-1:], nb * draw_block - K, 0)])

    @jax.jit
    def run(ts):
        grad = jax.vmap(lambda t: value_grad_hessian(potential, t, chunk_size, hessian=False)[1])
        return jax.lax.map(grad, ts.reshape(nb, draw_block, d)).reshape(-1, d)

    return -run(padded)[:K]


def mcmc_ksd(
    mcmc,
    *,
    stochastic: bool = False,
    max_draws: int | None = 2000,
    rng_key: jax.Array | None = None,
    **ksd_kwargs,
) -> float:
    """KSD (Eq. 20-21) of the draws of an ``MCMC`` run of a package kernel, in unconstrained θ.

    Chains are pooled, then thinned evenly to at most ``max_draws``. Scores are full-data
    gradients (one data pass per draw), or with ``stochastic=True`` the kernel's own estimator
    (noisy but unbiased, as paper 000 Sect. 5.2.3 allows).
    """
    kernel = mcmc.sampler
    pre = kernel.preprocessed
    z = mcmc.get_samples(group_by_chain=False)
    raise_if = [k for k in pre.potential.latent_sites if k not in z]
    if raise_if:
        raise ValueError(
            f"The run did not collect the unconstrained latent sites {raise_if}; keep 'z' in "
            "extra_fields or use the default fields."
        )
    latent = {k: jnp.asarray(z[k]) for k in pre.potential.latent_sites}
    S = next(iter(latent.values())).shape[0]
    sel = np.arange(S) if max_draws is None or S <= max_draws else np.linspace(
        0, S - 1, max_draws).round().astype(int)
    thetas = _unconstrain(kernel, {k: v[sel] for k, v in latent.items()}, batched=True)
    if stochastic:
        keys = jax.random.split(rng_key if rng_key is not None else jax.random.PRNGKey(0),
                                thetas.shape[0])
        scores = -jax.jit(jax.vmap(lambda k, t: pre.estimator.estimate(k, t)[0]))(keys, thetas)
    else:
        scores = full_data_scores(pre.potential, thetas,
                                  chunk_size=getattr(kernel, "chunk_size", DEFAULT_CHUNK))
    return ksd(thetas, scores, **ksd_kwargs)
