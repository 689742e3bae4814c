"""ArviZ output for runs of the package's kernels (any :class:`SubsampleKernelLike`)."""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from numpyro import handlers

from numpyro_subsample.core.datapass import map_data
from numpyro_subsample.core.potential import ModelData, Potential, in_plate, per_datum
from numpyro_subsample.post.protocol import kernel_of, model_at, run_data

__all__ = [
    "to_arviz",
    "full_observed_data",
    "full_log_likelihood",
    "log_likelihood_pass",
    "warn_divergences",
]

_BUDGET = 2**22  # draws × data per chunk of the log-likelihood pass


def warn_divergences(
    diverging: Any, step_size: float | None = None, *, stacklevel: int = 2
) -> int:
    """Warn, with a suggestion, when draws are marked ``diverging``; return their count."""
    count = int(np.sum(np.asarray(diverging)))
    if count:
        size = "" if step_size is None else f" {float(step_size):.3g}"
        warnings.warn(
            f"{count} of {np.size(diverging)} steps diverged or produced non-finite values "
            f"(marked `diverging`). The step size{size} is too large for this posterior: pass "
            "a smaller step_size (e.g. half), or let the kernel choose a smaller one (a "
            "smaller max_variance_inflation for SG kernels, a larger target_accept_prob for "
            "adapted HMC steps).",
            UserWarning,
            stacklevel=stacklevel,
        )
    return count


