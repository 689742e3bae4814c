"""The data never become constants of a compiled program, whatever the user passes to MCMC.

NumPyro's default ``MCMC(jit_model_args=False)`` hands the model arguments to the kernel's
``sample`` and ``postprocess_fn`` from a closure: read there, the data would be compiled into
the sampling loop. JAX warns when a program captures more than
``jax_captured_constants_warn_bytes`` of constants; these tests set that threshold far below
the data's size and turn the warning into an error.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from compile_utils import persistent_cache
from models import logistic_data, logistic_model
from numpyro.infer import MCMC as NumPyroMCMC

from numpyro_subsample import MCMC, SGHMC, SGLD, SGNHT, SGRLD, EnergyConservingHMC
from numpyro_subsample.compare.timing import CompileTimer

N, D = 20_000, 5  # X is 400 KB, y 80 KB
THRESHOLD = 40_000  # bytes of captured constants that raise (a tenth of X)


@pytest.fixture
def no_data_constants():
    """JAX's captured-constants warning as an error above THRESHOLD bytes."""
    old = jax.config.jax_captured_constants_warn_bytes
    jax.config.update("jax_captured_constants_warn_bytes", THRESHOLD)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="A large amount of constants")
            yield
    finally:
        jax.config.update("jax_captured_constants_warn_bytes", old)


def det_model(X, y=None, subsample_size=100):
    """A logistic regression with a deterministic site outside the plate that depends on the
    data (its column means) and one inside (the linear predictor of each row)."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    numpyro.deterministic("mean_logit", X.mean(0) @ beta)
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        eta = numpyro.deterministic("eta", X[idx] @ beta)
        numpyro.sample("y", dist.Bernoulli(logits=eta), obs=y[idx])


def categorical_model(y, n=100):
    pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(4)))
    with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
        numpyro.sample("y", dist.Categorical(probs=pi), obs=y[idx])


def _run(mcmc_cls, kernel, args, **kw):
    mcmc = mcmc_cls(kernel, num_warmup=50, num_samples=50, progress_bar=False, **kw)
    if mcmc_cls is MCMC:
        mcmc.check = False  # the checks' figures are not what this test is about
    mcmc.run(jax.random.PRNGKey(0), *args)
    return mcmc, mcmc.get_samples()


KERNELS = [
    pytest.param(lambda: SGLD(logistic_model), id="SGLD"),
    pytest.param(lambda: SGHMC(logistic_model), id="SGHMC"),
    pytest.param(lambda: SGNHT(logistic_model), id="SGNHT"),
    pytest.param(lambda: EnergyConservingHMC(logistic_model), id="ECS"),
]


@pytest.mark.parametrize("make", KERNELS)
@pytest.mark.parametrize("mcmc_cls", [NumPyroMCMC, MCMC], ids=["numpyro", "package"])
def test_default_run_captures_no_data(no_data_constants, make, mcmc_cls):
    """A default run of each kernel, NumPyro's MCMC and the package's, one chain."""
    mcmc, draws = _run(mcmc_cls, make(), logistic_data(N=N, d=D))
    assert draws["beta"].shape == (50, D)


@pytest.mark.parametrize("chain_method", ["sequential", "vectorized"])
@pytest.mark.parametrize("jit_model_args", [False, True])
def test_every_chain_method_captures_no_data(no_data_constants, chain_method, jit_model_args):
    """Two chains, with and without jit_model_args, and a model whose deterministic sites
    depend on the data (inside the plate: the first n rows are kept per draw)."""
    X, y = logistic_data(N=N, d=D)
    mcmc, draws = _run(NumPyroMCMC, SGLD(det_model), (X, y), num_chains=2,
                       chain_method=chain_method, jit_model_args=jit_model_args)
    assert draws["eta"].shape == (100, 100)
    beta = np.asarray(draws["beta"])
    np.testing.assert_allclose(draws["eta"], beta @ np.asarray(X[:100]).T, rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(draws["mean_logit"], beta @ np.asarray(X).mean(0), rtol=1e-4,
                               atol=1e-4)


def test_sgrld_captures_no_data(no_data_constants):
    y = np.random.default_rng(0).choice(4, size=100_000, p=[0.4, 0.3, 0.2, 0.1])
    _, draws = _run(NumPyroMCMC, SGRLD(categorical_model), (y.astype(np.int32),))
    assert draws["pi"].shape == (50, 4)


@pytest.mark.parametrize("mcmc_cls", [NumPyroMCMC, MCMC], ids=["numpyro", "package"])
def test_rerun_on_new_data_of_the_same_shapes_compiles_nothing(mcmc_cls):
    """NumPyro traces its loop again on every run (for the new arguments, and because it
    wraps the loop's body in a new jit each time); since no
    data value is a constant of the loop, the persistent cache serves it."""
    with persistent_cache():
        mcmc = mcmc_cls(SGLD(logistic_model), num_warmup=50, num_samples=50,
                        progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), *logistic_data(N=N, d=D, seed=0))
        mcmc.get_samples()
        with CompileTimer() as cc:
            mcmc.run(jax.random.PRNGKey(1), *logistic_data(N=N, d=D, seed=1))
            mcmc.get_samples()
    assert cc.compiled == 0, cc.programs


def test_progress_bar_steps_do_not_carry_the_data():
    """With the progress bar NumPyro compiles one step and calls it per iteration, passing
    the state in and out: the data must not be part of that state (each call would copy
    them)."""
    X, y = logistic_data(N=N, d=D)
    mcmc = NumPyroMCMC(SGLD(logistic_model), num_warmup=5, num_samples=5, progress_bar=True)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    for leaf in jax.tree.leaves(mcmc.last_state):
        assert np.ndim(leaf) == 0 or np.shape(leaf)[0] != N, np.shape(leaf)


def olre_model(x, y=None, n=100):
    """A Poisson regression with an observation-level effect, integrated out by quadrature."""
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0], subsample_size=n) as i:
        e = numpyro.sample("e", dist.Normal(0.0, s))
        numpyro.sample("y", dist.Poisson(jnp.exp(a + 0.5 * x[i] + e)), obs=y[i])


@pytest.mark.parametrize("mcmc_cls", [NumPyroMCMC, MCMC], ids=["numpyro", "package"])
def test_a_run_with_an_integrated_local_site_captures_no_data(no_data_constants, mcmc_cls):
    rng = np.random.default_rng(5)
    x = rng.normal(size=N).astype(np.float32)
    y = rng.poisson(np.exp(1.0 + 0.5 * x + 0.3 * rng.normal(size=N))).astype(np.float32)
    kernel = SGLD(olre_model, progress_bar=False)
    _run(mcmc_cls, kernel, (x, y))
    assert kernel.potential.integrated_sites == ("e",)
