"""Checks of a variational fit q = N(m, Σ): is SVI done, and is q close to the posterior?

* SVI stopped at ``max_steps`` before the plateau rule, or had non-finite steps;
* the Stein identities of the posterior read under q (:func:`~.checks.stein_moments`, 32
  antithetic guide draws, datum gradients on a subsample): E_q[∇f] = 0 (a mean off by the
  Newton step Σ E_q[∇f] > 1 sd warns) and diag E_q[∇²f] = diag Σ⁻¹ (a factor 10 warns). A
  stationary Gaussian fit satisfies both even where the posterior is far from Gaussian;
* the importance weights p/q at 300 guide draws (full-data values, the data read once):
  their Pareto k̂ above 0.7 (Yao et al. 2018, "Yes, but did it work?") says q is far from the
  posterior (e.g. a guide collapsed into the funnel of a
  centred hierarchical model);
* short exact chains on the full data (:mod:`.chain_check`): where they move away from q, q
  is far from the posterior where the importance weights cannot see it: a guide collapsed
  into a funnel's neck puts all its draws where p/q is smooth, so k̂ stays low, while the
  chains diffuse out of the neck;
* a mean at a support's boundary (:func:`~.checks.boundary_message`).
"""

from __future__ import annotations

import warnings
from functools import partial

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, scan_chunks
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.chain_check import CHAIN_PASSES, chain_check
from numpyro_subsample.proxies.checks import (
    boundary_message,
    coordinate_labels,
    describe,
    newton_offsets,
    prior_grad,
    scale_message,
    stein_moments,
    stein_subsample,
    transformed_coordinates,
)

__all__ = ["fit_messages", "importance_log_weights", "pareto_khat", "check_passes"]

MAX_NONFINITE_STEPS = 0.01  # share of SVI steps with a non-finite loss before a warning
STEIN_DRAWS = 32  # guide draws of the Stein checks, 16 antithetic pairs
PARETO_DRAWS = 300  # guide draws of the importance-weight check (full-data values)
MAX_STEIN_OFFSET = 1.0  # |Σ E_q[∇f]|_k / sd_k above which the guide's mean is off
MAX_PARETO_K = 0.7  # Pareto k̂ of p/q above which q is far from p (Yao et al. 2018)


def check_passes(num_data: int, chain: bool = True) -> float:
    """Data passes of the checks of a Gaussian q: the Stein draws' datum gradients on their
    subsample, the importance weights' full-data values and the chain check's (the terms at
    q's mean, then a gradient pass at the start and at each step, for all its chains)."""
    return (STEIN_DRAWS + 1) * len(stein_subsample(num_data, STEIN_DRAWS)) / num_data + (
        PARETO_DRAWS) + (CHAIN_PASSES if chain else 0)


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def importance_log_weights(
    potential: Potential,
    centre: jax.Array,
    scale_tril: jax.Array,
    z: jax.Array,
    data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
) -> jax.Array:
    """log p(θ_s) − log q(θ_s) + const at the draws θ_s = m + L z_s of q = N(m, LLᵀ): the
    full-data potential at every draw, the data read once (each chunk at all draws), as
    differences from m taken per datum before summing (they keep their precision when f
    itself is a large sum)."""
    thetas = centre + z @ scale_tril.T

    def chunk(idx, mask):
        base = potential.data_terms(centre, idx, data)
        terms = jax.vmap(lambda t: potential.data_terms(t, idx, data) - base)(thetas)
        return jnp.sum(jnp.where(mask, terms, 0.0), axis=1)

    lik = scan_chunks(chunk, potential.num_data, chunk_size, jnp.zeros(z.shape[0], centre.dtype))
    prior = jax.vmap(lambda t: potential.prior(t, data))(thetas)
    return -(lik + prior) + 0.5 * jnp.sum(z**2, axis=1)


def pareto_message(labels, khat, z, log_weights) -> str | None:
    """Message for a Gaussian guide far from the posterior (Pareto k̂ of the importance
    weights above :data:`MAX_PARETO_K`), or None; the coordinates named are those whose
    whitened draws correlate most with the log weights."""
    if not khat > MAX_PARETO_K:
        return None
    z = np.asarray(z, np.float64)
    lw = np.asarray(log_weights, np.float64)
    finite = np.isfinite(lw)
    lw = np.where(finite, lw, lw[finite].min() if finite.any() else 0.0)
    corr = np.nan_to_num((z - z.mean(0)).T @ (lw - lw.mean()) / (
        z.shape[0] * z.std(0) * max(lw.std(), 1e-300)))
    return (
        f"The Gaussian guide is far from the posterior: the Pareto k̂ of the importance "
        f"weights p/q at {z.shape[0]} guide draws is {khat:.2f} > {MAX_PARETO_K} (Yao et al. "
        "2018), so q's moments, and a chain centred "
        "and whitened by them, may be off; the "
        f"weights vary most along {describe(labels, corr, fmt='{:.2f}')} (correlation with "
        "the log weight). A funnel (a centred hierarchical scale) or a heavy tail does this: "
        "write those sites non-centred (numpyro.infer.reparam.LocScaleReparam) or in "
        "coordinates where the posterior is closer to Gaussian, and check the chain against "
        "a long full-data NUTS run."
    )


