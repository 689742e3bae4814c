"""The potential built from a model, and the errors for bad models and data."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import logistic_data, logistic_hier_model
from numpyro.infer.util import potential_energy

from numpyro_subsample import SGLD, ModelData, NoiseOptions, build_potential
from numpyro_subsample.core.data import check_data_finite
from numpyro_subsample.proxies.checks import transformed_coordinates

KEY = jax.random.PRNGKey(0)


@pytest.fixture(scope="module")
def data():
    return logistic_data(N=300, d=3, seed=1)


def _md(*args, **kwargs):
    return ModelData.from_args(args, kwargs)


def test_terms_match_numpyro_potential_energy(data):
    X, y = data
    md = _md(X, y)
    pot = build_potential(logistic_hier_model, md, KEY)
    assert pot.plate == ("data", 300, 100, -1)
    assert set(pot.latent_sites) == {"tau", "beta"} and pot.dim == 4
    for theta in [jnp.array([0.3, -0.1, 0.2, 0.5]), jnp.array([-1.0, 2.0, 0.0, -2.0])]:
        f0, fi = pot.terms(theta, jnp.arange(300), md)
        ref = potential_energy(
            logistic_hier_model, (X, y), {"subsample_size": 300}, pot.unravel(theta)
        )
        np.testing.assert_allclose(f0 + fi.sum(), ref, rtol=1e-5)


def test_terms_per_datum_and_jit_with_traced_indices(data):
    X, y = data
    md = _md(X, y)
    pot = build_potential(logistic_hier_model, md, KEY)
    theta = jnp.array([0.3, -0.1, 0.2, 0.5])
    _, full = pot.terms(theta, jnp.arange(300), md)
    idx = jnp.array([5, 7, 5, 299])
    sub = jax.jit(lambda t, i, d: pot.terms(t, i, d)[1])(theta, idx, md)
    np.testing.assert_allclose(sub, full[idx], rtol=1e-6)
    # the per-datum term is the Bernoulli negative log-likelihood
    beta = theta[:3]
    manual = -dist.Bernoulli(logits=X[idx] @ beta).log_prob(y[idx])
    np.testing.assert_allclose(sub, manual, rtol=1e-5)


def test_constrain_maps_to_support(data):
    X, y = data
    md = _md(X, y)
    pot = build_potential(logistic_hier_model, md, KEY)
    out = pot.constrain(pot.unravel(jnp.array([0.0, 0.0, 0.0, -3.0])), md)
    np.testing.assert_allclose(out["tau"], np.exp(-3.0), rtol=1e-6)


# --- bad input ------------------------------------------------------------------------------


def _model_no_subsample(X, y):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ b), obs=y)


def _model_two_plates(X, y):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=10) as i:
        numpyro.sample("y", dist.Bernoulli(logits=X[i] @ b), obs=y[i])
    with numpyro.plate("data2", X.shape[0], subsample_size=10) as j:
        numpyro.sample("y2", dist.Bernoulli(logits=X[j] @ b), obs=y[j])


def _model_local_latent(X, y):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=10) as i:
        with numpyro.plate("pair", 2, dim=-2):
            u = numpyro.sample("u", dist.Normal(0, 1))
        numpyro.sample("y", dist.Bernoulli(logits=X[i] @ b + u.sum(0)), obs=y[i])


def _model_discrete(X, y):
    k = numpyro.sample("k", dist.Bernoulli(0.5))
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=10) as i:
        numpyro.sample("y", dist.Bernoulli(logits=X[i] @ b + k), obs=y[i])


def _model_unindexed_obs(X, y):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=10) as i:
        numpyro.sample("y", dist.Bernoulli(logits=X[i] @ b), obs=y[:10])


def _model_too_large(X, y):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=X.shape[0] + 1) as i:
        numpyro.sample("y", dist.Bernoulli(logits=X[i] @ b), obs=y[i])


@pytest.mark.parametrize(
    "model, match",
    [
        (_model_no_subsample, "no subsample plate"),
        (_model_two_plates, "several subsample plates.*ordinary plates"),
        (_model_local_latent, r"Local latent site 'u' .*also in the plate\(s\) \['pair'\]"),
        (_model_discrete, "Latent site 'k' is discrete"),
        (_model_unindexed_obs, "indexed by the plate's indices"),
        (_model_too_large, "subsample_size=301 larger than its size N=300"),
    ],
)
def test_bad_models_raise_clear_errors(data, model, match):
    X, y = data
    with pytest.raises(ValueError, match=match):
        build_potential(model, _md(X, y), KEY)


def test_non_finite_data_is_rejected(data):
    X, y = data
    X_bad = X.at[17, 1].set(jnp.nan)
    with pytest.raises(ValueError, match=r"model_args\[0\] .*first at row 17"):
        check_data_finite(_md(X_bad, y), 300)
    kernel = SGLD(logistic_hier_model)
    with pytest.raises(ValueError, match="non-finite values"):
        kernel.init(KEY, 0, None, (X_bad, y), {})


@pytest.mark.filterwarnings("ignore:SGLD's step_size is now:DeprecationWarning")
def test_bad_kernel_settings_raise():
    with pytest.raises(ValueError, match="Unknown estimator 'foo'"):
        SGLD(logistic_hier_model, estimator="foo")
    with pytest.raises(ValueError, match="step_size must be a positive number"):
        SGLD(logistic_hier_model, step_size=-1.0)
    with pytest.raises(ValueError, match="proxy must be"):
        SGLD(logistic_hier_model, proxy="bogus")
    with pytest.raises(ValueError, match="step_size must be a positive number, got 'big'"):
        SGLD(logistic_hier_model, step_size="big")
    with pytest.raises(ValueError, match="chunk_size must be a positive integer, got 0"):
        SGLD(logistic_hier_model, chunk_size=0)
    with pytest.raises(ValueError, match=r"max_variance_inflation must be in \(0, 1\]"):
        SGLD(logistic_hier_model, noise=NoiseOptions(max_variance_inflation=1.5))


# --- ModelData ------------------------------------------------------------------------------


def test_model_data_round_trip_keeps_non_arrays_static():
    """Arrays (JAX or NumPy) are the pytree's children; ints, None, strings stay static."""
    X = np.arange(6.0, dtype=np.float32).reshape(3, 2)  # a NumPy array
    w = np.ones(2, np.float32)
    y = jnp.array([0.0, 1.0, 1.0])
    args, kwargs = (X, None, 3), {"y": y, "link": "logit", "opts": {"k": 2, "w": w}}
    md = ModelData.from_args(args, kwargs)
    assert len(md.arrays) == 3 and all(isinstance(a, jax.Array) for a in md.arrays)
    assert md.names() == ("model_args[0]", "model_kwargs['opts']['w']", "model_kwargs['y']")
    assert len(jax.tree.leaves(md)) == 3  # only the arrays are traced
    args2, kwargs2 = md.args_kwargs()
    assert args2[1] is None and args2[2] == 3 and isinstance(args2[2], int)
    assert kwargs2["link"] == "logit" and kwargs2["opts"]["k"] == 2
    assert set(kwargs2) == set(kwargs)
    np.testing.assert_array_equal(args2[0], X)
    np.testing.assert_array_equal(kwargs2["opts"]["w"], w)
    np.testing.assert_array_equal(kwargs2["y"], y)

    traces = []

    @jax.jit
    def f(d):
        traces.append(1)  # runs once per compilation
        (a, none, k), kw = d.args_kwargs()
        assert none is None and isinstance(k, int) and kw["link"] == "logit"  # not traced
        return k * a.sum() + kw["opts"]["k"] * kw["y"].sum()

    assert float(f(md)) == 3 * 15.0 + 2 * 2.0
    # new values of the same shapes: same signature, same compiled program
    other = ModelData.from_args((X + 1, None, 3), dict(kwargs, y=jnp.zeros(3)))
    assert other.signature() == md.signature() and not other.same_values(md)
    assert float(f(other)) == 3 * 21.0
    assert len(traces) == 1
    # a new static value is a new signature (and a new program)
    changed = ModelData.from_args((X, None, 4), kwargs)
    assert changed.signature() != md.signature()
    assert ModelData.from_args(args, kwargs).same_values(md)


