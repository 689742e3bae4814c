"""Models that were not tuned on: the suite of ``bench_models.py``, written as users write them
(NumPyro, one subsample plate over the rows), with their data generators.

GLMs and other regressions: ``robust-t`` (Student-t errors with unknown degrees of freedom),
``negbin``, ``ordinal`` (ordered logistic with ordered cutpoints), ``softmax`` (4 classes),
``hetero`` (log-linear noise scale), ``gamma-glm``, ``beta-reg``, ``weibull-cens`` (right-censored
survival through ``numpyro.factor``), ``zip`` (zero-inflated Poisson), ``rare-gate`` (the same
with a gate near 0), ``probit``, ``counts-offset`` (Poisson with an exposure), ``collinear``
(correlated columns on scales 0.01 to 300), ``small-logit`` (N = 600, n = 60), ``wide-logit``
(d = 200). Mixtures: ``mixture2`` (``MixtureSameFamily``) and ``enum-mix`` (a discrete
assignment summed out by enumeration). Hierarchical: ``hlogit-centred`` (50 groups, HalfCauchy
scale), ``eight-groups`` (8 groups of 3 to 2,500 rows), a negative binomial with 70 groups of 1
to ~2,000 rows written centred (``hier-negbin-c``), with ``LocScaleReparam(0)``
(``hier-negbin-lsr``) and non-centred by hand, a = mu + tau * z (``hier-negbin-nc``), and
varying intercepts and slopes with an ``LKJCholesky`` correlation, centred
(``lkj-centred``, ``MultivariateNormal`` group effects) and non-centred by hand
(``lkj-varying``); a radon-like varying-intercept model (85 groups, N = 912, n = 100) centred
with Uniform(0, 100) scales (``radon-like``) and non-centred with ``LocScaleReparam(0)`` applied
inside the model's body (``radon-nc-inside``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _hier_models import Problem
from numpyro.distributions.transforms import OrderedTransform
from numpyro.infer.reparam import LocScaleReparam


def _X(rng, n, d):
    return rng.normal(size=(n, d)).astype(np.float32)


def robust_t_data(n=20000, seed=1):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 4)
    b = np.array([1.0, -0.5, 0.3, 0.0])
    y = (0.5 + X @ b + 0.8 * rng.standard_t(4, n)).astype(np.float32)
    return (X, y), {"N": n}


def robust_t(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 2).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    nu = numpyro.sample("nu", dist.Gamma(2.0, 0.1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.StudentT(nu, a + X[i] @ b, sigma), obs=None if y is None else y[i])


def negbin_data(n=20000, seed=2):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 3)
    mu = np.exp(0.7 + X @ np.array([0.4, -0.3, 0.1]))
    phi = 2.5
    y = rng.negative_binomial(phi, phi / (phi + mu)).astype(np.float32)
    return (X, y), {"N": n}


def negbin(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    phi = numpyro.sample("phi", dist.Exponential(0.5))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(a + X[i] @ b), phi),
                       obs=None if y is None else y[i])


def ordinal_data(n=10000, seed=3):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 3)
    eta = X @ np.array([1.0, -0.7, 0.2])
    c = np.array([-1.0, 0.3, 1.5])
    u = eta + rng.logistic(size=n)
    y = np.searchsorted(c, u).astype(np.int32)
    return (X, y), {"N": n, "K": 4}


def ordinal(X, y=None, subsample_size=500):
    b = numpyro.sample("b", dist.Normal(0, 2).expand([X.shape[1]]).to_event(1))
    c = numpyro.sample("c", dist.TransformedDistribution(
        dist.Normal(0, 3).expand([3]).to_event(1), OrderedTransform()))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.OrderedLogistic(X[i] @ b, c), obs=None if y is None else y[i])


def softmax_data(n=20000, seed=4):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 3)
    B = rng.normal(size=(4, 3)) * 0.8  # intercept row + 3
    logits = np.concatenate([np.ones((n, 1)), X], 1) @ np.concatenate([B, np.zeros((4, 1))], 1)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = np.array([rng.choice(4, p=pi) for pi in p]).astype(np.int32)
    return (X, y), {"N": n, "K": 4}


def softmax(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 3).expand([3]).to_event(1))
    B = numpyro.sample("B", dist.Normal(0, 3).expand([X.shape[1], 3]).to_event(2))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        logits = jnp.concatenate([a + X[i] @ B, jnp.zeros((i.shape[0], 1))], -1)
        numpyro.sample("y", dist.Categorical(logits=logits), obs=None if y is None else y[i])


def hetero_data(n=20000, seed=5):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 2)
    y = (1 + X @ np.array([0.5, -1.0]) + np.exp(-0.3 + X @ np.array([0.4, 0.0]))
         * rng.normal(size=n)).astype(np.float32)
    return (X, y), {"N": n}


def hetero(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 10))
    b = numpyro.sample("b", dist.Normal(0, 10).expand([X.shape[1]]).to_event(1))
    s0 = numpyro.sample("s0", dist.Normal(0, 2))
    g = numpyro.sample("g", dist.Normal(0, 2).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a + X[i] @ b, jnp.exp(s0 + X[i] @ g)),
                       obs=None if y is None else y[i])


def gamma_data(n=15000, seed=6):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 3)
    mu = np.exp(1.0 + X @ np.array([0.3, 0.0, -0.2]))
    k = 1.7
    y = rng.gamma(k, mu / k).astype(np.float32)
    return (X, y), {"N": n}


def gamma_glm(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    k = numpyro.sample("shape", dist.Exponential(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        mu = jnp.exp(a + X[i] @ b)
        numpyro.sample("y", dist.Gamma(k, k / mu), obs=None if y is None else y[i])


def beta_data(n=10000, seed=7):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 2)
    mu = 1 / (1 + np.exp(-(-0.5 + X @ np.array([0.6, -0.4]))))
    phi = 8.0
    y = np.clip(rng.beta(mu * phi, (1 - mu) * phi), 1e-4, 1 - 1e-4).astype(np.float32)
    return (X, y), {"N": n}


def beta_reg(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 3))
    b = numpyro.sample("b", dist.Normal(0, 3).expand([X.shape[1]]).to_event(1))
    phi = numpyro.sample("phi", dist.Gamma(2.0, 0.1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        mu = jax_sigmoid(a + X[i] @ b)
        numpyro.sample("y", dist.Beta(mu * phi, (1 - mu) * phi), obs=None if y is None else y[i])


def jax_sigmoid(x):
    return 1 / (1 + jnp.exp(-x))


def weibull_data(n=10000, seed=8):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 2)
    k = 1.4
    scale = np.exp(1.0 + X @ np.array([0.5, -0.3]))
    t = scale * rng.weibull(k, n)
    c = rng.exponential(6.0, n)
    event = (t <= c).astype(np.float32)
    return ((X, np.minimum(t, c).astype(np.float32), event),
            {"N": n, "censored": float(1 - event.mean())})


def weibull(X, t, event, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 2).expand([X.shape[1]]).to_event(1))
    k = numpyro.sample("k", dist.LogNormal(0, 1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        d = dist.Weibull(jnp.exp(a + X[i] @ b), k)
        ti = t[i]
        logp = jnp.where(event[i] > 0, d.log_prob(ti), -(ti / d.scale) ** k)
        numpyro.factor("lik", logp)


def hier_nb_data(n=12000, groups=70, seed=9):
    rng = np.random.default_rng(seed)
    sizes = np.minimum(np.maximum(1, np.round(rng.lognormal(4.0, 1.3, groups))), 2000).astype(int)
    g = np.repeat(np.arange(groups), sizes).astype(np.int32)
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.5 + 0.4 * rng.normal(size=groups)
    mu = np.exp(a[g] + 0.3 * x)
    y = rng.negative_binomial(3.0, 3.0 / (3.0 + mu)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def hier_nb(g, x, y=None, groups=70, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
    b = numpyro.sample("b", dist.Normal(0, 1))
    phi = numpyro.sample("phi", dist.Exponential(0.2))
    with numpyro.plate("groups", groups):
        z = numpyro.sample("z", dist.Normal(0, 1))
    a = mu + tau * z
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(a[g[i]] + b * x[i]), phi),
                       obs=None if y is None else y[i])


def _groups(rng, groups, mean_log, sd_log, cap):
    sizes = np.minimum(np.maximum(1, np.round(rng.lognormal(mean_log, sd_log, groups))), cap)
    sizes = sizes.astype(int)
    return np.repeat(np.arange(groups), sizes).astype(np.int32)


def lkj_data(groups=40, seed=10):
    rng = np.random.default_rng(seed)
    g = _groups(rng, groups, 4.5, 1.0, 1500)
    x = rng.normal(size=g.size).astype(np.float32)
    C = np.array([[1, 0.5], [0.5, 1]])
    s = np.array([0.5, 0.3])
    ab = rng.multivariate_normal([1.0, -0.5], np.outer(s, s) * C, groups)
    y = (ab[g, 0] + ab[g, 1] * x + 1.0 * rng.normal(size=g.size)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def lkj(g, x, y=None, groups=40, subsample_size=500):
    m = numpyro.sample("m", dist.Normal(0, 5).expand([2]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1).expand([2]).to_event(1))
    L = numpyro.sample("L", dist.LKJCholesky(2, 2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    with numpyro.plate("groups", groups):
        z = numpyro.sample("z", dist.Normal(0, 1).expand([2]).to_event(1))
    ab = m + (s[:, None] * L @ z.T).T
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        gi = g[i]
        numpyro.sample("y", dist.Normal(ab[gi, 0] + ab[gi, 1] * x[i], sigma),
                       obs=None if y is None else y[i])


def zip_data(n=15000, seed=11):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 2)
    lam = np.exp(0.8 + X @ np.array([0.5, -0.2]))
    y = np.where(rng.uniform(size=n) < 0.3, 0, rng.poisson(lam)).astype(np.float32)
    return (X, y), {"N": n}


def zip_model(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 2).expand([X.shape[1]]).to_event(1))
    gate = numpyro.sample("gate", dist.Beta(1, 1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.ZeroInflatedPoisson(gate, jnp.exp(a + X[i] @ b)),
                       obs=None if y is None else y[i])


def mixture_data(n=10000, seed=12):
    rng = np.random.default_rng(seed)
    z = rng.uniform(size=n) < 0.35
    y = np.where(z, rng.normal(-1.0, 0.7, n), rng.normal(2.0, 1.0, n)).astype(np.float32)
    return (y,), {"N": n}


def mixture(y, subsample_size=500):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
    loc = numpyro.sample("loc", dist.TransformedDistribution(
        dist.Normal(0, 5).expand([2]).to_event(1), OrderedTransform()))
    scale = numpyro.sample("scale", dist.HalfNormal(3).expand([2]).to_event(1))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.MixtureSameFamily(dist.Categorical(w), dist.Normal(loc, scale)),
                       obs=y[i])


def probit_data(n=20000, seed=13):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 5)
    from scipy.stats import norm
    p = norm.cdf(-0.3 + X @ np.array([0.8, -0.5, 0.2, 0.0, 0.1]))
    y = (rng.uniform(size=n) < p).astype(np.float32)
    return (X, y), {"N": n}


def probit(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 3))
    b = numpyro.sample("b", dist.Normal(0, 3).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        p = dist.Normal(0, 1).cdf(a + X[i] @ b)
        numpyro.sample("y", dist.Bernoulli(probs=jnp.clip(p, 1e-6, 1 - 1e-6)),
                       obs=None if y is None else y[i])


def eight_data(seed=14):
    rng = np.random.default_rng(seed)
    sizes = np.array([3, 10, 40, 150, 400, 900, 1500, 2500])
    g = np.repeat(np.arange(8), sizes).astype(np.int32)
    theta = 2.0 + 1.0 * rng.normal(size=8)
    y = (theta[g] + 6.0 * rng.normal(size=g.size)).astype(np.float32)
    return (g, y), {"N": int(g.size), "groups": 8}


def eight(g, y=None, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    sigma = numpyro.sample("sigma", dist.HalfNormal(10))
    with numpyro.plate("groups", 8):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(theta[g[i]], sigma), obs=None if y is None else y[i])


def hlogit_data(groups=50, seed=15):
    rng = np.random.default_rng(seed)
    g = _groups(rng, groups, 4.0, 1.4, 2500)
    x = rng.normal(size=g.size).astype(np.float32)
    a = -0.5 + 0.8 * rng.normal(size=groups)
    p = 1 / (1 + np.exp(-(a[g] + 0.7 * x)))
    y = (rng.uniform(size=g.size) < p).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def hlogit(g, x, y=None, groups=50, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(2.5))
    b = numpyro.sample("b", dist.Normal(0, 5))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(logits=a[g[i]] + b * x[i]),
                       obs=None if y is None else y[i])


def lkj_centred(g, x, y=None, groups=40, subsample_size=500):
    m = numpyro.sample("m", dist.Normal(0, 5).expand([2]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1).expand([2]).to_event(1))
    L = numpyro.sample("L", dist.LKJCholesky(2, 2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    with numpyro.plate("groups", groups):
        ab = numpyro.sample("ab", dist.MultivariateNormal(m, scale_tril=s[:, None] * L))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        gi = g[i]
        numpyro.sample("y", dist.Normal(ab[gi, 0] + ab[gi, 1] * x[i], sigma),
                       obs=None if y is None else y[i])


def collinear_data(n=20000, seed=16):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 1))
    X = np.concatenate([z + 0.1 * rng.normal(size=(n, 1)), z + 0.1 * rng.normal(size=(n, 1)),
                        rng.normal(size=(n, 1))], 1) * np.array([0.01, 1.0, 300.0])
    y = (2.0 + X @ np.array([50.0, 0.5, 0.002]) + 0.5 * rng.normal(size=n)).astype(np.float32)
    return (X.astype(np.float32), y), {"N": n}


def collinear(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 10))
    b = numpyro.sample("b", dist.Normal(0, 100).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a + X[i] @ b, sigma), obs=None if y is None else y[i])


def small_data(n=600, seed=17):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 3)
    p = 1 / (1 + np.exp(-(0.3 + X @ np.array([1.0, -1.0, 0.5]))))
    y = (rng.uniform(size=n) < p).astype(np.float32)
    return (X, y), {"N": n}


def small_logit(X, y=None, subsample_size=60):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 5).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(logits=a + X[i] @ b), obs=None if y is None else y[i])


def rare_gate_data(n=15000, seed=18):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 1)
    lam = np.exp(0.2 + 0.3 * X[:, 0])
    y = np.where(rng.uniform(size=n) < 0.01, 0, rng.poisson(lam)).astype(np.float32)
    return (X, y), {"N": n}


def wide_data(n=20000, d=200, seed=19):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, d)
    b = np.zeros(d)
    b[:10] = rng.normal(size=10)
    p = 1 / (1 + np.exp(-(X @ b)))
    y = (rng.uniform(size=n) < p).astype(np.float32)
    return (X, y), {"N": n, "d": d}


def wide_logit(X, y=None, subsample_size=1000):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Bernoulli(logits=X[i] @ b), obs=None if y is None else y[i])


def counts_data(n=20000, seed=20):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 2)
    expo = rng.uniform(50, 500, n)
    y = rng.poisson(expo * np.exp(0.5 + X @ np.array([0.2, -0.1]))).astype(np.float32)
    return (X, np.log(expo).astype(np.float32), y), {"N": n}


def counts(X, log_expo, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Poisson(jnp.exp(log_expo[i] + a + X[i] @ b)),
                       obs=None if y is None else y[i])


def enum_mix(y, subsample_size=500):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
    loc = numpyro.sample("loc", dist.TransformedDistribution(
        dist.Normal(0, 5).expand([2]).to_event(1), OrderedTransform()))
    scale = numpyro.sample("scale", dist.HalfNormal(3))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as i:
        z = numpyro.sample("z", dist.Categorical(w), infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(loc[z], scale), obs=y[i])


def hier_nb_centred(g, x, y=None, groups=70, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
    b = numpyro.sample("b", dist.Normal(0, 1))
    phi = numpyro.sample("phi", dist.Exponential(0.2))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(a[g[i]] + b * x[i]), phi),
                       obs=None if y is None else y[i])


def radon_like_data(seed=21):
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(1.9, 1.0, 85)), 1, 116).astype(int)
    sizes = np.maximum(1, np.round(sizes * 919 / sizes.sum())).astype(int)
    g = np.repeat(np.arange(85), sizes).astype(np.int32)
    floor = (rng.uniform(size=g.size) < 0.17).astype(np.float32)
    u = rng.normal(size=g.size).astype(np.float32)  # a row-level covariate
    a = 1.5 + 0.32 * rng.normal(size=85)
    y = (a[g] - 0.66 * floor + 0.2 * u + 0.73 * rng.normal(size=g.size)).astype(np.float32)
    return (g, floor, u, y), {"N": int(g.size), "groups": 85}


def radon_like(g, floor, u, y=None, subsample_size=100):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    sigma_a = numpyro.sample("sigma_a", dist.Uniform(0, 100))
    sigma_y = numpyro.sample("sigma_y", dist.Uniform(0, 100))
    b = numpyro.sample("b", dist.Normal(0, 10).expand([2]).to_event(1))
    with numpyro.plate("groups", 85):
        a = numpyro.sample("a", dist.Normal(mu, sigma_a))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]] + b[0] * floor[i] + b[1] * u[i], sigma_y),
                       obs=None if y is None else y[i])


def radon_nc(g, floor, u, y=None, subsample_size=100):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(1))
    b = numpyro.sample("b", dist.Normal(0, 10).expand([2]).to_event(1))
    with numpyro.plate("groups", 85):
        with numpyro.handlers.reparam(config={"a": LocScaleReparam(0)}):
            a = numpyro.sample("a", dist.Normal(mu, sigma_a))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]] + b[0] * floor[i] + b[1] * u[i], sigma_y),
                       obs=None if y is None else y[i])


def enum_mix_marginal(y, subsample_size=500):
    """``enum_mix`` with the assignment summed out by hand: its NUTS reference (NumPyro's
    NUTS enumerates through funsor, which the package does not need)."""
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
    loc = numpyro.sample("loc", dist.TransformedDistribution(
        dist.Normal(0, 5).expand([2]).to_event(1), OrderedTransform()))
    scale = numpyro.sample("scale", dist.HalfNormal(3))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.MixtureSameFamily(dist.Categorical(w), dist.Normal(loc, scale)),
                       obs=y[i])


hier_nb_lsr = numpyro.handlers.reparam(hier_nb_centred, config={"a": LocScaleReparam(0)})



#: name: (model, data generator, compared sites, the model NUTS runs for the reference where it
#: differs: the same posterior)
_TABLE = {
    "robust-t": (robust_t, robust_t_data, ("a", "b", "sigma", "nu"), None),
    "negbin": (negbin, negbin_data, ("a", "b", "phi"), None),
    "ordinal": (ordinal, ordinal_data, ("b", "c"), None),
    "softmax": (softmax, softmax_data, ("a", "B"), None),
    "hetero": (hetero, hetero_data, ("a", "b", "s0", "g"), None),
    "gamma-glm": (gamma_glm, gamma_data, ("a", "b", "shape"), None),
    "beta-reg": (beta_reg, beta_data, ("a", "b", "phi"), None),
    "weibull-cens": (weibull, weibull_data, ("a", "b", "k"), None),
    "zip": (zip_model, zip_data, ("a", "b", "gate"), None),
    "rare-gate": (zip_model, rare_gate_data, ("a", "b", "gate"), None),
    "probit": (probit, probit_data, ("a", "b"), None),
    "counts-offset": (counts, counts_data, ("a", "b"), None),
    "collinear": (collinear, collinear_data, ("a", "b", "sigma"), None),
    "small-logit": (small_logit, small_data, ("a", "b"), None),
    "wide-logit": (wide_logit, wide_data, ("b",), None),
    "mixture2": (mixture, mixture_data, ("w", "loc", "scale"), None),
    "enum-mix": (enum_mix, mixture_data, ("w", "loc", "scale"), enum_mix_marginal),
    "hlogit-centred": (hlogit, hlogit_data, ("mu", "tau", "b", "a"), None),
    "eight-groups": (eight, eight_data, ("mu", "tau", "sigma", "theta"), None),
    "hier-negbin-c": (hier_nb_centred, hier_nb_data, ("mu", "tau", "b", "phi"), hier_nb),
    "hier-negbin-lsr": (hier_nb_lsr, hier_nb_data, ("mu", "tau", "b", "phi"), hier_nb),
    "hier-negbin-nc": (hier_nb, hier_nb_data, ("mu", "tau", "b", "phi", "z"), None),
    "lkj-centred": (lkj_centred, lkj_data, ("m", "s", "sigma"), lkj),
    "lkj-varying": (lkj, lkj_data, ("m", "s", "L", "sigma", "z"), None),
    "radon-like": (radon_like, radon_like_data, ("mu", "sigma_a", "sigma_y", "b", "a"), None),
    "radon-nc-inside": (radon_nc, radon_like_data, ("mu", "sigma_a", "sigma_y", "b", "a"),
                        None),
}


def problems_from(table: dict, names=None, reference_settings: dict | None = None
                  ) -> dict[str, Problem]:
    """The problems of a table ``{name: (model, data, sites, reference model)}`` (all, or
    ``names``), in its order; ``reference_settings``: per name, NUTS settings of its
    reference that differ from the suite's."""
    out = {}
    for name, (model, data, sites, reference_model) in table.items():
        if names is None or name in names:
            args, info = data()
            out[name] = Problem(name, model, args, {}, sites, info, reference_model,
                                reference_settings=(reference_settings or {}).get(name))
    return out


def suite(names=None) -> dict[str, Problem]:
    """The suite's problems (all, or ``names``), in the table's order."""
    return problems_from(_TABLE, names)
