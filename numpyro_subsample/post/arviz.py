"""ArviZ output for runs of the package's kernels (any :class:`SubsampleKernelLike`).

ArviZ runs the model on concrete values (a prior trace for its dimensions); that run is made
with NumPyro's argument validation off, as the sampler's compiled runs are: at concrete
float32 values a product such as LDA's θ β can fail NumPyro's simplex check by rounding.
"""

from __future__ import annotations

import copy
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from numpyro import handlers
from numpyro.distributions.distribution import validation_enabled

from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.post.checks import check_run
from numpyro_subsample.post.log_likelihood import (
    check_thin,
    full_log_likelihood,
    log_likelihood_chunks,
    log_likelihood_pass,
)
from numpyro_subsample.post.predictive import (
    DEFAULT_CHUNK_MEMORY,
    parse_memory,
    predict_draws,
)
from numpyro_subsample.post.protocol import kernel_of, run_data

__all__ = [
    "to_arviz",
    "full_observed_data",
    "full_log_likelihood",
    "log_likelihood_pass",
    "log_likelihood_chunks",
    "full_plate_deterministic",
]


def full_observed_data(mcmc, data: ModelData | None = None) -> dict[str, np.ndarray]:
    """Observed values of every observed sample site (``numpyro.factor`` sites left out), with
    the subsample plate over all N data.

    ``data``: the model's data (default: those of the run, ``ModelData.from_args``).

    Parameters
    ----------
    mcmc, data
        A finished run and the model's data.

    Returns
    -------
    dict
        Site → all N values.

    References
    ----------
    Kumar et al. (2019) (ArviZ).
    """
    kernel = kernel_of(mcmc, "full_observed_data")
    data = run_data(mcmc) if data is None else data
    args, kwargs = data.args_kwargs()
    model = kernel.potential.full_data_model()
    samples = {k: v[0] for k, v in mcmc.get_samples().items() if k in kernel.potential.latent_sites}
    with warnings.catch_warnings(), validation_enabled(False):
        warnings.simplefilter("ignore")
        tr = handlers.trace(handlers.substitute(handlers.seed(model, 0), data=samples)).get_trace(
            *args, **kwargs
        )
    return {  # numpyro.factor sites (auxiliary, no data) left out
        name: np.asarray(site["value"])
        for name, site in tr.items()
        if site["type"] == "sample" and site["is_observed"] and not name.startswith("_")
        and not (site.get("infer") or {}).get("is_auxiliary")
    }


def _plate_deterministic(idata, mcmc, data, mode: str, chunk_memory, kwargs: dict) -> None:
    """Posterior variables of the deterministic sites inside the plate: the stored values on
    a ``<plate>_subsample`` axis (row indices 0..n−1 as coordinates), or all N rows on the
    plate's axis; ``dims`` the user gave for a site are kept."""
    pot = kernel_of(mcmc).potential
    plate, post = pot.plate, idata.posterior
    user_dims = kwargs.get("dims") or {}
    if mode == "all":
        values = full_plate_deterministic(mcmc, data, chunk_memory=chunk_memory)
        dim = plate.name
    else:
        values = {k: post[k].values for k in pot.plate_deterministic_sites
                  if k in post and k not in user_dims}
        dim = f"{plate.name}_subsample"
    if not values:
        return
    old_dims = {d for k in values if k in post for d in post[k].dims}
    post = post.drop_vars([k for k in values if k in post])
    used = {d for v in post.data_vars.values() for d in v.dims}
    post = post.drop_vars([c for c in post.coords if c in old_dims and c not in used])
    for k, v in values.items():
        axis = v.ndim + plate.dim
        dims = tuple(dim if j == axis else f"{k}_dim_{j - 2}" for j in range(2, v.ndim))
        if k in user_dims and len(user_dims[k]) == v.ndim - 2:
            dims = tuple(user_dims[k])
        post[k] = (("chain", "draw") + dims, v)
        if mode == "first" and dim in dims:
            post = post.assign_coords({dim: np.arange(v.shape[axis])})
    idata.posterior = post


def full_plate_deterministic(
    mcmc, data: ModelData | None = None, *, chunk_memory: int | str = DEFAULT_CHUNK_MEMORY
) -> dict[str, np.ndarray]:
    """The deterministic sites inside the data plate for all N rows: (chains, draws, ...).

    The run stores them for the plate's first n rows only (O(n) per draw); this pass evaluates
    the full-data model (observed sites as observed) for every draw, in chunks of draws
    bounded by ``chunk_memory``.
    """
    kernel = kernel_of(mcmc, "full_plate_deterministic")
    pot = kernel.potential
    sites = pot.plate_deterministic_sites
    if not sites:
        return {}
    data = run_data(mcmc) if data is None else data
    samples = mcmc.get_samples(group_by_chain=True)
    chains, draws = np.shape(samples[pot.latent_sites[0]])[:2]
    latent = {k: np.asarray(samples[k]).reshape((chains * draws,) + np.shape(samples[k])[2:])
              for k in pot.latent_sites}
    out = predict_draws(pot.full_data_model(), latent, data, sites, jax.random.PRNGKey(0),
                        parse_memory(chunk_memory))
    return {k: v.reshape((chains, draws) + v.shape[1:]) for k, v in out.items()}


