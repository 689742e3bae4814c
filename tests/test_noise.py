"""The exact noise covariance of every estimator configuration (estimators.noise)."""

import os
import re
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import logistic_data, logistic_model

from numpyro_subsample import (
    SGLD,
    ModelData,
    NoiseOptions,
    build_potential,
    configure_estimator,
    fit_laplace,
)
from numpyro_subsample.compare.timing import CompileTimer
from numpyro_subsample.estimators import noise_covariance
from numpyro_subsample.estimators.base import GradientEstimator
from numpyro_subsample.estimators.noise import (
    CurvatureLimitedStepWarning,
    NoiseLimitedStepWarning,
    direction_errors,
    extend_noise,
    warn_if_noise_limited,
    whitened_noise,
)
from numpyro_subsample.estimators.noise_covariance import (
    exact_whitened_covs,
    monte_carlo_whitened_covs,
    noise_rows,
    point_covariances,
)

pytestmark = pytest.mark.fast_compile  # short runs: compilation is most of their time

HERE = os.path.dirname(__file__)
KEY = jax.random.PRNGKey(0)
NUM_DRAWS = 20_000
HEAVY_ROW, HEAVY_FACTOR = 17, 50.0


def heavy_data():
    """Logistic regression, N = 500, one row with a feature 50× larger than the others."""
    X, y = logistic_data(N=500, d=3, seed=1)
    X = np.asarray(X).copy()
    X[HEAVY_ROW, 2] *= HEAVY_FACTOR
    return jnp.asarray(X), y


@pytest.fixture(scope="module")
def heavy():
    X, y = heavy_data()
    data = ModelData.from_args((X, y), {"subsample_size": 10})
    pot = build_potential(logistic_model, data, KEY)
    proxy = fit_laplace(pot, data, KEY, check_chain=False)
    theta = proxy.centre + proxy.scale_tril @ jnp.asarray([1.0, -1.0, 0.5], proxy.centre.dtype)
    return pot, data, proxy, theta


# Without replacement the sampling fraction is large (n = 100 of 500), so that a missing
# finite-population factor (0.8 here) would be detected; those draws are slower, and less
# heavy-tailed, so fewer suffice.
CONFIGS = [
    ("uniform", {"subsample_size": 10}),
    ("uniform", {"subsample_size": 100, "replace": False}),
    ("cv", {"subsample_size": 10}),
    ("cv", {"subsample_size": 100, "replace": False}),
    ("preferential", {"subsample_size": 10}),
    ("preferential", {"subsample_size": 10, "weights": "exact"}),
    ("cv-preferential", {"subsample_size": 10}),
    ("stratified", {"subsample_size": 100, "num_strata": 4}),
    ("cv-stratified", {"subsample_size": 100, "num_strata": 4}),
    ("cv", {"subsample_size": 10, "adaptive": True, "v0": "proxy"}),
    ("cv-preferential", {"subsample_size": 10, "adaptive": True, "v0": "proxy"}),
]


def _whitened_draws(est, theta, tril, data, num_draws=NUM_DRAWS):
    keys = jax.random.split(jax.random.PRNGKey(3), num_draws)
    g = jax.jit(jax.vmap(est.estimate, in_axes=(None, 0, None, None)))(
        est.params, keys, theta, data)[0]
    return np.asarray(g, np.float64) @ np.asarray(tril, np.float64)


def _quadratic_form_z(u, cov, m):
    """z-score of E[(u − ū)ᵀ M (u − ū)] = tr(M Cov) against the exact value, with the
    Monte Carlo standard error from the draws themselves."""
    dev = u - u.mean(0)
    q = np.einsum("ki,ij,kj->k", dev, m, dev)
    se = q.std() / np.sqrt(len(q))
    return (q.mean() - np.trace(m @ cov)) / se, se / np.trace(m @ cov)


