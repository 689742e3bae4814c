"""The SG kernels with a structured (matrix-free) proxy: accuracy, no d × d array, the choice.

Known answers: the conjugate linear regression (exact posterior), dense references computed
from the structured L made explicit (small d), eigh. Tolerances are justified where they
appear.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import linreg_data, linreg_exact, linreg_model

import numpyro_subsample.proxies.choice as choice_module
import numpyro_subsample.sgmcmc.preprocess as kernel_module
from numpyro_subsample import (
    MCMC,
    SGHMC,
    SGLD,
    AdaptationOptions,
    DistributedSGLD,
    NoiseOptions,
    Proxy,
    ZVOptions,
    to_arviz,
    zv_mean,
)
from numpyro_subsample.core.potential import ModelData, build_potential
from numpyro_subsample.estimators.base import GradientEstimator
from numpyro_subsample.estimators.lipschitz import lipschitz_constants
from numpyro_subsample.estimators.noise import (
    NoiseLimitedStepWarning,
    noise_points,
    warn_if_noise_limited,
    whitened_noise,
)
from numpyro_subsample.estimators.noise_covariance import (
    exact_whitened_covs,
    monte_carlo_whitened_covs,
)
from numpyro_subsample.estimators.noise_matrix_free import NoiseOperator
from numpyro_subsample.estimators.preferential import hessian_weights
from numpyro_subsample.estimators.registry import configure_estimator
from numpyro_subsample.proxies.covariance import scale_matvec
from numpyro_subsample.proxies.lanczos import lanczos_eigh
from numpyro_subsample.proxies.structured import StructuredProxy, fit_structured
from numpyro_subsample.proxies.whitening import whiten_matvec, whiten_rmatvec, whiten_solve
from numpyro_subsample.sgmcmc.pilot_structured import WhitenedHessian, adapted_structured

# compilation takes most of these tests' time: most XLA optimisations off (conftest.py)
pytestmark = pytest.mark.fast_compile

D = 6  # the conjugate model's dimension


@pytest.fixture(scope="module")
def linreg():
    X, y = linreg_data(N=5000, d=D, seed=3)
    return X, y, linreg_exact(X, y)


@pytest.fixture(scope="module")
def small_fit(linreg):
    """A low-rank (k = 2) proxy of the conjugate model and its L as a dense matrix."""
    X, y, _ = linreg
    data = ModelData.from_args((X, y), {"subsample_size": 100})
    pot = build_potential(linreg_model, data, jax.random.PRNGKey(0))
    sp = fit_structured(pot, data, jax.random.PRNGKey(1), structure="low-rank", rank=2,
                        chunk_size=1024, num_epochs=0)
    eye = jnp.eye(D, dtype=sp.centre.dtype)
    L = jax.vmap(lambda e: scale_matvec(sp.cov_op, e), out_axes=1)(eye)
    return pot, data, sp, L


def _dense(x):
    return np.asarray(x, np.float64)


# --- the whitening abstraction and the matrix-free noise ----------------------------------------


def test_whitening_dispatch_matches_the_explicit_square_root(small_fit):
    """The same L applied through the structured operator and as a dense matrix (the dense
    branch is the code of the dense path); batched and single vectors."""
    _, _, sp, L = small_fit
    op = sp.cov_op
    x = jax.random.normal(jax.random.PRNGKey(2), (3, D))
    tol = dict(rtol=1e-5, atol=1e-5)
    for batch in (x, x[0]):
        np.testing.assert_allclose(whiten_matvec(op, batch), whiten_matvec(L, batch), **tol)
        np.testing.assert_allclose(whiten_rmatvec(op, batch), whiten_rmatvec(L, batch), **tol)
        np.testing.assert_allclose(whiten_solve(op, whiten_matvec(op, batch)), batch, **tol)
    # the dense solve is triangular: checked on a Cholesky factor
    tril = jnp.linalg.cholesky(L @ L.T)
    np.testing.assert_allclose(whiten_solve(tril, whiten_matvec(tril, x)), x, **tol)


@pytest.mark.parametrize("name", ["cv", "cv-stratified", "cv-preferential", "uniform"])
def test_lanczos_noise_equals_the_dense_covariance(small_fit, name):
    """With d Lanczos iterations (the whole Krylov space) the largest Ritz value of the mean
    noise covariance equals eigh of the dense mean over the same proxy draws (float32 sums
    over N = 5000 data: 1e-4 relative); the stratified case has groups (Σ_g c_g U_g U_gᵀ), the
    preferential one per-datum weights a_i, the uniform one no control variate."""
    pot, data, sp, L = small_fit
    est = configure_estimator(name, pot, data, sp, rng_key=jax.random.PRNGKey(3),
                              num_strata=4) if name == "cv-stratified" else (
        configure_estimator(name, pot, data, sp))
    key = jax.random.PRNGKey(4)
    got = whitened_noise(est, sp.centre, sp.cov_op, key, data, chunk_size=1024,
                         lanczos_iterations=D)
    assert got.cov is None and got.exact and got.points.shape == (9, D)
    thetas = noise_points(sp.centre, L, key, 9)
    np.testing.assert_allclose(got.points, thetas, rtol=1e-5, atol=1e-5)
    covs = exact_whitened_covs(est, thetas[1:], L, data, chunk_size=1024)
    ref = np.linalg.eigvalsh(covs.mean(0))
    np.testing.assert_allclose(got.largest, ref[-1], rtol=1e-4)
    np.testing.assert_allclose(np.sort(got.ritz_values), ref, rtol=1e-3, atol=1e-4 * ref[-1])
    assert got.data_passes == 8 * 2 * D  # two passes per Lanczos iteration and draw


def test_monte_carlo_fallback_uses_the_gram_matrix(small_fit):
    """Without second moments: the top eigenvalue of the mean sample covariance, from the
    (P·K)² Gram matrix, equals the dense (d, d) one from the same draws."""
    pot, data, sp, L = small_fit
    est = configure_estimator("cv", pot, data, sp)._replace(moments=None)
    key = jax.random.PRNGKey(5)
    got = whitened_noise(est, sp.centre, sp.cov_op, key, data, num_draws=8)
    assert not got.exact
    thetas = noise_points(sp.centre, L, key, 9)[1:]
    covs = monte_carlo_whitened_covs(est, thetas, L, jax.random.fold_in(key, 1), data, 8)
    np.testing.assert_allclose(got.largest, np.linalg.eigvalsh(covs.mean(0))[-1], rtol=1e-4)


def test_hutchinson_preferential_weights_match_eq16(small_fit):
    """||H_i L||_F (Putcha et al. 2023, Eq. 16) without a Hessian: for the rank-one H_i of a
    linear model each estimated weight has relative sd ≤ sqrt(1/(2M)) = 12.5% (M = 32
    probes); all within 5 sd, median error within 1 sd."""
    pot, data, sp, L = small_fit
    exact = hessian_weights(pot, data, sp.centre, L, 1024)
    est = hessian_weights(pot, data, sp.centre, sp.cov_op, 1024, jax.random.PRNGKey(6))
    rel = np.abs(est / exact - 1)
    assert np.all(rel < 0.625) and np.median(rel) < 0.125, (rel.max(), np.median(rel))
    assert not np.allclose(est, exact, rtol=1e-3)  # an estimate, not the dense formula


def test_lipschitz_closed_form_works_and_autodiff_is_refused(small_fit):
    """Gaussian linear model: L_i = ||x_i||² (σ = 1) with a structured proxy too; the autodiff
    estimate (per-datum d × d Hessians) is refused."""
    pot, data, sp, _ = small_fit
    L, kind = lipschitz_constants(pot, data, sp, chunk_size=1024)
    X = _dense(data.arrays[0])
    assert kind == "closed-form:gaussian"
    np.testing.assert_allclose(L, np.sum(X**2, 1), rtol=1e-5)
    with pytest.raises(ValueError, match="not supported with a structured proxy"):
        lipschitz_constants(pot, data, sp, method="autodiff")


def test_noise_limited_advice_for_saga_and_svrg():
    """SAGA and SVRG already use control variates: the advice is not 'use estimator=cv'."""
    for name in ("saga", "svrg", "uniform"):
        est = GradientEstimator(estimate=None, params=None, name=name, subsample_size=10,
                                num_data=1000)
        with pytest.warns(NoiseLimitedStepWarning) as rec:
            warn_if_noise_limited(est, 500.0, 1e-6)  # v·n/N = 5: a proxy that matches
        msg = str(rec[0].message)
        assert "far from the posterior" not in msg
        if name == "uniform":
            assert "estimator='cv'" in msg
        else:
            assert "estimator='cv'" not in msg and "already uses control variates" in msg


def test_noise_limited_advice_when_the_proxy_is_far_from_the_posterior():
    """v·n/N far above the proxy's whitened curvature: the gradients at the proxy's draws say
    the proxy does not describe the posterior, and the advice says so (with the figures)
    instead of control variates; just below the threshold, or with a curvature that explains the
    noise, the usual advice."""
    est = GradientEstimator(estimate=None, params=None, name="uniform", subsample_size=100,
                            num_data=1077)
    with pytest.warns(NoiseLimitedStepWarning) as rec:
        warn_if_noise_limited(est, 1.62e4, 6e-6, curvature=3.06)  # the digits BNN's figures
    msg = str(rec[0].message)
    assert "far from the posterior" in msg and "v·n/N = 1.5e+03" in msg and "μ = 3.06" in msg
    assert "estimator='cv'" not in msg
    for noise, mu in ((0.99 * 10 * 3.06 * 1077 / 100, 3.06), (1.62e4, 200.0)):
        with pytest.warns(NoiseLimitedStepWarning) as rec:
            warn_if_noise_limited(est, noise, 6e-6, curvature=mu)
        assert "far from the posterior" not in str(rec[0].message)
        assert "estimator='cv'" in str(rec[0].message)


# --- (a) accuracy on the conjugate model -----------------------------------------------------


@pytest.mark.parametrize(
    "cls,proxy,estimator",
    [
        (SGLD, "diagonal", "cv"),
        (SGLD, "low-rank", "cv-preferential"),
        (SGHMC, "diagonal", "cv-stratified"),
        (SGHMC, "low-rank", "cv"),
    ],
)
def test_structured_proxy_matches_exact_posterior(linreg, cls, proxy, estimator):
    """Means within 0.15 posterior sd, sds within 10% (8 chains × 4000 draws; ESS ≳ 1100 for
    SGLD, so the Monte Carlo sd of a mean is ≲ 0.03 sd, of an sd ≲ 2.5%, and the default step
    inflates the variance by ≤ 5%, the sd by ≤ 2.5%). Low-rank with k = 2 < d − 1. Runs
    through numpyro_subsample.MCMC (its run checks stay silent), to_arviz and
    print_summary; the SGHMC low-rank run streams degree-1 ZV statistics."""
    X, y, (mean, sd) = linreg
    zv = cls is SGHMC and proxy == "low-rank"
    kwargs = {"proxy_kwargs": {"rank": 2}} if proxy == "low-rank" else {}
    kernel = cls(linreg_model, estimator=estimator, proxy=proxy,
                 zv=ZVOptions() if zv else None, **kwargs)
    mcmc = MCMC(kernel, num_warmup=300, num_samples=4000, num_chains=8,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no run-check, noise or proxy warning
        mcmc.run(jax.random.PRNGKey(0), X, y)
    assert isinstance(kernel.proxy, StructuredProxy)
    assert kernel.proxy.info["structure"] == proxy
    assert kernel.noise_correction is False and kernel.preprocessed.noise_cov is None
    beta = _dense(mcmc.get_samples()["beta"])
    err, ratio = (beta.mean(0) - mean) / sd, beta.std(0) / sd
    assert np.all(np.abs(err) < 0.15), err
    assert np.all(np.abs(ratio - 1) < 0.1), ratio
    assert mcmc.run_check is not None and mcmc.run_check.ok
    idata = to_arviz(mcmc)
    assert idata.posterior["beta"].shape == (8, 4000, D)
    assert idata.sample_stats.attrs["step_size"] == pytest.approx(kernel.step_size)
    mcmc.print_summary()
    if zv:  # Baker et al. (2019): degree-1 ZV is nearly exact on a Gaussian posterior
        zmean = np.asarray(zv_mean(mcmc)["beta"], np.float64)
        assert np.all(np.abs(zmean - mean) / sd < 0.03), (zmean - mean) / sd


# --- (b) d > MAX_DENSE_DIM: no d × d array ---------------------------------------------------


def wide_model(X, y=None, subsample_size=60):
    """Linear regression with d = X.shape[1] coefficients, prior N(0, 1), noise sd 1."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, 1.0), obs=y[idx])