def test_numpy_arrays_are_accepted_as_data(data):
    X, y = data
    X_np, y_np = np.asarray(X), np.asarray(y)
    md_np, md = _md(X_np, y_np, subsample_size=50), _md(X, y, subsample_size=50)
    pot = build_potential(logistic_hier_model, md_np, KEY)
    assert pot.plate == ("data", 300, 50, -1) and pot.data_leaves == (0, 1)
    theta = jnp.array([0.3, -0.1, 0.2, 0.5])
    idx = jnp.array([0, 3, 299])
    np.testing.assert_allclose(pot.data_terms(theta, idx, md_np),
                               pot.data_terms(theta, idx, md), rtol=1e-6)
    assert md_np.signature() == md.signature() and md_np.same_values(md)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, jnp.bfloat16])
def test_host_finiteness_check_matches_the_compiled_one(monkeypatch, dtype):
    """CPU data are checked by NumPy in chunks (no compiled program); the rows it flags are
    those of the compiled check, across chunk boundaries and for NumPy inputs too."""
    from numpyro_subsample.core import data as pot_mod

    monkeypatch.setattr(pot_mod, "_HOST_CHUNK", 7)  # chunks of 3 rows of (N, 2, 1)
    x = np.ones((50, 2, 1), np.float32)
    x[[2, 3, 29, 49], [0, 1, 1, 0], 0] = [np.nan, np.inf, -np.inf, np.nan]
    arr = jnp.asarray(x, dtype)
    expected = np.asarray(pot_mod._rows_finite(arr))
    assert np.flatnonzero(~expected).tolist() == [2, 3, 29, 49]
    np.testing.assert_array_equal(pot_mod._host_rows_finite(arr), expected)
    np.testing.assert_array_equal(pot_mod._host_rows_finite(np.asarray(x)), expected)
    with pytest.raises(ValueError, match="non-finite values in 4 rows, the first at row 2"):
        check_data_finite(_md(arr))


