"""What post-processing reads from a kernel, as a protocol rather than kernel classes.

Every kernel of the package (the stochastic-gradient kernels of
:mod:`numpyro_subsample.sgmcmc` and ``EnergyConservingHMC`` of :mod:`numpyro_subsample.ecs`)
is a :class:`~numpyro_subsample.core.adapter.SubsampleKernel` and satisfies
:class:`SubsampleKernelLike`; the functions of :mod:`numpyro_subsample.post` accept any object
that does, and never import the kernel modules. The data are an argument of every pass over
them: those of the ``MCMC`` run (:func:`run_data`) or those the kernel was preprocessed on
(:func:`kernel_data`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpyro
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import unconstrain_fn

from numpyro_subsample.core.potential import ModelData, Potential, set_plate_indices

__all__ = [
    "PreprocessedLike",
    "SubsampleKernelLike",
    "check_kernel",
    "kernel_of",
    "run_data",
    "kernel_data",
    "model_at",
    "unconstrain",
]

class PreprocessedLike(Protocol):
    """The preprocessing of a kernel: its potential, wall time and full data passes.

    Optional fields read when present: ``step_size`` (the time step h), ``estimator`` (a
    :class:`~numpyro_subsample.estimators.base.GradientEstimator`, for the pseudo-variance
    and stochastic KSD scores).
    """

    potential: Potential
    seconds: float
    data_passes: float


class SubsampleKernelLike(Protocol):
    """A kernel that post-processing can read.

    ``potential``: the model's :class:`~numpyro_subsample.core.potential.Potential`;
    ``preprocessed``: a :class:`PreprocessedLike` (raises before ``init``); ``model``: the
    model with its subsample plate over all N data. Optional attributes read when present:
    ``estimator_name``, ``chunk_size``, ``zv_fn`` (the g of streamed ZV statistics), and the
    data of the preprocessing as ``preprocessed_data`` (or the adapter's ``_pre_data``).
    """

    @property
    def potential(self) -> Potential: ...

    @property
    def preprocessed(self) -> PreprocessedLike: ...

    @property
    def model(self) -> Callable: ...


_MEMBERS = ("potential", "preprocessed", "model")  # those of SubsampleKernelLike


def check_kernel(kernel: Any, purpose: str = "post-processing") -> SubsampleKernelLike:
    """Return ``kernel`` if it satisfies :class:`SubsampleKernelLike`, else raise ``TypeError``.

    Checked on the class, so that a kernel that has not run yet is recognised too.
    """
    missing = [m for m in _MEMBERS if not hasattr(type(kernel), m)]
    if missing:
        raise TypeError(
            f"{purpose} expects a numpyro_subsample kernel (SGLD, SGHMC, SGNHT, "
            f"EnergyConservingHMC, ...); got {type(kernel).__name__}, which lacks "
            f"{', '.join(missing)}. For other NumPyro kernels use arviz.from_numpyro."
        )
    return kernel


def kernel_of(mcmc: Any, purpose: str = "post-processing") -> SubsampleKernelLike:
    """The kernel of a finished ``MCMC`` run (``TypeError``/``ValueError`` otherwise)."""
    if not hasattr(mcmc, "sampler"):
        raise TypeError(
            f"{purpose} expects a numpyro.infer.MCMC run with a numpyro_subsample kernel; got "
            f"{type(mcmc).__name__}."
        )
    kernel = check_kernel(mcmc.sampler, purpose)
    if getattr(mcmc, "_states", None) is None:
        raise ValueError(f"Call mcmc.run(...) before {purpose}.")
    return kernel


def run_data(mcmc: Any) -> ModelData:
    """The data of an ``MCMC`` run (its model arguments) as :class:`ModelData`."""
    return ModelData.from_args(mcmc._args, mcmc._kwargs)  # noqa: SLF001


def kernel_data(kernel: Any) -> ModelData:
    """The data the kernel was preprocessed on (``ValueError`` before preprocessing)."""
    for name in ("preprocessed_data",):
        try:
            data = getattr(kernel, name, None)
        except RuntimeError:  # the accessor raises before preprocessing
            data = None
        if data is not None:
            return data
    raise ValueError(
        f"The {type(kernel).__name__} kernel holds no preprocessed data: run MCMC with it, "
        "or call kernel.preprocess(model_args, model_kwargs) first."
    )


def model_at(potential: Potential, idx: jax.Array) -> Callable:
    """The user's model with its subsample plate set to the indices ``idx``."""
    return set_plate_indices(potential.model, name=potential.plate.name, indices=idx)


@partial(jax.jit, static_argnames=("potential",))
def unconstrain(potential: Potential, latent: dict, data: ModelData) -> jax.Array:
    """Flat unconstrained θ (B, d) of constrained latent values with a leading batch axis
    (a dict holding at least ``potential.latent_sites``).

    The transforms depend on the latent values only, so the model runs with a one-datum plate.
    """
    args, kwargs = data.args_kwargs()
    # seeded: local latent sites in the plate, which ``latent`` does not hold, are drawn
    model = numpyro.handlers.seed(model_at(potential, jnp.arange(1)), rng_seed=0)
    latent = {k: latent[k] for k in potential.latent_sites}

    def one(p):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            z = unconstrain_fn(model, args, kwargs, p)
        return ravel_pytree(z)[0].astype(potential.init_theta.dtype)

    return jax.vmap(one)(latent)
