"""Failed proxy fits are detected and reported by site, with a remedy; good fits stay silent."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import logistic_data, logistic_model

from numpyro_subsample import ModelData, ProxyFitWarning, build_potential
from numpyro_subsample.compare.timing import CompileTimer
from numpyro_subsample.proxies import chain_check, fit_laplace, fit_variational
from numpyro_subsample.proxies.chain_check import CHAIN_PASSES, chain_moments
from numpyro_subsample.proxies.checks import MAX_AXES, coordinate_labels, excursion_axes


def _potential(model, *args, **kwargs):
    data = ModelData.from_args(args, kwargs)
    return build_potential(model, data, jax.random.PRNGKey(0)), data


def weak_prior_logistic(X, y=None, subsample_size=100):
    beta = numpyro.sample("beta", dist.Normal(0.0, 100.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def product_model(y, subsample_size=100):
    """y ~ N(a·b, 1): a saddle at a = b = 0 between the modes ±(a, b) with a·b ≈ ȳ."""
    a = numpyro.sample("a", dist.Normal(0.0, 10.0))
    b = numpyro.sample("b", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(a * b, 1.0), obs=y[idx])


def centred_groups(g, y, num_groups, subsample_size=100):
    """Centred hierarchical logistic model: its joint density is unbounded as tau → 0."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=theta[g[idx]]), obs=y[idx])


@pytest.fixture(scope="module")
def logistic():
    return _potential(logistic_model, *logistic_data())


def test_coordinate_labels_follow_the_flat_layout():
    pot, _ = _potential(centred_groups, jnp.zeros(200, jnp.int32), jnp.zeros(200), num_groups=3)
    labels = coordinate_labels(pot)
    assert labels == ("mu", "tau", "theta[0]", "theta[1]", "theta[2]")
    flat = pot.unravel(jnp.arange(5.0))
    assert [labels[int(i)] for i in np.asarray(flat["theta"])] == [
        "theta[0]", "theta[1]", "theta[2]"]


def test_separable_data_under_weak_prior_warns_with_site_and_remedy():
    """Separable data (a margin around x₁ = 0), N(0, 100²) prior: the mode is held by the prior
    only, the Laplace proxy is ~25 sds wide where the posterior ends at a wall; the default
    step size measured under that proxy was ~1e-10 (the chain did not move)."""
    rng = np.random.default_rng(0)
    X = np.concatenate([np.ones((2000, 1)), rng.normal(size=(2000, 2))], 1).astype(np.float32)
    X[:, 1] += np.sign(X[:, 1])
    y = (X[:, 1] > 0).astype(np.float32)
    pot, data = _potential(weak_prior_logistic, jnp.asarray(X), jnp.asarray(y))
    with pytest.warns(ProxyFitWarning, match="much wider than the posterior") as record:
        proxy = fit_laplace(pot, data, jax.random.PRNGKey(1), store_datum_grads=False)
    (message,) = [str(w.message) for w in record if "wider" in str(w.message)]
    assert message.split(" along ")[1].startswith("'beta[1]'")  # the separating coefficient
    for remedy in ("stronger prior", "proxy='variational'", "separation"):
        assert remedy in message
    assert proxy.info["axis_excursions"].max() > 1e3


def test_indefinite_hessian_error_names_the_sites():
    """Between the modes ±(a, b) of y ~ N(a·b, 1) the curvature is indefinite wherever a·b and
    ȳ have opposite signs; the data are chosen so that the start lies there, and the optimiser
    is stopped before it leaves."""
    pot, _ = _potential(product_model, jnp.zeros(1000))
    a0, b0 = np.asarray(pot.init_theta)
    y = np.random.default_rng(1).normal(-0.5 * np.sign(a0 * b0), 1.0, 1000)
    pot, data = _potential(product_model, jnp.asarray(y.astype(np.float32)))
    with pytest.raises(ValueError, match="not positive definite") as err:
        fit_laplace(pot, data, jax.random.PRNGKey(1), learning_rate=1e-6, max_newton_steps=0)
    message = str(err.value)
    assert "negative curvature load on '" in message  # on both, about equally near (0, 0)
    assert "'a' (" in message and "'b' (" in message and "proxy='variational'" in message