def _start_model(y=None, subsample_size=10):
    numpyro.sample("loc", dist.Normal(3.0, 10.0).expand([2]).to_event(1))
    numpyro.sample("scale", dist.HalfCauchy(1.0))  # no finite mean: the feasible point 1
    numpyro.sample("rate", dist.Gamma(4.0, 2.0))  # mean 2
    numpyro.sample("probs", dist.Dirichlet(jnp.ones(3)))  # mean 1/3 each
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y[idx])


def test_start_is_the_prior_mean_plus_a_reproducible_jitter():
    """The starting point is the unconstrained prior mean (the feasible point where the mean
    is not finite) plus N(0, 0.1²) from the key: a saddle at the mean (zero weights) is left."""
    from numpyro.distributions import biject_to

    from numpyro_subsample.core.structure import INIT_JITTER

    y = jnp.zeros(50)
    pots = [build_potential(_start_model, _md(y), jax.random.PRNGKey(k)) for k in (0, 0, 1)]
    np.testing.assert_array_equal(pots[0].init_theta, pots[1].init_theta)
    assert not np.allclose(pots[0].init_theta, pots[2].init_theta)
    simplex = biject_to(dist.Dirichlet(jnp.ones(3)).support)
    mean = np.concatenate([[3.0, 3.0], np.asarray(simplex.inv(jnp.ones(3) / 3)),  # sorted
                           [np.log(2.0)], [0.0]])  # names: loc, probs, rate, scale
    jitter = np.stack([np.asarray(p.init_theta) - mean for p in pots])
    assert np.all(np.abs(jitter) < 5 * INIT_JITTER) and np.all(np.abs(jitter) > 0)


def _two_sources(X, y, X2, y2):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=100) as i:
        numpyro.sample("y", dist.Normal(X[i] @ b, 1.0), obs=y[i])
    with numpyro.plate("data2", X2.shape[0]):
        numpyro.sample("y2", dist.Normal(X2 @ b, 0.5), obs=y2)


