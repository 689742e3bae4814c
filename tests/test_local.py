"""Local latent variables (continuous sites inside the subsample plate) against known answers.

Random intercepts: y_ij ~ N(z_i, 1), j = 1..m, z_i ~ N(μ, τ²) with τ known, μ ~ N(0, 10²). The
marginal of a group is ȳ_i ~ N(μ, τ² + 1/m), so the posterior of μ is Gaussian in closed form,
and the conditional of z_i is N((μ/τ² + Σ_j y_ij) / (1/τ² + m), 1 / (1/τ² + m)) (the exact
local update). LDA with two topics (SGRLD, the topics global, the documents' proportions
local) against NUTS on the full data.
"""

import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS

from numpyro_subsample import (
    SGHMC,
    SGLD,
    SGNHT,
    SGRLD,
    AdaptationOptions,
    EnergyConservingHMC,
    LocalConfig,
    NoiseOptions,
    to_arviz,
    zv_mean,
    zv_summary,
)
from numpyro_subsample.core.data import ModelData
from numpyro_subsample.estimators.local import local_estimator
from numpyro_subsample.estimators.selection import uniform_design

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from lda import lda_local_gibbs, lda_model, synthetic_corpus, to_tokens  # noqa: E402

TAU, M, N = 0.7, 4, 2000


def intercepts_model(Y, n=50):
    num, m = Y.shape
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("group", num, subsample_size=n) as idx:
        z = numpyro.sample("z", dist.Normal(mu, TAU))
        loc = jnp.broadcast_to(z[:, None], (z.shape[0], m))
        numpyro.sample("y", dist.Normal(loc, 1.0).to_event(1), obs=Y[idx])


def exact_intercepts(rng_key, rows, values, idx, Y, n=50):
    """z_i | μ, y_i for the groups ``idx``."""
    del rows, n
    prec = 1.0 / TAU**2 + Y.shape[1]
    mean = (values["mu"] / TAU**2 + Y[idx].sum(1)) / prec
    return {"z": mean + jax.random.normal(rng_key, mean.shape, mean.dtype) / jnp.sqrt(prec)}


@pytest.fixture(scope="module")
def intercepts():
    rng = np.random.default_rng(0)
    z = 1.5 + TAU * rng.normal(size=N)
    Y = (z[:, None] + rng.normal(size=(N, M))).astype(np.float32)
    v = TAU**2 + 1.0 / M
    prec = 1.0 / 100.0 + N / v
    return Y, (Y.mean(1).sum() / v) / prec, prec**-0.5


def marginal_grad(Y, mu):
    """d/dμ of −log p(μ | y) (the prior and the marginal likelihood of every group)."""
    v = TAU**2 + 1.0 / M
    return mu / 100.0 - np.sum(Y.mean(1) - mu) / v


@pytest.mark.parametrize("kernel, update", [(SGLD, None), (SGHMC, exact_intercepts),
                                            (SGNHT, None)],
                         ids=["sgld-mala", "sghmc-exact", "sgnht-mala"])
def test_random_intercepts_posterior(intercepts, kernel, update):
    """μ within 0.2 posterior sd in mean and 0.2 in log-sd; h is small enough that the
    discretisation and subsample inflate the sd by under 0.12 in log (0.03-0.11 over four keys),
    and 8 chains give 400-550 effective draws, a Monte Carlo error of about 0.05 sd (one chain
    gives about 50, and an error spread of 0.17 sd over keys)."""
    Y, mean, sd = intercepts
    # unpreconditioned: h ≈ 0.005 / posterior precision for SGLD; SGHMC / SGNHT with the
    # friction (diffusion) of the posterior's scale (α ≈ 4 sqrt(precision)) and h α ≈ 0.1
    opts = {"step_size": 2e-6} if kernel is SGLD else {"step_size": 5e-4, "friction": 200.0}
    with warnings.catch_warnings():  # SGLD's note on its step_size convention
        warnings.simplefilter("ignore", DeprecationWarning)
        k = kernel(model=intercepts_model, estimator="uniform",
                   local=LocalConfig(update=update, nodes=0), **opts)
    mcmc = MCMC(k, num_warmup=2000, num_samples=20000, num_chains=8,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(1), Y)
    assert not [w for w in seen if "numpyro_subsample" in w.filename], seen  # a sound run
    s = np.asarray(mcmc.get_samples()["mu"])
    assert "z" not in mcmc.get_samples()
    assert abs(s.mean() - mean) / sd < 0.2
    assert abs(np.log(s.std() / sd)) < 0.2
    state = mcmc.last_state.est_state
    assert int(state.visits.min()) > 0  # every group's intercept was drawn
    if update is None:  # MALA steps adapted towards 0.574
        assert np.all((np.asarray(state.accept) > 0.3) & (np.asarray(state.accept) < 0.9))


