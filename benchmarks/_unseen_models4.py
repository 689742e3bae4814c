"""A fourth batch of hierarchical models not tuned on (``bench_models.py --batch 4``), written as
users write them, with their data generators: the group-effect structures that partial
centring meets.

``crossed-3way`` (three crossed groupings of 25, 10 and 4 levels beside an intercept, each with
a HalfNormal scale), ``sizes-exponential`` (200 groups of 1 to 3,000 rows, Bernoulli, an
Exponential scale prior, centred), ``invgamma-nested`` (counties in states, the county
variance with an InverseGamma prior), ``probit-slopes`` (varying slopes without varying
intercepts, probit link, centred), ``poisson-group-predictor`` (group effects with a group
covariate and a HalfCauchy scale, Poisson counts with an exposure) and ``hetero-groups``
(group means and group log noise scales, both hierarchical and centred).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _unseen_models import problems_from
from _unseen_models2 import _rows, _sizes
from jax.scipy.stats import norm
from numpyro.infer.reparam import LocScaleReparam


def crossed3_data(seed=301):
    rng = np.random.default_rng(seed)
    n = 12000
    j, k, m = (rng.integers(0, L, n).astype(np.int32) for L in (25, 10, 4))
    u, v, w = 0.5 * rng.normal(size=25), 0.3 * rng.normal(size=10), 0.8 * rng.normal(size=4)
    y = (1.0 + u[j] + v[k] + w[m] + 1.2 * rng.normal(size=n)).astype(np.float32)
    return (j, k, m, y), {"N": n}


def crossed_3way(j, k, m, y=None, subsample_size=500):
    b0 = numpyro.sample("b0", dist.Normal(0, 5))
    su = numpyro.sample("su", dist.HalfNormal(1))
    sv = numpyro.sample("sv", dist.HalfNormal(1))
    sw = numpyro.sample("sw", dist.HalfNormal(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    with numpyro.plate("j", 25):
        u = numpyro.sample("u", dist.Normal(0, su))
    with numpyro.plate("k", 10):
        v = numpyro.sample("v", dist.Normal(0, sv))
    with numpyro.plate("m", 4):
        w = numpyro.sample("w", dist.Normal(0, sw))
    with numpyro.plate("data", j.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(b0 + u[j[i]] + v[k[i]] + w[m[i]], sigma),
                       obs=None if y is None else y[i])


def sizes_exp_data(groups=200, seed=302):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 3.0, 1.6, 1, 3000))
    x = rng.normal(size=g.size).astype(np.float32)
    a = -0.3 + 0.6 * rng.normal(size=groups)
    p = 1 / (1 + np.exp(-(a[g] + 0.5 * x)))
    y = (rng.uniform(size=g.size) < p).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def sizes_exponential(g, x, y=None, groups=200, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 2))
    tau = numpyro.sample("tau", dist.Exponential(1.0))
    b = numpyro.sample("b", dist.Normal(0, 2))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(logits=a[g[i]] + b * x[i]),
                       obs=None if y is None else y[i])


def invgamma_nested_data(seed=303):
    rng = np.random.default_rng(seed)
    states, counties = 8, 80
    state_of = np.sort(rng.integers(0, states, counties)).astype(np.int32)
    c = _rows(rng, _sizes(rng, counties, 3.5, 1.0, 1, 800))
    s_mean = 2.0 + 0.5 * rng.normal(size=states)
    c_mean = s_mean[state_of] + 0.4 * rng.normal(size=counties)
    y = (c_mean[c] + 0.9 * rng.normal(size=c.size)).astype(np.float32)
    return (c, state_of, y), {"N": int(c.size), "counties": counties}


def invgamma_nested(c, state_of, y=None, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    s_state = numpyro.sample("s_state", dist.HalfNormal(2))
    var_county = numpyro.sample("var_county", dist.InverseGamma(2.0, 0.5))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    with numpyro.plate("states", 8):
        s = numpyro.sample("s", dist.Normal(mu, s_state))
    with numpyro.plate("counties", state_of.shape[0]):
        a = numpyro.sample("a", dist.Normal(s[state_of], jnp.sqrt(var_county)))
    with numpyro.plate("data", c.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[c[i]], sigma), obs=None if y is None else y[i])


def probit_slopes_data(groups=50, seed=304):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 5.0, 1.0, 5, 2000))
    x = rng.normal(size=g.size).astype(np.float32)
    slope = 0.8 + 0.4 * rng.normal(size=groups)
    p = norm.cdf(0.2 + slope[g] * x)
    y = (rng.uniform(size=g.size) < np.asarray(p)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def probit_slopes(g, x, y=None, groups=50, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 2))
    mu_b = numpyro.sample("mu_b", dist.Normal(0, 2))
    s_b = numpyro.sample("s_b", dist.HalfNormal(1))
    with numpyro.plate("groups", groups):
        b = numpyro.sample("b", dist.Normal(mu_b, s_b))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        p = norm.cdf(a + b[g[i]] * x[i])
        numpyro.sample("y", dist.Bernoulli(probs=jnp.clip(p, 1e-6, 1 - 1e-6)),
                       obs=None if y is None else y[i])


def poisson_gp_data(groups=70, seed=305):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.0, 1.3, 1, 1500))
    z = rng.normal(size=groups).astype(np.float32)
    expo = rng.uniform(0.5, 3.0, g.size).astype(np.float32)
    a = 0.3 + 0.4 * z + 0.25 * rng.normal(size=groups)
    y = rng.poisson(expo * np.exp(a[g])).astype(np.float32)
    return (g, z, expo, y), {"N": int(g.size), "groups": groups}


def poisson_group_predictor(g, z, expo, y=None, subsample_size=500):
    c0 = numpyro.sample("c0", dist.Normal(0, 3))
    c1 = numpyro.sample("c1", dist.Normal(0, 3))
    tau = numpyro.sample("tau", dist.HalfCauchy(2.0))
    with numpyro.plate("groups", z.shape[0]):
        a = numpyro.sample("a", dist.Normal(c0 + c1 * z, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Poisson(expo[i] * jnp.exp(a[g[i]])),
                       obs=None if y is None else y[i])


def hetero_data(groups=30, seed=306):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.5, 1.0, 3, 1500))
    m = 1.0 + 0.5 * rng.normal(size=groups)
    log_s = -0.2 + 0.3 * rng.normal(size=groups)
    y = (m[g] + np.exp(log_s[g]) * rng.normal(size=g.size)).astype(np.float32)
    return (g, y), {"N": int(g.size), "groups": groups}


def hetero_groups(g, y=None, groups=30, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfNormal(1))
    nu = numpyro.sample("nu", dist.Normal(0, 2))
    omega = numpyro.sample("omega", dist.HalfNormal(1))
    with numpyro.plate("groups", groups):
        m = numpyro.sample("m", dist.Normal(mu, tau))
        log_s = numpyro.sample("log_s", dist.Normal(nu, omega))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(m[g[i]], jnp.exp(log_s[g[i]])),
                       obs=None if y is None else y[i])


def _noncentred(model, *sites):
    """The same posterior with ``sites`` non-centred: the NUTS reference's model."""
    return numpyro.handlers.reparam(model, config={s: LocScaleReparam(0) for s in sites})


