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
draw z_i for the rows of each subsample given θ and estimate the gradient with them, or, for
one site of one scalar value per datum, integrate it out of f_i by adaptive Gauss-Hermite
quadrature (:mod:`.quadrature`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.infer.util import constrain_fn

from numpyro_subsample.core.data import (
    ModelData,
    check_data_finite,
    trace_seed,
)
from numpyro_subsample.core.enumeration import (
    check_enumeration_scope,
    enumerate_sites,
    enumeration_dims,
    observed_log_likelihood,
)
from numpyro_subsample.core.plates import (
    DataPlate,
    full_plate,
    full_plate_model,
    in_plate,
    per_datum,
    set_plate_indices,
    site_log_prob,
)
from numpyro_subsample.core.structure import (
    _find_data_plate,
    _prototype_trace,
    _validate_sites,
    jittered_start,
    with_improper_values,
)
from numpyro_subsample.core.terms import (
    LocalSite,
    check_plate_indexing,
    local_site,
    local_values,
    model_constrain_fn,
    model_terms_fn,
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
    integrated
        Local sites integrated out of each f_i by quadrature
        (:func:`~numpyro_subsample.core.quadrature.integrate_local`): in neither θ nor
        ``local``.

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
    # local sites integrated out of each f_i (:mod:`.quadrature`): neither in θ nor in `local`
    integrated: tuple[LocalSite, ...] = ()

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

    @property
    def integrated_sites(self) -> tuple[str, ...]:
        """The local sites integrated out of each f_i by quadrature (not in θ)."""
        return tuple(s.name for s in self.integrated)

    @property
    def plate_latent_sites(self) -> tuple[str, ...]:
        """Every continuous latent site of the plate, drawn (``local``) or integrated: the
        sites whose values the draws do not hold."""
        return self.local_sites + self.integrated_sites

    def _refuse_local(self, what: str) -> None:
        if self.plate_latent_sites:
            raise ValueError(
                f"{what} is not available for a model with local latent sites "
                f"{list(self.plate_latent_sites)} inside the subsample "
                "plate: it depends on their values, which are drawn or integrated for the rows "
                "of each subsample only and not kept."
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

    A latent site with an improper prior (``dist.ImproperUniform``), which NumPyro cannot draw,
    is given the point of its support at 0 in unconstrained coordinates wherever the package
    traces the model for its structure
    (:func:`~numpyro_subsample.core.structure.with_improper_values`); its log-density is
    NumPyro's.

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
    model = with_improper_values(model, tr)
    plate = _find_data_plate(tr)
    latent, plate_det, enumerated, local_names = _validate_sites(tr, plate)
    dims = enumeration_dims(tr, enumerated)
    if dims:
        check_enumeration_scope(model, data, plate, tr, dims, init_values)
    init_theta, unravel = ravel_pytree({name: init_values[name] for name in latent})
    init_theta = jittered_start(init_theta, rng_key)
    local = tuple(local_site(name, tr[name], init_values[name], plate) for name in local_names)
    terms = model_terms_fn(model, plate, unravel, dims, local, trace_seed())
    check_plate_indexing(terms, init_theta, data, plate, local)
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
        constrain=model_constrain_fn(model, plate, dims, local, plate_det, local_names),
        model=model,
        data_leaves=data_leaves,
        enumerated_dims=tuple(dims.items()),
        local=local,
    )