@pytest.mark.parametrize("name, options", CONFIGS, ids=lambda v: str(v))
def test_exact_covariance_matches_monte_carlo(heavy, name, options):
    pot, data, proxy, theta = heavy
    est = configure_estimator(name, pot, data, proxy, **options)
    cov = exact_whitened_covs(est, theta[None], proxy.scale_tril, data, chunk_size=128)[0]
    large_fraction = options["subsample_size"] == 100
    u = _whitened_draws(est, theta, proxy.scale_tril, data, 4000 if large_fraction else NUM_DRAWS)
    top = np.linalg.eigh(cov)[1][:, -1]
    for m in (np.eye(3), np.outer(top, top)):  # the trace and the top eigenvalue
        z, rel_se = _quadratic_form_z(u, cov, m)
        assert abs(z) < 4.5, (name, options, z)
        # power: an error of 45% (20% at the large sampling fraction) would be seen
        assert rel_se < (0.03 if large_fraction else 0.1), rel_se
    if options.get("adaptive"):
        # the noise is that of the bucket n_t(θ) the estimator runs at θ, not of n_max
        n_t = np.asarray(est(KEY, theta, data)[1])
        assert n_t < est.subsample_size


def test_monte_carlo_from_few_subsamples_misses_the_heavy_row(heavy):
    """The noise measurement this module replaces: 16 subsamples of 10 from 500 include the
    heavy row with probability 27%, so the typical 16-draw estimate is far too small."""
    pot, data, proxy, theta = heavy
    est = configure_estimator("cv", pot, data, proxy)
    exact = np.trace(exact_whitened_covs(est, theta[None], proxy.scale_tril, data)[0])
    u = _whitened_draws(est, theta, proxy.scale_tril, data, num_draws=16 * 500)
    groups = u.reshape(500, 16, 3)
    traces = np.array([np.trace(np.cov(g.T)) for g in groups])
    assert np.median(traces) < 0.2 * exact, (np.median(traces), exact)


def test_whitened_noise_points_passes_and_fallback(heavy):
    pot, data, proxy, _ = heavy
    L = proxy.scale_tril
    est = configure_estimator("cv", pot, data, proxy)
    noise = whitened_noise(est, proxy.centre, L, KEY, data, num_points=4)
    # the centre is not evaluated (left out of the mean): 3 passes for the 3 draws
    assert noise.exact and noise.data_passes == 3.0 and noise.points.shape == (4, 3)
    assert noise.basis.shape == (3, 3) and noise.along.shape == (3, 3)  # 3 draws, no (P, d, d)
    np.testing.assert_allclose(noise.points[0], proxy.centre)
    covs = exact_whitened_covs(est, jnp.asarray(noise.points), L, data)
    assert np.abs(covs[0]).max() < 1e-8  # the control variate is exact at its centre
    mean_cov = covs[1:].mean(0)  # the mean over the proxy draws, centre left out
    np.testing.assert_allclose(noise.cov, mean_cov, rtol=1e-6)
    assert noise.largest == pytest.approx(np.linalg.eigvalsh(mean_cov).max())
    assert noise.largest > 0
    assert np.linalg.eigvalsh(noise.cov).min() > -1e-6 * noise.largest
    # an estimator without second moments is measured by Monte Carlo
    mc = whitened_noise(est._replace(moments=None), proxy.centre, L, KEY, data, num_points=2)
    assert not mc.exact and mc.cov.shape == (3, 3) and mc.along.shape == (1, 3)
    assert mc.data_passes == pytest.approx(2 * 16 * 10 / 500)


def _full_storage_errors(covs, basis=None):
    """The formula that stores every per-draw covariance: the mean of ``covs`` (draws, d, d),
    and the standard errors of e_kᵀ V_j e_k over the draws, e_k the columns of ``basis``
    (default: the eigenvectors of the mean)."""
    cov = covs.mean(0)
    lam, q = np.linalg.eigh(cov)
    q = q if basis is None else basis
    along = np.einsum("pij,ik,jk->pk", covs, q, q)
    return cov, lam, along.std(0, ddof=1) / np.sqrt(along.shape[0])


