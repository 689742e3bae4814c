"""SGLD against known answers, and its behaviour under numpyro.infer.MCMC."""

import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import (
    importance_moments,
    linreg_data,
    linreg_exact,
    linreg_model,
    logistic_data,
    logistic_hier_model,
    moment_errors,
)
from numpyro.infer import MCMC

from numpyro_subsample import SGLD, AdaptationOptions, DistributedSGLD, NoiseOptions, to_arviz
from numpyro_subsample.sgmcmc.stepsize import sgld_step_size

HERE = os.path.dirname(__file__)

# compilation takes most of these tests' time: most XLA optimisations off (conftest.py)
pytestmark = pytest.mark.fast_compile


@pytest.fixture(scope="module")
def linreg():
    X, y = linreg_data(N=10_000, d=4, seed=0)
    return X, y, linreg_exact(X, y)


@pytest.fixture(scope="module")
def linreg_run(linreg):
    """SGLD-CV with every default, 4 vectorised chains (the accuracy test's run)."""
    X, y, _ = linreg
    kernel = SGLD(linreg_model, estimator="cv")
    mcmc = MCMC(kernel, num_warmup=500, num_samples=5000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y,
             extra_fields=("grad", "subsample_size", "data_passes"))
    return kernel, mcmc


def test_cv_matches_exact_conjugate_posterior(linreg, linreg_run):
    """Means within 0.1 posterior sd, sds within 10% (N = 10^4, n = 100, default step)."""
    _, _, (mean, sd) = linreg
    kernel, mcmc = linreg_run
    beta = np.asarray(mcmc.get_samples()["beta"], np.float64)
    err = (beta.mean(0) - mean) / sd
    ratio = beta.std(0) / sd
    assert np.all(np.abs(err) < 0.1), err
    assert np.all(np.abs(ratio - 1) < 0.1), ratio
    # the Laplace proxy of a Gaussian posterior is exact
    np.testing.assert_allclose(kernel.proxy.centre, mean, atol=0.01 * sd.min())
    np.testing.assert_allclose(np.sqrt(np.diag(kernel.proxy.cov)), sd, rtol=1e-2)


def test_uniform_with_default_step_matches_exact_posterior(linreg):
    """Welling-Teh SGLD with its noise-aware default step, at N/n = 10 (at N/n = 100 the
    step the noise allows is ~1e-3 and the chain needs ~10^5 steps: the known weakness that
    control variates fix). The noise-corrected dynamic (default) takes the step of a noise-free
    chain here (the cap 1/v ≈ 0.094 barely binds), the uncorrected one a step ~5× smaller.
    Means within 0.25 sd, sds within 20%."""
    X, y, (mean, sd) = linreg
    kernel = SGLD(linreg_model, estimator="uniform")
    mcmc = MCMC(kernel, num_warmup=500, num_samples=5000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), X, y, subsample_size=1000)
    v = kernel.preprocessed.noise
    assert kernel.step_size == pytest.approx(sgld_step_size(v, corrected=True))
    assert kernel.step_size > 0.9 * sgld_step_size(0.0)
    plain = SGLD(linreg_model, estimator="uniform", noise=NoiseOptions(correction=False))
    plain.preprocess((X, y), {"subsample_size": 1000})
    assert plain.step_size == pytest.approx(sgld_step_size(v))
    assert plain.step_size < 0.5 * kernel.step_size
    beta = np.asarray(mcmc.get_samples()["beta"], np.float64)
    assert np.all(np.abs((beta.mean(0) - mean) / sd) < 0.25), (beta.mean(0) - mean) / sd
    assert np.all(np.abs(beta.std(0) / sd - 1) < 0.2), beta.std(0) / sd


def test_cv_matches_exact_posterior_on_logistic_with_constrained_scale():
    """Logistic regression with a HalfNormal scale: 0.2 sd in mean, 20% in sd vs the exact
    posterior (importance sampling on NumPyro's density: with an effective sample size above
    10^4 its Monte Carlo error is below 0.01 sd)."""
    X, y = logistic_data(N=2000, d=4, seed=2)
    ref, ess = importance_moments(logistic_hier_model, X, y)
    assert ess > 10_000, ess
    kernel = SGLD(logistic_hier_model, estimator="cv")
    mcmc = MCMC(kernel, num_warmup=500, num_samples=5000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), X, y)
    samples = mcmc.get_samples()
    assert np.all(np.asarray(samples["tau"]) > 0)
    err, ratio = moment_errors(samples, ref)
    assert np.all(np.abs(err) < 0.2), err
    assert np.all(np.abs(ratio - 1) < 0.2), ratio
    assert not np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))


def test_wrong_step_size_is_caught_by_the_accuracy_check(linreg):
    """The tolerance has power: a 4x too large step inflates the sd beyond 10%."""
    X, y, (mean, sd) = linreg
    with pytest.warns(DeprecationWarning, match="step_size is now the time step h"):
        kernel = SGLD(linreg_model, estimator="cv", step_size=0.4)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=3000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    ratio = np.asarray(mcmc.get_samples()["beta"]).std(0) / sd
    assert np.any(np.abs(ratio - 1) > 0.1), ratio


