"""The draws of a ZV fit: covariates U and function values G from an ``MCMC`` run or an
InferenceData (Baker, Fearnhead, Fox and Nemeth 2019, Sect. 4, Algorithm 2), with the gradient
covariates of Eq. 13 or the linearised ones (:mod:`numpyro_subsample.estimators.zv`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.estimators.zv import (
    covariate_choice,
    default_g,
    flat_fn,
    linearised_covariates,
    zv_covariates,
)
from numpyro_subsample.post.protocol import kernel_of, run_data, unconstrain
from numpyro_subsample.post.zv_solver import Draws
from numpyro_subsample.proxies.whitening import whiten_matvec, whiten_rmatvec

__all__ = ["unconstrained_draws", "draws_from_mcmc", "draws_from_idata", "zv_kernel_of"]


@partial(jax.jit, static_argnames=("fn",))
def _flat_values(fn: Callable, samples: dict) -> jax.Array:
    """g of every sample (leading axis B) as a flat vector (B, m), in batches."""
    flat = flat_fn(fn, jax.tree.map(lambda v: v[0], samples))[0]
    return jax.lax.map(flat, samples, batch_size=256)


def _eval_fn(fn: Callable, samples: dict) -> tuple[np.ndarray, Callable]:
    """fn over all (chain, draw) samples -> (C, D, m) and the unflattener."""
    C, D = next(iter(samples.values())).shape[:2]
    flat = {k: jnp.asarray(v).reshape((C * D,) + v.shape[2:]) for k, v in samples.items()}
    unflatten = flat_fn(fn, {k: v[0] for k, v in flat.items()})[1]
    G = _flat_values(fn, flat)
    return np.asarray(G, np.float64).reshape(C, D, -1), unflatten


def zv_kernel_of(mcmc: Any) -> Any:
    """The kernel of a finished run, with ZV's wording of the errors."""
    return kernel_of(mcmc, "ZV post-processing (zv_mean, zv_fit; or pass the InferenceData of "
                           "numpyro_subsample.to_arviz)")


def unconstrained_draws(mcmc, data: ModelData | None = None) -> np.ndarray:
    """Flat unconstrained θ (chain, draw, d) of a run (inverse transforms of the stored draws).

    ``data``: the model's data (default: those of the run).
    """
    pot = zv_kernel_of(mcmc).potential
    data = run_data(mcmc) if data is None else data
    samples = mcmc.get_samples(group_by_chain=True)
    C, D = next(iter(samples.values())).shape[:2]
    latent = {k: jnp.asarray(samples[k]).reshape((C * D,) + samples[k].shape[2:])
              for k in pot.latent_sites}
    return np.asarray(unconstrain(pot, latent, data)).reshape(C, D, -1)


def draws_from_mcmc(mcmc, fn, degree, unconstrained, data, covariates) -> Draws | None:
    kernel = zv_kernel_of(mcmc)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    if "grad" not in extra:
        return None
    if unconstrained and fn is not None:
        raise ValueError("Pass either fn or unconstrained=True, not both.")
    grad = np.asarray(extra["grad"], np.float64)
    linearised = covariate_choice(covariates, degree, grad.shape[-1]) == "linearised"
    need_theta = degree == 2 or unconstrained
    theta = unconstrained_draws(mcmc, data) if need_theta else None
    if unconstrained:
        samples = {"theta": theta}
    else:
        samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    G, unflatten = _eval_fn(fn or default_g, samples)
    if linearised:
        U = _linearised_draws(kernel, fn or default_g, unconstrained, grad, data)
        if U.shape != G.shape:
            raise ValueError(
                f"The linearised covariates have shape {U.shape[-1]} per draw, g of the stored "
                f"samples {G.shape[-1]}: g must depend on the model's sites only (those of "
                "the kernel's potential.constrain). Pass covariates='gradient'."
            )
        return Draws(U=U, G=G, unflatten=unflatten, paired=True)
    U = zv_covariates(theta, grad, degree, np) if degree == 2 else grad
    return Draws(U=np.asarray(U, np.float64), G=G, unflatten=unflatten)


