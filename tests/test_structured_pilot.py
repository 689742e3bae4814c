"""The proxy adapted on pilot chains above the dense limit (numpyro_subsample.sgmcmc.
pilot_structured), exercised on small models with the dense limit lowered."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from test_warmup import centred, grouped_data

from numpyro_subsample import SGLD, AdaptationOptions
from numpyro_subsample.core.datapass import value_grad_hessian
from numpyro_subsample.estimators.registry import configure_estimator
from numpyro_subsample.proxies import choice
from numpyro_subsample.proxies.base import ProxyFitWarning
from numpyro_subsample.proxies.covariance import (
    diag_cov,
    diag_precision,
    rescaled,
    structured_covariance,
    to_dense,
)
from numpyro_subsample.proxies.structured import StructuredProxy
from numpyro_subsample.proxies.whitening import whiten_matvec


@pytest.fixture
def structured_above_10(monkeypatch):
    """Models of more than 10 parameters get the structured proxy."""
    monkeypatch.setattr(choice, "MAX_DENSE_DIM", 10)


def test_rescaled_moves_marginal_sds_and_keeps_correlations():
    rng = np.random.default_rng(0)
    d, k = 12, 3
    basis, _ = np.linalg.qr(rng.normal(size=(d, k)))
    op = structured_covariance(jnp.asarray(rng.uniform(1, 3, d)), jnp.asarray(basis),
                               jnp.asarray(rng.uniform(-0.5, 4, k)))
    r = rng.uniform(0.3, 3.0, d)
    new = rescaled(op, jnp.asarray(r, op.diag.dtype))
    cov, cov_new = np.asarray(to_dense(op), np.float64), np.asarray(to_dense(new), np.float64)
    np.testing.assert_allclose(cov_new, np.outer(r, r) * cov, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(diag_precision(op)),
                               np.diag(np.linalg.inv(cov)), rtol=2e-4)
    np.testing.assert_allclose(np.asarray(diag_cov(new)), r**2 * np.diag(cov), rtol=2e-4)


def test_degenerate_joint_mode_above_the_dense_limit_is_adapted(structured_above_10):
    """The structured fit of a centred hierarchical model runs into the degenerate joint mode
    (the group scale shrinking to 0) and does not converge; the pilot starts from the
    mean-field fit instead, and its centre lands in the bulk, silently."""
    g, y = grouped_data()
    kernel = SGLD(centred, adaptation=AdaptationOptions(centring=False), progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pre = kernel.preprocess((g, y))
    assert not [w for w in caught if issubclass(w.category, ProxyFitWarning)]
    proxy, pot = pre.proxy, pre.potential
    assert isinstance(proxy, StructuredProxy) and proxy.kind == "adapted"
    assert proxy.info["start"] == "mean-field" and proxy.info["start_info"]["reason"]
    assert len(proxy.info["windows"]) >= 2
    assert proxy.info["rank"] >= 1  # the Hessian's at the adapted centre
    sd = np.sqrt(np.asarray(diag_cov(proxy.cov_op)))
    assert np.all(np.isfinite(sd)) and np.all(sd > 0)
    sigma_a = pot.constrain(pot.unravel(proxy.centre), pre_data(kernel))["sigma_a"]
    assert 0.05 < float(sigma_a) < 1.5


def pre_data(kernel):
    return kernel._pre_data


def _linreg_data(n=20_000, d=12, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = (X @ rng.normal(size=d) * 0.3 + rng.normal(size=n)).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)


def linreg(X, y=None, subsample_size=500):
    beta = numpyro.sample("beta", dist.Normal(0, 10).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, 1.0), obs=y[idx])


def test_structured_fit_of_a_model_without_group_scales_is_kept(structured_above_10):
    """Above the dense limit the pilot runs only for a model with a hierarchical scale."""
    X, y = _linreg_data()
    pre = SGLD(linreg, progress_bar=False).preprocess((X, y))
    proxy = pre.proxy
    assert isinstance(proxy, StructuredProxy) and proxy.kind == "structured"
    assert "windows" not in proxy.info


def test_adapted_structured_control_variate_is_unbiased(structured_above_10):
    g, y = grouped_data(seed=2)
    kernel = SGLD(centred, adaptation=AdaptationOptions(centring=False), progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre = kernel.preprocess((g, y))
    proxy, pot, data = pre.proxy, pre.potential, kernel._pre_data
    assert proxy.kind == "adapted"
    est = configure_estimator("cv", pot, data, proxy)
    theta = proxy.centre + 0.5 * whiten_matvec(proxy.cov_op, jnp.ones(pot.dim))
    exact = np.asarray(value_grad_hessian(pot, theta, data, hessian=False)[1])

    def draw(key):
        return est.estimate(est.params, key, theta, data)[0]

    draws = np.asarray(jax.vmap(draw)(jax.random.split(jax.random.PRNGKey(3), 4000)),
                       np.float64)
    se = draws.std(0) / np.sqrt(draws.shape[0]) + 1e-6 * np.abs(exact)
    assert np.all(np.abs(draws.mean(0) - exact) < 5 * se)


def _grouped(num_groups=80, seed=3):
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(np.exp(rng.normal(2.0, 1.3, num_groups))), 1, 400).astype(int)
    g = np.repeat(np.arange(num_groups), sizes)
    x = rng.normal(size=g.size)
    a = 0.3 + 0.5 * rng.normal(size=num_groups)
    y = a[g] + 0.7 * x + rng.normal(size=g.size)
    return g.astype(np.int32), x.astype(np.float32), y.astype(np.float32)


def hier_normal(g, x, y, num_groups, subsample_size=200):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfNormal(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    b = numpyro.sample("b", dist.Normal(0, 2))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]] + b * x[i], sigma), obs=y[i])


def _collapsed_reference(g, x, y, num_groups):
    """The exact posterior of (mu, tau, sigma, b) with the group effects integrated out
    (NUTS on four parameters), and the group effects' moments by Rao-Blackwellisation."""
    from numpyro.infer import MCMC as NumPyroMCMC
    from numpyro.infer import NUTS

    nj = np.bincount(g, minlength=num_groups).astype(np.float64)
    sums = {k: np.bincount(g, v, num_groups) for k, v in
            {"x": x, "y": y, "xx": x * x, "xy": x * y, "yy": y * y}.items()}

    def collapsed():
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        tau = numpyro.sample("tau", dist.HalfNormal(1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2))
        b = numpyro.sample("b", dist.Normal(0, 2))
        sr = sums["y"] - b * sums["x"] - mu * nj
        srr = (sums["yy"] - 2 * b * sums["xy"] + b * b * sums["xx"]
               - 2 * mu * (sums["y"] - b * sums["x"]) + mu * mu * nj)
        s2, t2 = sigma**2, tau**2
        numpyro.factor("y", jnp.sum(-0.5 * ((srr - t2 * sr**2 / (s2 + nj * t2)) / s2
                                            + (nj - 1) * jnp.log(s2) + jnp.log(s2 + nj * t2)
                                            + nj * jnp.log(2 * jnp.pi))))

    mcmc = NumPyroMCMC(NUTS(collapsed), num_warmup=1000, num_samples=6000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0))
    s = {k: np.asarray(v, np.float64) for k, v in mcmc.get_samples().items()}
    v = 1 / (1 / s["tau"][:, None] ** 2 + nj / s["sigma"][:, None] ** 2)
    m = v * (s["mu"][:, None] / s["tau"][:, None] ** 2
             + (sums["y"] - s["b"][:, None] * sums["x"]) / s["sigma"][:, None] ** 2)
    ref = {k: (s[k].mean(), s[k].std()) for k in s}
    ref["a"] = (m.mean(0), np.sqrt(v.mean(0) + m.var(0)))
    return ref


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["SGLD", "SGHMC"])
def test_default_kernel_above_the_dense_limit_is_right_on_a_centred_model(monkeypatch, kernel):
    """A centred hierarchical normal model (80 groups of 1 to 400 rows, HalfNormal scale)
    with the dense limit lowered below its 84 parameters: the structured fit runs into the
    degenerate joint mode, the pilot adapts the proxy, the model is sampled partially centred
    with the measured step; every site within 0.2 posterior sd of the exact posterior in mean
    and in log-sd, with no warning."""
    import numpyro_subsample as ns

    monkeypatch.setattr(choice, "MAX_DENSE_DIM", 40)
    g, x, y = _grouped()
    ref = _collapsed_reference(g, x, y, 80)
    mcmc = ns.MCMC(getattr(ns, kernel)(hier_normal), num_warmup=1000, num_samples=10_000,
                   num_chains=4, chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(1), g, x, y, 80)
    assert not [w for w in caught if issubclass(w.category, UserWarning)
                and "not enough devices" not in str(w.message)], [str(w.message) for w in caught]
    assert isinstance(mcmc.sampler.preprocessed.proxy, StructuredProxy)
    draws = {k: np.asarray(v, np.float64) for k, v in mcmc.get_samples().items()}
    for site, (mean, sd) in ref.items():
        err = np.abs(draws[site].mean(0) - mean) / sd
        log_sd = np.abs(np.log(draws[site].std(0) / sd))
        assert np.max(err) < 0.2 and np.max(log_sd) < 0.2, (site, np.max(err), np.max(log_sd))