def _avals(jaxpr):
    """Every abstract value of a jaxpr and of its sub-jaxprs (scan, while, cond, pjit, ...)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    out = [v.aval for v in (*jaxpr.invars, *jaxpr.constvars, *jaxpr.outvars)]
    for eqn in jaxpr.eqns:
        out += [v.aval for v in eqn.outvars]
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    out += _avals(sub)
    return out


def _square(jaxpr, d):
    """Shapes with two dimensions ≥ d (a d × d array or larger)."""
    return [a.shape for a in _avals(jaxpr)
            if sum(s >= d for s in getattr(a, "shape", ())) >= 2]


def test_the_jaxpr_check_finds_a_dense_factor():
    """The check has power: the dense path's Lᵀg holds a (d, d) array."""
    d = 7
    jx = jax.make_jaxpr(lambda L, g: whiten_rmatvec(L, g))(jnp.eye(d), jnp.ones(d))
    assert _square(jx, d) == [(d, d), (d, d)]


@pytest.mark.parametrize("adapt", [None, False])
def test_wide_model_runs_without_a_square_array(monkeypatch, adapt):
    """d > MAX_DENSE_DIM (lowered to 200: the same code path as above 2000, at d = 300 > N =
    250, so that only a d × d array has two dimensions ≥ d): the default proxy is low-rank
    (k = 10 here, Fisher curvature: one pass for its diagonal); preprocessing and 300 steps
    run, and no array with two dimensions ≥ d appears in the preprocessed arrays, the chain's
    init and step, or the Lanczos program of the noise; with the default adapted
    preconditioner (``adapt=None``) and with the measured-noise step rule (False)."""
    monkeypatch.setattr(kernel_module, "MAX_DENSE_DIM", 200)
    monkeypatch.setattr(choice_module, "MAX_DENSE_DIM", 200)
    d, N = 300, 250
    rng = np.random.default_rng(0)
    X = jnp.asarray((3 * rng.normal(size=(N, d)) / np.sqrt(d)).astype(np.float32))
    y = jnp.asarray((X @ rng.normal(size=d) + rng.normal(size=N)).astype(np.float32))
    kernel = SGLD(wide_model, proxy_kwargs={"rank": 10, "curvature": "fisher"},
                  chunk_size=125, adaptation=AdaptationOptions(preconditioner=adapt))
    mcmc = MCMC(kernel, num_warmup=100, num_samples=200, progress_bar=False, check=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    pre = kernel.preprocessed
    assert isinstance(pre.proxy, StructuredProxy) and pre.proxy.info["rank"] == 10
    assert kernel.noise_correction is False and pre.params.noise_scale is None
    # no group scale: the structured pilot does not run (pre.proxy is the fit)
    measured = adapt is False or adapted_structured(pre.proxy)
    assert pre.proxy.kind == "structured"
    assert np.isfinite(pre.noise) == measured and 0 < pre.step_size < 1
    assert (mcmc.last_state.adapt is None) == measured
    beta = np.asarray(mcmc.get_samples()["beta"])
    assert beta.shape == (200, d) and np.all(np.isfinite(beta))
    assert not np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))
    big = [x.shape for x in jax.tree.leaves(pre.params) if sum(s >= d for s in x.shape) >= 2]
    assert big == []
    data = ModelData.from_args((X, y), {})
    init_one, step, params = kernel._programs(pre, num_warmup=100, traced=False)
    assert _square(jax.make_jaxpr(init_one)(jax.random.PRNGKey(1), None, data, params), d) == []
    state = mcmc.last_state
    assert _square(jax.make_jaxpr(step)(state, data), d) == []
    est = pre.estimator
    thetas = jnp.stack([pre.centre] * 8)
    designs = jax.lax.map(lambda t: est.moments.design(est.params, t, data), thetas)

    def noise_program(operand, key):
        op = NoiseOperator(moments=est.moments, chunk_size=125)
        return lanczos_eigh(op, operand, key, d, 1, 20)

    jx = jax.make_jaxpr(noise_program)((est.params, thetas, designs, pre.scale_tril, data),
                                       jax.random.PRNGKey(2))
    assert _square(jx, d) == []
    if adapt is None:  # the pilot's whitened curvature, matrix-free too
        jx = jax.make_jaxpr(lambda operand, key: lanczos_eigh(
            WhitenedHessian(pre.potential, 125), operand, key, d, 1, 12))(
            (pre.centre, data, pre.proxy.cov_op), jax.random.PRNGKey(3))
        assert _square(jx, d) == []


