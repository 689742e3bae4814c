"""SAGA and SVRG (Dubey et al. 2016): unbiased given their state, state bookkeeping (SAGA's
table with repeated indices, SVRG's refresh clock and data passes), accuracy of SGLD, SGHMC and
SGNHT with them against the exact conjugate posterior, the memory guard and the options."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import linreg_data, linreg_exact, linreg_model
from numpyro.infer import MCMC

import numpyro_subsample.estimators.variance_reduced as vr
import numpyro_subsample.sgmcmc.preprocess as sg_kernel
from numpyro_subsample import SGHMC, SGLD, SGNHT, NoiseOptions, ZVOptions, zv_mean
from numpyro_subsample.core.datapass import datum_values_and_grads, value_grad_hessian
from numpyro_subsample.core.potential import ModelData, build_potential
from numpyro_subsample.estimators.registry import configure_estimator
from numpyro_subsample.estimators.selection import uniform_design
from numpyro_subsample.estimators.variance_reduced import SAGAState, SVRGState
from numpyro_subsample.proxies.laplace import fit_laplace

N_SMALL, N_SMALL_SUB = 300, 20


@pytest.fixture(scope="module")
def small():
    """Linear regression, N = 300, d = 3, n = 20: potential, data, Laplace proxy."""
    X, y = linreg_data(N_SMALL, 3, seed=3)
    data = ModelData.from_args((X, y), {"subsample_size": N_SMALL_SUB})
    pot = build_potential(linreg_model, data, jax.random.PRNGKey(0))
    return X, y, pot, data, fit_laplace(pot, data, jax.random.PRNGKey(1), check_chain=False)


def _full_grad(pot, theta, data):
    return value_grad_hessian(pot, theta, data, hessian=False)[1]


def _data_sum(pot, theta, data):
    """Σ_i ∇f_i(θ) (the full gradient without the prior's)."""
    return _full_grad(pot, theta, data) - jax.grad(lambda t: pot.prior(t, data))(theta)


# --- (a) unbiased given any state ---------------------------------------------------------------


@pytest.mark.parametrize("replace", [True, False])
@pytest.mark.parametrize("name", ["saga", "svrg"])
def test_unbiased_for_any_table_or_anchor(small, name, replace):
    """The mean of K estimates from a table / anchor far from θ̂, at a θ far from both, equals
    ∇f(θ) within 4 Monte Carlo standard errors per coordinate; the same estimates with the
    stored sum shifted by 8 standard errors fail the test (it has power)."""
    _, _, pot, data, proxy = small
    est = configure_estimator(name, pot, data, proxy, replace=replace)
    sd = jnp.sqrt(jnp.diag(proxy.cov))
    theta = proxy.centre + 3.0 * sd * jnp.array([1.0, -1.0, 0.5])
    other = proxy.centre - 2.0 * sd * jnp.array([0.5, 1.0, -1.0])
    if name == "saga":
        grads = datum_values_and_grads(pot, other, data)[1]
        noise = jax.random.normal(jax.random.PRNGKey(5), grads.shape)
        table = grads + noise * jnp.abs(grads).mean(0)
        state = SAGAState(table=table, total=table.sum(0))
    else:
        state = SVRGState(anchor=other, anchor_sum=_data_sum(pot, other, data),
                          age=jnp.zeros((), jnp.int32))
    K = 20_000
    keys = jax.random.split(jax.random.PRNGKey(7), K)
    gs = jax.jit(jax.vmap(lambda k: est.update(est.params, state, k, theta, data)[0]))(keys)
    gs = np.asarray(gs, np.float64)
    exact = np.asarray(_full_grad(pot, theta, data), np.float64)
    se = gs.std(0, ddof=1) / np.sqrt(K)
    z = (gs.mean(0) - exact) / se
    assert np.all(np.abs(z) < 4), z
    assert np.all(se > 0)
    z_biased = (gs.mean(0) + 8 * se - exact) / se
    assert np.all(np.abs(z_biased) > 4), z_biased


def test_svrg_refresh_sets_the_anchor_and_gives_the_full_gradient(small):
    """At the m-th update the anchor becomes θ with Σ_i ∇f_i(θ) (one data pass), so the
    estimate is the full gradient; before it the anchor is kept and no pass is spent."""
    _, _, pot, data, proxy = small
    est = configure_estimator("svrg", pot, data, proxy, update_every=5)
    m = int(est.params[2])
    assert m == 5 and est.info["update_every"] == 5
    theta = proxy.centre + 2.0 * jnp.sqrt(jnp.diag(proxy.cov))
    state, passes0 = est.init_state(est.params, data)
    assert float(passes0) == 0.0
    np.testing.assert_array_equal(state.anchor, proxy.centre)
    update = jax.jit(est.update)
    key = jax.random.PRNGKey(0)
    _, _, kept, p = update(est.params, state._replace(age=jnp.asarray(m - 2, jnp.int32)), key,
                           theta, data)
    assert float(p) == 0.0 and int(kept.age) == m - 1
    np.testing.assert_array_equal(kept.anchor, proxy.centre)
    g, n, new, p = update(est.params, kept, key, theta, data)
    assert float(p) == 1.0 and int(new.age) == 0 and int(n) == N_SMALL_SUB
    np.testing.assert_array_equal(new.anchor, theta)
    exact = np.asarray(_full_grad(pot, theta, data))
    scale = np.abs(np.asarray(datum_values_and_grads(pot, theta, data)[1])).sum(0)
    np.testing.assert_allclose(new.anchor_sum, _data_sum(pot, theta, data), atol=1e-5 * scale.max())
    np.testing.assert_allclose(g, exact, atol=1e-5 * scale.max())


# --- (b) state bookkeeping ----------------------------------------------------------------------


def test_saga_table_and_sum_stay_consistent_with_repeated_indices(small):
    """40 updates at random θ with replacement (n = 20 of N = 300: repeats are common): every
    drawn row holds ∇f_i(θ) of the last update that drew it, the others ∇f_i(θ̂), and the
    running sum equals the table's sum."""
    _, _, pot, data, proxy = small
    stored = configure_estimator("saga", pot, data, proxy)
    state, passes = jax.jit(stored.init_state)(stored.params, data)
    assert float(passes) == 0.0  # the proxy's ∇f_i(θ̂) table is copied
    np.testing.assert_array_equal(state.table, proxy.datum_grads)
    est = configure_estimator("saga", pot, data, proxy._replace(datum_grads=None))
    draw = uniform_design(N_SMALL, N_SMALL_SUB, True).draw
    state, passes = jax.jit(est.init_state)(est.params, data)
    assert float(passes) == 1.0  # no table kept by the proxy: one data pass
    expected = np.asarray(proxy.datum_grads, np.float64)
    np.testing.assert_allclose(state.table, expected, rtol=1e-5, atol=1e-5)
    update = jax.jit(est.update)
    sd = jnp.sqrt(jnp.diag(proxy.cov))
    repeats = 0
    for t in range(40):
        key = jax.random.PRNGKey(100 + t)
        theta = proxy.centre + 2.0 * sd * jax.random.normal(jax.random.PRNGKey(t), (3,))
        _, _, state, p = update(est.params, state, key, theta, data)
        assert float(p) == 0.0
        idx = np.asarray(draw(est.params[0], key)[0])
        repeats += len(idx) - len(np.unique(idx))
        expected[idx] = np.asarray(datum_values_and_grads(pot, theta, data)[1])[idx]
    assert repeats > 5, repeats
    scale = np.abs(expected).max()
    np.testing.assert_allclose(state.table, expected, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(state.total, np.asarray(state.table, np.float64).sum(0),
                               rtol=0, atol=1e-5 * np.abs(expected).sum(0).max())


def test_svrg_refreshes_every_m_steps_with_one_data_pass_each(small):
    """update_every=7: the chain's data_passes grow by n/N per step plus 1 at steps 7, 14, ...
    exactly, where the anchor becomes the chain's state; two vectorized chains own their
    anchors and share the clock."""
    X, y, _, _, proxy = small
    kernel = SGLD(linreg_model, estimator="svrg", update_every=7, proxy=proxy)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=30, num_chains=2, chain_method="vectorized",
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=N_SMALL_SUB,
             extra_fields=("data_passes",))
    passes = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["data_passes"], np.float64)
    # sample k is the state after step k + 1; step 1 evaluates the first estimate, unmoved
    steps = np.arange(1, 31)
    per_step = N_SMALL_SUB / N_SMALL + (steps % 7 == 0)
    first = kernel.preprocessed.data_passes + N_SMALL_SUB / N_SMALL
    for c in range(2):
        np.testing.assert_allclose(passes[c, 0], first, rtol=1e-5)
        # float32 sums: the increments are exact to a few ulps of the running total
        ulps = 4 * np.finfo(np.float32).eps * passes[c].max()
        np.testing.assert_allclose(np.diff(passes[c]), per_step[1:], rtol=1e-4, atol=ulps)
    last = mcmc.last_state.est_state
    assert last.age.shape == () and int(last.age) == 30 % 7
    beta = np.asarray(mcmc.get_samples(group_by_chain=True)["beta"])
    np.testing.assert_allclose(last.anchor, beta[:, 27], rtol=1e-6)  # the state at step 28
    assert not np.allclose(last.anchor[0], last.anchor[1])