def test_structured_curvature_is_the_top_eigenvalue_of_the_whitened_hessian():
    """μ of the step rule for an adapted structured proxy: Lanczos on Lᵀ∇²f L, against the
    dense eigenvalue (a linear regression: the Hessian is the same everywhere)."""
    from numpyro_subsample.core.data import ModelData
    from numpyro_subsample.sgmcmc.curvature import full_hessian
    from numpyro_subsample.sgmcmc.pilot_structured import structured_at, structured_curvature

    X, y = _linreg_data(n=2000)
    data = ModelData.from_args((X, y), {})
    pot = SGLD(linreg, progress_bar=False).potential_for(data)
    rng = np.random.default_rng(1)
    basis, _ = np.linalg.qr(rng.normal(size=(pot.dim, 2)))
    # a proxy about 3x too wide (precision 2000/9 against X'X ≈ 2000 I), less along two
    # directions: μ well above 1
    op = structured_covariance(jnp.asarray(np.full(pot.dim, 2000.0 / 9)), jnp.asarray(basis),
                               jnp.asarray([500.0, 100.0]))
    proxy = structured_at(pot, data, np.zeros(pot.dim), op, chunk_size=500, kind="adapted",
                          passes=0.0, info={})
    mu, passes = structured_curvature(proxy, pot, data, chunk_size=500)
    total = full_hessian(pot, proxy.centre, data, 500)
    cov = np.asarray(to_dense(op), np.float64)
    root = np.linalg.cholesky(cov)
    exact = np.linalg.eigvalsh(root.T @ np.asarray(total, np.float64) @ root)[-1]
    assert passes == 12 and exact > 1
    assert abs(mu - exact) < 1e-3 * exact