def _centred_groups_potential():
    """``centred_groups`` on 1000 rows in 5 groups whose effects barely differ (group sd
    0.1): the group scale's posterior sits near zero."""
    rng = np.random.default_rng(0)
    g = rng.integers(0, 5, 1000)
    y = (rng.uniform(size=1000) < 1 / (1 + np.exp(-rng.normal(0, 0.1, 5)[g]))).astype(np.float32)
    return _potential(centred_groups, jnp.asarray(g, jnp.int32), jnp.asarray(y),
                      num_groups=5)


def test_centred_hierarchical_scale_at_zero_names_tau():
    pot, data = _centred_groups_potential()
    with pytest.raises(ValueError, match="boundary of the support of 'tau'") as err:
        fit_laplace(pot, data, jax.random.PRNGKey(1))
    assert "hierarchical scale at zero" in str(err.value)
    assert "proxy='variational'" in str(err.value)
    assert "AdaptationOptions(proxy=None)" in str(err.value)


def test_laplace_stopped_early_warns_with_sites(logistic):
    pot, data = logistic
    with pytest.warns(ProxyFitWarning, match="did not reach the mode") as record:
        proxy = fit_laplace(pot, data, jax.random.PRNGKey(1), learning_rate=1e-4,
                            max_newton_steps=0, store_datum_grads=False)
    message = str(record[0].message)
    assert "max_newton_steps=0" in message and "'beta[" in message
    assert not proxy.info["converged"] and proxy.info["newton_decrement"] > 1


def test_good_laplace_fit_is_silent(logistic):
    pot, data = logistic
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        proxy = fit_laplace(pot, data, jax.random.PRNGKey(1))
    assert proxy.info["converged"] and proxy.info["newton_decrement"] < 1e-3
    assert proxy.info["warnings"] == []
    assert np.all(np.abs(np.log(proxy.info["chain_sd_ratio"])) < np.log(1.5))
    assert np.all(np.abs(proxy.info["chain_shift"]) < 1.0), proxy.info["chain_shift"]


def test_good_variational_fit_is_silent(logistic):
    pot, data = logistic
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        proxy = fit_variational(pot, data, jax.random.PRNGKey(1))
    assert proxy.info["converged"] and proxy.info["warnings"] == []
    assert np.all(np.abs(np.log(proxy.info["stein_ratio"])) < np.log(2)), proxy.info["stein_ratio"]
    assert proxy.info["pareto_k"] < 0.5
    assert np.all(np.abs(np.log(proxy.info["chain_sd_ratio"])) < np.log(1.5))
    assert np.all(np.abs(proxy.info["chain_shift"]) < 1.0), proxy.info["chain_shift"]


def test_variational_with_few_steps_warns_with_sites(logistic):
    pot, data = logistic
    with pytest.warns(ProxyFitWarning, match="SVI stopped at max_steps=250") as record:
        fit_variational(pot, data, jax.random.PRNGKey(1), max_steps=250)
    message = str(record[0].message)
    assert "'beta[" in message and "Pass a larger max_steps" in message


def test_variational_collapsed_scale_warns_with_sites(logistic):
    """A guide whose sds are 30 times too small (hand-set parameters: a collapsed scale, as
    NumPyro's SVI at too large a learning rate leaves it): the ratio of diag E_q[∇²f] (Stein)
    to the guide's diag Σ⁻¹, 0.75-1.1 for the converged fit, drops to about 1/900."""
    pot, data = logistic
    good = fit_variational(pot, data, jax.random.PRNGKey(1))
    params = dict(good.info["guide_params"])
    params["auto_scale_tril"] = params["auto_scale_tril"] / 30.0
    with pytest.warns(ProxyFitWarning) as record:
        proxy = fit_variational(pot, data, jax.random.PRNGKey(0), guide=good.info["guide"],
                                guide_params=params)
    (message,) = [str(w.message) for w in record if "variances are far" in str(w.message)]
    assert "'beta[" in message and "smaller learning_rate" in message
    assert np.all(proxy.info["stein_ratio"] < 0.1)


