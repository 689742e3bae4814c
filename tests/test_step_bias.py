"""The default Richardson-Romberg probe of the step's bias (numpyro_subsample.sgmcmc.step_bias).

(a) the dynamics' given-noise steps are BlackJAX's steps; (b) a run biased by a too large step
warns; (c) default runs of the test models stay silent, under the package's and NumPyro's MCMC;
(d) the probe's cost is recorded and bounded.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import (
    linreg_data,
    linreg_exact,
    linreg_model,
    logistic_data,
    logistic_hier_model,
    logistic_model,
    nuts_reference,
    standardised_errors,
)
from numpyro.infer import MCMC as NumPyroMCMC

from numpyro_subsample import (
    MCMC,
    SGHMC,
    SGLD,
    SGNHT,
    AdaptationOptions,
    NoiseOptions,
    RunDiagnosticsWarning,
    StepBiasWarning,
)
from numpyro_subsample.post.checks import RunCheck
from numpyro_subsample.sgmcmc import step_bias
from numpyro_subsample.sgmcmc.dynamics import (
    corrected_dynamics,
    sghmc_dynamics,
    sgld_dynamics,
    sgnht_dynamics,
)

pytestmark = pytest.mark.fast_compile  # short programs: compiling them is most of their cost

D = 5
#: A default run of the benchmarks: 4 chains × (1000 warm-up + 10^4) steps, one gradient
#: estimate per step and chain.
DEFAULT_RUN_ESTIMATES = 4 * (1000 + 10_000)


@pytest.mark.parametrize("make", [
    sgld_dynamics, lambda: sghmc_dynamics(0.7), lambda: sgnht_dynamics(0.5),
    lambda: corrected_dynamics("sgld"), lambda: corrected_dynamics("sghmc", 0.7),
    lambda: corrected_dynamics("sgnht", 0.5),
], ids=["sgld", "sghmc", "sgnht", "sgld-corrected", "sghmc-corrected", "sgnht-corrected"])
def test_step_with_given_noise_is_the_blackjax_step(make):
    """step(key, ...) == step_noise(normal(key), ...): BlackJAX's diffusions draw
    jax.random.normal(key, w.shape) for a flat position."""
    dyn = make()
    k = jax.random.split(jax.random.PRNGKey(3), 4)
    w, p, g = (jax.random.normal(kk, (D,)) for kk in k[:3])
    if dyn.name.startswith("sgld"):
        p = jnp.zeros((0,))
    therm = jnp.asarray(0.8)
    a = jax.random.normal(jax.random.PRNGKey(5), (D, D))
    scale = jnp.linalg.cholesky(0.2 * jnp.eye(D) + 0.01 * a @ a.T)
    xi = jax.random.normal(k[3], (D,))
    for h in (0.01, 0.3):
        got = dyn.step(k[3], w, p, therm, g, h, scale)
        given = dyn.step_noise(xi, w, p, therm, g, h, scale)
        for x, y in zip(got, given, strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def _preprocess(kernel, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pre = kernel.preprocess(args)
    return pre, [w for w in caught if issubclass(w.category, StepBiasWarning)]


def test_a_too_large_sgld_step_warns_with_the_bias_and_the_remedy():
    """SGLD at h = 0.6 on a conjugate linear regression (whitened Gaussian target): the
    stationary variance is (1 − h/2)^(-1) ≥ 1.43 times the posterior's, so the sd is at least
    19 % too large (the drawn sd is checked against the exact one)."""
    X, y = linreg_data(N=2000, d=3)
    _, sd = linreg_exact(X, y)
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(linreg_model, step_size=0.6, progress_bar=False)
    mcmc = NumPyroMCMC(kernel, num_warmup=100, num_samples=4000, progress_bar=False)
    with pytest.warns(StepBiasWarning, match=r"h = 0\.6 biases the posterior sd of beta\[\d\] "
                      r"by about \+0\.\d\d ± 0\.\d\d.*step_size=0\.3"):
        mcmc.run(jax.random.PRNGKey(0), X, y)
    probe = kernel.preprocessed.step_bias
    assert probe.flagged and probe.kind == "sd" and probe.step_size == 0.6
    assert 0.15 < probe.bias < 0.4 and probe.bias > 3.5 * probe.bias_se
    assert kernel.with_step_size(0.3).preprocessed.step_bias is None  # it was of h = 0.6
    drawn_sd = np.asarray(mcmc.get_samples()["beta"]).std(0)
    assert np.all(drawn_sd > 1.1 * sd)  # the run is as wrong as the probe says


def _run_without_bias_warning(kernel, X, y, num_samples: int):
    """Two vectorized chains of the package's MCMC, a StepBiasWarning turned into an error."""
    mcmc = MCMC(kernel, num_warmup=200, num_samples=num_samples, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StepBiasWarning)
        mcmc.run(jax.random.PRNGKey(0), X, y)
    return mcmc


