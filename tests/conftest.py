import hashlib
import os
import sys
import tempfile

import jax
import pytest

from numpyro_subsample.compare import xla_fast_compile

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("CI", "1")  # no progress bars in tests

# Many tests compile the same programs (NumPyro's MCMC recompiles its loop on every run):
# a persistent compilation cache turns the repeats into cache hits.
# Keyed by XLA_FLAGS: an executable compiled under other flags (e.g. another host device
# count) must never be read back (XLA's deserialisation can crash on it); and by worker.
_flags = hashlib.sha1(os.environ.get("XLA_FLAGS", "").encode()).hexdigest()[:8]
_cache = os.path.join(
    os.environ.get(
        "NUMPYRO_SUBSAMPLE_TEST_CACHE",
        os.path.join(tempfile.gettempdir(), "numpyro_subsample_jax_cache"),
    ),
    f"xla-flags-{_flags}",
    # one directory per xdist worker: JAX writes cache entries unlocked and not atomically
    # (without a size limit), and a worker reading an entry while another writes it crashed
    # XLA's deserialisation (segfault)
    os.environ.get("PYTEST_XDIST_WORKER", "main"),
)
jax.config.update("jax_compilation_cache_dir", _cache)
# every program, also the small ones: modules recompile them after jax.clear_caches() below
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's in-memory compiled programs after each test module (the persistent cache
    above keeps them on disk): every CPU executable holds memory mappings, and one worker
    running hundreds of tests reached the kernel's vm.max_map_count (65530) and crashed with
    a segfault inside XLA."""
    yield
    jax.clear_caches()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "fast_compile: compile with most XLA optimisations off (module or test): for programs "
        "that run briefly, whose compilation takes longer than their run",
    )


@pytest.fixture(autouse=True, scope="module")
def _fast_compile_module(request):
    """``pytestmark = pytest.mark.fast_compile``: the whole module, its fixtures included."""
    with xla_fast_compile(request.node.get_closest_marker("fast_compile") is not None):
        yield


@pytest.fixture(autouse=True)
def _fast_compile_test(request):
    """``@pytest.mark.fast_compile`` on a test."""
    with xla_fast_compile(request.node.get_closest_marker("fast_compile") is not None):
        yield


# The longest test modules of the default run first (from `pytest --durations=0`): with
# `--dist loadfile` each module runs whole on one of CI's two workers, and a long module
# scheduled last leaves the other worker idle (longest-processing-time-first ordering;
# pyproject.toml turns off xdist's own reordering by test count with --no-loadscope-reorder).
_LONGEST_FIRST = ("test_sgld.py", "test_sgrld.py", "test_noise.py", "test_ecs.py",
                  "test_enumeration.py", "test_structured_kernels.py", "test_variance_reduced.py",
                  "test_sghmc.py", "test_distributed.py", "test_structured_proxies.py",
                  "test_notebooks.py", "test_cli.py", "test_checks.py", "test_cli_faults.py",
                  "test_preferential.py", "test_local.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a rank
