"""Bad input is refused early (construction, or init before the proxy fit) with a message that
names the argument or site, the value seen and what to do."""

import dataclasses
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import logistic_data, logistic_model
from numpyro.infer import MCMC

import numpyro_subsample.ecs.kernel as ecs_kernel
import numpyro_subsample.proxies.laplace as laplace
import numpyro_subsample.sgmcmc.preprocess as sg_kernel
from numpyro_subsample import (
    SGHMC,
    SGLD,
    SGNHT,
    SGRLD,
    AdaptationOptions,
    EnergyConservingHMC,
    HMCOptions,
    LikelihoodOptions,
    LocalConfig,
    ModelData,
    NoiseOptions,
    PreferentialOptions,
    ZVOptions,
    build_potential,
)
from numpyro_subsample.core.options import OPTIONS
from numpyro_subsample.ecs.difference import SELECTIONS
from numpyro_subsample.ecs.likelihood_proxies import LIKELIHOOD_PROXIES
from numpyro_subsample.estimators.adaptive import AdaptiveOptions
from numpyro_subsample.estimators.floyd import DRAW_METHODS
from numpyro_subsample.estimators.registry import ESTIMATORS, estimator_options
from numpyro_subsample.sgmcmc.distributed import DISTRIBUTED_ESTIMATORS, DistributedSGLD
from numpyro_subsample.sgmcmc.kernel import SGMCMCKernel

KEY = jax.random.PRNGKey(0)
N = 300


@pytest.fixture(scope="module")
def data():
    return logistic_data(N=N, d=3, seed=1)


@pytest.fixture
def no_fit(monkeypatch):
    """Any proxy fit fails the test: errors must come before it."""

    def fail(*args, **kwargs):
        raise AssertionError("the proxy was fitted before the bad input was reported")

    for module in (laplace, sg_kernel, ecs_kernel):
        monkeypatch.setattr(module, "fit_laplace", fail)


def _md(*args, **kwargs):
    return ModelData.from_args(args, kwargs)


def _raises(exc, *fragments):
    """pytest.raises(exc) whose message must contain every fragment (literally)."""
    return pytest.raises(exc, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


# --- 1. observations whose shape broadcasts the likelihood -------------------------------------


def _model_obs(X, y, subsample_size=50):
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


@pytest.mark.parametrize("trailing", [(1,), (2,)])
def test_observations_that_broadcast_the_likelihood_raise(data, no_fit, trailing):
    """y of shape (N, 1) against a likelihood of batch shape (n,) would give an (n, n) log
    likelihood: refused, naming the site, both shapes and the fix."""
    X, y = data
    y_bad = jnp.broadcast_to(y[:, None], (N, *trailing))
    with _raises(ValueError, "'y'", f"(50, {trailing[0]})", "(50,)", "reshape"):
        build_potential(_model_obs, _md(X, y_bad), KEY)
    with _raises(ValueError, "'y'", "reshape"):
        SGLD(logistic_model).init(KEY, 0, None, (X, y_bad), {})
    # the well-shaped model: exactly one term per plate index, equal to the Bernoulli one
    md = _md(X, y)
    pot = build_potential(_model_obs, md, KEY)
    idx = jnp.array([0, 7, 7, 299])
    beta = jnp.array([0.3, -0.2, 0.1])
    fi = pot.data_terms(beta, idx, md)
    assert fi.shape == (4,)
    np.testing.assert_allclose(fi, -dist.Bernoulli(logits=X[idx] @ beta).log_prob(y[idx]),
                               rtol=1e-5)


def test_event_and_nested_plate_observations_are_accepted(data):
    """Observations with event dimensions or an inner plate are not mistaken for broadcasts."""
    X, y = data
    Y = jnp.stack([y, 1 - y], -1)

    def model(X, Y, subsample_size=50):
        beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size, dim=-2) as idx:
            mu, m = (X[idx] @ beta)[:, None], idx.shape[0]
            numpyro.sample("v", dist.Normal(mu[..., None], 1.0).expand([m, 1, 2]).to_event(1),
                           obs=Y[idx][:, None, :])
            with numpyro.plate("k", 2, dim=-1):
                numpyro.sample("w", dist.Bernoulli(logits=mu), obs=Y[idx])

    md = _md(X, Y)
    pot = build_potential(model, md, KEY)
    assert pot.data_terms(jnp.zeros(3), jnp.arange(5), md).shape == (5,)