def test_a_biased_step_the_rule_chose_is_reduced_and_the_run_is_right():
    """SGLD with max_variance_inflation 0.6 (h = 0.75 by its rule) on a conjugate linear
    regression: the probe finds the sd about 30 % too large, and the kernel, whose step it
    chose, reduces it to h · 0.1 / bias instead of warning; the drawn sds are then within 10 %
    of the exact ones (they are ≥ 1.2× at h = 0.75, `test_a_too_large_sgld_step_warns...`)."""
    X, y = linreg_data(N=2000, d=3)
    _, sd = linreg_exact(X, y)
    kernel = SGLD(linreg_model, noise=NoiseOptions(max_variance_inflation=0.6),
                  progress_bar=False)
    mcmc = _run_without_bias_warning(kernel, X, y, num_samples=8000)
    probe = kernel.preprocessed.step_bias
    assert probe.step_size > 0.7 and probe.kind == "sd" and not probe.flagged
    assert probe.bias > step_bias.REDUCE_FROM
    assert probe.chosen_step == pytest.approx(probe.step_size * step_bias.BIAS_TARGET
                                              / abs(probe.bias), rel=1e-6)
    assert kernel.step_size == pytest.approx(probe.chosen_step)
    assert mcmc.run_check.attrs()["step_bias_chosen_step"] == pytest.approx(probe.chosen_step)
    drawn_sd = np.asarray(mcmc.get_samples()["beta"]).std(0)
    np.testing.assert_allclose(drawn_sd / sd, 1.0, atol=0.1)


def test_a_step_the_gradient_noise_limits_is_not_reduced():
    """With estimator='uniform' the noise limits SGLD's step to under half the noise-free
    rule's (which would leave a reduced run unmixed): the probe reports but keeps the step."""
    X, y = linreg_data(N=2000, d=3)
    kernel = SGLD(linreg_model, estimator="uniform",
                  noise=NoiseOptions(max_variance_inflation=0.6), progress_bar=False)
    pre = kernel.preprocess((X, y))
    assert pre.step_size < 0.5 * kernel._default_step_size(0.0)
    assert pre.step_bias is not None and pre.step_bias.chosen_step is None
    assert pre.step_bias.pairs == step_bias.PROBE_PAIRS  # no refinement either


def test_refinement_and_reduction_rules():
    """More rounds of pairs only where an estimate of 0.1 or more is beyond 1.5 se; the
    reduction only for an estimate ≥ 0.15 beyond 3 se whatever d, 0.1 or more two se below it
    (and 20 batch means), at most 4-fold."""
    z = np.zeros(3)
    assert not step_bias.suspect(np.array([0.09, 0.0, 0.0]), z + 0.01, z, z + 0.01)
    assert not step_bias.suspect(np.array([0.2, 0.0, 0.0]), z + 0.2, z, z + 0.01)
    assert step_bias.suspect(z, z + 0.01, np.array([0.0, -0.12, 0.0]), z + 0.05)

    def probe(mean_bias, mean_se, ess=50.0, kind="mean"):
        return step_bias.BiasProbe(0.1, np.asarray(mean_bias), np.asarray(mean_se), z, z + 0.01,
                                   0, kind, False, 4, 400, 4800, 1.0, 0.1, np.full(3, ess))

    assert probe([0.14, 0, 0], z + 0.01).bias_limited_step is None  # under 0.15
    assert probe([0.16, 0, 0], z + 0.04).bias_limited_step is None  # 0.16 − 2 se < 0.1
    assert probe([0.3, 0, 0], z + 0.11).bias_limited_step is None  # under 3 se
    assert probe([0.3, 0, 0], z + 0.01, ess=10.0).bias_limited_step is None  # few batches
    assert probe([0.2, -0.25, 0], z + 0.01).bias_limited_step == pytest.approx(0.04)
    assert probe([2.0, 0, 0], z + 0.01).bias_limited_step == pytest.approx(0.025)  # 4-fold cap
    assert probe([2.0, 0, 0], z + 0.01, kind="diverged").bias_limited_step is None
    # 400 coordinates: a group scale's −0.285 ± 0.076 (3.75 se, a 400-group model's τ) cuts
    d = 400
    many = step_bias.BiasProbe(0.1, np.r_[-0.285, np.zeros(d - 1)], np.full(d, 0.076),
                               np.zeros(d), np.full(d, 0.01), 0, "mean", False, 8, 800, 19200,
                               1.0, 0.1, np.full(d, 50.0))
    assert many.bias_limited_step == pytest.approx(0.1 * 0.1 / 0.285)


