"""ZV above MAX_ZV_COVARIATES parameters: the gradient covariates (a dense p × p fit) are
refused, degree 1 switches to one linearised covariate per function (u_i = ∇g_i(θ̄)ᵀ Σ̂ ŝ,
:mod:`numpyro_subsample.estimators.zv`), in the loop and on stored draws.

Known answers: the conjugate Gaussian model with d = MAX_ZV_COVARIATES + 1 independent means
(exact posterior mean ȳ·N/(N+1), sd (N+1)^(-1/2)); the covariates' mean zero under exact
posterior draws and the exact gradient, for a nonlinear g and an arbitrary θ̄ and Σ̂.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from numpyro_subsample import SGLD, RunDiagnosticsWarning, ZVOptions, to_arviz, zv_fit, zv_summary
from numpyro_subsample.estimators.zv import (
    MAX_ZV_COVARIATES,
    ZVPairedStats,
    check_covariates,
    covariate_choice,
    linearised_covariates,
)

pytestmark = pytest.mark.fast_compile

D = MAX_ZV_COVARIATES + 1
N = 20


def test_check_covariates_bounds_and_message():
    check_covariates(MAX_ZV_COVARIATES, 1)  # at the limit: allowed
    with pytest.raises(ValueError, match=r"p = 2001 covariates.*MAX_ZV_COVARIATES=2000"
                                         r".*covariates='linearised'"):
        check_covariates(MAX_ZV_COVARIATES + 1, 1)


def test_covariate_choice():
    assert covariate_choice("auto", 1, MAX_ZV_COVARIATES) == "gradient"
    assert covariate_choice("auto", 1, MAX_ZV_COVARIATES + 1) == "linearised"
    assert covariate_choice("linearised", 1, 3) == "linearised"
    assert covariate_choice("auto", 2, 10**5) == "gradient"  # then refused by its size check
    with pytest.raises(ValueError, match="reduction of degree 1"):
        covariate_choice("linearised", 2, 3)
    with pytest.raises(ValueError, match="covariates must be one of"):
        covariate_choice("diagonal", 1, 3)


def test_linearised_covariates_by_hand_and_mean_zero():
    """u = J_g(θ̄) Σ̂ ŝ against jacfwd, and E[u] = 0 over exact draws of a Gaussian posterior
    with the exact score, for a nonlinear g, θ̄ off the mode and a Σ̂ unrelated to Σ."""
    d, M = 5, 200_000
    rng = np.random.default_rng(0)
    A = rng.normal(size=(d, d))
    Sigma = A @ A.T / d + np.eye(d)
    mu = rng.normal(size=d)
    B = rng.normal(size=(d, d))
    Sigma_hat = B @ B.T / d + 0.5 * np.eye(d)
    centre = mu + rng.normal(size=d)

    def g(th):
        return jnp.stack([jnp.exp(0.3 * th[0]) * th[1], th[2] ** 2, jnp.sin(th[3]) + th[4]])

    theta = rng.multivariate_normal(mu, Sigma, size=M)
    score = -(theta - mu) @ np.linalg.inv(Sigma)  # ∇ log π, exact
    with jax.enable_x64():
        centre = jnp.asarray(centre)
        direction = jnp.asarray(score @ Sigma_hat)
        u = np.asarray(linearised_covariates(g, jnp.asarray(centre), direction))
        J = np.asarray(jax.jacfwd(g)(jnp.asarray(centre)))
    assert u.shape == (M, 3)
    np.testing.assert_allclose(u[:3], np.asarray(direction[:3]) @ J.T, rtol=1e-10, atol=1e-12)
    z = u.mean(0) / (u.std(0) / np.sqrt(M))
    assert np.all(np.abs(z) < 4.5), z


def wide_model(y=None):
    """d = MAX_ZV_COVARIATES + 1 independent means, one data plate."""
    mu = numpyro.sample("mu", dist.Normal(0, 1).expand([D]).to_event(1))
    numpyro.deterministic("mu_sum", mu[:3].sum())
    with numpyro.plate("data", y.shape[0], subsample_size=10) as idx:
        numpyro.sample("y", dist.Normal(mu, 1).to_event(1), obs=y[idx])


@pytest.fixture(scope="module")
def wide():
    """Streamed (auto: linearised) and stored ZV of one run of the wide model."""
    y = jnp.asarray(np.random.default_rng(1).normal(0.5, 1.0, size=(N, D)), jnp.float32)
    kernel = SGLD(wide_model, zv=ZVOptions(), progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=1000, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), y=y, extra_fields=("grad",))
    exact_mean = np.asarray(y).sum(0) / (N + 1)
    return mcmc, exact_mean, (N + 1) ** -0.5


def test_wide_model_streams_linearised_statistics_without_a_square_array(wide):
    mcmc, exact, sd = wide
    stats = mcmc.last_state.zv_stats
    assert isinstance(stats, ZVPairedStats)
    m = 2 * (D + 1)  # default g: every coordinate of mu and mu_sum, and their squares
    assert all(np.shape(x) in ((2,), (2, m)) for x in stats), [np.shape(x) for x in stats]
    res = zv_fit(mcmc, degree=1, mode="stream")
    zv, raw = np.asarray(res.mean["first"]["mu"]), np.asarray(res.raw_mean["first"]["mu"])
    err_zv, err_raw = np.abs(zv - exact) / sd, np.abs(raw - exact) / sd
    # 2000 draws: the raw means are ~0.1 sd off in the worst of 2001 coordinates; the
    # linearised ZV removes most of it (the posterior is the Gaussian the proxy fits).
    assert err_zv.max() < 0.02 and err_zv.max() * 3 < err_raw.max(), (err_zv.max(),
                                                                       err_raw.max())
    vr = np.asarray(res.variance_reduction["first"]["mu"])  # NaN: g̃ exactly constant
    assert np.nanmedian(vr) > 30, np.nanmedian(vr)
    # the deterministic site is linear in θ too
    assert abs(float(res.mean["first"]["mu_sum"]) - exact[:3].sum()) < 0.02 * sd * 3


def test_wide_model_stored_draws_match_the_stream(wide):
    mcmc, exact, sd = wide
    stored = zv_fit(mcmc, degree=1, mode="stored")
    stream = zv_fit(mcmc, degree=1, mode="stream")
    assert np.asarray(stored.beta).shape == (2 * (D + 1),)
    np.testing.assert_allclose(np.asarray(stored.mean["first"]["mu"]),
                               np.asarray(stream.mean["first"]["mu"]), atol=2e-3 * sd)
    # a user function of the constrained sample, and per chain with cross-fitting
    res = zv_fit(mcmc, lambda z: z["mu"][:10] * z["mu"][10:20], degree=1, by_chain=True,
                 cross_fit=True)
    truth = exact[:10] * exact[10:20]  # independent coordinates: E[x y] = E[x] E[y]
    assert np.asarray(res.mean).shape == (2, 10)
    assert np.max(np.abs(np.asarray(res.mean) - truth) / sd) < 0.1
    with pytest.raises(ValueError, match="p = 2001 covariates"):
        zv_fit(mcmc, degree=1, mode="stored", covariates="gradient")
    with pytest.raises(ValueError, match="linearised covariates; pass covariates='linearised'"):
        zv_fit(mcmc, degree=1, mode="stream", covariates="gradient")


@pytest.mark.slow
def test_wide_model_arviz_group_and_summary(wide):
    mcmc, exact, sd = wide
    with warnings.catch_warnings():  # 2000 SGLD draws: min ESS < 100 over 2001 coordinates
        warnings.simplefilter("ignore", RunDiagnosticsWarning)
        idata = to_arviz(mcmc, zv=True)
    zv = idata.zv_posterior["mu"].sel(zv_stat="mean").values
    assert np.max(np.abs(zv - exact) / sd) < 0.02
    table = zv_summary(idata)  # read from the group: the idata alone has no preconditioner
    assert abs(table.loc["mu[0]", "zv_mean"] - zv[0]) < 1e-9
    del idata["zv_posterior"]
    with pytest.raises(ValueError, match="pass the MCMC run"):
        zv_fit(idata, degree=1)


def test_degree2_and_gradient_streaming_refused_before_the_fit(monkeypatch):
    from numpyro_subsample.proxies import choice
    from numpyro_subsample.sgmcmc import preprocess

    def no_fit(*args, **kwargs):
        raise AssertionError("the proxy was fitted before the ZV check")

    monkeypatch.setattr(choice, "fit_structured", no_fit)
    monkeypatch.setattr(preprocess, "fit_laplace", no_fit)
    y = jnp.zeros((N, D))
    kernel = SGLD(wide_model, zv=ZVOptions(covariates="gradient"), progress_bar=False)
    with pytest.raises(ValueError, match="MAX_ZV_COVARIATES"):
        kernel.preprocess((), {"y": y})
    kernel = SGLD(wide_model, zv=ZVOptions(degree=2), progress_bar=False)
    with pytest.raises(ValueError, match="MAX_ZV_DEGREE2_DIM"):
        kernel.preprocess((), {"y": y})
    with pytest.raises(ValueError, match="covariates"):
        SGLD(wide_model, zv=ZVOptions(covariates="diagonal"))
