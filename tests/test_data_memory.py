"""The data are held once: the package's MCMC passes them to its loop as arguments (no
reference, no copy, a memory-mapped file read in place); NumPyro's default loop reads them from
references made only on that path; the draws are the same for the same key."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from models import logistic_data, logistic_model
from numpyro.infer import MCMC as NumPyroMCMC

from numpyro_subsample import MCMC, SGHMC, SGLD
from numpyro_subsample.post.loop import device_args

N, D = 4000, 3


pytestmark = pytest.mark.fast_compile  # short runs: compilation is most of their time


def _draws(mcmc_cls, kernel, X, y, **kw):
    mcmc = mcmc_cls(kernel, num_warmup=30, num_samples=40, progress_bar=False, **kw)
    if mcmc_cls is MCMC:
        mcmc.check = False
    mcmc.run(jax.random.PRNGKey(1), X, y)
    return mcmc, np.asarray(mcmc.get_samples()["beta"])


@pytest.mark.parametrize("make", [SGLD, SGHMC], ids=["SGLD", "SGHMC"])
@pytest.mark.parametrize("kw", [{}, {"num_chains": 2, "chain_method": "vectorized"},
                                {"thinning": 3}], ids=["one", "vectorized", "thinned"])
def test_package_mcmc_makes_no_references_and_gives_numpyros_draws(make, kw):
    X, y = logistic_data(N=N, d=D)
    kernel = make(logistic_model)
    _, ours = _draws(MCMC, kernel, X, y, **kw)
    assert kernel._refs is not None and kernel._refs.refs is None  # never made: no copy
    plain = make(logistic_model)
    _, theirs = _draws(NumPyroMCMC, plain, X, y, **kw)
    assert plain._refs.refs is not None  # NumPyro's default loop reads the references
    # the same draws up to rounding: the package's loop is compiled with
    # FAST_COMPILE_OPTIONS, which round some operations differently in the last bit
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_progress_bar_loop_gives_the_same_draws():
    X, y = logistic_data(N=N, d=D)
    _, quiet = _draws(MCMC, SGLD(logistic_model), X, y)
    mcmc = MCMC(SGLD(logistic_model), num_warmup=30, num_samples=40, progress_bar=True)
    mcmc.check = False
    mcmc.run(jax.random.PRNGKey(1), X, y)
    np.testing.assert_array_equal(quiet, np.asarray(mcmc.get_samples()["beta"]))


def _aligned_npy(path, x):
    np.save(path, x)
    mapped = np.load(path, mmap_mode="r")
    assert mapped.ctypes.data % 64 == 0  # a whole float32 .npy file is
    return mapped


def test_memory_mapped_data_are_read_in_place(tmp_path):
    """The loop's data are the file's mapping itself (JAX aliases it on the CPU): the run
    copies nothing into memory, and its draws are those of the same data in memory."""
    if jax.default_backend() != "cpu":
        pytest.skip("aliasing a host mapping is a CPU property")
    X, y = logistic_data(N=N, d=D)
    Xm = _aligned_npy(tmp_path / "X.npy", np.asarray(X, np.float32))
    ym = _aligned_npy(tmp_path / "y.npy", np.asarray(y, np.float32))
    (Xd, yd), _ = device_args(((Xm, ym), {}))
    assert Xd.unsafe_buffer_pointer() == Xm.ctypes.data  # no copy
    kernel = SGLD(logistic_model)
    _, mapped = _draws(MCMC, kernel, Xm, ym)
    assert kernel._refs.refs is None
    assert kernel.preprocessed_data.arrays[0].unsafe_buffer_pointer() == Xm.ctypes.data
    _, in_memory = _draws(MCMC, SGLD(logistic_model), np.asarray(X), np.asarray(y))
    np.testing.assert_array_equal(mapped, in_memory)


def test_memory_mapped_data_jax_would_copy_fail_early(tmp_path):
    """A mapped file of another dtype (or a slice of one) would be copied whole: the run
    refuses it before any work, naming the file and the fix."""
    if jax.default_backend() != "cpu":
        pytest.skip("aliasing a host mapping is a CPU property")
    X, y = logistic_data(N=N, d=D)
    Xm = _aligned_npy(tmp_path / "X64.npy", np.asarray(X, np.float64))
    kernel = SGLD(logistic_model)
    mcmc = MCMC(kernel, num_warmup=30, num_samples=40, progress_bar=False)
    with pytest.raises(ValueError, match=r"X64\.npy.*would be copied whole.*float32"):
        mcmc.run(jax.random.PRNGKey(1), Xm, y)
    assert kernel._pre is None  # failed before the preprocessing


def test_parallel_chains_keep_numpyros_default_loop():
    """With several chains mapped by NumPyro (chain_method="parallel") the package's MCMC
    keeps NumPyro's default jit_model_args=False (its mapped loop would trace every model
    argument and carry the data); alone, or vectorized, it passes the data as arguments."""
    assert MCMC(SGLD(logistic_model), num_warmup=1, num_samples=1, num_chains=2,
                chain_method="parallel", progress_bar=False)._jit_model_args is (
        jax.local_device_count() < 2)  # NumPyro falls back to sequential on one device
    assert MCMC(SGLD(logistic_model), num_warmup=1, num_samples=1, num_chains=2,
                chain_method="vectorized")._jit_model_args
    assert not MCMC(SGLD(logistic_model), num_warmup=1, num_samples=1,
                    jit_model_args=False)._jit_model_args
