"""The proxy adapted by pilot chains (numpyro_subsample.sgmcmc.warmup)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.reparam import LocScaleReparam

from numpyro_subsample import SGLD, AdaptationOptions, ModelData
from numpyro_subsample.core.datapass import value_grad_hessian
from numpyro_subsample.estimators.noise import whitened_noise
from numpyro_subsample.estimators.registry import configure_estimator
from numpyro_subsample.proxies.laplace import LaplaceFitError, fit_laplace
from numpyro_subsample.sgmcmc import pilot_moments, warmup
from numpyro_subsample.sgmcmc.curvature import full_hessian
from numpyro_subsample.sgmcmc.dynamics import sgld_dynamics


def grouped_data(num_groups=20, num_data=600, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, 1.2, num_groups)
    sizes = np.maximum(1, np.floor(w / w.sum() * num_data)).astype(int)
    sizes[np.argmax(sizes)] += num_data - sizes.sum()
    g = np.repeat(np.arange(num_groups), sizes).astype(np.int32)
    a = 1.0 + 0.3 * rng.normal(size=num_groups)
    y = (a[g] + 0.8 * rng.normal(size=num_data)).astype(np.float32)
    return jnp.asarray(g), jnp.asarray(y)


def centred(g, y=None, subsample_size=100, num_groups=20):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.Uniform(0.0, 100.0))
    sigma_y = numpyro.sample("sigma_y", dist.Uniform(0.0, 100.0))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(mu, sigma_a))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(a[g[idx]], sigma_y), obs=y[idx])


def _halfnormal(g, y=None, subsample_size=100, num_groups=20):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(mu, sigma_a))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(a[g[idx]], sigma_y), obs=y[idx])


noncentred = numpyro.handlers.reparam(_halfnormal, config={"a": LocScaleReparam(0)})


def _potential(model, g, y):
    kernel = SGLD(model, progress_bar=False)
    data = ModelData.from_args((g, y), {})
    return kernel, kernel.potential_for(data), data


def _adapted(model, g, y, start=None):
    kernel, pot, data = _potential(model, g, y)
    if start is None:
        start = fit_laplace(pot, data, jax.random.PRNGKey(1), store_datum_grads=False,
                            check_chain=False)
    windows = warmup.pilot_schedule(pot.num_data, pot.plate.subsample_size)
    proxy = warmup.adapt_proxy(
        start, pot, data, jax.random.PRNGKey(2), dynamics=sgld_dynamics(),
        rule=lambda v, mu: kernel._default_step_size(v, False, mu), windows=windows,
        chunk_size=256)
    return kernel, pot, data, start, proxy


def test_degenerate_joint_mode_is_refused_by_laplace_but_runs_by_default():
    g, y = grouped_data()
    _, pot, data = _potential(centred, g, y)
    with pytest.raises(LaplaceFitError, match="sigma_a"):
        fit_laplace(pot, data, jax.random.PRNGKey(0), store_datum_grads=False, check_chain=False)
    # the model as written (the default would go on to sample it partially centred)
    kernel = SGLD(centred, adaptation=AdaptationOptions(centring=False), progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre = kernel.preprocess((g, y))
    info = pre.proxy.info
    start_info = info["start_info"] if pre.proxy.kind == "adapted" else info
    assert start_info["fallback_from"][0].startswith("laplace:")
    assert len(info["windows"]) >= 2
    sd = np.sqrt(np.diag(np.asarray(pre.proxy.cov)))
    assert np.all(np.isfinite(sd)) and np.all(sd > 0)
    # the adapted centre is inside the bulk, not at the collapsed scale (log sigma_a ≈ -13)
    sigma_a = pot.constrain(pot.unravel(pre.proxy.centre), data)["sigma_a"]
    assert 0.05 < float(sigma_a) < 1.5


def test_safe_start_adapts_without_any_fit():
    g, y = grouped_data(seed=1)
    kernel, pot, data = _potential(noncentred, g, y)
    start = warmup.safe_start(pot, data, chunk_size=256, reason="test")
    assert start.kind == "start"
    _, _, _, _, proxy = _adapted(noncentred, g, y, start=start)
    assert proxy.kind == "adapted" and len(proxy.info["windows"]) >= 1
    assert np.all(np.isfinite(np.asarray(proxy.cov)))


def test_recentred_control_variate_is_unbiased():
    g, y = grouped_data(seed=2)
    _, pot, data, _, proxy = _adapted(noncentred, g, y)
    est = configure_estimator("cv", pot, data, proxy)
    theta = proxy.centre + 0.5 * (proxy.scale_tril @ jnp.ones(pot.dim))
    exact = np.asarray(value_grad_hessian(pot, theta, data, hessian=False)[1])

    def draw(key):
        return est.estimate(est.params, key, theta, data)[0]

    keys = jax.random.split(jax.random.PRNGKey(3), 4000)
    draws = np.asarray(jax.vmap(draw)(keys), np.float64)
    se = draws.std(0) / np.sqrt(draws.shape[0]) + 1e-6 * np.abs(exact)
    assert np.all(np.abs(draws.mean(0) - exact) < 5 * se)


def test_adapted_noise_at_most_the_initial_on_a_poor_mode():
    """Non-centred hierarchical model: the joint mode is far from the bulk, so control
    variates centred there are noisier over the posterior than those of the adapted proxy."""
    g, y = grouped_data(num_groups=30, num_data=1500, seed=4)
    _, pot, data, start, proxy = _adapted(noncentred, g, y)
    assert proxy.kind == "adapted"
    key = jax.random.PRNGKey(5)
    noise = {}
    for name, centre_proxy in (("mode", start), ("adapted", proxy)):
        est = configure_estimator("cv", pot, data, centre_proxy)
        # the same points (draws of the adapted proxy) and whitening for both
        noise[name] = whitened_noise(est, proxy.centre, proxy.scale_tril, key, data,
                                     num_points=9, chunk_size=256).largest
    assert noise["adapted"] <= noise["mode"]


@pytest.mark.parametrize("num_data, subsample_size", [
    (300_000, 100), (300_000, 1000), (10**6, 1000), (10**6, 5000), (10**7, 1000),
    (10**7, 50_000), (20_000, 500), (2_561, 400), (10**6, 1250), (4 * 10**6, 35_000),
])
def test_pilot_subsamples_cost_at_most_7_passes_beyond_the_floors(num_data, subsample_size):
    """The windows' subsamples cost at most MAX_PILOT_PASSES = 7 data passes where the floors
    (2·10^6 datum evaluations, 50 steps per window) do not bind, so that with two full passes
    per window the warm-up costs at most 15; below, they cost exactly a floor."""
    windows = warmup.pilot_schedule(num_data, subsample_size)
    rows = sum(windows) * warmup.PILOT_CHAINS * subsample_size
    floors = (warmup.MIN_PILOT_ROWS <= 7 * num_data
              and 4 * warmup.MIN_WINDOW * warmup.PILOT_CHAINS * subsample_size <= 7 * num_data)
    assert len(windows) == len(warmup.DEFAULT_WINDOWS) and min(windows) >= warmup.MIN_WINDOW
    if floors:
        assert rows / num_data <= warmup.MAX_PILOT_PASSES
        assert warmup.MAX_PILOT_PASSES + 2 * len(windows) <= 15
    else:  # the larger floor, never more than the full windows
        floor_rows = max(warmup.MIN_PILOT_ROWS, warmup.MAX_PILOT_PASSES * num_data,
                         len(windows) * warmup.MIN_WINDOW * warmup.PILOT_CHAINS * subsample_size)
        full = sum(warmup.DEFAULT_WINDOWS) * warmup.PILOT_CHAINS * subsample_size
        assert rows <= min(1.05 * floor_rows, full)


def test_each_window_costs_its_subsamples_and_at_most_two_full_passes():
    """The pilot's data passes: the windows' subsamples plus at most two full passes (the
    control variates at the new centre, the Hessian) per window that moved or rescaled the
    proxy, none for a window that kept it."""
    g, y = grouped_data(num_groups=30, num_data=1500, seed=4)
    _, pot, data, start, proxy = _adapted(noncentred, g, y)
    windows = proxy.info["windows"]
    n = pot.plate.subsample_size
    subsamples = sum(w.steps for w in windows) * warmup.PILOT_CHAINS * n / pot.num_data
    changed = sum(w.moved or w.rescaled for w in windows)
    full = proxy.num_data_passes - start.num_data_passes - subsamples
    assert changed >= 1
    assert -1e-6 <= full <= 2 * changed + 1e-6, (full, changed, windows)


def test_well_fitted_proxy_is_kept_and_costs_few_passes():
    """Laplace on a near-Gaussian posterior agrees with the pilot within its Monte Carlo
    error: no window moves it, the pilot stops after two windows, and (at N = 10^5, where the
    pass budget binds rather than the 10^6-row floor for small data) its cost stays within 15
    data passes."""
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(100_000, 3)).astype(np.float32))
    y = jnp.asarray((X @ np.array([0.5, -0.2, 0.1]) + rng.normal(size=100_000))
                    .astype(np.float32))

    def linreg(X, y=None, subsample_size=500):
        beta = numpyro.sample("beta", dist.Normal(0, 10).expand([3]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ beta, 1.0), obs=y[idx])

    kernel = SGLD(linreg, progress_bar=False)
    pre = kernel.preprocess((X, y))
    windows = pre.proxy.info.get("windows")
    assert windows is not None and len(windows) == 2
    assert not any(w.moved or w.rescaled for w in windows)
    laplace = SGLD(linreg, progress_bar=False,
                   adaptation=AdaptationOptions(proxy=False)).preprocess((X, y))
    assert pre.data_passes - laplace.data_passes <= 15


def test_adapt_proxy_true_is_refused_where_it_cannot_apply():
    g, y = grouped_data()
    with pytest.raises(ValueError, match=r"AdaptationOptions\(proxy=True\)"):
        SGLD(centred, adaptation=AdaptationOptions(proxy=True), preconditioning=False,
             step_size=1e-3, progress_bar=False).preprocess((g, y))


def _ar1_draws(rng, cov_chol, steps, chains, rho):
    """Stationary AR(1) draws (steps, chains, d) with covariance L Lᵀ and lag-1
    autocorrelation rho: an autocorrelated pilot window of known covariance."""
    d = cov_chol.shape[0]
    x = np.empty((steps, chains, d))
    x[0] = rng.normal(size=(chains, d))
    for t in range(1, steps):
        x[t] = rho * x[t - 1] + np.sqrt(1 - rho**2) * rng.normal(size=(chains, d))
    return x @ cov_chol.T


def test_window_covariance_is_dense_only_when_the_draws_resolve_it():
    from numpyro.diagnostics import effective_sample_size

    rng = np.random.default_rng(0)
    d = 12
    a = rng.normal(size=(d, d))
    cov = a @ a.T / d + np.eye(d)
    chol = np.linalg.cholesky(cov)

    def estimate(steps, rho):
        ws = _ar1_draws(rng, chol, steps, 4, rho)
        ess = np.asarray(effective_sample_size(np.transpose(ws, (1, 0, 2))))
        return pilot_moments.window_covariance(ws, ess), float(np.median(ess))

    dense, n_eff = estimate(2000, 0.5)  # ESS about 2700 >> 2d: the dense covariance
    assert n_eff >= pilot_moments.DENSE_ESS_PER_DIM * d
    ev = np.linalg.eigvalsh(np.linalg.solve(chol, np.linalg.solve(chol, dense).T))
    assert 0.75 < ev[0] and ev[-1] < 1.3
    diag, n_eff = estimate(100, 0.9)  # ESS about 20 < 2d: variances only, no correlations
    assert n_eff < pilot_moments.DENSE_ESS_PER_DIM * d
    assert np.allclose(diag, np.diag(np.diag(diag)))
    # each log variance moves towards the draws' by the weight ESS / (ESS + 2), not beyond
    assert np.all(np.abs(np.log(np.diag(diag))) <= np.abs(np.log(np.diag(cov))) + 1.0)


def test_hessian_whitening_takes_correlations_from_the_hessian_and_scales_from_draws():
    """A Gaussian posterior (linear regression, correlated covariates): about 15 effective
    draws cannot estimate a 16 × 16 covariance, but the Hessian at their mean gives the posterior
    covariance exactly; the draws' variances in its coordinates are then about 1."""
    rng = np.random.default_rng(1)
    n, d = 2000, 16
    X = rng.normal(size=(n, d)) @ (np.eye(d) + 0.8 * rng.normal(size=(d, d)) / np.sqrt(d))
    y = X @ rng.normal(size=d) + rng.normal(size=n)

    def model(X, y=None, subsample_size=100):
        beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([d]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ beta, 1.0), obs=y[idx])

    kernel = SGLD(model, progress_bar=False)
    data = ModelData.from_args((jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)), {})
    pot = kernel.potential_for(data)
    start = fit_laplace(pot, data, jax.random.PRNGKey(0), store_datum_grads=False,
                        check_chain=False)
    post_cov = np.asarray(start.cov, np.float64)
    post_chol = np.linalg.cholesky(post_cov)
    centre = np.asarray(start.centre, np.float64)
    # a poor proxy (unit covariance) and 4 autocorrelated chains of posterior draws
    poor = warmup.proxy_at(pot, data, centre, np.eye(d), chunk_size=512, kind="adapted",
                           passes=0.0, seconds=0.0, info={})
    draws = centre + _ar1_draws(rng, post_chol, 80, 4, 0.9)
    proxy, spent = pilot_moments.hessian_whitened(poor, pot, data, draws, chunk_size=512)
    # proxy_at's pass gave ∇²f at the centre: no pass here, and it is the full Hessian
    assert spent == 0.0
    np.testing.assert_allclose(proxy.info["hessian"],
                               full_hessian(pot, poor.centre, data, 512), rtol=1e-4, atol=1e-3)
    again, spent = pilot_moments.hessian_whitened(poor._replace(info={}), pot, data, draws,
                                                  chunk_size=512)
    assert spent == 1.0
    np.testing.assert_allclose(again.cov, proxy.cov, rtol=1e-5, atol=1e-8)
    cov = np.asarray(proxy.cov, np.float64)
    ev = np.linalg.eigvalsh(np.linalg.solve(post_chol, np.linalg.solve(post_chol, cov).T))
    assert 0.6 < ev[0] and ev[-1] < 1.6


