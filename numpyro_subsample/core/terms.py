"""The functions of a :class:`~numpyro_subsample.core.potential.Potential` built from the
model: its terms (f0, f_i) on a subsample, the check that the plate's indices select the
observed rows, the map to constrained values, and the local latent sites (one value per
datum inside the plate).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.infer.util import _unconstrain_reparam, constrain_fn

from numpyro_subsample.core.data import ModelData, indexed_axes
from numpyro_subsample.core.enumeration import enumerate_sites, enumerated_joint
from numpyro_subsample.core.plates import (
    DataPlate,
    SiteError,
    check_plate_log_prob,
    in_plate,
    per_datum,
    set_plate_indices,
    site_log_prob,
)
from numpyro_subsample.core.structure import _check_indexed_lengths

__all__ = ["LocalSite", "check_plate_indexing", "local_site", "local_values",
           "model_constrain_fn", "model_terms_fn", "rows_at_init", "trace_terms"]


class LocalSite(NamedTuple):
    """A continuous latent site inside the subsample plate: one value per datum.

    ``axis``: the plate's axis in the site's value (batch and event dims); ``row_shape``: the
    constrained value of one datum (the value without that axis); ``support``: the site's
    support; ``init``: a constrained starting value of one datum (its prior mean given the
    global sites' prior means, for the plate's first row; :func:`~.structure._init_to_mean`).
    """

    name: str
    axis: int
    row_shape: tuple[int, ...]
    support: Any
    init: np.ndarray

    def to_site(self, rows: jax.Array) -> jax.Array:
        """(m, *row_shape) values of m data -> the site's value (plate axis in place)."""
        return jnp.moveaxis(rows, 0, self.axis)


def local_values(sites: tuple[LocalSite, ...], local: dict | None, where: str) -> dict:
    """The site values of ``local`` ({name: (m, *row_shape)}), checked complete."""
    names = tuple(s.name for s in sites)
    if local is None or set(local) != set(names):
        got = None if local is None else sorted(local)
        raise ValueError(
            f"{where}: the model has local latent sites {list(names)} inside the subsample "
            f"plate, so their values for the rows are needed (got {got}). Use a kernel that "
            "samples local sites (numpyro_subsample.estimators.local)."
        )
    return {s.name: s.to_site(local[s.name]) for s in sites}


def rows_at_init(local: tuple[LocalSite, ...], m: int) -> dict:
    """Each local site's starting value for ``m`` data."""
    return {s.name: jnp.broadcast_to(jnp.asarray(s.init), (m, *s.row_shape)) for s in local}


def model_terms_fn(model: Callable, plate: DataPlate, unravel: Callable, dims: dict,
              local: tuple[LocalSite, ...], seed_key) -> Callable:
    """The potential's ``terms(theta, idx, data, local_rows=None) -> (f0, f_i)``: the model
    traced at θ on the subsample ``idx`` (enumerated sites summed out, local sites at
    ``local_rows``)."""

    def terms(theta: jax.Array, idx: jax.Array, data: ModelData,
              local_rows: dict | None = None) -> tuple[jax.Array, jax.Array]:
        m = int(idx.shape[0])
        params = unravel(theta)
        args, kwargs = data.args_kwargs()
        fn = set_plate_indices(model, name=plate.name, indices=idx)
        if dims:
            fn = enumerate_sites(fn, dims=dims)
        fn = handlers.substitute(fn, substitute_fn=partial(_unconstrain_reparam, params))
        if local:
            fn = handlers.substitute(fn, data=local_values(local, local_rows, "terms"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mtr = handlers.trace(handlers.seed(fn, seed_key)).get_trace(*args, **kwargs)
        if dims:
            f0, log_z, observed = enumerated_joint(mtr, plate, m, dims, theta.dtype, True)
            joint = log_z + sum(observed.values())
            return f0, -logsumexp(joint, axis=tuple(range(len(dims))))
        return trace_terms(mtr, plate, m, theta.dtype)

    return terms


def trace_terms(mtr: dict, plate: DataPlate, m: int, dtype) -> tuple[jax.Array, jax.Array]:
    """(f0, f_i) of a trace on m data: minus the log-probabilities of the sample sites outside
    the plate, and per datum of those inside it (user scales applied, rescaled to m data)."""
    f0 = jnp.zeros((), dtype)
    fi = jnp.zeros((m,), dtype)
    for name, site in mtr.items():
        if site["type"] != "sample":
            continue
        lp = site_log_prob(site)
        scale = site["scale"]
        if in_plate(site, plate.name):
            check_plate_log_prob(name, site, lp, plate)
            per = per_datum(lp, plate, m, name)
            if scale is not None:
                per = per * (scale * m / plate.size)
            fi = fi - per
        else:
            total = jnp.sum(lp)
            f0 = f0 - (total if scale is None else scale * total)
    return f0, fi


def check_plate_indexing(terms: Callable, init_theta: jax.Array, data: ModelData,
                          plate: DataPlate, local: tuple[LocalSite, ...]) -> None:
    """Evaluate ``terms`` on a subsample length other than the model's n, so that observed
    values not indexed by the plate are caught here rather than silently; its jaxpr also
    shows which data arrays the plate's indices select rows of, whose lengths must be N."""
    m_check = 3 if plate.subsample_size != 3 else 2
    try:
        indexed = indexed_axes(
            lambda idx, data: terms(init_theta, idx, data, rows_at_init(local, m_check)),
            np.arange(m_check, dtype=np.int32), data,
        )
    except SiteError:
        raise
    except (ValueError, TypeError, IndexError) as err:
        raise ValueError(
            f"Evaluating the model with {m_check} indices of the subsample plate "
            f"'{plate.name}' failed: every observed site inside the plate must be indexed by "
            f"the plate's indices (e.g. obs=y[idx]). Original error: {err}"
        ) from err
    _check_indexed_lengths(indexed, data, plate)


def model_constrain_fn(model: Callable, plate: DataPlate, dims: dict, local: tuple[LocalSite, ...],
                  plate_det: tuple[str, ...], local_names: tuple[str, ...]) -> Callable:
    """The potential's ``constrain(z, data)``: the constrained latent values and the
    deterministic sites outside the plate, from one datum of the plate."""

    def constrain(z: dict, data: ModelData) -> dict:
        args, kwargs = data.args_kwargs()
        one = set_plate_indices(model, name=plate.name, indices=jnp.arange(1))
        if dims:  # the enumerated values are not sampled (and not returned)
            one = enumerate_sites(one, dims=dims)
        if local:  # nor the local ones (held at their starting values here)
            one = handlers.substitute(one, data=local_values(local, rows_at_init(local, 1),
                                                             "constrain"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = constrain_fn(one, args, kwargs, z, return_deterministic=True)
        return {k: v for k, v in out.items() if k not in plate_det and k not in local_names}

    return constrain


def local_site(name: str, site: dict, unconstrained: Any, plate: DataPlate) -> LocalSite:
    """The :class:`LocalSite` of a continuous site inside the plate, from the prototype trace
    (whose plate has the indices 0..n−1) and its unconstrained initial value there."""
    support = site["fn"].support
    value = np.asarray(biject_to(support)(unconstrained))
    axis = len(site["fn"].batch_shape) + plate.dim
    rows = np.moveaxis(value, axis, 0)
    return LocalSite(name=name, axis=axis, row_shape=tuple(rows.shape[1:]), support=support,
                     init=rows[0])
