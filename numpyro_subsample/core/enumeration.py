"""Parallel enumeration of discrete per-datum sites inside the subsample plate.

Each site marked ``infer={"enumerate": "parallel"}`` gets its whole support along its own batch
dimension, left of every plate and batch dimension of the model (as in Obermeyer et al. 2019,
*Tensor variable elimination for plated factor graphs*), so that the per-datum term of
:mod:`.potential` is f_i = −log Σ_z p(z_i, x_i | θ) (a logsumexp over those dimensions).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp
from numpyro import handlers
from numpyro.distributions.distribution import ExpandedDistribution
from numpyro.infer.util import _unconstrain_reparam
from numpyro.primitives import Messenger

from numpyro_subsample.core.data import ModelData, trace_seed
from numpyro_subsample.core.plates import (
    DataPlate,
    SiteError,
    check_plate_log_prob,
    in_plate,
    per_datum,
    set_plate_indices,
    site_log_prob,
)

__all__ = [
    "check_enumerable",
    "check_enumeration_scope",
    "enumerate_sites",
    "enumerated_joint",
    "enumeration_dims",
    "observed_log_likelihood",
]


class enumerate_sites(Messenger):
    """Give each site of ``dims`` ({name: batch dim}) its whole support as value, along its
    own batch dimension (left of every plate and batch dimension of the model), as parallel
    enumeration does; the model's downstream code broadcasts over it."""

    def __init__(self, fn=None, dims=None):
        self.dims = dims or {}
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] in self.dims and not msg["is_observed"]:
            msg["value"] = enumerated_values(msg["fn"], self.dims[msg["name"]])


def enumerated_values(fn, dim: int) -> jax.Array:
    """The support of ``fn`` as an array of shape (K, 1, ..., 1) + event_shape, with K at batch
    dimension ``dim`` (< 0)."""
    base = fn
    while isinstance(base, ExpandedDistribution):  # its enumerate_support drops event dims
        base = base.base_dist
    values = jnp.asarray(base.enumerate_support(expand=False))
    return values.reshape((values.shape[0],) + (1,) * (-dim - 1) + tuple(fn.event_shape))


def enum_per_datum(
    lp: jax.Array, plate: DataPlate, m: int, name: str, num_enum: int, rank: int
) -> jax.Array:
    """Reduce a log-prob array with enumeration dims to shape (K_E, ..., K_1, m): the plate
    along ``plate.dim`` kept, the enumeration dims (the leftmost ``num_enum`` of ``rank``
    batch dims) kept, every other dim summed."""
    if jnp.ndim(lp) > rank:
        raise SiteError(
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


def enumerated_joint(
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
        lp = site_log_prob(site)
        scale = site["scale"]
        if not in_plate(site, plate.name):
            total = jnp.sum(lp)
            f0 = f0 - (total if scale is None else scale * total)
            continue
        if name not in dims:
            check_plate_log_prob(name, site, lp, plate)
        per = enum_per_datum(lp, plate, m, name, num_enum, rank)
        if scaled and scale is not None:
            per = per * (scale * m / plate.size)
        if name in dims:
            log_z = log_z + per
        else:
            observed[name] = per
    return f0, log_z, observed


def observed_log_likelihood(
    model: Callable, plate: DataPlate, dims: dict, latent: dict, idx: jax.Array,
    data: ModelData,
) -> dict:
    """:meth:`Potential.log_likelihood_at`."""
    m = int(idx.shape[0])
    args, kwargs = data.args_kwargs()
    fn = set_plate_indices(model, name=plate.name, indices=idx)
    if dims:
        fn = enumerate_sites(fn, dims=dims)
    fn = handlers.substitute(handlers.seed(fn, trace_seed()), data=latent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = handlers.trace(fn).get_trace(*args, **kwargs)
    if not dims:
        return {
            name: per_datum(site_log_prob(site), plate, m, name)
            for name, site in tr.items()
            if site["type"] == "sample" and site["is_observed"] and in_plate(site, plate.name)
        }
    _, acc, observed = enumerated_joint(tr, plate, m, dims, jnp.result_type(float), False)
    axes = tuple(range(len(dims)))
    prev = logsumexp(acc, axis=axes)  # log Σ_z p(z | θ) = 0 up to rounding
    out = {}
    for name, lp in observed.items():
        acc = acc + lp
        cur = logsumexp(acc, axis=axes)
        out[name] = cur - prev
        prev = cur
    return out


def check_enumerable(name: str, site: dict, plate: DataPlate) -> None:
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


def enumeration_dims(tr: dict, enumerated: tuple[str, ...]) -> dict:
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


def check_enumeration_scope(
    model, data: ModelData, plate: DataPlate, tr: dict, dims: dict, init_values: dict
) -> None:
    """Only sample sites of the plate may depend on the enumerated sites: a site outside the
    plate or a deterministic site whose shape changes when they are enumerated (compared with
    the prototype trace, same indices) is refused."""
    shapes: dict = {}

    def run(data):
        args, kwargs = data.args_kwargs()
        fn = set_plate_indices(model, name=plate.name, indices=jnp.arange(plate.subsample_size))
        fn = enumerate_sites(fn, dims=dims)
        fn = handlers.substitute(fn, substitute_fn=partial(_unconstrain_reparam, init_values))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            etr = handlers.trace(handlers.seed(fn, trace_seed())
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
