"""The hierarchical and scale-model suite of ``bench_hierarchical.py``: data generators and the
models as a user writes them (NumPyro, one subsample plate over the rows).

- ``normal-centred``: y_i ~ N(a_{g_i} + x_i β, σ_y²), a_g ~ N(μ, σ_a²), σ_a, σ_y ~ Uniform(0,
  100) (Gelman and Hill's radon model), 100 groups of 1 to ~1000 rows;
- ``normal-noncentred``: the same data, HalfNormal(1) scales, a_g written with
  ``LocScaleReparam(0)``;
- ``logistic-varying``: varying intercepts and slopes, a_g ~ N(μ_a, τ_a²), b_g ~ N(μ_b, τ_b²),
  HalfNormal(1) scales, 80 groups of 2 to ~1000 rows (centred);
- ``sparse-gamma``: logistic regression with Gamma(0.5, 0.5) global and local scales
  (β_j ~ N(0, (τ λ_j)²); d = 51, 5 non-zero);
- ``horseshoe``: linear regression with the horseshoe prior (half-Cauchy global and local
  scales; Carvalho, Polson and Scott 2010), d = 25, 3 non-zero;
- ``poisson-noncentred``: Poisson counts with varying intercepts, a_g ~ N(b_0, τ²), τ ~
  HalfCauchy(1), written non-centred with ``LocScaleReparam(0)``, 60 groups of 1 to 800
  rows;
- ``normal-group-predictor``: varying intercepts with a group-level predictor, a_g ~ N(γ_0 +
  γ_1 u_g, σ_a²), Exponential(1) scales (centred), 85 groups of a few to ~500 rows, N ≈ 2,600.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.reparam import LocScaleReparam


@dataclass
class Problem:
    """A suite entry: the model, its data arguments and keyword arguments, the sites compared."""

    name: str
    model: object
    args: tuple
    kwargs: dict
    sites: tuple
    info: dict
    #: the model NUTS runs for the reference, where it differs (the same posterior written
    #: non-centred, which NUTS samples without divergences)
    reference_model: object = None
    #: the same posterior with its group effects written centred, where ``model`` is not
    #: (the input of ``centring_weights``)
    centred_model: object = None
    #: NUTS settings of its reference that differ from ``hier_refs.SETTINGS`` (e.g. a dense
    #: mass matrix where crossed effects make the posterior a narrow ridge)
    reference_settings: dict | None = None


def _group_sizes(rng, num_groups: int, num_data: int, smallest: int) -> np.ndarray:
    w = rng.lognormal(0.0, 1.6, size=num_groups)
    sizes = np.maximum(smallest, np.floor(w / w.sum() * num_data)).astype(int)
    sizes[np.argmax(sizes)] += num_data - sizes.sum()
    return sizes


def _grouped_rows(rng, num_groups: int, num_data: int, smallest: int):
    """Group sizes, the rows' shuffled group indices and two N(0, 1) covariates."""
    sizes = _group_sizes(rng, num_groups, num_data, smallest)
    g = np.repeat(np.arange(num_groups), sizes).astype(np.int32)
    rng.shuffle(g)
    return sizes, g, rng.normal(size=(num_data, 2)).astype(np.float32)


def grouped_normal_data(num_data: int = 15_000, num_groups: int = 100, seed: int = 34):
    rng = np.random.default_rng(seed)
    sizes, g, X = _grouped_rows(rng, num_groups, num_data, 1)
    a = 1.5 + 0.3 * rng.normal(size=num_groups)
    y = (a[g] + X @ np.array([0.7, -0.4]) + 0.8 * rng.normal(size=num_data)).astype(np.float32)
    info = {"group_sizes_min_median_max": [int(sizes.min()), int(np.median(sizes)),
                                           int(sizes.max())], "true_sigma_a": 0.3}
    return (X, g, y), info


def normal_centred(X, g, y=None, subsample_size: int = 500, num_groups: int = 100):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.Uniform(0.0, 100.0))
    sigma_y = numpyro.sample("sigma_y", dist.Uniform(0.0, 100.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(mu, sigma_a))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(a[g[idx]] + X[idx] @ beta, sigma_y),
                       obs=None if y is None else y[idx])


