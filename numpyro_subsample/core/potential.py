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
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.special import logsumexp
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.distributions.distribution import ExpandedDistribution
from numpyro.infer.initialization import init_to_median
from numpyro.infer.util import _unconstrain_reparam, constrain_fn
from numpyro.primitives import Messenger

from numpyro_subsample.core.data import ModelData, indexed_axes
from numpyro_subsample.core.options import OptionTypeError

__all__ = [
    "DataPlate",
    "ModelData",
    "Potential",
    "build_potential",
    "check_data_finite",
    "set_plate_indices",
    "full_plate",
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
    # unconstrained -> constrained latent values and the deterministic sites outside the plate
    constrain: Callable[[dict, ModelData], dict]
    model: Callable
    data_leaves: tuple[int, ...]  # positions in ModelData.arrays of arrays with N rows
    # (name, batch dim) of the discrete sites of the plate summed out of f_i, in model order
    enumerated_dims: tuple[tuple[str, int], ...] = ()

    @property
    def dim(self) -> int:
        return int(self.init_theta.shape[0])

    @property
    def enumerated_sites(self) -> tuple[str, ...]:
        """The discrete sites inside the plate summed out of each f_i (not part of θ)."""
        return tuple(name for name, _ in self.enumerated_dims)

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
        """The user's model with its subsample plate over all its indices 0..size−1.

        The size is read from the model's plate at each call, so the same object serves the
        run's data (N rows) and new data of any number of rows; one object per model (a static
        argument of compiled programs).
        """
        return _full_plate_model(self.model, self.plate.name)

    def constrain_at(self, z: dict, idx: jax.Array, data: ModelData) -> dict:
        """Constrained latent values and every deterministic site, with the plate at ``idx``.

        Deterministic sites inside the data plate hold their values for the rows ``idx``
        (cost O(len(idx)) model evaluations); the others do not depend on ``idx``.
        """
        args, kwargs = data.args_kwargs()
        fn = set_plate_indices(self.model, name=self.plate.name, indices=idx)
        if self.enumerated_dims:
            fn = _enumerate_sites(fn, dims=dict(self.enumerated_dims))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return constrain_fn(fn, args, kwargs, z, return_deterministic=True)

    def log_likelihood_at(self, latent: dict, idx: jax.Array, data: ModelData) -> dict:
        """log p(x_i | θ) for the rows ``idx``, ``(len(idx),)`` per observed site of the plate.

        ``latent``: constrained values of the latent sites (one draw). Without enumerated
        sites, each site's own log-likelihood. With enumerated sites z the sites of a datum
        are dependent given θ: site k holds log p(x_ik | x_i1..x_i(k−1), θ) (chain rule in the
        model's order, each term marginal over z), so their sum is log p(x_i | θ) =
        log Σ_z p(z, x_i | θ). Unscaled (no subsample or user scale).
        """
        return _observed_log_likelihood(
            self.model, self.plate, dict(self.enumerated_dims), latent, idx, data
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


class full_plate(Messenger):
    """Make the subsample plate ``name`` cover all its indices (no subsampling), whatever its
    size.

    A deterministic site inside the plate keeps its computed value when a handler substitutes
    one of another shape, e.g. the n-row values stored by a run substituted into this N-row
    model (``arviz.from_numpyro``, ``numpyro.infer.log_likelihood``), so that the model's
    downstream code sees N rows; the trace records the substituted value.
    """

    def __init__(self, fn=None, name: str = ""):
        self.name = name
        self._computed: dict = {}
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] == self.name:
            size = msg["args"][0]
            msg["value"] = jnp.arange(size)
            msg["args"] = (size, size)
        elif msg["type"] == "deterministic" and in_plate(msg, self.name):
            self._computed[msg["name"]] = msg["value"]

    def postprocess_message(self, msg):
        if msg["type"] == "deterministic" and msg["name"] in self._computed:
            computed = self._computed.pop(msg["name"])
            if jnp.shape(msg["value"]) != jnp.shape(computed):
                msg["value"] = computed


@lru_cache(maxsize=64)
def _full_plate_model(model: Callable, name: str) -> full_plate:
    return full_plate(model, name=name)


class _enumerate_sites(Messenger):
    """Give each site of ``dims`` ({name: batch dim}) its whole support as value, along its
    own batch dimension (left of every plate and batch dimension of the model), as parallel
    enumeration does; the model's downstream code broadcasts over it."""

    def __init__(self, fn=None, dims=None):
        self.dims = dims or {}
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] in self.dims and not msg["is_observed"]:
            msg["value"] = _enumerated_values(msg["fn"], self.dims[msg["name"]])


