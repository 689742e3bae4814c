"""ArviZ output of a run, for any kernel satisfying the post-processing protocol."""

import warnings

import arviz as az
import jax
import matplotlib
import numpy as np
import numpyro.distributions as dist
import pytest
from models import logistic_data, logistic_hier_model
from numpyro.infer import MCMC

from numpyro_subsample import SGLD, EnergyConservingHMC, to_arviz
from numpyro_subsample.post.arviz import warn_divergences

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def run():
    X, y = logistic_data(N=1500, d=3, seed=4)
    kernel = SGLD(logistic_hier_model, estimator="cv")
    mcmc = MCMC(kernel, num_warmup=100, num_samples=300, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("grad",))
    return X, y, mcmc


def test_to_arviz_groups_and_full_observed_data(run):
    X, y, mcmc = run
    idata = to_arviz(mcmc)
    assert {"posterior", "sample_stats", "observed_data"} <= set(idata.groups())
    assert "log_likelihood" not in idata.groups()
    assert idata.posterior["beta"].shape == (2, 300, 3)
    assert idata.posterior["tau"].shape == (2, 300)
    np.testing.assert_array_equal(idata.observed_data["y"].values, np.asarray(y))
    stats = idata.sample_stats
    for name in ("diverging", "subsample_size", "data_passes", "grad"):
        assert name in stats, name
    assert stats["grad"].shape == (2, 300, 4)
    assert idata.posterior.attrs["estimator"] == "cv"
    assert idata.posterior.attrs["step_size"] > 0
    summary = az.summary(idata)
    assert {"beta[0]", "tau"} <= set(summary.index)
    az.plot_trace(idata, var_names=["tau"])


def test_log_likelihood_on_full_data(run):
    X, y, mcmc = run
    idata = to_arviz(mcmc, log_likelihood=True)
    ll = idata.log_likelihood["y"].values
    assert ll.shape == (2, 300, 1500)
    beta = np.asarray(idata.posterior["beta"].values[1, 7])
    manual = dist.Bernoulli(logits=X @ beta).log_prob(y)
    np.testing.assert_allclose(ll[1, 7], manual, rtol=1e-4, atol=1e-5)


def test_arviz_from_numpyro_does_not_crash(run):
    _, y, mcmc = run
    idata = az.from_numpyro(mcmc)
    assert idata.posterior["beta"].shape == (2, 300, 3)
    assert idata.observed_data["y"].shape == (1500,)


def test_to_arviz_rejects_other_kernels():
    from numpyro.infer import NUTS

    mcmc = MCMC(NUTS(lambda: None), num_warmup=1, num_samples=1)
    with pytest.raises(TypeError, match="numpyro_subsample kernel"):
        to_arviz(mcmc)


def test_to_arviz_needs_a_finished_run():
    mcmc = MCMC(SGLD(logistic_hier_model), num_warmup=1, num_samples=1)
    with pytest.raises(ValueError, match="mcmc.run"):
        to_arviz(mcmc)


def test_divergence_warning_names_the_count_and_a_smaller_step():
    with pytest.warns(UserWarning, match="3 of 8 steps.*step size 0.5.*smaller step_size"):
        assert warn_divergences(np.array([1, 1, 0, 0, 1, 0, 0, 0], bool), 0.5) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_divergences(np.zeros(8, bool), 0.5) == 0


def test_to_arviz_reads_energy_conserving_hmc_through_the_protocol():
    X, y = logistic_data(N=1500, d=3, seed=4)
    mcmc = MCMC(EnergyConservingHMC(logistic_hier_model), num_warmup=50, num_samples=50,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # divergences of the short warmup
        idata = to_arviz(mcmc, log_likelihood=True)
    assert idata.posterior.attrs["sampler"] == "EnergyConservingHMC"
    assert idata.posterior.attrs["preprocessing_data_passes"] >= 1
    assert idata.posterior["beta"].shape == (1, 50, 3)
    np.testing.assert_array_equal(idata.observed_data["y"].values, np.asarray(y))
    ll = idata.log_likelihood["y"].values
    assert ll.shape == (1, 50, 1500)
    beta = np.asarray(idata.posterior["beta"].values[0, 7])
    manual = dist.Bernoulli(logits=X @ beta).log_prob(y)
    np.testing.assert_allclose(ll[0, 7], manual, rtol=1e-4, atol=1e-5)
