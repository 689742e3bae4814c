"""The diagonal preconditioner adapted during warm-up (sgmcmc.adaptation).

Known answers: hand computations of the running mean, the step-size rules' own inflation
factors, and the conjugate linear regression (exact posterior) with columns on scales 0.1 to
100, which no fixed step handles in raw coordinates.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import linreg_exact, linreg_model

from numpyro_subsample import (
    MCMC,
    SGHMC,
    SGLD,
    AdaptationOptions,
    DistributedSGLD,
    ModelData,
    NoiseOptions,
)
from numpyro_subsample.post.checks import RunDiagnosticsWarning
from numpyro_subsample.sgmcmc.adaptation import (
    MIN_ADAPT_WARMUP,
    MIN_MOMENT,
    adaptation_window,
    adaptive_step_size,
    init_adaptation,
    update_adaptation,
)
from numpyro_subsample.sgmcmc.stepsize import _sghmc_inflation, sghmc_step_size, sgld_step_size

pytestmark = pytest.mark.fast_compile

SCALES = np.array([1.0, 10.0, 100.0, 0.1])


@pytest.fixture(scope="module")
def scaled():
    """Linear regression whose posterior sds span 10⁻⁴ to 10⁻¹ (columns scaled by SCALES)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, 4)) * SCALES
    y = X @ np.array([0.5, -0.1, 0.01, 3.0]) + rng.normal(size=5000)
    X, y = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)
    return X, y, linreg_exact(X, y)


def test_running_mean_by_hand():
    """V₀ = 1 + g₀²; then ρ = max(1/(i+2), 1/W): the plain mean of V₀ and the gradients
    until W of them, then an exponential average; frozen from i = num_warmup on."""
    g0, g1, g2, g3 = (jnp.array([x, 2 * x]) for x in (1.0, 3.0, 0.5, 7.0))
    st = init_adaptation(g0)
    np.testing.assert_allclose(st.moment, [2.0, 5.0])
    st = update_adaptation(st, g1, jnp.asarray(0), num_warmup=3, window=2)  # ρ = 1/2
    np.testing.assert_allclose(st.moment, [(2.0 + 9.0) / 2, (5.0 + 36.0) / 2])
    st = update_adaptation(st, g2, jnp.asarray(1), num_warmup=3, window=2)  # ρ = max(1/3, 1/2)
    want = np.array([5.5 + 0.5 * (0.25 - 5.5), 20.5 + 0.5 * (1.0 - 20.5)])
    np.testing.assert_allclose(st.moment, want, rtol=1e-6)
    np.testing.assert_allclose(st.scale, 1 / np.sqrt(want + MIN_MOMENT), rtol=1e-6)
    frozen = update_adaptation(st, g3, jnp.asarray(3), num_warmup=3, window=2)
    np.testing.assert_array_equal(frozen.moment, st.moment)
    np.testing.assert_array_equal(frozen.scale, st.scale)
    assert adaptation_window(100) == 50 and adaptation_window(5000) == 1000


def test_step_rule_meets_the_inflation_bound_at_every_split():
    """In adapted coordinates curvature μ and noise v share a unit budget; the chosen h keeps
    each rule's stationary variance inflation within δ at every split (SGLD: the closed form
    (2 + hv)/(2 − hμ) of stepsize.py; SGHMC: its Lyapunov factor)."""
    delta = 0.05
    h = adaptive_step_size(lambda v, mu: sgld_step_size(v, delta, mu))
    np.testing.assert_allclose(h, 2 * delta / (1 + delta), rtol=1e-9)  # the worst split: μ = 1
    for mu in np.linspace(1e-3, 1.0, 50):
        assert (2 + h * (1 - mu)) / (2 - h * mu) <= 1 + delta + 1e-9
    h = adaptive_step_size(lambda v, mu: sghmc_step_size(v, 1.0, delta, mu))
    worst = max(_sghmc_inflation(h, 1 - mu, 1.0, mu) for mu in np.linspace(1e-3, 1.0, 200))
    assert 1 + 0.9 * delta < worst <= 1 + delta + 1e-6  # tight, not just small