@pytest.mark.parametrize("with_moments", [True, False], ids=["exact", "monte-carlo"])
def test_streaming_noise_equals_the_full_storage_formula(heavy, with_moments):
    """The measurement keeps the mean, the directions and the per-draw projections only; its
    mean, eigenvalues and standard errors equal those of the formula that stores every
    per-draw covariance (computed here from the same points), before and after extension.
    Both reduce the same float64 matrices and differ in summation order only: 1e-9."""
    pot, data, proxy, _ = heavy
    L = proxy.scale_tril
    est = configure_estimator("cv", pot, data, proxy)
    est = est if with_moments else est._replace(moments=None)
    key, key2 = KEY, jax.random.PRNGKey(5)

    def covs_at(points, k):
        points = jnp.asarray(points)
        if with_moments:
            return exact_whitened_covs(est, points, L, data)
        return monte_carlo_whitened_covs(est, points, L, jax.random.fold_in(k, 1), data)

    first = whitened_noise(est, proxy.centre, L, key, data, num_points=5)
    covs = covs_at(first.points, key)[1:]
    cov, lam, se = _full_storage_errors(covs)
    np.testing.assert_allclose(first.cov, cov, rtol=1e-12)
    got_lam, got_se = direction_errors(first)
    np.testing.assert_allclose(got_lam, lam, rtol=1e-9)
    np.testing.assert_allclose(got_se, se, rtol=1e-9)
    assert first.largest == pytest.approx(lam[-1], rel=1e-9)
    assert all(np.ndim(f) <= 2 for f in first)

    more = extend_noise(est, first, L, key2, data, num_points=4)
    covs = np.concatenate([covs, covs_at(more.points[5:], key2)])
    cov, lam, _ = _full_storage_errors(covs)
    np.testing.assert_allclose(more.cov, cov, rtol=1e-12)
    assert more.largest == pytest.approx(lam[-1], rel=1e-9)
    got_lam, got_se = direction_errors(more)
    np.testing.assert_allclose(got_lam, lam, rtol=1e-9)
    # the directions stay the first measurement's eigenvectors, ordered by e_kᵀ V̄ e_k
    first_basis = np.linalg.eigh(first.cov)[1]
    match = np.abs(more.basis.T @ first_basis)
    np.testing.assert_allclose(np.sort(match, axis=1)[:, -1], 1.0, rtol=1e-9)
    rayleigh = np.einsum("ik,ij,jk->k", more.basis, more.cov, more.basis)
    assert np.all(np.diff(rayleigh) >= 0)
    np.testing.assert_allclose(got_se, _full_storage_errors(covs, more.basis)[2], rtol=1e-9)

    # a measurement of the centre alone is replaced by the new draws, directions included
    alone = whitened_noise(est, proxy.centre, L, key, data, num_points=1)
    grown = extend_noise(est, alone, L, key2, data, num_points=4)
    covs = covs_at(grown.points[1:], key2)
    cov, lam, se = _full_storage_errors(covs)
    np.testing.assert_allclose(grown.cov, cov, rtol=1e-12)
    np.testing.assert_allclose(direction_errors(grown)[1], se, rtol=1e-9)


def test_extend_noise_and_direction_errors(heavy):
    """More draws: the mean and its largest eigenvalue over all draws, passes counted; the
    standard errors are the spread of e_kᵀ V(θ) e_k over the draws / sqrt(draws)."""
    pot, data, proxy, _ = heavy
    L = proxy.scale_tril
    est = configure_estimator("cv", pot, data, proxy)
    first = whitened_noise(est, proxy.centre, L, KEY, data, num_points=4)
    with CompileTimer() as ct:  # one compiled pass per point serves any number of points
        more = extend_noise(est, first, L, jax.random.PRNGKey(5), data, num_points=3)
    assert "_moment_sums" not in ct.programs
    assert more.along.shape == (6, 3) and more.points.shape == (7, 3)
    assert more.data_passes == pytest.approx(6.0)  # 3 + 3 draws, the centre not evaluated
    np.testing.assert_allclose(more.points[:4], first.points)
    np.testing.assert_allclose(more.points[0], proxy.centre)
    covs = exact_whitened_covs(est, jnp.asarray(more.points), L, data)
    np.testing.assert_allclose(more.cov, covs[1:].mean(0), rtol=1e-5)
    assert more.largest == pytest.approx(np.linalg.eigvalsh(more.cov).max())
    lam, se = direction_errors(more)
    np.testing.assert_allclose(lam, np.linalg.eigvalsh(more.cov), rtol=1e-9)
    for k in range(3):
        e = more.basis[:, k]
        along = [e @ c @ e for c in covs[1:]]
        assert se[k] == pytest.approx(np.std(along, ddof=1) / np.sqrt(6), rel=1e-5)
    assert np.all(se > 0)
    _, se1 = direction_errors(whitened_noise(est, proxy.centre, L, KEY, data, num_points=2))
    assert np.all(se1 == 0)  # one draw: no spread to measure