def test_local_estimator_unbiased(intercepts):
    """With exact conditional draws of the local sites, the mean of the estimate is the
    marginal gradient (Fisher's identity): within 4 standard errors over 4000 estimates."""
    Y, _, _ = intercepts
    kernel = SGHMC(intercepts_model, estimator="uniform", step_size=1e-6,
                   local=LocalConfig(update=exact_intercepts))
    data = ModelData.from_args((Y,), {})
    pot = kernel.potential_for(data)
    est = local_estimator(pot, uniform_design(N, 50, True, jnp.float32),
                          LocalConfig(update=exact_intercepts))
    theta = jnp.asarray([1.3], jnp.float32)
    state, _ = est.init_state(est.params, data)

    @jax.jit
    def one(key):
        return est.update(est.params, state, key, theta, data)[0][0]

    g = np.asarray(jax.lax.map(one, jax.random.split(jax.random.PRNGKey(0), 4000)),
                   np.float64)
    se = g.std() / np.sqrt(g.size)
    assert abs(g.mean() - marginal_grad(Y, 1.3)) < 4 * se
    # and the estimate is not trivially exact: its spread is that of a subsample
    assert se > 1e-3 * abs(marginal_grad(Y, 1.3))


@pytest.fixture(scope="module")
def small_lda():
    K, V, D, a, e = 2, 6, 60, 0.5, 0.5
    counts, _ = synthetic_corpus(D, V, K, 30, seed=1, alpha=a, eta=e)

    def full(counts):
        with numpyro.plate("topic", K):
            beta = numpyro.sample("topics", dist.Dirichlet(jnp.full((V,), e)))
        with numpyro.plate("doc", D):
            theta = numpyro.sample("theta", dist.Dirichlet(jnp.full((K,), a)))
            numpyro.sample("words", dist.Multinomial(counts.sum(-1), theta @ beta), obs=counts)

    mcmc = MCMC(NUTS(full), num_warmup=300, num_samples=1500, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), counts)
    return counts, (K, a, e), np.asarray(mcmc.get_samples()["topics"])


# MALA local updates are checked on the random intercepts above; here the Gibbs conditional
@pytest.mark.slow
@pytest.mark.parametrize("update, steps", [(lda_local_gibbs, 1)], ids=["gibbs"])
def test_sgrld_lda_against_nuts(small_lda, update, steps):
    """Topics of a two-topic LDA (documents' proportions local) against full-data NUTS, after
    matching the labels. Each coordinate's mean within 0.1 sd (bias allowance of the constant
    step) plus 3 Monte Carlo standard errors of the difference (from both runs' ESS, ~100
    and ~500 here, so about 0.45 sd in all); sds within 0.25 in log (the constant step
    inflates them by ~10 %, the sd's Monte Carlo error is ~0.06)."""
    counts, (K, a, e), ref = small_lda
    kernel = SGRLD(lda_model, step_size=3e-4, schedule="constant",
                   local=LocalConfig(update=update, steps=steps))
    mcmc = MCMC(kernel, num_warmup=1500, num_samples=15000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), counts, to_tokens(counts), K, 20, a, e)
    s = np.asarray(mcmc.get_samples()["topics"])
    assert np.allclose(s.sum(-1), 1.0, atol=1e-5) and (s > 0).all()
    rm, rs = ref.mean(0), ref.std(0)
    if np.abs(s.mean(0)[::-1] - rm).sum() < np.abs(s.mean(0) - rm).sum():
        s = s[:, ::-1]
    ess = effective_sample_size(s.reshape(1, s.shape[0], -1)).reshape(rm.shape)
    ess_ref = effective_sample_size(ref.reshape(1, ref.shape[0], -1)).reshape(rm.shape)
    se = np.sqrt(1.0 / ess + 1.0 / ess_ref)
    assert ess.min() > 50
    assert (np.abs((s.mean(0) - rm) / rs) < 0.1 + 3 * se).all()
    assert np.abs(np.log(s.std(0) / rs)).max() < 0.25