def _normal_halfnormal(X, g, y=None, subsample_size: int = 500, num_groups: int = 100):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(mu, sigma_a))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(a[g[idx]] + X[idx] @ beta, sigma_y),
                       obs=None if y is None else y[idx])


normal_noncentred = numpyro.handlers.reparam(_normal_halfnormal,
                                             config={"a": LocScaleReparam(0)})


def varying_logistic_data(num_data: int = 20_000, num_groups: int = 80, seed: int = 35):
    rng = np.random.default_rng(seed)
    sizes, g, X = _grouped_rows(rng, num_groups, num_data, 2)
    a = -0.5 + 0.6 * rng.normal(size=num_groups)
    b = 0.8 + 0.4 * rng.normal(size=num_groups)
    logits = a[g] + b[g] * X[:, 0] - 0.5 * X[:, 1]
    y = (rng.uniform(size=num_data) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    info = {"group_sizes_min_median_max": [int(sizes.min()), int(np.median(sizes)),
                                           int(sizes.max())]}
    return (X, g, y), info


def logistic_varying(X, g, y=None, subsample_size: int = 500, num_groups: int = 80):
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 2.5))
    mu_b = numpyro.sample("mu_b", dist.Normal(0.0, 2.5))
    tau_a = numpyro.sample("tau_a", dist.HalfNormal(1.0))
    tau_b = numpyro.sample("tau_b", dist.HalfNormal(1.0))
    c = numpyro.sample("c", dist.Normal(0.0, 2.5))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(mu_a, tau_a))
        b = numpyro.sample("b", dist.Normal(mu_b, tau_b))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        gi = g[idx]
        logits = a[gi] + b[gi] * X[idx, 0] + c * X[idx, 1]
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=None if y is None else y[idx])


def sparse_logistic_data(num_data: int = 10_000, dim: int = 50, seed: int = 36):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(num_data, dim)).astype(np.float32)
    beta = np.zeros(dim)
    beta[:5] = [1.5, -1.0, 0.8, -0.6, 0.4]
    logits = 0.3 + X @ beta
    y = (rng.uniform(size=num_data) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return (X, y), {"nonzero": 5}


def sparse_gamma(X, y=None, subsample_size: int = 500):
    d = X.shape[1]
    intercept = numpyro.sample("intercept", dist.Normal(0.0, 2.5))
    tau = numpyro.sample("tau", dist.Gamma(0.5, 0.5))
    with numpyro.plate("coef", d):
        lam = numpyro.sample("lambda", dist.Gamma(0.5, 0.5))
        beta = numpyro.sample("beta", dist.Normal(0.0, tau * lam))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=intercept + X[idx] @ beta),
                       obs=None if y is None else y[idx])


def horseshoe_data(num_data: int = 10_000, dim: int = 25, seed: int = 37):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(num_data, dim)).astype(np.float32)
    beta = np.zeros(dim)
    beta[:3] = [0.5, -0.3, 0.2]
    y = (X @ beta + rng.normal(size=num_data)).astype(np.float32)
    return (X, y), {"nonzero": 3}


def horseshoe(X, y=None, subsample_size: int = 500):
    d = X.shape[1]
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
    with numpyro.plate("coef", d):
        lam = numpyro.sample("lambda", dist.HalfCauchy(1.0))
        beta = numpyro.sample("beta", dist.Normal(0.0, tau * lam))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, sigma), obs=None if y is None else y[idx])


#: sparse-gamma's NUTS reference: the same posterior with the five coefficients that are
#: non-zero in the simulation centred and the 45 others non-centred (a partial centring chosen
#: from the truth). Written centred or non-centred throughout, NUTS did not mix (centred: not
#: finished in 90 min; non-centred: min ESS 3, 2,683 divergences); this form: min ESS 1,900,
#: 21 divergences in 10^4 draws.
sparse_gamma_mixed = numpyro.handlers.reparam(
    sparse_gamma, config={"beta": LocScaleReparam(
        centered=np.concatenate([np.ones(5), np.zeros(45)]).astype(np.float32))})
