"""Preferential subsampling (Putcha, Nemeth and Fearnhead 2023, Sect. 3): alias draws,
unbiasedness, Fig. 1 ordering of pseudo-variances, posterior accuracy of SGLD-PS and
SGLD-CV-PS."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import importance_moments, linreg_data, linreg_exact, linreg_model
from numpyro.infer import MCMC
from sklearn.datasets import make_classification

from numpyro_subsample import (
    SGLD,
    ModelData,
    build_potential,
    configure_estimator,
    fit_laplace,
)
from numpyro_subsample.core.datapass import datum_values_and_grads, value_grad_hessian
from numpyro_subsample.estimators.alias import alias_draw, build_alias_table
from numpyro_subsample.estimators.base import control_variate_from_proxy, weighted_gradient
from numpyro_subsample.estimators.preferential import analytic_pseudo_variance
from numpyro_subsample.post.diagnostics import estimator_pseudo_variance

# compilation takes most of these tests' time: most XLA optimisations off (conftest.py)
pytestmark = pytest.mark.fast_compile

# -- models of Putcha et al. (2023) Sect. 5.1 (priors as in Appendix C) ------------------------
SIGMA_X = np.array([[1e5, 6e4], [6e4, 2e5]], np.float32)


def gaussian2_model(x, subsample_size=10):
    theta = numpyro.sample("theta", dist.Normal(0.0, np.sqrt(1e3)).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("x", dist.MultivariateNormal(theta, SIGMA_X), obs=x[idx])


def logistic10_model(X, y=None, subsample_size=10):
    beta = numpyro.sample("beta", dist.Normal(0.0, np.sqrt(10.0)).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def _classification(N, weights, seed, leverage_rows=0):
    X, y = make_classification(
        n_samples=N, n_features=4, n_informative=3, n_redundant=1, weights=weights,
        random_state=seed, class_sep=1.0,
    )
    X = (X - X.mean(0)) / X.std(0)
    if leverage_rows:
        rng = np.random.default_rng(seed)
        X[:leverage_rows] *= rng.uniform(8.0, 12.0, size=(leverage_rows, 1))
    X = np.concatenate([np.ones((N, 1)), X], 1).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y.astype(np.float32))


def _setup(model, args, n, seed=0):
    data = ModelData.from_args(args, {"subsample_size": n})
    pot = build_potential(model, data, jax.random.PRNGKey(seed))
    proxy = fit_laplace(pot, data, jax.random.PRNGKey(seed + 1), check_chain=False)
    return pot, data, proxy


@pytest.fixture(scope="module")
def imbalanced_leverage():
    """Imbalanced (95/5) logistic regression, d = 5, with 5 high-leverage rows."""
    X, y = _classification(2000, [0.05], seed=3, leverage_rows=5)
    pot, data, proxy = _setup(logistic10_model, (X, y), 20)
    return X, y, pot, data, proxy


def test_alias_table_realises_the_law():
    rng = np.random.default_rng(0)
    p = rng.gamma(0.3, size=500) + 1e-9
    p /= p.sum()
    table = build_alias_table(p)
    np.testing.assert_allclose(np.asarray(table.probs), p, rtol=2e-5, atol=1e-12)
    idx = np.asarray(jax.jit(lambda k: alias_draw(table, k, 400_000))(jax.random.PRNGKey(1)))
    freq = np.bincount(idx, minlength=p.size) / idx.size
    se = np.sqrt(p * (1 - p) / idx.size)
    big = p * idx.size > 20  # normal approximation of the counts
    assert np.max(np.abs(freq - p)[big] / se[big]) < 5.0
    assert np.sum(freq[~big] * idx.size) < 5 * max(1.0, np.sum(p[~big]) * idx.size)


def test_bad_user_weights_and_replace(imbalanced_leverage):
    _, _, pot, data, proxy = imbalanced_leverage
    w = np.ones(pot.num_data)
    w[7] = 0.0
    with pytest.raises(ValueError, match="strictly positive.*index 7"):
        configure_estimator("preferential", pot, data, proxy, subsample_size=20, weights=w)
    with pytest.raises(ValueError, match="length N"):
        configure_estimator("preferential", pot, data, proxy, subsample_size=20,
                            weights=np.ones(3))
    with pytest.raises(ValueError, match="replace=True"):
        configure_estimator("cv-preferential", pot, data, proxy, subsample_size=20,
                            replace=False)
    with pytest.raises(ValueError, match="control variate"):
        configure_estimator("preferential", pot, data, proxy, subsample_size=20, adaptive=True)
    with pytest.raises(ValueError, match="Unknown option.*weights.*uniform_mix"):
        configure_estimator("cv-preferential", pot, data, proxy, bogus=1)
    # a user array is used as given (no uniform mixing by default)
    w = np.arange(1, pot.num_data + 1, dtype=float)
    est = configure_estimator("preferential", pot, data, proxy, subsample_size=20, weights=w)
    np.testing.assert_allclose(np.asarray(est.info["probs"]), w / w.sum(), rtol=1e-4)
    # another law of the same size: the same compiled function, other arrays
    other = configure_estimator("preferential", pot, data, proxy, subsample_size=20,
                                weights=w[::-1].copy())
    assert other.estimate is est.estimate and other.params is not est.params


@pytest.mark.parametrize(
    "name,weights", [("preferential", "approx"), ("cv-preferential", "approx"),
                     ("cv-preferential", "exact")]
)
def test_unbiased(imbalanced_leverage, name, weights):
    """Average of many subsample estimates at a fixed θ equals the full gradient (< 4 SE); the
    same draws reweighted by N/n instead of 1/(n p_i) (a wrong estimator) fail that check."""
    _, _, pot, data, proxy = imbalanced_leverage
    n = 20
    est = configure_estimator(name, pot, data, proxy, subsample_size=n, weights=weights)
    theta = proxy.centre + proxy.scale_tril @ jnp.array([1.5, -1.0, 0.5, 1.0, -2.0])
    full = np.asarray(value_grad_hessian(pot, theta, data, hessian=False)[1], np.float64)
    draws = 1500 if weights == "exact" else 4000
    keys = jax.random.split(jax.random.PRNGKey(5), draws)
    cv = control_variate_from_proxy(proxy) if name == "cv-preferential" else None

    def both(params, k, data):
        g = est.estimate(params, k, theta, data)[0]
        if weights == "exact":  # the law depends on θ: no static design to reweight
            return g, g
        design = est.info["design"]
        idx, _ = design.draw(design.params, k)  # the same indices as estimate(k, θ)
        wrong = jnp.full((n,), pot.num_data / n)
        return g, weighted_gradient(pot, theta, idx, wrong, data, cv)

    batched = jax.jit(jax.vmap(both, in_axes=(None, 0, None)))
    g, g_wrong = (np.asarray(a, np.float64) for a in batched(est.params, keys, data))

    def passes(g):
        se = g.std(0) / np.sqrt(draws)
        return np.all(np.abs(g.mean(0) - full) < 4 * se + 1e-4 * np.abs(full))

    assert passes(g), (g.mean(0), full)
    if weights != "exact":
        assert not passes(g_wrong), (g_wrong.mean(0), full)


# -- Fig. 1: pseudo-variance ordering at N = 1000 ---------------------------------------------
def _fig1_setup(kind):
    if kind == "gaussian":
        rng = np.random.default_rng(0)
        x = rng.multivariate_normal([0.0, 1.0], SIGMA_X, size=1000).astype(np.float32)
        return _setup(gaussian2_model, (jnp.asarray(x),), 10)
    weights = [0.5] if kind == "balanced" else [0.05]
    return _setup(logistic10_model, _classification(1000, weights, seed=1), 10)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gaussian", "balanced", "imbalanced"])
def test_fig1_pseudo_variance_ordering(kind):
    pot, data, proxy = _fig1_setup(kind)
    n = 10
    d = proxy.centre.shape[0]
    thetas = proxy.centre + jax.random.normal(jax.random.PRNGKey(2), (10, d)) @ proxy.scale_tril.T
    names = ["uniform", "preferential", ("preferential", "exact")]
    if kind != "gaussian":  # Gaussian: CV is already optimal with uniform weights (paper)
        names += ["cv", "cv-preferential", ("cv-preferential", "exact")]
    grads_at = np.asarray(jax.vmap(lambda t: datum_values_and_grads(pot, t, data)[1])(thetas),
                          np.float64)
    pv, pv_se = {}, {}
    for spec in names:
        name, weights = (spec, "approx") if isinstance(spec, str) else spec
        opts = {} if name in ("uniform", "cv") else {"weights": weights}
        est = configure_estimator(name, pot, data, proxy, subsample_size=n, **opts)
        m, se = estimator_pseudo_variance(
            est, pot, thetas, data, num_draws=300 if weights == "approx" else 200,
            rng_key=jax.random.PRNGKey(3),
        )
        pv[spec], pv_se[spec] = m.mean(), np.sqrt(np.sum(se**2)) / m.size
        if weights == "approx":
            # the empirical value matches the closed form (Appendix A.2) at every θ
            probs = None if name in ("uniform", "cv") else np.asarray(est.info["probs"])
            grads = grads_at
            if name.startswith("cv"):
                grads = grads_at - np.asarray(proxy.datum_grads, np.float64)
            exact = np.array([analytic_pseudo_variance(g, probs, n) for g in grads])
            assert np.all(np.abs(m - exact) < 5 * se + 1e-3 * exact), (spec, m, exact, se)

    def less(a, b, factor=1.0):
        assert pv[a] < factor * pv[b] + 3 * np.hypot(pv_se[a], pv_se[b]), (kind, a, b, pv)

    less("preferential", "uniform", 0.9)
    less(("preferential", "exact"), "preferential")
    if kind != "gaussian":
        less("cv-preferential", "cv", 0.9)
        less(("cv-preferential", "exact"), "cv-preferential")


# -- posterior accuracy -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def linreg_setup():
    X, y = linreg_data(N=2000, d=4, seed=2)
    _, _, proxy = _setup(linreg_model, (X, y), 40)
    return X, y, proxy


@pytest.mark.parametrize("name,n,steps", [("preferential", 200, 4000),
                                          ("cv-preferential", 40, 4000)])
def test_accuracy_linreg_exact(linreg_setup, name, n, steps):
    X, y, proxy = linreg_setup
    mean, sd = linreg_exact(X, y)
    mcmc = MCMC(SGLD(linreg_model, estimator=name, proxy=proxy), num_warmup=0,
                num_samples=steps, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=n)
    b = np.asarray(mcmc.get_samples()["beta"], np.float64)
    err = (b.mean(0) - mean) / sd
    ratio = b.std(0) / sd
    assert np.all(np.abs(err) < 0.3), err
    assert np.all((ratio > 0.75) & (ratio < 1.3)), ratio


@pytest.mark.slow
def test_accuracy_imbalanced_logistic_high_leverage(imbalanced_leverage):
    X, y, pot, data, proxy = imbalanced_leverage
    # the exact posterior's moments by importance sampling: with an effective sample size
    # above 10^4 their Monte Carlo error is below 0.01 posterior sd
    moments, ess = importance_moments(logistic10_model, X, y, proxy=proxy)
    assert ess > 10_000, ess
    mean, sd = moments["beta"]
    for name in ("cv-preferential", "preferential"):
        n = 20 if name == "cv-preferential" else 200
        mcmc = MCMC(SGLD(logistic10_model, estimator=name, proxy=proxy), num_warmup=0,
                    num_samples=3000, progress_bar=False)
        mcmc.run(jax.random.PRNGKey(1), X, y, subsample_size=n)
        b = np.asarray(mcmc.get_samples()["beta"], np.float64)
        err, ratio = (b.mean(0) - mean) / sd, b.std(0) / sd
        assert np.all(np.abs(err) < 0.35), (name, err)
        assert np.all((ratio > 0.7) & (ratio < 1.35)), (name, ratio)
    # power: SGLD-PS with the weights N/n instead of 1/(n p_i) follows the drift of
    # F(θ) = f0(θ) + N Σ_i p_i f_i(θ); its mode is far outside the 0.35 sd tolerance
    p = configure_estimator("preferential", pot, data, proxy, subsample_size=20).info["probs"]
    idx = jnp.arange(pot.num_data)

    def wrong_f(t):
        f0, fi = pot.terms(t, idx, data)
        return f0 + pot.num_data * jnp.dot(p, fi)

    newton = jax.jit(lambda t: t - jnp.linalg.solve(jax.hessian(wrong_f)(t), jax.grad(wrong_f)(t)))
    t = proxy.centre
    for _ in range(20):
        t = newton(t)
    shift = (np.asarray(t) - mean) / sd
    assert np.max(np.abs(shift)) > 3 * 0.35, shift