def _ar1_window(rng, steps: int, chains: int, d: int, rho: float, mean: float) -> np.ndarray:
    """Chains of a stationary AR(1) process N(mean, 1) started at its own draws."""
    x = np.empty((steps, chains, d))
    x[0] = rng.normal(size=(chains, d))
    for t in range(1, steps):
        x[t] = rho * x[t - 1] + np.sqrt(1.0 - rho ** 2) * rng.normal(size=(chains, d))
    return x + mean


def test_a_trusted_start_keeps_its_centre_when_slow_pilot_chains_agree_with_it():
    """Four pilot chains that barely move from draws of a right proxy (ESS 2-4 per window):
    the spread of their 4 start points is a t-like standard error with ~3 degrees of freedom,
    which over d coordinates once moved a correct Laplace centre by >1 sd (covtype_subset20k).
    The centre's standard error uses the proxy's variance 1 as a floor, so such windows keep
    it, and a real shift of 3 proxy sds is still found."""
    rng = np.random.default_rng(0)
    moved = [pilot_moments.window_moments(_ar1_window(rng, 50, 4, 54, 0.995, 0.0), True)[2]
             for _ in range(40)]
    assert np.mean(moved) <= 0.1, np.mean(moved)
    shifted = [pilot_moments.window_moments(_ar1_window(rng, 50, 4, 54, 0.9, 3.0), True)[2]
               for _ in range(10)]
    assert all(shifted)


