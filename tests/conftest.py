import os
import sys
import tempfile

import jax

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("CI", "1")  # no progress bars in tests

# Many tests compile the same programs (NumPyro's MCMC recompiles its loop on every run):
# a persistent compilation cache turns the repeats into cache hits.
_cache = os.environ.get(
    "NUMPYRO_SUBSAMPLE_TEST_CACHE",
    os.path.join(tempfile.gettempdir(), "numpyro_subsample_jax_cache"),
)
jax.config.update("jax_compilation_cache_dir", _cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
