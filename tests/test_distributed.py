"""Distributed SGLD (paper 004): shard layout, unbiasedness and posterior accuracy.

The multi-device checks run in one subprocess with 4 simulated CPU devices (XLA_FLAGS must be
set before jax is imported); it prints one JSON line of measurements that the tests below
check. Tolerances: exact conjugate posterior of tests/models.py, means within 0.1 posterior sd
and sds within 10%; unbiasedness |mean − full| < 4 SE per coordinate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import linreg_data, linreg_model

from numpyro_subsample.core.potential import ModelData, build_potential
from numpyro_subsample.sgmcmc.distributed import shard_layout
from numpyro_subsample.sgmcmc.shards import _full_plate_scale

# compilation takes most of these tests' time: most XLA optimisations off (conftest.py)
pytestmark = pytest.mark.fast_compile

SCRIPT = textwrap.dedent(
    r"""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["CI"] = "1"
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    import jax, jax.numpy as jnp, numpy as np
    from jax import monitoring
    from numpyro.infer import MCMC
    if sys.argv[2]:  # the persistent compilation cache of the test session (conftest.py)
        jax.config.update("jax_compilation_cache_dir", sys.argv[2])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from models import linreg_model, linreg_data, linreg_exact
    from numpyro_subsample import ModelData, to_arviz
    from numpyro_subsample.sgmcmc.distributed import DistributedSGLD

    # The programs here run for seconds but take longer to compile: compile them with most
    # XLA optimisations off, except the long chain of the uniform estimator (run(optimise=))
    jax.config.update("jax_disable_most_optimizations", True)
    out = {"devices": len(jax.devices())}
    X, y = linreg_data(N=4000, d=4, seed=3)
    mean, sd = linreg_exact(X, y)
    UNEQUAL = [500, 1500, 1200, 800]

    def run(name, chains=32, seed=1, model_kwargs=None, ess=1600, optimise=False, **kw):
        # Run long enough for an effective sample size ~ ess: the SGLD autocorrelation time
        # in steps is about 2/h with h = step_size, the time step in whitened coordinates
        # (AR(1) coefficient 1 − h), so SE(mean) ≈ sd/sqrt(ess) = 0.025 sd and 0.1 sd is 4 SE.
        t0 = time.perf_counter()
        k = DistributedSGLD(linreg_model, num_shards=4, **kw)
        k.preprocess((X, y), model_kwargs or {})
        steps = ess * (2.0 / k.step_size) / chains
        num_draws = int(np.ceil(steps / k.layout.cycle_length))
        m = MCMC(k, num_warmup=0, num_samples=num_draws, num_chains=chains,
                 chain_method="vectorized", progress_bar=False)
        jax.config.update("jax_disable_most_optimizations", not optimise)
        m.run(jax.random.PRNGKey(seed), X, y, extra_fields=("data_passes", "subsample_size"),
              **(model_kwargs or {}))
        jax.config.update("jax_disable_most_optimizations", True)
        b = np.asarray(m.get_samples()["beta"], np.float64)
        out[name] = {
            "z": ((b.mean(0) - mean) / sd).tolist(), "r": (b.std(0) / sd).tolist(),
            "q": k.layout.frequencies.tolist(), "tau": k.layout.trajectory_lengths.tolist(),
            "draws": num_draws, "steps_per_chain": num_draws * k.layout.cycle_length,
            "step_size": k.step_size, "seconds": time.perf_counter() - t0,
        }
        return k, m

    # 1. cv, fixed τ = 1, equal shards; data layout and ArviZ output checked on this run
    k, m = run("cv_fixed_tau1", trajectory_length=1, adaptive_trajectory=False)
    proxy = k.proxy
    setup = k.setup
    out["sharding"] = {
        "specs": [[str(x) for x in a.sharding.spec] for a in setup.data + (setup.datum_grads,)],
        "global_shapes": [list(a.shape) for a in setup.data],
        "shard_shapes": [[list(s.data.shape) for s in a.addressable_shards] for a in setup.data],
        "shard_devices": [sorted(str(s.device) for s in a.addressable_shards) for a in setup.data],
        "grad_shard_shapes": [list(s.data.shape) for s in setup.datum_grads.addressable_shards],
        "names": list(setup.data_names),
    }
    # the device-local rows are the data's contiguous blocks
    first = np.asarray(setup.data[0].addressable_shards[2].data)[0, :5]
    out["local_rows_match"] = bool(np.allclose(first, np.asarray(X)[2000:2005]))
    idata = to_arviz(m)
    out["arviz"] = {"chain": int(idata.posterior.sizes["chain"]),
                    "draw": int(idata.posterior.sizes["draw"]),
                    "stats": sorted(idata.sample_stats.data_vars)}
    last = m.last_state
    out["comm"] = k.communication_bytes(last)

    # 2. cv, fixed τ = 5 with unequal shards (q_s = 1/S ≠ N_s/N, Eq. 1 weights N_s S / N)
    k5, _ = run("cv_fixed_tau5_unequal", trajectory_length=5, adaptive_trajectory=False,
                shard_sizes=UNEQUAL, proxy=proxy, seed=2)
    # the step's bias probe: at run 1's step (silent), at h = 0.6 (drawn sds about 20 % too
    # wide), and not with trajectories of 5 steps
    import warnings
    from numpyro_subsample import StepBiasWarning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        big = DistributedSGLD(linreg_model, num_shards=4, step_size=0.6, trajectory_length=1,
                              adaptive_trajectory=False, proxy=proxy)
        big.preprocess((X, y))
    p1, p6 = k.preprocessed.step_bias, big.preprocessed.step_bias
    out["probe"] = {
        "default": [p1.flagged, p1.bias, p1.kind],
        "large": [p6.flagged, p6.bias, p6.kind],
        "large_warned": [str(w.message) for w in seen if issubclass(w.category, StepBiasWarning)],
        "tau5_skipped": k5.preprocessed.step_bias_skipped,
    }
    # 3. cv, adaptive τ_s = τ̄ S q_s with user frequencies unrelated to the sizes (Cor. 1.3)
    kq, _ = run("cv_adaptive_userq", trajectory_length=3, shard_sizes=UNEQUAL,
                shard_frequencies=[0.2, 0.3, 0.3, 0.2], proxy=proxy, seed=3)
    # 4. uniform estimator, adaptive with the default q_s = N_s/N; its noise ~ N/n forces a
    # small step (n = 400 keeps it moderate; long trajectories would shrink it further)
    ku, _ = run("uniform_adaptive", ess=600, trajectory_length=4, shard_sizes=UNEQUAL,
                estimator="uniform", proxy=proxy, seed=4, model_kwargs={"subsample_size": 400},
                optimise=True)

    # 5. unbiasedness over shard choice and minibatch, at a point 1.5 sd from the centre
    pot = k.potential
    theta = proxy.centre + proxy.scale_tril @ jnp.full((4,), 1.5)
    data = ModelData.from_args((X, y))
    f_full = lambda t: (lambda f0, fi: f0 + fi.sum())(*pot.terms(t, jnp.arange(4000), data))
    full = np.asarray(jax.grad(f_full)(theta), np.float64)
    for name, kern, kw in (("cv", kq, {}), ("uniform", ku, {"subsample_size": 400})):
        q = kern.layout.frequencies
        K = 2000
        g = np.asarray(kern.shard_estimates(jax.random.split(jax.random.PRNGKey(5), K), theta),
                       np.float64)  # (S, K, d)
        mix = np.einsum("s,sd->d", q, g.mean(1))
        se = np.sqrt(np.einsum("s,sd->d", q**2, g.var(1, ddof=1) / K))
        keys = jax.random.split(jax.random.PRNGKey(6), 3000)
        # the single-device reference of the two-stage law (shard s ~ q, minibatch within s)
        est = kern.preprocessed.estimator
        run_est = jax.jit(jax.vmap(est.estimate, in_axes=(None, 0, None, None)))
        r = run_est(est.params, keys, theta, ModelData.from_args((X, y), kw))[0]
        r = np.asarray(r, np.float64)
        out["unbiased_" + name] = {
            "mixture_t": ((mix - full) / se).tolist(),
            "random_t": ((r.mean(0) - full) / (r.std(0, ddof=1) / np.sqrt(len(r)))).tolist(),
            # a wrong weight (no 1/q_s) must be detected by the same test
            "no_inv_q_t": ((np.einsum("s,sd->d", q * q, g.mean(1)) - full) / se).tolist(),
        }

    # 6. a rerun of the first kernel on new data of the same shapes refits the proxy and
    # compiles none of the package's programs (only NumPyro's loop of the new MCMC object)
    y2 = y + 0.5
    names = []
    def span(event, start, end, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            names.append(str(kw.get("fun_name", "?")))
    monitoring.register_event_time_span_listener(span)
    draws = out["cv_fixed_tau1"]["draws"]  # NumPyro's own eager ops on draws of that shape
    MCMC(k, num_warmup=0, num_samples=draws, num_chains=32, chain_method="vectorized",
         progress_bar=False).run(jax.random.PRNGKey(7), X, y2)
    monitoring.unregister_event_time_span_listener(span)
    out["rerun_compiled"] = [n for n in names if "fori_collect" not in n and "body_fn" not in n]
    out["rerun_refit"] = not np.allclose(k.proxy.centre, proxy.centre)

    # 7. errors
    try:
        MCMC(DistributedSGLD(linreg_model, num_shards=4), num_warmup=0, num_samples=1,
             num_chains=2, chain_method="vectorized", progress_bar=False).run(
                 jax.random.PRNGKey(0), X, y)
        out["chains_error"] = ""
    except ValueError as err:
        out["chains_error"] = str(err)
    print("RESULT " + json.dumps(out))
    """
)


def _device_cache(cache_dir: str | None) -> str:
    """A cache directory of its own for the 4-device subprocess: an executable compiled with
    another device count, read back by a 1-device process, can crash XLA's deserialisation."""
    return f"{cache_dir}-devices4" if cache_dir else ""


@pytest.fixture(scope="module")
def result():  # the tests reading it are marked slow: the subprocess takes minutes cold
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, here, _device_cache(jax.config.jax_compilation_cache_dir)],
        capture_output=True, text=True, env=env,
        timeout=900,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    if os.environ.get("DISTRIBUTED_TEST_DUMP"):
        with open(os.environ["DISTRIBUTED_TEST_DUMP"], "w") as f:
            json.dump(out, f, indent=1)
    return out