def _radon_like_data(seed: int = 21):
    """85 groups of 1 to ~100 rows (N ≈ 919), two row covariates, group sd 0.32."""
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(1.9, 1.0, 85)), 1, 116).astype(int)
    sizes = np.maximum(1, np.round(sizes * 919 / sizes.sum())).astype(int)
    g = np.repeat(np.arange(85), sizes).astype(np.int32)
    floor = (rng.uniform(size=g.size) < 0.17).astype(np.float32)
    u = rng.normal(size=g.size).astype(np.float32)
    a = 1.5 + 0.32 * rng.normal(size=85)
    y = (a[g] - 0.66 * floor + 0.2 * u + 0.73 * rng.normal(size=g.size)).astype(np.float32)
    return tuple(jnp.asarray(x) for x in (g, floor, u, y))


def _radon(g, floor, u, y=None, subsample_size: int = 100, inside: bool = False):
    """A radon-like varying-intercept model, centred, or with ``LocScaleReparam(0)`` applied
    inside the body (``inside``)."""
    import contextlib

    mu = numpyro.sample("mu", dist.Normal(0, 10))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(1))
    b = numpyro.sample("b", dist.Normal(0, 10).expand([2]).to_event(1))
    with numpyro.plate("groups", 85):
        with (numpyro.handlers.reparam(config={"a": LocScaleReparam(0)}) if inside
              else contextlib.nullcontext()):
            a = numpyro.sample("a", dist.Normal(mu, sigma_a))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]] + b[0] * floor[i] + b[1] * u[i], sigma_y),
                       obs=None if y is None else y[i])


