"""The subsample plate: its facts, the handlers that set its indices, and the per-datum
reduction and shape checks of the log-probs of the sites inside it (used by
:mod:`.potential` and :mod:`.enumeration`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.primitives import Messenger

from numpyro_subsample.core.options import OptionTypeError

__all__ = [
    "DataPlate",
    "SiteError",
    "check_observed_shape",
    "check_plate_log_prob",
    "check_plate_sizes",
    "first_indices",
    "full_plate_model",
    "full_plate",
    "in_plate",
    "per_datum",
    "set_plate_indices",
    "site_log_prob",
    "widen_plate",
]


class DataPlate(NamedTuple):
    """Facts about the model's subsample plate.

    Parameters
    ----------
    name
        The plate's name.
    size
        N.
    subsample_size
        n.
    dim
        The plate's batch dimension.

    References
    ----------
    Welling and Teh (2011) (N/n-weighted subsample sums over this plate).
    """

    name: str
    size: int  # N
    subsample_size: int  # n, as written in the model
    dim: int  # the (negative) batch dimension of the plate


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


def widen_plate(msg: dict, name: str) -> bool:
    """Make ``msg``, if it is the subsample plate ``name``, cover all its indices 0..size−1 (no
    subsampling), whatever its size; return whether it was."""
    if msg["type"] != "plate" or msg["name"] != name:
        return False
    size = msg["args"][0]
    msg["value"] = jnp.arange(size)
    msg["args"] = (size, size)
    return True


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
        if widen_plate(msg, self.name):
            return
        if msg["type"] == "deterministic" and in_plate(msg, self.name):
            self._computed[msg["name"]] = msg["value"]

    def postprocess_message(self, msg):
        if msg["type"] == "deterministic" and msg["name"] in self._computed:
            computed = self._computed.pop(msg["name"])
            if jnp.shape(msg["value"]) != jnp.shape(computed):
                msg["value"] = computed


@lru_cache(maxsize=64)
def full_plate_model(model: Callable, name: str) -> full_plate:
    return full_plate(model, name=name)


class check_plate_sizes(Messenger):
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


class SiteError(ValueError):
    """A site of the model does not follow the subsample plate (message names the site)."""


def site_log_prob(site: dict) -> jax.Array:
    intermediates = site.get("intermediates")
    if intermediates:
        return site["fn"].log_prob(site["value"], intermediates)
    return site["fn"].log_prob(site["value"])


def per_datum(lp: jax.Array, plate: DataPlate, m: int, name: str) -> jax.Array:
    """Reduce a log-prob array with the plate along ``plate.dim`` to a length-m vector."""
    axis = jnp.ndim(lp) + plate.dim
    if axis < 0 or lp.shape[axis] != m:
        raise SiteError(
            f"Observed site '{name}' inside the subsample plate '{plate.name}' has log-prob "
            f"shape {tuple(jnp.shape(lp))}, which does not follow the plate's {m} indices along "
            f"dim {plate.dim}. Index the data with the plate's indices, e.g. "
            f"`with numpyro.plate('{plate.name}', N, subsample_size=n) as idx: ... obs=y[idx]`."
        )
    lp = jnp.moveaxis(lp, axis, 0)
    return lp.reshape((m, -1)).sum(-1)


class first_indices(Messenger):
    """Give every subsample plate the indices 0..n−1 (no random permutation of N)."""

    def process_message(self, msg):
        if msg["type"] == "plate":
            size, subsample_size = msg["args"]
            if subsample_size is not None and subsample_size < size:
                msg["value"] = jnp.arange(subsample_size)


def in_plate(site: dict, plate_name: str) -> bool:
    return any(f.name == plate_name for f in site.get("cond_indep_stack", []))


def check_observed_shape(name: str, site: dict, plate: DataPlate) -> None:
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
        raise SiteError(
            f"Observed site '{name}' inside the subsample plate '{plate.name}' has a value of "
            f"shape {value_shape}, but its distribution has shape {fn_shape} (batch "
            f"{tuple(fn.batch_shape)}, event {tuple(fn.event_shape)}): {what}. Give the "
            "observations the distribution's shape, e.g. y.reshape(-1) for a column vector y "
            "of shape (N, 1) (or obs=y[idx].reshape(-1) in the model)."
        )


def check_plate_log_prob(name: str, site: dict, lp: jax.Array, plate: DataPlate) -> None:
    """The log-prob of an observed site of the plate has its distribution's batch shape."""
    if jnp.shape(lp) != tuple(site["fn"].batch_shape):
        check_observed_shape(name, site, plate)
        raise SiteError(
            f"Observed site '{name}' inside the subsample plate '{plate.name}' has "
            f"log-prob shape {tuple(jnp.shape(lp))}, not its distribution's batch "
            f"shape {tuple(site['fn'].batch_shape)}: the log-likelihood would not "
            "have one term per datum. Give the observations the distribution's "
            "shape."
        )
