"""Test helpers: count XLA compilations, and a fresh persistent compilation cache."""

from __future__ import annotations

import contextlib
import tempfile

import jax
from jax import monitoring


class CompileCounter:
    """XLA compilations inside the block, by program name (cache hits of JAX's persistent
    compilation cache are not compilations)."""

    def __enter__(self):
        self.names: list[str] = []
        self.hits = 0

        def span(event, start, end, **kw):
            if event == "/jax/core/compile/backend_compile_duration":
                self.names.append(str(kw.get("fun_name", "?")))

        def count(event, **kw):
            if event == "/jax/compilation_cache/cache_hits":
                self.hits += 1

        self._span, self._count = span, count
        monitoring.register_event_time_span_listener(span)
        monitoring.register_event_listener(count)
        return self

    def __exit__(self, *exc):
        monitoring.unregister_event_time_span_listener(self._span)
        monitoring.unregister_event_listener(self._count)

    @property
    def compiled(self) -> int:
        return len(self.names) - self.hits


@contextlib.contextmanager
def persistent_cache():
    """JAX's persistent compilation cache in a fresh directory, caching every program."""
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")
    old = [getattr(jax.config, k) for k in keys]
    with tempfile.TemporaryDirectory() as d:
        for k, v in zip(keys, (d, 0.0, 0), strict=True):
            jax.config.update(k, v)
        try:
            yield
        finally:
            for k, v in zip(keys, old, strict=True):
                jax.config.update(k, v)
