"""Predictions of a run for all N rows of its data (or for new data), in chunks of draws.

``numpyro.infer.Predictive(model, samples)(key, X)`` on the user's model runs its subsample
plate as written: it predicts a random subsample of n rows, not the N rows of ``X``.
:func:`predictive` runs ``Predictive`` on the model with the plate over all its rows instead,
re-draws the observed sites inside the plate (posterior predictive) and evaluates the
deterministic sites there for every row, a chunk of draws at a time, written into preallocated
NumPy arrays.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache, partial
from typing import Any

import jax
import numpy as np
from numpyro.infer import Predictive
from numpyro.primitives import Messenger

from numpyro_subsample.core.plates import widen_plate
from numpyro_subsample.core.potential import ModelData, in_plate
from numpyro_subsample.post.protocol import check_kernel, kernel_data, kernel_of, run_data

__all__ = [
    "predictive",
    "predictive_model",
    "predict_draws",
    "parse_memory",
    "DEFAULT_CHUNK_MEMORY",
    "DEFAULT_MAX_MEMORY",
]

DEFAULT_CHUNK_MEMORY = 256 * 2**20  # bytes of one chunk's temporaries (beyond the outputs)
DEFAULT_MAX_MEMORY = 2**30  # bytes of the arrays predictive returns, unless raised

_UNITS = {"": 1, "b": 1, "kb": 2**10, "kib": 2**10, "mb": 2**20, "mib": 2**20,
          "gb": 2**30, "gib": 2**30}


def parse_memory(value: int | str, name: str = "chunk_memory") -> int:
    """Bytes from an int or a string such as ``"512MB"``, ``"1.5GB"``, ``"64kB"`` (binary units,
    1 MB = 2^20 bytes)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        out = int(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        unit = m.group(2).lower() if m else None
        if unit not in _UNITS:
            raise ValueError(
                f"{name}={value!r} is not a memory size: pass bytes as an int or a string "
                "such as '256MB', '1GB', '64kB'."
            )
        out = int(float(m.group(1)) * _UNITS[unit])
    else:
        raise TypeError(f"{name} must be an int (bytes) or a string such as '256MB'; got "
                        f"{type(value).__name__}.")
    if out < 1:
        raise ValueError(f"{name}={value!r} must be at least 1 byte.")
    return out


class _predict_plate(Messenger):
    """All rows of the subsample plate ``name``, its observed sites re-drawn (unobserved)."""

    def __init__(self, fn=None, name: str = ""):
        self.name = name
        super().__init__(fn)

    def process_message(self, msg):
        if widen_plate(msg, self.name):
            return
        if msg["type"] == "sample" and msg["is_observed"] and in_plate(msg, self.name):
            msg["value"] = None
            msg["is_observed"] = False


@lru_cache(maxsize=64)
def predictive_model(model: Callable, plate_name: str) -> Callable:
    """``model`` with the subsample plate ``plate_name`` over all its rows (whatever their
    number) and the observed sites inside it drawn from their distributions.

    One object per model and plate (a static argument of the compiled chunk program).
    """
    return _predict_plate(model, name=plate_name)


@partial(jax.jit, static_argnames=("model", "return_sites"))
def _predict_chunk(model, samples: dict, keys: jax.Array, data: ModelData, return_sites):
    """Predictive on each draw of a chunk with its own key: draws do not depend on the chunking."""
    args, kwargs = data.args_kwargs()
    sites = None if return_sites is None else list(return_sites)

    def one(sample, key):
        batch = jax.tree.map(lambda v: v[None], sample)
        pred = Predictive(model, posterior_samples=batch, return_sites=sites, batch_ndims=1,
                          parallel=True)(key, *args, **kwargs)
        return jax.tree.map(lambda v: v[0], pred)

    return jax.vmap(one)(samples, keys)


def _chunks(num: int, size: int):
    for start in range(0, num, size):
        yield start, min(start + size, num)


def _take(tree: dict, start: int, stop: int, size: int) -> dict:
    """Rows start..stop of every leaf, padded to ``size`` rows by repeating the last one."""
    rows = np.minimum(np.arange(start, start + size), stop - 1)
    return {k: np.asarray(v)[rows] for k, v in tree.items()}


def predictive(
    mcmc_or_kernel: Any,
    samples: dict | None = None,
    *args: Any,
    rng_key: jax.Array | None = None,
    return_sites: Sequence[str] | None = None,
    chunk_memory: int | str = DEFAULT_CHUNK_MEMORY,
    max_memory: int | str | None = DEFAULT_MAX_MEMORY,
    **kwargs: Any,
) -> dict[str, np.ndarray]:
    """Posterior predictions of a package kernel's model for every row of the data.

    Runs ``numpyro.infer.Predictive`` on the model with its subsample plate over all rows
    (:func:`predictive_model`): each observed site inside the plate is drawn for every row
    (its observed values, if passed, are ignored), and each deterministic site inside the plate
    is evaluated for every row (from the re-drawn values where it reads an observed site).
    ``Predictive(model, samples)(key, X)`` on the user's model instead predicts a random
    subsample of n rows: use this function, or ``Predictive(kernel.model, samples)(key, X,
    y=None)`` (all rows of ``X``, no chunking; there observed values that are passed are kept).

    Parameters
    ----------
    mcmc_or_kernel
        A finished ``numpyro.infer.MCMC`` run of a package kernel, or the kernel itself (after
        a run or ``kernel.preprocess``).
    samples
        Draws with one leading draw axis (``mcmc.get_samples()``, the default for an MCMC
        run; required for a kernel). Only the model's latent sites are used: deterministic
        sites are recomputed.
    *args, **kwargs
        The model's arguments. None given: the data of the run (or of the kernel's
        preprocessing), all N rows. Given: new data, with any number of rows.
    rng_key
        Key of the draws (default ``PRNGKey(0)``); each draw gets its own key, so the result
        does not depend on ``chunk_memory``.
    return_sites
        Sites to return (NumPyro's ``Predictive`` default: the sample sites that are not
        latent, the observed sites of the plate included, and every deterministic site).
    chunk_memory
        Bound on the outputs of one chunk of draws (bytes, or a string such as ``"512MB"``);
        the model's intermediate arrays for that chunk come on top. The returned arrays
        (draws × rows per site) are allocated once and filled chunk by chunk.
    max_memory
        Bound on the returned arrays together (bytes or a string such as ``"8GB"``; default
        1 GB; ``None``: no bound). Beyond it nothing is computed and a ``ValueError`` says how
        large the arrays would be (draws × rows × dtype per site) and what to do: raise the
        bound, keep fewer sites (``return_sites``) or fewer draws.

    Returns
    -------
    dict
        Site name → NumPy array with the draws along the first axis (the plate's rows along
        the plate's dimension for sites inside the plate).

    References
    ----------
    Gelman et al. (2013), Sect. 6.3 (posterior predictive draws).
    """
    bound = parse_memory(chunk_memory)
    limit = None if max_memory is None else parse_memory(max_memory, "max_memory")
    kernel, samples, data = _resolve(mcmc_or_kernel, samples, args, kwargs)
    pot = kernel.potential
    missing = [k for k in pot.latent_sites if k not in samples]
    if missing:
        raise ValueError(f"samples lacks the latent sites {missing} of the model; pass draws "
                         "such as mcmc.get_samples().")
    latent = {k: np.asarray(samples[k]) for k in pot.latent_sites}
    num = int(np.shape(latent[pot.latent_sites[0]])[0])
    if num < 1 or any(np.ndim(v) < 1 or np.shape(v)[0] != num for v in latent.values()):
        shapes = {k: np.shape(v) for k, v in latent.items()}
        raise ValueError(f"samples must have one leading draw axis of the same length for every "
                         f"latent site; got shapes {shapes}.")
    model = predictive_model(pot.model, pot.plate.name)
    sites = None if return_sites is None else tuple(return_sites)
    key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    return predict_draws(model, latent, data, sites, key, bound, max_bytes=limit)


def format_bytes(num: float) -> str:
    """``num`` bytes in binary units: '512 B', '3.8 MB', '4.0 GB'."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if num < 1024 or unit == "TB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.1f} TB"


def _check_output_size(shapes: dict, num: int, max_bytes: int) -> None:
    """Refuse outputs of more than ``max_bytes`` (naming each site's draws × shape × dtype)."""
    sizes = {k: num * int(np.prod(s.shape)) * s.dtype.itemsize for k, s in shapes.items()}
    total = sum(sizes.values())
    if total <= max_bytes:
        return
    parts = [
        f"'{k}': {num} draws × {' × '.join(map(str, shapes[k].shape[1:])) or 'scalar'} × "
        f"{shapes[k].dtype} = {format_bytes(sizes[k])}"
        for k in sorted(sizes, key=sizes.get, reverse=True)[:4]
    ]
    raise ValueError(
        f"predictive would return {format_bytes(total)} ({'; '.join(parts)}), more than "
        f"max_memory={format_bytes(max_bytes)}. Pass max_memory='{format_bytes(2 * total)}' "
        "(or None) to allow it, return_sites=[...] to keep fewer sites, or fewer draws "
        "(e.g. {k: v[::10] for k, v in mcmc.get_samples().items()})."
    )


def predict_draws(
    model: Callable,
    latent: dict,
    data: ModelData,
    return_sites: tuple[str, ...] | None,
    rng_key: jax.Array,
    chunk_bytes: int,
    max_bytes: int | None = None,
) -> dict[str, np.ndarray]:
    """``Predictive(model)`` on each of the S draws of ``latent`` (leading axis), a chunk of
    draws at a time whose outputs take at most ``chunk_bytes`` (at least one draw), written
    into preallocated arrays. Draw s uses the s-th key of ``split(rng_key, S)``. Outputs of
    more than ``max_bytes`` in total are refused before any is computed."""
    num = int(np.shape(next(iter(latent.values())))[0])
    keys = jax.random.split(rng_key, num)
    shapes = jax.eval_shape(lambda lat, k, d: _predict_chunk(model, lat, k, d, return_sites),
                            _take(latent, 0, 1, 1), keys[:1], data)
    if max_bytes is not None:
        _check_output_size(shapes, num, max_bytes)
    per_draw = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in shapes.values())
    size = int(max(1, min(num, chunk_bytes // max(per_draw, 1))))
    out = {k: np.empty((num,) + s.shape[1:], s.dtype) for k, s in shapes.items()}
    for start, stop in _chunks(num, size):
        rows = np.minimum(np.arange(start, start + size), stop - 1)
        pred = _predict_chunk(model, _take(latent, start, stop, size), keys[rows], data,
                              return_sites)
        for k, v in pred.items():
            out[k][start:stop] = np.asarray(v)[: stop - start]
        del pred
    return out


def _resolve(source: Any, samples: dict | None, args: tuple, kwargs: dict):
    """The kernel, the draws and the data of a call of :func:`predictive`."""
    if hasattr(source, "sampler"):  # an MCMC run
        kernel = kernel_of(source, "predictive")
        if samples is None:
            samples = source.get_samples()
        data = run_data(source) if not (args or kwargs) else ModelData.from_args(args, kwargs)
        return kernel, samples, data
    kernel = check_kernel(source, "predictive")
    if samples is None:
        raise ValueError("predictive(kernel, samples, ...) needs samples (e.g. "
                         "mcmc.get_samples()) when given a kernel rather than an MCMC run.")
    data = kernel_data(kernel) if not (args or kwargs) else ModelData.from_args(args, kwargs)
    return kernel, samples, data