def test_escalation_rule():
    """Further rounds where an estimate of 0.2 or more beyond 2 se neither reduces the step
    nor is dominated by one that does (a radon-like model's group scale: -0.295 ± 0.109 from 8
    pairs, which does not cut at 2.7 se; 0.22 sd off at that step)."""
    z, e = np.zeros(3), np.full(3, 50.0)
    assert step_bias.undecided(np.array([-0.295, 0, 0]), z + 0.109, z, z + 0.01, e)
    assert not step_bias.undecided(np.array([-0.19, 0, 0]), z + 0.05, z, z + 0.01, e)  # < 0.2
    assert not step_bias.undecided(np.array([0.3, 0, 0]), z + 0.16, z, z + 0.01, e)  # < 2 se
    assert not step_bias.undecided(np.array([0.3, 0, 0]), z + 0.05, z, z + 0.01, e)  # cuts
    # a cut from a larger estimate decides the step; a larger undecided one does not
    assert not step_bias.undecided(np.array([0.5, 0.25, 0]), np.array([0.05, 0.1, 0.01]),
                                   z, z + 0.01, e)
    assert step_bias.undecided(np.array([0.3, 0.5, 0]), np.array([0.05, 0.2, 0.01]),
                               z, z + 0.01, e)
    assert not step_bias.undecided(z, z + 0.01, np.array([np.nan, 0, 0]), z + 0.01, e)
    # the escalated probe stays within 0.8 x a default run's estimates at any step
    assert step_bias.MAX_ESCALATED_ESTIMATES <= 0.82 * DEFAULT_RUN_ESTIMATES


@pytest.mark.slow
def test_a_too_large_step_on_a_scale_model_warns_and_the_run_is_off():
    """SGLD at h = 0.6 on the logistic regression with a HalfNormal prior scale: the run's
    means are ≥ 0.3 posterior sd away from full-data NUTS's (measured: tau 11 sd, beta[1]
    2.3 sd with 4 chains × 11,000 steps), and the probe warns."""
    X, y = logistic_data(N=5000, d=4)
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(logistic_hier_model, step_size=0.6, progress_bar=False)
    mcmc = NumPyroMCMC(kernel, num_warmup=1000, num_samples=10_000, num_chains=2,
                       chain_method="vectorized", progress_bar=False)
    with pytest.warns(StepBiasWarning, match="h = 0.6"):
        mcmc.run(jax.random.PRNGKey(0), X, y)
    assert kernel.preprocessed.step_bias.flagged
    err, _ = standardised_errors(mcmc.get_samples(), nuts_reference("logistic_hier", X, y))
    assert np.max(np.abs(err)) >= 0.3


@pytest.mark.parametrize("cls", [SGLD, SGHMC, SGNHT])
def test_default_runs_of_a_linear_regression_are_silent(cls):
    X, y = linreg_data(N=10_000, d=4)
    kernel = cls(linreg_model, progress_bar=False)
    mcmc = _run_without_bias_warning(kernel, X, y, num_samples=4000)
    probe = kernel.preprocessed.step_bias
    assert probe is not None and not probe.flagged
    assert mcmc.run_check.step_bias is probe
    assert mcmc.run_check.attrs()["step_bias_flagged"] == 0
    assert mcmc.run_check.attrs()["step_bias_resolution"] < step_bias.BIAS_TOLERANCE
    assert "step_bias_skipped" not in mcmc.run_check.attrs()
    assert not any("probe" in m for m in mcmc.run_check.messages)
    assert np.all(np.abs(probe.mean_bias) < 0.1) and np.all(np.abs(probe.sd_bias) < 0.1)


