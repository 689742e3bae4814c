"""Stratified (clustering-based) subsampling of Fu and Zhang (2023): design, estimators, SGLD
accuracy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import linreg_data, linreg_exact, linreg_model
from numpyro.infer import MCMC

from numpyro_subsample import SGLD, strata_of
from numpyro_subsample.core.datapass import value_grad_hessian
from numpyro_subsample.core.potential import ModelData, build_potential
from numpyro_subsample.estimators.registry import configure_estimator
from numpyro_subsample.estimators.stratified import (
    allocate_batch_sizes,
    make_strata,
    stratified_design,
)
from numpyro_subsample.proxies.laplace import fit_laplace

N, n = 2000, 500


@pytest.fixture(scope="module")
def linreg():
    X, y = linreg_data(N, 4, seed=3)
    data = ModelData.from_args((X, y), {"subsample_size": n})
    pot = build_potential(linreg_model, data, jax.random.PRNGKey(0))
    proxy = fit_laplace(pot, data, jax.random.PRNGKey(1), check_chain=False)
    return X, y, pot, data, proxy


def test_allocation_follows_eq14_and_bounds():
    sizes = np.array([1000, 500, 30, 5, 2000])
    spreads = np.array([1.0, 4.0, 100.0, 0.0, 0.25])
    b = allocate_batch_sizes(sizes, spreads, 200)
    assert b.sum() == 200 and np.all(b >= 1) and np.all(b <= sizes)
    assert b[3] == 1  # zero spread: the minimum
    ideal = 200 * sizes * np.sqrt(spreads) / np.sum(sizes * np.sqrt(spreads))
    free = (b > 1) & (b < sizes)
    assert np.all(np.abs(b[free] - ideal[free]) < 2.5)
    # a stratum whose ideal share exceeds its size is taken whole, the rest redistributed
    b2 = allocate_batch_sizes(np.array([10, 1000]), np.array([1e6, 1.0]), 100)
    assert b2.tolist() == [10, 90]
    with pytest.raises(ValueError, match="num_strata"):
        allocate_batch_sizes(np.array([5, 5, 5]), np.ones(3), 2)


def test_draws_distinct_within_strata_and_uniform():
    rng = np.random.default_rng(0)
    groups = ((0, 40), (5, 25), (10, 7))
    feats = np.concatenate([rng.normal(c, 0.1, size=(m, 2)) for c, m in groups])
    strata = make_strata(feats, 3, 20)
    assert sorted(strata.sizes.tolist()) == [7, 25, 40]
    design = stratified_design(strata, jnp.float32)
    draw = jax.jit(jax.vmap(design.draw, in_axes=(None, 0)))
    idx, w = draw(design.params, jax.random.split(jax.random.PRNGKey(0), 4000))
    idx, w = np.asarray(idx), np.asarray(w)
    labels = strata.labels
    counts = np.zeros(feats.shape[0])
    for row in idx:
        assert len(set(row.tolist())) == row.size  # without replacement
        np.add.at(counts, row, 1)
    assert np.all(np.bincount(labels[idx[0]], minlength=3) == strata.batch_sizes)
    # inclusion probability b_j / n_j for every datum; weights n_j / b_j
    p = (strata.batch_sizes / strata.sizes)[labels]
    se = np.sqrt(4000 * p * (1 - p)) + 1e-9
    assert np.all(np.abs(counts - 4000 * p) < 5 * se)
    np.testing.assert_allclose(w[0], (strata.sizes / strata.batch_sizes)[labels[idx[0]]], rtol=1e-6)


@pytest.mark.parametrize("method", ["loop", "sort"])
def test_floyd_draw_every_subset_equally_likely(method):
    """Exact law of the within-stratum draw (Floyd's algorithm, loop and loop-free forms): each
    of the C(n_j, b_j) subsets has frequency 1/C(n_j, b_j) within 5 SE; a full stratum
    (b_j = n_j) is taken whole; members are read through a shuffled CSR layout."""
    from itertools import combinations

    from numpyro_subsample.estimators.stratified import Strata

    sizes, b = np.array([5, 6, 3, 40]), np.array([2, 3, 3, 4])
    labels = np.repeat(np.arange(4), sizes)
    perm = np.random.default_rng(0).permutation(labels.size)  # plate index -> shuffled ids
    labels = labels[np.argsort(perm)]
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    strata = Strata(labels, order, starts, sizes, b, np.ones(4), 0.0, 0.0)
    design = stratified_design(strata, jnp.float32, draw_method=method)
    draws = 40_000
    idx = np.asarray(jax.jit(jax.vmap(design.draw, in_axes=(None, 0)))(
        design.params, jax.random.split(jax.random.PRNGKey(3), draws))[0])
    off = np.concatenate([[0], np.cumsum(b)])
    for j in range(4):
        block = np.sort(idx[:, off[j]:off[j + 1]], axis=1)
        assert np.all(labels[block] == j) and np.all(np.diff(block, axis=1) > 0)
        if j == 3:  # inclusion frequency b_j / n_j for every member of the large stratum
            counts = np.bincount(block.ravel(), minlength=labels.size)[order[starts[3]:]]
            p = b[3] / sizes[3]
            assert np.all(np.abs(counts - draws * p) < 5 * np.sqrt(draws * p * (1 - p)))
            continue
        subsets = list(combinations(order[starts[j]:starts[j] + sizes[j]].tolist(), b[j]))
        freq = {tuple(sorted(c)): 0 for c in subsets}
        for row in map(tuple, block.tolist()):
            freq[row] += 1  # KeyError if a row were not one of the subsets
        p = 1 / len(subsets)
        f = np.array(list(freq.values()))
        assert np.all(np.abs(f - draws * p) <= 5 * np.sqrt(draws * p * (1 - p))), f


@pytest.mark.parametrize("name", ["stratified", "cv-stratified"])
def test_unbiased(linreg, name):
    _, _, pot, data, proxy = linreg
    est = configure_estimator(name, pot, data, proxy, num_strata=8)
    st = strata_of(est)
    assert st.batch_sizes.sum() == n and st.sizes.sum() == N
    theta = proxy.centre + proxy.scale_tril @ jnp.array([1.5, -1.0, 0.5, 2.0])
    full = np.asarray(value_grad_hessian(pot, theta, data, hessian=False)[1])
    keys = jax.random.split(jax.random.PRNGKey(7), 2000)
    batched = jax.jit(jax.vmap(est.estimate, in_axes=(None, 0, None, None)))
    gs = np.asarray(batched(est.params, keys, theta, data)[0])
    se = gs.std(0) / np.sqrt(gs.shape[0])
    assert np.all(np.abs(gs.mean(0) - full) < 4 * se + 1e-6 * np.abs(full)), (gs.mean(0), full, se)


def clustered_logistic(X, y=None, subsample_size=100):
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def test_pseudo_variance_below_uniform_on_clustered_data():
    rng = np.random.default_rng(1)
    centres = rng.normal(0, 3, size=(6, 3))
    Xc = centres[rng.integers(0, 6, size=N)] + 0.3 * rng.normal(size=(N, 3))
    X = np.concatenate([np.ones((N, 1)), Xc], 1).astype(np.float32)
    y = (rng.uniform(size=N) < 1 / (1 + np.exp(-X @ np.array([0.2, 0.5, -0.5, 0.3])))).astype(
        np.float32
    )
    X, y = jnp.asarray(X), jnp.asarray(y)
    data = ModelData.from_args((X, y), {"subsample_size": 60})
    pot = build_potential(clustered_logistic, data, jax.random.PRNGKey(0))
    proxy = fit_laplace(pot, data, jax.random.PRNGKey(1), check_chain=False)
    keys = jax.random.split(jax.random.PRNGKey(2), 2000)

    def pseudo_variance(est, theta):  # E‖Lᵀ(ĝ − ∇f)‖², Putcha et al. (2023) Eq. (6), whitened
        batched = jax.jit(jax.vmap(est.estimate, in_axes=(None, 0, None, None)))
        gs = batched(est.params, keys, theta, data)[0] @ proxy.scale_tril
        return float(jnp.sum(jnp.var(gs, axis=0)))

    uniform = configure_estimator("uniform", pot, data, proxy)
    strat = configure_estimator("stratified", pot, data, proxy)  # default: gradients, k = 10
    by_x = configure_estimator("stratified", pot, data, proxy, features=np.asarray(X[:, 1:]))
    cv = configure_estimator("cv", pot, data, proxy)
    cv_strat = configure_estimator("cv-stratified", pot, data, proxy)
    # user features (the covariates, as in the paper): each stratum lies in one true cluster
    true = np.argmin(((np.asarray(X[:, 1:])[:, None] - centres) ** 2).sum(-1), 1)
    st = strata_of(by_x)
    assert all(len(np.unique(true[st.labels == j])) == 1 for j in range(st.sizes.shape[0]))
    for u in (jnp.zeros(4), jnp.array([1.0, -1.0, 1.0, 0.5])):
        theta = proxy.centre + proxy.scale_tril @ u
        pv_u = pseudo_variance(uniform, theta)
        assert pseudo_variance(strat, theta) < 0.5 * pv_u
        pv_cs, pv_cv = pseudo_variance(cv_strat, theta), pseudo_variance(cv, theta)
        # at the centre (u = 0) both residuals vanish: only float32 rounding is left
        assert pv_cs < pv_cv or max(pv_cs, pv_cv) < 1e-9 * pv_u, (pv_cs, pv_cv, pv_u)


def test_bad_options(linreg):
    _, _, pot, data, proxy = linreg
    with pytest.raises(ValueError, match="num_strata"):
        configure_estimator("stratified", pot, data, proxy, num_strata=n + 1)
    with pytest.raises(ValueError, match="features must have shape"):
        configure_estimator("stratified", pot, data, proxy, features=np.zeros((N - 1, 2)))
    with pytest.raises(ValueError, match="NaN"):
        configure_estimator("stratified", pot, data, proxy, features=np.full((N, 2), np.nan))
    with pytest.raises(ValueError, match="proxy"):
        configure_estimator("stratified", pot, data, None)
    with pytest.raises(ValueError, match="Unknown option.*num_strata"):
        configure_estimator("cv-stratified", pot, data, proxy, num_stratas=3)
    with pytest.raises(ValueError, match="draw_method"):
        configure_estimator("stratified", pot, data, proxy, draw_method="fast")


@pytest.mark.slow
def test_sgld_stratified_exact_linreg(linreg):
    """SGLD with the stratified estimator vs the exact posterior: |mean error| < 0.1 sd,
    sd ratio within 10%."""
    X, y, _, _, proxy = linreg
    kernel = SGLD(linreg_model, estimator="stratified", proxy=proxy, num_strata=20)
    mcmc = MCMC(kernel, num_warmup=50, num_samples=5000, num_chains=8, thinning=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=n)
    mean, sd = linreg_exact(X, y)
    beta = np.asarray(mcmc.get_samples()["beta"], np.float64)
    err, ratio = (beta.mean(0) - mean) / sd, beta.std(0) / sd
    assert np.all(np.abs(err) < 0.1), err
    assert np.all(np.abs(ratio - 1) < 0.1), ratio
    assert strata_of(kernel).batch_sizes.sum() == n


def test_compiled_estimate_is_keyed_by_the_batch_sizes(linreg):
    """Equal static configurations (same b_j) share one estimate function, so compiled code is
    reused; different b_j give a different function (never compiled code with wrong sizes)."""
    X, _, pot, data, proxy = linreg
    feats = np.asarray(X[:, 1:])
    a = configure_estimator("stratified", pot, data, proxy, num_strata=4, features=feats)
    b = configure_estimator("stratified", pot, data, proxy, num_strata=4, features=feats)
    c = configure_estimator("stratified", pot, data, proxy, num_strata=5, features=feats)
    assert a.estimate is b.estimate
    assert tuple(strata_of(a).batch_sizes) != tuple(strata_of(c).batch_sizes)
    assert a.estimate is not c.estimate
