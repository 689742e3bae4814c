"""An eighth batch of hierarchical models not tuned on (``bench_models.py --batch 8``), written as
users write them, with their data generators: hierarchies inside other likelihoods and
transforms.

``irt-2pl`` (a two-parameter item-response model: 40 items with LogNormal discriminations and
hierarchical difficulties, 400 persons' abilities, 12,000 responses), ``dirichlet-hier``
(categorical rows of 50 groups, group simplexes Dirichlet(α m) around a Dirichlet mean m with a
Gamma concentration α), ``zip-hier`` (zero-inflated Poisson counts with varying intercepts in
the count part and a group-varying zero probability, both centred), ``ordinal-hier`` (ordered
logistic ratings with centred varying rater intercepts and ordered cut points) and
``negbin-dispersion`` (negative binomial counts whose per-group dispersion is hierarchical on
the log scale, centred).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _unseen_models import problems_from
from _unseen_models2 import _rows, _sizes
from _unseen_models4 import _noncentred


def irt_data(items=40, persons=400, seed=801):
    rng = np.random.default_rng(seed)
    n = 12000
    item = rng.integers(0, items, n).astype(np.int32)
    person = rng.integers(0, persons, n).astype(np.int32)
    a = np.exp(0.3 * rng.normal(size=items))
    b = 0.2 + 0.8 * rng.normal(size=items)
    ability = rng.normal(size=persons)
    p = 1 / (1 + np.exp(-a[item] * (ability[person] - b[item])))
    y = (rng.uniform(size=n) < p).astype(np.float32)
    return (item, person, y), {"N": n, "items": items, "persons": persons}


def irt_2pl(item, person, y=None, items=40, persons=400, subsample_size=500):
    s_a = numpyro.sample("s_a", dist.HalfNormal(1.0))
    mu_b = numpyro.sample("mu_b", dist.Normal(0.0, 2.0))
    s_b = numpyro.sample("s_b", dist.HalfNormal(2.0))
    with numpyro.plate("items", items):
        a = numpyro.sample("a", dist.LogNormal(0.0, s_a))
        b = numpyro.sample("b", dist.Normal(mu_b, s_b))
    with numpyro.plate("persons", persons):
        ability = numpyro.sample("ability", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", item.shape[0], subsample_size=subsample_size) as i:
        logits = a[item[i]] * (ability[person[i]] - b[item[i]])
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=None if y is None else y[i])


def dirichlet_data(groups=50, K=4, seed=802):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.0, 1.0, 3, 1500))
    m = np.array([0.4, 0.3, 0.2, 0.1])
    p = rng.dirichlet(20.0 * m, groups)
    y = np.array([rng.choice(K, p=p[j]) for j in g], np.int32)
    return (g, y), {"N": int(g.size), "groups": groups}


def dirichlet_hier(g, y=None, groups=50, subsample_size=500):
    m = numpyro.sample("m", dist.Dirichlet(jnp.ones(4)))
    alpha = numpyro.sample("alpha", dist.Gamma(2.0, 0.1))
    with numpyro.plate("groups", groups):
        p = numpyro.sample("p", dist.Dirichlet(alpha * m))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Categorical(probs=p[g[i]]), obs=None if y is None else y[i])


def zip_hier_data(groups=60, seed=803):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.5, 1.0, 5, 2000))
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.8 + 0.4 * rng.normal(size=groups)
    z = -1.0 + 0.7 * rng.normal(size=groups)
    zero = rng.uniform(size=g.size) < 1 / (1 + np.exp(-z[g]))
    y = np.where(zero, 0, rng.poisson(np.exp(a[g] + 0.3 * x))).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def zip_hier(g, x, y=None, groups=60, subsample_size=500):
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 2.0))
    s_a = numpyro.sample("s_a", dist.HalfNormal(1.0))
    mu_z = numpyro.sample("mu_z", dist.Normal(0.0, 2.0))
    s_z = numpyro.sample("s_z", dist.HalfNormal(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("groups", groups):
        a = numpyro.sample("a", dist.Normal(mu_a, s_a))
        z = numpyro.sample("z", dist.Normal(mu_z, s_z))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.ZeroInflatedPoisson(jax_sigmoid(z[g[i]]),
                                                     jnp.exp(a[g[i]] + b * x[i])),
                       obs=None if y is None else y[i])


def jax_sigmoid(v):
    return 1.0 / (1.0 + jnp.exp(-v))


def ordinal_hier_data(raters=70, seed=804):
    rng = np.random.default_rng(seed)
    r = _rows(rng, _sizes(rng, raters, 4.0, 1.1, 2, 1500))
    x = rng.normal(size=r.size).astype(np.float32)
    u = 0.6 * rng.normal(size=raters)
    eta = u[r] + 0.9 * x
    cuts = np.array([-1.5, 0.0, 1.2, 2.5])
    p_le = 1 / (1 + np.exp(-(cuts[None, :] - eta[:, None])))
    y = (rng.uniform(size=r.size)[:, None] > p_le).sum(1).astype(np.int32)
    return (r, x, y), {"N": int(r.size), "raters": raters}


def ordinal_hier(r, x, y=None, raters=70, subsample_size=500):
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    cuts = numpyro.sample("cuts", dist.TransformedDistribution(
        dist.Normal(0.0, 3.0).expand([4]).to_event(1), dist.transforms.OrderedTransform()))
    with numpyro.plate("raters", raters):
        u = numpyro.sample("u", dist.Normal(0.0, tau))
    with numpyro.plate("data", r.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.OrderedLogistic(u[r[i]] + b * x[i], cuts),
                       obs=None if y is None else y[i])


def negbin_disp_data(groups=50, seed=805):
    rng = np.random.default_rng(seed)
    g = _rows(rng, _sizes(rng, groups, 4.2, 1.0, 5, 2000))
    x = rng.normal(size=g.size).astype(np.float32)
    log_phi = 1.0 + 0.5 * rng.normal(size=groups)
    mu = np.exp(1.5 + 0.4 * x)
    phi = np.exp(log_phi)[g]
    y = rng.negative_binomial(phi, phi / (phi + mu)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": groups}


def negbin_dispersion(g, x, y=None, groups=50, subsample_size=500):
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    m = numpyro.sample("m", dist.Normal(0.0, 2.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("groups", groups):
        log_phi = numpyro.sample("log_phi", dist.Normal(m, s))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(a + b * x[i]),
                                                    jnp.exp(log_phi[g[i]])),
                       obs=None if y is None else y[i])


#: name: (model, data generator, compared sites, the model NUTS runs where it differs)
_TABLE = {
    "irt-2pl": (irt_2pl, irt_data, ("s_a", "mu_b", "s_b", "a", "b", "ability"),
                _noncentred(irt_2pl, "b")),
    "dirichlet-hier": (dirichlet_hier, dirichlet_data, ("m", "alpha", "p"), None),
    "zip-hier": (zip_hier, zip_hier_data, ("mu_a", "s_a", "mu_z", "s_z", "b", "a", "z"),
                 _noncentred(zip_hier, "a", "z")),
    "ordinal-hier": (ordinal_hier, ordinal_hier_data, ("b", "tau", "cuts", "u"),
                     _noncentred(ordinal_hier, "u")),
    "negbin-dispersion": (negbin_dispersion, negbin_disp_data,
                          ("a", "b", "m", "s", "log_phi"),
                          _noncentred(negbin_dispersion, "log_phi")),
}


def suite(names=None):
    """The eighth batch's problems (all, or ``names``), in the table's order."""
    return problems_from(_TABLE, names)