_LOGISTIC_CASES = [(cls, est, model) for cls in (SGLD, SGHMC, SGNHT) for est in ("cv", "uniform")
                   for model in (logistic_model, logistic_hier_model)]
_FAST_CASES = [(SGLD, "cv", logistic_hier_model), (SGHMC, "uniform", logistic_model),
               (SGNHT, "cv", logistic_hier_model)]


@pytest.mark.parametrize("cls,estimator,model", [
    pytest.param(*case, marks=() if case in _FAST_CASES else pytest.mark.slow)
    for case in _LOGISTIC_CASES])
def test_default_preprocessing_of_logistic_models_is_silent(cls, estimator, model):
    X, y = logistic_data(N=5000, d=4)
    pre, caught = _preprocess(cls(model, estimator=estimator, progress_bar=False), X, y)
    assert not caught, caught[0].message
    assert pre.step_bias is not None and not pre.step_bias.flagged


def test_plain_numpyro_mcmc_is_silent_on_a_default_logistic_run():
    X, y = logistic_data(N=5000, d=4)
    kernel = SGHMC(logistic_model, progress_bar=False)
    mcmc = NumPyroMCMC(kernel, num_warmup=200, num_samples=1000, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StepBiasWarning)
        mcmc.run(jax.random.PRNGKey(1), X, y)
    assert kernel.preprocessed.step_bias is not None


def test_probe_cost_is_recorded_and_bounded():
    """At most 0.3 × the gradient estimates of a default run (4 chains × 11,000 steps), for any
    step, 0.45 × with its refinement; recorded in the preprocessing and counted in its data
    passes."""
    for h in (1e-4, 0.01, 0.1, 1.0):
        steps = step_bias.probe_steps(h)
        assert 3 * step_bias.PROBE_PAIRS * steps <= 0.3 * DEFAULT_RUN_ESTIMATES
    X, y = logistic_data(N=5000, d=4)
    off = SGLD(logistic_model, progress_bar=False, bias_probe=False)
    on = SGLD(logistic_model, progress_bar=False)
    pre_off, pre_on = off.preprocess((X, y)), on.preprocess((X, y))
    probe = pre_on.step_bias
    assert pre_off.step_bias is None
    assert probe.gradient_evaluations == 3 * probe.pairs * probe.steps
    assert probe.gradient_evaluations <= 0.45 * DEFAULT_RUN_ESTIMATES
    assert step_bias.MAX_ESTIMATES <= 0.45 * DEFAULT_RUN_ESTIMATES
    assert probe.data_passes == pytest.approx(probe.gradient_evaluations * 100 / 5000)
    assert pre_on.data_passes == pytest.approx(pre_off.data_passes + probe.data_passes)
    assert float(pre_on.params.data_passes) == pytest.approx(pre_on.data_passes, rel=1e-5)
    assert pre_on.step_size == pre_off.step_size  # the probe does not change the run


@pytest.mark.parametrize("second_agrees", [False, True])
def test_one_rounds_alarm_is_confirmed_by_a_second(monkeypatch, second_agrees):
    """A bias flagged by the first round of pairs is flagged only if it stays significant with
    a second round pooled in (estimates patched: 0.5 ± 0.1 from four pairs, then 0.05 ± 0.05 or
    0.5 ± 0.05 from eight); the second round's estimates are counted."""
    X, y = linreg_data(N=2000, d=3)

    def estimates(sums):
        d = sums.shape[-1]
        first = sums.shape[0] == step_bias.PROBE_PAIRS
        b, se = (0.5, 0.1) if first or second_agrees else (0.05, 0.05)
        if not first:
            se = 0.05
        mean = np.full(d, 0.0)
        mean[1] = b
        return mean, np.full(d, se), np.zeros(d), np.full(d, 0.01), np.full(d, 100.0)

    monkeypatch.setattr(step_bias, "batch_estimates", estimates)
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(linreg_model, step_size=0.05, progress_bar=False)
    pre, flagged = _preprocess(kernel, X, y)
    probe = pre.step_bias
    assert probe.pairs == 2 * step_bias.PROBE_PAIRS
    assert probe.gradient_evaluations == 3 * probe.pairs * probe.steps
    assert probe.flagged == second_agrees and bool(flagged) == second_agrees


