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
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.infer.initialization import init_to_median
from numpyro.infer.util import _unconstrain_reparam, constrain_fn
from numpyro.primitives import Messenger

from numpyro_subsample.core.data import ModelData

__all__ = [
    "DataPlate",
    "ModelData",
    "Potential",
    "build_potential",
    "check_data_finite",
    "set_plate_indices",
    "per_datum",
    "in_plate",
]


class DataPlate(NamedTuple):
    """Facts about the model's subsample plate."""

    name: str
    size: int  # N
    subsample_size: int  # n, as written in the model
    dim: int  # the (negative) batch dimension of the plate


@dataclass(frozen=True, eq=False)
class Potential:
    """The potential of a model as pure functions of a flat unconstrained vector θ ∈ R^d.

    ``terms(θ, idx, data)`` returns ``(f0(θ), f_idx(θ))``: the prior term and the vector of
    per-datum terms for the plate indices ``idx`` (any length, traced or not), Putcha et al.
    (2023, Eq. 1), for the model's data ``data`` (a :class:`ModelData`). The object is hashable
    by identity, so it can be a static argument of ``jax.jit``: one potential per model and data
    signature, compiled once.
    """

    plate: DataPlate
    terms: Callable[[jax.Array, jax.Array, ModelData], tuple[jax.Array, jax.Array]]
    unravel: Callable[[jax.Array], dict]
    init_theta: jax.Array  # flat unconstrained starting point (prior median)
    latent_sites: tuple[str, ...]
    plate_deterministic_sites: tuple[str, ...]
    constrain: Callable[[dict, ModelData], dict]  # unconstrained -> constrained + deterministic
    model: Callable
    data_leaves: tuple[int, ...]  # positions in ModelData.arrays of arrays with N rows

    @property
    def dim(self) -> int:
        return int(self.init_theta.shape[0])

    @property
    def num_data(self) -> int:
        return self.plate.size

    def prior(self, theta: jax.Array, data: ModelData) -> jax.Array:
        """f0(θ)."""
        return self.terms(theta, jnp.zeros((1,), jnp.int32), data)[0]

    def data_terms(self, theta: jax.Array, idx: jax.Array, data: ModelData) -> jax.Array:
        """f_i(θ) for i in idx."""
        return self.terms(theta, idx, data)[1]

    def full_data_model(self) -> Callable:
        """The user's model with its subsample plate set to all N indices."""
        return set_plate_indices(
            self.model, name=self.plate.name, indices=jnp.arange(self.plate.size)
        )


class set_plate_indices(Messenger):
    """Make the subsample plate ``name`` use the given indices (and their number as its size)."""

    def __init__(self, fn=None, name: str = "", indices=None):
        self.name = name
        self.indices = indices
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] == self.name:
            msg["value"] = self.indices
            msg["args"] = (msg["args"][0], int(self.indices.shape[0]))


class _check_plate_sizes(Messenger):
    """Raise a clear error for a plate whose subsample size exceeds its size."""

    def process_message(self, msg):
        if msg["type"] == "plate":
            size, subsample_size = msg["args"]
            if subsample_size is not None and subsample_size > size:
                raise ValueError(
                    f"Plate '{msg['name']}' has subsample_size={subsample_size} larger than "
                    f"its size N={size}. Pass a subsample_size between 1 and {size}."
                )


def _site_log_prob(site: dict) -> jax.Array:
    intermediates = site.get("intermediates")
    if intermediates:
        return site["fn"].log_prob(site["value"], intermediates)
    return site["fn"].log_prob(site["value"])


def per_datum(lp: jax.Array, plate: DataPlate, m: int, name: str) -> jax.Array:
    """Reduce a log-prob array with the plate along ``plate.dim`` to a length-m vector."""
    axis = jnp.ndim(lp) + plate.dim
    if axis < 0 or lp.shape[axis] != m:
        raise ValueError(
            f"Observed site '{name}' inside the subsample plate '{plate.name}' has log-prob "
            f"shape {tuple(jnp.shape(lp))}, which does not follow the plate's {m} indices along "
            f"dim {plate.dim}. Index the data with the plate's indices, e.g. "
            f"`with numpyro.plate('{plate.name}', N, subsample_size=n) as idx: ... obs=y[idx]`."
        )
    lp = jnp.moveaxis(lp, axis, 0)
    return lp.reshape((m, -1)).sum(-1)