def full_observed_data(mcmc, data: ModelData | None = None) -> dict[str, np.ndarray]:
    """Observed values of every sample site, with the subsample plate over all N data.

    ``data``: the model's data (default: those of the run, ``ModelData.from_args``).
    """
    kernel = kernel_of(mcmc, "full_observed_data")
    data = run_data(mcmc) if data is None else data
    args, kwargs = data.args_kwargs()
    model = kernel.potential.full_data_model()
    samples = {k: v[0] for k, v in mcmc.get_samples().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = handlers.trace(handlers.substitute(handlers.seed(model, 0), data=samples)).get_trace(
            *args, **kwargs
        )
    return {
        name: np.asarray(site["value"])
        for name, site in tr.items()
        if site["type"] == "sample" and site["is_observed"] and not name.startswith("_")
    }


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def _log_likelihood(potential: Potential, latent: dict, data: ModelData, chunk_size: int):
    plate = potential.plate
    args, kwargs = data.args_kwargs()

    def one(sample, idx):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = handlers.substitute(handlers.seed(model_at(potential, idx), 0), data=sample)
            tr = handlers.trace(model).get_trace(*args, **kwargs)
        return {
            name: per_datum(site["fn"].log_prob(site["value"]), plate, idx.shape[0], name)
            for name, site in tr.items()
            if site["type"] == "sample" and site["is_observed"] and in_plate(site, plate.name)
        }

    def chunk(idx):  # (chunk, S) per site
        return jax.tree.map(jnp.transpose, jax.vmap(one, in_axes=(0, None))(latent, idx))

    return jax.tree.map(jnp.transpose, map_data(chunk, plate.size, chunk_size))


def log_likelihood_pass(
    potential: Potential, latent: dict, data: ModelData, chunk_size: int = 1024
) -> dict[str, jax.Array]:
    """log p(x_i | θ_s) for S draws and every datum i of the plate, (S, N) per observed site.

    ``latent``: constrained latent values with a leading draw axis. One pass over the data in
    chunks of at most ``chunk_size`` data (fewer when S is large: S · chunk ≤ 2²²); compiled
    once per potential and shapes.
    """
    num_draws = int(np.shape(next(iter(latent.values())))[0])
    chunk = int(max(1, min(int(chunk_size), _BUDGET // max(num_draws, 1))))
    latent = {k: jnp.asarray(latent[k]) for k in potential.latent_sites}
    return _log_likelihood(potential, latent, data, chunk)


def full_log_likelihood(
    mcmc, chunk_size: int = 1024, data: ModelData | None = None
) -> dict[str, np.ndarray]:
    """log p(x_i | θ_s) for every draw s and every datum i of the plate: (chains, draws, N).

    Costs S·N likelihood evaluations (:func:`log_likelihood_pass`). ``data``: the model's data
    (default: those of the run).
    """
    kernel = kernel_of(mcmc, "full_log_likelihood")
    data = run_data(mcmc) if data is None else data
    samples = mcmc.get_samples(group_by_chain=True)
    chains, draws = next(iter(samples.values())).shape[:2]
    latent = {
        k: np.asarray(samples[k]).reshape((chains * draws,) + samples[k].shape[2:])
        for k in kernel.potential.latent_sites
    }
    out = log_likelihood_pass(kernel.potential, latent, data, chunk_size)
    return {k: np.asarray(v).reshape(chains, draws, -1) for k, v in out.items()}


def to_arviz(
    mcmc, log_likelihood: bool = False, zv: bool | int = False, **kwargs
) -> az.InferenceData:
    """``arviz.InferenceData`` for a run of a package kernel (SG kernels or ECS).

    Groups: ``posterior`` (constrained draws), ``sample_stats`` (``diverging``,
    ``subsample_size``, ``data_passes`` and any other collected extra field such as ``grad``),
    ``observed_data`` (all N data, not the last subsample) and, when ``log_likelihood=True``,
    ``log_likelihood`` on the full data (S·N evaluations). ``attrs`` record the sampler, the
    step size and estimator where the kernel has them, and the preprocessing cost. Extra
    keyword arguments go to ``arviz.from_numpyro`` (``coords``, ``dims``, ...). Warns when
    draws are marked ``diverging``.

    ``zv=True`` (or the degree, 1 or 2) adds the zero-variance post-processing of Baker,
    Fearnhead, Fox and Nemeth (2019, Sect. 4; :mod:`numpyro_subsample.post.zv`): a
    ``zv_posterior`` group with, per site, the ZV-corrected ``mean`` and ``var`` and the raw
    values along a ``zv_stat`` axis, and (with ``extra_fields=("grad",)``)
    ``unconstrained_posterior``. It needs ``extra_fields=("grad",)`` or an SG kernel built
    with ``zv_stream=True``.
    """
    kernel = kernel_of(mcmc, "to_arviz")
    pre = kernel.preprocessed
    step_size = getattr(pre, "step_size", None)
    extra = mcmc.get_extra_fields()
    if "diverging" in extra:
        warn_divergences(extra["diverging"], step_size, stacklevel=3)
    data = run_data(mcmc)
    idata = az.from_numpyro(mcmc, log_likelihood=False, **kwargs)
    plate = kernel.potential.plate
    obs = full_observed_data(mcmc, data)
    observed = xr.Dataset({
        k: ([plate.name] + [f"{k}_dim_{j}" for j in range(1, v.ndim)], v) for k, v in obs.items()
    })
    if "observed_data" in idata.groups():
        del idata.observed_data
    idata.add_groups(observed_data=observed)
    if log_likelihood:
        ll = full_log_likelihood(mcmc, data=data)
        idata.add_groups(
            log_likelihood=xr.Dataset(
                {k: (("chain", "draw", plate.name), v) for k, v in ll.items()}
            )
        )
    attrs = {
        "sampler": type(kernel).__name__,
        "estimator": getattr(kernel, "estimator_name", None),
        "step_size": None if step_size is None else float(step_size),
        "preprocessing_seconds": float(pre.seconds),
        "preprocessing_data_passes": float(pre.data_passes),
        "num_data": int(plate.size),
        "plate": plate.name,
    }
    attrs = {k: v for k, v in attrs.items() if v is not None}
    for group in ("posterior", "sample_stats"):
        getattr(idata, group).attrs.update(attrs)
    if zv:
        from numpyro_subsample.post.zv import add_zv_groups

        add_zv_groups(idata, mcmc, degree=1 if zv is True else int(zv), data=data)
    return idata