def test_probe_is_skipped_where_it_cannot_apply_and_the_record_says_why():
    X, y = logistic_data(N=2000, d=3)
    svrg = SGLD(logistic_model, estimator="svrg", progress_bar=False).preprocess((X, y))
    probe = svrg.step_bias  # probed, each pair's chains with their own anchors and clocks
    assert probe is not None and not probe.flagged and svrg.step_bias_skipped == ""
    n = svrg.estimator.subsample_size
    assert probe.data_passes > probe.gradient_evaluations * n / 2000  # the anchors' refreshes
    with pytest.MonkeyPatch.context() as mp:  # a state too large for the pairs
        mp.setattr(step_bias, "MAX_PROBE_STATE_BYTES", 1000)
        saga = SGLD(logistic_model, estimator="saga", progress_bar=False).preprocess((X, y))
    assert saga.step_bias is None and "keeps a state of" in saga.step_bias_skipped
    kernel = SGLD(logistic_model, adaptation=AdaptationOptions(preconditioner=True),
                  progress_bar=False)
    pre = kernel.preprocess((X, y))
    assert pre.step_bias is None and "adapted in the warm-up" in pre.step_bias_skipped
    off = SGLD(logistic_model, bias_probe=False, progress_bar=False).preprocess((X, y))
    assert off.step_bias_skipped == "bias_probe=False"
    adapted_off = SGLD(logistic_model, adaptation=AdaptationOptions(preconditioner=True),
                       bias_probe=False, progress_bar=False)
    assert adapted_off.preprocess((X, y)).step_bias_skipped == "bias_probe=False"
    for k in (kernel, adapted_off):  # the adapted preconditioner: probed after the run
        mcmc = MCMC(k, num_warmup=500, num_samples=500, num_chains=2,
                    chain_method="vectorized", progress_bar=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RunDiagnosticsWarning)  # a short run: few ESS
            warnings.simplefilter("error", StepBiasWarning)
            mcmc.run(jax.random.PRNGKey(0), X, y)
        attrs = mcmc.run_check.attrs()
        assert not any("probe" in m or "bias" in m for m in mcmc.run_check.messages)
    assert attrs["step_bias_skipped"] == "bias_probe=False"  # off: not after the run either
    assert "step_bias_flagged" not in attrs and not adapted_off.probes_after_run


def test_resolution_of_the_probe():
    """The smallest bias the probe would flag: FLAG_BIAS where its standard errors are small,
    significance × the largest standard error otherwise, infinite after a divergence."""
    d = 5
    z = step_bias.significance(d)

    def probe(se, kind="mean"):
        arr = np.full(d, se)
        return step_bias.BiasProbe(0.1, np.zeros(d), arr, np.zeros(d), arr / 2, 0, kind,
                                   False, 4, 200, 2400, 1.0, 0.1)
    assert probe(0.001).resolution == step_bias.FLAG_BIAS
    assert probe(0.2).resolution == pytest.approx(z * 0.2)
    assert probe(0.2).resolution > step_bias.BIAS_TOLERANCE
    assert probe(np.nan, "diverged").resolution == np.inf
    assert probe(0.001).inconclusive == "" and "resolves only" in probe(0.2).inconclusive
    check = RunCheck(min_ess_bulk=500.0, min_ess_tail=500.0, max_rhat=1.0, worst_sites=(),
                     divergences=0, num_draws=1000, num_chains=2, ess_threshold=200.0,
                     max_mcse_sd=0.05, messages=(), step_bias=probe(0.2))
    assert "resolves only" in check.attrs()["step_bias_inconclusive"]
    check = check._replace(step_bias=probe(0.001))
    assert "step_bias_inconclusive" not in check.attrs()


def test_bias_probe_option_is_validated():
    with pytest.raises(TypeError, match="bias_probe"):
        SGLD(logistic_model, bias_probe="yes")


# --- the probe after the run: the adapted preconditioner and structured proxies -------------


def _run_adapted(kernel, X, y, num_samples=4000):
    mcmc = MCMC(kernel, num_warmup=500, num_samples=num_samples, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), X, y)
    return mcmc, [w for w in caught if issubclass(w.category, StepBiasWarning)]