# --- 2. sizes and options ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, size, exc",
    [(0, N, ValueError), (-5, N, ValueError), (2.5, N, TypeError), (N + 1, N, ValueError),
     (0, 0, ValueError)],
)
def test_bad_plate_sizes_raise(data, n, size, exc):
    X, y = data
    fragments = ["'data'", f"subsample_size={n!r}"] if size else ["N=0", "model_args[0]"]
    with _raises(exc, *fragments):
        build_potential(_model_obs, _md(X[:size], y[:size], subsample_size=n), KEY)


_BAD_OPTIONS = [
    # (kernel, keyword, bad value, exception)
    (SGLD, "chunk_size", 0, ValueError),
    (SGLD, "chunk_size", -3, ValueError),
    (SGLD, "chunk_size", 2.5, TypeError),
    (SGLD, "step_size", "big", TypeError),
    (SGLD, "step_size", -1.0, ValueError),
    (SGLD, "step_size", float("nan"), ValueError),
    (SGLD, "init_strategy", "middle", ValueError),
    (SGLD, "seed", 1.5, TypeError),
    (SGLD, "seed", "a", TypeError),
    (SGLD, "replace", "yes", TypeError),
    (SGLD, "preconditioning", None, TypeError),
    (SGLD, "proxy", "mode", ValueError),
    (SGLD, "proxy_kwargs", 3, TypeError),
    (SGLD, "zv", 3, TypeError),
    (SGLD, "noise", {"correction": True}, TypeError),
    (SGLD, "adaptation", True, TypeError),
    (SGLD, "local", 5, TypeError),
    (SGHMC, "friction", 0.0, ValueError),
    (SGHMC, "friction", "high", TypeError),
    (SGNHT, "friction", -1.0, ValueError),
    (EnergyConservingHMC, "num_blocks", 0, ValueError),
    (EnergyConservingHMC, "num_blocks", 2.0, TypeError),
    (EnergyConservingHMC, "subsample_size", 1, ValueError),
    (EnergyConservingHMC, "subsample_size", 2.5, TypeError),
    (EnergyConservingHMC, "selection", "pps", ValueError),
    (EnergyConservingHMC, "hmc", {"algo": "HMC"}, TypeError),
    (EnergyConservingHMC, "seed", None, TypeError),
    (DistributedSGLD, "num_shards", 0, ValueError),
    (DistributedSGLD, "trajectory_length", 0, ValueError),
    (DistributedSGLD, "trajectory_length", 2.5, TypeError),
    (DistributedSGLD, "shard_sizes", [100, 0], ValueError),
    (DistributedSGLD, "shard_frequencies", [0.5, -0.5], ValueError),
    (DistributedSGLD, "adaptive_trajectory", "yes", TypeError),
    (DistributedSGLD, "estimator", "preferential", ValueError),
]


@pytest.mark.filterwarnings("ignore:SGLD's step_size is now:DeprecationWarning")
@pytest.mark.parametrize("cls, name, value, exc", _BAD_OPTIONS,
                         ids=[f"{c.__name__}-{k}={v!r}" for c, k, v, _ in _BAD_OPTIONS])
def test_bad_kernel_options_raise_at_construction(cls, name, value, exc):
    with _raises(exc, name, repr(value)):
        cls(logistic_model, **{name: value})


_BAD_RECORDS = [
    # (option record, field, bad value, exception)
    (NoiseOptions, "max_variance_inflation", 0.0, ValueError),
    (NoiseOptions, "max_variance_inflation", 1.5, ValueError),
    (NoiseOptions, "max_variance_inflation", "5%", TypeError),
    (NoiseOptions, "correction", "yes", TypeError),
    (ZVOptions, "degree", 3, ValueError),
    (ZVOptions, "covariates", "diagonal", ValueError),
    (ZVOptions, "fn", 3, TypeError),
    (AdaptationOptions, "preconditioner", "yes", TypeError),
    (AdaptationOptions, "proxy", 1, TypeError),
    (HMCOptions, "step_size", "small", TypeError),
    (HMCOptions, "target_accept_prob", 1.5, ValueError),
    (HMCOptions, "max_tree_depth", 0, ValueError),
    (HMCOptions, "num_steps", 0, ValueError),
    (HMCOptions, "trajectory_length", -1.0, ValueError),
    (HMCOptions, "algo", "MALA", ValueError),
    (HMCOptions, "dense_mass", "yes", TypeError),
    (PreferentialOptions, "uniform_mix", 0.0, ValueError),
    (PreferentialOptions, "num_draws", 0, ValueError),
    (LikelihoodOptions, "num_mc_draws", 1, ValueError),
    (LikelihoodOptions, "taylor_order", 3, ValueError),
]


