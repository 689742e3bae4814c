"""log p(x_i | θ_s) of every draw and every datum of the plate, computed in chunks of draws
and data whose temporaries stay within a memory bound: the ``log_likelihood`` group of
:func:`~numpyro_subsample.post.arviz.to_arviz` (for PSIS-LOO, Vehtari, Gelman and Gabry 2017).
"""

from __future__ import annotations

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers

from numpyro_subsample.core.potential import ModelData, Potential, in_plate, per_datum
from numpyro_subsample.post.predictive import DEFAULT_CHUNK_MEMORY, parse_memory
from numpyro_subsample.post.protocol import kernel_of, model_at, run_data

__all__ = ["full_log_likelihood", "log_likelihood_pass", "log_likelihood_chunks", "check_thin"]

_TILE_ARRAYS = 8  # model intermediates per (draw, datum) of a tile, for its share of the bound


@partial(jax.jit, static_argnames=("potential", "chunk"))
def _log_likelihood_rows(potential: Potential, latent: dict, data: ModelData, chunk: int):
    """{site: (s, N)} for the s draws of ``latent``: a loop over data chunks of ``chunk`` rows
    writing into one (s, N) buffer per site (the last chunk overlaps the previous one)."""
    plate = potential.plate
    num_data = plate.size
    chunk = min(chunk, num_data)
    args, kwargs = data.args_kwargs()

    def one(sample, idx):
        if potential.enumerated_sites:  # marginal over the enumerated sites
            return potential.log_likelihood_at(sample, idx, data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = handlers.substitute(handlers.seed(model_at(potential, idx), 0), data=sample)
            tr = handlers.trace(model).get_trace(*args, **kwargs)
        return {
            name: per_datum(site["fn"].log_prob(site["value"]), plate, idx.shape[0], name)
            for name, site in tr.items()
            if site["type"] == "sample" and site["is_observed"] and in_plate(site, plate.name)
        }

    def tile(start):  # {site: (s, chunk)}
        idx = start + jax.lax.iota(jnp.int32, chunk)
        return jax.vmap(one, in_axes=(0, None))(latent, idx)

    zero = jnp.zeros((), jnp.int32)
    shapes = jax.eval_shape(tile, zero)
    init = {k: jnp.zeros((v.shape[0], num_data), v.dtype) for k, v in shapes.items()}

    def body(c, bufs):
        start = jnp.minimum(c * chunk, num_data - chunk).astype(jnp.int32)
        vals = tile(start)
        return {k: jax.lax.dynamic_update_slice(b, vals[k], (zero, start)) for k, b in bufs.items()}

    return jax.lax.fori_loop(0, -(-num_data // chunk), body, init)


def log_likelihood_chunks(
    num_draws: int, num_data: int, itemsize: int, chunk_size: int, chunk_bytes: int
) -> tuple[int, int]:
    """``(draws, data)`` per chunk of :func:`log_likelihood_pass`: a buffer of draws × N
    values of ``itemsize`` bytes (all observed sites) within half of ``chunk_bytes``, and the
    model's intermediates for draws × data (``_TILE_ARRAYS`` values each) within the other half;
    at least one draw and one datum, at most ``chunk_size`` data."""
    if isinstance(chunk_size, bool) or int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}.")
    draws = int(max(1, min(num_draws, chunk_bytes // (2 * num_data * itemsize))))
    data = int(max(1, min(int(chunk_size), num_data,
                          chunk_bytes // (2 * draws * itemsize * _TILE_ARRAYS))))
    return draws, data


def log_likelihood_pass(
    potential: Potential,
    latent: dict,
    data: ModelData,
    chunk_size: int = 1024,
    chunk_memory: int | str = DEFAULT_CHUNK_MEMORY,
) -> dict[str, np.ndarray]:
    """log p(x_i | θ_s) for S draws and every datum i of the plate, (S, N) per observed site.

    ``latent``: constrained latent values with a leading draw axis. The output arrays are
    allocated once and filled a chunk of draws at a time; ``chunk_memory`` (bytes, or a string
    such as ``"512MB"``) bounds the temporaries of one chunk beyond the output: a buffer of s
    draws × N per site (at most half the bound) and the model's intermediates for s draws ×
    ``chunk_size`` data (estimated, the other half). A chunk holds at least one draw. One
    compiled program per potential and chunk shape.
    """
    if potential.plate_latent_sites:
        raise ValueError(
            "log p(x_i | θ) of a model with local latent sites "
            f"{list(potential.plate_latent_sites)} "
            f"inside the plate '{potential.plate.name}' is an integral over them, which the "
            "draws (global sites only) cannot give; leave log_likelihood out, or marginalise "
            "the local sites out of the model."
        )
    bound = parse_memory(chunk_memory)
    latent = {k: np.asarray(latent[k]) for k in potential.latent_sites}
    num_draws = int(np.shape(latent[potential.latent_sites[0]])[0])
    num_data = potential.plate.size
    probe = jax.eval_shape(
        lambda lat, d: _log_likelihood_rows(potential, lat, d, 1),
        {k: v[:1] for k, v in latent.items()},
        data,
    )
    itemsize = sum(v.dtype.itemsize for v in probe.values())
    draws, chunk = log_likelihood_chunks(num_draws, num_data, itemsize, chunk_size, bound)
    out = {k: np.empty((num_draws, num_data), v.dtype) for k, v in probe.items()}
    for start in range(0, num_draws, draws):
        stop = min(start + draws, num_draws)
        rows = np.minimum(np.arange(start, start + draws), stop - 1)  # pad with the last draw
        block = _log_likelihood_rows(potential, {k: v[rows] for k, v in latent.items()}, data,
                                     chunk)
        for k, v in block.items():
            out[k][start:stop] = np.asarray(v)[: stop - start]
        del block
    return out


def full_log_likelihood(
    mcmc,
    chunk_size: int = 1024,
    data: ModelData | None = None,
    *,
    chunk_memory: int | str = DEFAULT_CHUNK_MEMORY,
    thin: int = 1,
) -> dict[str, np.ndarray]:
    """log p(x_i | θ_s) for every draw s and every datum i of the plate: (chains, draws, N).

    Costs S·N likelihood evaluations (:func:`log_likelihood_pass`, temporaries bounded by
    ``chunk_memory`` beyond the output). ``thin``: every ``thin``-th draw of each chain
    (draws 0, thin, 2·thin, ...). ``data``: the model's data (default: those of the run).

    Parameters
    ----------
    mcmc, chunk_size, data, chunk_memory, thin
        A finished run and the options above.

    Returns
    -------
    dict
        Site → (chains, draws, N).

    References
    ----------
    Vehtari, Gelman and Gabry (2017).
    """
    kernel = kernel_of(mcmc, "full_log_likelihood")
    thin = check_thin(thin, "thin")
    data = run_data(mcmc) if data is None else data
    samples = mcmc.get_samples(group_by_chain=True)
    latent = {k: np.asarray(samples[k])[:, ::thin] for k in kernel.potential.latent_sites}
    chains, draws = next(iter(latent.values())).shape[:2]
    latent = {k: v.reshape((chains * draws,) + v.shape[2:]) for k, v in latent.items()}
    out = log_likelihood_pass(kernel.potential, latent, data, chunk_size, chunk_memory)
    return {k: v.reshape(chains, draws, -1) for k, v in out.items()}


def check_thin(thin: int, name: str) -> int:
    """``thin`` as an int, or a ValueError naming the argument ``name``."""
    if isinstance(thin, bool) or not isinstance(thin, (int, np.integer)) or thin < 1:
        raise ValueError(f"{name} must be a positive integer (1 keeps every draw); got {thin!r}.")
    return int(thin)
