"""The structure of a model read from one trace of it: its subsample plate, its latent,
deterministic and enumerated sites, and the checks that they fit the package (used by
:func:`~numpyro_subsample.core.potential.build_potential`)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions import ImproperUniform, biject_to

from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.enumeration import check_enumerable
from numpyro_subsample.core.plates import (
    DataPlate,
    check_observed_shape,
    check_plate_sizes,
    first_indices,
    in_plate,
)
from numpyro_subsample.core.rng import host_generator

__all__ = ["INIT_JITTER", "as_given", "jittered_start", "with_improper_values"]


#: Standard deviation of the jitter added to the prior mean in unconstrained coordinates to
#: make the potential's starting point (:func:`jittered_start`). The exact prior mean can be
#: a saddle of the posterior (the zero weights of a neural network, the zero factors of a
#: matrix factorisation) where gradient-based fits stay; 0.1 breaks such symmetries and is
#: small beside most priors' scales (NumPyro's ``init_to_uniform`` and Stan start uniformly
#: in (−2, 2)).
INIT_JITTER = 0.1


def jittered_start(theta: jax.Array, rng_key: jax.Array) -> jax.Array:
    """``theta`` plus N(0, INIT_JITTER² I) drawn by NumPy's generator seeded with the bits of
    ``rng_key`` (the same key gives the same start; no compiled program)."""
    z = host_generator(rng_key).standard_normal(theta.shape)
    return device_array((np.asarray(theta) + INIT_JITTER * z).astype(theta.dtype))


def _init_to_mean(site=None):
    """NumPyro init strategy: the prior mean where it is defined and finite, else the point of
    the support at 0 in unconstrained coordinates. It draws nothing, unlike NumPyro's
    ``init_to_median``, whose draws would be compiled into the prototype trace
    (``benchmarks/bench_rng_compile.py``)."""
    if site is None:
        return _init_to_mean
    if site["type"] != "sample" or site["is_observed"] or site["fn"].support.is_discrete:
        return None
    if site["value"] is not None:
        return site["value"]
    fn = site["fn"]
    transform = biject_to(fn.support)
    shape = tuple(site["kwargs"].get("sample_shape") or ()) + fn.shape()
    feasible = transform(jnp.zeros(transform.inverse_shape(shape)))
    try:
        mean = jnp.broadcast_to(1.0 * fn.mean, feasible.shape)
    except (NotImplementedError, ValueError, TypeError, AttributeError):
        return feasible
    return jnp.where(jnp.isfinite(mean), mean, feasible).astype(feasible.dtype)


def _improper(fn) -> bool:
    """Whether ``fn`` is an improper prior (NumPyro's ``ImproperUniform``, possibly expanded,
    made independent, masked or transformed), which has a density but no ``sample``."""
    while hasattr(fn, "base_dist"):
        fn = fn.base_dist
    return isinstance(fn, ImproperUniform)


def _improper_value(site):
    """``substitute_fn``: the point of an improper prior's support at 0 in unconstrained
    coordinates, for its latent sites only (None, no substitution, for every other site)."""
    if (site["type"] != "sample" or site["is_observed"] or site["value"] is not None
            or not _improper(site["fn"])):
        return None
    fn = site["fn"]
    transform = biject_to(fn.support)
    shape = tuple(site["kwargs"].get("sample_shape") or ()) + fn.shape()
    return transform(jnp.zeros(transform.inverse_shape(shape)))


def with_improper_values(model, trace: dict):
    """``model`` with a feasible value in every latent site of an improper prior
    (``dist.ImproperUniform``) where its ``trace`` has one (else ``model`` itself), so that
    the traces that read the model's structure, which draw the other latent sites from their
    priors, run; a value substituted from outside (the sampled θ) takes precedence, as
    NumPyro's ``init_to_uniform`` does for such sites."""
    if not any(site["type"] == "sample" and not site["is_observed"] and _improper(site["fn"])
               for site in trace.values()):
        return model
    return handlers.substitute(model, substitute_fn=_improper_value)


def as_given(model):
    """The model given to :func:`with_improper_values` (``model`` itself if not wrapped)."""
    if isinstance(model, handlers.substitute) and model.substitute_fn is _improper_value:
        return model.fn
    return model