def check_data_finite(data: ModelData, num_data: int | None = None) -> None:
    """Raise if a floating array of the data holds non-finite values.

    With ``num_data`` only arrays whose leading dimension is N (the data the plate indexes)
    are checked; without it, every floating array.
    """
    for name, leaf in zip(data.names(), data.arrays, strict=True):
        if isinstance(leaf, jax.core.Tracer) or leaf.ndim == 0:
            continue
        if num_data is not None and leaf.shape[0] != num_data:
            continue
        if not jnp.issubdtype(leaf.dtype, jnp.inexact):
            continue
        finite = np.asarray(_rows_finite(leaf))
        if not finite.all():
            bad = np.flatnonzero(~finite)
            raise ValueError(
                f"The data argument {name} (shape {tuple(leaf.shape)}) has non-finite values "
                f"in {bad.size} rows, the first at row {int(bad[0])}. Remove or impute those "
                "rows before sampling."
            )


@jax.jit
def _rows_finite(x: jax.Array) -> jax.Array:
    return jnp.isfinite(x).reshape(x.shape[0], -1).all(-1)


class _first_indices(Messenger):
    """Give every subsample plate the indices 0..n−1 (no random permutation of N)."""

    def process_message(self, msg):
        if msg["type"] == "plate":
            size, subsample_size = msg["args"]
            if subsample_size is not None and subsample_size < size:
                msg["value"] = jnp.arange(subsample_size)


def _prototype_trace(model, data: ModelData, rng_key) -> tuple[dict, dict]:
    """The model's trace (for its structure: sites, plates, supports) and the unconstrained
    prior medians of its latent sites, in one compiled program instead of many eager ops.

    The trace's values are tracers of that program: only their static attributes (shapes,
    distributions, plate frames) are read afterwards.
    """
    holder = {}

    def run(key, data):
        args, kwargs = data.args_kwargs()
        with _check_plate_sizes(), _first_indices():
            tr = handlers.trace(
                handlers.substitute(
                    handlers.seed(model, key), substitute_fn=init_to_median(num_samples=15)
                )
            ).get_trace(*args, **kwargs)
        holder["trace"] = tr
        return {
            name: biject_to(site["fn"].support).inv(site["value"])
            for name, site in tr.items()
            if site["type"] == "sample" and not site["is_observed"]
            and not site["fn"].support.is_discrete
        }

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values = jax.jit(run)(rng_key, data)
    return holder["trace"], values


def _find_data_plate(tr: dict) -> DataPlate:
    plates = {
        name: site["args"]
        for name, site in tr.items()
        if site["type"] == "plate"
        and site["args"][1] is not None
        and site["args"][0] > site["args"][1]
    }
    if not plates:
        raise ValueError(
            "The model has no subsample plate: numpyro_subsample needs the likelihood inside "
            "`numpyro.plate(name, N, subsample_size=n)` with n < N, and the observed data "
            "indexed by the plate's indices."
        )
    if len(plates) > 1:
        raise ValueError(
            f"The model has several subsample plates {sorted(plates)}; only one subsample plate "
            "is supported. Keep subsample_size on the data plate only."
        )
    (name, (size, subsample_size)), = plates.items()
    dim = None
    for site in tr.values():
        for frame in site.get("cond_indep_stack", []):
            if frame.name == name:
                dim = frame.dim
    if dim is None:
        raise ValueError(f"The subsample plate '{name}' contains no sample site.")
    return DataPlate(name, int(size), int(subsample_size), int(dim))


def in_plate(site: dict, plate_name: str) -> bool:
    return any(f.name == plate_name for f in site.get("cond_indep_stack", []))