def to_arviz(
    mcmc,
    log_likelihood: bool = False,
    zv: bool | int = False,
    *,
    log_likelihood_thin: int = 1,
    plate_deterministic: str = "first",
    chunk_memory: int | str = DEFAULT_CHUNK_MEMORY,
    check: bool = True,
    **kwargs,
) -> az.InferenceData:
    """``arviz.InferenceData`` for a run of a package kernel (SG kernels or ECS).

    Groups: ``posterior`` (constrained draws), ``sample_stats`` (``diverging`` and any other
    collected extra field, such as ``data_passes``, ``subsample_size`` or ``grad``),
    ``observed_data`` (all N data, not the last subsample) and, when ``log_likelihood=True``,
    ``log_likelihood`` on the full data (S·N evaluations). ``attrs`` record the sampler, the
    step size and estimator where the kernel has them, and the preprocessing cost. Extra
    keyword arguments go to ``arviz.from_numpyro`` (``coords``, ``dims``, ...).

    Each posterior variable carries the Monte Carlo standard errors of its mean and sd (ArviZ
    ``mcse``) as attributes ``mcse_mean`` and ``mcse_sd`` (flat over the site's coordinates);
    ``az.summary(idata)`` gives the same per coordinate. The run checks of
    :func:`~numpyro_subsample.post.checks.check_run` (min bulk/tail ESS, split R-hat,
    divergences and stopped chains, the largest MCSE of a mean in sd units, and the
    step-halving shift when it was run) are in the ``sample_stats`` attributes; with
    ``check=True`` (default) a run that fails them warns, unless the run came from
    :class:`~numpyro_subsample.post.mcmc.MCMC`, which has warned already.

    The ``log_likelihood`` group is a float array of chains × draws × N per observed site (the
    output itself, 4·S·N bytes in float32). It is computed a chunk of draws at a time into that
    preallocated array; ``chunk_memory`` (bytes, or a string such as ``"512MB"``; default
    256 MB) bounds the temporaries beyond the output (:func:`log_likelihood_pass`).
    ``log_likelihood_thin=k`` computes it on every k-th draw of each chain only (its ``draw``
    coordinate holds the kept draws' indices 0, k, 2k, ...).

    Deterministic sites inside the data plate: with ``plate_deterministic="first"`` (default)
    the posterior holds the values the run stored, for the plate's first n rows (indices
    0..n−1, n the model's ``subsample_size``), the same rows for every draw; with ``"all"``
    they are recomputed for all N rows (dimension named after the plate, S·N evaluations, in
    chunks bounded by ``chunk_memory``; :func:`numpyro_subsample.post.predictive.predictive`
    gives the same for new data).

    ``zv=True`` (or the degree, 1 or 2) adds the zero-variance post-processing of Baker,
    Fearnhead, Fox and Nemeth (2019, Sect. 4; :mod:`numpyro_subsample.post.zv`): a
    ``zv_posterior`` group with, per site, the ZV-corrected ``mean`` and ``var`` and the raw
    values along a ``zv_stat`` axis, and (with ``extra_fields=("grad",)``)
    ``unconstrained_posterior``. It needs ``extra_fields=("grad",)`` or an SG kernel built
    with ``zv=ZVOptions()``.

    Parameters
    ----------
    mcmc, log_likelihood, log_likelihood_thin, chunk_memory, plate_deterministic, zv, check
        The finished run and the options above.
    **kwargs
        Passed to ``arviz.from_numpyro``.

    Returns
    -------
    arviz.InferenceData
        The groups above.

    References
    ----------
    Baker et al. (2019), Sect. 4 (ZV).
    """
    kernel = kernel_of(mcmc, "to_arviz")
    thin = check_thin(log_likelihood_thin, "log_likelihood_thin")
    if plate_deterministic not in ("first", "all"):
        raise ValueError(
            f"plate_deterministic={plate_deterministic!r}: pass 'first' (the stored values for "
            "the plate's first n rows) or 'all' (recomputed for all N rows)."
        )
    parse_memory(chunk_memory)
    run_check = getattr(mcmc, "run_check", None)
    if run_check is None:
        run_check = check_run(mcmc, warn=check, stacklevel=3)
    data = run_data(mcmc)
    with validation_enabled(False):  # ArviZ runs the model on concrete values (module doc)
        idata = az.from_numpyro(_with_jax_arrays(mcmc), log_likelihood=False, **kwargs)
    _add_observed_data(idata, mcmc, data)
    _plate_deterministic(idata, mcmc, data, plate_deterministic, chunk_memory, kwargs)
    if log_likelihood:
        _add_log_likelihood(idata, mcmc, data, chunk_memory, thin)
    attrs = _run_attrs(kernel)
    for group in ("posterior", "sample_stats"):
        getattr(idata, group).attrs.update(attrs)
    idata.sample_stats.attrs.update(run_check.attrs())
    _add_mcse(idata.posterior)
    if zv:
        from numpyro_subsample.post.zv import add_zv_groups

        add_zv_groups(idata, mcmc, degree=1 if zv is True else int(zv), data=data)
    return idata


