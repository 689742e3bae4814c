"""The map from a reparameterised model's coordinates to those of the model it reparameterises.

A reparameterisation (e.g. NumPyro's :class:`~numpyro.infer.reparam.LocScaleReparam`, partial
centring) changes the latent coordinates θ, not the likelihood: the per-datum terms of the
reparameterised model are those of the original at φ(θ), f_i(θ) = f̃_i(φ(θ)), with φ the
original model's unconstrained coordinates of the same latent values. The control variate of
:mod:`numpyro_subsample.estimators.base` uses φ, in which the likelihood is closest to linear
where the original is the form the data pin (a group effect a_j, not its standardised
ã_j = (a_j − m)/s, whose data gradient moves with s).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.infer.util import unconstrain_fn

from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.plates import set_plate_indices
from numpyro_subsample.core.potential import LikelihoodMap, Potential

__all__ = ["MAP_CHECK_ROWS", "with_likelihood_map"]

#: Rows on which :func:`with_likelihood_map` checks that the two potentials' terms agree.
MAP_CHECK_ROWS = 8


def _to_original(potential: Potential, original: Potential):
    def to_original(theta: jax.Array, data: ModelData) -> jax.Array:
        values = potential.constrain(potential.unravel(theta), data)
        args, kwargs = data.args_kwargs()
        model = handlers.seed(set_plate_indices(original.model, name=original.plate.name,
                                                indices=jnp.arange(1)), rng_seed=0)
        latent = {k: values[k] for k in original.latent_sites}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            z = unconstrain_fn(model, args, kwargs, latent)
        return ravel_pytree(z)[0].astype(theta.dtype)

    return to_original


def with_likelihood_map(potential: Potential, original: Potential,
                        data: ModelData) -> Potential:
    """``potential`` with its :class:`~numpyro_subsample.core.potential.LikelihoodMap` to
    ``original``, the potential of the model it reparameterises; ``potential`` unchanged
    where the map is not defined (local or enumerated sites, an original site the
    reparameterised model does not return, another dimension) or where the two potentials'
    terms differ at its start on the first :data:`MAP_CHECK_ROWS` rows."""
    if (potential.local or original.local or potential.enumerated_dims
            or original.enumerated_dims or potential.dim != original.dim
            or potential.plate.size != original.plate.size):
        return potential
    to_original = _to_original(potential, original)
    theta = potential.init_theta
    rows = jnp.arange(min(MAP_CHECK_ROWS, potential.num_data))
    try:
        phi = to_original(theta, data)
        mine = potential.data_terms(theta, rows, data)
        theirs = original.data_terms(phi, rows, data)
    except (KeyError, TypeError, ValueError):
        return potential
    mine, theirs = np.asarray(mine, np.float64), np.asarray(theirs, np.float64)
    tol = 1e-4 * (1.0 + np.abs(mine))
    if phi.shape != theta.shape or not np.all(np.abs(mine - theirs) <= tol):
        return potential
    return dataclasses.replace(potential,
                               likelihood_map=LikelihoodMap(original, to_original))
