"""Energy-conserving subsampling HMC (paper 003): estimator, proxies, accuracy vs full NUTS."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import (
    logistic_data,
    logistic_hier_model,
    logistic_model,
    nuts_reference,
    standardised_errors,
)
from numpyro.infer import MCMC
from numpyro.infer.autoguide import AutoMultivariateNormal

from numpyro_subsample import EnergyConservingHMC
from numpyro_subsample.core.datapass import datum_values_and_grads
from numpyro_subsample.datasets import make_quasi_separated

N, M = 2000, 100
FIELDS = ("sigma2", "index_accept_prob", "accept_prob")
# logistic_hier_model is a logistic regression with a constrained hyperparameter (tau ~
# HalfNormal): both requirements of the issue on one model keeps the file inside its budget.


@pytest.fixture(scope="module")
def data():
    return logistic_data(N=N, d=3, seed=4)


@pytest.fixture(scope="module")
def reference(data):
    return nuts_reference("logistic_hier", *data)


def _run(kernel, X, y, seed, num_warmup=250, num_samples=800):
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), X, y, subsample_size=M, extra_fields=FIELDS)
    return mcmc


@pytest.fixture(scope="module")
def taylor_run(data):
    X, y = data
    return _run(EnergyConservingHMC(logistic_hier_model, proxy="taylor", selection="uniform"),
                X, y, 0)


@pytest.fixture(scope="module")
def hybrid_run(data):
    """Second-order hybrid with Hansen-Hurwitz (preferential) selection of the subsample."""
    X, y = data
    kernel = EnergyConservingHMC(logistic_hier_model, proxy="hybrid", hybrid_order=2,
                                 selection="preferential")
    return _run(kernel, X, y, 1)


def _reusing_guide(data, hybrid_run, **kwargs):
    """A kernel reusing the hybrid run's fitted guide (no second SVI), preprocessed."""
    X, y = data
    info = hybrid_run.sampler.proxy.info
    kernel = EnergyConservingHMC(
        logistic_hier_model,
        proxy_kwargs={"guide": info["guide"], "guide_params": info["guide_params"]}, **kwargs,
    )
    kernel.preprocess((X, y), {"subsample_size": M})
    return kernel


@pytest.fixture(scope="module")
def variational_kernel(data, hybrid_run):
    """The paper's variational proxy."""
    return _reusing_guide(data, hybrid_run, proxy="variational", selection="uniform")


@pytest.fixture(scope="module")
def kernels(data, taylor_run, hybrid_run, variational_kernel):
    """Proxy / selection variants, preprocessed only (sampling is tested above)."""
    X, y = data
    out = {"taylor": taylor_run.sampler, "hybrid2-hh": hybrid_run.sampler,
           "variational": variational_kernel,
           "hybrid1": _reusing_guide(data, hybrid_run, proxy="hybrid", hybrid_order=1)}
    k = EnergyConservingHMC(logistic_hier_model, proxy="taylor", taylor_order=1,
                            selection="preferential")
    k.preprocess((X, y), {"subsample_size": M})
    out["taylor1-hh"] = k
    return out


def _check_accuracy(mcmc, ref, mean_tol=0.2, sd_tol=0.2):
    samples = mcmc.get_samples()
    assert np.all(samples["tau"] > 0)
    err, ratio = standardised_errors(samples, ref)
    assert np.all(np.abs(err) < mean_tol), err
    assert np.all(np.abs(ratio - 1) < sd_tol), ratio


def test_taylor_matches_full_nuts(reference, taylor_run):
    """Second-order Taylor proxy: means within 0.2 sd, sds within 20% of full-data NUTS
    (all sites, tau included)."""
    _check_accuracy(taylor_run, reference)
    ex = taylor_run.get_extra_fields()
    assert np.median(ex["sigma2"]) < 0.5
    assert ex["index_accept_prob"].mean() > 0.8
    assert 0.5 < ex["accept_prob"].mean() <= 1.0