@pytest.mark.slow
def test_data_really_sharded(result):
    assert result["devices"] == 4
    sh = result["sharding"]
    # X and y, the plate-indexed arguments
    assert sh["names"] == ["model_args[0]", "model_args[1]"]
    # sharded along the leading (shard) axis, nothing else: one shard per device
    assert all(spec[0] == "shards" and set(spec[1:]) <= {"None"} for spec in sh["specs"])
    assert sh["global_shapes"] == [[4, 1000, 4], [4, 1000]]
    # each of the 4 devices holds exactly one shard of each array, never the whole data
    assert sh["shard_shapes"] == [[[1, 1000, 4]] * 4, [[1, 1000]] * 4]
    assert all(len(set(devs)) == 4 for devs in sh["shard_devices"])
    assert sh["grad_shard_shapes"] == [[1, 1000, 4]] * 4
    assert result["local_rows_match"]


@pytest.mark.slow
def test_communication_is_chain_states_only(result):
    comm = result["comm"]
    # 32 chains of a 4-dim model: under 100 bytes each, versus the resident data
    assert 0 < comm["per_trajectory"] < 32 * 100
    assert comm["per_draw"] == 4 * comm["per_trajectory"]
    assert comm["data_resident"] == 4000 * (4 + 1 + 4) * 4  # X, y and ∇f_i(θ̂), float32


