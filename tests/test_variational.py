"""The variational proxy: SVI fit, guide ordering, and SGLD accuracy with proxy="variational"."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import linreg_data, linreg_exact, linreg_model, logistic_data, logistic_hier_model
from numpyro.infer import MCMC
from numpyro.infer.autoguide import AutoMultivariateNormal

from numpyro_subsample import SGLD, ModelData, build_potential, fit_variational

# compilation takes most of these tests' time: most XLA optimisations off (conftest.py)
pytestmark = pytest.mark.fast_compile


@pytest.fixture(scope="module")
def linreg():
    X, y = linreg_data(N=5000, d=4, seed=5)
    return X, y, linreg_exact(X, y)


def _run(kernel, X, y, seed):
    mcmc = MCMC(kernel, num_warmup=300, num_samples=4000, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), X, y)
    return mcmc


@pytest.fixture(scope="module")
def cv_run(linreg):
    X, y, _ = linreg
    kernel = SGLD(linreg_model, estimator="cv", proxy="variational")
    return kernel, _run(kernel, X, y, 0)


def _assert_exact(mcmc, exact, mean_tol=0.1, sd_tol=0.1):
    mean, sd = exact
    beta = np.asarray(mcmc.get_samples()["beta"], np.float64)
    err, ratio = (beta.mean(0) - mean) / sd, beta.std(0) / sd
    assert np.all(np.abs(err) < mean_tol), err
    assert np.all(np.abs(ratio - 1) < sd_tol), ratio


def test_cv_with_variational_proxy_matches_exact_posterior(linreg, cv_run):
    """SGLD-CV, proxy="variational": means within 0.1 sd, sds within 10% of the exact answer."""
    _assert_exact(cv_run[1], linreg[2])


def test_svi_reports_trace_and_stops_by_rule(linreg, cv_run):
    kernel, _ = cv_run
    info = kernel.proxy.info
    assert kernel.proxy.kind == "variational"
    assert info["converged"] and info["svi_steps"] < 20_000
    assert info["losses"].shape == (info["svi_steps"],)
    assert len(info["elbo_trace"]) == info["svi_steps"] // 250
    assert info["elbo_trace"][-1] > info["elbo_trace"][0]
    # the guide is a usable (approximate) proxy: centre within 1 sd, sds within a factor 2.5
    mean, sd = linreg[2]
    assert np.all(np.abs((np.asarray(kernel.proxy.centre) - mean) / sd) < 1.0)
    ratio = np.sqrt(np.diag(np.asarray(kernel.proxy.cov))) / sd
    assert np.all((ratio > 0.4) & (ratio < 2.5)), ratio
    assert kernel.proxy.num_data_passes > 1


def test_cv_preferential_with_variational_proxy(linreg, cv_run):
    """SGLD-CV-PS (preferential weights from the variational proxy), reusing the fitted guide
    through guide=/guide_params= (no second SVI)."""
    X, y, exact = linreg
    info = cv_run[0].proxy.info
    kernel = SGLD(
        linreg_model, estimator="cv-preferential", proxy="variational",
        proxy_kwargs={"guide": info["guide"], "guide_params": info["guide_params"]},
    )
    mcmc = _run(kernel, X, y, 1)
    np.testing.assert_allclose(kernel.proxy.centre, cv_run[0].proxy.centre, rtol=1e-5)
    _assert_exact(mcmc, exact)


def test_guide_flattening_order_is_mapped():
    """The guide flattens sites in model order (tau, beta); ravel_pytree sorts (beta, tau).

    With hand-set guide parameters, the proxy's centre and covariance must land on the right
    sites: a mix-up would put tau's mean and variance on beta[0].
    """
    X, y = logistic_data(N=500, d=3, seed=0)
    data = ModelData.from_args((X, y), {"subsample_size": 50})
    pot = build_potential(logistic_hier_model, data, jax.random.PRNGKey(0))
    guide = AutoMultivariateNormal(logistic_hier_model)
    loc = jnp.array([-1.0, 0.1, 0.2, 0.3])  # guide order: tau (unconstrained), beta[0..2]
    scale = jnp.array([0.5, 0.01, 0.02, 0.03])
    params = {"auto_loc": loc, "auto_scale_tril": jnp.diag(scale)}
    proxy = fit_variational(pot, data, jax.random.PRNGKey(1), guide=guide, guide_params=params)
    z = pot.unravel(proxy.centre)
    np.testing.assert_allclose(z["tau"], -1.0, rtol=1e-6)
    np.testing.assert_allclose(z["beta"], [0.1, 0.2, 0.3], rtol=1e-6)
    sd = pot.unravel(jnp.sqrt(jnp.diag(proxy.cov)))
    np.testing.assert_allclose(sd["tau"], 0.5, rtol=1e-5)
    np.testing.assert_allclose(sd["beta"], [0.01, 0.02, 0.03], rtol=1e-5)
    assert proxy.info["gaussian"] and proxy.info["svi_steps"] == 0
    draws = proxy.info["sample"](jax.random.PRNGKey(2), 4000)
    np.testing.assert_allclose(draws.mean(0), proxy.centre, atol=0.05)


def test_bad_input_raises(linreg):
    X, y, _ = linreg
    data = ModelData.from_args((X, y), {})
    pot = build_potential(linreg_model, data, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="guide_params= needs the guide="):
        fit_variational(pot, data, jax.random.PRNGKey(0), guide_params={"auto_loc": jnp.zeros(4)})
    with pytest.raises(ValueError, match="learning_rate"):
        fit_variational(pot, data, jax.random.PRNGKey(0), learning_rate=-1.0)
    with pytest.raises(ValueError, match="block_size must be a positive integer, got 0"):
        fit_variational(pot, data, jax.random.PRNGKey(0), block_size=0)
    with pytest.raises(ValueError, match="proxy must be"):
        SGLD(linreg_model, proxy="vi")


def test_refit_on_new_data_compiles_nothing(cv_run, caplog):
    """A refit on new data of the same shapes (same potential, hence the same default guide)
    reuses every compiled SVI program, moment and data-pass program of the kernel's fit."""
    kernel, _ = cv_run
    X2, y2 = linreg_data(N=5000, d=4, seed=6)
    data2 = ModelData.from_args((X2, y2), {})
    with caplog.at_level(logging.WARNING), jax.log_compiles():
        proxy = fit_variational(kernel.potential, data2, jax.random.PRNGKey(3), max_steps=2000,
                                store_datum_grads=False)
    compiled = [r.getMessage()[:120] for r in caplog.records if "Compiling" in r.getMessage()]
    assert not compiled, compiled
    assert proxy.info["svi_steps"] <= 2000 and proxy.info["guide"] is kernel.proxy.info["guide"]
    mean, sd = linreg_exact(X2, y2)
    # the refit starts at the prior medians, as the kernel's fit: 500 SVI steps left one
    # coordinate 30 sds short for some seeds; 2000 (or early stopping) reach the mean
    assert np.all(np.abs((np.asarray(proxy.centre) - mean) / sd) < 1.5)