@pytest.mark.parametrize("cls, name, value, exc", _BAD_RECORDS,
                         ids=[f"{c.__name__}-{k}={v!r}" for c, k, v, _ in _BAD_RECORDS])
def test_bad_option_records_raise_when_built(cls, name, value, exc):
    with _raises(exc, cls.__name__, name, repr(value)):
        cls(**{name: value})


def test_bad_local_config_raises_at_kernel_construction():
    with _raises(ValueError, "LocalConfig", "steps", "0"):
        SGLD(logistic_model, local=LocalConfig(steps=0))
    with _raises(TypeError, "LocalConfig", "update", "3"):
        SGRLD(logistic_model, local=LocalConfig(update=3))


@pytest.mark.parametrize("cls, given, meant, exc", [
    (SGLD, "stepsize", "step_size", ValueError), (SGHMC, "frictoin", "friction", ValueError),
    (SGLD, "adaptaton", "adaptation", ValueError),
    (DistributedSGLD, "num_shard", "num_shards", ValueError),
    (SGNHT, "chunksize", "chunk_size", ValueError),
    (SGRLD, "stepsize", "step_size", TypeError),
    (EnergyConservingHMC, "num_block", "num_blocks", TypeError),
])
def test_misspelt_kernel_option_suggests_the_kernel_argument(cls, given, meant, exc):
    """A misspelt keyword of the kernel is not reported as an estimator option with "valid
    options: none" alone (SG kernels pass unknown keywords to the estimator) nor as a bare
    "unexpected keyword argument" (closed signatures): the message offers the argument."""
    with _raises(exc, f"{given!r}: did you mean {meant}?", cls.__name__, meant):
        cls(logistic_model, **{given: 0.1})


def test_misspelt_estimator_option_suggests_the_estimator_option():
    with _raises(ValueError, "'num_strat': did you mean num_strata?", "kmeans_iters"):
        SGLD(logistic_model, estimator="stratified", num_strat=5)
    with pytest.raises(ValueError, match="'bogus'") as err:  # no close match: no guess
        SGLD(logistic_model, bogus=1)
    assert "did you mean" not in str(err.value) and "step_size" in str(err.value)


@pytest.mark.parametrize("cls", [SGLD, SGHMC, EnergyConservingHMC])
def test_subsample_size_equal_to_n_runs_on_every_row(data, cls):
    """n = N is allowed (the README's 1 ≤ n ≤ N): the plate is the data plate and each step
    reads every row."""
    X, y = data
    mcmc = MCMC(cls(logistic_model, progress_bar=False), num_warmup=20, num_samples=30,
                progress_bar=False)
    mcmc.run(KEY, X, y, subsample_size=N)
    assert mcmc.sampler.potential.plate.subsample_size == N
    beta = np.asarray(mcmc.get_samples()["beta"])
    assert beta.shape == (30, 3) and np.isfinite(beta).all() and np.ptp(beta, 0).min() > 0


def test_ecs_subsample_size_and_blocks_are_checked_at_construction():
    with _raises(ValueError, "num_blocks=7", "subsample_size=50"):
        EnergyConservingHMC(logistic_model, subsample_size=50, num_blocks=7)