# --- (c) accuracy against the exact conjugate posterior ----------------------------------------


@pytest.fixture(scope="module")
def linreg():
    X, y = linreg_data(N=10_000, d=4, seed=0)
    data = ModelData.from_args((X, y), {})
    pot = build_potential(linreg_model, data, jax.random.PRNGKey(0))
    proxy = fit_laplace(pot, data, jax.random.PRNGKey(1), check_chain=False)
    return X, y, linreg_exact(X, y), proxy


@pytest.mark.parametrize("estimator", ["saga", "svrg"])
@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC, SGNHT])
def test_matches_exact_conjugate_posterior(linreg, kernel_cls, estimator):
    """Default step (noise correction off), 8 chains × 2500 draws at N = 10^4, n = 100: means
    within 0.15 posterior sd and sds within 10% of the exact posterior. The effective sample
    size is ~10^3 (integrated autocorrelation ~2/h steps), so the mean error has sd ~0.03 sd
    and the sd ratio ~2%, on top of the rule's ≤ 2.5% sd inflation (δ = 0.05 in variance).
    SGLD-SAGA also streams the ZV statistics (Baker et al. 2019, Sect. 4): on a Gaussian
    posterior its mean is within 0.03 sd."""
    X, y, (mean, sd), proxy = linreg
    zv = kernel_cls is SGLD and estimator == "saga"
    kernel = kernel_cls(linreg_model, estimator=estimator, proxy=proxy,
                        zv=ZVOptions() if zv else None)
    assert kernel.noise_correction is False
    mcmc = MCMC(kernel, num_warmup=200, num_samples=2500, num_chains=8,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    beta = np.asarray(mcmc.get_samples()["beta"], np.float64)
    err, ratio = (beta.mean(0) - mean) / sd, beta.std(0) / sd
    assert np.all(np.abs(err) < 0.15), err
    assert np.all(np.abs(ratio - 1) < 0.1), ratio
    assert not np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))
    state = mcmc.last_state.est_state
    if estimator == "saga":  # every chain owns its table; the sums still match
        assert state.table.shape == (8, 10_000, 4)
        np.testing.assert_allclose(state.total, np.asarray(state.table, np.float64).sum(1),
                                   rtol=1e-4, atol=1e-2)
    if zv:
        assert np.all(np.asarray(mcmc.last_state.zv_stats.count) == 2500)
        zv_err = (np.asarray(zv_mean(mcmc)["beta"]) - mean) / sd
        assert np.all(np.abs(zv_err) < 0.03), zv_err