def test_local_control_variate_unbiased(intercepts):
    """The control-variate estimator with local sites (table of ḡ_i(θ̂) at θ̂ = 1.0, exact
    conditional draws): at θ = 1.3 its mean is the marginal gradient within 4 standard errors
    over 4000 estimates, and its variance is a fraction of the uniform estimator's (the spread
    of ḡ_i over the groups is removed; the draws' own noise and the residuals stay)."""
    from numpyro_subsample.estimators.local_start import local_control_variate

    Y, _, _ = intercepts
    kernel = SGHMC(intercepts_model, estimator="uniform", step_size=1e-6,
                   local=LocalConfig(update=exact_intercepts))
    data = ModelData.from_args((Y,), {})
    pot = kernel.potential_for(data)
    cfg = LocalConfig(update=exact_intercepts)
    design = uniform_design(N, 50, True, jnp.float32)
    plain = local_estimator(pot, design, cfg)
    state, _ = plain.init_state(plain.params, data)
    table, _ = local_control_variate(pot, cfg, jnp.asarray([1.0]), state,
                                     jax.random.PRNGKey(3), data, 512)
    assert table[0].shape == (N, 1)
    cv = local_estimator(pot, design, cfg, table)
    theta = jnp.asarray([1.3], jnp.float32)
    spreads = {}
    for est in (plain, cv):
        @jax.jit
        def one(key, est=est):
            return est.update(est.params, state, key, theta, data)[0][0]

        g = np.asarray(jax.lax.map(one, jax.random.split(jax.random.PRNGKey(0), 4000)),
                       np.float64)
        se = g.std() / np.sqrt(g.size)
        assert abs(g.mean() - marginal_grad(Y, 1.3)) < 4 * se, (est.name, g.mean(), se)
        spreads[est.name] = g.var()
    assert spreads["local-cv"] < 0.5 * spreads["local"], spreads


def test_local_sites_errors(intercepts):
    """Clear errors, raised before sampling, for what local sites drawn by MALA
    (``LocalConfig(nodes=0)``) do not support."""
    Y, _, _ = intercepts
    mala = LocalConfig(nodes=0)
    with pytest.raises(ValueError, match=r"local latent sites \['z'\].*estimator='cv' or "
                                         r"'uniform' \(got 'preferential'\)"):
        MCMC(SGHMC(intercepts_model, estimator="preferential", step_size=1e-6, local=mala),
             num_warmup=1, num_samples=1, progress_bar=False).run(jax.random.PRNGKey(0), Y)
    with pytest.raises(ValueError, match="a step_size or the adapted preconditioner"):
        MCMC(SGHMC(intercepts_model, adaptation=AdaptationOptions(preconditioner=False),
                   local=mala),
             num_warmup=1,
             num_samples=1, progress_bar=False).run(jax.random.PRNGKey(0), Y)
    with pytest.raises(ValueError, match="EnergyConservingHMC does not support local"):
        MCMC(EnergyConservingHMC(intercepts_model), num_warmup=1, num_samples=1,
             progress_bar=False).run(jax.random.PRNGKey(0), Y)

    def bad_update(rng_key, rows, values, idx, Y, n=50):
        return {"w": rows["z"]}

    with pytest.raises(ValueError, match=r"LocalConfig.update must return a dict of the local "
                                         r"sites \['z'\]"):
        MCMC(SGHMC(intercepts_model, estimator="uniform", step_size=1e-6,
                   local=LocalConfig(update=bad_update)),
             num_warmup=1, num_samples=1, progress_bar=False).run(jax.random.PRNGKey(0), Y)
    with pytest.raises(ValueError, match=r"StrataOptions\(features=...\)"):
        counts, _ = synthetic_corpus(20, 5, 2, 10)
        MCMC(SGRLD(lda_model, estimator="stratified", step_size=0.01), num_warmup=1,
             num_samples=1, progress_bar=False).run(jax.random.PRNGKey(0), counts,
                                                    to_tokens(counts), 2, 5)


