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

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def run():
    X, y = logistic_data(N=1500, d=3, seed=4)
    kernel = SGLD(logistic_hier_model, estimator="cv")
    mcmc = MCMC(kernel, num_warmup=100, num_samples=300, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("grad", "subsample_size", "data_passes"))
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


def _spy_blocks(monkeypatch):
    """Record the number of draws of every chunk of the log-likelihood pass."""
    import numpyro_subsample.post.log_likelihood as ll_mod

    calls = []
    original = ll_mod._log_likelihood_rows

    def spy(potential, latent, data, chunk):
        first = next(iter(latent.values()))
        if not isinstance(first, jax.core.Tracer):  # not the shape probe
            calls.append((first.shape[0], chunk))
        return original(potential, latent, data, chunk)

    monkeypatch.setattr(ll_mod, "_log_likelihood_rows", spy)
    return calls


def test_log_likelihood_in_chunks_equals_one_chunk_and_respects_the_bound(run, monkeypatch):
    from numpyro_subsample import full_log_likelihood

    X, y, mcmc = run
    calls = _spy_blocks(monkeypatch)
    whole = full_log_likelihood(mcmc)["y"]
    assert calls == [(600, 1024)]  # 600 draws × 1500 data fit the default 256 MB in one chunk
    calls.clear()
    bound = 64 * 1500 * 4  # a buffer of 32 draws × N in half of it
    chunked = full_log_likelihood(mcmc, chunk_memory=bound)["y"]
    assert [c[0] for c in calls] == [32] * 19  # ceil(600 / 32) chunks of 32 draws
    assert all(c[0] * 1500 * 4 <= bound // 2 for c in calls)
    assert all(c[0] * c[1] * 4 * 8 <= bound // 2 for c in calls)  # the tile's share
    assert chunked.shape == whole.shape == (2, 300, 1500)
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-6)
    calls.clear()
    tiny = full_log_likelihood(mcmc, chunk_memory="1kB")["y"]  # one draw, data in 16-row tiles
    assert len(calls) == 600 and calls[0] == (1, 16)
    np.testing.assert_allclose(tiny, whole, rtol=1e-5, atol=1e-6)
    beta = np.asarray(mcmc.get_samples(group_by_chain=True)["beta"][1, 123])
    manual = dist.Bernoulli(logits=X @ beta).log_prob(y)
    np.testing.assert_allclose(tiny[1, 123], manual, rtol=1e-4, atol=1e-5)


def test_log_likelihood_thinned_draws(run):
    _, _, mcmc = run
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        full = to_arviz(mcmc, log_likelihood=True, check=False)  # a short run
        thin = to_arviz(mcmc, log_likelihood=True, log_likelihood_thin=7, chunk_memory="64kB",
                        check=False)
    ll = thin.log_likelihood["y"]
    assert ll.shape == (2, 43, 1500)
    np.testing.assert_array_equal(ll["draw"].values, np.arange(0, 300, 7))
    np.testing.assert_allclose(ll.values, full.log_likelihood["y"].values[:, ::7], rtol=1e-5,
                               atol=1e-6)
    assert thin.posterior["beta"].shape == (2, 300, 3)  # the posterior keeps every draw
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Pareto k of a short, tiled chain
        loo = az.loo(thin)
    assert np.isfinite(loo.elpd_loo)


def test_log_likelihood_options_are_checked(run):
    _, _, mcmc = run
    with pytest.raises(ValueError, match="log_likelihood_thin must be a positive integer"):
        to_arviz(mcmc, log_likelihood=True, log_likelihood_thin=0)
    with pytest.raises(ValueError, match="chunk_memory='lots' is not a memory size"):
        to_arviz(mcmc, log_likelihood=True, chunk_memory="lots")
    with pytest.raises(ValueError, match="plate_deterministic='some'"):
        to_arviz(mcmc, plate_deterministic="some")


def test_observed_data_leaves_out_factor_sites():
    """``numpyro.factor`` outside the data plate (a penalty) and inside it (a likelihood
    written by hand) are auxiliary sites without data: ``observed_data`` holds the observed
    site on all N rows, and neither factor (the outside one made xarray refuse the group)."""
    import jax.numpy as jnp
    import numpyro

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + rng.normal(size=400)).astype(np.float32)

    def model(X, y, subsample_size=50):
        b = numpyro.sample("b", dist.Normal(0, 1).expand([2]).to_event(1))
        numpyro.factor("ridge", -0.5 * jnp.sum(b ** 2))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
            numpyro.sample("y", dist.Normal(X[i] @ b, 1.0), obs=y[i])
            numpyro.factor("extra", -0.01 * (y[i] - X[i] @ b) ** 2)

    mcmc = MCMC(SGLD(model, progress_bar=False), num_warmup=50, num_samples=100,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = to_arviz(mcmc)
    assert list(idata.observed_data.data_vars) == ["y"]
    assert idata.observed_data["y"].shape == (400,)
