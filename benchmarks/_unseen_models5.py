"""A fifth batch of hierarchical models not tuned on (``bench_models.py --batch 5``), written as
users write them, with their data generators: scale priors of other families.

``bugs-precision`` (a centred normal model written BUGS-style: group and noise precisions with
Gamma(0.001, 0.001) priors, sd = 1/√precision; 60 groups of 1 to 800 rows),
``lognormal-scale-logit`` (Bernoulli varying intercepts, the group scale with a LogNormal(−1, 1)
prior, centred; 90 groups) and ``truncnormal-poisson-slopes`` (Poisson counts with varying
intercepts and slopes, each scale with a TruncatedNormal(0, 1, low=0) prior, centred; 50
groups).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _unseen_models import problems_from
from _unseen_models2 import _rows
from _unseen_models4 import _noncentred


def bugs_precision_data(groups=60, seed=501):
    rng = np.random.default_rng(seed)
    sizes = np.maximum(1, np.round(np.geomspace(1, 800, groups))).astype(int)
    g = _rows(rng, sizes)
    x = rng.normal(size=g.size).astype(np.float32)
    a = 2.0 + 0.5 * rng.normal(size=groups)
    y = (a[g] + 0.7 * x + 1.5 * rng.normal(size=g.size)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def bugs_precision(g, x, y=None, groups=60, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1000.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1000.0))
    tau_a = numpyro.sample("tau_a", dist.Gamma(0.001, 0.001))
    tau_y = numpyro.sample("tau_y", dist.Gamma(0.001, 0.001))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, 1.0 / jnp.sqrt(tau_a)))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]] + b * x[i], 1.0 / jnp.sqrt(tau_y)),
                       obs=None if y is None else y[i])


def lognormal_logit_data(groups=90, seed=502):
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(4.0, 1.3, groups)), 2, 2000).astype(int)
    g = _rows(rng, sizes)
    x = rng.normal(size=g.size).astype(np.float32)
    a = -0.5 + 0.4 * rng.normal(size=groups)
    p = 1 / (1 + np.exp(-(a[g] + 0.8 * x)))
    y = (rng.uniform(size=g.size) < p).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def lognormal_scale_logit(g, x, y=None, groups=90, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.5))
    sigma = numpyro.sample("sigma", dist.LogNormal(-1.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.5))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, sigma))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(logits=a[g[i]] + b * x[i]),
                       obs=None if y is None else y[i])


def truncnormal_data(groups=50, seed=503):
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(4.5, 1.0, groups)), 3, 1500).astype(int)
    g = _rows(rng, sizes)
    x = rng.normal(size=g.size).astype(np.float32)
    a = 1.0 + 0.3 * rng.normal(size=groups)
    b = 0.2 + 0.15 * rng.normal(size=groups)
    y = rng.poisson(np.exp(a[g] + b[g] * x)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def truncnormal_poisson_slopes(g, x, y=None, groups=50, subsample_size=500):
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 2.0))
    mu_b = numpyro.sample("mu_b", dist.Normal(0.0, 1.0))
    s_a = numpyro.sample("s_a", dist.TruncatedNormal(0.0, 1.0, low=0.0))
    s_b = numpyro.sample("s_b", dist.TruncatedNormal(0.0, 1.0, low=0.0))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu_a, s_a))
        b = numpyro.sample("b", dist.Normal(mu_b, s_b))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Poisson(jnp.exp(a[g[i]] + b[g[i]] * x[i])),
                       obs=None if y is None else y[i])


#: name: (model, data generator, compared sites, the model NUTS runs where it differs)
_TABLE = {
    "bugs-precision": (bugs_precision, bugs_precision_data,
                       ("mu", "b", "tau_a", "tau_y", "a"), _noncentred(bugs_precision, "a")),
    "lognormal-scale-logit": (lognormal_scale_logit, lognormal_logit_data,
                              ("mu", "sigma", "b", "a"), _noncentred(lognormal_scale_logit, "a")),
    "truncnormal-poisson-slopes": (truncnormal_poisson_slopes, truncnormal_data,
                                   ("mu_a", "mu_b", "s_a", "s_b", "a", "b"),
                                   _noncentred(truncnormal_poisson_slopes, "a", "b")),
}


def suite(names=None):
    """The fifth batch's problems (all, or ``names``), in the table's order."""
    return problems_from(_TABLE, names)