def test_mean_field_fit_matches_a_gaussian_posterior():
    """The mean-field start on a conjugate linear regression: q's mean is the posterior mean
    and its sds 1/√Λ_jj, the conditional sds of the exact Gaussian posterior (within the
    plateau rule's tolerance)."""
    from numpyro_subsample.core.potential import ModelData, build_potential
    from numpyro_subsample.proxies.variational import mean_field

    X, y = _linreg_data(n=5000)
    data = ModelData.from_args((X, y))
    pot = build_potential(linreg, data, jax.random.PRNGKey(0))
    Xd = np.asarray(X, np.float64)
    precision = Xd.T @ Xd + np.eye(Xd.shape[1]) / 100.0
    mean = np.linalg.solve(precision, Xd.T @ np.asarray(y, np.float64))
    sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    q = mean_field(pot, data, jax.random.PRNGKey(1))
    assert q.info["converged"] and q.passes > 0
    assert np.max(np.abs(q.mean - mean) / sd) < 0.5  # SVI's iterate average, not exact
    np.testing.assert_allclose(q.sd, 1.0 / np.sqrt(np.diag(precision)), rtol=0.15)


@pytest.mark.parametrize("ratio", [0.0, np.inf])
def test_kernel_keeps_the_mean_field_start_only_where_its_step_is_larger(structured_above_10,
                                                                          monkeypatch, ratio):
    """The pilot from a mean-field start returns that start beside the adapted proxy; the
    kernel measures the step at both and keeps the start only where its step exceeds the
    adapted one's by more than MEAN_FIELD_STEP_RATIO (here 0: always; inf: never)."""
    from numpyro_subsample.sgmcmc import kernel_preprocess, pilot_structured

    monkeypatch.setattr(kernel_preprocess, "MEAN_FIELD_STEP_RATIO", ratio)
    starts = []
    original = pilot_structured.variational_start

    def recorded(*args, **kwargs):
        starts.append(original(*args, **kwargs))
        return starts[-1]

    monkeypatch.setattr(pilot_structured, "variational_start", recorded)
    g, y = grouped_data()
    kernel = SGLD(centred, adaptation=AdaptationOptions(centring=False), progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre = kernel.preprocess((g, y))
    proxy = pre.proxy
    choice = proxy.info["step_choice"]
    assert proxy.kind == "adapted" and proxy.info["windows"]
    assert proxy.info["mean_field_start"] is None  # not kept beside the proxy chosen
    at_start = np.allclose(np.asarray(proxy.centre), np.asarray(starts[-1].centre))
    assert at_start == (ratio == 0.0)
    assert pre.step_size == (choice["mean_field_start"] if ratio == 0.0 else choice["adapted"])
    assert proxy.info["rank"] >= 1


def test_a_given_step_keeps_the_adapted_structured_proxy(structured_above_10, monkeypatch):
    """With step_size given there is no step to compare: the adapted proxy is kept, and the
    mean-field start's alternative (its Hessian's low-rank part) is neither computed nor held
    beside it; the preprocessing's passes by stage add up to its total."""
    from numpyro_subsample.sgmcmc import pilot_structured

    alternatives = []
    original = pilot_structured._with_low_rank

    def recorded(proxy, *args, **kwargs):
        if "mean_field" in (proxy.info or {}):
            alternatives.append(proxy)
        return original(proxy, *args, **kwargs)

    monkeypatch.setattr(pilot_structured, "_with_low_rank", recorded)
    g, y = grouped_data()
    kernel = SGLD(centred, adaptation=AdaptationOptions(centring=False), progress_bar=False,
                  step_size=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre = kernel.preprocess((g, y))
    assert pre.step_size == 0.01 and pre.proxy.kind == "adapted"
    assert pre.proxy.info["mean_field_start"] is None and "step_choice" not in pre.proxy.info
    assert alternatives == []
    stages = dict(pre.cost)
    assert sum(stages.values()) == pytest.approx(pre.data_passes)
    assert stages["proxy fit"] > 0 and stages["pilot chains"] > 0
