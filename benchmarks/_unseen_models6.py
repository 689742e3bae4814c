"""A sixth batch of hierarchical models not tuned on (``bench_models.py --batch 6``), written as
users write them, with their data generators: group-scale priors that vanish at 0, which keep
a centred model's joint mode finite.

``gamma-scale-poisson`` (Poisson counts with varying intercepts, the group scale with a
Gamma(2, 4) prior, centred; 120 groups of 1 to 1,500 rows), ``lognormal-nested`` (pupils in
schools in districts, normal likelihood, both group scales LogNormal(−1, 1), centred) and
``invgamma-scale-logit`` (Bernoulli varying intercepts, the group sd itself with an
InverseGamma(2, 1) prior, centred; 100 groups).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _unseen_models import problems_from
from _unseen_models2 import _rows
from _unseen_models4 import _noncentred


def gamma_poisson_data(groups=120, seed=601):
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(3.5, 1.5, groups)), 1, 1500).astype(int)
    g = _rows(rng, sizes)
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.3 + 0.35 * rng.normal(size=groups)
    y = rng.poisson(np.exp(a[g] + 0.4 * x)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def gamma_scale_poisson(g, x, y=None, groups=120, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    sigma = numpyro.sample("sigma", dist.Gamma(2.0, 4.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, sigma))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Poisson(jnp.exp(a[g[i]] + b * x[i])),
                       obs=None if y is None else y[i])


def nested_data(districts=12, schools=80, seed=602):
    rng = np.random.default_rng(seed)
    district_of = rng.integers(0, districts, schools).astype(np.int32)
    sizes = np.clip(np.round(rng.lognormal(4.0, 1.0, schools)), 2, 1500).astype(int)
    school = _rows(rng, sizes)
    d = 0.4 * rng.normal(size=districts)
    s = d[district_of] + 0.3 * rng.normal(size=schools)
    y = (1.0 + s[school] + 1.0 * rng.normal(size=school.size)).astype(np.float32)
    return (school, district_of, y), {"N": int(school.size), "schools": schools,
                                      "districts": districts}


def lognormal_nested(school, district_of, y=None, districts=12, schools=80,
                     subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau_d = numpyro.sample("tau_d", dist.LogNormal(-1.0, 1.0))
    tau_s = numpyro.sample("tau_s", dist.LogNormal(-1.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("districts", districts):
        d = numpyro.sample("d", dist.Normal(mu, tau_d))
    with numpyro.plate("schools", schools):
        s = numpyro.sample("s", dist.Normal(d[district_of], tau_s))
    with numpyro.plate("data", school.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(s[school[i]], sigma), obs=None if y is None else y[i])


def invgamma_logit_data(groups=100, seed=603):
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(4.2, 1.2, groups)), 3, 2500).astype(int)
    g = _rows(rng, sizes)
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.2 + 0.6 * rng.normal(size=groups)
    p = 1 / (1 + np.exp(-(a[g] - 0.5 * x)))
    y = (rng.uniform(size=g.size) < p).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def invgamma_scale_logit(g, x, y=None, groups=100, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.5))
    sigma = numpyro.sample("sigma", dist.InverseGamma(2.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.5))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, sigma))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(logits=a[g[i]] + b * x[i]),
                       obs=None if y is None else y[i])


#: name: (model, data generator, compared sites, the model NUTS runs where it differs)
_TABLE = {
    "gamma-scale-poisson": (gamma_scale_poisson, gamma_poisson_data, ("mu", "sigma", "b", "a"),
                            _noncentred(gamma_scale_poisson, "a")),
    "lognormal-nested": (lognormal_nested, nested_data,
                         ("mu", "tau_d", "tau_s", "sigma", "d", "s"),
                         _noncentred(lognormal_nested, "d", "s")),
    "invgamma-scale-logit": (invgamma_scale_logit, invgamma_logit_data,
                             ("mu", "sigma", "b", "a"), _noncentred(invgamma_scale_logit, "a")),
}


def suite(names=None):
    """The sixth batch's problems (all, or ``names``), in the table's order."""
    return problems_from(_TABLE, names)
