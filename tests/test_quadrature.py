"""A scalar local latent site integrated out of each datum's term by adaptive Gauss-Hermite
quadrature (numpyro_subsample.core.quadrature), the default of SGLD, SGHMC and SGNHT."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import stats
from scipy.special import gammaln

from numpyro_subsample import MCMC, SGHMC, SGLD, LocalConfig
from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.potential import build_potential
from numpyro_subsample.core.quadrature import QuadratureWarning, integrate_local


def effect_model(y, n=100):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=n) as i:
        z = numpyro.sample("z", dist.Normal(0.0, 0.5))
        numpyro.sample("y", dist.Normal(mu + z, 1.0), obs=y[i])


def gamma_poisson(y, n=200):
    """y_i ~ Poisson(λ z_i), z_i ~ Gamma(2, 2): p(y_i | λ) is negative binomial."""
    lam = numpyro.sample("lam", dist.Gamma(2.0, 1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=n) as i:
        z = numpyro.sample("z", dist.Gamma(2.0, 2.0))
        numpyro.sample("y", dist.Poisson(lam * z), obs=y[i])


def negbin_logpmf(y, lam, a=2.0, b=2.0):
    return (gammaln(y + a) - gammaln(a) - gammaln(y + 1) + a * np.log(b / (b + lam))
            + y * np.log(lam / (b + lam)))


def squared_effect(y, n=50):
    """y_i ~ N(μ + z_i² + z_i / 2, 0.3): z_i's conditional has two modes of unequal mass, and
    a rule centred at one of them misses the other."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=n) as i:
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu + z**2 + 0.5 * z, 0.3), obs=y[i])


def _integrated(model, *args):
    data = ModelData.from_args(args, {})
    return integrate_local(build_potential(model, data, jax.random.PRNGKey(0))), data


def test_a_gaussian_local_site_is_integrated_exactly():
    """z_i ~ N(0, 0.5²), y_i ~ N(μ + z_i, 1): f_i(μ) = −log N(y_i | μ, 1.25) and its gradient,
    to float32 rounding (a Gauss-Hermite rule at the mode is exact for a Gaussian)."""
    y = np.random.default_rng(0).normal(1.0, 1.2, size=300).astype(np.float32)
    pot, data = _integrated(effect_model, y)
    assert pot.integrated_sites == ("z",) and not pot.local and pot.dim == 1
    idx = jnp.arange(y.size)
    for mu in (-2.0, 0.7, 3.0):
        theta = jnp.asarray([mu], jnp.float32)
        fi = np.asarray(pot.terms(theta, idx, data)[1])
        exact = -stats.norm.logpdf(y, mu, np.sqrt(1.25))
        np.testing.assert_allclose(fi, exact, atol=2e-5)
        g = jax.grad(lambda t: pot.terms(t, idx, data)[1].sum())(theta)
        np.testing.assert_allclose(float(g[0]), -np.sum(y - mu) / 1.25, rtol=1e-4)


def test_a_positive_site_matches_the_negative_binomial_marginal():
    """A Gamma local site (integrated in its log coordinate, with the Jacobian, where its
    conditional is skewed): each f_i within 1e-3 nats of −log NegBin(y_i | λ) and the
    gradient in log λ within 0.1 % with the default 15 nodes."""
    rng = np.random.default_rng(1)
    y = rng.poisson(3.0 * rng.gamma(2.0, 0.5, size=400)).astype(np.float32)
    pot, data = _integrated(gamma_poisson, y)
    idx = jnp.arange(y.size)
    for lam in (1.0, 3.0, 8.0):
        theta = jnp.asarray([np.log(lam)], jnp.float32)  # λ's unconstrained coordinate
        fi = np.asarray(pot.terms(theta, idx, data)[1], np.float64)
        np.testing.assert_allclose(fi, -negbin_logpmf(y, lam), atol=1e-3)
        g = float(jax.grad(lambda t: pot.terms(t, idx, data)[1].sum())(theta)[0])
        # d/d log λ of −Σ log NegBin = −Σ (y − (y + a) λ / (b + λ))
        exact = -np.sum(y - (y + 2.0) * lam / (2.0 + lam))
        assert abs(g - exact) <= 1e-3 * abs(exact) + 1e-3, (lam, g, exact)


@pytest.mark.parametrize("kernel", [SGLD, SGHMC])
def test_default_run_with_a_positive_local_site_is_right_and_silent(kernel):
    """``kernel(gamma_poisson)`` at default arguments: λ's mean within 0.15 posterior sd and
    its log-sd within 0.15 of the exact marginal posterior (a grid over λ of the negative
    binomial likelihood), no warning; the site is integrated, and the chain's usual path
    (Laplace proxy, control variates) runs."""
    rng = np.random.default_rng(2)
    y = rng.poisson(3.0 * rng.gamma(2.0, 0.5, size=2000)).astype(np.float32)
    grid = np.linspace(1.5, 5.0, 4001)
    log_post = np.array([negbin_logpmf(y, g).sum() for g in grid]) + stats.gamma.logpdf(grid, 2.0)
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    mean = np.sum(w * grid)
    sd = np.sqrt(np.sum(w * (grid - mean) ** 2))
    k = kernel(gamma_poisson)
    mcmc = MCMC(k, num_warmup=1000, num_samples=5000, num_chains=2, chain_method="vectorized",
                progress_bar=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), y)
    assert not [w for w in seen if issubclass(w.category, UserWarning)], [
        str(w.message) for w in seen]
    assert k.potential.integrated_sites == ("z",) and k.estimator_name == "cv"
    s = np.asarray(mcmc.get_samples()["lam"])
    assert "z" not in mcmc.get_samples()
    assert abs(s.mean() - mean) / sd < 0.15, (s.mean(), mean, sd)
    assert abs(np.log(s.std() / sd)) < 0.15, (s.std(), sd)


def test_a_conditional_the_rule_does_not_resolve_warns_with_the_remedy():
    """Two modes of z_i given y_i: the 15- and 31-node rules' gradients differ by many
    posterior sd, and the preprocessing warns naming the site, the figure and both
    remedies."""
    rng = np.random.default_rng(3)
    y = (1.0 + rng.normal(size=300) ** 2 + 0.3 * rng.normal(size=300)).astype(np.float32)
    with pytest.warns(QuadratureWarning, match=r"local site 'z' .* 15 Gauss-Hermite nodes.*"
                                               r"[0-9.]+ posterior sd.*"
                                               r"LocalConfig\(nodes=31\).*LocalConfig\(nodes=0\)"):
        SGLD(squared_effect, bias_probe=False, progress_bar=False).preprocess((y,))


def test_nodes_zero_draws_the_site_and_bad_nodes_are_refused():
    y = np.zeros(200, np.float32)
    k = SGLD(effect_model, local=LocalConfig(nodes=0), estimator="uniform")
    assert k.potential_for(ModelData.from_args((y,), {})).local_sites == ("z",)
    with pytest.raises(ValueError, match="nodes"):
        SGLD(effect_model, local=LocalConfig(nodes=-1))


def test_the_variational_proxy_is_refused_with_an_integrated_site():
    y = np.random.default_rng(4).normal(size=200).astype(np.float32)
    with pytest.raises(ValueError, match=r"integrated out.*proxy='laplace'.*nodes=0"):
        SGLD(effect_model, proxy="variational", progress_bar=False).preprocess((y,))