@pytest.mark.filterwarnings("ignore:This run may be wrong")  # 20 draws: not mixed
def test_local_sites_refuse_marginal_quantities(intercepts):
    """What needs p(x_i | θ) or the marginal gradient is refused, not computed from the joint:
    an explicit proxy, proxy options or noise correction, the pointwise log-likelihood, ZV."""
    Y, _, _ = intercepts
    base = dict(estimator="uniform", step_size=1e-6,
                local=LocalConfig(update=exact_intercepts))
    for extra, what in [({"proxy": "variational"}, "no proxy"),
                        ({"proxy_kwargs": {"num_epochs": 1}}, "no proxy_kwargs"),
                        ({"noise": NoiseOptions(correction=True)},
                         "the noise correction left out")]:
        with pytest.raises(ValueError, match=rf"local latent sites \['z'\].*{what}"):
            MCMC(SGHMC(intercepts_model, **base, **extra), num_warmup=1, num_samples=1,
                 progress_bar=False).run(jax.random.PRNGKey(0), Y)
    mcmc = MCMC(SGHMC(intercepts_model, **base), num_warmup=5, num_samples=20,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), Y, extra_fields=("grad",))
    with pytest.raises(ValueError, match=r"log p\(x_i \| θ\) of a model with local latent"):
        to_arviz(mcmc, log_likelihood=True)
    with pytest.raises(ValueError, match=r"ZV needs the gradient of the marginal posterior"):
        zv_mean(mcmc)
    idata = to_arviz(mcmc)  # the draws themselves convert
    assert "mu" in idata.posterior and idata.posterior.attrs["local_sites"] == "z"
    with pytest.raises(ValueError, match=r"local latent sites \(z\)"):
        zv_summary(idata)


