"""Random keys: the sampling loops' per-step keys, and NumPy generators for one-off host
draws (a draw site of a JAX generator inside a program costs compile time,
``benchmarks/bench_rng_compile.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["STEP_RNG", "host_generator", "host_normals", "raw_key", "split_step_key"]

STEP_RNG = "philox4x32"


def raw_key(key: jax.Array) -> jax.Array:
    """uint32[2] key data for a legacy ``PRNGKey`` or a typed key of any implementation."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(key)
        if data.shape[-1:] != (2,):
            data = jax.random.bits(key, (2,), jnp.uint32)
        return data
    return key


def host_generator(key: jax.Array, stream: int | None = None) -> np.random.Generator:
    """NumPy's generator seeded with the bits of ``key`` (a legacy or typed JAX key) and, if
    given, the number ``stream`` (independent draws from one key, as ``fold_in`` for JAX's
    generators, without compiling one): the same key gives the same host draws."""
    entropy = np.asarray(raw_key(key), np.uint32).ravel()
    if stream is not None:
        entropy = np.append(entropy, np.uint32(stream))
    return np.random.default_rng(entropy)


def host_normals(key: jax.Array, shape: tuple[int, ...], dtype) -> np.ndarray:
    """Standard normal draws of ``shape`` by :func:`host_generator` of ``key``, or of each key
    of a batch (a leading axis of keys gives a leading axis of draws)."""
    bits = np.asarray(raw_key(key), np.uint32)
    rows = [host_generator(b).standard_normal(shape) for b in bits.reshape(-1, bits.shape[-1])]
    return np.stack(rows).reshape(bits.shape[:-1] + tuple(shape)).astype(dtype)


def split_step_key(
    key: jax.Array, impl: str = STEP_RNG
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The chain's next key (same type as ``key``) and two keys for one step.

    The per-step randomness uses Philox-4x32 (Salmon et al. 2011, Random123; a 64-bit key, as
    JAX's default Threefry-2x32), which JAX lowers to straight-line code on CPU where Threefry
    is a rolled loop (the per-step cost is in ``benchmarks/RESULTS.md``). The state keeps the
    raw uint32[2] key data (or a typed key if NumPyro hands one in for a continued run), so
    the chain is reproducible from the user's key and the loop carry keeps its type. Under
    ``pmap`` (``chain_method="parallel"``) JAX cannot lower Philox, so the kernels pass
    ``impl="threefry2x32"`` there.
    """
    phx = jax.random.wrap_key_data(raw_key(key), impl=impl)
    nxt, k_dyn, k_est = jax.random.split(phx, 3)
    nxt = jax.random.key_data(nxt)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(key)
        try:
            nxt = jax.random.wrap_key_data(nxt, impl=impl)
        except TypeError:  # an implementation whose key data is not uint32[2]
            nxt = jax.random.fold_in(key, 1)
    return nxt, k_dyn, k_est