def test_hybrid_matches_full_nuts(reference, hybrid_run):
    """Second-order hybrid + preferential selection: 0.2 sd / 20% vs full-data NUTS."""
    _check_accuracy(hybrid_run, reference)
    ex = hybrid_run.get_extra_fields()
    assert np.median(ex["sigma2"]) < 1.0
    assert ex["index_accept_prob"].mean() > 0.5


def _moments_fn(kernel, K):
    """jit: θ -> (l̂ over K subsamples, σ̂² over them, exact Σℓ_i(θ) − A)."""
    pre = kernel.preprocessed
    estimate = kernel._estimate_fn(pre)
    a_sum = jnp.sum(pre.datum_aux(jnp.arange(pre.potential.num_data))[0])
    keys = jax.random.split(jax.random.PRNGKey(0), K)

    @jax.jit
    def fn(theta):
        w = jax.scipy.linalg.solve_triangular(pre.tril, theta - pre.ref, lower=True)

        def one(key):
            idx = kernel._draw_indices(pre, key, pre.subsample_size)
            _, loglik, sigma2 = estimate(w, idx, pre.datum_aux(idx))
            return loglik, sigma2

        ll, s2 = jax.lax.map(one, keys, batch_size=100)
        values, _ = datum_values_and_grads(pre.potential, theta)
        return ll, s2, -jnp.sum(values) - a_sum

    return fn


def _proxy_draws(kernel, num):
    pre = kernel.preprocessed
    eps = jax.random.normal(jax.random.PRNGKey(7), (num, pre.ref.shape[0]))
    return pre.ref + eps @ pre.tril.T


@pytest.mark.parametrize("which", ["taylor", "taylor1-hh", "hybrid1", "hybrid2-hh",
                                   "variational"])
def test_loglik_estimator_unbiased_and_variance(which, kernels):
    """At a point 2 proxy-sds from the centre: E_u[l̂(θ)] = Σ_i ℓ_i(θ) within 4 SE, and the
    mean σ̂² matches the variance of l̂ over subsamples within 15% (uniform and
    Hansen-Hurwitz selection)."""
    kernel = kernels[which]
    pre = kernel.preprocessed
    d = pre.ref.shape[0]
    theta = pre.ref + pre.tril @ jnp.full((d,), 2.0 / np.sqrt(d))
    ll, s2, exact = (np.asarray(x, np.float64) for x in _moments_fn(kernel, 1000)(theta))
    se = ll.std() / np.sqrt(ll.size)
    assert abs(ll.mean() - exact) < 4 * se + 1e-5 * abs(exact), (ll.mean(), exact, se)
    assert abs(s2.mean() / ll.var() - 1) < 0.15, (s2.mean(), ll.var())


def test_variational_proxy_ignores_state_and_hybrid_fixes_it(hybrid_run, variational_kernel):
    """Paper 003's observation, measured: σ̂² of the pure variational proxy at draws from the
    posterior approximation is far above the hybrid's (its θ-dependence cancels in l̂)."""
    f_v = _moments_fn(variational_kernel, 200)
    f_h = _moments_fn(hybrid_run.sampler, 200)
    s2_v, s2_h = [], []
    for theta in _proxy_draws(hybrid_run.sampler, 8):
        s2_v.append(np.median(f_v(theta)[1]))
        s2_h.append(np.median(f_h(theta)[1]))
    assert np.median(s2_v) > 10 * np.median(s2_h), (s2_v, s2_h)


def test_variational_proxy_total_is_elbo_identity(variational_kernel):
    """Σ_i q_i(θ) = ELBO + log q(θ) − log π(θ) ≈ Σ_i ℓ_i(θ) (Eq. 2-3): the difference is the
    same constant −KL(q‖p) ≤ 0 at every θ, up to the non-Gaussianity of the posterior."""
    kernel = variational_kernel
    pot = kernel.preprocessed.potential
    full = jax.jit(lambda t: -jnp.sum(datum_values_and_grads(pot, t)[0]))
    total = jax.jit(kernel.proxy_total)
    gaps = np.asarray([float(total(t) - full(t)) for t in _proxy_draws(kernel, 10)])
    assert gaps.std() < 0.5, gaps
    assert -2.0 < gaps.mean() < 0.3, gaps