def test_a_too_large_step_with_the_adapted_preconditioner_warns_after_the_run():
    """SGLD at h = 1 with the preconditioner adapted in the warm-up (the default of
    high-dimensional runs, whose preprocessing cannot probe the step) on a conjugate linear
    regression: the drawn sds are ≥ 15 % too large (measured 23-25 %), and the pairs run after
    the run, from its last draws with its final preconditioner, find it and warn."""
    X, y = linreg_data(N=2000, d=3)
    _, sd = linreg_exact(X, y)
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(linreg_model, step_size=1.0, progress_bar=False,
                      adaptation=AdaptationOptions(preconditioner=True))
    mcmc, caught = _run_adapted(kernel, X, y)
    assert kernel.preprocessed.step_bias is None  # not in the preprocessing
    assert caught and "h = 1 biases the posterior sd of beta" in str(caught[0].message)
    assert "from the run's last draws" in str(caught[0].message)
    assert "step_size=0.5" in str(caught[0].message)
    probe = mcmc.run_check.step_bias
    assert probe.after_run and probe.flagged and probe.kind == "sd" and probe.step_size == 1.0
    assert any("probe found" in m for m in mcmc.run_check.messages)
    drawn_sd = np.asarray(mcmc.get_samples()["beta"]).std(0)
    assert np.all(drawn_sd > 1.15 * sd)  # the run is as wrong as the probe says
    np.testing.assert_allclose(probe.sd_bias, drawn_sd / sd - 1, atol=0.08)
    assert kernel.probe_after_run(mcmc.last_state, None) is probe  # made once per run


def test_a_default_run_with_the_adapted_preconditioner_is_probed_after_it_and_silent():
    X, y = linreg_data(N=2000, d=3)
    kernel = SGLD(linreg_model, progress_bar=False,
                  adaptation=AdaptationOptions(preconditioner=True))
    mcmc, caught = _run_adapted(kernel, X, y)
    assert not caught, caught[0].message
    probe = mcmc.run_check.step_bias
    assert probe is not None and probe.after_run and not probe.flagged
    assert probe.step_size == kernel.step_size
    attrs = mcmc.run_check.attrs()
    assert attrs["step_bias_after_run"] == 1 and attrs["step_bias_flagged"] == 0
    assert "step_bias_skipped" not in attrs
    assert attrs["step_bias_resolution"] < step_bias.BIAS_TOLERANCE
    assert probe.gradient_evaluations == 3 * probe.pairs * probe.steps
    assert probe.gradient_evaluations <= 0.3 * DEFAULT_RUN_ESTIMATES


@pytest.mark.parametrize("cls,kwargs", [
    (SGLD, {"proxy": "low-rank", "proxy_kwargs": {"rank": 1}}),  # adapted by default
    (SGHMC, {"proxy": "diagonal", "adaptation": AdaptationOptions(preconditioner=False)}),
], ids=["sgld-low-rank-adapted", "sghmc-diagonal"])
def test_default_runs_with_a_structured_proxy_are_probed_after_them_and_silent(cls, kwargs):
    from numpyro_subsample.proxies.whitening import is_structured

    X, y = linreg_data(N=2000, d=3)
    kernel = cls(linreg_model, progress_bar=False, **kwargs)
    mcmc, caught = _run_adapted(kernel, X, y)
    assert is_structured(kernel.preprocessed.scale_tril)
    assert kernel.preprocessed.step_bias is None
    assert not caught, caught[0].message
    probe = mcmc.run_check.step_bias
    assert probe is not None and probe.after_run and not probe.flagged
    assert np.all(np.abs(probe.mean_bias) < 0.1) and np.all(np.abs(probe.sd_bias) < 0.1)


def test_plain_numpyro_run_with_the_adapted_preconditioner_is_probed_by_to_arviz():
    """Under plain `numpyro.infer.MCMC` nothing checks the run until `to_arviz`, which runs
    the checks: the pairs after the run then warn on the too large step and its attributes
    record them."""
    from numpyro_subsample import to_arviz

    X, y = linreg_data(N=2000, d=3)
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(linreg_model, step_size=1.0, progress_bar=False,
                      adaptation=AdaptationOptions(preconditioner=True))
    mcmc = NumPyroMCMC(kernel, num_warmup=500, num_samples=4000, num_chains=2,
                       chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StepBiasWarning)  # nothing during the run itself
        mcmc.run(jax.random.PRNGKey(0), X, y)
    with pytest.warns(StepBiasWarning, match="from the run's last draws"):
        idata = to_arviz(mcmc)
    attrs = idata.sample_stats.attrs
    assert attrs["step_bias_after_run"] == 1 and attrs["step_bias_flagged"] == 1