def _prototype_trace(model, data: ModelData, rng_key) -> tuple[dict, dict]:
    """The model's trace (for its structure: sites, plates, supports) and the unconstrained
    prior means of its latent sites (:func:`_init_to_mean`), in one compiled program instead
    of many eager ops.

    The trace's values are tracers of that program: only their static attributes (shapes,
    distributions, plate frames) are read afterwards.
    """
    holder = {}

    def run(key, data):
        args, kwargs = data.args_kwargs()
        with check_plate_sizes(), first_indices():
            tr = handlers.trace(
                handlers.substitute(
                    handlers.seed(model, key), substitute_fn=_init_to_mean
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
        and site["args"][0] >= site["args"][1]
    }
    if not plates:
        raise ValueError(
            "The model has no subsample plate: numpyro_subsample needs the likelihood inside "
            "`numpyro.plate(name, N, subsample_size=n)` with 1 ≤ n ≤ N (n = N reads every row "
            "at each step), and the observed data indexed by the plate's indices."
        )
    if len(plates) > 1:
        raise ValueError(
            f"The model has several subsample plates {sorted(plates)} (sizes "
            f"{ {k: v[0] for k, v in sorted(plates.items())} }); only one subsample plate is "
            "supported. Keep subsample_size on the largest plate and write the others as "
            "ordinary plates (`numpyro.plate(name, size)`, observed on all their rows): their "
            "likelihood terms are then evaluated in full at every step, exactly."
        )
    (name, (size, subsample_size)), = plates.items()
    dim = None
    for site in tr.values():
        for frame in site.get("cond_indep_stack", []):
            if frame.name == name:
                dim = frame.dim
    if dim is None:
        raise ValueError(f"The subsample plate '{name}' contains no sample site.")
    return DataPlate(name=name, size=int(size), subsample_size=int(subsample_size), dim=int(dim))


def _validate_sites(
    tr: dict, plate: DataPlate
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(global latent sites, deterministic sites of the plate, enumerated sites of the plate,
    continuous local latent sites of the plate)."""
    latent, plate_det, observed_in_plate, enumerated, local = [], [], [], [], []
    for name, site in tr.items():
        if site["type"] == "deterministic" and in_plate(site, plate.name):
            plate_det.append(name)
        if site["type"] != "sample":
            continue
        if site["is_observed"]:
            if in_plate(site, plate.name):
                check_observed_shape(name, site, plate)
                observed_in_plate.append(name)
            continue
        if site["fn"].support.is_discrete:
            if in_plate(site, plate.name):
                check_enumerable(name, site, plate)
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
            check_local(name, site, plate)
            local.append(name)
            continue
        latent.append(name)
    if not observed_in_plate:
        raise ValueError(
            f"The subsample plate '{plate.name}' has no observed sample site; put the "
            "likelihood (`numpyro.sample(..., obs=...)`) inside it."
        )
    if not latent:
        raise ValueError("The model has no global latent sample site to infer.")
    if local and enumerated:
        raise ValueError(
            f"The subsample plate '{plate.name}' has both continuous local latent sites "
            f"{local} and enumerated discrete sites {enumerated}; only one kind per model is "
            "supported. Sum the discrete sites out by hand (a logsumexp in a numpyro.factor)."
        )
    return tuple(latent), tuple(plate_det), tuple(enumerated), tuple(local)


def check_local(name: str, site: dict, plate: DataPlate) -> None:
    """A continuous latent site inside the plate is a local variable: one value per datum (in
    no other plate, no batch dimension of size > 1 beside the plate's)."""
    others = [f.name for f in site["cond_indep_stack"] if f.name != plate.name]
    batch = tuple(site["fn"].batch_shape)
    axis = len(batch) + plate.dim
    if others or axis < 0 or any(k != 1 for j, k in enumerate(batch) if j != axis):
        where = f"also in the plate(s) {others}" if others else f"batch shape {batch}"
        raise ValueError(
            f"Local latent site '{name}' inside the subsample plate '{plate.name}' has "
            f"{where}: a local site holds one value per datum (a site in the subsample plate "
            "and no other plate, its batch shape the plate's; put vector values in the event "
            "shape, e.g. dist.Normal(...).expand([k]).to_event(1))."
        )


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
