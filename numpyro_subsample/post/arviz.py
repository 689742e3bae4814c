"""ArviZ output for runs of the package's kernels."""

from __future__ import annotations

import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from numpyro import handlers
from numpyro.infer import MCMC
from numpyro.infer import log_likelihood as numpyro_log_likelihood

from numpyro_subsample.core.datapass import chunk_indices
from numpyro_subsample.sgmcmc.kernel import SGMCMCKernel, warn_divergences
from numpyro_subsample.core.potential import _set_plate_indices

__all__ = ["to_arviz", "full_observed_data", "full_log_likelihood"]


def _kernel_of(
    mcmc: MCMC,
    expects: str = "to_arviz expects an MCMC run with a numpyro_subsample kernel; for other "
    "kernels use arviz.from_numpyro.",
    before: str = "converting to ArviZ",
) -> SGMCMCKernel:
    """The package kernel of a finished MCMC run (``TypeError``/``ValueError`` otherwise)."""
    kernel = getattr(mcmc, "sampler", None)
    if not isinstance(kernel, SGMCMCKernel):
        raise TypeError(expects)
    if mcmc._states is None:  # noqa: SLF001
        raise ValueError(f"Call mcmc.run(...) before {before}.")
    return kernel


def full_observed_data(mcmc: MCMC) -> dict[str, np.ndarray]:
    """Observed values of every sample site, with the subsample plate over all N data."""
    kernel = _kernel_of(mcmc)
    model = kernel.model
    samples = {k: v[0] for k, v in mcmc.get_samples().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = handlers.trace(handlers.substitute(handlers.seed(model, 0), data=samples)).get_trace(
            *mcmc._args, **mcmc._kwargs  # noqa: SLF001
        )
    return {
        name: np.asarray(site["value"])
        for name, site in tr.items()
        if site["type"] == "sample" and site["is_observed"] and not name.startswith("_")
    }


def full_log_likelihood(mcmc: MCMC, chunk_size: int = 1024) -> dict[str, np.ndarray]:
    """log p(x_i | θ_s) for every draw s and every datum i of the plate: (chains, draws, N).

    Costs S·N likelihood evaluations, computed over data chunks.
    """
    kernel = _kernel_of(mcmc)
    plate = kernel.potential.plate
    samples = mcmc.get_samples(group_by_chain=True)
    chains, draws = next(iter(samples.values())).shape[:2]
    flat = {k: v.reshape((chains * draws,) + v.shape[2:]) for k, v in samples.items()}
    args, kwargs = mcmc._args, mcmc._kwargs  # noqa: SLF001

    @jax.jit
    def chunk_ll(idx):
        model = _set_plate_indices(kernel.user_model, name=plate.name, indices=idx)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = numpyro_log_likelihood(model, flat, *args, **kwargs)
        return {
            k: jnp.moveaxis(v, plate.dim, -1).reshape(v.shape[0], -1, idx.shape[0]).sum(1)
            for k, v in out.items()
        }

    idx, _ = chunk_indices(plate.size, chunk_size)
    pieces = [jax.device_get(chunk_ll(i)) for i in idx]
    return {
        k: np.concatenate([p[k] for p in pieces], -1)[..., : plate.size].reshape(chains, draws, -1)
        for k in pieces[0]
    }


def to_arviz(
    mcmc: MCMC, log_likelihood: bool = False, zv: bool | int = False, **kwargs
) -> az.InferenceData:
    """``arviz.InferenceData`` for a run of a package kernel.

    Groups: ``posterior`` (constrained draws), ``sample_stats`` (``diverging``,
    ``subsample_size``, ``data_passes`` and any other collected extra field such as ``grad``),
    ``observed_data`` (all N data, not the last subsample) and, when ``log_likelihood=True``,
    ``log_likelihood`` on the full data (S·N evaluations). ``attrs`` record the step size,
    estimator and preprocessing cost. Extra keyword arguments go to ``arviz.from_numpyro``
    (``coords``, ``dims``, ...).

    ``zv=True`` (or the degree, 1 or 2) adds ZV post-processing (paper 002 Sect. 4, see
    :mod:`numpyro_subsample.post.zv`): a ``zv_posterior`` group with, per site, the ZV-corrected
    ``mean`` and ``var`` and the raw values along a ``zv_stat`` axis, and (when the gradients
    were collected with ``extra_fields=("grad",)``) ``unconstrained_posterior``. It needs
    ``extra_fields=("grad",)`` or a kernel built with ``zv_stream=True``.
    """
    kernel = _kernel_of(mcmc)
    extra = mcmc.get_extra_fields()
    if "diverging" in extra:
        warn_divergences(extra["diverging"], kernel.step_size)
    idata = az.from_numpyro(mcmc, log_likelihood=False, **kwargs)
    plate = kernel.potential.plate
    obs = full_observed_data(mcmc)
    obs_dims = {
        k: [plate.name] + [f"{k}_dim_{j}" for j in range(1, v.ndim)] for k, v in obs.items()
    }
    observed = xr.Dataset({k: (obs_dims[k], v) for k, v in obs.items()})
    if "observed_data" in idata.groups():
        del idata.observed_data
    idata.add_groups(observed_data=observed)
    if log_likelihood:
        ll = full_log_likelihood(mcmc)
        idata.add_groups(
            log_likelihood=xr.Dataset(
                {k: (("chain", "draw", plate.name), v) for k, v in ll.items()}
            )
        )
    pre = kernel.preprocessed
    attrs = {
        "sampler": type(kernel).__name__,
        "estimator": kernel.estimator_name,
        "step_size": float(pre.step_size),
        "preprocessing_seconds": float(pre.seconds),
        "preprocessing_data_passes": float(pre.data_passes),
        "num_data": int(plate.size),
        "plate": plate.name,
    }
    for group in ("posterior", "sample_stats"):
        getattr(idata, group).attrs.update(attrs)
    if zv:
        from numpyro_subsample.post.zv import add_zv_groups

        add_zv_groups(idata, mcmc, degree=1 if zv is True else int(zv))
    return idata
