"""A ninth batch of hierarchical models not tuned on (``bench_models.py --batch 9``), written as
users write them, with their data generators: groups the data do not inform, scales near zero,
vector-valued group effects and soft constraints.

``empty-groups`` (varying intercepts of a logistic regression over 80 groups, 12 of which have
no rows: effects to be predicted for new groups, informed by the prior alone; HalfCauchy(1)
scale), ``near-zero-scale`` (a normal model whose 100 groups barely differ: true τ = 0.02
against a noise sd of 1, so the posterior of τ piles up against 0; HalfNormal(1) scale),
``beta-reg-hier`` (Beta regression in the mean-precision form with centred group intercepts on
the logit scale and a Gamma precision), ``multilogit-vec`` (a three-class softmax regression whose
group effects are a vector per group, ``Normal(0, s).to_event(1)`` with a scale per class),
``soft-sum-zero`` (Stan's soft sum-to-zero constraint on the group effects through
``numpyro.factor``, with a deterministic site) and ``rare-slopes`` (Poisson counts with an
exposure offset and group-varying slopes only, on a binary covariate that is 1 in 3 % of rows, so
that many groups have no row to inform their slope).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _unseen_models import problems_from
from _unseen_models2 import _rows, _sizes
from _unseen_models4 import _noncentred


def empty_groups_data(groups=80, empty=12, seed=901):
    rng = np.random.default_rng(seed)
    sizes = _sizes(rng, groups, 4.5, 1.2, 1, 2500)
    sizes[rng.choice(groups, empty, replace=False)] = 0
    g = _rows(rng, sizes)
    x = rng.normal(size=g.size).astype(np.float32)
    a = -0.5 + 0.8 * rng.normal(size=groups)
    p = 1 / (1 + np.exp(-(a[g] + 0.7 * x)))
    y = (rng.uniform(size=g.size) < p).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups, "empty": empty}


def empty_groups(g, x, y=None, groups=80, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.5))
    tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.5))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(logits=a[g[i]] + b * x[i]),
                       obs=None if y is None else y[i])


def near_zero_data(groups=100, seed=902):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 3.5, 0.9, 2, 800))
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.3 + 0.02 * rng.normal(size=groups)
    y = (a[g] + 0.5 * x + rng.normal(size=g.size)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def near_zero_scale(g, x, y=None, groups=100, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]] + b * x[i], sigma),
                       obs=None if y is None else y[i])


def beta_hier_data(groups=60, seed=903):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.5, 1.0, 3, 2000))
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.2 + 0.5 * rng.normal(size=groups)
    m = 1 / (1 + np.exp(-(a[g] - 0.4 * x)))
    phi = 12.0
    y = np.clip(rng.beta(m * phi, (1 - m) * phi), 1e-4, 1 - 1e-4).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def beta_reg_hier(g, x, y=None, groups=60, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    phi = numpyro.sample("phi", dist.Gamma(2.0, 0.1))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, s))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        m = jnp.clip(1.0 / (1.0 + jnp.exp(-(a[g[i]] + b * x[i]))), 1e-6, 1 - 1e-6)
        numpyro.sample("y", dist.Beta(m * phi, (1.0 - m) * phi), obs=None if y is None else y[i])


def multilogit_data(groups=50, seed=904):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.5, 1.1, 2, 2000))
    x = rng.normal(size=g.size).astype(np.float32)
    u = np.stack([0.7 * rng.normal(size=groups), 0.3 * rng.normal(size=groups)], 1)
    c = np.array([0.3, -0.2]) + u[g] + np.outer(x, [0.8, -0.5])
    logits = np.concatenate([np.zeros((g.size, 1)), c], 1)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = (rng.uniform(size=(g.size, 1)) > np.cumsum(p, 1)).sum(1).astype(np.int32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def multilogit_vec(g, x, y=None, groups=50, subsample_size=500):
    c0 = numpyro.sample("c0", dist.Normal(0.0, 2.0).expand([2]).to_event(1))
    beta = numpyro.sample("beta", dist.Normal(0.0, 2.0).expand([2]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1.0).expand([2]).to_event(1))
    with numpyro.plate("groups", groups):
        u = numpyro.sample("u", dist.Normal(0.0, s).to_event(1))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        c = c0 + u[g[i]] + x[i, None] * beta
        logits = jnp.concatenate([jnp.zeros_like(c[:, :1]), c], axis=1)
        numpyro.sample("y", dist.Categorical(logits=logits), obs=None if y is None else y[i])


def soft_zero_data(groups=70, seed=905):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.0, 1.0, 2, 1500))
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.6 * rng.normal(size=groups)
    a -= a.mean()
    y = rng.poisson(np.exp(1.0 + a[g] + 0.3 * x)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def soft_sum_zero(g, x, y=None, groups=70, subsample_size=500):
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 3.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(0.0, tau))
    numpyro.factor("sum_to_zero", dist.Normal(0.0, 0.001 * groups).log_prob(jnp.sum(a)))
    numpyro.deterministic("a_mean", jnp.mean(a))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Poisson(jnp.exp(alpha + a[g[i]] + b * x[i])),
                       obs=None if y is None else y[i])


def rare_slopes_data(groups=60, seed=906):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.5, 1.0, 3, 2000))
    x = (rng.uniform(size=g.size) < 0.03).astype(np.float32)
    exposure = rng.uniform(0.5, 3.0, size=g.size).astype(np.float32)
    slope = 0.5 + 0.4 * rng.normal(size=groups)
    y = rng.poisson(exposure * np.exp(0.2 + slope[g] * x)).astype(np.float32)
    return (g, x, np.log(exposure), y), {"N": int(g.size), "groups": groups,
                                        "rows with x = 1": int(x.sum())}


def rare_slopes(g, x, log_exposure, y=None, groups=60, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    mu_b = numpyro.sample("mu_b", dist.Normal(0.0, 2.0))
    s_b = numpyro.sample("s_b", dist.Exponential(1.0))
    with numpyro.plate("groups", groups):
        slope = numpyro.sample("slope", dist.Normal(mu_b, s_b))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        rate = jnp.exp(log_exposure[i] + a + slope[g[i]] * x[i])
        numpyro.sample("y", dist.Poisson(rate), obs=None if y is None else y[i])


#: name: (model, data generator, compared sites, the model NUTS runs where it differs)
_TABLE = {
    "empty-groups": (empty_groups, empty_groups_data, ("mu", "tau", "b", "a"),
                     _noncentred(empty_groups, "a")),
    "near-zero-scale": (near_zero_scale, near_zero_data, ("mu", "tau", "b", "sigma", "a"),
                        _noncentred(near_zero_scale, "a")),
    "beta-reg-hier": (beta_reg_hier, beta_hier_data, ("mu", "s", "b", "phi", "a"), None),
    "multilogit-vec": (multilogit_vec, multilogit_data, ("c0", "beta", "s", "u"),
                       _noncentred(multilogit_vec, "u")),
    "soft-sum-zero": (soft_sum_zero, soft_zero_data, ("alpha", "b", "tau", "a"),
                      _noncentred(soft_sum_zero, "a")),
    "rare-slopes": (rare_slopes, rare_slopes_data, ("a", "mu_b", "s_b", "slope"),
                    _noncentred(rare_slopes, "slope")),
}


def suite(names=None):
    """The ninth batch's problems (all, or ``names``), in the table's order."""
    return problems_from(_TABLE, names)