def radon_centred(g, floor, u, y=None, subsample_size: int = 100):
    _radon(g, floor, u, y, subsample_size)


def radon_inside(g, floor, u, y=None, subsample_size: int = 100):
    _radon(g, floor, u, y, subsample_size, inside=True)


def test_pilot_chains_move_with_sghmc_dynamics():
    from numpyro_subsample import SGHMC, SGNHT
    from numpyro_subsample.sgmcmc.dynamics import sghmc_dynamics

    assert SGLD(radon_centred)._pilot_dynamics()[0] == sghmc_dynamics(1.0)
    assert SGHMC(radon_centred, friction=2.0)._pilot_dynamics()[0] == sghmc_dynamics(2.0)
    assert SGNHT(radon_centred)._pilot_dynamics()[0] == sghmc_dynamics(1.0)


@pytest.fixture(scope="module")
def radon_reference():
    from numpyro.infer import MCMC as NumPyroMCMC
    from numpyro.infer import NUTS

    args = _radon_like_data()
    noncentred = numpyro.handlers.reparam(radon_centred, config={"a": LocScaleReparam(0)})
    nuts = NumPyroMCMC(NUTS(noncentred, target_accept_prob=0.9), num_warmup=1000,
                       num_samples=10_000, progress_bar=False)
    nuts.run(jax.random.PRNGKey(1), *args, subsample_size=args[0].shape[0])
    return args, nuts.get_samples()


