"""The control variate in the coordinates of the model a reparameterisation came from
(core.likelihood_map, estimators.base)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.reparam import LocScaleReparam

from numpyro_subsample import ModelData, build_potential, configure_estimator
from numpyro_subsample.core.likelihood_map import with_likelihood_map
from numpyro_subsample.estimators.noise_covariance import exact_whitened_covs
from numpyro_subsample.proxies.laplace import proxy_from_moments

KEY = jax.random.PRNGKey(0)
GROUPS = 8


def grouped(g, y=None, subsample_size=20):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", GROUPS):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]], 1.0), obs=None if y is None else y[i])


noncentred = numpyro.handlers.reparam(grouped, config={"a": LocScaleReparam(0)})


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    sizes = np.array([2, 3, 5, 10, 20, 40, 80, 140])
    g = jnp.asarray(np.repeat(np.arange(GROUPS), sizes), jnp.int32)
    a = 0.5 + 0.8 * rng.normal(size=GROUPS)
    y = jnp.asarray(a[np.asarray(g)] + rng.normal(size=g.shape[0]), jnp.float32)
    data = ModelData.from_args((g, y), {})
    centred = build_potential(grouped, data, KEY)
    plain = build_potential(noncentred, data, KEY)
    mapped = with_likelihood_map(plain, centred, data)
    # a proxy centred at log τ = −1 (τ ≈ 0.37), the standardised effects at 0
    values = {"mu": jnp.asarray(0.5), "tau": jnp.asarray(-1.0), "a_decentered": jnp.zeros(GROUPS)}
    centre = jax.flatten_util.ravel_pytree(values)[0]
    cov = 0.05 * jnp.eye(plain.dim)
    proxy = proxy_from_moments(plain, data, centre, cov)
    # a point where the scale differs from the centre's (τ = 1) and the effects a little
    theta = jax.flatten_util.ravel_pytree(
        {"mu": jnp.asarray(0.6), "tau": jnp.asarray(0.0),
         "a_decentered": 0.1 * jnp.linspace(-1.0, 1.0, GROUPS)})[0]
    return data, centred, plain, mapped, proxy, theta


def test_the_map_gives_the_original_terms(setup):
    data, centred, plain, mapped, _, theta = setup
    assert plain.likelihood_map is None and mapped.likelihood_map is not None
    rows = jnp.arange(data.arrays[0].shape[0])
    phi = mapped.likelihood_map.to_original(theta, data)
    np.testing.assert_allclose(plain.data_terms(theta, rows, data),
                               centred.data_terms(phi, rows, data), rtol=1e-5, atol=1e-5)
    # a = μ + τ ã: the original's coordinates hold a, not ã
    a = centred.unravel(phi)["a"]
    np.testing.assert_allclose(a, 0.6 + 0.1 * np.linspace(-1.0, 1.0, GROUPS), rtol=1e-5)


def test_no_map_where_the_terms_differ(setup):
    data, centred, plain, _, _, _ = setup

    def other(g, y=None, subsample_size=20):  # the same sites, another likelihood
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfNormal(1.0))
        with numpyro.plate("groups", GROUPS):
            a = numpyro.sample("a", dist.Normal(mu, tau))
        with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
            numpyro.sample("y", dist.Normal(a[g[i]], 2.0), obs=None if y is None else y[i])

    assert with_likelihood_map(plain, build_potential(other, data, KEY), data) is plain


def _estimates(est, theta, data, num_draws):
    keys = jax.random.split(jax.random.PRNGKey(3), num_draws)
    return np.asarray(jax.jit(jax.vmap(est.estimate, in_axes=(None, 0, None, None)))(
        est.params, keys, theta, data)[0], np.float64)


@pytest.mark.parametrize("store", [True, False])
def test_the_mapped_control_variate_is_unbiased_with_its_exact_noise(setup, store):
    data, _, _, mapped, proxy, theta = setup
    proxy = proxy if store else proxy._replace(datum_grads=None)
    est = configure_estimator("cv", mapped, data, proxy)
    assert est.params[1].map_inverse is not None
    full = np.asarray(jax.grad(lambda t: mapped.terms(t, jnp.arange(mapped.num_data), data)[0]
                               + mapped.data_terms(t, jnp.arange(mapped.num_data), data).sum()
                               )(theta), np.float64)
    g = _estimates(est, theta, data, 20_000)
    se = g.std(0) / np.sqrt(g.shape[0])
    assert np.all(np.abs(g.mean(0) - full) < 4.5 * se + 1e-4 * np.abs(full)), (g.mean(0), full)
    # the exact noise covariance (identity whitening) is the estimates' covariance
    cov = exact_whitened_covs(est, theta[None], jnp.eye(mapped.dim), data, chunk_size=64)[0]
    dev = g - g.mean(0)
    q = (dev**2).sum(1)
    z = (q.mean() - np.trace(cov)) / (q.std() / np.sqrt(len(q)))
    assert abs(z) < 4.5, z


def test_the_mapped_control_variate_removes_the_scale_s_noise(setup):
    """Where the scale differs from the centre's, the Taylor term in ã leaves residuals
    (τ − τ̂) ∂f_i/∂a; in a they shrink with a − â (here 0.1 against τ − τ̂ = 0.63)."""
    data, _, plain, mapped, proxy, theta = setup
    eye = jnp.eye(plain.dim)
    in_theta = exact_whitened_covs(configure_estimator("cv", plain, data, proxy), theta[None],
                                   eye, data)[0]
    in_phi = exact_whitened_covs(configure_estimator("cv", mapped, data, proxy), theta[None],
                                 eye, data)[0]
    assert np.trace(in_phi) < 0.2 * np.trace(in_theta), (np.trace(in_phi), np.trace(in_theta))
    # at the centre both are exact
    at_centre = exact_whitened_covs(configure_estimator("cv", mapped, data, proxy),
                                    proxy.centre[None], eye, data)[0]
    assert np.abs(at_centre).max() < 1e-6