#: name: (model, data generator, compared sites, the model NUTS runs where it differs)
_TABLE = {
    "crossed-3way": (crossed_3way, crossed3_data,
                     ("b0", "su", "sv", "sw", "sigma", "u", "v", "w"),
                     _noncentred(crossed_3way, "u", "v", "w")),
    "sizes-exponential": (sizes_exponential, sizes_exp_data, ("mu", "tau", "b", "a"),
                          _noncentred(sizes_exponential, "a")),
    "invgamma-nested": (invgamma_nested, invgamma_nested_data,
                        ("mu", "s_state", "var_county", "sigma", "s", "a"),
                        _noncentred(invgamma_nested, "s", "a")),
    "probit-slopes": (probit_slopes, probit_slopes_data, ("a", "mu_b", "s_b", "b"),
                      _noncentred(probit_slopes, "b")),
    "poisson-group-predictor": (poisson_group_predictor, poisson_gp_data,
                                ("c0", "c1", "tau", "a"),
                                _noncentred(poisson_group_predictor, "a")),
    "hetero-groups": (hetero_groups, hetero_data, ("mu", "tau", "nu", "omega", "m", "log_s"),
                      _noncentred(hetero_groups, "m", "log_s")),
}


def suite(names=None):
    """The fourth batch's problems (all, or ``names``), in the table's order."""
    return problems_from(_TABLE, names)