def _validate_sites(tr: dict, plate: DataPlate) -> tuple[tuple[str, ...], tuple[str, ...]]:
    latent, plate_det, observed_in_plate = [], [], []
    for name, site in tr.items():
        if site["type"] == "deterministic" and in_plate(site, plate.name):
            plate_det.append(name)
        if site["type"] != "sample":
            continue
        if site["is_observed"]:
            if in_plate(site, plate.name):
                observed_in_plate.append(name)
            continue
        if site["fn"].support.is_discrete:
            raise ValueError(
                f"Latent site '{name}' is discrete; stochastic-gradient MCMC needs continuous "
                "latent variables. Marginalise it out (e.g. with a mixture distribution) or "
                "observe it."
            )
        if in_plate(site, plate.name):
            raise ValueError(
                f"Latent site '{name}' lies inside the subsample plate '{plate.name}'. Local "
                "(per-datum) latent variables are not supported: marginalise them, or move "
                "the site out of the plate."
            )
        latent.append(name)
    if not observed_in_plate:
        raise ValueError(
            f"The subsample plate '{plate.name}' has no observed sample site; put the "
            "likelihood (`numpyro.sample(..., obs=...)`) inside it."
        )
    if not latent:
        raise ValueError("The model has no latent sample site to infer.")
    return tuple(latent), tuple(plate_det)


def build_potential(model: Callable, data: ModelData, rng_key: jax.Array) -> Potential:
    """Inspect and validate ``model`` on ``data`` and return its :class:`Potential`.

    Raises ``ValueError`` naming the site or setting for: no subsample plate, several subsample
    plates, subsample size > N, discrete latent sites, latent sites inside the plate, observed
    sites that do not follow the plate, non-finite data.
    """
    check_data_finite(data)
    tr, medians = _prototype_trace(model, data, rng_key)
    plate = _find_data_plate(tr)
    latent, plate_det = _validate_sites(tr, plate)
    init_theta, unravel = ravel_pytree({name: medians[name] for name in latent})
    seed_key = jnp.asarray(np.zeros(2, np.uint32))  # PRNGKey(0), without an eager program

    def terms(theta: jax.Array, idx: jax.Array, data: ModelData) -> tuple[jax.Array, jax.Array]:
        m = int(idx.shape[0])
        params = unravel(theta)
        args, kwargs = data.args_kwargs()
        fn = set_plate_indices(model, name=plate.name, indices=idx)
        fn = handlers.substitute(fn, substitute_fn=partial(_unconstrain_reparam, params))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mtr = handlers.trace(handlers.seed(fn, seed_key)).get_trace(*args, **kwargs)
        f0 = jnp.zeros((), theta.dtype)
        fi = jnp.zeros((m,), theta.dtype)
        for name, site in mtr.items():
            if site["type"] != "sample":
                continue
            lp = _site_log_prob(site)
            scale = site["scale"]
            if in_plate(site, plate.name):
                per = per_datum(lp, plate, m, name)
                if scale is not None:
                    per = per * (scale * m / plate.size)
                fi = fi - per
            else:
                total = jnp.sum(lp)
                f0 = f0 - (total if scale is None else scale * total)
        return f0, fi

    # The validation trace uses a subsample length different from the model's n, so that
    # observed values not indexed by the plate are caught here rather than silently.
    m_check = 3 if plate.subsample_size != 3 else 2
    try:
        jax.eval_shape(terms, init_theta, np.arange(m_check, dtype=np.int32), data)
    except (ValueError, TypeError, IndexError) as err:
        if "does not follow the plate" in str(err):
            raise
        raise ValueError(
            f"Evaluating the model with {m_check} indices of the subsample plate "
            f"'{plate.name}' failed: every observed site inside the plate must be indexed by "
            f"the plate's indices (e.g. obs=y[idx]). Original error: {err}"
        ) from err

    def constrain(z: dict, data: ModelData) -> dict:
        args, kwargs = data.args_kwargs()
        one = set_plate_indices(model, name=plate.name, indices=jnp.arange(1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = constrain_fn(one, args, kwargs, z, return_deterministic=True)
        return {k: v for k, v in out.items() if k not in plate_det}

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
        constrain=constrain,
        model=model,
        data_leaves=data_leaves,
    )