def _add_observed_data(idata: az.InferenceData, mcmc, data: ModelData) -> None:
    """The ``observed_data`` group on all N data of the plate, replacing ArviZ's (the last
    subsample's)."""
    plate = kernel_of(mcmc).potential.plate
    obs = full_observed_data(mcmc, data)

    def dims(k: str, v: np.ndarray) -> list[str]:  # an observed site outside the plate: its own
        first = [plate.name] if v.ndim and v.shape[0] == plate.size else []
        return first + [f"{k}_dim_{j}" for j in range(len(first), v.ndim)]

    observed = xr.Dataset({k: (dims(k, v), v) for k, v in obs.items()})
    if "observed_data" in idata.groups():
        del idata.observed_data
    idata.add_groups(observed_data=observed)


def _add_log_likelihood(idata: az.InferenceData, mcmc, data: ModelData, chunk_memory,
                        thin: int) -> None:
    """The ``log_likelihood`` group on the full data, every ``thin``-th draw of each chain."""
    plate = kernel_of(mcmc).potential.plate
    ll = full_log_likelihood(mcmc, data=data, chunk_memory=chunk_memory, thin=thin)
    draws = np.arange(next(iter(ll.values())).shape[1]) * thin
    idata.add_groups(
        log_likelihood=xr.Dataset(
            {k: (("chain", "draw", plate.name), v) for k, v in ll.items()},
            coords={"chain": idata.posterior.chain.values, "draw": draws},
        )
    )


def _run_attrs(kernel) -> dict:
    """The attributes of the posterior and sample_stats groups: the sampler, its estimator and
    step size where it has them, the preprocessing cost and the plate."""
    pre, potential = kernel.preprocessed, kernel.potential
    step_size = getattr(pre, "step_size", None)
    attrs = {
        "sampler": type(kernel).__name__,
        "estimator": getattr(kernel, "estimator_name", None),
        "step_size": None if step_size is None else float(step_size),
        "preprocessing_seconds": float(pre.seconds),
        "preprocessing_data_passes": float(pre.data_passes),
        "num_data": int(potential.plate.size),
        "plate": potential.plate.name,
        "local_sites": ",".join(potential.local_sites) or None,
        "integrated_sites": ",".join(potential.integrated_sites) or None,
    }
    return {k: v for k, v in attrs.items() if v is not None}


def _add_mcse(posterior: xr.Dataset) -> None:
    """Each posterior variable's Monte Carlo standard errors of its mean and sd (ArviZ
    ``mcse``) as its attributes ``mcse_mean`` and ``mcse_sd``: a float for a scalar site, else
    a flat array over the site's coordinates in C order (netCDF attributes are at most 1-D)."""
    if posterior.sizes.get("draw", 0) < 4:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant coordinates give nan, as in az.summary
        for method in ("mean", "sd"):
            mcse = az.mcse(posterior, method=method)
            for name in posterior.data_vars:
                v = np.asarray(mcse[name].values, np.float64)
                posterior[name].attrs[f"mcse_{method}"] = float(v) if v.ndim == 0 else v.ravel()


def _with_jax_arrays(mcmc):
    """A shallow copy of ``mcmc`` whose model arguments hold JAX arrays in place of NumPy
    ones: ArviZ traces the model under ``jax.eval_shape``, where the plate's indices are
    tracers, and a NumPy array cannot be indexed by a tracer."""
    view = copy.copy(mcmc)

    def conv(x):
        return jnp.asarray(x) if isinstance(x, np.ndarray) else x

    view._args = jax.tree.map(conv, mcmc._args)
    view._kwargs = jax.tree.map(conv, mcmc._kwargs)
    return view
