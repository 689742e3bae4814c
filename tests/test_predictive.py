"""Predictions for all N rows, and deterministic sites inside the data plate."""

import warnings

import arviz as az
import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import logistic_data
from numpyro.infer import MCMC, Predictive

from numpyro_subsample import SGLD, predictive, to_arviz

# compilation takes most of these tests' time: most XLA optimisations off (conftest.py)
pytestmark = pytest.mark.fast_compile

N, n = 600, 40


def det_model(X, y=None, subsample_size=n):
    """Logistic regression with a deterministic site inside the data plate, used downstream."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    numpyro.deterministic("beta_sum", beta.sum())
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        p = numpyro.deterministic("p", jax.nn.sigmoid(X[idx] @ beta))
        numpyro.sample("y", dist.Bernoulli(probs=p), obs=None if y is None else y[idx])


@pytest.fixture(scope="module")
def run():
    X, y = logistic_data(N=N, d=3, seed=7)
    mcmc = MCMC(SGLD(det_model), num_warmup=50, num_samples=60, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mcmc.run(jax.random.PRNGKey(1), X, y)
    return X, y, mcmc


def sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, np.float64)))


def test_plate_deterministic_holds_the_first_n_rows(run):
    X, _, mcmc = run
    s = mcmc.get_samples()
    assert s["p"].shape == (120, n)
    np.testing.assert_allclose(s["p"], sigmoid(s["beta"] @ np.asarray(X[:n]).T), rtol=1e-5)
    np.testing.assert_allclose(s["beta_sum"], s["beta"].sum(-1), rtol=1e-5, atol=1e-6)


def test_predictive_covers_all_rows_of_the_run(run):
    X, y, mcmc = run
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pred = predictive(mcmc, rng_key=jax.random.PRNGKey(3))
    beta = np.asarray(mcmc.get_samples()["beta"])
    assert set(pred) == {"p", "y", "beta_sum"}
    assert pred["p"].shape == pred["y"].shape == (120, N)
    np.testing.assert_allclose(pred["p"], sigmoid(beta @ np.asarray(X).T), rtol=1e-5)
    # y is drawn (not the observed values): its mean matches p within 5 binomial sds
    assert set(np.unique(pred["y"])) == {0.0, 1.0}
    assert not (pred["y"] == np.asarray(y)).all(-1).any()
    sd = np.sqrt((pred["p"] * (1 - pred["p"])).sum()) / pred["p"].size
    assert abs(pred["y"].mean() - pred["p"].mean()) < 5 * sd


def test_predictive_chunks_do_not_change_the_draws(run, monkeypatch):
    import numpyro_subsample.post.predictive as pmod

    _, _, mcmc = run
    whole = predictive(mcmc, rng_key=jax.random.PRNGKey(3))
    calls = []
    original = pmod._predict_chunk

    def spy(model, samples, keys, data, return_sites):
        if not isinstance(keys, jax.core.Tracer):  # not the shape probe
            calls.append(keys.shape[0])
        return original(model, samples, keys, data, return_sites)

    monkeypatch.setattr(pmod, "_predict_chunk", spy)
    per_draw = (2 * N + 1) * 4  # p, y and beta_sum in float32
    chunked = predictive(mcmc, rng_key=jax.random.PRNGKey(3), chunk_memory=25 * per_draw)
    assert calls == [25] * 5  # 120 draws in chunks of 25 (the last padded)
    np.testing.assert_array_equal(chunked["y"], whole["y"])
    np.testing.assert_allclose(chunked["p"], whole["p"], rtol=1e-6)


def test_predictive_on_new_data_of_another_size(run):
    X, _, mcmc = run
    X_new = np.asarray(logistic_data(N=17, d=3, seed=8)[0])
    s = mcmc.get_samples()
    pred = predictive(mcmc, None, X_new)  # fewer rows than the model's subsample_size
    assert pred["y"].shape == pred["p"].shape == (120, 17)
    np.testing.assert_allclose(pred["p"], sigmoid(s["beta"] @ X_new.T), rtol=1e-5)
    sub = {k: v[::10] for k, v in s.items()}
    only_p = predictive(mcmc.sampler, sub, X_new, return_sites=["p"])
    assert set(only_p) == {"p"}
    np.testing.assert_allclose(only_p["p"], pred["p"][::10], rtol=1e-6)
    big = predictive(mcmc.sampler, sub, np.concatenate([np.asarray(X)] * 2))
    assert big["p"].shape == (12, 2 * N)


def test_plain_predictive_subsamples_but_kernel_model_does_not(run):
    """The documented pitfall: Predictive on the user's model predicts n random rows."""
    X, _, mcmc = run
    s = mcmc.get_samples()
    plain = Predictive(det_model, s)(jax.random.PRNGKey(0), X)
    assert plain["p"].shape == (120, n)
    full = Predictive(mcmc.sampler.model, s)(jax.random.PRNGKey(0), X)
    assert full["p"].shape == (120, N)