@pytest.mark.slow
@pytest.mark.parametrize("written", ["centred", "inside"])
@pytest.mark.parametrize("kernel", ["SGLD", "SGNHT"])
def test_default_kernels_leave_a_collapsed_variational_start_of_a_radon_model(
        radon_reference, written, kernel):
    """Default SGLD and SGNHT on a radon-like model with a HalfNormal group scale, written
    centred or with ``LocScaleReparam(0)`` inside the body: the (centred form's) Laplace fit
    has no positive definite Hessian and its variational start collapses into the funnel's
    neck (log σ_a ≈ −3.8 to −5.9 against −1.2). With pilot chains of their own dynamics
    SGLD stayed there (h 6·10⁻⁴, 1.1 sd off, warned) and SGNHT's weights sent the inside form
    to its non-centred self (1 sd off, warned). Silent, and every site within 0.15 posterior
    sd in mean and log-sd of full-data NUTS on the same posterior written non-centred."""
    import numpyro_subsample as ns

    args, ref = radon_reference
    model = radon_centred if written == "centred" else radon_inside
    mcmc = ns.MCMC(getattr(ns, kernel)(model, progress_bar=False), num_warmup=1000,
                   num_samples=10_000, num_chains=4, chain_method="vectorized",
                   progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), *args)
    assert [str(w.message) for w in caught] == []
    draws = mcmc.get_samples()
    for site in ("mu", "sigma_a", "sigma_y", "b", "a"):
        r, d = np.asarray(ref[site], np.float64), np.asarray(draws[site], np.float64)
        sd = r.std(0)
        assert np.max(np.abs(d.mean(0) - r.mean(0)) / sd) < 0.15, site
        assert np.max(np.abs(np.log(d.std(0) / sd))) < 0.15, site