@pytest.mark.slow
def test_arviz_output(result):
    az = result["arviz"]
    assert az["chain"] == 32 and az["draw"] == result["cv_fixed_tau1"]["draws"]
    assert {"diverging", "data_passes", "subsample_size"} <= set(az["stats"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, mean_tol, sd_tol",
    [
        ("cv_fixed_tau1", 0.1, 0.1),
        ("cv_fixed_tau5_unequal", 0.1, 0.1),
        ("cv_adaptive_userq", 0.1, 0.1),
        # SGLD without control variates needs a small step (noise ~ N/n) and mixes slowly:
        # a shorter run (ess 600, SE 0.04 sd) with the NUTS-level tolerance (0.2 sd, 20%).
        ("uniform_adaptive", 0.2, 0.2),
    ],
)
def test_posterior_matches_exact(result, name, mean_tol, sd_tol):
    r = result[name]
    z, ratio = np.asarray(r["z"]), np.asarray(r["r"])
    assert np.all(np.abs(z) < mean_tol), (name, z, r)
    assert np.all(np.abs(ratio - 1) < sd_tol), (name, ratio, r)


@pytest.mark.slow
def test_schedules_realise_the_frequencies(result):
    assert result["cv_fixed_tau1"]["tau"] == [1, 1, 1, 1]
    assert result["cv_fixed_tau5_unequal"]["q"] == [0.25] * 4  # ring, equal trajectories
    r = result["cv_adaptive_userq"]
    assert r["tau"] == [2, 4, 4, 2]  # round(3 · 4 · q_s), q = (0.2, 0.3, 0.3, 0.2) ≠ N_s/N
    np.testing.assert_allclose(r["q"], np.array([2, 4, 4, 2]) / 12)
    r = result["uniform_adaptive"]
    assert r["tau"] == [2, 6, 5, 3]  # round(4 · 4 · N_s/N), N_s = 500, 1500, 1200, 800


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["cv", "uniform"])
def test_estimator_unbiased_over_shards_and_minibatches(result, estimator):
    r = result["unbiased_" + estimator]
    assert np.all(np.abs(r["mixture_t"]) < 4), r["mixture_t"]
    assert np.all(np.abs(r["random_t"]) < 4), r["random_t"]
    assert np.max(np.abs(r["no_inv_q_t"])) > 10  # the check has power against a wrong weight


