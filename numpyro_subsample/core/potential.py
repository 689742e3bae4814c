"""From a NumPyro model to the terms of its potential, in unconstrained space.

Notation of Putcha, Nemeth and Fearnhead (2023, Eq. 1-3): the potential is
f(θ) = f0(θ) + Σ_{i=1}^N f_i(θ), with f0 = −log prior (plus the negative log-Jacobians of the
transforms to unconstrained space) and f_i = −log p(x_i | θ), the negative log-likelihood of
datum i of the subsample plate.

The data are an argument, never a captured constant: ``ModelData`` (:mod:`.data`) splits the
model's ``(args, kwargs)`` into array leaves (traced by ``jax.jit``) and everything else
(static, in the pytree structure), and ``Potential.terms(θ, idx, data)`` runs the user's model,
unchanged, with the plate's indices set to ``idx`` (a small handler) and the latent values
substituted by NumPyro's own ``_unconstrain_reparam``. A compiled program therefore never grows
with N and is reused for new data of the same shapes.

Discrete per-datum sites inside the plate marked for enumeration are summed out of f_i by
parallel enumeration (each site's support along its own batch dimension left of the plates, as
in Obermeyer et al. 2019), so that f_i = −log Σ_z p(z_i, x_i | θ).

Continuous latent sites inside the plate are *local* variables z_i (one value per datum, e.g.
a document's topic proportions): they are not part of θ; ``terms(θ, idx, data, local)`` takes
their constrained values for the rows ``idx`` and returns f_i(θ, z_i) = −log p(z_i | θ)
− log p(x_i | z_i, θ). The kernels that support them (:mod:`numpyro_subsample.estimators.local`)
draw z_i for the rows of each subsample given θ and estimate the gradient with them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.special import logsumexp
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.infer.util import _unconstrain_reparam, constrain_fn

from numpyro_subsample.core.data import (
    ModelData,
    check_data_finite,
    indexed_axes,
    trace_seed,
)
from numpyro_subsample.core.enumeration import (
    check_enumeration_scope,
    enumerate_sites,
    enumerated_joint,
    enumeration_dims,
    observed_log_likelihood,
)
from numpyro_subsample.core.plates import (
    DataPlate,
    SiteError,
    check_plate_log_prob,
    full_plate,
    full_plate_model,
    in_plate,
    per_datum,
    set_plate_indices,
    site_log_prob,
)
from numpyro_subsample.core.structure import (
    _check_indexed_lengths,
    _find_data_plate,
    _prototype_trace,
    _validate_sites,
    jittered_start,
)

__all__ = [
    "DataPlate",
    "LocalSite",
    "ModelData",
    "Potential",
    "build_potential",
    "check_data_finite",
    "set_plate_indices",
    "full_plate",
    "per_datum",
    "in_plate",
]


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


@dataclass(frozen=True, eq=False)
class Potential:
    """The potential of a model as pure functions of a flat unconstrained vector θ ∈ R^d.

    ``terms(θ, idx, data)`` returns ``(f0(θ), f_idx(θ))``: the prior term and the vector of
    per-datum terms for the plate indices ``idx`` (any length, traced or not), Putcha et al.
    (2023, Eq. 1), for the model's data ``data`` (a :class:`ModelData`). The object is hashable
    by identity, so it can be a static argument of ``jax.jit``: one potential per model and data
    signature, compiled once.

    Parameters
    ----------
    plate, terms, unravel, init_theta, latent_sites, plate_deterministic_sites
        The plate, ``terms`` above, flat θ → sites, a start, the site names.
    constrain, model, data_leaves, enumerated_dims, local
        Unconstrain's inverse, the model, plate-indexed data, enumerated and local sites.

    References
    ----------
    Putcha, Nemeth and Fearnhead (2023), Eq. 1.
    """

    plate: DataPlate
    # terms(θ, idx, data[, local]): local = {site: (m, *row_shape)} for the local sites
    terms: Callable[..., tuple[jax.Array, jax.Array]]
    unravel: Callable[[jax.Array], dict]
    init_theta: jax.Array  # flat unconstrained start: prior mean + jitter (jittered_start)
    latent_sites: tuple[str, ...]
    plate_deterministic_sites: tuple[str, ...]
    # unconstrained -> constrained latent values and the deterministic sites outside the plate
    constrain: Callable[[dict, ModelData], dict]
    model: Callable
    data_leaves: tuple[int, ...]  # positions in ModelData.arrays of arrays with N rows
    # (name, batch dim) of the discrete sites of the plate summed out of f_i, in model order
    enumerated_dims: tuple[tuple[str, int], ...] = ()
    # the continuous local latent sites of the plate (not part of θ), in model order
    local: tuple[LocalSite, ...] = ()

    @property
    def dim(self) -> int:
        return int(self.init_theta.shape[0])

    @property
    def enumerated_sites(self) -> tuple[str, ...]:
        """The discrete sites inside the plate summed out of each f_i (not part of θ)."""
        return tuple(name for name, _ in self.enumerated_dims)

    @property
    def local_sites(self) -> tuple[str, ...]:
        """The continuous latent sites inside the plate (one value per datum, not in θ)."""
        return tuple(s.name for s in self.local)

    @property
    def num_data(self) -> int:
        return self.plate.size

    def _refuse_local(self, what: str) -> None:
        if self.local:
            raise ValueError(
                f"{what} is not available for a model with local latent sites "
                f"{list(self.local_sites)} inside the subsample plate: it depends on their "
                "values, which are drawn for the rows of each subsample only and not kept."
            )

    def local_joint_at(self, values: dict, local: dict, idx: jax.Array,
                       data: ModelData) -> jax.Array:
        """log p(z_i | θ) + log p(x_i | z_i, θ) for the rows ``idx``, shape ``(len(idx),)``.

        ``values``: constrained values of the global latent sites; ``local``: constrained
        values of the local sites for the rows, {name: (m, *row_shape)}. Unscaled.
        """
        m = int(idx.shape[0])
        subs = {**values, **local_values(self.local, local, "local_joint_at")}
        args, kwargs = data.args_kwargs()
        fn = set_plate_indices(self.model, name=self.plate.name, indices=idx)
        fn = handlers.substitute(handlers.seed(fn, trace_seed()),
                                 data=subs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tr = handlers.trace(fn).get_trace(*args, **kwargs)
        dtype = jnp.result_type(*jax.tree.leaves(local))
        out = jnp.zeros((m,), dtype)
        for name, site in tr.items():
            if site["type"] == "sample" and in_plate(site, self.plate.name):
                out = out + per_datum(site_log_prob(site), self.plate, m, name).astype(dtype)
        return out

    def prior(self, theta: jax.Array, data: ModelData) -> jax.Array:
        """f0(θ)."""
        return self.terms(theta, jnp.zeros((1,), jnp.int32), data)[0]

    def data_terms(self, theta: jax.Array, idx: jax.Array, data: ModelData) -> jax.Array:
        """f_i(θ) for i in idx."""
        return self.terms(theta, idx, data)[1]

    def full_data_model(self) -> Callable:
        """The user's model with its subsample plate over all its indices 0..size−1.

        The size is read from the model's plate at each call, so the same object serves the
        run's data (N rows) and new data of any number of rows; one object per model (a static
        argument of compiled programs).
        """
        return full_plate_model(self.model, self.plate.name)

    def constrain_at(self, z: dict, idx: jax.Array, data: ModelData) -> dict:
        """Constrained latent values and every deterministic site, with the plate at ``idx``.

        Deterministic sites inside the data plate hold their values for the rows ``idx``
        (cost O(len(idx)) model evaluations); the others do not depend on ``idx``.
        """
        self._refuse_local("constrain_at (deterministic sites of the plate)")
        args, kwargs = data.args_kwargs()
        fn = set_plate_indices(self.model, name=self.plate.name, indices=idx)
        if self.enumerated_dims:
            fn = enumerate_sites(fn, dims=dict(self.enumerated_dims))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return constrain_fn(fn, args, kwargs, z, return_deterministic=True)

    def log_likelihood_at(self, latent: dict, idx: jax.Array, data: ModelData) -> dict:
        """log p(x_i | θ) for the rows ``idx``, ``(len(idx),)`` per observed site of the plate.

        ``latent``: constrained values of the latent sites (one draw). Without enumerated
        sites, each site's own log-likelihood. With enumerated sites z the sites of a datum
        are dependent given θ: site k holds log p(x_ik | x_i1..x_i(k−1), θ) (chain rule in the
        model's order, each term marginal over z), so their sum is log p(x_i | θ) =
        log Σ_z p(z, x_i | θ). Unscaled (no subsample or user scale). Not available with
        local latent sites (p(x_i | θ) is then an integral over z_i).
        """
        self._refuse_local("log_likelihood_at (the pointwise log-likelihood)")
        return observed_log_likelihood(
            self.model, self.plate, dict(self.enumerated_dims), latent, idx, data
        )


def build_potential(model: Callable, data: ModelData, rng_key: jax.Array) -> Potential:
    """Inspect and validate ``model`` on ``data`` and return its :class:`Potential`.

    Discrete latent sites inside the plate marked for parallel enumeration
    (``infer={"enumerate": "parallel"}``, as ``numpyro.contrib.funsor.config_enumerate`` or
    ``numpyro.handlers.infer_config`` set) are summed out of each datum's term, exactly and
    jointly: with z_i = (z_i1, ..., z_iJ) the enumerated sites of datum i,

        f_i(θ) = −log Σ_{z_i} p(z_i | θ) p(x_i | z_i, θ),

    the sum over the Π_j K_j joint values (cost Π_j K_j per datum). Each site's support is put
    along its own batch dimension left of every plate and batch dimension of the model, as in
    parallel enumeration (Obermeyer et al. 2019), so the model must broadcast its values (e.g.
    ``loc[z]``, not ``z.reshape(-1)``). An enumerated site may depend on earlier ones (e.g.
    ``Categorical(probs[z1])``). Enumerated sites are not part of θ, of ``latent_sites`` nor of
    the draws (:attr:`Potential.enumerated_sites` lists them); a user scale on a site of the
    plate multiplies its log-prob inside the sum.

    Raises ``ValueError`` naming the site, argument or setting for: no subsample plate, several
    subsample plates, a plate of size 0, a subsample size outside [1, N] (``TypeError`` if not
    an integer), discrete latent sites outside the plate (marked for enumeration or not),
    discrete sites inside the plate not marked for parallel enumeration or without a finite
    support or with more than one value per datum, continuous latent sites inside the plate
    with more than one value per datum (one value each is a local site, :class:`LocalSite`),
    deterministic sites or sites outside the plate that depend on enumerated sites, observed
    sites that do not follow the plate or whose value would broadcast the likelihood, data
    arrays indexed by the plate without N rows, non-finite data.

    Parameters
    ----------
    model, data, rng_key
        The model, its :class:`ModelData` and the key of the prototype trace.

    Returns
    -------
    Potential
        The model's potential.

    References
    ----------
    Putcha et al. (2023), Eq. 1.
    """
    check_data_finite(data)
    tr, init_values = _prototype_trace(model, data, rng_key)
    plate = _find_data_plate(tr)
    latent, plate_det, enumerated, local_names = _validate_sites(tr, plate)
    dims = enumeration_dims(tr, enumerated)
    if dims:
        check_enumeration_scope(model, data, plate, tr, dims, init_values)
    init_theta, unravel = ravel_pytree({name: init_values[name] for name in latent})
    init_theta = jittered_start(init_theta, rng_key)
    local = tuple(_local_site(name, tr[name], init_values[name], plate) for name in local_names)
    terms = _terms_fn(model, plate, unravel, dims, local, trace_seed())
    _check_plate_indexing(terms, init_theta, data, plate, local)
    data_leaves = tuple(
        i for i, a in enumerate(data.arrays) if a.ndim >= 1 and a.shape[0] == plate.size
    )
    return Potential(
        plate=plate,
        terms=terms,
        unravel=unravel,
        init_theta=init_theta,
        latent_sites=latent,
        plate_deterministic_sites=plate_det,
        constrain=_constrain_fn(model, plate, dims, local, plate_det, local_names),
        model=model,
        data_leaves=data_leaves,
        enumerated_dims=tuple(dims.items()),
        local=local,
    )


def _rows_at_init(local: tuple[LocalSite, ...], m: int) -> dict:
    """Each local site's starting value for ``m`` data."""
    return {s.name: jnp.broadcast_to(jnp.asarray(s.init), (m, *s.row_shape)) for s in local}


def _terms_fn(model: Callable, plate: DataPlate, unravel: Callable, dims: dict,
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
        return _trace_terms(mtr, plate, m, theta.dtype)

    return terms


def _trace_terms(mtr: dict, plate: DataPlate, m: int, dtype) -> tuple[jax.Array, jax.Array]:
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


def _check_plate_indexing(terms: Callable, init_theta: jax.Array, data: ModelData,
                          plate: DataPlate, local: tuple[LocalSite, ...]) -> None:
    """Evaluate ``terms`` on a subsample length other than the model's n, so that observed
    values not indexed by the plate are caught here rather than silently; its jaxpr also
    shows which data arrays the plate's indices select rows of, whose lengths must be N."""
    m_check = 3 if plate.subsample_size != 3 else 2
    try:
        indexed = indexed_axes(
            lambda idx, data: terms(init_theta, idx, data, _rows_at_init(local, m_check)),
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


def _constrain_fn(model: Callable, plate: DataPlate, dims: dict, local: tuple[LocalSite, ...],
                  plate_det: tuple[str, ...], local_names: tuple[str, ...]) -> Callable:
    """The potential's ``constrain(z, data)``: the constrained latent values and the
    deterministic sites outside the plate, from one datum of the plate."""

    def constrain(z: dict, data: ModelData) -> dict:
        args, kwargs = data.args_kwargs()
        one = set_plate_indices(model, name=plate.name, indices=jnp.arange(1))
        if dims:  # the enumerated values are not sampled (and not returned)
            one = enumerate_sites(one, dims=dims)
        if local:  # nor the local ones (held at their starting values here)
            one = handlers.substitute(one, data=local_values(local, _rows_at_init(local, 1),
                                                             "constrain"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = constrain_fn(one, args, kwargs, z, return_deterministic=True)
        return {k: v for k, v in out.items() if k not in plate_det and k not in local_names}

    return constrain


def _local_site(name: str, site: dict, unconstrained: Any, plate: DataPlate) -> LocalSite:
    """The :class:`LocalSite` of a continuous site inside the plate, from the prototype trace
    (whose plate has the indices 0..n−1) and its unconstrained initial value there."""
    support = site["fn"].support
    value = np.asarray(biject_to(support)(unconstrained))
    axis = len(site["fn"].batch_shape) + plate.dim
    rows = np.moveaxis(value, axis, 0)
    return LocalSite(name=name, axis=axis, row_shape=tuple(rows.shape[1:]), support=support,
                     init=rows[0])