def test_a_laplace_fit_stopped_far_from_its_mode_hands_the_start_to_the_variational_fit():
    """A Laplace fit that stopped more than MAX_START_DECREMENT proxy sds from the mode of its
    local quadratic (Adam ran into a funnel's neck) does not start the pilot: the variational
    fit does, with both fits' passes; a fit that stopped near its mode does; where the
    variational fit fails too, the unconverged Laplace fit is the start."""
    g, y = grouped_data()
    _, pot, data = _potential(noncentred, g, y)
    base = warmup.safe_start(pot, data, chunk_size=256, reason="")
    far = base._replace(kind="laplace", num_data_passes=3.0,
                        info={"converged": False, "newton_decrement": 8.8})
    near = far._replace(info={"converged": False, "newton_decrement": 0.5})
    variational = base._replace(kind="variational", num_data_passes=5.0,
                                info={"converged": True})

    def fits(laplace, variational_fails=False):
        def fit(kind):
            if kind == "variational" and variational_fails:
                raise np.linalg.LinAlgError("not positive definite")
            return laplace if kind == "laplace" else variational
        return fit

    start = warmup.start_proxy(fits(far), "laplace", pot, data, chunk_size=256)
    assert start.kind == "variational" and start.num_data_passes == 8.0
    assert start.info["fallback_from"][0].startswith("laplace: stopped 8.8 proxy sds")
    assert warmup.start_proxy(fits(near), "laplace", pot, data, chunk_size=256).kind == "laplace"
    kept = warmup.start_proxy(fits(far, True), "laplace", pot, data, chunk_size=256)
    assert kept.kind == "laplace" and kept.info["newton_decrement"] == 8.8


def _rat_data(groups=70, seed=701):
    """Bernoulli rows of 70 groups of 3 to 2000 rows (benchmarks/_unseen_models7.py)."""
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(3.5, 1.3, groups)), 3, 2000).astype(int)
    g = np.repeat(np.arange(groups), sizes)
    rng.shuffle(g)
    theta = rng.beta(2.5, 14.0, groups)
    y = rng.uniform(size=g.size) < theta[g]
    return jnp.asarray(g, jnp.int32), jnp.asarray(y, jnp.float32)


def rat_tumours(g, y=None, groups=70, subsample_size=500):
    phi = numpyro.sample("phi", dist.Beta(1.0, 1.0))
    kappa = numpyro.sample("kappa", dist.Pareto(1.0, 1.5))
    with numpyro.plate("groups", groups):
        theta = numpyro.sample("theta", dist.Beta(phi * kappa, (1.0 - phi) * kappa))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(probs=theta[g[i]]), obs=None if y is None else y[i])


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["SGLD", "SGHMC"])
def test_a_beta_hierarchy_whose_laplace_fit_runs_into_the_funnel_is_right_by_default(kernel):
    """Gelman's rat-tumour model (BDA3 Sect. 5.3): group rates Beta(φκ, (1 − φ)κ), a Pareto
    prior on κ. Its joint density grows without bound as κ → ∞ with every rate at φ, so Adam
    runs into that neck and Newton stops there, 8 sds from its quadratic's mode; pilot chains
    started there stayed in the neck (κ ≈ 10^7, ESS 9). By default the pilot starts from the
    variational fit: every site within 0.15 sd in mean and log-sd of long NUTS, no warning."""
    from numpyro.infer import MCMC as NumPyroMCMC
    from numpyro.infer import NUTS

    from numpyro_subsample import MCMC, SGHMC

    g, y = _rat_data()
    nuts = NumPyroMCMC(NUTS(rat_tumours), num_warmup=1000, num_samples=10_000,
                       progress_bar=False)
    nuts.run(jax.random.PRNGKey(1), g, y, subsample_size=g.shape[0])
    ref = nuts.get_samples()
    cls = {"SGLD": SGLD, "SGHMC": SGHMC}[kernel]
    mcmc = MCMC(cls(rat_tumours, progress_bar=False), num_warmup=1000, num_samples=10_000,
                num_chains=4, chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), g, y)
    assert [str(w.message) for w in caught] == []
    draws = mcmc.get_samples()
    for site in ("phi", "kappa", "theta"):
        r, d = np.asarray(ref[site]), np.asarray(draws[site])
        sd = r.std(0)
        assert np.max(np.abs(d.mean(0) - r.mean(0)) / sd) < 0.15, site
        assert np.max(np.abs(np.log(d.std(0) / sd))) < 0.15, site