def test_variational_mean_off_warns_with_sites(logistic):
    """A guide whose mean is 3 sds off along beta[2] (hand-set parameters): the Newton step
    Σ E_q[∇f] of the Stein check names it; a good fit's steps are within 0.2 sd."""
    pot, data = logistic
    good = fit_variational(pot, data, jax.random.PRNGKey(1))
    assert np.all(np.abs(good.info["stationary_offsets"]) < 0.2), good.info["stationary_offsets"]
    params = dict(good.info["guide_params"])
    sd = np.sqrt(np.diag(np.asarray(good.info["guide_cov"])))
    params["auto_loc"] = params["auto_loc"].at[2].add(3 * sd[2])
    with pytest.warns(ProxyFitWarning, match="mean is not stationary") as record:
        proxy = fit_variational(pot, data, jax.random.PRNGKey(1), guide=good.info["guide"],
                                guide_params=params)
    message = next(str(w.message) for w in record if "not stationary" in str(w.message))
    assert message.index("'beta[2]'") < message.index("SVI stopped short")
    assert abs(proxy.info["stationary_offsets"][2] + 3) < 0.5, proxy.info["stationary_offsets"]


@pytest.mark.fast_compile
def test_variational_funnel_warns_far_from_posterior_naming_tau():
    """The centred hierarchical model whose Laplace fit is refused (tau at zero): the Gaussian
    guide satisfies its own stationarity conditions but collapses into the funnel (NUTS:
    log tau 3 sds higher, sds 15 times wider); the importance weights' Pareto k̂ (> 1) says
    so, naming tau."""
    pot, data = _centred_groups_potential()
    with pytest.warns(ProxyFitWarning, match="far from the posterior") as record:
        proxy = fit_variational(pot, data, jax.random.PRNGKey(1))
    message = next(str(w.message) for w in record if "far from" in str(w.message))
    assert message.index("'tau'") < message.index("correlation") and "LocScaleReparam" in message
    assert proxy.info["pareto_k"] > 0.7


def barely_differing_groups(g, x, y, groups, subsample_size=200):
    """Centred normal model whose groups barely differ; HalfNormal(1) group scale."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]] + b * x[i], sigma), obs=y[i])


def _barely_differing_potential(groups=50, tau=0.02, seed=902):
    """50 groups of 2 to ~800 rows (1800 in all), true group sd 0.02 against a noise sd of 1."""
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(np.exp(rng.normal(3.5, 0.9, groups))), 2, 800).astype(int)
    g = np.repeat(np.arange(groups), sizes)
    rng.shuffle(g)
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.3 + tau * rng.normal(size=groups)
    y = (a[g] + 0.5 * x + rng.normal(size=g.size)).astype(np.float32)
    return _potential(barely_differing_groups, jnp.asarray(g), jnp.asarray(x), jnp.asarray(y),
                      groups=groups)


def test_variational_funnel_the_weights_miss_is_found_by_the_chains():
    """A guide collapsed into the funnel's neck whose importance weights look fine: q's log
    tau is -5.4 where full-data NUTS (2 × 5000 draws) has -3.17 ± 0.61, and q's sds are
    several times too small; the Pareto k̂ of p/q stays below 0.7 (q's draws all lie where
    p/q is smooth), the Stein checks pass, and the chain check's chains spread out of the
    neck."""
    pot, data = _barely_differing_potential()
    with pytest.warns(ProxyFitWarning, match="short MALA chains") as record:
        proxy = fit_variational(pot, data, jax.random.PRNGKey(1))
    assert proxy.info["pareto_k"] < 0.7  # the weights alone would have been silent
    assert [m for m in proxy.info["warnings"] if "MALA" not in m] == []
    message = next(str(w.message) for w in record if "MALA" in str(w.message))
    assert "neck of a funnel" in message and "SGHMC(model)" in message
    assert float(pot.unravel(proxy.centre)["tau"]) < -4.5  # collapsed: NUTS -3.17 ± 0.61
    assert np.max(proxy.info["chain_sd_ratio"]) > 3, proxy.info["chain_sd_ratio"]


def test_laplace_fit_at_a_hierarchical_joint_mode_is_found_by_the_chains():
    """The joint mode of a centred hierarchy (group sd 0.3) puts log tau at -1.49 where
    full-data NUTS (2 × 5000 draws) has -1.11 ± 0.13: the Hessian there is positive definite
    and the mode's own checks pass, while the chains move over 1.5 proxy sds from it."""
    pot, data = _barely_differing_potential(tau=0.3)
    with pytest.warns(ProxyFitWarning, match="The Laplace proxy is far from the posterior"):
        proxy = fit_laplace(pot, data, jax.random.PRNGKey(1))
    assert [m for m in proxy.info["warnings"] if "MALA" not in m] == []
    assert float(pot.unravel(proxy.centre)["tau"]) < -1.4  # NUTS: -1.11 ± 0.13
    assert np.max(np.abs(proxy.info["chain_shift"])) > 1.5