def test_to_arviz_plate_deterministic_first_rows_and_all_rows(run):
    X, _, mcmc = run
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = to_arviz(mcmc, check=False)  # a short run: the mixing checks would warn
        every = to_arviz(mcmc, log_likelihood=True, plate_deterministic="all",
                         chunk_memory="8kB", check=False)
    p = first.posterior["p"]
    assert p.dims == ("chain", "draw", "data_subsample") and p.shape == (2, 60, n)
    np.testing.assert_array_equal(p["data_subsample"].values, np.arange(n))
    beta = every.posterior["beta"].values
    p_all = every.posterior["p"]
    assert p_all.dims == ("chain", "draw", "data") and p_all.shape == (2, 60, N)
    np.testing.assert_allclose(p_all.values, sigmoid(beta @ np.asarray(X).T), rtol=1e-5)
    np.testing.assert_allclose(p_all.values[..., :n], p.values, rtol=1e-6)
    assert every.log_likelihood["y"].shape == (2, 60, N)
    assert "beta_sum" in every.posterior and every.posterior["beta_sum"].shape == (2, 60)


def test_arviz_from_numpyro_with_the_stored_plate_site(run):
    """The stored n-row values substituted into the N-row model do not break it."""
    _, y, mcmc = run
    idata = az.from_numpyro(mcmc)
    assert idata.log_likelihood["y"].shape == (2, 60, N)
    assert idata.observed_data["y"].shape == (N,)


def test_predictive_errors(run):
    _, _, mcmc = run
    with pytest.raises(ValueError, match="needs samples"):
        predictive(mcmc.sampler)
    with pytest.raises(ValueError, match="lacks the latent sites"):
        predictive(mcmc, {"p": mcmc.get_samples()["p"]})
    with pytest.raises(ValueError, match="chunk_memory='12 parsecs' is not a memory size"):
        predictive(mcmc, chunk_memory="12 parsecs")
    with pytest.raises(TypeError, match="numpyro_subsample kernel"):
        predictive(object(), {})


def test_predictive_refuses_outputs_beyond_the_memory_budget(run):
    """120 draws × 600 rows: p (float32) and y take 120·600·4 bytes each, 563 kB together;
    a 100 kB budget refuses before computing, naming the sizes and the option; raising the
    budget or keeping fewer sites passes."""
    _, _, mcmc = run
    with pytest.raises(ValueError, match=r"(?s)would return 563\.\d kB.*'p': 120 draws × 600 × "
                                         r"float32 = 281\.\d kB.*max_memory=100\.0 kB.*"
                                         r"max_memory='1\.1 MB'.*return_sites"):
        predictive(mcmc, max_memory="100kB")
    small = predictive(mcmc, return_sites=["p"], max_memory="300kB")
    assert small["p"].shape == (120, N) and small["p"].nbytes == 120 * N * 4
    full = predictive(mcmc, max_memory="1.1MB")
    np.testing.assert_array_equal(full["p"], small["p"])
    with pytest.raises(ValueError, match="max_memory='lots' is not a memory size"):
        predictive(mcmc, max_memory="lots")


def test_predictive_default_budget_refuses_a_4gb_output(run):
    """The issue's case, scaled by the draws: 10^5 rows × 10^4 draws × float32 = 3.7 GB per
    site is beyond the default 1 GB, refused at once (no computation)."""
    _, _, mcmc = run
    beta = np.zeros((10_000, 3), np.float32)
    X = np.zeros((100_000, 3), np.float32)
    with pytest.raises(ValueError, match=r"'p': 10000 draws × 100000 × float32 = 3\.7 GB"):
        predictive(mcmc, {"beta": beta}, X)
    out = predictive(mcmc, {"beta": beta[:2]}, X)  # 2 draws: 1.5 MB
    assert out["p"].shape == (2, 100_000)