# --- (c) the automatic choice, (d) refusals ----------------------------------------------------


def test_default_proxy_is_dense_below_and_low_rank_above_max_dense_dim(linreg, monkeypatch):
    X, y, _ = linreg
    dense = SGLD(linreg_model).preprocess((X, y), {})  # d = 6 ≤ MAX_DENSE_DIM = 2000
    assert isinstance(dense.proxy, Proxy) and dense.noise_corrected
    assert dense.noise_cov.shape == (D, D)
    monkeypatch.setattr(kernel_module, "MAX_DENSE_DIM", D - 1)
    monkeypatch.setattr(choice_module, "MAX_DENSE_DIM", D - 1)
    kernel = SGLD(linreg_model)
    assert kernel.noise_correction is True  # as requested, until d is known
    pre = kernel.preprocess((X, y), {})
    assert isinstance(pre.proxy, StructuredProxy)
    assert pre.proxy.info["structure"] == "low-rank" and pre.proxy.info["rank"] == D - 1
    # the Hessian with a Hutchinson diagonal (the exact one costs d HVPs per datum)
    assert pre.proxy.info["curvature"] == "hessian"
    assert pre.proxy.info["diagonal"] == "hutchinson"
    fisher = SGLD(linreg_model, proxy_kwargs={"curvature": "fisher"}).preprocess((X, y), {})
    assert fisher.proxy.info["curvature"] == "fisher"
    assert kernel.noise_correction is False and pre.noise_cov is None
    assert pre.params.noise_scale is None
    # DistributedSGLD keeps the dense proxy (it has its own preprocessing)
    assert DistributedSGLD(linreg_model, num_shards=1)._proxy_choice(10**6) == "laplace"