@pytest.mark.parametrize("cls", [SGLD, SGHMC])
def test_raw_coordinates_against_the_exact_posterior(scaled, cls):
    """No proxy whitening (preconditioning=False): the adaptation alone must find scales that
    span three decades. Mean within 0.15 posterior sds and sds within 10 %: 2 chains × 8000
    draws, ESS ≥ 400 per coordinate in this configuration, so the Monte Carlo sd of the mean
    is ≤ 0.05 sd and that of the sd ≤ 3.5 %; the default step inflates variances by ≤ 5 %."""
    X, y, (mean, sd) = scaled
    kernel = cls(linreg_model, preconditioning=False,
                 adaptation=AdaptationOptions(preconditioner=True),
                 progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=1000, num_samples=8000, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), X, y)
    b = np.asarray(mcmc.get_samples()["beta"], np.float64)
    assert np.all(np.abs(b.mean(0) - mean) / sd < 0.15)
    assert np.all(np.abs(np.log(b.std(0) / sd)) < 0.1)
    # the learned scale is the posterior sd up to the noise share: s² = 1/(1/σ² + v) ≤ σ²,
    # and the running mean's own error (window 200: ~5 %)
    s = np.asarray(mcmc.last_state.adapt.scale)
    ratio = s / sd
    assert np.all((ratio > 0.5) & (ratio < 1.3)), ratio
    assert kernel.step_size == pytest.approx(adaptive_step_size(
        lambda v, mu: kernel._default_step_size(v, False, mu)))


def test_scale_frozen_after_warmup_and_default_with_structured_proxy(scaled):
    """The scale after warm-up is the one the sampling phase ends with; a structured proxy
    turns the adaptation on by default (no noise measured: NaN), a dense one does not."""
    X, y, _ = scaled
    kernel = SGLD(linreg_model, proxy="diagonal", progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=300, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunDiagnosticsWarning)  # warm-up draws are not checked
        mcmc.warmup(jax.random.PRNGKey(0), X, y)
    after_warmup = np.asarray(mcmc.post_warmup_state.adapt.scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RunDiagnosticsWarning)  # 300 SGLD draws: ESS < 100
        mcmc.run(jax.random.PRNGKey(1), X, y)
    np.testing.assert_array_equal(np.asarray(mcmc.last_state.adapt.scale), after_warmup)
    assert not np.allclose(after_warmup, 1.0)  # it did adapt
    assert np.isnan(kernel.preprocessed.noise) and not kernel.noise_correction
    dense = SGLD(linreg_model, progress_bar=False)
    state = dense.init(jax.random.PRNGKey(0), 10, None, (X, y), {})
    assert state.adapt is None and np.isfinite(dense.preprocessed.noise)
    pot = kernel.potential_for(ModelData.from_args((X, y), {}))
    raw = SGLD(linreg_model, preconditioning=False, progress_bar=False)  # no whitening: on
    assert raw._adapts(pot)
    # ... unless a step is given: plain SGLD in raw coordinates (the papers' protocol)
    with pytest.warns(DeprecationWarning):  # SGLD's step_size convention notice
        given = SGLD(linreg_model, preconditioning=False, step_size=1e-4)
    assert not given._adapts(pot)


def test_bad_requests_raise_early(scaled):
    X, y, _ = scaled
    kernel = SGLD(linreg_model, adaptation=AdaptationOptions(preconditioner=True),
                  progress_bar=False)
    with pytest.raises(ValueError, match=f"num_warmup=10 < {MIN_ADAPT_WARMUP}"):
        MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False).run(
            jax.random.PRNGKey(0), X, y)
    assert kernel._pre is None  # raised before the proxy fit
    with pytest.raises(ValueError, match=r"NoiseOptions\(correction=True\)"):
        SGLD(linreg_model, adaptation=AdaptationOptions(preconditioner=True),
             noise=NoiseOptions(correction=True))
    with pytest.raises(ValueError, match="not by DistributedSGLD"):
        DistributedSGLD(linreg_model, adaptation=AdaptationOptions(preconditioner=True))
    with pytest.raises(TypeError, match="preconditioner"):
        SGLD(linreg_model, adaptation=AdaptationOptions(preconditioner="yes"))
