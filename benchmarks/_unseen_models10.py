"""A tenth batch of hierarchical models not tuned on (``bench_models.py --batch 10``), written as
users write them, with their data generators: pairwise comparisons, a non-linear mean function,
censored responses and a two-part model.

``bradley-terry`` (paired comparisons: 150 players of very unequal activity, each row a game
between two of them, P(i beats j) = logistic(a_i − a_j + home advantage), abilities
a ~ Normal(0, σ) with a HalfNormal(1) σ: every row informs two group effects),
``emax-hier`` (a dose-response curve E0 + Emax d/(ED50_j + d) with a log ED50 per subject,
log ED50_j ~ Normal(μ, ω), 60 subjects of 3 to 200 rows: the group effect enters the mean
non-linearly), ``tobit-hier`` (a normal regression with group intercepts whose responses are
left-censored at 0, the censored rows entering through the Normal cdf with
``numpyro.factor``) and ``hurdle-gamma`` (a zero-or-positive response: Bernoulli for a zero,
Gamma for a positive amount, each part with its own group effects and scale).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _unseen_models import problems_from
from _unseen_models2 import _rows, _sizes
from _unseen_models4 import _noncentred


def bradley_terry_data(players=150, games=12_000, seed=1001):
    rng = np.random.default_rng(seed)
    activity = rng.lognormal(0.0, 1.0, players)
    p = activity / activity.sum()
    i = rng.choice(players, games, p=p).astype(np.int32)
    j = rng.choice(players, games, p=p).astype(np.int32)
    same = i == j
    j[same] = (j[same] + 1 + rng.integers(0, players - 1, same.sum())) % players
    a = 0.6 * rng.normal(size=players)
    y = (rng.uniform(size=games) < 1 / (1 + np.exp(-(a[i] - a[j] + 0.2)))).astype(np.float32)
    games_per_player = np.bincount(np.concatenate([i, j]), minlength=players)
    return (i, j, y), {"N": games, "players": players,
                       "games per player": f"{games_per_player.min()}-{games_per_player.max()}"}


def bradley_terry(i, j, y=None, players=150, subsample_size=500):
    home = numpyro.sample("home", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("players", players):
        a = numpyro.sample("a", dist.Normal(0.0, sigma))
    with numpyro.plate("data", i.shape[0], subsample_size=subsample_size) as k:
        numpyro.sample("y", dist.Bernoulli(logits=a[i[k]] - a[j[k]] + home),
                       obs=None if y is None else y[k])


def emax_data(subjects=60, seed=1002):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, subjects, 3.5, 1.0, 3, 200))
    dose = rng.choice(np.array([0.0, 1.0, 3.0, 10.0, 30.0, 100.0]), g.size).astype(np.float32)
    log_ed50 = np.log(8.0) + 0.5 * rng.normal(size=subjects)
    mean = 2.0 + 10.0 * dose / (np.exp(log_ed50[g]) + dose)
    y = (mean + 1.5 * rng.normal(size=g.size)).astype(np.float32)
    return (g, dose, y), {"N": int(g.size), "subjects": subjects}


def emax_hier(g, dose, y=None, subjects=60, subsample_size=400):
    e0 = numpyro.sample("e0", dist.Normal(0.0, 10.0))
    emax = numpyro.sample("emax", dist.Normal(0.0, 20.0))
    mu = numpyro.sample("mu", dist.Normal(2.0, 2.0))
    omega = numpyro.sample("omega", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("subjects", subjects):
        log_ed50 = numpyro.sample("log_ed50", dist.Normal(mu, omega))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as k:
        d = dose[k]
        mean = e0 + emax * d / (jnp.exp(log_ed50[g[k]]) + d)
        numpyro.sample("y", dist.Normal(mean, sigma), obs=None if y is None else y[k])


def tobit_data(groups=70, seed=1003):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.0, 1.1, 1, 1500))
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.3 + 0.7 * rng.normal(size=groups)
    latent = a[g] + 0.8 * x + 1.2 * rng.normal(size=g.size)
    censored = latent <= 0.0
    y = np.where(censored, 0.0, latent).astype(np.float32)
    return (g, x, y, censored.astype(np.float32)), {
        "N": int(g.size), "groups": groups, "censored": f"{censored.mean():.0%}"}


def tobit_hier(g, x, y, censored, groups=70, subsample_size=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as k:
        mean = a[g[k]] + b * x[k]
        c = censored[k]
        observed = dist.Normal(mean, sigma).log_prob(y[k])
        below = jnp.log(jnp.clip(dist.Normal(0.0, 1.0).cdf(-mean / sigma), 1e-30, 1.0))
        numpyro.factor("y", jnp.where(c > 0, below, observed))


def hurdle_data(groups=50, seed=1004):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.0, 1.0, 2, 1200))
    x = rng.normal(size=g.size).astype(np.float32)
    u = -0.3 + 0.8 * rng.normal(size=groups)
    v = 1.0 + 0.4 * rng.normal(size=groups)
    zero = rng.uniform(size=g.size) < 1 / (1 + np.exp(-(u[g] + 0.5 * x)))
    mean = np.exp(v[g] + 0.3 * x)
    shape = 2.0
    amount = rng.gamma(shape, mean / shape)
    y = np.where(zero, 0.0, amount).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups, "zeros": f"{zero.mean():.0%}"}


def hurdle_gamma(g, x, y, groups=50, subsample_size=500):
    u0 = numpyro.sample("u0", dist.Normal(0.0, 2.5))
    bu = numpyro.sample("bu", dist.Normal(0.0, 2.5))
    su = numpyro.sample("su", dist.HalfNormal(1.0))
    v0 = numpyro.sample("v0", dist.Normal(0.0, 2.5))
    bv = numpyro.sample("bv", dist.Normal(0.0, 2.5))
    sv = numpyro.sample("sv", dist.HalfNormal(1.0))
    shape = numpyro.sample("shape", dist.Gamma(2.0, 0.5))
    with numpyro.plate("groups", groups):
        u = numpyro.sample("u", dist.Normal(u0, su))
        v = numpyro.sample("v", dist.Normal(v0, sv))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as k:
        zero = y[k] <= 0.0
        logit_zero = u[g[k]] + bu * x[k]
        mean = jnp.exp(v[g[k]] + bv * x[k])
        positive = dist.Gamma(shape, shape / mean).log_prob(jnp.where(zero, 1.0, y[k]))
        ll = jnp.where(zero, jax.nn.log_sigmoid(logit_zero),
                       jax.nn.log_sigmoid(-logit_zero) + positive)
        numpyro.factor("y", ll)


#: name: (model, data generator, compared sites, the model NUTS runs where it differs)
_TABLE = {
    "bradley-terry": (bradley_terry, bradley_terry_data, ("home", "sigma", "a"),
                      _noncentred(bradley_terry, "a")),
    "emax-hier": (emax_hier, emax_data, ("e0", "emax", "mu", "omega", "sigma", "log_ed50"),
                  _noncentred(emax_hier, "log_ed50")),
    "tobit-hier": (tobit_hier, tobit_data, ("mu", "tau", "b", "sigma", "a"),
                   _noncentred(tobit_hier, "a")),
    "hurdle-gamma": (hurdle_gamma, hurdle_data,
                     ("u0", "bu", "su", "v0", "bv", "sv", "shape", "u", "v"),
                     _noncentred(hurdle_gamma, "u", "v")),
}


def suite(names=None):
    """The tenth batch's problems (all, or ``names``), in the table's order."""
    return problems_from(_TABLE, names)
