"""SGHMC and SGNHT kernels: step-size rule, state fields, accuracy against exact / NUTS."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import scipy.linalg
from models import (
    linreg_data,
    linreg_exact,
    linreg_model,
    logistic_data,
    logistic_model,
    nuts_reference,
    standardised_errors,
)
from numpyro.infer import MCMC

from numpyro_subsample import SGHMC, SGNHT, to_arviz
from numpyro_subsample.core.potential import ModelData, build_potential
from numpyro_subsample.proxies.laplace import fit_laplace
from numpyro_subsample.sgmcmc.stepsize import sghmc_step_size, sgnht_step_size

N, n = 2000, 500


def _stationary_var_x(h, alpha, v, mu=1.0):
    """Var x of the SGHMC recursion (dynamics.py) for a Gaussian target, by solving the
    discrete Lyapunov equation numerically (independent of the closed form in stepsize.py)."""
    a = 1 - alpha * h
    A = np.array([[1 - h * h * mu, h * a], [-h * mu, a]])
    s2 = h * h * v + 2 * alpha * h
    Q = s2 * np.array([[h * h, h], [h, 1.0]])
    return scipy.linalg.solve_discrete_lyapunov(A, Q)[0, 0] * mu


@pytest.mark.parametrize("v", [0.0, 0.5, 30.0])
@pytest.mark.parametrize("alpha", [0.5, 1.0, 3.0])
def test_sghmc_step_rule_meets_inflation_bound(v, alpha):
    h = sghmc_step_size(v, alpha, 0.05)
    assert 0 < h
    assert abs(_stationary_var_x(h, alpha, v) - 1.05) < 1e-3
    assert sgnht_step_size(v, alpha, 0.05) <= h
    with pytest.raises(ValueError, match="max_variance_inflation"):
        sghmc_step_size(v, alpha, 0.0)


@pytest.fixture(scope="module")
def linreg():
    X, y = linreg_data(N, 4, seed=5)
    data = ModelData.from_args((X, y), {"subsample_size": n})
    pot = build_potential(linreg_model, data, jax.random.PRNGKey(0))
    return X, y, fit_laplace(pot, data, jax.random.PRNGKey(1), check_chain=False)


@pytest.fixture(scope="module")
def logistic():
    X, y = logistic_data(N, 4, seed=6)
    data = ModelData.from_args((X, y), {"subsample_size": n})
    pot = build_potential(logistic_model, data, jax.random.PRNGKey(0))
    ref = nuts_reference("logistic", X, y, num_warmup=400, num_samples=1500, num_chains=2)
    return X, y, fit_laplace(pot, data, jax.random.PRNGKey(1), check_chain=False), ref


CONFIGS = [
    (SGHMC, "cv", 1500),
    (SGNHT, "cv", 2000),
    (SGHMC, "stratified", 3000),
    (SGNHT, "stratified", 3000),
]


def _run(kernel_cls, estimator, num_samples, X, y, proxy):
    opts = {"num_strata": 20} if estimator == "stratified" else {}
    kernel = kernel_cls(linreg_model if proxy[1] == "linreg" else logistic_model,
                        estimator=estimator, proxy=proxy[0], **opts)
    mcmc = MCMC(kernel, num_warmup=50, num_samples=num_samples, num_chains=8,
                chain_method="vectorized", progress_bar=False,
                thinning=max(1, num_samples // 1500))
    mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=n,
             extra_fields=("momentum", "thermostat"))
    return kernel, mcmc


@pytest.mark.parametrize("kernel_cls,estimator,num_samples", CONFIGS)
def test_exact_linreg(linreg, kernel_cls, estimator, num_samples):
    """|mean error| < 0.1 posterior sd, sd ratio within 10% of the exact posterior."""
    X, y, proxy = linreg
    kernel, mcmc = _run(kernel_cls, estimator, num_samples, X, y, (proxy, "linreg"))
    mean, sd = linreg_exact(X, y)
    beta = np.asarray(mcmc.get_samples()["beta"], np.float64)
    err, ratio = (beta.mean(0) - mean) / sd, beta.std(0) / sd
    assert np.all(np.abs(err) < 0.1), err
    assert np.all(np.abs(ratio - 1) < 0.1), ratio
    extra = mcmc.get_extra_fields()
    assert extra["momentum"].shape[-1] == 4
    if kernel_cls is SGNHT:  # the thermostat moved away from its start and stayed positive
        xi = np.asarray(extra["thermostat"])
        assert np.all(np.isfinite(xi)) and xi.mean() > 0 and xi.std() > 0


@pytest.mark.parametrize("kernel_cls,estimator,num_samples", CONFIGS)
def test_logistic_vs_nuts(logistic, kernel_cls, estimator, num_samples):
    """|mean error| < 0.2 NUTS sd, sd ratio within 20%."""
    X, y, proxy, ref = logistic
    kernel, mcmc = _run(kernel_cls, estimator, num_samples, X, y, (proxy, "logistic"))
    err, ratio = standardised_errors(mcmc.get_samples(), ref)
    assert np.all(np.abs(err) < 0.2), err
    assert np.all(np.abs(ratio - 1) < 0.2), ratio
    idata = to_arviz(mcmc)
    assert idata.posterior["beta"].shape[:2] == (8, mcmc.num_samples // mcmc.thinning)


def test_bad_friction():
    with pytest.raises(ValueError, match="friction"):
        SGHMC(linreg_model, friction=0.0)
