"""Run checks (ESS, R-hat, stopped and frozen chains, step halving): they fire on runs that may
be wrong and stay silent on a correct run of a well-posed model."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
from models import linreg_data, linreg_exact, linreg_model, logistic_data, logistic_model

from numpyro_subsample import MCMC, SGHMC, SGLD, RunDiagnosticsWarning, check_run, to_arviz

# compilation takes most of these tests' time: most XLA optimisations off (conftest.py)
pytestmark = pytest.mark.fast_compile


@pytest.fixture(scope="module")
def logistic():
    return logistic_data(N=2000, d=4, seed=1)


def test_correct_run_is_silent(logistic):
    X, y = logistic
    mcmc = MCMC(SGHMC(logistic_model, progress_bar=False), num_warmup=300, num_samples=3000,
                num_chains=2, chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mcmc.run(jax.random.PRNGKey(0), X, y)
        idata = to_arviz(mcmc)
    rc = mcmc.run_check
    assert rc.ok and rc.min_ess_bulk > 100 and rc.max_rhat < 1.01, rc
    assert rc.num_draws == 6000 and rc.divergences == 0
    assert idata.sample_stats.attrs["min_ess_bulk"] == pytest.approx(rc.min_ess_bulk)


def test_frozen_chain_warns_with_site_and_step(logistic):
    X, y = logistic
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(logistic_model, step_size=1e-7, progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=500, progress_bar=False)
    with pytest.warns(RunDiagnosticsWarning, match=r"min ESS .* at beta\[\d\].*step size 1e-07"):
        mcmc.run(jax.random.PRNGKey(0), X, y)
    assert mcmc.run_check.min_ess_bulk < 100
    assert mcmc.run_check.worst_sites[0].startswith("beta[")


def test_disagreeing_chains_warn_rhat(logistic):
    X, y = logistic
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(logistic_model, step_size=1e-5, progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=400, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    with pytest.warns(RunDiagnosticsWarning, match=r"split R-hat .* between 4 chains"):
        mcmc.run(jax.random.PRNGKey(0), X, y)
    assert mcmc.run_check.max_rhat > 1.01


def test_a_chain_stopped_at_its_start_is_named_so():
    """fail_step 1 is the first step, which evaluates the gradient at the initial position."""
    from types import SimpleNamespace

    from numpyro_subsample.post.checks import _failures

    state = SimpleNamespace(fail_step=np.asarray([1, -1, 7]), fail_coord=np.asarray([2, -1, 0]))
    lines = _failures(SimpleNamespace(last_state=state, sampler=None))
    assert lines[0].startswith("chain 0 stopped at its start: the gradient estimate along θ[2]")
    assert lines[1].startswith("chain 2 stopped at step 7: θ[0] became non-finite")
    assert len(lines) == 3  # and the remedy


def test_stopped_chain_names_step_and_site(capsys):
    X, y = linreg_data(N=2000, d=3)
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(linreg_model, step_size=3.0, progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=300, progress_bar=False)
    with pytest.warns(RunDiagnosticsWarning, match=r"chain 0 stopped at step \d+: beta\[\d\]"):
        mcmc.run(jax.random.PRNGKey(0), X, y)
    state = mcmc.last_state
    div = np.asarray(mcmc.get_extra_fields()["diverging"])
    first = int(state.fail_step) - 1  # draws are counted from 0, steps from 1
    assert div[first:].all() and not div[:first].any()
    beta = np.asarray(mcmc.get_samples()["beta"])
    assert np.all(beta[first:] == beta[first])  # the chain stopped at its last valid state
    assert mcmc.run_check.divergences == div.sum()
    mcmc.print_summary()
    assert f"Number of divergences: {div.sum()}" in capsys.readouterr().out
    idata = to_arviz(mcmc)  # the run has warned already
    assert idata.sample_stats.attrs["num_divergent"] == div.sum()
    assert int(idata.sample_stats["diverging"].sum()) == div.sum()


def test_step_halving_detects_bias_of_a_large_step():
    """SGLD with h = 0.6 on a Gaussian target (whitened) inflates the variance by
    (2 + h v)/(2 − h) ≥ 1.43: the log sd moves by ≥ 0.18 when the step is halved."""
    X, y = linreg_data(N=2000, d=3)
    _, sd = linreg_exact(X, y)
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(linreg_model, step_size=0.6, progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=100, num_samples=4000, check_bias=True, progress_bar=False)
    with pytest.warns(RunDiagnosticsWarning, match="halving the step to 0.3"):
        mcmc.run(jax.random.PRNGKey(0), X, y)
    bias = mcmc.run_check.bias
    assert bias.log_sd_shift > 3 * bias.log_sd_shift_se and bias.log_sd_shift > 0.1
    drawn_sd = np.asarray(mcmc.get_samples()["beta"]).std(0)
    assert np.all(drawn_sd > 1.1 * sd)  # the check reports a real inflation


def test_step_halving_silent_for_default_step(logistic):
    X, y = logistic
    mcmc = MCMC(SGHMC(logistic_model, progress_bar=False), num_warmup=300, num_samples=3000,
                num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), X, y)
    rc = check_run(mcmc, check_bias=True, warn=False)
    assert rc.ok, rc.messages
    assert rc.bias.step_size == pytest.approx(0.5 * mcmc.sampler.step_size)


def _hierarchical(num_groups=30, num_data=3000, seed=0):
    import numpyro
    import numpyro.distributions as dist

    rng = np.random.default_rng(seed)
    g = rng.integers(0, num_groups, num_data)
    x = rng.normal(size=num_data).astype(np.float32)
    a = 0.8 * rng.normal(size=num_groups)
    y = (rng.uniform(size=num_data) < 1 / (1 + np.exp(-(a[g] + 0.5 * x)))).astype(np.float32)

    def model(g, x, y=None, subsample_size=200):
        mu = numpyro.sample("mu", dist.Normal(0, 2))
        tau = numpyro.sample("tau", dist.HalfNormal(1))
        b = numpyro.sample("b", dist.Normal(0, 2))
        with numpyro.plate("groups", num_groups):
            a = numpyro.sample("a", dist.Normal(mu, tau))
        with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=a[g[idx]] + b * x[idx]), obs=y[idx])

    return model, (g.astype(np.int32), x, y)


def test_non_centred_hierarchical_with_laplace_warns_not_mixed():
    """The joint mode of a non-centred hierarchical model is a poor centre and preconditioner
    (README, issue of hierarchical models): the run must say it has not mixed."""
    import numpyro
    from numpyro.infer.reparam import LocScaleReparam

    model, data = _hierarchical()
    nc = numpyro.handlers.reparam(model, config={"a": LocScaleReparam(0)})
    mcmc = MCMC(SGLD(nc, progress_bar=False), num_warmup=500, num_samples=5000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    with pytest.warns(RunDiagnosticsWarning, match=r"min ESS .* a_decentered\["):
        mcmc.run(jax.random.PRNGKey(0), *data)
    assert mcmc.run_check.max_rhat > 1.01 and mcmc.run_check.min_ess_bulk < 100


@pytest.mark.slow
def test_variational_proxy_uses_expected_hessian_covariance():
    """On the non-centred model the kernels' variational proxy takes (E_q[∇²f])⁻¹, which does
    not collapse where a guide's scale can; the converged full-rank guide does not collapse
    either (its covariance is (E_q[∇²f])⁻¹ at stationarity), so the two agree."""
    import numpyro
    from numpyro.infer.reparam import LocScaleReparam

    model, data = _hierarchical()
    nc = numpyro.handlers.reparam(model, config={"a": LocScaleReparam(0)})
    kernel = SGLD(nc, proxy="variational", proxy_kwargs={"max_steps": 3000}, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel.preprocess(data, {})
    proxy = kernel.proxy
    assert proxy.info["covariance"] == "expected_hessian"
    eig = np.linalg.eigvalsh(np.asarray(proxy.cov, np.float64))
    guide_eig = np.linalg.eigvalsh(np.asarray(proxy.info["guide_cov"], np.float64))
    assert eig.min() > 1e-4 and guide_eig.min() > 1e-4
    assert 0.5 < eig.min() / guide_eig.min() < 2.0, (eig.min(), guide_eig.min())
    assert kernel.step_size > 1e-2  # a usable step, where the Laplace centre gives ~1e-2/v


@pytest.mark.slow
def test_rhat_threshold_is_not_crossed_by_chance_over_many_coordinates():
    """Independent draws from one distribution (2 chains × 400, 5000 coordinates): the
    largest split R-hat exceeds 1.01 by chance, never the per-coordinate thresholds; one
    coordinate whose chains sit 0.6 sd apart exceeds its threshold."""
    import arviz as az

    from numpyro_subsample.post.checks import rhat_thresholds

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 400, 5000))
    x[1, :, 7] += 0.6
    ds = az.convert_to_dataset({"x": x})
    rhat = np.asarray(az.rhat(ds)["x"].values)
    ess = sum(np.asarray(az.ess(az.convert_to_dataset({"x": x[c:c + 1]}), method="bulk")["x"]
                         .values) for c in range(2))  # each chain's own, as check_run
    limit = rhat_thresholds(ess, chains=2, draws=400)
    over = np.nonzero(rhat > limit)[0]
    assert np.delete(rhat, 7).max() > 1.01  # the fixed rule would warn
    assert list(over) == [7], over