_BAD_ESTIMATOR_OPTIONS = [
    # (estimator, options, exception, fragments of the message)
    ("stratified", {"num_strat": 5}, ValueError, ["num_strat", "num_strata", "kmeans_iters"]),
    ("cv-preferential", {"uniform_mixx": 0.1}, ValueError, ["uniform_mixx", "uniform_mix"]),
    ("cv", {"bogus": 1}, ValueError, ["bogus", "'cv'"]),
    ("cv", {"adaptive": True, "v_0": 1.0}, ValueError, ["v_0", "v0", "n_min"]),
    ("stratified", {"num_strata": 0}, ValueError, ["num_strata", "0"]),
    ("stratified", {"num_strata": "10"}, TypeError, ["num_strata", "'10'"]),
    ("cv-stratified", {"num_strata": 2.5}, TypeError, ["num_strata", "2.5"]),
    ("stratified", {"kmeans_iters": 0}, ValueError, ["kmeans_iters", "0"]),
    ("stratified", {"num_probes": -1}, ValueError, ["num_probes", "-1"]),
    ("stratified", {"draw_method": "fast"}, ValueError, ["draw_method", "'fast'", "'sort'"]),
    ("stratified", {"features": "x"}, TypeError, ["features", "'x'"]),
    ("preferential", {"uniform_mix": 1.5}, ValueError, ["uniform_mix", "1.5"]),
    ("preferential", {"weights": "exactly"}, ValueError, ["weights", "'exactly'", "'exact'"]),
    ("preferential", {"weights": 3.0}, TypeError, ["weights", "3.0"]),
    ("cv", {"adaptive": "yes"}, TypeError, ["adaptive", "'yes'"]),
    ("uniform", {"adaptive": True}, ValueError, ["adaptive=True", "'uniform'", "'cv'"]),
    ("cv", {"adaptive": True, "v0": -1.0}, ValueError, ["v0", "-1.0"]),
    ("cv", {"adaptive": True, "v0": "auto"}, ValueError, ["v0", "'auto'", "'pilot'"]),
    ("cv", {"adaptive": True, "pilot_quantile": 0.0}, ValueError, ["pilot_quantile", "0.0"]),
    ("cv", {"adaptive": True, "n_min": 0}, ValueError, ["n_min", "0"]),
    ("cv-preferential", {"adaptive": True, "pilot_chains": 2.5}, TypeError,
     ["pilot_chains", "2.5"]),
    ("cv", {"subsample_size": 0}, ValueError, ["subsample_size", "0"]),
    ("preferential", {"replace": False}, ValueError, ["'preferential'", "replace=False"]),
]


@pytest.mark.parametrize("name, options, exc, fragments", _BAD_ESTIMATOR_OPTIONS,
                         ids=[f"{e}-{o}" for e, o, _, _ in _BAD_ESTIMATOR_OPTIONS])
def test_bad_estimator_options_raise_at_construction(name, options, exc, fragments):
    with _raises(exc, *fragments):
        SGLD(logistic_model, estimator=name, **options)


def test_option_spec_matches_the_code():
    """The declared options are the constructors' keyword arguments, and the declared choices
    those the code accepts."""
    kernels = {"SGMCMCKernel": (SGMCMCKernel, {"model", "estimator", "estimator_options",
                                               "adaptation", "noise", "zv", "local"}),
               "SGHMC": (SGHMC, {"model", "kwargs"}),
               "EnergyConservingHMC": (EnergyConservingHMC, {"model", "hmc", "likelihood",
                                                             "preferential", "deprecated"}),
               "DistributedSGLD": (DistributedSGLD, {"model", "mesh", "kwargs"})}
    for owner, (cls, undeclared) in kernels.items():
        params = set(inspect.signature(cls.__init__).parameters) - {"self"}
        assert set(OPTIONS[owner]) == params - undeclared, owner
    records = {"ZVOptions": ZVOptions, "AdaptationOptions": AdaptationOptions,
               "NoiseOptions": NoiseOptions, "HMCOptions": HMCOptions,
               "LikelihoodOptions": LikelihoodOptions,
               "PreferentialOptions": PreferentialOptions}
    for owner, cls in records.items():
        assert set(OPTIONS[owner]) == {f.name for f in dataclasses.fields(cls)}, owner
    assert set(OPTIONS["LocalConfig"]) == set(LocalConfig._fields) - {"init_step"}
    assert OPTIONS["DistributedSGLD"]["estimator"].choices == DISTRIBUTED_ESTIMATORS
    assert set(OPTIONS["EnergyConservingHMC"]["selection"].choices) == set(SELECTIONS)
    assert set(OPTIONS["EnergyConservingHMC"]["likelihood_proxy"].choices) == set(
        LIKELIHOOD_PROXIES)
    assert set(OPTIONS["estimator='stratified'"]["draw_method"].choices) == set(DRAW_METHODS)
    assert set(OPTIONS["adaptive=True"]) == set(AdaptiveOptions._fields)
    for name in ESTIMATORS:
        assert set(OPTIONS.get(f"estimator={name!r}", {})) == set(estimator_options(name))


# --- 3. data lengths and values ----------------------------------------------------------------


def _model_plate_size(X, y, size, subsample_size=20):
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", size, subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