def stationarity_message(labels, offsets) -> str | None:
    """Message for a guide whose mean is off by more than :data:`MAX_STEIN_OFFSET` of its
    sds along some coordinate (``offsets``: the Newton step Σ E_q[∇f] over the sds), or None."""
    offsets = np.asarray(offsets, np.float64)
    bad = ~(np.abs(offsets) <= MAX_STEIN_OFFSET)
    if not bad.any():
        return None
    return (
        f"The guide's mean is not stationary: E_q[∇f] (Stein's identity at guide draws) is 0 at "
        f"a converged Gaussian fit, and here the step Σ E_q[∇f] it asks for is over "
        f"{MAX_STEIN_OFFSET:g} guide sd along {describe(labels, offsets)}. SVI stopped short "
        "or its ELBO gradient is too noisy: pass more max_steps and a smaller learning_rate "
        "(proxy_kwargs={...}), or a larger subsample_size (the noise grows as N/n)."
    )


def pareto_khat(log_weights) -> float:
    """ArviZ's Pareto k̂ of the importance weights (Vehtari et al. 2024); inf if any log
    weight is not finite, 0 if they are equal within 0.01 (q = p up to rounding, where the
    tail fit is degenerate)."""
    lw = np.asarray(log_weights, np.float64)
    if not np.all(np.isfinite(lw)):
        return float("inf")
    if np.ptp(lw) < 1e-2:
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(az.psislw(lw - lw.max())[1])


def fit_messages(potential, data, proxy, info, patience, tol, gaussian,
                 chunk_size, chain=True) -> tuple[list, dict]:
    """Warnings of a variational fit (:mod:`.checks`): non-finite SVI steps, SVI stopped at
    ``max_steps``, a Gaussian q breaking the Stein identities (mean or variances), importance
    weights with a large Pareto k̂, chains moving away from q (with ``chain``), a mean at a
    support's boundary; and the figures checked."""
    labels = coordinate_labels(potential)
    mean = np.asarray(proxy.centre, np.float64)
    cov = np.asarray(proxy.cov, np.float64)
    grad = np.asarray(proxy.sum_grads) + np.asarray(prior_grad(potential, proxy.centre, data))
    decrement, offsets = newton_offsets(grad, cov)
    messages = [m for m in (_nonfinite_message(info), _unconverged_message(info, labels, offsets,
                                                                          patience, tol)) if m]
    figures = {"mean_decrement": decrement, "stein_ratio": None, "stationary_offsets": None,
               "pareto_k": None, "chain_sd_ratio": None, "chain_shift": None,
               "chain_acceptance": None}
    if gaussian:
        idx = stein_subsample(potential.num_data, STEIN_DRAWS)
        dtype = proxy.centre.dtype
        z = jax.random.normal(jax.random.PRNGKey(0), (STEIN_DRAWS // 2, potential.dim), dtype)
        change, curvature = stein_moments(potential, proxy.centre, proxy.scale_tril,
                                          jnp.concatenate([z, -z]), jnp.asarray(idx), data)
        stationary = newton_offsets(grad + np.asarray(change, np.float64), cov)[1]
        inv_tril = np.linalg.inv(np.asarray(proxy.scale_tril, np.float64))
        ratio = np.asarray(curvature, np.float64) / np.sum(inv_tril**2, axis=0)  # / diag(Σ⁻¹)
        z = jax.random.normal(jax.random.PRNGKey(1), (PARETO_DRAWS, potential.dim), dtype)
        lw = importance_log_weights(potential, proxy.centre, proxy.scale_tril, z, data,
                                    int(chunk_size))
        khat = pareto_khat(lw)
        figures.update(stein_ratio=ratio, stationary_offsets=-stationary, pareto_k=khat)
        messages += [m for m in (stationarity_message(labels, -stationary),
                                 scale_message(labels, ratio),
                                 pareto_message(labels, khat, z, lw)) if m]
        if chain:
            message, more = chain_check(potential, data, proxy.centre, proxy.scale_tril, cov,
                                        labels, chunk_size, "guide")
            figures.update(more)
            messages += [message] if message else []
    outward = -offsets * (np.abs(offsets) > 1.0) if info.get("converged") is False else None
    boundary = boundary_message(
        labels, transformed_coordinates(potential, data), mean, "variational", outward
    )
    messages += [boundary] if boundary else []
    return messages, figures


def _nonfinite_message(info) -> str | None:
    losses = info.get("losses")
    bad = int(np.sum(~np.isfinite(losses))) if losses is not None else 0
    if not bad > MAX_NONFINITE_STEPS * max(losses.size if losses is not None else 0, 1):
        return None
    return (
        f"{bad} of {losses.size} SVI steps had a non-finite loss (−ELBO) and were skipped; the "
        "guide may sit where the model's density or its gradient overflows. Pass a smaller "
        "learning_rate (proxy_kwargs={'learning_rate': ...}) or check the model's support and "
        "priors."
    )


def _unconverged_message(info, labels, offsets, patience, tol) -> str | None:
    """SVI stopped at ``max_steps`` before the plateau rule: the ELBO's last rise and trend."""
    trace = info.get("elbo_trace")
    if info.get("converged") is not False or trace is None or not len(trace):
        return None
    k = min(patience, len(trace) - 1)
    rise = float(trace[-1] - trace[-1 - k]) if k else float("nan")
    trend = info.get("elbo_trend", float("nan"))
    return (
        f"SVI stopped at max_steps={info['svi_steps']} before its ELBO levelled off (rise "
        f"{rise:.3g} nats over the last {k} block(s), trend {trend:.3g} nats per 1000 steps; "
        f"the rule asks for {patience} blocks without a rise above max({tol:.3g}, 2 se) at "
        "each of its learning rates); the guide's mean may still move, most along "
        f"{describe(labels, -offsets)} (remaining Newton step from the mean, in guide sds). "
        "Pass a larger max_steps (proxy_kwargs={'max_steps': ...}), or a smaller "
        "learning_rate if the ELBO is erratic."
    )