# --- (d) the memory guard and the options -------------------------------------------------------


def test_saga_memory_guard_counts_the_chains_and_comes_before_the_fit(small, monkeypatch):
    """A limit between one and four tables: one chain runs, four vectorized chains are refused
    at init, before any proxy fit, with a message naming the sizes, the bytes, the limit and
    the alternatives."""
    X, y, _, _, _ = small
    table = N_SMALL * 3 * 4  # float32
    monkeypatch.setattr(vr, "SAGA_MAX_TABLE_BYTES", 2 * table)

    def fail(*args, **kwargs):
        raise AssertionError("the proxy was fitted before the memory check")

    monkeypatch.setattr(sg_kernel, "fit_laplace", fail)
    kernel = SGLD(linreg_model, estimator="saga")
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    with pytest.raises(ValueError) as info:
        kernel.init(keys, 0, None, (X, y), {"subsample_size": N_SMALL_SUB})
    msg = str(info.value)
    for part in ("estimator='saga'", f"N={N_SMALL}", "d=3", "4 chain(s)", f"{4 * table:,} bytes",
                 f"{2 * table:,} bytes", "SAGA_MAX_TABLE_BYTES", "'svrg'", "'cv'"):
        assert part in msg, (part, msg)
    # a single chain fits under the limit (with a proxy given, nothing is fitted)
    monkeypatch.undo()
    monkeypatch.setattr(vr, "SAGA_MAX_TABLE_BYTES", 2 * table)
    proxy = small[4]
    ok = SGLD(linreg_model, estimator="saga", proxy=proxy)
    state = ok.init(jax.random.PRNGKey(0), 0, None, (X, y), {"subsample_size": N_SMALL_SUB})
    assert state.est_state.table.shape == (N_SMALL, 3)
    monkeypatch.setattr(vr, "SAGA_MAX_TABLE_BYTES", table - 1)
    with pytest.raises(ValueError, match="SAGA_MAX_TABLE_BYTES"):
        SGLD(linreg_model, estimator="saga", proxy=proxy).preprocess(
            (X, y), {"subsample_size": N_SMALL_SUB})