def test_a_too_large_saga_step_warns_and_the_run_is_off():
    """SAGA (a table of past gradients per chain, Dubey et al. 2016): the pairs carry one table
    per chain, both chains of a pair starting from a new chain's. At h = 0.6 on the conjugate
    linear regression (stationary sd at least 19 % too large) the probe warns, as with the
    stateless estimators, and the run's sds are as wrong as it says."""
    X, y = linreg_data(N=2000, d=3)
    _, sd = linreg_exact(X, y)
    with pytest.warns(DeprecationWarning):
        kernel = SGLD(linreg_model, estimator="saga", step_size=0.6, progress_bar=False)
    mcmc = NumPyroMCMC(kernel, num_warmup=100, num_samples=4000, progress_bar=False)
    with pytest.warns(StepBiasWarning, match=r"h = 0\.6 biases the posterior sd of beta"):
        mcmc.run(jax.random.PRNGKey(0), X, y)
    probe = kernel.preprocessed.step_bias
    assert probe.flagged and probe.kind == "sd" and 0.15 < probe.bias < 0.4
    drawn_sd = np.asarray(mcmc.get_samples()["beta"]).std(0)
    assert np.all(drawn_sd > 1.1 * sd)
    silent = SGLD(linreg_model, estimator="saga", progress_bar=False).preprocess((X, y))
    assert silent.step_bias is not None and not silent.step_bias.flagged


def _effect_model(y, n=500):
    """A per-row random effect: y_i ~ N(mu + z_i, 1), z_i ~ N(0, 0.5^2)."""
    import numpyro
    import numpyro.distributions as dist

    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
        z = numpyro.sample("z", dist.Normal(0.0, 0.5))
        numpyro.sample("y", dist.Normal(mu + z, 1.0), obs=y[idx])


@pytest.mark.parametrize("step_size", [None, 0.001], ids=["default", "too-large"])
def test_drawn_local_sites_are_probed_after_the_run(step_size):
    """Local latent sites drawn by their inner update (``LocalConfig(nodes=0)``): the pairs
    run after the run, each chain with the local sites' table of the chain whose draws start
    it, drawn with the pair's shared keys. At the default step the probe runs and is silent;
    at h = 0.001 in mu's unconstrained coordinate (posterior sd 0.035: h / sd^2 = 0.8) the
    drawn sd of mu is over 25 % too large (measured 41 %) and the probe warns, its estimate
    within 0.15 of the drawn excess."""
    from numpyro_subsample import LocalConfig

    rng = np.random.default_rng(11)
    y = (1.3 + 0.5 * rng.normal(size=1000) + rng.normal(size=1000)).astype(np.float32)
    sd = (1.0 / 100.0 + y.size / 1.25) ** -0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # SGLD's step_size convention
        kernel = SGLD(_effect_model, local=LocalConfig(nodes=0), progress_bar=False,
                      **({} if step_size is None else {"step_size": step_size}))
    mcmc = MCMC(kernel, num_warmup=1000, num_samples=3000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(2), y)
    biased = [w for w in caught if issubclass(w.category, StepBiasWarning)]
    probe = mcmc.run_check.step_bias
    assert probe is not None and probe.after_run
    assert kernel.preprocessed.step_bias_skipped == step_bias.LOCAL_SKIP
    assert "step_bias_skipped" not in mcmc.run_check.attrs()
    excess = float(np.asarray(mcmc.get_samples()["mu"]).std() / sd - 1)
    if step_size is None:
        assert not biased and not probe.flagged and abs(excess) < 0.1
        assert probe.gradient_evaluations <= 0.3 * DEFAULT_RUN_ESTIMATES
    else:
        assert biased and probe.flagged and probe.kind == "sd"
        assert "h = 0.001 biases the posterior sd of mu" in str(biased[0].message)
        assert excess > 0.25 and abs(probe.bias - excess) < 0.15