def test_fields_shapes_and_grad(linreg, linreg_run):
    X, y, _ = linreg
    kernel, mcmc = linreg_run
    extra = mcmc.get_extra_fields(group_by_chain=True)
    assert extra["subsample_size"].shape == (4, 5000)
    assert np.all(extra["subsample_size"] == 100)
    assert extra["grad"].shape == (4, 5000, 4)
    assert not np.any(extra["diverging"])
    # data passes: preprocessing plus n/N per step, cumulative
    passes = np.asarray(extra["data_passes"][0])
    np.testing.assert_allclose(np.diff(passes), 100 / 10_000, rtol=1e-3)
    assert passes[0] > kernel.preprocessed.data_passes
    # the stored gradient is the estimate of the log-posterior gradient at the stored draw
    beta = mcmc.get_samples(group_by_chain=True)["beta"][0, :50]
    prec_grad = -(X.T @ (X @ beta.T - y[:, None])).T - beta / 100.0
    rel = np.abs(extra["grad"][0, :50] - prec_grad) / (np.abs(prec_grad).mean() + 1)
    assert np.median(rel) < 0.2


@pytest.fixture(scope="module")
def small():
    X, y = logistic_data(N=2000, d=3, seed=5)
    return X, y


def test_sequential_chains_thinning_and_reproducibility(small):
    X, y = small
    kernel = SGLD(logistic_hier_model)
    runs = []
    mcmc = MCMC(kernel, num_warmup=100, num_samples=400, num_chains=2, thinning=4,
                chain_method="sequential", progress_bar=False)
    for key in (3, 3, 4):
        mcmc.run(jax.random.PRNGKey(key), X, y)
        runs.append(mcmc.get_samples(group_by_chain=True))
    assert runs[0]["beta"].shape == (2, 100, 3) and runs[0]["tau"].shape == (2, 100)
    np.testing.assert_array_equal(runs[0]["beta"], runs[1]["beta"])
    # chains differ from each other, and another key gives other draws
    assert not np.allclose(runs[0]["beta"][0], runs[0]["beta"][1])
    assert not np.allclose(runs[2]["beta"], runs[0]["beta"])


def test_continue_with_post_warmup_state_and_no_refit(small):
    X, y = small
    kernel = SGLD(logistic_hier_model)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=200, progress_bar=False)
    mcmc.warmup(jax.random.PRNGKey(0), X, y)
    proxy = kernel.proxy
    mcmc.run(mcmc.post_warmup_state.rng_key, X, y)
    assert kernel.proxy is proxy  # the proxy was not refitted
    first = mcmc.get_samples()["beta"]
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.post_warmup_state.rng_key, X, y)
    second = mcmc.get_samples()["beta"]
    assert first.shape == second.shape == (200, 3)
    assert int(mcmc.last_state.i) == 600
    assert not np.allclose(first, second)


def test_progress_bar_and_init_params(small):
    X, y = small
    kernel = SGLD(logistic_hier_model, progress_bar=True)
    init = {"beta": jnp.zeros(3), "tau": jnp.asarray(0.0)}  # unconstrained values
    mcmc = MCMC(kernel, num_warmup=5, num_samples=20, progress_bar=True)
    mcmc.run(jax.random.PRNGKey(0), X, y, init_params=init)
    assert mcmc.get_samples()["beta"].shape == (20, 3)


def test_first_step_evaluates_the_gradient_at_the_start_without_moving(small):
    """The initial state holds no gradient: the first draw evaluates it at init_params (with
    num_warmup=0; each of its k steps per draw spends a subsample without moving) and the
    second draw moves."""
    X, y = small
    kernel = SGLD(logistic_hier_model, progress_bar=False)
    init = {"beta": jnp.asarray([0.3, -0.2, 0.1]), "tau": jnp.asarray(0.0)}
    mcmc = MCMC(kernel, num_warmup=0, num_samples=3, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, init_params=init, extra_fields=("data_passes",))
    beta = np.asarray(mcmc.get_samples()["beta"])
    np.testing.assert_allclose(beta[0], init["beta"], rtol=1e-6)
    assert not np.allclose(beta[1], beta[0])
    passes = np.asarray(mcmc.get_extra_fields()["data_passes"], np.float64)
    n, k = kernel.potential.plate.subsample_size, kernel.steps_per_draw
    np.testing.assert_allclose(passes[0], kernel.preprocessed.data_passes + k * n / X.shape[0],
                               rtol=1e-5)


def test_init_params_with_a_non_finite_gradient_raise_before_sampling(small):
    X, y = small
    kernel = SGLD(logistic_hier_model, progress_bar=False)
    init = {"beta": jnp.asarray([jnp.nan, 0.0, 0.0]), "tau": jnp.asarray(0.0)}
    mcmc = MCMC(kernel, num_warmup=5, num_samples=5, progress_bar=False)
    with pytest.raises(ValueError, match="not finite at the initial position given by init"):
        mcmc.run(jax.random.PRNGKey(0), X, y, init_params=init)