def _enumerated_values(fn, dim: int) -> jax.Array:
    """The support of ``fn`` as an array of shape (K, 1, ..., 1) + event_shape, with K at batch
    dimension ``dim`` (< 0)."""
    base = fn
    while isinstance(base, ExpandedDistribution):  # its enumerate_support drops event dims
        base = base.base_dist
    values = jnp.asarray(base.enumerate_support(expand=False))
    return values.reshape((values.shape[0],) + (1,) * (-dim - 1) + tuple(fn.event_shape))


def _enum_per_datum(
    lp: jax.Array, plate: DataPlate, m: int, name: str, num_enum: int, rank: int
) -> jax.Array:
    """Reduce a log-prob array with enumeration dims to shape (K_E, ..., K_1, m): the plate
    along ``plate.dim`` kept, the enumeration dims (the leftmost ``num_enum`` of ``rank``
    batch dims) kept, every other dim summed."""
    if jnp.ndim(lp) > rank:
        raise _SiteError(
            f"Site '{name}' inside the subsample plate '{plate.name}' has log-prob shape "
            f"{tuple(jnp.shape(lp))} with more than {rank} batch dimensions when the "
            "enumerated sites are summed out: the model must broadcast the enumerated values "
            "(placed left of every plate) rather than reshape them."
        )
    lp = jnp.reshape(lp, (1,) * (rank - jnp.ndim(lp)) + tuple(jnp.shape(lp)))
    axis = rank + plate.dim
    if lp.shape[axis] != m:
        per_datum(lp, plate, m, name)  # raises the error for sites that do not follow the plate
    other = tuple(a for a in range(num_enum, rank) if a != axis)
    return jnp.sum(lp, axis=other)


def _enumerated_joint(
    tr: dict, plate: DataPlate, m: int, dims: dict, dtype, scaled: bool
) -> tuple[jax.Array, jax.Array, dict]:
    """From a trace with the sites of ``dims`` enumerated: (−log prior outside the plate,
    log p(z_i | θ) (K_E, ..., K_1, m), {observed site: log p(x_i | z_i, θ)}) for the m rows.

    With ``scaled``, the sites' scales relative to the plate's N/m multiply their terms (the
    prior term is always scaled)."""
    num_enum, rank = len(dims), max(-d for d in dims.values())
    f0 = jnp.zeros((), dtype)
    log_z = jnp.zeros((m,), dtype)
    observed = {}
    for name, site in tr.items():
        if site["type"] != "sample":
            continue
        lp = _site_log_prob(site)
        scale = site["scale"]
        if not in_plate(site, plate.name):
            total = jnp.sum(lp)
            f0 = f0 - (total if scale is None else scale * total)
            continue
        if name not in dims:
            _check_plate_log_prob(name, site, lp, plate)
        per = _enum_per_datum(lp, plate, m, name, num_enum, rank)
        if scaled and scale is not None:
            per = per * (scale * m / plate.size)
        if name in dims:
            log_z = log_z + per
        else:
            observed[name] = per
    return f0, log_z, observed