def test_refined_noise_bounds_the_correction_error(heavy):
    """The noise-corrected kernels add proxy draws until (or cap the step so that) the
    correction's own error h·se(λ̂)/(2c) is within max_variance_inflation along every
    eigen-direction; the plain dynamic measures 8 draws only."""
    from numpyro_subsample import SGHMC
    from numpyro_subsample.sgmcmc.kernel import MAX_NOISE_EXTENSIONS

    X, y = heavy_data()
    for cls in (SGLD, SGHMC):
        plain = cls(logistic_model, estimator="cv", noise=NoiseOptions(correction=False),
                    progress_bar=False)
        plain.preprocess((X, y), {"subsample_size": 10})
        assert plain.preprocessed.params.noise_scale is None
        kernel = cls(logistic_model, estimator="cv", progress_bar=False)
        kernel.preprocess((X, y), {"subsample_size": 10})
        pre = kernel.preprocessed
        c = getattr(kernel, "friction", 1.0)
        assert pre.noise_draws in 8 + 9 * np.arange(MAX_NOISE_EXTENSIONS + 1)
        assert pre.noise_errors.shape == (3,)
        bound = pre.step_size * pre.noise_errors.max() / (2 * c)
        assert bound <= kernel.max_variance_inflation * (1 + 1e-6)
        rule = kernel._default_step_size(pre.noise)
        # with the 8 draws of the plain dynamic the bound is violated on this model: the
        # refinement had to act (more draws, or a step below the rule's)
        assert pre.noise_draws > 8 or pre.step_size < rule
        assert plain.preprocessed.noise_draws == 8


@pytest.fixture(scope="module")
def large():
    X, y = logistic_data(N=20_000, d=3, seed=2)
    return X, y