def test_divergence_is_flagged_and_samples_stay_finite(small):
    X, y = small
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(logistic_hier_model, step_size=25.0)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=300, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    assert set(mcmc.get_extra_fields()) == {"diverging"}  # NumPyro HMC's default fields
    div = np.asarray(mcmc.get_extra_fields()["diverging"])
    assert div.any()
    assert np.all(np.isfinite(np.asarray(mcmc.get_samples()["beta"])))
    with pytest.warns(UserWarning, match="pass a smaller step_size"):
        to_arviz(mcmc)


def _run_script(code: str, env_extra: dict) -> str:
    env = {**os.environ, **env_extra, "PYTHONPATH": HERE}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_float64_with_x64_and_parallel_chains_on_two_devices():
    code = """
        import jax
        jax.config.update("jax_enable_x64", True)
        import numpy as np
        from numpyro.infer import MCMC
        from models import linreg_data, linreg_exact, linreg_model
        from numpyro_subsample import SGLD
        X, y = linreg_data(N=4000, d=3, seed=1)
        X, y = X.astype("float64"), y.astype("float64")
        mean, sd = linreg_exact(X, y)
        kernel = SGLD(linreg_model)
        mcmc = MCMC(kernel, num_warmup=300, num_samples=4000, num_chains=2,
                    chain_method="parallel", progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), X, y)
        b = mcmc.get_samples(group_by_chain=True)["beta"]
        assert jax.device_count() == 2
        assert b.dtype == np.float64 and kernel.proxy.centre.dtype == np.float64, b.dtype
        assert b.shape == (2, 4000, 3)
        err = (np.asarray(b).reshape(-1, 3).mean(0) - mean) / sd
        assert np.all(np.abs(err) < 0.15), err
        print("OK", mcmc.chain_method)
    """
    # most XLA optimisations off: the run is short, its compilation is not (conftest.py)
    out = _run_script(code, {"XLA_FLAGS": "--xla_force_host_platform_device_count=2",
                             "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"})
    assert "OK parallel" in out


def test_warnings_are_not_raised_in_normal_runs(small):
    X, y = small
    kernel = SGLD(logistic_hier_model)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=50, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mcmc.run(jax.random.PRNGKey(0), X, y)


def test_kernel_and_mcmc_pickle_and_run_again(small):
    """Plain pickle of a kernel and of an MCMC object (NumPyro's kernels pickle); the restored
    objects run (preprocessing is recomputed, not pickled)."""
    import pickle

    X, y = small
    kernel = SGLD(logistic_hier_model)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=30, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    k2 = pickle.loads(pickle.dumps(kernel))
    m2 = pickle.loads(pickle.dumps(mcmc))
    np.testing.assert_array_equal(m2.get_samples()["beta"], mcmc.get_samples()["beta"])
    m2.run(jax.random.PRNGKey(0), X, y)
    np.testing.assert_allclose(m2.get_samples()["beta"], mcmc.get_samples()["beta"], rtol=1e-5)
    m3 = MCMC(k2, num_warmup=20, num_samples=30, progress_bar=False)
    m3.run(jax.random.PRNGKey(0), X, y)
    np.testing.assert_allclose(m3.get_samples()["beta"], mcmc.get_samples()["beta"], rtol=1e-5)


def test_exploding_chain_is_flagged_not_returned(linreg):
    """A too-large step makes the chain grow geometrically while staying finite (|1 − h| > 1 on
    a Gaussian target in whitened coordinates): states beyond MAX_PROXY_SD proxy sds are
    rejected and flagged, so no draw explodes and the run warns."""
    from numpyro_subsample.sgmcmc.chain import MAX_PROXY_SD

    X, y, (mean, sd) = linreg
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(linreg_model, step_size=3.0)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=300, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    beta = np.asarray(mcmc.get_samples()["beta"], np.float64)
    div = np.asarray(mcmc.get_extra_fields()["diverging"])
    assert div.sum() > 100, div.sum()
    proxy_sd = np.sqrt(np.diag(np.asarray(kernel.proxy.cov)))
    assert np.all(np.abs(beta - np.asarray(kernel.proxy.centre)) < MAX_PROXY_SD * proxy_sd * 5)
    with pytest.warns(UserWarning, match="smaller step_size"):
        to_arviz(mcmc)


def test_default_step_without_preconditioning_is_refused_at_construction():
    """Without the proxy's whitening the measured-noise rule does not apply: refused unless the
    preconditioner adapts (the default then, tests/test_adaptation.py)."""
    with pytest.raises(ValueError, match="step_size=None needs preconditioning=True"):
        SGLD(logistic_hier_model, preconditioning=False,
             adaptation=AdaptationOptions(preconditioner=False))
    with pytest.raises(ValueError, match="step_size=None needs preconditioning=True"):
        DistributedSGLD(logistic_hier_model, preconditioning=False)