def test_a_hierarchy_of_another_family_starts_from_the_variational_fit():
    """Beta group rates around a latent mean and concentration: the start is the variational
    fit, tried first, and the Laplace fit only where it fails; Normal group effects keep the
    Laplace fit first."""
    g, y = _rat_data(groups=12)
    kernel = SGLD(rat_tumours, progress_bar=False)
    data = ModelData.from_args((g, y), {"groups": 12})
    pot = kernel.potential_for(data)
    base = warmup.safe_start(pot, data, chunk_size=256, reason="")
    asked = []

    def fit(kind, fail=()):
        asked.append(kind)
        if kind in fail:
            raise LaplaceFitError("refused")
        return base._replace(kind=kind, info={"converged": True})

    assert warmup.start_proxy(fit, "laplace", pot, data, chunk_size=256).kind == "variational"
    assert asked == ["variational"]
    asked.clear()
    start = warmup.start_proxy(lambda k: fit(k, ("variational",)), "laplace", pot, data,
                               chunk_size=256)
    assert start.kind == "laplace" and asked == ["variational", "laplace"]
    gg, yy = grouped_data()
    _, npot, ndata = _potential(noncentred, gg, yy)
    asked.clear()
    assert warmup.start_proxy(fit, "laplace", npot, ndata, chunk_size=256).kind == "laplace"
    assert asked == ["laplace"]


def test_a_pilot_that_has_not_settled_runs_more_windows():
    """A trusted start 20 posterior sds off with a covariance 100 times too small: the
    scheduled windows end still moving the proxy, so the pilot adds windows of the last length
    (at most EXTRA_WINDOWS) while they move its centre by more than SETTLED_SHIFT of its
    sds, with the same draws until then, and ends nearer the posterior than without them."""
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(5000, 3)).astype(np.float32))
    p = 1.0 / (1.0 + np.exp(-(np.asarray(X) @ np.array([0.5, -0.2, 0.1]))))
    y = jnp.asarray((rng.uniform(size=5000) < p).astype(np.float32))

    def logreg(X, y=None, subsample_size=100):
        beta = numpyro.sample("beta", dist.Normal(0, 10).expand([3]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])

    kernel, pot, data = _potential(logreg, X, y)
    fit = fit_laplace(pot, data, jax.random.PRNGKey(1), store_datum_grads=False,
                      check_chain=False)
    centre, cov = np.asarray(fit.centre, np.float64), np.asarray(fit.cov, np.float64)
    sd = np.sqrt(np.diag(cov))
    start = warmup.proxy_at(pot, data, centre + 20.0 * sd, 0.01 * cov, chunk_size=256,
                            kind="laplace", passes=0.0, seconds=0.0, info={"converged": True})
    windows = warmup.pilot_schedule(pot.num_data, pot.plate.subsample_size)

    def adapted(extra):
        return warmup.adapt_proxy(
            start, pot, data, jax.random.PRNGKey(2), dynamics=sgld_dynamics(),
            rule=lambda v, mu: kernel._default_step_size(v, False, mu), windows=windows,
            chunk_size=256, extra_windows=extra)

    def off(proxy):  # worst coordinate, in the posterior's sds
        return float(np.max(np.abs(np.asarray(proxy.centre) - centre) / sd))

    scheduled, extended = adapted(0), adapted(warmup.EXTRA_WINDOWS)
    assert len(scheduled.info["windows"]) == len(windows)
    assert scheduled.info["windows"][-1].moved
    assert scheduled.info["windows"][-1].shift > warmup.SETTLED_SHIFT
    ran = extended.info["windows"]
    assert len(windows) < len(ran) <= len(windows) + warmup.EXTRA_WINDOWS
    assert all(w.steps == windows[-1] for w in ran[len(windows):])
    assert all(w.shift > warmup.SETTLED_SHIFT for w in ran[len(windows) - 1:-1])
    assert ran[:len(windows)] == scheduled.info["windows"]  # the same draws until then
    assert off(extended) < 0.25 * off(scheduled), (off(extended), off(scheduled))


