"""ZV refuses a fit that would form a dense p × p matrix with p > MAX_ZV_COVARIATES (the same
check guards ``zv_fit`` on stored draws and on streamed statistics)."""

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_subsample import SGLD
from numpyro_subsample.estimators.zv import MAX_ZV_COVARIATES, check_covariates


def test_check_covariates_bounds_and_message():
    check_covariates(MAX_ZV_COVARIATES, 1)  # at the limit: allowed
    with pytest.raises(ValueError, match=r"p = 2001 covariates.*MAX_ZV_COVARIATES=2000"):
        check_covariates(MAX_ZV_COVARIATES + 1, 1)


def wide_model(y=None):
    """d = MAX_ZV_COVARIATES + 1 independent means, one data plate."""
    mu = numpyro.sample("mu", dist.Normal(0, 1).expand([MAX_ZV_COVARIATES + 1]).to_event(1))
    with numpyro.plate("data", y.shape[0], subsample_size=10) as idx:
        numpyro.sample("y", dist.Normal(mu, 1).to_event(1), obs=y[idx])


def test_streamed_degree1_zv_on_a_wide_model_raises_before_the_fit(monkeypatch):
    from numpyro_subsample.sgmcmc import preprocess

    def no_fit(*args, **kwargs):
        raise AssertionError("the proxy was fitted before the ZV check")

    monkeypatch.setattr(preprocess, "fit_structured", no_fit)
    monkeypatch.setattr(preprocess, "fit_laplace", no_fit)
    y = jnp.zeros((20, MAX_ZV_COVARIATES + 1))
    kernel = SGLD(wide_model, zv_stream=True, progress_bar=False)
    with pytest.raises(ValueError, match="MAX_ZV_COVARIATES"):
        kernel.preprocess((), {"y": y})
