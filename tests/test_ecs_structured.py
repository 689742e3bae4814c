"""Energy-conserving subsampling HMC with a structured posterior proxy (issue 16): diagonal or
low-rank Σ̂ = L Lᵀ, the first-order Taylor likelihood proxy, no d × d array.

Known answers: full-data NUTS on the hierarchical logistic regression (the same reference as
``test_ecs.py``); Σ_i ℓ_i(θ) at a point off the centre for the estimator's unbiasedness.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import logistic_data, logistic_hier_model, nuts_reference, standardised_errors
from numpyro.infer import MCMC

import numpyro_subsample.proxies.choice as choice_module
from numpyro_subsample import EnergyConservingHMC, HMCOptions, LikelihoodOptions
from numpyro_subsample.core.datapass import datum_values_and_grads
from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.ecs.difference import MAX_SIGMA2
from numpyro_subsample.proxies.base import ProxyFitWarning
from numpyro_subsample.proxies.structured import StructuredProxy
from numpyro_subsample.proxies.whitening import whiten_matvec

pytestmark = pytest.mark.fast_compile

N, M = 2000, 100


@pytest.fixture(scope="module")
def data():
    return logistic_data(N=N, d=3, seed=4)


@pytest.fixture(scope="module")
def diagonal_run(data):
    X, y = data
    kernel = EnergyConservingHMC(logistic_hier_model, proxy="diagonal")
    mcmc = MCMC(kernel, num_warmup=250, num_samples=800, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=M, extra_fields=("sigma2",))
    return mcmc


def test_no_variance_warning_where_the_estimator_is_precise(diagonal_run):
    """The diagonal proxy's first-order Taylor on the d = 4 logistic model: σ̂² at proxy draws
    below MAX_SIGMA2, so preprocessing (inside the fixture's run) did not warn."""
    s2 = diagonal_run.sampler.preprocessed.info["sigma2_at_proxy_draws"]
    assert s2.shape == (16,) and np.median(s2) < MAX_SIGMA2, s2


@pytest.mark.slow
def test_diagonal_proxy_matches_full_nuts(data, diagonal_run):
    kernel = diagonal_run.sampler
    pre = kernel.preprocessed
    assert isinstance(pre.proxy, StructuredProxy) and pre.spec == ("taylor", 1)
    samples = diagonal_run.get_samples()
    err, ratio = standardised_errors(samples, nuts_reference("logistic_hier", *data))
    assert np.all(np.abs(err) < 0.2), err
    assert np.all(np.abs(ratio - 1) < 0.2), ratio


def test_structured_estimator_is_unbiased(diagonal_run):
    """E_u[l̂(θ)] = Σ_i ℓ_i(θ) − A within 4 SE at a point 2 proxy sds from the centre (the
    preferential selection, the default), and σ̂² matches the variance of l̂ within 15 %."""
    kernel = diagonal_run.sampler
    pre = kernel.preprocessed
    d = pre.centre.shape[0]
    theta = pre.centre + whiten_matvec(pre.scale_tril, jnp.full((d,), 2.0 / np.sqrt(d)))
    pot, a_sum = kernel.potential, kernel.proxy_constant()

    @jax.jit
    def moments(theta, data):
        ll, s2 = kernel.loglik_estimates(theta, jax.random.PRNGKey(0), 1000, data)
        values, _ = datum_values_and_grads(pot, theta, data)
        return ll, s2, -jnp.sum(values) - a_sum

    ll, s2, exact = (np.asarray(x, np.float64) for x in moments(theta, kernel.preprocessed_data))
    se = ll.std() / np.sqrt(ll.size)
    assert abs(ll.mean() - exact) < 4 * se + 1e-5 * abs(exact), (ll.mean(), exact, se)
    assert abs(s2.mean() / ll.var() - 1) < 0.15, (s2.mean(), ll.var())


def test_structured_proxy_refuses_second_order_terms(data):
    X, y = data
    for kwargs in ({"likelihood": LikelihoodOptions(taylor_order=2)},
                   {"likelihood_proxy": "hybrid"},
                   {"likelihood_proxy": "variational"}):
        kernel = EnergyConservingHMC(logistic_hier_model, proxy="low-rank",
                                     proxy_kwargs={"rank": 2}, **kwargs)
        with pytest.raises(ValueError, match="first-order Taylor"):
            kernel.preprocess((X, y), {"subsample_size": M})
    with pytest.raises(ValueError, match="proxy_kwargs \\['ranks'\\]"):
        EnergyConservingHMC(logistic_hier_model, proxy="low-rank",
                            proxy_kwargs={"ranks": 2}).preprocess((X, y), {"subsample_size": M})


def wide_model(X, y=None, subsample_size=50):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, 1.0), obs=y[idx])


def _avals(jaxpr):
    for eqn in jaxpr.eqns:
        yield from (v.aval for v in eqn.outvars)
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else [p]):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _avals(inner)


def _square(closed, d):
    return [a.shape for a in _avals(closed.jaxpr)
            if sum(s >= d for s in getattr(a, "shape", ())) >= 2]


def test_wide_model_runs_without_a_square_array(monkeypatch):
    """d > MAX_DENSE_DIM (lowered to 200; d = 300 > N = 250, so only a d × d array has two
    dimensions ≥ d): the default proxy is low-rank, the likelihood proxy first-order Taylor;
    preprocessing and a short run work, and no array with two dimensions ≥ d appears in the
    preprocessed arrays or the chain's init and step."""
    monkeypatch.setattr(choice_module, "MAX_DENSE_DIM", 200)
    d, n = 300, 250
    rng = np.random.default_rng(0)
    X = jnp.asarray((3 * rng.normal(size=(n, d)) / np.sqrt(d)).astype(np.float32))
    y = jnp.asarray((X @ rng.normal(size=d) + rng.normal(size=n)).astype(np.float32))
    kernel = EnergyConservingHMC(wide_model, proxy_kwargs={"rank": 10},
                                 hmc=HMCOptions(max_tree_depth=4), chunk_size=125)
    mcmc = MCMC(kernel, num_warmup=50, num_samples=50, progress_bar=False)
    # the first-order proxy leaves the likelihood's quadratic part in d_i: σ̂² ≫ 1, said loudly
    with pytest.warns(ProxyFitWarning, match=r"σ̂² at 16 proxy draws has median .*Raise "
                                             r"subsample_size \(σ̂² ∝ 1/m: no m below N"):
        mcmc.run(jax.random.PRNGKey(0), X, y)
    pre = kernel.preprocessed
    assert np.median(pre.info["sigma2_at_proxy_draws"]) > MAX_SIGMA2
    assert isinstance(pre.proxy, StructuredProxy) and pre.spec == ("taylor", 1)
    assert np.all(np.isfinite(np.asarray(mcmc.get_samples()["beta"])))
    big = [x.shape for x in jax.tree.leaves(pre.params) if sum(s >= d for s in x.shape) >= 2]
    assert big == []
    data = ModelData.from_args((X, y), {})
    init_one, step, params = kernel._programs(pre, num_warmup=50, traced=False)
    assert _square(jax.make_jaxpr(init_one)(jax.random.PRNGKey(1), None, data, params), d) == []
    assert _square(jax.make_jaxpr(step)(mcmc.last_state, data), d) == []
