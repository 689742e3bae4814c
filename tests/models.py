"""Test models with known answers, shared by the test modules."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import constrain_fn, potential_energy

NOISE_SD = 1.0
PRIOR_SD = 10.0


def linreg_model(X, y=None, subsample_size=100):
    """Conjugate Bayesian linear regression with known noise sd."""
    beta = numpyro.sample("beta", dist.Normal(0.0, PRIOR_SD).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, NOISE_SD), obs=y[idx])


def linreg_data(N=10_000, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = np.concatenate([np.ones((N, 1)), rng.normal(size=(N, d - 1))], 1).astype(np.float32)
    beta = rng.normal(size=d)
    y = (X @ beta + NOISE_SD * rng.normal(size=N)).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)


def linreg_exact(X, y):
    """Exact posterior mean and sd of beta (float64)."""
    X = np.asarray(X, np.float64)
    y = np.asarray(y, np.float64)
    prec = X.T @ X / NOISE_SD**2 + np.eye(X.shape[1]) / PRIOR_SD**2
    cov = np.linalg.inv(prec)
    mean = cov @ X.T @ y / NOISE_SD**2
    return mean, np.sqrt(np.diag(cov))


def logistic_hier_model(X, y=None, subsample_size=100):
    """Logistic regression with a constrained (HalfNormal) prior scale on the coefficients."""
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, tau).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def logistic_model(X, y=None, subsample_size=100):
    """Logistic regression, prior N(0, 10²) (the issues' benchmark model)."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def logistic_data(N=5_000, d=4, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    X = np.concatenate([np.ones((N, 1)), rng.normal(size=(N, d - 1))], 1).astype(np.float32)
    beta = scale * rng.normal(size=d)
    p = 1 / (1 + np.exp(-(X @ beta)))
    y = (rng.uniform(size=N) < p).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)


@functools.lru_cache(maxsize=8)
def _nuts_cached(model_name, data_key, num_warmup, num_samples, num_chains):
    model = {"logistic_hier": logistic_hier_model, "logistic": logistic_model}[model_name]
    X, y = _DATA[data_key]
    mcmc = MCMC(
        NUTS(model), num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
        chain_method="vectorized", progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(12345), X, y, subsample_size=X.shape[0])
    return {k: np.asarray(v) for k, v in mcmc.get_samples().items()}


_DATA: dict = {}


def nuts_reference(model_name, X, y, num_warmup=500, num_samples=2000, num_chains=2):
    """Full-data NUTS draws (cached per process) of a model from this module."""
    key = (id(X), id(y))
    _DATA[key] = (X, y)
    return _nuts_cached(model_name, key, num_warmup, num_samples, num_chains)


def standardised_errors(samples: dict, reference: dict):
    """Per-coordinate (mean error / ref sd, sd ratio) over the sites of the reference."""
    errs, ratios = [], []
    for k, ref in reference.items():
        s = np.asarray(samples[k]).reshape(np.asarray(samples[k]).shape[0], -1)
        r = ref.reshape(ref.shape[0], -1)
        errs.append((s.mean(0) - r.mean(0)) / r.std(0))
        ratios.append(s.std(0) / r.std(0))
    return np.concatenate(errs), np.concatenate(ratios)


def importance_moments(model, X, y, num_draws=20_000, df=5.0, proxy=None):
    """Posterior mean and sd (float64) of every latent site, constrained, by self-normalised
    importance sampling on the full data, and the weights' effective sample size.

    The proposal is a multivariate t (``df``) with the package's Laplace fit as centre and
    scale (``proxy``, fitted if None), in the unconstrained space; the target's density and
    the constraining transforms are NumPyro's own (independent of the package's potential).
    With an effective sample size S the moments' Monte Carlo error is about sd/√S.
    """
    from numpyro_subsample import ModelData, build_potential, fit_laplace

    data = ModelData.from_args((X, y), {})
    pot = build_potential(model, data, jax.random.PRNGKey(0))
    if proxy is None:
        proxy = fit_laplace(pot, data, jax.random.PRNGKey(1), check_chain=False)
    d = proxy.centre.shape[0]
    kz, kc = jax.random.split(jax.random.PRNGKey(11))
    z = jax.random.normal(kz, (num_draws, d), proxy.centre.dtype)
    u = z * jnp.sqrt(df / jax.random.chisquare(kc, df, (num_draws, 1), proxy.centre.dtype))
    theta = proxy.centre + u @ proxy.scale_tril.T
    kwargs = {"subsample_size": X.shape[0]}

    def at(t, X, y):
        params = pot.unravel(t)
        return (potential_energy(model, (X, y), kwargs, params),
                constrain_fn(model, (X, y), kwargs, params))

    energy, sites = jax.jit(
        lambda th, X, y: jax.lax.map(lambda t: at(t, X, y), th, batch_size=500))(theta, X, y)
    # log target − log proposal, up to constants: −U(θ) + (df + d)/2 log(1 + |u|²/df)
    log_w = -np.asarray(energy, np.float64) + 0.5 * (df + d) * np.log1p(
        np.sum(np.asarray(u, np.float64) ** 2, 1) / df)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    moments = {}
    for name, v in sites.items():
        v = np.asarray(v, np.float64).reshape(num_draws, -1)
        mean = w @ v
        moments[name] = (mean, np.sqrt(w @ (v - mean) ** 2))
    return moments, 1.0 / np.sum(w**2)


def moment_errors(samples: dict, moments: dict):
    """Per-coordinate (mean error / sd, sd ratio) against reference moments
    (:func:`importance_moments`), over the sites of the reference."""
    errs, ratios = [], []
    for k, (mean, sd) in moments.items():
        s = np.asarray(samples[k], np.float64)
        s = s.reshape(s.shape[0], -1)
        errs.append((s.mean(0) - mean) / sd)
        ratios.append(s.std(0) / sd)
    return np.concatenate(errs), np.concatenate(ratios)