@pytest.mark.slow
def test_rerun_on_new_data_compiles_nothing_of_ours(result):
    assert result["rerun_compiled"] == []
    assert result["rerun_refit"]


@pytest.mark.slow
def test_the_step_bias_is_probed_where_trajectories_are_one_step(result):
    """With one step per shard the coupled pairs at h and h/2 run with the single-device
    reference of the shard estimator: silent at the default step, warning at h = 0.6 (the
    Euler step's sds (1 − h/2)^(-1/2) − 1 = 20 % too wide); not with trajectories of 5 steps,
    whose shard noise persists over a trajectory (the reason recorded)."""
    r = result["probe"]
    assert r["default"][0] is False and abs(r["default"][1]) < 0.1
    assert r["large"][0] is True and r["large"][2] == "sd" and 0.12 < r["large"][1] < 0.4
    assert r["large_warned"] and "DistributedSGLD: the time step h = 0.6" in r["large_warned"][0]
    assert "trajectories of more than one step" in r["tau5_skipped"]


@pytest.mark.slow
def test_chains_must_fill_the_devices(result):
    assert "multiple of the number of shards" in result["chains_error"]


def test_layout_defaults_and_validation():
    lay = shard_layout(10, 3, trajectory_length=10)
    assert lay.sizes.tolist() == [4, 3, 3] and lay.offsets.tolist() == [0, 4, 7]
    assert lay.trajectory_lengths.tolist() == [12, 9, 9]  # τ̄ S q_s with q_s = N_s / N
    np.testing.assert_allclose(lay.frequencies, [4 / 10, 3 / 10, 3 / 10])
    coarse = shard_layout(10, 3, trajectory_length=1)  # rounding: the realised q_s are used
    assert coarse.trajectory_lengths.tolist() == [1, 1, 1]
    np.testing.assert_allclose(coarse.frequencies, 1 / 3)
    fixed = shard_layout(10, 3, trajectory_length=7, adaptive=False)
    assert fixed.trajectory_lengths.tolist() == [7, 7, 7]
    np.testing.assert_allclose(fixed.frequencies, 1 / 3)
    with pytest.raises(ValueError, match="adaptive_trajectory=True"):
        shard_layout(10, 2, shard_frequencies=[0.7, 0.3], adaptive=False)
    with pytest.raises(ValueError, match="shard_sizes"):
        shard_layout(10, 2, shard_sizes=[3, 3])
    with pytest.raises(ValueError, match="shard_frequencies"):
        shard_layout(10, 2, shard_frequencies=[0.5, 0.6])
    with pytest.raises(ValueError, match="trajectory_length"):
        shard_layout(10, 2, trajectory_length=0)


def _fixed_size_model(X, y=None, num_data=1, subsample_size=10):
    """linreg_model with the plate size given as a number, not read from the data."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", num_data, subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, 1.0), obs=y[idx])


@pytest.mark.parametrize("model, kwargs", [
    (linreg_model, {"subsample_size": 10}),  # plate size read from the data: M on a shard
    (_fixed_size_model, {"num_data": 300}),  # plate size N whatever the rows
])
def test_shard_rows_give_the_full_data_terms(model, kwargs):
    """The ordinary potential on a shard's 80 local rows equals it on the full data at the
    corresponding global rows (the plate's scale restored to N/m by the shard handler)."""
    X, y = linreg_data(N=300, d=3, seed=0)
    data = ModelData.from_args((X, y), kwargs)
    shard = ModelData.from_args((X[100:180], y[100:180]), kwargs)
    pot = build_potential(model, data, jax.random.PRNGKey(0))
    theta = pot.init_theta + 0.3
    for m in (1, 10, 80):  # m = 80: as many indices as the shard has rows
        idx = jnp.arange(m) * (80 // m)
        with _full_plate_scale(name="data", size=300):
            f0, fi = pot.terms(theta, idx, shard)
        g0, gi = pot.terms(theta, idx + 100, data)
        np.testing.assert_allclose(f0, g0, rtol=1e-6)
        np.testing.assert_allclose(fi, gi, rtol=1e-5)