def _linearisation(kernel: Any) -> tuple[jax.Array, Any]:
    """θ̄ and the square root L of Σ̂ = L Lᵀ of the linearised covariates: the kernel's
    centre and whitening, fixed before sampling and shared by its chains."""
    pre = kernel.preprocessed
    centre, scale = getattr(pre, "centre", None), getattr(pre, "scale_tril", None)
    if centre is None or scale is None:
        raise ValueError(
            f"covariates='linearised' needs the kernel's centre and preconditioner; "
            f"{type(kernel).__name__} has none. Pass covariates='gradient'."
        )
    return centre, scale


@partial(jax.jit, static_argnames=("potential", "fn", "unconstrained"))
def _linearised_batch(potential, fn, unconstrained, centre, scale, grads, data):
    """u = J_g(θ̄) L Lᵀ ŝ for grads (B, d) (module docstring) -> (B, m)."""
    def g_flat(th):
        sample = {"theta": th} if unconstrained else potential.constrain(
            potential.unravel(th), data)
        return flat_fn(fn, sample)[0](sample)

    v = whiten_matvec(scale, whiten_rmatvec(scale, grads.astype(centre.dtype)))
    return linearised_covariates(g_flat, centre, v)


def _linearised_draws(kernel, fn, unconstrained, grad, data) -> np.ndarray:
    """The linearised covariates (C, D, m) of stored gradients (C, D, d), chain by chain."""
    centre, scale = _linearisation(kernel)
    return np.stack([np.asarray(_linearised_batch(
        kernel.potential, fn, unconstrained, centre, scale, jnp.asarray(g), data), np.float64)
        for g in grad])


def draws_from_idata(idata, fn, degree, unconstrained, covariates) -> Draws:
    local = idata.posterior.attrs.get("local_sites") if "posterior" in idata.groups() else None
    if local:
        raise ValueError(
            f"ZV needs the gradient of the marginal posterior of the global sites; this run's "
            f"model has local latent sites ({local}), whose chain gradient is the joint's at "
            "their current values. Use the plain means of the draws."
        )
    if "sample_stats" not in idata.groups() or "grad" not in idata.sample_stats:
        raise ValueError(
            "The InferenceData has no sample_stats.grad: run MCMC with "
            "extra_fields=('grad',) before to_arviz (or use the kernel's zv=ZVOptions() and "
            "read idata.zv_posterior)."
        )
    grad = np.asarray(idata.sample_stats["grad"].values, np.float64)
    if covariate_choice(covariates, degree, grad.shape[-1]) == "linearised":
        raise ValueError(
            f"ZV of degree 1 for d = {grad.shape[-1]} parameters uses the linearised "
            "covariates (above MAX_ZV_COVARIATES, or as asked), which need the kernel's centre "
            "and preconditioner: pass the MCMC run to zv_fit / zv_mean, or read the "
            "zv_posterior group of to_arviz(mcmc, zv=True)."
        )
    theta = None
    if degree == 2 or unconstrained:
        if "unconstrained_posterior" not in idata.groups():
            raise ValueError(
                "degree=2 / unconstrained=True need the unconstrained draws: create the "
                "InferenceData with to_arviz(mcmc, zv=True), which adds unconstrained_posterior."
            )
        up = idata.unconstrained_posterior
        C, D = grad.shape[:2]
        theta = np.concatenate(
            [np.asarray(up[k].values).reshape(C, D, -1) for k in sorted(up.data_vars)], -1
        )
        if theta.shape[-1] != grad.shape[-1]:
            raise ValueError(
                f"unconstrained_posterior has {theta.shape[-1]} coordinates, grad has "
                f"{grad.shape[-1]}."
            )
    if unconstrained:
        if fn is not None:
            raise ValueError("Pass either fn or unconstrained=True, not both.")
        samples = {"theta": theta}
    else:
        samples = {k: np.asarray(v.values) for k, v in idata.posterior.data_vars.items()}
    G, unflatten = _eval_fn(fn or default_g, samples)
    U = zv_covariates(theta, grad, degree, np) if degree == 2 else grad
    return Draws(U=np.asarray(U, np.float64), G=G, unflatten=unflatten)
