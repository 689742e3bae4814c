"""A third batch of models not tuned on (``bench_models.py --batch 3``), written as users write
them, with their data generators.

``lad-reg`` (a Laplace likelihood: median regression), ``binomial-nc`` (binomial counts of
1-50 trials, group intercepts non-centred by hand), ``spline-rw`` (a smooth of 16 basis
functions with a random-walk prior and a HalfNormal smoothing scale), ``hier-student``
(Student-t group effects, centred), ``beta-binomial`` (overdispersed counts with a
logistic mean), ``categorical-dirichlet`` (a simplex site under SGLD), ``factor-survival``
(censored exponential survival written with ``numpyro.factor``), ``measurement-error`` (the
covariate measured with error: a local latent per row), ``multi-output`` (three outcomes per
row with an LKJ noise correlation), ``poisson-slopes`` (centred varying intercepts and
slopes, each with its own scale), ``lognormal-reg`` and ``olre-poisson`` (a Poisson
regression with an observation-level random effect: a local latent per row).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _hier_models import Problem
from _unseen_models import _X, problems_from
from _unseen_models2 import _rows, _sizes


def lad_data(n=15000, seed=201):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 4)
    y = (0.5 + X @ np.array([1.0, -0.5, 0.0, 0.3]) + rng.laplace(0, 0.8, n)).astype(np.float32)
    return (X, y), {"N": n}


def lad_reg(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 2).expand([X.shape[1]]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(2))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Laplace(a + X[i] @ b, s), obs=None if y is None else y[i])


def binomial_data(groups=60, seed=202):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.5, 1.3, 1, 2000))
    trials = rng.integers(1, 51, g.size).astype(np.float32)
    x = rng.normal(size=g.size).astype(np.float32)
    a = -0.5 + 0.7 * rng.normal(size=groups)
    p = 1 / (1 + np.exp(-(a[g] + 0.4 * x)))
    y = rng.binomial(trials.astype(int), p).astype(np.float32)
    return (g, x, trials, y), {"N": int(g.size), "groups": groups}


def binomial_nc(g, x, trials, y=None, groups=60, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 2))
    tau = numpyro.sample("tau", dist.HalfNormal(1))
    b = numpyro.sample("b", dist.Normal(0, 1))
    with numpyro.plate("groups", groups):
        z = numpyro.sample("z", dist.Normal(0, 1))
    a = mu + tau * z
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Binomial(trials[i], logits=a[g[i]] + b * x[i]),
                       obs=None if y is None else y[i])


def spline_data(n=20000, seed=203):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, n)
    centres = np.linspace(0, 1, 16)
    B = np.exp(-0.5 * ((x[:, None] - centres[None]) / 0.07) ** 2).astype(np.float32)
    y = (np.sin(6 * x) + 0.5 * x + rng.normal(0, 0.5, n)).astype(np.float32)
    return (B, y), {"N": n}


def spline_rw(B, y=None, subsample_size=500):
    tau = numpyro.sample("tau", dist.HalfNormal(0.5))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1))
    w0 = numpyro.sample("w0", dist.Normal(0, 2))
    with numpyro.plate("knots", B.shape[1] - 1):
        dw = numpyro.sample("dw", dist.Normal(0, tau))
    w = jnp.concatenate([w0[None], w0 + jnp.cumsum(dw)])
    with numpyro.plate("data", B.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(B[i] @ w, sigma), obs=None if y is None else y[i])


def student_groups_data(groups=50, seed=204):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.8, 1.0, 3, 1500))
    a = 2.0 + 0.5 * rng.standard_t(3, size=groups)
    y = (a[g] + 1.5 * rng.normal(size=g.size)).astype(np.float32)
    return (g, y), {"N": int(g.size), "groups": groups}


def hier_student(g, y=None, groups=50, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfNormal(2))
    sigma = numpyro.sample("sigma", dist.HalfNormal(3))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.StudentT(3, mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]], sigma), obs=None if y is None else y[i])


def beta_binomial_data(n=12000, seed=205):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n).astype(np.float32)
    trials = rng.integers(5, 40, n).astype(np.float32)
    m = 1 / (1 + np.exp(-(-0.3 + 0.6 * x)))
    kappa = 12.0
    p = rng.beta(m * kappa, (1 - m) * kappa)
    y = rng.binomial(trials.astype(int), p).astype(np.float32)
    return (x, trials, y), {"N": n}


def beta_binomial(x, trials, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 2))
    b = numpyro.sample("b", dist.Normal(0, 2))
    kappa = numpyro.sample("kappa", dist.LogNormal(2, 1.5))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as i:
        m = jnp.clip(1 / (1 + jnp.exp(-(a + b * x[i]))), 1e-6, 1 - 1e-6)
        numpyro.sample("y", dist.BetaBinomial(m * kappa, (1 - m) * kappa, trials[i]),
                       obs=None if y is None else y[i])


def categorical_data(n=15000, seed=206):
    rng = np.random.default_rng(seed)
    p = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    y = rng.choice(6, size=n, p=p).astype(np.int32)
    return (y,), {"N": n}


def categorical_dirichlet(y, subsample_size=500):
    p = numpyro.sample("p", dist.Dirichlet(jnp.ones(6)))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Categorical(probs=p), obs=y[i])


def survival_data(n=15000, seed=207):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 3)
    rate = np.exp(-1.0 + X @ np.array([0.5, -0.3, 0.2]))
    t_event = rng.exponential(1 / rate)
    t_cens = rng.exponential(2.0, n)
    t = np.minimum(t_event, t_cens).astype(np.float32)
    event = (t_event <= t_cens).astype(np.float32)
    return (X, t, event), {"N": n}


def factor_survival(X, t, event, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 3))
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        log_rate = a + X[i] @ b
        numpyro.factor("loglik", event[i] * log_rate - jnp.exp(log_rate) * t[i])


def measurement_data(n=5000, seed=208):
    rng = np.random.default_rng(seed)
    x_true = rng.normal(size=n)
    x_obs = (x_true + 0.5 * rng.normal(size=n)).astype(np.float32)
    y = (1.0 + 0.8 * x_true + 0.4 * rng.normal(size=n)).astype(np.float32)
    return (x_obs, y), {"N": n}


def measurement_error(x_obs, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 5))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    with numpyro.plate("data", x_obs.shape[0], subsample_size=subsample_size) as i:
        x = numpyro.sample("x", dist.Normal(0, 1))
        numpyro.sample("x_obs", dist.Normal(x, 0.5), obs=x_obs[i])
        numpyro.sample("y", dist.Normal(a + b * x, sigma), obs=None if y is None else y[i])


def multi_output_data(n=10000, seed=209):
    rng = np.random.default_rng(seed)
    x = _X(rng, n, 2)
    B = np.array([[1.0, -0.5], [0.3, 0.8], [-0.7, 0.2]])
    C = np.array([[1.0, 0.6, -0.3], [0.6, 1.0, 0.2], [-0.3, 0.2, 1.0]])
    s = np.array([0.5, 1.0, 2.0])
    cov = C * np.outer(s, s)
    y = (x @ B.T + rng.multivariate_normal(np.zeros(3), cov, size=n)).astype(np.float32)
    return (x, y), {"N": n}


def multi_output(x, y=None, subsample_size=500):
    B = numpyro.sample("B", dist.Normal(0, 2).expand([3, x.shape[1]]).to_event(2))
    sd = numpyro.sample("sd", dist.HalfNormal(2).expand([3]).to_event(1))
    L = numpyro.sample("L", dist.LKJCholesky(3, 2.0))
    scale_tril = sd[:, None] * L
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.MultivariateNormal(x[i] @ B.T, scale_tril=scale_tril),
                       obs=None if y is None else y[i])


def poisson_slopes_data(groups=40, seed=210):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 5.0, 1.1, 5, 3000))
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.3 + 0.5 * rng.normal(size=groups)
    b = 0.2 + 0.2 * rng.normal(size=groups)
    y = rng.poisson(np.exp(a[g] + b[g] * x)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def poisson_slopes(g, x, y=None, groups=40, subsample_size=500):
    mu_a = numpyro.sample("mu_a", dist.Normal(0, 2))
    mu_b = numpyro.sample("mu_b", dist.Normal(0, 1))
    s_a = numpyro.sample("s_a", dist.HalfNormal(1))
    s_b = numpyro.sample("s_b", dist.HalfNormal(1))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu_a, s_a))
        b = numpyro.sample("b", dist.Normal(mu_b, s_b))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Poisson(jnp.exp(a[g[i]] + b[g[i]] * x[i])),
                       obs=None if y is None else y[i])


def lognormal_data(n=15000, seed=211):
    rng = np.random.default_rng(seed)
    X = _X(rng, n, 3)
    y = np.exp(0.2 + X @ np.array([0.4, 0.0, -0.6]) + 0.7 * rng.normal(size=n))
    return (X, y.astype(np.float32)), {"N": n}


def lognormal_reg(X, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 3))
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    s = numpyro.sample("s", dist.Exponential(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.LogNormal(a + X[i] @ b, s), obs=None if y is None else y[i])


def olre_data(n=5000, seed=212):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n).astype(np.float32)
    eps = 0.4 * rng.normal(size=n)
    y = rng.poisson(np.exp(1.0 + 0.5 * x + eps)).astype(np.float32)
    return (x, y), {"N": n}


def olre_poisson(x, y=None, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0, 3))
    b = numpyro.sample("b", dist.Normal(0, 1))
    s = numpyro.sample("s", dist.HalfNormal(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as i:
        e = numpyro.sample("e", dist.Normal(0, s))
        numpyro.sample("y", dist.Poisson(jnp.exp(a + b * x[i] + e)),
                       obs=None if y is None else y[i])


#: name: (model, data generator, compared sites, the model NUTS runs where it differs)
_TABLE = {
    "lad-reg": (lad_reg, lad_data, ("a", "b", "s"), None),
    "binomial-nc": (binomial_nc, binomial_data, ("mu", "tau", "b", "z"), None),
    "spline-rw": (spline_rw, spline_data, ("tau", "sigma", "w0", "dw"), None),
    "hier-student": (hier_student, student_groups_data, ("mu", "tau", "sigma", "a"), None),
    "beta-binomial": (beta_binomial, beta_binomial_data, ("a", "b", "kappa"), None),
    "categorical-dirichlet": (categorical_dirichlet, categorical_data, ("p",), None),
    "factor-survival": (factor_survival, survival_data, ("a", "b"), None),
    "measurement-error": (measurement_error, measurement_data, ("a", "b", "sigma"), None),
    "multi-output": (multi_output, multi_output_data, ("B", "sd", "L"), None),
    "poisson-slopes": (poisson_slopes, poisson_slopes_data,
                       ("mu_a", "mu_b", "s_a", "s_b", "a", "b"), None),
    "lognormal-reg": (lognormal_reg, lognormal_data, ("a", "b", "s"), None),
    "olre-poisson": (olre_poisson, olre_data, ("a", "b", "s"), None),
}


def suite(names=None) -> dict[str, Problem]:
    """The batch's problems (all, or ``names``), in the table's order."""
    return problems_from(_TABLE, names)
