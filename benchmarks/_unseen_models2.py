"""A second batch of models not tuned on (``bench_models.py --batch 2``), written as users write
them, with their data generators.

``hier-poisson`` (centred group intercepts, HalfNormal scale, an exposure), ``crossed-scales``
(two crossed groupings, 30 × 12, each with its own scale), ``nested-3level`` (counties within
states, centred at both levels), ``lasso-logit`` (Laplace prior), ``t-prior-linear`` (Student-t
prior, InverseGamma noise variance), ``near-separable`` (a logistic coefficient of 6),
``big-counts`` (Poisson means near 500), ``group-sigmas`` (a noise scale per group with a
hierarchical LogNormal prior), ``many-small-groups`` (400 groups of 2 to 40 rows, Bernoulli),
``hier-gamma`` (Gamma outcome, centred group effects on the log mean), ``softmax-hier``
(3 classes, group intercepts per class) and ``normal-invgamma`` (conjugate mean and variance).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _hier_models import Problem
from _unseen_models import problems_from


def _sizes(rng, groups, mean_log, sd_log, lo, hi):
    return np.clip(np.round(rng.lognormal(mean_log, sd_log, groups)), lo, hi).astype(int)


def _rows(rng, sizes):
    g = np.repeat(np.arange(sizes.size), sizes).astype(np.int32)
    rng.shuffle(g)
    return g


def hier_poisson_data(groups=40, seed=101):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 5.0, 1.2, 2, 3000))
    x = rng.normal(size=g.size).astype(np.float32)
    log_e = rng.uniform(-1, 1, g.size).astype(np.float32)
    a = 0.5 + 0.4 * rng.normal(size=groups)
    y = rng.poisson(np.exp(a[g] + 0.3 * x + log_e)).astype(np.float32)
    return (g, x, log_e, y), {"N": int(g.size), "groups": groups}


def hier_poisson(g, x, log_e, y=None, groups=40, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 3))
    tau = numpyro.sample("tau", dist.HalfNormal(1))
    b = numpyro.sample("b", dist.Normal(0, 1))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Poisson(jnp.exp(a[g[i]] + b * x[i] + log_e[i])),
                       obs=None if y is None else y[i])


def crossed_data(seed=102):
    rng = np.random.default_rng(seed)
    n = 12000
    u = rng.integers(0, 30, n).astype(np.int32)
    v = rng.integers(0, 12, n).astype(np.int32)
    au, av = 0.6 * rng.normal(size=30), 0.3 * rng.normal(size=12)
    y = (1.0 + au[u] + av[v] + 1.2 * rng.normal(size=n)).astype(np.float32)
    return (u, v, y), {"N": n}


def crossed(u, v, y=None, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    su = numpyro.sample("su", dist.HalfNormal(1))
    sv = numpyro.sample("sv", dist.HalfNormal(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    with numpyro.plate("U", 30):
        au = numpyro.sample("au", dist.Normal(0, su))
    with numpyro.plate("V", 12):
        av = numpyro.sample("av", dist.Normal(0, sv))
    with numpyro.plate("data", u.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(mu + au[u[i]] + av[v[i]], sigma),
                       obs=None if y is None else y[i])


def nested_data(seed=103):
    rng = np.random.default_rng(seed)
    states, counties = 6, 60
    state_of = np.repeat(np.arange(states), counties // states).astype(np.int32)
    sizes = _sizes(rng, counties, 4.0, 1.3, 1, 2000)
    c = _rows(rng, sizes)
    s_eff = 0.8 * rng.normal(size=states)
    c_eff = s_eff[state_of] + 0.4 * rng.normal(size=counties)
    y = (2.0 + c_eff[c] + rng.normal(size=c.size)).astype(np.float32)
    return (c, state_of, y), {"N": int(c.size)}


def nested(c, state_of, y=None, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau_s = numpyro.sample("tau_s", dist.HalfNormal(2))
    tau_c = numpyro.sample("tau_c", dist.HalfNormal(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    with numpyro.plate("states", 6):
        s = numpyro.sample("s", dist.Normal(mu, tau_s))
    with numpyro.plate("counties", 60):
        a = numpyro.sample("a", dist.Normal(s[state_of], tau_c))
    with numpyro.plate("data", c.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[c[i]], sigma), obs=None if y is None else y[i])


def lasso_data(n=20000, seed=104):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 10)).astype(np.float32)
    b = np.array([1.0, -0.8, 0.5, 0, 0, 0, 0, 0, 0.05, 0])
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(X @ b - 0.3)))).astype(np.float32)
    return (X, y), {"N": n}


def lasso_logit(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Laplace(0, 0.5).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(logits=a + X[i] @ b), obs=None if y is None else y[i])


def tprior_data(n=15000, seed=105):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6)).astype(np.float32) * np.array([1, 1, 1, 5, 0.2, 1], np.float32)
    b = np.array([0.5, -1.0, 0.0, 0.1, 2.0, 0.3])
    y = (X @ b + 2.0 * rng.normal(size=n)).astype(np.float32)
    return (X, y), {"N": n}


def tprior_linear(X, y=None, subsample_size=500):
    b = numpyro.sample("b", dist.StudentT(3, 0, 1).expand([X.shape[1]]).to_event(1))
    s2 = numpyro.sample("s2", dist.InverseGamma(2.0, 2.0))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(X[i] @ b, jnp.sqrt(s2)), obs=None if y is None else y[i])


def separable_data(n=10000, seed=106):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)).astype(np.float32)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(6.0 * X[:, 0] - 0.5 * X[:, 1])))).astype(
        np.float32)
    return (X, y), {"N": n}


def separable(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 2.5))
    b = numpyro.sample("b", dist.Normal(0, 2.5).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(logits=a + X[i] @ b), obs=None if y is None else y[i])


def big_counts_data(n=15000, seed=107):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)).astype(np.float32)
    y = rng.poisson(np.exp(6.2 + X @ np.array([0.2, -0.1, 0.05]))).astype(np.float32)
    return (X, y), {"N": n}


def big_counts(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 10))
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Poisson(jnp.exp(a + X[i] @ b)), obs=None if y is None else y[i])


def group_sigmas_data(groups=30, seed=108):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 5.0, 1.0, 5, 2000))
    m = 1.0 + 0.5 * rng.normal(size=groups)
    s = np.exp(0.0 + 0.4 * rng.normal(size=groups))
    y = (m[g] + s[g] * rng.normal(size=g.size)).astype(np.float32)
    return (g, y), {"N": int(g.size), "groups": groups}


def group_sigmas(g, y=None, groups=30, subsample_size=500):
    mu0 = numpyro.sample("mu0", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfNormal(1))
    ms = numpyro.sample("ms", dist.Normal(0, 1))
    ss = numpyro.sample("ss", dist.HalfNormal(1))
    with numpyro.plate("groups", groups):
        m = numpyro.sample("m", dist.Normal(mu0, tau))
        s = numpyro.sample("s", dist.LogNormal(ms, ss))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(m[g[i]], s[g[i]]), obs=None if y is None else y[i])


def small_groups_data(groups=400, seed=109):
    rng = np.random.default_rng(seed)
    g = _rows(rng, rng.integers(2, 41, groups))
    x = rng.normal(size=g.size).astype(np.float32)
    a = -0.3 + 0.7 * rng.normal(size=groups)
    y = (rng.uniform(size=g.size) < 1 / (1 + np.exp(-(a[g] + 0.5 * x)))).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def small_groups(g, x, y=None, groups=400, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 3))
    tau = numpyro.sample("tau", dist.HalfNormal(1))
    b = numpyro.sample("b", dist.Normal(0, 3))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(logits=a[g[i]] + b * x[i]),
                       obs=None if y is None else y[i])


def hier_gamma_data(groups=50, seed=110):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.5, 1.0, 3, 1500))
    x = rng.normal(size=g.size).astype(np.float32)
    a = 1.0 + 0.3 * rng.normal(size=groups)
    mean = np.exp(a[g] + 0.4 * x)
    shape = 3.0
    y = rng.gamma(shape, mean / shape).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def hier_gamma(g, x, y=None, groups=50, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 3))
    tau = numpyro.sample("tau", dist.HalfCauchy(1))
    b = numpyro.sample("b", dist.Normal(0, 1))
    shape = numpyro.sample("shape", dist.Gamma(2.0, 0.5))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        mean = jnp.exp(a[g[i]] + b * x[i])
        numpyro.sample("y", dist.Gamma(shape, shape / mean), obs=None if y is None else y[i])


def softmax_hier_data(groups=20, seed=111):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 5.5, 0.8, 20, 3000))
    x = rng.normal(size=g.size).astype(np.float32)
    A = np.stack([np.zeros(groups), 0.5 + 0.5 * rng.normal(size=groups),
                  -0.3 + 0.5 * rng.normal(size=groups)], 1)
    logits = A[g] + np.outer(x, [0.0, 0.8, -0.6])
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = np.array([rng.choice(3, p=pi) for pi in p], np.int32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def softmax_hier(g, x, y=None, groups=20, subsample_size=500):
    m = numpyro.sample("m", dist.Normal(0, 3).expand([2]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1).expand([2]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0, 2).expand([2]).to_event(1))
    with numpyro.plate("groups", groups):
        A = numpyro.sample("A", dist.Normal(m, s).to_event(1))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        eta = A[g[i]] + x[i][:, None] * b
        logits = jnp.concatenate([jnp.zeros_like(eta[:, :1]), eta], axis=1)
        numpyro.sample("y", dist.Categorical(logits=logits), obs=None if y is None else y[i])


def normal_ig_data(n=20000, seed=112):
    rng = np.random.default_rng(seed)
    y = (3.0 + 2.5 * rng.normal(size=n)).astype(np.float32)
    return (y,), {"N": n}


def normal_ig(y, subsample_size=500):
    s2 = numpyro.sample("s2", dist.InverseGamma(3.0, 4.0))
    mu = numpyro.sample("mu", dist.Normal(0, 10 * jnp.sqrt(s2)))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(mu, jnp.sqrt(s2)), obs=y[i])


#: name: (model, data generator, compared sites, the model NUTS runs where it differs)
_TABLE = {
    "hier-poisson": (hier_poisson, hier_poisson_data, ("mu", "tau", "b", "a"), None),
    "crossed-scales": (crossed, crossed_data, ("mu", "su", "sv", "sigma", "au", "av"), None),
    "nested-3level": (nested, nested_data, ("mu", "tau_s", "tau_c", "sigma", "s", "a"), None),
    "lasso-logit": (lasso_logit, lasso_data, ("a", "b"), None),
    "t-prior-linear": (tprior_linear, tprior_data, ("b", "s2"), None),
    "near-separable": (separable, separable_data, ("a", "b"), None),
    "big-counts": (big_counts, big_counts_data, ("a", "b"), None),
    "group-sigmas": (group_sigmas, group_sigmas_data, ("mu0", "tau", "ms", "ss", "m", "s"), None),
    "many-small-groups": (small_groups, small_groups_data, ("mu", "tau", "b", "a"), None),
    "hier-gamma": (hier_gamma, hier_gamma_data, ("mu", "tau", "b", "shape", "a"), None),
    "softmax-hier": (softmax_hier, softmax_hier_data, ("m", "s", "b", "A"), None),
    "normal-invgamma": (normal_ig, normal_ig_data, ("s2", "mu"), None),
}


#: NUTS reference settings that differ from the suite's: a dense mass matrix where mu and the
#: two sets of crossed effects form a ridge (diagonal mass: min ESS 325 of 10^4 draws)
_REFERENCE_SETTINGS = {"crossed-scales": {"dense_mass": True}}


def suite(names=None) -> dict[str, Problem]:
    """The batch's problems (all, or ``names``), in the table's order."""
    return problems_from(_TABLE, names, _REFERENCE_SETTINGS)