def _no_fit(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the proxy was fitted before the bad input was reported")

    monkeypatch.setattr(choice_module, "fit_structured", fail)
    monkeypatch.setattr(kernel_module, "fit_laplace", fail)


def test_refusals_name_the_argument(linreg, small_fit, monkeypatch):
    X, y, _ = linreg
    sp = small_fit[2]
    for proxy in ("diagonal", "low-rank", sp):
        with pytest.raises(ValueError, match=r"NoiseOptions\(correction=True\) .*structured proxy"):
            SGHMC(linreg_model, proxy=proxy, noise=NoiseOptions(correction=True))
    with pytest.raises(ValueError, match="proxy must be 'laplace', 'variational', 'diagonal'"):
        SGLD(linreg_model, proxy="dense")
    with pytest.raises(ValueError, match="supported by SGLD, SGHMC and SGNHT, not by "
                                         "DistributedSGLD"):
        DistributedSGLD(linreg_model, num_shards=1, proxy="low-rank")
    _no_fit(monkeypatch)
    monkeypatch.setattr(kernel_module, "MAX_DENSE_DIM", D - 1)
    monkeypatch.setattr(choice_module, "MAX_DENSE_DIM", D - 1)
    with pytest.raises(ValueError, match=r"NoiseOptions\(correction=True\) .*MAX_DENSE_DIM"):
        SGLD(linreg_model, noise=NoiseOptions(correction=True)).preprocess((X, y), {})
    with pytest.raises(ValueError, match=r"proxy_kwargs \['max_newton_steps'\]"):
        SGLD(linreg_model, proxy_kwargs={"max_newton_steps": 3}).preprocess((X, y), {})
    monkeypatch.setattr(kernel_module, "MAX_ZV_DEGREE2_DIM", D - 1)
    with pytest.raises(ValueError, match=r"ZVOptions\(degree=2\) .*MAX_ZV_DEGREE2_DIM"):
        SGLD(linreg_model, proxy="diagonal", zv=ZVOptions(degree=2)).preprocess(
            (X, y), {})


def test_adaptive_with_autodiff_lipschitz_is_refused_with_a_structured_proxy(linreg,
                                                                               small_fit):
    X, y, _ = linreg
    kernel = SGLD(linreg_model, proxy=small_fit[2], estimator="cv", adaptive=True,
                  lipschitz="autodiff", v0=1.0)
    with pytest.raises(ValueError, match="not supported with a structured proxy"):
        kernel.preprocess((X, y), {})