def _rare_slopes_data(groups=60, seed=906):
    """Poisson counts with an exposure; the slope's covariate is 1 in 3 % of rows
    (benchmarks/_unseen_models9.py)."""
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(4.5, 1.0, groups)), 3, 2000).astype(int)
    g = np.repeat(np.arange(groups), sizes).astype(np.int32)
    rng.shuffle(g)
    x = (rng.uniform(size=g.size) < 0.03).astype(np.float32)
    exposure = rng.uniform(0.5, 3.0, size=g.size).astype(np.float32)
    slope = 0.5 + 0.4 * rng.normal(size=groups)
    y = rng.poisson(exposure * np.exp(0.2 + slope[g] * x)).astype(np.float32)
    return tuple(jnp.asarray(a) for a in (g, x, np.log(exposure), y))


def rare_slopes(g, x, log_exposure, y=None, groups=60, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    mu_b = numpyro.sample("mu_b", dist.Normal(0.0, 2.0))
    s_b = numpyro.sample("s_b", dist.Exponential(1.0))
    with numpyro.plate("groups", groups):
        slope = numpyro.sample("slope", dist.Normal(mu_b, s_b))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        rate = jnp.exp(log_exposure[i] + a + slope[g[i]] * x[i])
        numpyro.sample("y", dist.Poisson(rate), obs=None if y is None else y[i])


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["SGLD", "SGHMC"])
def test_group_slopes_on_a_rare_covariate_are_right_by_default(kernel):
    """Group-varying slopes of a binary covariate that is 1 in 3 % of 8,209 rows: the Laplace
    fit has no positive definite Hessian, the variational fit collapses into the funnel's neck
    (log s_b = −6.3 against −0.9) and the four scheduled pilot windows still move the proxy 3-5
    sds each; sampled from the fourth, SGLD is 5.5 sds off in s_b and SGHMC 1.9 (warned, ESS
    5). With the windows the pilot adds while it drifts: every site within 0.15 sd in mean and
    log-sd of long NUTS on the model written non-centred, no warning."""
    from numpyro.infer import MCMC as NumPyroMCMC
    from numpyro.infer import NUTS

    from numpyro_subsample import MCMC, SGHMC

    args = _rare_slopes_data()
    nc = numpyro.handlers.reparam(rare_slopes, config={"slope": LocScaleReparam(0)})
    nuts = NumPyroMCMC(NUTS(nc), num_warmup=1000, num_samples=10_000, progress_bar=False)
    nuts.run(jax.random.PRNGKey(1), *args, subsample_size=args[0].shape[0])
    ref = nuts.get_samples()
    cls = {"SGLD": SGLD, "SGHMC": SGHMC}[kernel]
    mcmc = MCMC(cls(rare_slopes, progress_bar=False), num_warmup=1000, num_samples=10_000,
                num_chains=4, chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), *args)
    assert [str(w.message) for w in caught] == []
    draws = mcmc.get_samples()
    for site in ("a", "mu_b", "s_b", "slope"):
        r, d = np.asarray(ref[site]), np.asarray(draws[site])
        sd = r.std(0)
        assert np.max(np.abs(d.mean(0) - r.mean(0)) / sd) < 0.15, site
        assert np.max(np.abs(np.log(d.std(0) / sd))) < 0.15, site
