"""Test helper: a fresh persistent compilation cache (counting compilations:
``numpyro_subsample.compare.timing.CompileTimer``)."""

from __future__ import annotations

import contextlib
import tempfile

import jax
from jax.experimental.compilation_cache import compilation_cache


@contextlib.contextmanager
def persistent_cache():
    """JAX's persistent compilation cache in a fresh directory, caching every program."""
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")
    old = [getattr(jax.config, k) for k in keys]
    with tempfile.TemporaryDirectory() as d:
        for k, v in zip(keys, (d, 0.0, 0), strict=True):
            jax.config.update(k, v)
        compilation_cache.reset_cache()  # JAX opens the cache once: point it at d
        try:
            yield
        finally:
            for k, v in zip(keys, old, strict=True):
                jax.config.update(k, v)
            compilation_cache.reset_cache()