def test_the_chain_check_runs_by_default_up_to_its_row_limit(monkeypatch):
    """Above MAX_CHAIN_CHECK_ROWS rows the fits leave the chain check out unless asked (its
    202 full-data passes grow with N): the Laplace fit at the hierarchical joint mode of the
    test above is then silent and 202 passes cheaper, and check_chain=True finds it."""
    limit = chain_check.MAX_CHAIN_CHECK_ROWS
    assert chain_check.runs_chain_check(None, limit)
    assert not chain_check.runs_chain_check(None, limit + 1)
    assert chain_check.runs_chain_check(True, 10 * limit)
    assert not chain_check.runs_chain_check(False, 1)
    pot, data = _barely_differing_potential(tau=0.3)
    monkeypatch.setattr(chain_check, "MAX_CHAIN_CHECK_ROWS", pot.num_data - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = fit_laplace(pot, data, jax.random.PRNGKey(1))
    assert quiet.info["chain_sd_ratio"] is None
    with pytest.warns(ProxyFitWarning, match="The Laplace proxy is far from the posterior"):
        asked = fit_laplace(pot, data, jax.random.PRNGKey(1), check_chain=True)
    assert asked.num_data_passes == pytest.approx(quiet.num_data_passes + CHAIN_PASSES)


@pytest.mark.fast_compile
def test_chains_recover_a_gaussian_posterior_and_see_a_narrow_q(logistic):
    """On the logistic model (posterior close to Gaussian), MALA chains started at the Laplace
    fit's draws and moved in its whitened coordinates keep its moments (sd ratio within 0.7-1.4,
    means within 0.6 sd); with q's sds 4 times too small they spread to over twice q's sd."""
    pot, data = logistic
    laplace = fit_laplace(pot, data, jax.random.PRNGKey(1))
    sd = np.sqrt(np.diag(np.asarray(laplace.cov)))
    for shrink, check in ((1.0, lambda r: np.all(np.abs(np.log(r)) < np.log(1.4))),
                          (0.25, lambda r: np.all(r > 2.0))):
        offset, chain_sd, acceptance = chain_moments(pot, laplace.centre,
                                                     shrink * laplace.scale_tril,
                                                     jax.random.PRNGKey(3), data)
        ratio = np.asarray(chain_sd) / (shrink * sd)
        assert check(ratio), (shrink, ratio)
        assert 0.4 < float(acceptance) < 0.8, acceptance
        assert np.all(np.abs(np.asarray(offset)) / sd < 0.6), offset


def test_excursion_axes_keep_the_extreme_sds_in_high_dimension():
    sd = np.random.default_rng(0).permutation(300).astype(float)
    axes = excursion_axes(sd)
    assert len(axes) == MAX_AXES and np.all(np.diff(axes) > 0)
    assert set(sd[axes]) == set(range(MAX_AXES // 2)) | set(range(300 - MAX_AXES // 2, 300))
    np.testing.assert_array_equal(excursion_axes(sd[:MAX_AXES]), np.arange(MAX_AXES))


def test_newton_pass_measures_the_excursions_in_the_same_program():
    """f, ∇f equal value_grad_hessian's, and ∇²f with the excursions off (with them on, the
    data terms' Hessian is not computed: the prior's alone); with the excursions on, each rise
    is f(θ + s e_k) − f(θ) (prior included), with them off zeros; one compiled program serves
    both (the switch is an argument)."""
    from numpyro_subsample.core.datapass import value_grad_hessian
    from numpyro_subsample.proxies.checks import excursion_points, newton_pass

    X, y = logistic_data(N=700, d=3, seed=2)
    pot, data = _potential(logistic_model, X, y)
    theta = pot.init_theta + 0.1
    coords, steps = excursion_points(np.asarray([0.2, 0.3, 0.5]), np.asarray([0, 2]))
    np.testing.assert_array_equal(coords, [0, 2, 0, 2])
    np.testing.assert_allclose(steps, [0.2, 0.5, -0.2, -0.5])
    args = (pot, theta, jnp.asarray(coords), jnp.asarray(steps, theta.dtype))
    on = newton_pass(*args, jnp.asarray(True), data, 256)
    with CompileTimer() as ct:
        off = newton_pass(*args, jnp.asarray(False), data, 256)
    assert "newton_pass" not in ct.programs
    f, g, h = value_grad_hessian(pot, theta, data, 256)
    for a, b in ((on.value, f), (on.grad, g), (off.value, f), (off.grad, g), (off.hessian, h)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(on.hessian, jax.hessian(pot.prior)(theta, data), rtol=1e-6)
    np.testing.assert_allclose(on.prior_grad, jax.grad(pot.prior)(theta, data), rtol=1e-6)
    assert on.rises.shape == (2, 2) and not np.any(np.asarray(off.rises))
    for j, (k, s) in enumerate(zip(coords, steps, strict=True)):
        moved = value_grad_hessian(pot, theta.at[k].add(s), data, 256, hessian=False)[0]
        np.testing.assert_allclose(on.rises.reshape(-1)[j], moved - f, rtol=2e-3, atol=2e-3)


def test_curvature_reuses_the_laplace_hessian():
    """A Laplace proxy carries ∇²f(θ̂) in ``info["hessian"]``; the step rule's curvature at
    pilot draws then needs no data pass and equals the one measured by a Hessian pass."""
    from numpyro_subsample.sgmcmc.curvature import measured_curvature

    X, y = logistic_data(N=2000, d=4, seed=3)
    pot, data = _potential(logistic_model, X, y)
    proxy = fit_laplace(pot, data, jax.random.PRNGKey(0), store_datum_grads=False)
    h = proxy.info["hessian"]
    np.testing.assert_allclose(np.linalg.inv(h), proxy.cov, rtol=1e-3, atol=1e-7)
    draws = np.asarray(proxy.centre) + 0.5 * np.random.default_rng(0).standard_normal(
        (5, pot.dim)) @ np.asarray(proxy.scale_tril).T
    wide = proxy._replace(scale_tril=2.0 * proxy.scale_tril)  # μ ≈ 4, above the floor of 1
    given = wide._replace(info={**proxy.info, "draws": draws})
    measured = wide._replace(info={"draws": draws})
    mu_given, passes_given, _ = measured_curvature(given, pot, data, chunk_size=256)
    mu_measured, passes_measured, _ = measured_curvature(measured, pot, data, chunk_size=256)
    assert (passes_given, passes_measured) == (0.0, 1.0)
    assert 3.0 < mu_measured < 5.0
    np.testing.assert_allclose(mu_given, mu_measured, rtol=1e-4)