def test_local_site_with_two_values_per_datum_is_refused():
    def model(Y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("group", Y.shape[0], subsample_size=5) as idx:
            z = numpyro.sample("z", dist.Normal(mu, 1.0).expand([3, 5]))
            numpyro.sample("y", dist.Normal(z.sum(0), 1.0), obs=Y[idx])

    with pytest.raises(ValueError, match="Local latent site 'z'.*batch shape"):
        SGHMC(model, estimator="uniform", step_size=1e-3).preprocess((np.zeros(20),))


def test_user_update_gets_a_key_every_numpyro_distribution_samples_with(intercepts):
    """The local update receives a legacy uint32[2] PRNGKey (the per-step keys are Philox,
    with which JAX cannot sample e.g. a Poisson)."""
    Y, _, _ = intercepts
    kinds = []

    def poisson_update(rng_key, rows, values, idx, Y, n=50):
        kinds.append((rng_key.dtype, rng_key.shape))
        k1, k2 = jax.random.split(rng_key)
        extra = dist.Poisson(3.0).sample(k2, rows["z"].shape)  # JAX: Threefry only
        return {"z": exact_intercepts(k1, rows, values, idx, Y)["z"] + 0.0 * extra}

    MCMC(SGLD(intercepts_model, estimator="uniform", step_size=1e-6,
              local=LocalConfig(update=poisson_update)),
         num_warmup=0, num_samples=5, progress_bar=False).run(jax.random.PRNGKey(0), Y)
    assert kinds and all(k == (jnp.uint32, (2,)) for k in kinds), kinds


def effect_model(y, n=500):
    """Issue 35's per-row random effect: y_i ~ N(μ + z_i, 1), z_i ~ N(0, 0.5²)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
        z = numpyro.sample("z", dist.Normal(0.0, 0.5))
        numpyro.sample("y", dist.Normal(mu + z, 1.0), obs=y[idx])


@pytest.mark.parametrize("kernel, runner, local", [
    (SGLD, "package", None), (SGHMC, "numpyro", None), (SGLD, "package", LocalConfig(nodes=0))],
    ids=["SGLD-package", "SGHMC-numpyro", "SGLD-package-mala"])
def test_random_effect_at_default_arguments(kernel, runner, local):
    """``SGLD(model)`` / ``SGHMC(model)`` with every argument left out on a model with a local
    site (no hand tuning): by default z integrated out of each datum's term by quadrature, and
    the kernel's usual path (Laplace proxy, control variates); with ``LocalConfig(nodes=0)``
    z drawn by MALA, control variates at the end of a pilot, which the chains start from, and
    the adapted preconditioner's step. μ's exact posterior: y_i ~ N(μ, 1.25) marginally. Mean
    within 0.2 posterior sd and log-sd within 0.15 with over 150 effective draws (Monte Carlo
    error under 0.08 sd; about 700 in a trial), and no warning."""
    from numpyro_subsample import MCMC as PackageMCMC

    rng = np.random.default_rng(11)
    y = (1.3 + 0.5 * rng.normal(size=1000) + rng.normal(size=1000)).astype(np.float32)
    prec = 1.0 / 100.0 + y.size / 1.25
    mean, sd = y.sum() / 1.25 / prec, prec**-0.5
    k = kernel(effect_model) if local is None else kernel(effect_model, local=local)
    run = PackageMCMC if runner == "package" else MCMC
    mcmc = run(k, num_warmup=1000, num_samples=8000, num_chains=4, chain_method="vectorized",
               progress_bar=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(2), y)
    assert not [w for w in seen if issubclass(w.category, UserWarning)], [
        str(w.message) for w in seen]
    assert k.estimator_name == "cv"
    if local is None:
        assert k.potential.integrated_sites == ("z",) and not k.potential.local
    else:
        assert k.potential.local_sites == ("z",) and k.preprocessed.data_passes > 40  # pilot
        if runner == "package":  # the step's bias probed after the run, silent
            assert mcmc.run_check.step_bias is not None and mcmc.run_check.step_bias.after_run
    s = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"])
    assert effective_sample_size(s) > 150
    assert abs(s.mean() - mean) / sd < 0.2
    assert abs(np.log(s.std() / sd)) < 0.15


def olre_model(x, y, n=500):
    """A Poisson regression with an observation-level random effect e_i ~ N(0, s)."""
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0], subsample_size=n) as i:
        e = numpyro.sample("e", dist.Normal(0.0, s))
        numpyro.sample("y", dist.Poisson(jnp.exp(a + b * x[i] + e)), obs=y[i])


def test_the_pilot_of_a_local_scale_starts_from_its_conditionals():
    """The pilot's Fisher-identity gradient with every e_i at its prior mean 0 pushes log s
    down by N per unit; Adam moved s faster than the rows' inner updates (one in N/n steps)
    followed, and the pilot ended at s = 0.01 (the truth 0.4; the chains then stayed there,
    32 sd off). The local sites now sweep towards their conditionals first."""
    rng = np.random.default_rng(12)
    x = rng.normal(size=5000).astype(np.float32)
    y = rng.poisson(np.exp(1.0 + 0.5 * x + 0.4 * rng.normal(size=5000))).astype(np.float32)
    k = SGLD(olre_model, progress_bar=False, local=LocalConfig(nodes=0))
    pre = k.preprocess((x, y))
    s = float(jnp.exp(pre.potential.unravel(pre.centre)["s"]))
    assert 0.25 < s < 0.55, s


@pytest.mark.slow
def test_random_intercepts_at_default_arguments(intercepts):
    """The intercepts model (m = 4 observations per group, n = 400 of 2000 groups) with
    ``SGLD(model)`` at default arguments: μ against its closed form."""
    Y, mean, sd = intercepts
    k = SGLD(intercepts_model)
    mcmc = MCMC(k, num_warmup=2000, num_samples=20000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(3), Y, n=400)
    assert not [w for w in seen if issubclass(w.category, UserWarning)], seen
    s = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"])
    assert effective_sample_size(s) > 150
    assert abs(s.mean() - mean) / sd < 0.2
    assert abs(np.log(s.std() / sd)) < 0.15


@pytest.mark.slow
@pytest.mark.parametrize("kernel_class", [SGRLD, SGLD])
def test_lda_at_defaults_is_right_or_loud(kernel_class):
    """SGRLD(lda_model) and SGLD(lda_model) at default arguments on bench_lda.py's quick
    corpus: either the held-out perplexity is within 10 % of scikit-learn's online LDA (10
    passes) and the run is silent, or the run warns (noise-limited step, not mixed, a chain
    stopped): never a silent wrong run."""
    from lda import (
        completion_probs,
        draws_perplexity,
        perplexity,
        sklearn_online_lda,
        split_documents,
    )

    counts, _ = synthetic_corpus(1400, 300, 10, 80, seed=0)
    train, tokens = counts[:1000], to_tokens(counts[:1000])
    observed, held_out = split_documents(counts[1200:], 2)
    beta, _ = sklearn_online_lda(train, 10, 50, 10)
    ref = perplexity(completion_probs(beta, observed), held_out)
    mcmc = MCMC(kernel_class(lda_model), num_warmup=300, num_samples=1000, progress_bar=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), train, tokens, 10, 50)
        loud = [w for w in seen if issubclass(w.category, UserWarning)]
        if not loud:  # plain NumPyro MCMC: the package's run check, as to_arviz runs it
            from numpyro_subsample.post.checks import check_run
            check_run(mcmc, warn=True)
            loud = [w for w in seen if issubclass(w.category, UserWarning)]
    b = np.asarray(mcmc.get_samples()["topics"])
    ppl = draws_perplexity(b[500::50], observed, held_out)
    assert loud or ppl < 1.1 * ref, (ppl, ref)


def test_missing_responses_by_obs_mask_run_and_match_the_exact_posterior():
    """``obs_mask`` makes the missing responses local latent sites (``y_unobserved``) and ``y``
    a deterministic site of the plate, which depends on them: the run leaves that site out
    (it used to refuse the model at the first draw) and the coefficients match the exact
    conjugate posterior of the observed rows within 0.3 sd (SGHMC at defaults)."""
    from numpyro_subsample import MCMC as PackageMCMC

    rng = np.random.default_rng(1)
    N = 1000
    X = rng.normal(size=(N, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + rng.normal(size=N)).astype(np.float32)
    observed = np.arange(N) % 5 != 0

    def model(X, y, observed, subsample_size=100):
        b = numpyro.sample("b", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as i:
            numpyro.sample("y", dist.Normal(X[i] @ b, 1.0), obs=y[i], obs_mask=observed[i])

    A = X[observed].astype(np.float64)
    prec = A.T @ A + np.eye(2)
    exact = np.linalg.solve(prec, A.T @ y[observed])
    sd = np.sqrt(np.diag(np.linalg.inv(prec)))
    mcmc = PackageMCMC(SGHMC(model, progress_bar=False), num_warmup=300, num_samples=2000,
                       num_chains=2, chain_method="vectorized", progress_bar=False, check=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, observed)
    samples = mcmc.get_samples()
    assert "y" not in samples and "b" in samples
    b = np.asarray(samples["b"], np.float64)
    assert np.all(np.abs(b.mean(0) - exact) / sd < 0.3), (b.mean(0) - exact) / sd
    assert np.all(np.abs(np.log(b.std(0) / sd)) < 0.2), b.std(0) / sd
