"""A seventh batch of hierarchical models not tuned on (``bench_models.py --batch 7``), written as
users write them, with their data generators: hierarchies that are not location-scale, and
scale priors written in less common ways.

``rat-tumours`` (Bernoulli rows of 70 groups, group rates Beta(φκ, (1 − φ)κ) with Gelman's
Pareto(1, 1.5) prior on κ, BDA3 Sect. 5.3), ``frailty-survival`` (exponential survival times
with censoring, clinic frailties Gamma(1/v, 1/v) with a HalfNormal prior on v, the likelihood by
``numpyro.factor``), ``flat-scale-normal`` (a centred normal model with an improper flat prior
on the group scale), ``brms-default`` (varying intercepts and slopes, centred, brms's default
priors: half Student-t(3, 0, 2.5) scales as ``FoldedDistribution``), ``ar-groups`` (60 AR(1)
series of very unequal lengths, centred hierarchical intercepts and autoregression
coefficients through tanh) and ``transformed-scales`` (Poisson counts with crossed region and
site effects, one scale written as an exp-transformed normal, a deterministic total sd).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _unseen_models import problems_from
from _unseen_models2 import _rows, _sizes
from _unseen_models4 import _noncentred


def rat_data(groups=70, seed=701):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 3.5, 1.3, 3, 2000))
    theta = rng.beta(2.5, 14.0, groups)
    y = (rng.uniform(size=g.size) < theta[g]).astype(np.float32)
    return (g, y), {"N": int(g.size), "groups": groups}


def rat_tumours(g, y=None, groups=70, subsample_size=500):
    phi = numpyro.sample("phi", dist.Beta(1.0, 1.0))
    kappa = numpyro.sample("kappa", dist.Pareto(1.0, 1.5))
    with numpyro.plate("groups", groups):
        theta = numpyro.sample("theta", dist.Beta(phi * kappa, (1.0 - phi) * kappa))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(probs=theta[g[i]]), obs=None if y is None else y[i])


def frailty_data(groups=80, seed=702):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 3.8, 1.0, 2, 1500))
    x = rng.normal(size=g.size).astype(np.float32)
    w = rng.gamma(2.0, 0.5, groups)  # v = 0.5
    t = rng.exponential(1.0 / (w[g] * np.exp(-1.0 + 0.5 * x)))
    c = rng.uniform(0.0, 3.0, g.size)
    event = (t < c).astype(np.float32)
    return (g, x, np.minimum(t, c).astype(np.float32), event), {"N": int(g.size),
                                                                  "groups": groups}


def frailty_survival(g, x, t, event, groups=80, subsample_size=500):
    b0 = numpyro.sample("b0", dist.Normal(0.0, 5.0))
    b1 = numpyro.sample("b1", dist.Normal(0.0, 2.0))
    v = numpyro.sample("v", dist.HalfNormal(1.0))
    with numpyro.plate("groups", groups):
        w = numpyro.sample("w", dist.Gamma(1.0 / v, 1.0 / v))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        log_rate = jnp.log(w[g[i]]) + b0 + b1 * x[i]
        numpyro.factor("lik", event[i] * log_rate - jnp.exp(log_rate) * t[i])


def flat_data(groups=60, seed=703):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 3.0, 1.6, 1, 1000))
    a = 1.0 + 0.4 * rng.normal(size=groups)
    y = (a[g] + 1.0 * rng.normal(size=g.size)).astype(np.float32)
    return (g, y), {"N": int(g.size), "groups": groups}


def flat_scale_normal(g, y=None, groups=60, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.ImproperUniform(dist.constraints.positive, (), ()))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]], sigma), obs=None if y is None else y[i])


def brms_data(groups=90, seed=704):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 3.6, 1.2, 2, 1200))
    x = rng.normal(size=g.size).astype(np.float32)
    a = 3.0 + 0.6 * rng.normal(size=groups)
    b = 0.5 + 0.25 * rng.normal(size=groups)
    y = (a[g] + b[g] * x + 1.3 * rng.normal(size=g.size)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def _half_t():
    return dist.FoldedDistribution(dist.StudentT(3.0, 0.0, 2.5))


def brms_default(g, x, y=None, groups=90, subsample_size=500):
    intercept = numpyro.sample("intercept", dist.StudentT(3.0, 3.0, 2.5))
    slope = numpyro.sample("slope", dist.Normal(0.0, 10.0))
    sd_a = numpyro.sample("sd_a", _half_t())
    sd_b = numpyro.sample("sd_b", _half_t())
    sigma = numpyro.sample("sigma", _half_t())
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(intercept, sd_a))
        b = numpyro.sample("b", dist.Normal(slope, sd_b))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]] + b[g[i]] * x[i], sigma),
                       obs=None if y is None else y[i])


def ar_data(series=60, seed=705):
    rng = np.random.default_rng(seed)
    lengths = _sizes(rng, series, 4.0, 1.1, 20, 1500)
    c = 0.5 + 0.3 * rng.normal(size=series)
    phi = np.tanh(0.8 + 0.4 * rng.normal(size=series))
    g, prev, cur = [], [], []
    for j, T in enumerate(lengths):
        ys = np.zeros(T + 1)
        ys[0] = c[j] / (1 - phi[j])
        for t in range(1, T + 1):
            ys[t] = c[j] + phi[j] * ys[t - 1] + 0.8 * rng.normal()
        g.append(np.full(T, j))
        prev.append(ys[:-1])
        cur.append(ys[1:])
    order = rng.permutation(int(lengths.sum()))
    g, prev, cur = (np.concatenate(v)[order] for v in (g, prev, cur))
    return ((g.astype(np.int32), prev.astype(np.float32), cur.astype(np.float32)),
            {"N": int(g.size), "series": series})


def ar_groups(g, y_prev, y, series=60, subsample_size=500):
    mu_c = numpyro.sample("mu_c", dist.Normal(0.0, 2.0))
    s_c = numpyro.sample("s_c", dist.HalfNormal(1.0))
    mu_e = numpyro.sample("mu_e", dist.Normal(0.0, 1.0))
    s_e = numpyro.sample("s_e", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("series", series):
        c = numpyro.sample("c", dist.Normal(mu_c, s_c))
        eta = numpyro.sample("eta", dist.Normal(mu_e, s_e))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(c[g[i]] + jnp.tanh(eta[g[i]]) * y_prev[i], sigma),
                       obs=y[i])


def transformed_data(regions=10, sites=120, seed=706):
    rng = np.random.default_rng(seed)
    n = 15000
    r = rng.integers(0, regions, n).astype(np.int32)
    s = _rows(rng, np.maximum(1, rng.multinomial(n - sites, rng.dirichlet(np.full(sites, 0.6)))
                              + 1))
    u = 0.5 * rng.normal(size=regions)
    v = 0.3 * rng.normal(size=sites)
    log_e = rng.uniform(-0.5, 0.5, n).astype(np.float32)
    y = rng.poisson(np.exp(0.2 + u[r] + v[s] + log_e)).astype(np.float32)
    return (r, s, log_e, y), {"N": n, "regions": regions, "sites": sites}


def transformed_scales(r, s, log_e, y=None, regions=10, sites=120, subsample_size=500):
    b0 = numpyro.sample("b0", dist.Normal(0.0, 3.0))
    s_region = numpyro.sample("s_region", dist.Exponential(1.0))
    s_site = numpyro.sample("s_site", dist.TransformedDistribution(
        dist.Normal(-1.0, 0.7), dist.transforms.ExpTransform()))
    numpyro.deterministic("total_sd", jnp.sqrt(s_region ** 2 + s_site ** 2))
    with numpyro.plate("regions", regions):
        u = numpyro.sample("u", dist.Normal(0.0, s_region))
    with numpyro.plate("sites", sites):
        v = numpyro.sample("v", dist.Normal(0.0, s_site))
    with numpyro.plate("data", r.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Poisson(jnp.exp(b0 + u[r[i]] + v[s[i]] + log_e[i])),
                       obs=None if y is None else y[i])


#: name: (model, data generator, compared sites, the model NUTS runs where it differs)
_TABLE = {
    "rat-tumours": (rat_tumours, rat_data, ("phi", "kappa", "theta"), None),
    "frailty-survival": (frailty_survival, frailty_data, ("b0", "b1", "v", "w"), None),
    "flat-scale-normal": (flat_scale_normal, flat_data, ("mu", "tau", "sigma", "a"),
                          _noncentred(flat_scale_normal, "a")),
    "brms-default": (brms_default, brms_data,
                     ("intercept", "slope", "sd_a", "sd_b", "sigma", "a", "b"),
                     _noncentred(brms_default, "a", "b")),
    "ar-groups": (ar_groups, ar_data, ("mu_c", "s_c", "mu_e", "s_e", "sigma", "c", "eta"),
                  _noncentred(ar_groups, "c", "eta")),
    "transformed-scales": (transformed_scales, transformed_data,
                           ("b0", "s_region", "s_site", "total_sd", "u", "v"),
                           _noncentred(transformed_scales, "u", "v")),
}


def suite(names=None):
    """The seventh batch's problems (all, or ``names``), in the table's order."""
    return problems_from(_TABLE, names)