def test_a_second_ordinary_plate_is_evaluated_in_full_and_the_posterior_is_exact():
    """The remedy the several-plates error gives: a second data source as an ordinary plate
    beside the subsample plate; against the exact conjugate posterior of both sources."""
    from numpyro_subsample import MCMC, SGHMC

    rng = np.random.default_rng(3)
    X, X2 = rng.normal(size=(2000, 3)), rng.normal(size=(40, 3)) * np.array([1.0, 3.0, 0.3])
    b = np.array([0.5, -1.0, 0.8])
    y, y2 = X @ b + rng.normal(size=2000), X2 @ b + 0.5 * rng.normal(size=40)
    prec = np.eye(3) + X.T @ X + X2.T @ X2 / 0.25
    cov = np.linalg.inv(prec)
    mean = cov @ (X.T @ y + X2.T @ y2 / 0.25)
    args = tuple(np.asarray(a, np.float32) for a in (X, y, X2, y2))
    mcmc = MCMC(SGHMC(_two_sources), num_warmup=500, num_samples=3000, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mcmc.run(jax.random.PRNGKey(0), *args)
    draws = np.asarray(mcmc.get_samples()["b"], np.float64)
    sd = np.sqrt(np.diag(cov))
    assert np.max(np.abs(draws.mean(0) - mean) / sd) < 0.25
    assert np.max(np.abs(np.log(draws.std(0) / sd))) < 0.15


def _flat_priors(k, y, subsample_size=100):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.ImproperUniform(dist.constraints.positive, (), ()))
    with numpyro.plate("pair", 2):
        c = numpyro.sample("c", dist.ImproperUniform(dist.constraints.real, (), ()))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(mu + c[k[i]], s), obs=y[i])


def _flat_data(num_data=500):
    rng = np.random.default_rng(0)
    k = rng.integers(0, 2, num_data)
    return (jnp.asarray(k, jnp.int32),
            jnp.asarray(rng.normal(np.where(k == 0, 1.0, -1.0), 2.0), jnp.float32))


def test_improper_priors_are_read_without_drawing_from_them():
    """``dist.ImproperUniform`` has a density but no ``sample``; the traces that read the
    model's structure draw latent sites from their priors, so they would raise
    NotImplementedError. The potential starts such sites at the support's point at 0 in
    unconstrained coordinates and its terms equal NumPyro's potential energy."""
    k, y = _flat_data()
    md = ModelData.from_args((k, y), {})
    pot = build_potential(_flat_priors, md, KEY)
    assert set(pot.latent_sites) == {"mu", "s", "c"} and pot.dim == 4
    for theta in [jnp.array([0.3, -0.2, 0.1, 0.5]), jnp.array([-1.0, 2.0, 0.0, -0.7])]:
        f0, fi = pot.terms(theta, jnp.arange(500), md)
        ref = potential_energy(_flat_priors, (k, y), {"subsample_size": 500},
                               pot.unravel(theta))
        np.testing.assert_allclose(f0 + fi.sum(), ref, rtol=1e-5)
    # the proxy checks trace the model for its supports
    assert transformed_coordinates(pot, md).tolist() == [False, False, False, True]


@pytest.mark.slow
def test_a_model_with_improper_priors_is_sampled_right_by_default():
    """Default SGLD on the model above against long full-data NUTS (which starts improper
    sites by ``init_to_uniform``): every site within 0.15 posterior sd in mean and 0.15 in
    log-sd, no warning."""
    from numpyro.infer import MCMC as NumPyroMCMC
    from numpyro.infer import NUTS

    from numpyro_subsample import MCMC

    k, y = _flat_data(4000)
    nuts = NumPyroMCMC(NUTS(_flat_priors), num_warmup=1000, num_samples=10_000,
                       progress_bar=False)
    nuts.run(jax.random.PRNGKey(1), k, y, subsample_size=y.shape[0])
    ref = nuts.get_samples()
    mcmc = MCMC(SGLD(_flat_priors, progress_bar=False), num_warmup=1000, num_samples=10_000,
                num_chains=4, progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), k, y)
    assert [str(w.message) for w in caught] == []
    draws = mcmc.get_samples()
    for site in ("mu", "s", "c"):
        r, d = np.asarray(ref[site]), np.asarray(draws[site])
        sd = r.std(0)
        assert np.max(np.abs(d.mean(0) - r.mean(0)) / sd) < 0.15, site
        assert np.max(np.abs(np.log(d.std(0) / sd))) < 0.15, site
