"""Steps of the dynamics per draw (``steps_per_draw``): the rule, a given k against the exact
posterior, the defaults and bad input."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
from models import linreg_data, linreg_exact, linreg_model
from numpyro.infer import MCMC as NumPyroMCMC

from numpyro_subsample import MCMC, SGHMC, SGLD, DistributedSGLD
from numpyro_subsample.sgmcmc.stepsize import MAX_STEPS_PER_DRAW, steps_per_draw

H1 = 2 * 0.05 / 1.05  # SGLD's unit-curvature step at δ = 0.05


def test_the_rule_restores_the_unit_step_mixing_within_its_cap():
    assert steps_per_draw(H1, H1) == 1
    assert steps_per_draw(1.2 * H1, H1) == 1  # a larger step never needs more
    assert steps_per_draw(H1 / 1.4, H1) == 1
    assert steps_per_draw(H1 / 1.6, H1) == 2
    assert steps_per_draw(H1 / 4.8, H1) == 5
    assert steps_per_draw(H1 / 12, H1) == MAX_STEPS_PER_DRAW
    assert steps_per_draw(H1 / (2 * MAX_STEPS_PER_DRAW + 1), H1) == 1  # would not mix anyway
    assert steps_per_draw(H1 / 3, H1, max_steps=2) == 2


@pytest.fixture(scope="module")
def linreg():
    X, y = linreg_data(N=5_000)
    return X, y, linreg_exact(X, y)


def _lag1(x: np.ndarray) -> float:
    x = x - x.mean()
    return float(np.sum(x[1:] * x[:-1]) / np.sum(x * x))


@pytest.mark.parametrize("runner", ["package", "numpyro"])
def test_given_steps_per_draw_keep_the_posterior_and_thin_inside_the_step(linreg, runner):
    """k = 3 steps per draw on the conjugate linear regression: one draw per ``MCMC`` sample
    (the state counts draws), three steps' data passes per draw, the lag-1 autocorrelation
    about that of three steps (ρ³), and the exact posterior within 0.15 sd in mean and
    log-sd; under the package's ``MCMC`` and under NumPyro's."""
    X, y, (mean, sd) = linreg
    runs = {}
    for k in (1, 3):
        kernel = SGLD(linreg_model, steps_per_draw=k, progress_bar=False)
        mcmc = (MCMC if runner == "package" else NumPyroMCMC)(
            kernel, num_warmup=500, num_samples=4_000, num_chains=2,
            chain_method="vectorized", progress_bar=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # k = 1 is short of ESS here; judged below
            mcmc.run(jax.random.PRNGKey(0), X, y)
        assert kernel.steps_per_draw == k
        runs[k] = (mcmc, kernel)
    (m1, k1), (m3, k3) = runs[1], runs[3]
    assert k1.step_size == k3.step_size
    assert np.all(np.asarray(m3.last_state.i) == 4_500)
    pre = float(k1.preprocessed.data_passes)
    passes1 = float(np.asarray(m1.last_state.data_passes)[0]) - pre
    passes3 = float(np.asarray(m3.last_state.data_passes)[0]) - pre
    assert passes3 == pytest.approx(3 * passes1, rel=0.01)
    b1 = np.asarray(m1.get_samples(group_by_chain=True)["beta"])[0]
    b3 = np.asarray(m3.get_samples(group_by_chain=True)["beta"])[0]
    rho1 = np.array([_lag1(b1[:, j]) for j in range(b1.shape[1])])
    rho3 = np.array([_lag1(b3[:, j]) for j in range(b3.shape[1])])
    np.testing.assert_allclose(rho3, rho1**3, atol=0.08)
    draws = np.asarray(m3.get_samples()["beta"], np.float64)
    assert np.max(np.abs(draws.mean(0) - mean) / sd) < 0.15
    assert np.max(np.abs(np.log(draws.std(0) / sd))) < 0.15


@pytest.mark.parametrize("estimator", ["saga", "svrg"])
def test_stateful_estimators_take_several_steps_per_draw_in_vectorized_chains(linreg,
                                                                           estimator):
    """SAGA's per-chain table and SVRG's shared refresh clock with k = 3 steps per draw in
    vectorized chains: the run completes, the chains' clock stays shared, each draw after the
    first costs three steps' data passes, and the draws match the exact posterior within 0.15
    sd in mean and log-sd."""
    X, y, (mean, sd) = linreg
    kernel = SGLD(linreg_model, estimator=estimator, steps_per_draw=3, progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=500, num_samples=3_000, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), X, y)
    state = mcmc.last_state
    assert np.all(np.asarray(state.i) == 3_500)
    if estimator == "svrg":
        assert np.ndim(state.est_state.age) == 0  # one clock for the vectorized chains
    n = kernel.preprocessed.potential.plate.subsample_size
    passes = np.asarray(state.data_passes) - float(kernel.preprocessed.data_passes)
    assert np.all(passes >= 3 * 3_500 * n / X.shape[0] - 1e-3)
    draws = np.asarray(mcmc.get_samples()["beta"], np.float64)
    assert np.max(np.abs(draws.mean(0) - mean) / sd) < 0.15
    assert np.max(np.abs(np.log(draws.std(0) / sd))) < 0.15


def test_defaults_take_one_step_per_draw_where_the_step_is_not_cut(linreg):
    """A GLM's SGLD step is its unit-curvature one (k = 1); a given ``step_size`` and SGHMC
    take one step per draw."""
    X, y, _ = linreg
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # SGLD's step_size convention
        given_step = SGLD(linreg_model, step_size=0.01, progress_bar=False)
    for kernel in (SGLD(linreg_model, progress_bar=False), given_step,
                   SGHMC(linreg_model, progress_bar=False)):
        kernel.preprocess((X, y))
        assert kernel.steps_per_draw == 1
        assert kernel.preprocessed.params.steps_per_draw is None


@pytest.mark.parametrize("bad", [0, -2, 1.5, "3"])
def test_bad_steps_per_draw_is_refused_at_construction(bad):
    with pytest.raises((ValueError, TypeError), match="steps_per_draw"):
        SGLD(linreg_model, steps_per_draw=bad)


def test_distributed_sgld_refuses_steps_per_draw():
    with pytest.raises(ValueError, match="steps_per_draw=2.*trajectory_length"):
        DistributedSGLD(linreg_model, num_shards=1, steps_per_draw=2)


def test_default_sgld_on_a_hierarchical_model_takes_several_steps_per_draw_and_is_right():
    """Default SGLD on a centred hierarchical normal model (30 groups of 1 to 400 rows), whose
    step the curvature's spread over the posterior keeps at about a quarter of the unit one:
    k > 1 steps per draw, no warning (the run check's ESS included, 2 chains × 5000 draws),
    and every site within 0.2 posterior sd in mean and log-sd of full-data NUTS."""
    from numpyro.infer import NUTS
    from test_centring import _grouped_data, grouped_normal

    g, y, _ = _grouped_data()
    nuts = NumPyroMCMC(NUTS(grouped_normal), num_warmup=500, num_samples=5_000,
                       progress_bar=False)
    nuts.run(jax.random.PRNGKey(1), g, y, subsample_size=g.shape[0])
    ref = nuts.get_samples()
    kernel = SGLD(grouped_normal, progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=1000, num_samples=5_000, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), g, y)
    assert [str(w.message) for w in caught] == []
    assert kernel.steps_per_draw > 1
    draws = mcmc.get_samples()
    for site in ("mu", "sigma_a", "sigma_y", "a"):
        r, d = np.asarray(ref[site]), np.asarray(draws[site])
        sd = r.std(0)
        assert np.max(np.abs(d.mean(0) - r.mean(0)) / sd) < 0.2, site
        assert np.max(np.abs(np.log(d.std(0) / sd))) < 0.2, site