@pytest.mark.parametrize("name", ["saga", "svrg"])
def test_noise_correction_is_off_and_refused(name):
    assert SGLD(linreg_model, estimator=name).noise_correction is False
    assert SGNHT(linreg_model, estimator=name,
                 noise=NoiseOptions(correction=False)).noise_correction is False
    assert SGLD(linreg_model, estimator="cv").noise_correction is True
    with pytest.raises(ValueError, match=rf"NoiseOptions\(correction=True\) .*estimator='{name}'"):
        SGHMC(linreg_model, estimator=name, noise=NoiseOptions(correction=True))


@pytest.mark.parametrize("name, options, match", [
    ("svrg", {"update_every": 0}, "update_every"),
    ("svrg", {"update_every": 2.5}, "update_every"),
    ("saga", {"update_every": 3}, "update_every"),
    ("saga", {"adaptive": True}, "adaptive=True"),
])
def test_bad_options_raise_at_construction(name, options, match):
    with pytest.raises(ValueError, match=match):
        SGLD(linreg_model, estimator=name, **options)


# --- (e) reproducibility ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["saga", "svrg"])
def test_same_key_same_draws(small, name):
    X, y, _, _, proxy = small

    def draws(seed):
        kernel = SGHMC(linreg_model, estimator=name, proxy=proxy, update_every=5) \
            if name == "svrg" else SGHMC(linreg_model, estimator=name, proxy=proxy)
        mcmc = MCMC(kernel, num_warmup=10, num_samples=40, num_chains=2,
                    chain_method="vectorized", progress_bar=False)
        mcmc.run(jax.random.PRNGKey(seed), X, y, subsample_size=N_SMALL_SUB)
        return np.asarray(mcmc.get_samples()["beta"])

    a, b, c = draws(0), draws(0), draws(1)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
