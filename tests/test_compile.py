"""Data are arguments: programs do not grow with N, and reruns on new data compile nothing."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from compile_utils import persistent_cache
from models import logistic_data, logistic_model
from numpyro.infer import MCMC

from numpyro_subsample import SGHMC, SGLD, EnergyConservingHMC
from numpyro_subsample.compare.timing import CompileTimer
from numpyro_subsample.core.datapass import value_grad_hessian
from numpyro_subsample.core.potential import ModelData, build_potential

pytestmark = pytest.mark.fast_compile  # short runs: compilation is most of their time


def _data(seed, N=3000):
    return logistic_data(N=N, d=4, seed=seed)


@pytest.mark.parametrize("chain_method,num_chains", [("sequential", 1), ("vectorized", 2)])
def test_rerun_on_new_same_shape_data_compiles_nothing(chain_method, num_chains):
    """MCMC(jit_model_args=True): the second run on new data of the same shapes refits the
    proxy (new values) and compiles nothing; NumPyro re-traces its loop, which the persistent
    compilation cache then serves."""
    with persistent_cache():
        kernel = SGLD(logistic_model)
        mcmc = MCMC(kernel, num_warmup=50, num_samples=200, num_chains=num_chains,
                    chain_method=chain_method, progress_bar=False, jit_model_args=True)
        X1, y1 = _data(0)
        mcmc.run(jax.random.PRNGKey(0), X1, y1)
        mcmc.get_samples()  # NumPyro's own reshape of the draws, compiled once
        first_centre = np.asarray(kernel.proxy.centre)
        X2, y2 = _data(1)
        with CompileTimer() as cc:
            mcmc.run(jax.random.PRNGKey(1), X2, y2)
            beta = np.asarray(mcmc.get_samples()["beta"])
        assert cc.compiled == 0, cc.programs
        # the second run really used the new data: new proxy, draws near its centre
        assert not np.allclose(kernel.proxy.centre, first_centre)
        sd = np.sqrt(np.diag(np.asarray(kernel.proxy.cov)))
        assert np.all(np.abs(beta.mean(0) - np.asarray(kernel.proxy.centre)) < 0.5 * sd)


def test_default_jit_model_args_reuses_our_programs():
    """With NumPyro's default (jit_model_args=False) NumPyro rebuilds its loop, but nothing of
    the package's preprocessing or init is compiled again for new same-shape data."""
    kernel = SGLD(logistic_model)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=50, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *_data(2))
    with CompileTimer() as cc:
        mcmc.run(jax.random.PRNGKey(1), *_data(3))
    ours = [n for n in cc.programs if "fori_collect" not in n and "body_fn" not in n]
    assert ours == [], cc.programs


def test_equal_values_in_new_arrays_skip_the_refit():
    kernel = SGLD(logistic_model)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=50, progress_bar=False)
    X, y = _data(4)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    pre = kernel.preprocessed
    mcmc.run(jax.random.PRNGKey(0), jnp.array(np.asarray(X)), jnp.array(np.asarray(y)))
    assert kernel.preprocessed is pre
    mcmc.run(jax.random.PRNGKey(0), X, y.at[0].set(1 - y[0]))
    assert kernel.preprocessed is not pre


def test_program_size_does_not_grow_with_the_data():
    """The data enter as arguments: the full-data pass and the sampling step lower to the same
    program (up to the digits of shape annotations) at N = 10^4 and 10^5."""
    sizes = {}
    for N in (10_000, 100_000):
        X, y = _data(5, N=N)
        data = ModelData.from_args((X, y), {})
        pot = build_potential(logistic_model, data, jax.random.PRNGKey(0))
        text = value_grad_hessian.lower(pot, pot.init_theta, data).as_text()
        sizes[N] = len(text)
    assert abs(sizes[100_000] - sizes[10_000]) < 0.02 * sizes[10_000], sizes
    assert sizes[100_000] < 200_000  # no constant of N·d floats (4·10^5 of them) inside


class _RecordingNormal(dist.Normal):
    """A normal prior that records whether each log-density evaluation saw a traced value."""

    traced: list = []

    def log_prob(self, value):
        type(self).traced.append(isinstance(value, jax.core.Tracer))
        return super().log_prob(value)


def _recording_model(X, y=None, subsample_size=100):
    beta = numpyro.sample("beta", _RecordingNormal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC, EnergyConservingHMC])
def test_cold_run_evaluates_the_model_only_inside_compiled_programs(kernel_cls):
    """Run op by op, the model costs one XLA compilation per primitive (about 20 ms each on
    CPU, seconds in all): every evaluation of the model during preprocessing, init and
    sampling is traced."""
    _RecordingNormal.traced.clear()
    mcmc = MCMC(kernel_cls(_recording_model), num_warmup=100, num_samples=50,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *_data(6, N=1000))
    assert _RecordingNormal.traced and all(_RecordingNormal.traced), _RecordingNormal.traced


def _primitives(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names |= _primitives(sub)
    return names


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC])
def test_chain_init_compiles_no_generator_and_no_estimator(kernel_cls):
    """With host draws the per-chain init is a few vector ops: no random number generator and
    no model evaluation (the first step evaluates the gradient); without them (a traced key
    under pmap) it draws in the program."""
    X, y = _data(0)
    kernel = kernel_cls(logistic_model, progress_bar=False)
    pre = kernel.preprocess((X, y))
    init_one, _, params = kernel._programs(pre, num_warmup=10, traced=False)
    data = ModelData.from_args((X, y), {})
    key = jax.random.PRNGKey(3)
    (draws,) = kernel._init_draws(key, params)
    assert draws.shape == (2, X.shape[1])
    np.testing.assert_array_equal(draws, kernel._init_draws(key, params)[0])
    with_draws = _primitives(jax.make_jaxpr(init_one)(key, None, data, params, draws).jaxpr)
    assert not {p for p in with_draws if "random" in p or "threefry" in p}, with_draws
    assert not {"gather", "logistic", "exp", "log", "log1p"} & with_draws, with_draws
    in_program = _primitives(jax.make_jaxpr(init_one)(key, None, data, params).jaxpr)
    assert {p for p in in_program if "random" in p}


def test_numpy_data_reach_the_device_without_a_compiled_program():
    """ModelData transfers NumPy arrays (jnp.asarray would compile an eager 'stage' program
    per shape and dtype), with JAX's dtype canonicalisation."""
    X = np.random.default_rng(0).normal(size=(37, 5))
    with CompileTimer() as ct:
        data = ModelData.from_args((X, np.arange(37)), {"k": 2})
    assert ct.programs == []
    assert data.arrays[0].dtype == jnp.zeros(1).dtype and isinstance(data.arrays[0], jax.Array)
    np.testing.assert_allclose(data.arrays[0], X, rtol=1e-6)
    assert data.args_kwargs()[1] == {"k": 2}