@pytest.mark.parametrize(
    "n_x, n_y, size, name, rows",
    [(N, N - 50, N, "model_args[1]", N - 50),   # y shorter than the plate
     (N, N + 50, N, "model_args[1]", N + 50),   # y longer
     (N, N, N - 100, "model_args[0]", N)],      # plate smaller than the data
)
def test_data_length_differs_from_plate_size(data, no_fit, n_x, n_y, size, name, rows):
    X, y = data
    X = jnp.concatenate([X, X])[:n_x]
    y = jnp.concatenate([y, y])[:n_y]
    with _raises(ValueError, name, f"{rows} rows", f"N={size}", "'data'"):
        build_potential(_model_plate_size, _md(X, y, size), KEY)
    with _raises(ValueError, name, f"N={size}"):
        SGLD(_model_plate_size).init(KEY, 0, None, (X, y, size), {})


@pytest.mark.parametrize("where", ["X", "y"])
def test_non_finite_data_raise_before_the_fit(data, no_fit, where):
    X, y = data
    if where == "X":
        args, kwargs, name = (X.at[17, 2].set(jnp.inf), y), {}, "model_args[0]"
    else:
        args, kwargs, name = (X,), {"y": y.at[40].set(jnp.nan)}, "model_kwargs['y']"
    with _raises(ValueError, name, "non-finite", f"row {17 if where == 'X' else 40}"):
        SGLD(logistic_model).init(KEY, 0, None, args, kwargs)
    with _raises(ValueError, name, "non-finite"):
        EnergyConservingHMC(logistic_model, num_blocks=5).init(KEY, 0, None, args, kwargs)


# --- 4. NumPy arrays ---------------------------------------------------------------------------


def _samples(kernel, X, y, **run_kwargs):
    mcmc = MCMC(kernel, num_warmup=50, num_samples=100, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(3), X, y, **run_kwargs)
    return np.asarray(mcmc.get_samples()["beta"])


@pytest.mark.filterwarnings("ignore:SGLD's step_size is now:DeprecationWarning")
def test_numpy_scalars_are_accepted_as_options():
    kernel = SGLD(logistic_model, step_size=np.float32(0.01), chunk_size=np.int64(512),
                  noise=NoiseOptions(max_variance_inflation=np.float64(0.1)), seed=np.int32(1),
                  replace=np.bool_(False))
    assert kernel.chunk_size == 512 and kernel.seed == 1 and kernel.replace is False
    ecs = EnergyConservingHMC(logistic_model, num_blocks=np.int64(5),
                              hmc=HMCOptions(target_accept_prob=np.float64(0.9)),
                              subsample_size=np.int64(50))
    assert ecs.num_blocks == 5 and ecs.hmc_options["target_accept_prob"] == 0.9


@pytest.mark.parametrize("kind", ["sgld", "ecs"])
def test_numpy_arrays_give_the_same_draws(kind):
    X, y = logistic_data(N=500, d=3, seed=2)
    X_np, y_np = np.asarray(X), np.asarray(y)
    assert isinstance(X_np, np.ndarray) and not isinstance(X_np, jax.Array)

    def make():
        if kind == "sgld":
            return SGLD(logistic_model)
        return EnergyConservingHMC(logistic_model, num_blocks=5,
                                   hmc=HMCOptions(algo="HMC", num_steps=5))

    kw = {"subsample_size": 50}
    draws_np = _samples(make(), X_np, y_np, **kw)
    draws_jnp = _samples(make(), X, y, **kw)
    assert draws_np.shape == (100, 3) and np.all(np.isfinite(draws_np))
    np.testing.assert_allclose(draws_np, draws_jnp, rtol=1e-5, atol=1e-6)


# --- 5. option errors that need the data come before the proxy fit -----------------------------


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: SGLD(logistic_model, estimator="stratified", num_strata=51), ["num_strata=51",
                                                                               "50"]),
        (lambda: SGLD(logistic_model, estimator="stratified", features=np.ones((N - 1, 2))),
         ["features", f"N={N}"]),
        (lambda: SGLD(logistic_model, estimator="preferential", weights=np.ones(3)),
         ["weights", f"N={N}"]),
        (lambda: SGLD(logistic_model, estimator="cv", adaptive=True, n_max=N + 1),
         ["n_max", f"N={N}"]),
        (lambda: EnergyConservingHMC(logistic_model, num_blocks=7), ["num_blocks=7"]),
        (lambda: EnergyConservingHMC(logistic_model, subsample_size=N + 10),
         ["subsample_size", f"N={N}"]),
    ],
)
def test_data_dependent_option_errors_come_before_the_fit(data, no_fit, make, match):
    X, y = data
    kernel = make()
    with _raises(ValueError, *match):
        kernel.init(KEY, 0, None, (X, y), {"subsample_size": 50})
