"""Variational proxy: a NumPyro autoguide fitted by SVI on the model's own subsampled ELBO.

The fitted guide q gives a centre (its mean) and a covariance in the flat unconstrained space
of :attr:`Potential.unravel`; :func:`fit_variational` turns them into a
:class:`~numpyro_subsample.proxies.base.Proxy` with
:func:`~numpyro_subsample.proxies.laplace.proxy_from_moments`, so the control variates, the
preconditioning and the preferential weights use it as they use the Laplace proxy. The guide
and its parameters stay in ``proxy.info`` for the variational energy-conserving proxy
(Rønning and Hamelryck 2021, Eq. 2-4; :mod:`numpyro_subsample.ecs.kernel`).

Guide: ``AutoMultivariateNormal`` up to ``max_full_rank_dim`` (default 200) unconstrained
dimensions, ``AutoLowRankMultivariateNormal`` above; or the user's ``guide=`` (any NumPyro
guide) with or without fitted ``guide_params=``. The default guide is built once per
:class:`~numpyro_subsample.core.potential.Potential`, and every compiled SVI program takes the
data as an argument, so a refit on new data of the same shapes compiles nothing.

Ordering. An ``AutoContinuous`` guide flattens the latent sites in model order, ``Potential``
by name; the guide's moments are permuted by the map read off ``guide._unpack_latent``.

Convergence rule. SVI runs in blocks of ``block_size`` Adam steps on the unconstrained
parameters, iterate-averaged within each block. After each block the ELBO of the averaged
parameters is estimated with common random numbers (the same ``num_eval_particles`` subsamples
and guide draws every time), so that blocks are compared without the subsampling noise of the
ELBO:

1. a block improves if that ELBO rises by more than ``tol`` nats (default ``0.01 · d``);
2. after ``patience`` blocks without improvement the learning rate is divided by 4;
3. SVI stops at such a plateau after ``num_decays`` reductions (``info["converged"] = True``),
   or at ``max_steps``. The result is the average over the last block.

A fit that failed (ELBO still rising at ``max_steps``, non-finite steps, a collapsed guide
scale, a mean at a support's boundary) is reported by site (:func:`fit_variational`).

The SVI runs are in :mod:`~numpyro_subsample.proxies.svi`, the guides and their moments in
:mod:`~numpyro_subsample.proxies.guides` (re-exported here).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, value_grad_hessian
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.checks import (
    boundary_message,
    coordinate_labels,
    describe,
    newton_offsets,
    prior_grad,
    scale_message,
    stein_curvature,
    stein_subsample,
    transformed_coordinates,
    warn_proxy,
)
from numpyro_subsample.proxies.guides import (
    MAX_FULL_RANK_DIM,
    _cached_default_guide,
    _setup_guide,
    default_guide,
    guide_moments,
)
from numpyro_subsample.proxies.laplace import proxy_from_moments
from numpyro_subsample.proxies.svi import _fit_svi

__all__ = ["fit_variational", "default_guide", "guide_moments", "MAX_FULL_RANK_DIM"]

MAX_NONFINITE_STEPS = 0.01  # share of SVI steps with a non-finite loss before a warning
STEIN_DRAWS = 32  # guide draws of the scale check (its ratio has sd ≈ √(2/32) = 0.25)


def _check_settings(block_size, max_steps, patience, num_decays, num_eval_particles,
                    learning_rate, tol):
    for name, value in (("block_size", block_size), ("max_steps", max_steps),
                        ("patience", patience), ("num_eval_particles", num_eval_particles)):
        if not (isinstance(value, (int, np.integer)) and value >= 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if not (isinstance(num_decays, (int, np.integer)) and num_decays >= 0):
        raise ValueError(f"num_decays must be a non-negative integer, got {num_decays!r}.")
    if not (isinstance(learning_rate, (int, float)) and np.isfinite(learning_rate)
            and learning_rate > 0):
        raise ValueError(
            f"learning_rate must be a positive number, got {learning_rate!r}; the default is "
            "0.02."
        )
    if tol is not None and not (isinstance(tol, (int, float)) and tol >= 0):
        raise ValueError(f"tol must be a non-negative number of nats or None, got {tol!r}.")


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def _mean_hessian(potential: Potential, thetas: jax.Array, data: ModelData, chunk_size: int):
    """The full-data Hessian of f averaged over the rows of ``thetas`` (one pass each)."""
    hess = jax.lax.map(lambda t: value_grad_hessian(potential, t, data, chunk_size)[2], thetas)
    return hess.mean(0)


def fit_variational(
    potential: Potential,
    data: ModelData,
    rng_key: jax.Array,
    *,
    guide: Callable | None = None,
    guide_params: dict | None = None,
    max_full_rank_dim: int = MAX_FULL_RANK_DIM,
    learning_rate: float = 0.02,
    block_size: int = 250,
    patience: int = 2,
    num_decays: int = 3,
    max_steps: int = 20_000,
    tol: float | None = None,
    num_eval_particles: int = 32,
    num_moment_samples: int = 4000,
    covariance: str = "guide",
    num_hessian_draws: int = 8,
    chunk_size: int = DEFAULT_CHUNK,
    store_datum_grads: bool = True,
    progress: bool = False,
) -> Proxy:
    """Variational proxy: SVI on the model's subsampled ELBO, moments of the fitted guide.

    The model is ``potential.model``, its arguments ``data``. ``guide`` defaults to an
    ``AutoMultivariateNormal`` (low-rank above ``max_full_rank_dim``) started at the
    potential's initial point; with ``guide_params`` (already fitted) SVI is skipped. The
    stopping rule is in the module docstring. ``num_data_passes`` counts the SVI steps and the
    common-random-number ELBO evaluations (n/N each), the per-datum gradients at the centre
    (one) and the Stein check's datum gradients (33 at each of m = min(N, 4096,
    max(512, N/33)) data: one pass for N ≥ 16 896).
    ``proxy.info`` holds the guide, its parameters, the per-step loss (``losses``, −ELBO on
    the model's subsample), the per-block common-random-number ELBO (``elbo_trace``, after
    ``initial_elbo``), ``svi_steps``, whether the plateau rule was met (``converged``),
    ``gaussian`` and ``sample`` (draws ``(key, S) -> (S, d)`` from q in the potential's flat
    space), and the checks' figures (``mean_decrement``, ``stein_ratio``) and ``warnings``.

    ``covariance``: ``"guide"`` (the guide's own covariance, as the variational proxies of
    Rønning and Hamelryck 2021) or ``"expected_hessian"``: centre at the guide's mean and
    covariance (E_q[∇²f])⁻¹, the full-data Hessian averaged over the mean and
    ``num_hessian_draws`` guide draws (one pass each; dense, so d ≤ ``max_full_rank_dim``).
    Variational fits shrink variances and can collapse a direction altogether (a guide sd of
    1e-4 where the posterior's is 0.1 on hierarchical models), which would freeze a chain
    whitened by it; the expected curvature over the guide's mass does not collapse, and is
    the covariance the stochastic-gradient kernels use (``info["guide_cov"]`` keeps the
    guide's). Falls back to the guide's covariance, with a warning, if the averaged Hessian
    is not positive definite.

    Warns (:class:`~numpyro_subsample.proxies.base.ProxyFitWarning`, naming sites and a
    remedy) if more than 1% of the SVI steps had a non-finite loss, SVI stopped at
    ``max_steps`` with the ELBO still rising by more than ``tol`` over the last ``patience``
    blocks, a Gaussian guide's variances are far (a factor 10) from stationary ones along a
    coordinate (the ratio of diag E_q[∇²f], by Stein's identity at 32 guide draws, to the
    guide's diag Σ⁻¹: ``stein_ratio``; a collapsed or too wide guide scale), or its mean is at
    a support's boundary (:mod:`.checks`). The Newton
    decrement at the mean (``mean_decrement``, in guide sds) is reported, not checked: the mean
    of a skewed posterior (a non-centred hierarchical model) is legitimately several sds
    from its mode.

    Parameters
    ----------
    potential, data
        The model's potential and data.
    rng_key
        Key of SVI and of the moment draws.
    guide
        A NumPyro guide (default: an autoguide, see above).
    guide_params
        Fitted guide parameters: skip SVI.
    max_full_rank_dim
        Largest d of the full-rank default guide.
    learning_rate, block_size, patience, num_decays, max_steps, tol
        SVI's Adam rate and its stopping rule (module docstring).
    num_eval_particles
        Particles of the common-random-number ELBO.
    num_moment_samples
        Draws for the moments of a non-Gaussian guide.
    covariance
        ``"guide"`` or ``"expected_hessian"`` (above).
    num_hessian_draws
        Guide draws averaged by ``"expected_hessian"``.
    chunk_size
        Data per vmapped evaluation in full-data passes.
    store_datum_grads
        Keep the (N, d) table of ∇f_i at the centre.
    progress
        Show progress bars.

    Returns
    -------
    Proxy
        N(guide mean, Σ̂) with ``info`` as above.

    References
    ----------
    Rønning and Hamelryck (2021), Eq. 2-4 (variational proxies); Hoffman, Blei, Wang and
    Paisley (2013) (stochastic variational inference).
    """
    t0 = time.perf_counter()
    _check_settings(block_size, max_steps, patience, num_decays, num_eval_particles,
                    learning_rate, tol)
    if potential.enumerated_sites:
        raise ValueError(
            "The variational proxy does not support sites marked for enumeration "
            f"({', '.join(repr(s) for s in potential.enumerated_sites)}): NumPyro's SVI would "
            "need funsor and TraceEnum_ELBO to sum them out. Use proxy='laplace' (the "
            "default), which fits the potential with those sites summed out."
        )
    if guide_params is not None and guide is None:
        raise ValueError(
            "guide_params= needs the guide= they were fitted for; pass both (e.g. "
            "proxy.info['guide'] and proxy.info['guide_params'] of a fitted proxy)."
        )
    if guide is None:
        guide = _cached_default_guide(potential, int(max_full_rank_dim))
    k_setup, k_fit, k_mom = jax.random.split(rng_key, 3)
    _setup_guide(guide, k_setup, data)
    if guide_params is None:
        params, info = _fit_svi(
            potential.model, guide, data, k_fit, learning_rate=learning_rate,
            block_size=int(block_size), patience=int(patience), num_decays=int(num_decays),
            max_steps=int(max_steps), progress=progress,
            tol=0.01 * potential.dim if tol is None else float(tol),
            num_eval_particles=int(num_eval_particles),
        )
        evaluations = info["svi_steps"] + info["crn_evaluations"]
        passes = evaluations * potential.plate.subsample_size / potential.num_data
    else:
        params, info, passes = guide_params, {"svi_steps": 0, "converged": None}, 0.0
    mean, cov, gaussian, sample = guide_moments(
        potential, data, guide, params, rng_key=k_mom, num_samples=num_moment_samples
    )
    dtype = potential.init_theta.dtype
    mean, cov = jnp.asarray(mean, dtype), jnp.asarray(cov, dtype)
    if not (bool(jnp.all(jnp.isfinite(mean))) and bool(jnp.all(jnp.isfinite(cov)))):
        raise ValueError(
            "The fitted guide has non-finite moments; pass a smaller learning_rate or a guide."
        )
    eig_min = float(np.linalg.eigvalsh(0.5 * (np.asarray(cov) + np.asarray(cov).T)).min())
    if not eig_min > 0:
        raise ValueError(
            f"The guide's covariance is not positive definite (smallest eigenvalue {eig_min:.3g})"
            "; use a full-rank guide or more num_moment_samples."
        )
    guide_cov = cov
    if covariance not in ("guide", "expected_hessian"):
        raise ValueError(
            f"covariance must be 'guide' or 'expected_hessian', got {covariance!r}."
        )
    if covariance == "expected_hessian":
        if potential.dim > int(max_full_rank_dim):
            raise ValueError(
                f"covariance='expected_hessian' needs a dense d × d Hessian; d = "
                f"{potential.dim} > max_full_rank_dim = {max_full_rank_dim}: use 'guide'."
            )
        k_h = jax.random.fold_in(k_mom, 1)
        draws = jnp.asarray(sample(k_h, int(num_hessian_draws)), dtype)
        thetas = jnp.concatenate([mean[None], draws])
        h_mean = np.asarray(_mean_hessian(potential, thetas, data, int(chunk_size)), np.float64)
        h_mean = 0.5 * (h_mean + h_mean.T)
        passes += float(thetas.shape[0])
        lam = np.linalg.eigvalsh(h_mean)
        if lam.min() > 0:
            cov = jnp.asarray(np.linalg.inv(h_mean), dtype)
        else:
            warn_proxy(
                "covariance='expected_hessian': the full-data Hessian averaged over the guide's "
                f"mean and {int(num_hessian_draws)} draws is not positive definite (smallest "
                f"eigenvalue {lam.min():.3g}); the guide's covariance is used instead. Check the "
                "fit (more SVI steps, a smaller learning_rate) or pass covariance='guide'."
            )
    proxy = proxy_from_moments(
        potential, data, mean, cov, chunk_size=chunk_size, store_datum_grads=store_datum_grads,
        kind="variational", num_data_passes=passes,
    )
    messages, figures = _fit_messages(potential, data, proxy, info, int(patience), tol, gaussian)
    for message in messages:
        warn_proxy(message)
    info.update(guide=guide, guide_params=params, gaussian=gaussian, sample=sample,
                warnings=messages, guide_cov=guide_cov, covariance=covariance, **figures)
    passes = proxy.num_data_passes + (
        (STEIN_DRAWS + 1) * len(stein_subsample(potential.num_data, STEIN_DRAWS))
        / potential.num_data if gaussian else 0.0
    )
    return proxy._replace(info=info, num_data_passes=passes, seconds=time.perf_counter() - t0)


def _fit_messages(potential, data, proxy, info, patience, tol, gaussian) -> tuple[list, dict]:
    """Warnings of a variational fit (:mod:`.checks`): non-finite SVI steps, an ELBO still
    rising at ``max_steps``, guide variances far from the posterior's (Stein's identity at
    guide draws, Gaussian guides), a mean at a support's boundary; and the figures checked."""
    labels = coordinate_labels(potential)
    mean = np.asarray(proxy.centre, np.float64)
    cov = np.asarray(proxy.cov, np.float64)
    grad = np.asarray(proxy.sum_grads) + np.asarray(prior_grad(potential, proxy.centre, data))
    decrement, offsets = newton_offsets(grad, cov)
    messages = []
    losses = info.get("losses")
    if losses is not None and losses.size:
        bad = int(np.sum(~np.isfinite(losses)))
        if bad > MAX_NONFINITE_STEPS * losses.size:
            messages.append(
                f"{bad} of {losses.size} SVI steps had a non-finite loss (−ELBO) and were "
                "skipped; the guide may sit where the model's density or its gradient "
                "overflows. Pass a smaller learning_rate (proxy_kwargs={'learning_rate': ...}) "
                "or check the model's support and priors."
            )
    trace = info.get("elbo_trace")
    rising = False
    if trace is not None and len(trace) and info.get("converged") is False:
        tol = 0.01 * potential.dim if tol is None else float(tol)
        previous = np.concatenate([[info["initial_elbo"]], trace])[-1 - min(patience, len(trace))]
        rise = float(trace[-1] - previous)
        if rise > tol:
            rising = True
            messages.append(
                f"SVI stopped at max_steps={info['svi_steps']} with the ELBO still rising "
                f"({rise:.3g} nats over the last {min(patience, len(trace))} block(s), tol "
                f"{tol:.3g}); the guide's mean is still moving, most along "
                f"{describe(labels, -offsets)} (remaining Newton step from the mean, in guide "
                "sds). Pass a larger max_steps (proxy_kwargs={'max_steps': ...}) or a larger "
                "learning_rate if the rise is steady, a smaller one if it is erratic."
            )
    ratio = None
    if gaussian:
        idx = stein_subsample(potential.num_data, STEIN_DRAWS)
        dtype = proxy.centre.dtype
        z = jax.random.normal(jax.random.PRNGKey(0), (STEIN_DRAWS, potential.dim), dtype)
        curvature = np.asarray(stein_curvature(
            potential, proxy.centre, proxy.scale_tril, z, jnp.asarray(idx), data,
        ), np.float64)
        inv_tril = np.linalg.inv(np.asarray(proxy.scale_tril, np.float64))
        ratio = curvature / np.sum(inv_tril**2, axis=0)  # over diag(Σ⁻¹)
        scale = scale_message(labels, ratio)
        messages += [scale] if scale else []
    outward = -offsets * (np.abs(offsets) > 1.0) if rising else None
    boundary = boundary_message(
        labels, transformed_coordinates(potential, data), mean, "variational", outward
    )
    messages += [boundary] if boundary else []
    return messages, {"mean_decrement": decrement, "stein_ratio": ratio}