#: The horseshoe written non-centred (β_j = τ λ_j β̃_j): the same posterior, for its NUTS
#: reference (the centred funnels give NUTS divergences and an ESS of a few draws).
horseshoe_noncentred = numpyro.handlers.reparam(horseshoe, config={"beta": LocScaleReparam(0)})


def poisson_data(num_groups: int = 60, seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes = np.maximum(1, np.round(np.geomspace(1, 800, num_groups))).astype(int)
    g = np.repeat(np.arange(num_groups), sizes).astype(np.int32)
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.5 + 0.4 * rng.normal(size=num_groups)
    y = rng.poisson(np.exp(a[g] + 0.3 * x)).astype(np.float32)
    return (g, x, y), {"N": int(g.size), "groups": num_groups, "sizes": "1-800"}


def _poisson(g, x, y=None, num_groups: int = 60, subsample_size: int = 500):
    b0 = numpyro.sample("b0", dist.Normal(0.0, 5.0))
    b1 = numpyro.sample("b1", dist.Normal(0.0, 2.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(b0, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Poisson(jnp.exp(a[g[idx]] + b1 * x[idx])),
                       obs=None if y is None else y[idx])


poisson_noncentred = numpyro.handlers.reparam(_poisson, config={"a": LocScaleReparam(0)})


def group_predictor_data(num_groups: int = 85, seed: int = 1):
    rng = np.random.default_rng(seed)
    sizes = np.minimum(np.maximum(1, np.round(rng.lognormal(3.0, 1.2, num_groups))), 1000)
    g = np.repeat(np.arange(num_groups), sizes.astype(int)).astype(np.int32)
    floor = rng.integers(0, 2, g.size).astype(np.float32)
    u = rng.normal(size=num_groups).astype(np.float32)
    a = 1.5 + 0.7 * u + 0.2 * rng.normal(size=num_groups)
    y = (a[g] - 0.6 * floor + 0.8 * rng.normal(size=g.size)).astype(np.float32)
    return (g, floor, u, y), {"N": int(g.size), "groups": num_groups}


def normal_group_predictor(g, floor, u, y=None, num_groups: int = 85,
                           subsample_size: int = 400):
    g0 = numpyro.sample("g0", dist.Normal(0.0, 10.0))
    g1 = numpyro.sample("g1", dist.Normal(0.0, 10.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.Exponential(1.0))
    sigma_y = numpyro.sample("sigma_y", dist.Exponential(1.0))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(g0 + g1 * u, sigma_a))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(a[g[idx]] + beta * floor[idx], sigma_y),
                       obs=None if y is None else y[idx])


def suite() -> dict[str, Problem]:
    """The suite's problems, in the table's order."""
    normal, n_info = grouped_normal_data()
    varying, v_info = varying_logistic_data()
    sparse, s_info = sparse_logistic_data()
    hs, h_info = horseshoe_data()
    pois, p_info = poisson_data()
    gp, gp_info = group_predictor_data()
    return {
        "normal-centred": Problem("normal-centred", normal_centred, normal, {},
                                  ("mu", "sigma_a", "sigma_y", "beta", "a"), n_info),
        "normal-noncentred": Problem("normal-noncentred", normal_noncentred, normal, {},
                                     ("mu", "sigma_a", "sigma_y", "beta", "a"),
                                     n_info, centred_model=_normal_halfnormal),
        "logistic-varying": Problem("logistic-varying", logistic_varying, varying, {},
                                    ("mu_a", "mu_b", "tau_a", "tau_b", "c", "a", "b"), v_info),
        "sparse-gamma": Problem("sparse-gamma", sparse_gamma, sparse, {},
                                ("intercept", "tau", "lambda", "beta"), s_info,
                                sparse_gamma_mixed),
        "horseshoe": Problem("horseshoe", horseshoe, hs, {},
                             ("sigma", "tau", "lambda", "beta"), h_info,
                             horseshoe_noncentred),
        "poisson-noncentred": Problem("poisson-noncentred", poisson_noncentred, pois, {},
                                      ("b0", "b1", "tau", "a"), p_info),
        "normal-group-predictor": Problem("normal-group-predictor", normal_group_predictor,
                                          gp, {}, ("g0", "g1", "beta", "sigma_a", "sigma_y",
                                                   "a"), gp_info),
    }