def _observed_log_likelihood(
    model: Callable, plate: DataPlate, dims: dict, latent: dict, idx: jax.Array,
    data: ModelData,
) -> dict:
    """:meth:`Potential.log_likelihood_at`."""
    m = int(idx.shape[0])
    args, kwargs = data.args_kwargs()
    fn = set_plate_indices(model, name=plate.name, indices=idx)
    if dims:
        fn = _enumerate_sites(fn, dims=dims)
    fn = handlers.substitute(handlers.seed(fn, jnp.asarray(np.zeros(2, np.uint32))), data=latent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = handlers.trace(fn).get_trace(*args, **kwargs)
    if not dims:
        return {
            name: per_datum(_site_log_prob(site), plate, m, name)
            for name, site in tr.items()
            if site["type"] == "sample" and site["is_observed"] and in_plate(site, plate.name)
        }
    _, acc, observed = _enumerated_joint(tr, plate, m, dims, jnp.result_type(float), False)
    axes = tuple(range(len(dims)))
    prev = logsumexp(acc, axis=axes)  # log Σ_z p(z | θ) = 0 up to rounding
    out = {}
    for name, lp in observed.items():
        acc = acc + lp
        cur = logsumexp(acc, axis=axes)
        out[name] = cur - prev
        prev = cur
    return out


class _check_plate_sizes(Messenger):
    """Raise a clear error for a subsampled plate of size 0, or whose subsample size is not an
    integer between 1 and its size."""

    def process_message(self, msg):
        if msg["type"] != "plate" or msg["args"][1] is None:
            return
        (size, n), name = msg["args"], msg["name"]
        if size < 1:
            raise ValueError(
                f"Plate '{name}' has size N={size} and subsample_size={n!r}: there are no data "
                "to subsample. Check the data passed to the model (the plate's size is usually "
                "the number of rows, e.g. X.shape[0])."
            )
        if not isinstance(n, (int, np.integer)) or isinstance(n, (bool, np.bool_)):
            raise OptionTypeError(
                f"Plate '{name}' has subsample_size={n!r} (type {type(n).__name__}); pass an "
                f"integer between 1 and its size N={size}, e.g. subsample_size={min(size, 100)}."
            )
        if not 1 <= n <= size:
            what = (f"larger than its size N={size}" if n > size
                    else f"which is not positive (its size is N={size})")
            raise ValueError(
                f"Plate '{name}' has subsample_size={n!r} {what}. Pass a subsample_size "
                f"between 1 and {size}."
            )


class _SiteError(ValueError):
    """A site of the model does not follow the subsample plate (message names the site)."""


def _site_log_prob(site: dict) -> jax.Array:
    intermediates = site.get("intermediates")
    if intermediates:
        return site["fn"].log_prob(site["value"], intermediates)
    return site["fn"].log_prob(site["value"])


def per_datum(lp: jax.Array, plate: DataPlate, m: int, name: str) -> jax.Array:
    """Reduce a log-prob array with the plate along ``plate.dim`` to a length-m vector."""
    axis = jnp.ndim(lp) + plate.dim
    if axis < 0 or lp.shape[axis] != m:
        raise _SiteError(
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
        if isinstance(leaf, jax.core.Tracer) or leaf.ndim == 0 or leaf.size == 0:
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
        try:
            values = jax.jit(run)(rng_key, data)
        except AssertionError as err:  # NumPyro asserts a positive plate size
            if "size of plate" not in str(err):
                raise
            empty = [n for n, a in zip(data.names(), data.arrays, strict=True)
                     if a.ndim >= 1 and a.shape[0] == 0]
            raise ValueError(
                f"A plate of the model has size N=0 ({err}); data arguments with 0 rows: "
                f"{empty or 'none'}. Pass non-empty data (the plate's size is usually the "
                "number of rows, e.g. X.shape[0])."
            ) from err
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


def _check_observed_shape(name: str, site: dict, plate: DataPlate) -> None:
    """The observed value of a site in the plate must not broadcast its distribution: its
    shape must broadcast to ``batch_shape + event_shape`` unchanged, so that the log-likelihood
    has one term per datum (a (n, 1) value against a (n,) likelihood would give n × n)."""
    fn = site["fn"]
    value_shape = tuple(jnp.shape(site["value"]))
    fn_shape = tuple(fn.batch_shape) + tuple(fn.event_shape)
    try:
        joint = jnp.broadcast_shapes(value_shape, fn_shape)
    except ValueError:
        joint = None
    if joint != fn_shape:
        what = ("the two shapes do not broadcast" if joint is None else
                f"the log-likelihood would have shape {joint} instead of one term per datum")
        raise _SiteError(
            f"Observed site '{name}' inside the subsample plate '{plate.name}' has a value of "
            f"shape {value_shape}, but its distribution has shape {fn_shape} (batch "
            f"{tuple(fn.batch_shape)}, event {tuple(fn.event_shape)}): {what}. Give the "
            "observations the distribution's shape, e.g. y.reshape(-1) for a column vector y "
            "of shape (N, 1) (or obs=y[idx].reshape(-1) in the model)."
        )


def _check_plate_log_prob(name: str, site: dict, lp: jax.Array, plate: DataPlate) -> None:
    """The log-prob of an observed site of the plate has its distribution's batch shape."""
    if jnp.shape(lp) != tuple(site["fn"].batch_shape):
        _check_observed_shape(name, site, plate)
        raise _SiteError(
            f"Observed site '{name}' inside the subsample plate '{plate.name}' has "
            f"log-prob shape {tuple(jnp.shape(lp))}, not its distribution's batch "
            f"shape {tuple(site['fn'].batch_shape)}: the log-likelihood would not "
            "have one term per datum. Give the observations the distribution's "
            "shape."
        )


def _check_enumerable(name: str, site: dict, plate: DataPlate) -> None:
    """A discrete latent site inside the plate can be summed out of f_i: marked for parallel
    enumeration, with a finite support, and one value per datum (in no other plate)."""
    mark = site["infer"].get("enumerate")
    if mark != "parallel":
        got = "" if mark is None else f" (infer={{'enumerate': {mark!r}}})"
        raise ValueError(
            f"Latent site '{name}' is discrete and lies inside the subsample plate "
            f"'{plate.name}' but is not marked for parallel enumeration{got}. Mark it, so that "
            "it is summed out of each datum's term: numpyro.sample("
            f"'{name}', ..., infer={{'enumerate': 'parallel'}}), or wrap the model with "
            "numpyro.contrib.funsor.config_enumerate (needs the funsor package) or with "
            "numpyro.handlers.infer_config."
        )
    if not site["fn"].has_enumerate_support:
        fn = site["fn"]
        while isinstance(fn, ExpandedDistribution):
            fn = fn.base_dist
        raise ValueError(
            f"Latent site '{name}' inside the subsample plate '{plate.name}' is marked for "
            f"enumeration, but its distribution {type(fn).__name__} has no finite "
            "support to enumerate. Marginalise it out by hand, or truncate its support "
            "(e.g. a Categorical)."
        )
    others = [f.name for f in site["cond_indep_stack"] if f.name != plate.name]
    batch = tuple(site["fn"].batch_shape)
    axis = len(batch) + plate.dim
    if others or any(k != 1 for j, k in enumerate(batch) if j != axis):
        where = f"also in the plate(s) {others}" if others else f"batch shape {batch}"
        raise ValueError(
            f"Latent site '{name}' is marked for enumeration inside the subsample plate "
            f"'{plate.name}' but has {where}: only one discrete value per datum can be "
            "enumerated (a site in the subsample plate and no other plate, with no batch "
            "dimension beyond the plate's). Split it into one site per value, or marginalise "
            "it by hand."
        )


def _validate_sites(
    tr: dict, plate: DataPlate
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(latent sites, deterministic sites of the plate, enumerated sites of the plate)."""
    latent, plate_det, observed_in_plate, enumerated = [], [], [], []
    for name, site in tr.items():
        if site["type"] == "deterministic" and in_plate(site, plate.name):
            plate_det.append(name)
        if site["type"] != "sample":
            continue
        if site["is_observed"]:
            if in_plate(site, plate.name):
                _check_observed_shape(name, site, plate)
                observed_in_plate.append(name)
            continue
        if site["fn"].support.is_discrete:
            if in_plate(site, plate.name):
                _check_enumerable(name, site, plate)
                enumerated.append(name)
                continue
            raise ValueError(
                f"Latent site '{name}' is discrete and lies outside the subsample plate "
                f"'{plate.name}'; stochastic-gradient MCMC needs continuous global latent "
                "variables (only discrete sites inside the plate can be enumerated, one value "
                "per datum). Marginalise it out by hand (e.g. with dist.MixtureSameFamily or "
                "a logsumexp over its values in a numpyro.factor) or observe it."
            )
        if in_plate(site, plate.name):
            raise ValueError(
                f"Latent site '{name}' lies inside the subsample plate '{plate.name}'. Local "
                "(per-datum) continuous latent variables are not supported: marginalise them, "
                "or move the site out of the plate. (Discrete per-datum sites marked "
                "infer={'enumerate': 'parallel'} are summed out.)"
            )
        latent.append(name)
    if not observed_in_plate:
        raise ValueError(
            f"The subsample plate '{plate.name}' has no observed sample site; put the "
            "likelihood (`numpyro.sample(..., obs=...)`) inside it."
        )
    if not latent:
        raise ValueError("The model has no latent sample site to infer.")
    return tuple(latent), tuple(plate_det), tuple(enumerated)


def _check_indexed_lengths(indexed: set, data: ModelData, plate: DataPlate) -> None:
    """Every data array whose rows the plate's indices select has N rows along that axis
    (a shorter one would be read at clipped indices, a longer one partly ignored)."""
    names = data.names()
    for pos, axis in sorted(indexed):
        shape = tuple(data.arrays[pos].shape)
        if shape[axis] != plate.size:
            raise ValueError(
                f"The data argument {names[pos]} (shape {shape}) has {shape[axis]} rows along "
                f"axis {axis}, which the subsample plate '{plate.name}' indexes, but the plate "
                f"has size N={plate.size}. Pass arrays with N rows, or give the plate the "
                f"number of rows as its size (e.g. numpyro.plate('{plate.name}', "
                "X.shape[0], subsample_size=n))."
            )


def _enumeration_dims(tr: dict, enumerated: tuple[str, ...]) -> dict:
    """{site: batch dim}: the j-th enumerated site at dim −(B + j), B the largest number of
    batch dims (plates included) of any site of the model, so that enumeration dims never
    meet the model's own."""
    base = 0
    for site in tr.values():
        for frame in site.get("cond_indep_stack", []):
            base = max(base, -frame.dim)
        if site["type"] == "sample":
            base = max(base, len(site["fn"].batch_shape))
    return {name: -(base + j) for j, name in enumerate(enumerated, 1)}


def _check_enumeration_scope(
    model, data: ModelData, plate: DataPlate, tr: dict, dims: dict, medians: dict
) -> None:
    """Only sample sites of the plate may depend on the enumerated sites: a site outside the
    plate or a deterministic site whose shape changes when they are enumerated (compared with
    the prototype trace, same indices) is refused."""
    shapes: dict = {}

    def run(data):
        args, kwargs = data.args_kwargs()
        fn = set_plate_indices(model, name=plate.name, indices=jnp.arange(plate.subsample_size))
        fn = _enumerate_sites(fn, dims=dims)
        fn = handlers.substitute(fn, substitute_fn=partial(_unconstrain_reparam, medians))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            etr = handlers.trace(handlers.seed(fn, jnp.asarray(np.zeros(2, np.uint32)))
                                 ).get_trace(*args, **kwargs)
        for name, site in etr.items():
            if site["type"] == "sample":
                shapes[name] = tuple(site["fn"].batch_shape)
            elif site["type"] == "deterministic":
                shapes[name] = tuple(jnp.shape(site["value"]))
        return jnp.zeros(())

    jax.eval_shape(run, data)
    enumerated = ", ".join(f"'{n}'" for n in dims)
    for name, site in tr.items():
        if name not in shapes or name in dims:
            continue
        if site["type"] == "deterministic":
            before, what = tuple(jnp.shape(site["value"])), f"Deterministic site '{name}'"
        elif site["type"] == "sample" and not in_plate(site, plate.name):
            before = tuple(site["fn"].batch_shape)
            what = f"Sample site '{name}' outside the subsample plate"
        else:
            continue
        if shapes[name] != before:
            raise ValueError(
                f"{what} depends on the enumerated site(s) {enumerated} (shape "
                f"{shapes[name]} when they are summed out, instead of {before}). Only the "
                f"sample sites inside the subsample plate '{plate.name}' may depend on "
                "enumerated sites: remove the site, or compute it from the draws after "
                "sampling."
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
    support or with more than one value per datum, continuous latent sites inside the plate,
    deterministic sites or sites outside the plate that depend on enumerated sites, observed
    sites that do not follow the plate or whose value would broadcast the likelihood, data
    arrays indexed by the plate without N rows, non-finite data.
    """
    check_data_finite(data)
    tr, medians = _prototype_trace(model, data, rng_key)
    plate = _find_data_plate(tr)
    latent, plate_det, enumerated = _validate_sites(tr, plate)
    dims = _enumeration_dims(tr, enumerated)
    if dims:
        _check_enumeration_scope(model, data, plate, tr, dims, medians)
    init_theta, unravel = ravel_pytree({name: medians[name] for name in latent})
    seed_key = jnp.asarray(np.zeros(2, np.uint32))  # PRNGKey(0), without an eager program

    def terms(theta: jax.Array, idx: jax.Array, data: ModelData) -> tuple[jax.Array, jax.Array]:
        m = int(idx.shape[0])
        params = unravel(theta)
        args, kwargs = data.args_kwargs()
        fn = set_plate_indices(model, name=plate.name, indices=idx)
        if dims:
            fn = _enumerate_sites(fn, dims=dims)
        fn = handlers.substitute(fn, substitute_fn=partial(_unconstrain_reparam, params))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mtr = handlers.trace(handlers.seed(fn, seed_key)).get_trace(*args, **kwargs)
        if dims:
            f0, log_z, observed = _enumerated_joint(mtr, plate, m, dims, theta.dtype, True)
            joint = log_z + sum(observed.values())
            return f0, -logsumexp(joint, axis=tuple(range(len(dims))))
        f0 = jnp.zeros((), theta.dtype)
        fi = jnp.zeros((m,), theta.dtype)
        for name, site in mtr.items():
            if site["type"] != "sample":
                continue
            lp = _site_log_prob(site)
            scale = site["scale"]
            if in_plate(site, plate.name):
                _check_plate_log_prob(name, site, lp, plate)
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
    # Its jaxpr also shows which data arrays the plate's indices select rows of.
    m_check = 3 if plate.subsample_size != 3 else 2
    try:
        indexed = indexed_axes(
            lambda idx, data: terms(init_theta, idx, data),
            np.arange(m_check, dtype=np.int32), data,
        )
    except _SiteError:
        raise
    except (ValueError, TypeError, IndexError) as err:
        raise ValueError(
            f"Evaluating the model with {m_check} indices of the subsample plate "
            f"'{plate.name}' failed: every observed site inside the plate must be indexed by "
            f"the plate's indices (e.g. obs=y[idx]). Original error: {err}"
        ) from err
    _check_indexed_lengths(indexed, data, plate)

    def constrain(z: dict, data: ModelData) -> dict:
        args, kwargs = data.args_kwargs()
        one = set_plate_indices(model, name=plate.name, indices=jnp.arange(1))
        if dims:  # the enumerated values are not sampled (and not returned)
            one = _enumerate_sites(one, dims=dims)
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
        enumerated_dims=tuple(dims.items()),
    )