def test_bad_settings_raise(data):
    X, y = data
    with pytest.raises(ValueError, match="proxy must be"):
        EnergyConservingHMC(logistic_hier_model, proxy="laplace")
    with pytest.raises(ValueError, match="taylor_order"):
        EnergyConservingHMC(logistic_hier_model, taylor_order=3)
    with pytest.raises(ValueError, match="hybrid_order"):
        EnergyConservingHMC(logistic_hier_model, proxy="hybrid", hybrid_order=3)
    with pytest.raises(ValueError, match="selection"):
        EnergyConservingHMC(logistic_hier_model, selection="pps")
    with pytest.raises(ValueError, match="uniform_mix"):
        EnergyConservingHMC(logistic_hier_model, selection="preferential", uniform_mix=0.0)
    with pytest.raises(ValueError, match="multiple of num_blocks"):
        EnergyConservingHMC(logistic_hier_model, num_blocks=7).preprocess(
            (X, y), {"subsample_size": M}
        )


def quasi_separated_data(N=2000):
    """Quasi-separated logistic regression (datasets.make_quasi_separated): the rare feature's
    coefficient has a wide, right-skewed posterior (skewness ≈ 1), Laplace is poor."""
    ds = make_quasi_separated(N)
    return jnp.asarray(ds.X_train), jnp.asarray(ds.y_train)


def test_sigma2_ordering_poor_laplace():
    """Quasi-separated logistic regression (N = 2000, m = 100): mean over 12 full-data NUTS
    draws of σ̂² (itself a mean over 200 subsamples). Measured (docs/variational_ecs.md):
    hybrid-2 ≈ 0.1 vs Taylor-2 ≈ 0.5; Hansen-Hurwitz selection ≈ 100× lower than uniform.
    The guide is the Gaussian with the posterior's moments, passed as ``guide_params``, so the
    test checks the L²(q) projection itself, independent of SVI's accuracy.
    """
    X, y = quasi_separated_data()
    ref = nuts_reference("logistic", X, y, num_warmup=300, num_samples=600, num_chains=1)
    beta = ref["beta"]
    guide = AutoMultivariateNormal(logistic_model)
    params = {"auto_loc": jnp.asarray(beta.mean(0), jnp.float32),
              "auto_scale_tril": jnp.asarray(np.linalg.cholesky(np.cov(beta.T)), jnp.float32)}
    gk = {"guide": guide, "guide_params": params}
    variants = {"taylor2": dict(proxy="taylor", selection="uniform"),
                "hybrid2": dict(proxy="hybrid", proxy_kwargs=gk, selection="uniform"),
                "taylor2-hh": dict(proxy="taylor"),  # preferential is the default
                "hybrid2-hh": dict(proxy="hybrid", proxy_kwargs=gk)}
    thetas = jnp.asarray(beta[:: beta.shape[0] // 12][:12])
    mean_s2 = {}
    for name, kw in variants.items():
        k = EnergyConservingHMC(logistic_model, **kw)
        k.preprocess((X, y), {"subsample_size": M})
        fn = jax.jit(lambda t, k=k: jnp.mean(k.loglik_estimates(t, jax.random.PRNGKey(3),
                                                                  200)[1]))
        mean_s2[name] = float(np.mean([fn(t) for t in thetas]))
    assert mean_s2["hybrid2"] < 0.5 * mean_s2["taylor2"], mean_s2
    assert mean_s2["taylor2-hh"] < 0.2 * mean_s2["taylor2"], mean_s2
    assert mean_s2["hybrid2-hh"] < 0.2 * mean_s2["hybrid2"], mean_s2
