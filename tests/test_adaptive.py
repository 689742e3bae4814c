"""Adaptive subsample size (Putcha, Nemeth and Fearnhead 2023, Sect. 3.3, Algorithm 2):
Lipschitz constants, buckets, unbiasedness, the pseudo-variance threshold, and accuracy with
fewer data passes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import linreg_data, linreg_exact, linreg_model, logistic_data, logistic_model
from numpyro.infer import MCMC

from numpyro_subsample import SGLD, ModelData, build_potential, configure_estimator, fit_laplace
from numpyro_subsample.core.datapass import value_grad_hessian
from numpyro_subsample.estimators.adaptive import bucket_sizes
from numpyro_subsample.estimators.lipschitz import lipschitz_constants

# compilation takes most of these tests' time: most XLA optimisations off (conftest.py)
pytestmark = pytest.mark.fast_compile


def poisson_model(X, y=None, subsample_size=50):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Poisson(jnp.exp(X[idx] @ beta)), obs=y[idx])


def _setup(model, args, n):
    data = ModelData.from_args(args, {"subsample_size": n})
    pot = build_potential(model, data, jax.random.PRNGKey(0))
    return pot, data, fit_laplace(pot, data, jax.random.PRNGKey(1), check_chain=False)


@pytest.fixture(scope="module")
def linreg():
    X, y = linreg_data(N=2000, d=4, seed=4)
    pot, data, proxy = _setup(linreg_model, (X, y), 64)
    return X, y, pot, data, proxy


def test_bucket_sizes():
    assert bucket_sizes(1, 50) == (1, 2, 4, 8, 16, 32, 50)
    assert bucket_sizes(3, 64) == (3, 4, 8, 16, 32, 64)
    assert bucket_sizes(64, 64) == (64,)


def test_lipschitz_closed_forms(linreg):
    X, _, pot, data, proxy = linreg
    sq = np.sum(np.asarray(X, np.float64) ** 2, 1)
    L, kind = lipschitz_constants(pot, data, proxy)
    assert kind == "closed-form:gaussian"
    np.testing.assert_allclose(L, sq, rtol=1e-5)  # ||x||²/σ², σ = 1 (Appendix C.3)

    Xl, yl = logistic_data(N=500, d=3, seed=1)
    potl, datal, proxl = _setup(logistic_model, (Xl, yl), 20)
    L, kind = lipschitz_constants(potl, datal, proxl)
    assert kind == "closed-form:bernoulli-logit"
    np.testing.assert_allclose(L, 0.25 * np.sum(np.asarray(Xl, np.float64) ** 2, 1), rtol=1e-5)

    rng = np.random.default_rng(0)
    Xp = np.concatenate([np.ones((300, 1)), 0.5 * rng.normal(size=(300, 2))], 1)
    yp = rng.poisson(np.exp(Xp @ np.array([0.5, 0.3, -0.2])))
    potp, datap, proxp = _setup(poisson_model, (jnp.asarray(Xp, jnp.float32),
                                                jnp.asarray(yp, jnp.float32)), 20)
    L, kind = lipschitz_constants(potp, datap, proxp)
    assert kind == "closed-form:poisson"
    La, kind = lipschitz_constants(potp, datap, proxp, method="autodiff")
    assert kind == "autodiff-estimate"
    # the autodiff estimate is max over θ̂ and 8 draws of ||∇²f_i(θ)||₂ = exp(x_iᵀθ)||x_i||²:
    # the same points (seed 0, spread 1.5, as lipschitz_constants) in closed form
    ws = 1.5 * np.asarray(jax.random.normal(jax.random.PRNGKey(0), (8, 3), proxp.centre.dtype))
    pts = np.concatenate([np.asarray(proxp.centre)[None],
                          np.asarray(proxp.centre) + ws @ np.asarray(proxp.scale_tril).T])
    expect = np.max(np.exp(Xp @ pts.T), 1) * np.sum(Xp**2, 1)
    np.testing.assert_allclose(La, expect, rtol=1e-4)
    assert np.all(L >= La * (1 - 1e-5))  # a bound on the ball, above the sampled Hessians


def test_errors(linreg):
    _, _, pot, data, proxy = linreg
    with pytest.raises(ValueError, match="control variate"):
        configure_estimator("uniform", pot, data, proxy, adaptive=True)
    with pytest.raises(ValueError, match="v0 must be"):
        configure_estimator("cv", pot, data, proxy, adaptive=True, v0=-1.0)
    with pytest.raises(ValueError, match="lipschitz"):
        configure_estimator("cv", pot, data, proxy, adaptive=True, v0=1.0,
                            lipschitz=np.ones(3))
    with pytest.raises(ValueError, match="n_min"):
        configure_estimator("cv", pot, data, proxy, adaptive=True, v0=1.0, n_min=100)
    with pytest.raises(ValueError, match="Unknown option.*v0.*n_min"):
        configure_estimator("cv", pot, data, proxy, adaptive=True, pilot_step=3)
    with pytest.raises(ValueError, match="Unknown option.*weights"):
        configure_estimator("cv", pot, data, proxy, adaptive=True, weights="approx")
    with pytest.raises(ValueError, match="static weights"):
        configure_estimator("cv-preferential", pot, data, proxy, adaptive=True,
                            weights="exact")


@pytest.mark.slow
def test_adaptive_unbiased_and_below_threshold(linreg):
    """At a fixed θ the bucket is fixed: the estimate is unbiased (|mean − full| < 4 SE), and
    its pseudo-variance (Eq. 6) is below V0 whenever Eq. 19 (not the n_max clip) chose the
    size; for ASGLD-CV (uniform buckets) and ASGLD-CV-PS (alias-table buckets)."""
    _, _, pot, data, proxy = linreg
    ws = jnp.array([[0.3, -0.2, 0.1, 0.2], [1.0, -1.0, 0.5, 0.8], [2.0, 1.0, -1.5, 1.0]])
    thetas = proxy.centre + ws @ proxy.scale_tril.T
    full = np.asarray(jax.vmap(
        lambda t: value_grad_hessian(pot, t, data, hessian=False)[1])(thetas[:2]), np.float64)
    draws = 3000
    keys = jax.random.split(jax.random.PRNGKey(5), draws)
    for name in ("cv", "cv-preferential"):
        est = configure_estimator(name, pot, data, proxy, subsample_size=64, adaptive=True,
                                  v0="proxy")
        v0 = est.info["v0"]

        @jax.jit
        def run(params, keys, thetas, data, estimate=est.estimate):
            sizes = jax.vmap(lambda t: estimate(params, keys[0], t, data)[1])(thetas)
            g = jax.vmap(lambda t: jax.vmap(
                lambda k: estimate(params, k, t, data)[0])(keys))(thetas[:2])
            return sizes, g

        sizes, g = run(est.params, keys, thetas, data)
        sizes, g = np.asarray(sizes), np.asarray(g, np.float64)
        assert sizes[0] < sizes[1] <= sizes[2] <= 64, (name, sizes)
        se = g.std(1) / np.sqrt(draws)
        assert np.all(np.abs(g.mean(1) - full) < 4 * se + 1e-4 * np.abs(full)), name
        pv = np.mean(np.sum((g - full[:, None]) ** 2, -1), 1)
        assert sizes[1] < 64 and np.all(pv < v0), (name, pv, v0)


@pytest.mark.slow
@pytest.mark.parametrize("name,v0", [("cv", "proxy"), ("cv-preferential", "pilot")])
def test_adaptive_accuracy_and_data_passes(linreg, name, v0):
    """Same tolerance as the fixed-n tests (conjugate posterior, sd units), average n_t below
    n_max, sampling data passes at least a fifth below the fixed-n chain's T·n_max/N, and
    below it also with the pilot's passes counted."""
    X, y, _, _, proxy = linreg
    mean, sd = linreg_exact(X, y)
    n_max, steps = 64, 4000
    kernel = SGLD(linreg_model, estimator=name, proxy=proxy, adaptive=True, v0=v0,
                  pilot_steps=100)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=steps, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), X, y, subsample_size=n_max,
             extra_fields=("subsample_size", "data_passes"))
    b = np.asarray(mcmc.get_samples()["beta"], np.float64)
    ex = mcmc.get_extra_fields()
    err = (b.mean(0) - mean) / sd
    ratio = b.std(0) / sd
    assert np.all(np.abs(err) < 0.3), err
    assert np.all((ratio > 0.75) & (ratio < 1.3)), ratio
    n_t = np.asarray(ex["subsample_size"])
    assert n_t.mean() < 0.8 * n_max and n_t.max() <= n_max and len(np.unique(n_t)) > 2
    passes = float(ex["data_passes"][-1] - ex["data_passes"][0])
    np.testing.assert_allclose(passes, n_t[1:].sum() / X.shape[0], rtol=1e-3)
    fixed = (steps - 1) * n_max / X.shape[0]  # the fixed-n chain's sampling passes
    assert passes < 0.8 * fixed  # the adaptive size saves a fifth of them at least
    assert passes + kernel.preprocessed.estimator.info["data_passes"] < fixed  # with its pilot