def test_noise_limited_step_warns_for_uniform_not_for_cv(large):
    X, y = large
    kernel = SGLD(logistic_model, estimator="uniform")
    with pytest.warns(NoiseLimitedStepWarning, match="estimator='uniform'.*estimator='cv'"):
        pre = kernel.preprocess((X, y), {"subsample_size": 1})
    assert pre.step_size < 1e-4 and pre.noise > 1e4
    kernel = SGLD(logistic_model, estimator="cv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pre = kernel.preprocess((X, y), {"subsample_size": 10})
    assert pre.step_size > 1e-2
    # the noise passes are counted in the preprocessing
    assert pre.data_passes >= pre.proxy.num_data_passes + 4


def test_float64_exact_covariance_equals_the_formula():
    """Under jax_enable_x64, chunked (padded last chunk) and grouped sums equal the formula
    on the (N, d) per-datum residuals, stratum by stratum, to float64 precision."""
    code = """
        import conftest  # noqa: F401  (the tests' compilation cache)
        import jax
        jax.config.update("jax_enable_x64", True)
        import numpy as np
        from models import logistic_data, logistic_model
        from numpyro_subsample import ModelData, build_potential, configure_estimator, fit_laplace
        from numpyro_subsample.core.datapass import datum_values_and_grads
        from numpyro_subsample.estimators.noise_covariance import exact_whitened_covs
        X, y = logistic_data(N=300, d=3, seed=5)
        X, y = X.astype("float64"), y.astype("float64")
        data = ModelData.from_args((X, y), {"subsample_size": 30})
        key = jax.random.PRNGKey(0)
        pot = build_potential(logistic_model, data, key)
        proxy = fit_laplace(pot, data, key, check_chain=False)
        est = configure_estimator("cv-stratified", pot, data, proxy, num_strata=3)
        L = np.asarray(proxy.scale_tril)
        theta = proxy.centre + proxy.scale_tril @ np.array([0.5, 1.0, -1.0])
        cov = exact_whitened_covs(est, theta[None], proxy.scale_tril, data, chunk_size=64)[0]
        assert cov.dtype == np.float64
        r = np.asarray(datum_values_and_grads(pot, theta, data)[1]
                       - datum_values_and_grads(pot, proxy.centre, data)[1]) @ L
        s = est.info["strata"]
        ref = np.zeros((3, 3))
        for j, (n_j, b_j) in enumerate(zip(s.sizes, s.batch_sizes)):
            rj = r[s.labels == j]
            dev = rj - rj.mean(0)
            ref += n_j**2 / b_j * (1 - b_j / n_j) * dev.T @ dev / (n_j - 1)
        assert np.allclose(cov, ref, rtol=1e-9, atol=1e-12), (cov, ref)
        print("OK")
    """
    env = {**os.environ, "PYTHONPATH": HERE}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout


@pytest.mark.parametrize("name, options", [("cv", {}), ("uniform", {}), ("preferential", {}),
                                           ("cv-stratified", {"num_strata": 4})])
def test_noise_on_a_row_sample_is_unbiased_and_costs_its_share(monkeypatch, name, options):
    """Above 2 · NOISE_ROWS rows the exact noise sums over a uniform row sample scaled by N/M:
    over many samples its mean is the full pass's covariance (to its Monte Carlo error), one
    sample's relative sd is below 10 % at M = 2000, and a point costs M/N of a pass (a stratified
    design keeps the full pass)."""
    X, y = logistic_data(N=20_000, d=3, seed=2)
    data = ModelData.from_args((X, y), {"subsample_size": 50})
    pot = build_potential(logistic_model, data, KEY)
    proxy = fit_laplace(pot, data, KEY, check_chain=False)
    est = configure_estimator(name, pot, data, proxy, **options)
    thetas = proxy.centre + jnp.asarray([[1.0, -1.0, 0.5], [-0.5, 0.3, 1.2]]) @ proxy.scale_tril.T
    L = proxy.scale_tril
    full, full_passes = point_covariances(est, thetas, L, KEY, data, exact=True)
    monkeypatch.setattr(noise_covariance, "NOISE_ROWS", 2000)
    stratified = name.endswith("stratified")
    assert (noise_rows(est, thetas, data, KEY) is None) == stratified
    if stratified:
        assert point_covariances(est, thetas, L, KEY, data, exact=True)[1] == full_passes
        return
    rows = np.asarray(noise_rows(est, thetas, data, KEY))
    assert rows.shape == (2000,) and np.all(np.diff(rows) > 0)  # distinct, sorted
    extra = float(est.moments.passes_per_point)
    sampled = []
    for seed in range(40):
        cov_at, passes = point_covariances(est, thetas, L, jax.random.PRNGKey(seed), data,
                                           exact=True)
        assert passes == pytest.approx(2 * (0.1 + extra))
        sampled.append(np.stack([cov_at(0), cov_at(1)]))
    sampled = np.stack(sampled)  # (40, 2, d, d)
    for p in range(2):
        exact = np.trace(full(p))
        traces = np.trace(sampled[:, p], axis1=1, axis2=2)
        se = traces.std(ddof=1) / np.sqrt(len(traces))
        assert abs(traces.mean() - exact) < 4 * se + 1e-6 * exact, (p, traces.mean(), exact, se)
        assert traces.std(ddof=1) / exact < 0.1, (p, traces / exact)  # one sample's spread


def _estimator(name: str = "cv") -> GradientEstimator:
    return GradientEstimator(estimate=None, params=None, name=name, subsample_size=500,
                             num_data=10_000)


def test_a_step_the_curvature_holds_warns_about_the_curvature_not_the_noise():
    """Where the rule's step without noise is itself below MIN_USEFUL_STEP and the noise does
    not halve it, the warning blames the curvature, names its coordinate, and does not advise
    a larger subsample."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_noise_limited(_estimator(), 2.3e6, 4.2e-10, curvature=2.28e8,
                              noise_free_step=4.2e-10, curvature_site="lambda[21]")
    assert [w.category for w in caught] == [CurvatureLimitedStepWarning]
    message = str(caught[0].message)
    assert "μ = 2.28e+08 along lambda[21]" in message
    assert "does not lower it" in message and "do not raise this step" in message
    assert "Use a larger subsample_size" not in message
    # the noise lowers it, by less than half: still the curvature's, and the message says so
    with pytest.warns(CurvatureLimitedStepWarning, match="lowers it to 3.00e-10"):
        warn_if_noise_limited(_estimator(), 2.3e6, 3e-10, curvature=2.28e8,
                              noise_free_step=4.2e-10)


def test_a_step_the_noise_holds_warns_about_the_noise_and_the_curvature_beneath_it():
    with pytest.warns(NoiseLimitedStepWarning, match="Use a larger subsample_size.*Without the "
                      r"noise the curvature μ = 2.28e\+08 would still hold it to 4.20e-10"):
        warn_if_noise_limited(_estimator(), 2.3e6, 1e-10, curvature=2.28e8,
                              noise_free_step=4.2e-10)
    with warnings.catch_warnings(record=True) as caught:  # the curvature leaves a useful step
        warnings.simplefilter("always")
        warn_if_noise_limited(_estimator(), 2.3e6, 1e-6, curvature=1.0, noise_free_step=0.095)
        warn_if_noise_limited(_estimator(), 1.0, 0.05, curvature=1.0, noise_free_step=0.095)
    assert [w.category for w in caught] == [NoiseLimitedStepWarning]
    assert "Without the noise" not in str(caught[0].message)


@pytest.mark.slow
def test_a_centred_funnel_whose_step_the_curvature_holds_warns_so(monkeypatch):
    """End to end: 50 groups of 4 rows (noise sd 5, group sd 0.1) sampled centred; the
    pilot's chains go down the funnel, where the curvature (μ ≈ 700) holds the step to about
    1.3e-4 while the noise (v < 0.01) does not lower it. MIN_USEFUL_STEP is raised to 1e-3 so
    that this cheap model crosses it."""
    import numpyro
    import numpyro.distributions as dist

    from numpyro_subsample import AdaptationOptions
    from numpyro_subsample.estimators import noise

    def funnel(g, y):
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
        with numpyro.plate("groups", 50):
            a = numpyro.sample("a", dist.Normal(mu, tau))
        with numpyro.plate("data", g.shape[0], subsample_size=100) as idx:
            numpyro.sample("y", dist.Normal(a[g[idx]], 5.0), obs=y[idx])

    rng = np.random.default_rng(0)
    g = np.repeat(np.arange(50), 4)
    y = 1.0 + 0.1 * rng.normal(size=50)[g] + 5.0 * rng.normal(size=g.size)
    monkeypatch.setattr(noise, "MIN_USEFUL_STEP", 1e-3)
    kernel = SGLD(funnel, progress_bar=False, adaptation=AdaptationOptions(centring=False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pre = kernel.preprocess((jnp.asarray(g), jnp.asarray(y, jnp.float32)), {})
    limited = [w for w in caught if issubclass(w.category, (CurvatureLimitedStepWarning,
                                                            NoiseLimitedStepWarning))]
    assert [w.category for w in limited] == [CurvatureLimitedStepWarning], limited
    assert pre.step_size < 1e-3 and pre.step_size >= 0.5 * pre.noise_free_step
    assert re.search(r"μ = [0-9.e+]+ along (tau|mu|a\[\d+\])", str(limited[0].message))
