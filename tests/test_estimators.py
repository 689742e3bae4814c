"""Unbiasedness of the uniform and control-variate gradient estimators, and the index draws."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import logistic_data, logistic_hier_model

from numpyro_subsample import (
    ModelData,
    build_potential,
    configure_estimator,
    fit_laplace,
    sample_without_replacement,
)
from numpyro_subsample.core.datapass import value_grad_hessian

pytestmark = pytest.mark.fast_compile  # short runs: compilation is most of their time

KEY = jax.random.PRNGKey(0)
NUM_DRAWS = 4000


@pytest.fixture(scope="module")
def setup():
    X, y = logistic_data(N=2000, d=3, seed=3)
    data = ModelData.from_args((X, y), {"subsample_size": 20})
    pot = build_potential(logistic_hier_model, data, KEY)
    proxy = fit_laplace(pot, data, KEY, check_chain=False)
    # a point about 2 posterior sd away from the mode, where the CV correction matters
    theta = proxy.centre + 2.0 * proxy.scale_tril @ jnp.ones(pot.dim) / np.sqrt(pot.dim)
    full = value_grad_hessian(pot, theta, data, hessian=False)[1]
    return pot, data, proxy, theta, full


def _mean_and_se(estimator, theta, data):
    keys = jax.random.split(jax.random.PRNGKey(7), NUM_DRAWS)
    g = jax.jit(jax.vmap(estimator.estimate, in_axes=(None, 0, None, None)))(
        estimator.params, keys, theta, data)[0]
    g = np.asarray(g, np.float64)
    return g.mean(0), g.std(0) / np.sqrt(NUM_DRAWS)


@pytest.mark.parametrize(
    "name, replace, store",
    [
        ("uniform", True, True),
        ("uniform", False, True),
        ("cv", True, True),
        ("cv", False, True),
        ("cv", True, False),
    ],
)
def test_estimator_is_unbiased(setup, name, replace, store):
    pot, data, proxy, theta, full = setup
    if not store:
        proxy = proxy._replace(datum_grads=None)
    est = configure_estimator(name, pot, data, proxy, replace=replace)
    mean, se = _mean_and_se(est, theta, data)
    err = np.abs(mean - np.asarray(full))
    # coordinates only in the prior (tau here) have zero variance: they must be exact
    assert np.all(err <= 4.5 * se + 1e-4 * (1 + np.abs(np.asarray(full)))), (err, se)
    # the test has power: a 2% relative bias of the full gradient would be detected
    assert np.all(se < 0.02 * np.abs(np.asarray(full)) + 1e-3) or name == "uniform"


def test_cv_reduces_variance_near_the_mode(setup):
    pot, data, proxy, _, _ = setup
    theta = proxy.centre
    _, se_u = _mean_and_se(configure_estimator("uniform", pot, data, proxy), theta, data)
    _, se_cv = _mean_and_se(configure_estimator("cv", pot, data, proxy), theta, data)
    noisy = se_u > 0
    assert np.all(se_cv[noisy] < 0.2 * se_u[noisy])


def test_cv_is_exact_at_the_centre(setup):
    pot, data, proxy, _, _ = setup
    est = configure_estimator("cv", pot, data, proxy)
    full = value_grad_hessian(pot, proxy.centre, data, hessian=False)[1]
    g, n = est(KEY, proxy.centre, data)
    np.testing.assert_allclose(g, full, atol=1e-2 * float(jnp.abs(full).max()) + 1e-2)
    assert int(n) == 20


def test_unknown_option_is_rejected(setup):
    pot, data, proxy, _, _ = setup
    with pytest.raises(ValueError, match="Unknown option"):
        configure_estimator("cv", pot, data, proxy, bogus=1)


@pytest.mark.parametrize("population, n", [(50, 10), (50, 50), (10_000, 1000)])
def test_without_replacement_is_distinct_and_uniform(population, n):
    draw = jax.jit(jax.vmap(lambda k: sample_without_replacement(k, population, n)))
    idx = np.asarray(draw(jax.random.split(KEY, 400)))
    assert all(len(set(row)) == n for row in idx)
    assert idx.min() >= 0 and idx.max() < population
    if population == 50 and n == 10:
        counts = np.bincount(idx.ravel(), minlength=population)
        expected = 400 * n / population
        # inclusion probability n/N for every unit (chi-square, 49 dof, p ~ 1e-4 cut)
        assert ((counts - expected) ** 2 / expected).sum() < 95


def test_without_replacement_rejects_too_many():
    with pytest.raises(ValueError, match="Cannot draw"):
        sample_without_replacement(KEY, 5, 6)
