"""Discrete per-datum sites inside the subsample plate, marked for enumeration, summed out of f_i:
terms equal to hand-marginalised models, SG kernels and ECS against NUTS on the marginal model,
refusals of what stays unsupported, and the marginal per-datum log-likelihood."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import standardised_errors
from numpyro import handlers
from numpyro.infer import MCMC, NUTS, init_to_median

from numpyro_subsample import SGHMC, SGLD, SGNHT, EnergyConservingHMC, ModelData, build_potential
from numpyro_subsample import to_arviz as ns_to_arviz

# compilation takes most of these tests' time: most XLA optimisations off (conftest.py)
pytestmark = pytest.mark.fast_compile

KEY = jax.random.PRNGKey(0)
N, M = 2000, 100
ENUM = {"enumerate": "parallel"}


# -- models --------------------------------------------------------------------------------------
def _globals(K, D):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(K)))
    # prior means -3, ..., 3 break the label symmetry: the posterior is unimodal
    centres = jnp.linspace(-3.0, 3.0, K)[:, None] * jnp.ones(D)
    loc = numpyro.sample("loc", dist.Normal(centres, 1.0).to_event(2))
    scale = numpyro.sample("scale", dist.HalfNormal(2.0))
    return w, loc, scale


def mixture_enum(x, K=2, subsample_size=M):
    """Gaussian mixture with a per-row assignment z, marked on the site."""
    w, loc, scale = _globals(K, x.shape[1])
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        z = numpyro.sample("z", dist.Categorical(w), infer=ENUM)
        numpyro.sample("obs", dist.Normal(loc[z], scale).to_event(1), obs=x[idx])


def _mark_enumerate(site):
    """numpyro.contrib.funsor.config_enumerate's rule (that module needs funsor)."""
    if site["type"] == "sample" and not site["is_observed"] and site["fn"].has_enumerate_support:
        return {"enumerate": "parallel"}
    return {}


def _mixture_unmarked(x, K=2, subsample_size=M):
    w, loc, scale = _globals(K, x.shape[1])
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        z = numpyro.sample("z", dist.Categorical(w))
        numpyro.sample("obs", dist.Normal(loc[z], scale).to_event(1), obs=x[idx])


mixture_config = handlers.infer_config(_mixture_unmarked, _mark_enumerate)


def mixture_msf(x, K=2, subsample_size=M):
    """The same model marginalised by NumPyro (no discrete site)."""
    w, loc, scale = _globals(K, x.shape[1])
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        comp = dist.Normal(loc, scale).to_event(1)
        numpyro.sample("obs", dist.MixtureSameFamily(dist.Categorical(w), comp), obs=x[idx])


def mixture_data(N=N, K=2, D=1, seed=0):
    rng = np.random.default_rng(seed)
    w = np.arange(1, K + 1) / np.arange(1, K + 1).sum()
    z = rng.choice(K, size=N, p=w)
    centres = np.linspace(-2.0, 2.0, K)[:, None] * np.ones(D)
    return jnp.asarray(centres[z] + rng.normal(size=(N, D)), jnp.float32)


def _md(*args, **kwargs):
    return ModelData.from_args(args, kwargs)


def _thetas(pot, num=3, seed=1):
    """The prior median and draws around it (unconstrained), (num + 1, d)."""
    noise = jax.random.normal(jax.random.PRNGKey(seed), (num, pot.dim))
    return jnp.concatenate([pot.init_theta[None], pot.init_theta + 0.7 * noise])


def _all_terms(pot, thetas, idx, md):
    """(f0, f_idx) at each θ of ``thetas``, in one compiled program."""
    return jax.jit(jax.vmap(pot.terms, in_axes=(0, None, None)))(thetas, idx, md)


# -- (a) terms of the enumerated model = terms of the marginalised model -------------------------
@pytest.mark.parametrize("K,D,model", [(2, 1, mixture_enum), (3, 2, mixture_config)])
def test_terms_equal_mixture_same_family(K, D, model):
    """f0 and every f_i of the enumerated model equal those of MixtureSameFamily (float32: the
    same sums in another order), at several θ, for repeated and traced indices."""
    x = mixture_data(N=N, K=K, D=D)
    md = _md(x, K=K)
    pot = build_potential(model, md, KEY)
    ref = build_potential(mixture_msf, md, KEY)
    assert pot.latent_sites == ref.latent_sites == ("w", "loc", "scale")
    assert pot.enumerated_sites == ("z",) and pot.dim == ref.dim
    idx = jnp.concatenate([jnp.arange(N), jnp.array([3, 3, N - 1])])
    thetas = _thetas(pot)
    f0, fi = _all_terms(pot, thetas, idx, md)
    g0, gi = _all_terms(ref, thetas, idx, md)
    assert fi.shape == (4, N + 3) and fi.dtype == jnp.float32
    np.testing.assert_allclose(f0, g0, rtol=1e-6)
    np.testing.assert_allclose(fi, gi, rtol=2e-5, atol=2e-5)
    # the enumerated site is not part of the constrained draws
    out = pot.constrain(pot.unravel(pot.init_theta), md)
    assert set(out) == {"w", "loc", "scale"}


# -- (d) two enumerated sites of a datum -----------------------------------------------------------
def two_sites_enum(x, dependent=False, subsample_size=M):
    """Two discrete sites per row (K1 = 2, K2 = 3), independent or z2 | z1."""
    w1 = numpyro.sample("w1", dist.Dirichlet(jnp.ones(2)))
    w2 = numpyro.sample("w2", dist.Dirichlet(jnp.ones((2, 3))).to_event(1))
    a = numpyro.sample("a", dist.Normal(jnp.array([-2.0, 2.0]), 1.0).to_event(1))
    b = numpyro.sample("b", dist.Normal(jnp.array([-1.0, 0.0, 1.0]), 1.0).to_event(1))
    scale = numpyro.sample("scale", dist.HalfNormal(2.0))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        z1 = numpyro.sample("z1", dist.Categorical(w1), infer=ENUM)
        probs2 = w2[z1] if dependent else w2[0]
        z2 = numpyro.sample("z2", dist.Categorical(probs2), infer=ENUM)
        numpyro.sample("obs", dist.Normal(a[z1] + b[z2], scale), obs=x[idx])


def two_sites_by_hand(x, dependent=False, subsample_size=M):
    """The same with the 6 joint values summed by hand (one mixture of 6 components)."""
    w1 = numpyro.sample("w1", dist.Dirichlet(jnp.ones(2)))
    w2 = numpyro.sample("w2", dist.Dirichlet(jnp.ones((2, 3))).to_event(1))
    a = numpyro.sample("a", dist.Normal(jnp.array([-2.0, 2.0]), 1.0).to_event(1))
    b = numpyro.sample("b", dist.Normal(jnp.array([-1.0, 0.0, 1.0]), 1.0).to_event(1))
    scale = numpyro.sample("scale", dist.HalfNormal(2.0))
    p2 = w2 if dependent else jnp.broadcast_to(w2[0], (2, 3))
    log_w = (jnp.log(w1)[:, None] + jnp.log(p2)).reshape(-1)
    loc = (a[:, None] + b[None, :]).reshape(-1)
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        lp = dist.Normal(loc, scale).log_prob(x[idx][:, None]) + log_w
        numpyro.factor("obs", jax.scipy.special.logsumexp(lp, -1))


@pytest.mark.parametrize("dependent", [False, True])
def test_two_enumerated_sites_equal_hand_marginalisation(dependent):
    x = mixture_data(N=500, K=2, D=1, seed=3)[:, 0]
    md = _md(x, dependent=dependent)
    pot = build_potential(two_sites_enum, md, KEY)
    ref = build_potential(two_sites_by_hand, md, KEY)
    assert pot.enumerated_sites == ("z1", "z2") and pot.dim == ref.dim
    assert dict(pot.enumerated_dims) == {"z1": -2, "z2": -3}
    idx = jnp.arange(500)
    thetas = _thetas(pot)
    f0, fi = _all_terms(pot, thetas, idx, md)
    g0, gi = _all_terms(ref, thetas, idx, md)
    np.testing.assert_allclose(f0, g0, rtol=1e-6)
    np.testing.assert_allclose(fi, gi, rtol=2e-5, atol=2e-5)


# -- (b, c) kernels on the enumerated model against NUTS on the marginalised one ---------------
@pytest.fixture(scope="module")
def mix():
    return mixture_data(N=N, K=2, D=1, seed=0)


@pytest.fixture(scope="module")
def nuts_ref(mix):
    """NUTS on the marginalised model, started at the prior median (locations −3, 3): a random
    start can settle in the label-swapped local mode, which the priors make negligible."""
    mcmc = MCMC(NUTS(mixture_msf, init_strategy=init_to_median()), num_warmup=500,
                num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(12345), mix, subsample_size=N)
    return {k: np.asarray(v) for k, v in mcmc.get_samples().items()}


@pytest.fixture(scope="module")
def sgld_run(mix):
    """SGLD-CV on the enumerated mixture, 4 vectorised chains (its Laplace proxy is reused by
    the other kernels' runs, so that the file fits one proxy fit)."""
    kernel = SGLD(mixture_enum, estimator="cv")
    mcmc = MCMC(kernel, num_warmup=300, num_samples=2000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), mix)
    return mcmc


def _check(mcmc, ref, mean_tol, sd_tol):
    samples = mcmc.get_samples()
    assert set(samples) == {"w", "loc", "scale"}  # no draws of z
    err, ratio = standardised_errors(samples, ref)
    assert np.all(np.abs(err) < mean_tol), err
    assert np.all(np.abs(ratio - 1) < sd_tol), ratio
    assert not np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))


def test_sgld_matches_nuts(sgld_run, nuts_ref):
    """SGLD-CV: means within 0.2 posterior sd and sds within 15% of NUTS on the
    MixtureSameFamily model (two NUTS runs of this size differ by up to 0.07 sd and 8%)."""
    _check(sgld_run, nuts_ref, 0.2, 0.15)


def test_sghmc_matches_nuts(mix, nuts_ref, sgld_run):
    """SGHMC-CV (4 vectorised chains): the tolerances of SGLD."""
    kernel = SGHMC(mixture_enum, estimator="cv", proxy=sgld_run.sampler.proxy)
    mcmc = MCMC(kernel, num_warmup=300, num_samples=1000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(3), mix)
    _check(mcmc, nuts_ref, 0.2, 0.15)


def test_sgnht_runs(mix, nuts_ref, sgld_run):
    """SGNHT: a short single chain lands on the posterior (means within 0.5 posterior sd, sds
    within 50%: a smoke test of the dynamics on the enumerated potential)."""
    mcmc = MCMC(SGNHT(mixture_enum, proxy=sgld_run.sampler.proxy), num_warmup=200,
                num_samples=500, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(4), mix)
    _check(mcmc, nuts_ref, 0.5, 0.5)


@pytest.mark.slow
def test_energy_conserving_hmc_matches_nuts(mix, nuts_ref, sgld_run):
    """ECS (the SGLD run's Laplace proxy, default likelihood proxy and selection): means within
    0.25 posterior sd and sds within 20% of NUTS (one chain of 500 draws)."""
    kernel = EnergyConservingHMC(mixture_enum, proxy=sgld_run.sampler.proxy)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=500, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(5), mix)
    _check(mcmc, nuts_ref, 0.25, 0.2)


# -- (e) refusals ---------------------------------------------------------------------------------
def _global_discrete(x, subsample_size=M):
    k = numpyro.sample("k", dist.Bernoulli(0.5), infer=ENUM)
    loc = numpyro.sample("loc", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("obs", dist.Normal(loc + k, 1.0), obs=x[idx])


def _local_continuous(x, subsample_size=M):
    loc = numpyro.sample("loc", dist.Normal(0.0, 1.0))
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        u = numpyro.sample("u", dist.Normal(0.0, 1.0))
        z = numpyro.sample("z", dist.Categorical(w), infer=ENUM)
        numpyro.sample("obs", dist.Normal(loc + u + z, 1.0), obs=x[idx])


def _local_site(fn_of_w, infer=None, inner=False):
    def model(x, subsample_size=M):
        w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
        with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
            if inner:
                with numpyro.plate("pair", 2):
                    z = numpyro.sample("z", fn_of_w(w), infer=infer or {})
            else:
                z = numpyro.sample("z", fn_of_w(w), infer=infer or {})
            numpyro.sample("obs", dist.Normal(z.sum() * 0.0 + w[0], 1.0), obs=x[idx])
    return model


def _depends_outside(x, subsample_size=M):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
    loc = numpyro.sample("loc", dist.Normal(jnp.array([-3.0, 3.0]), 1.0).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        z = numpyro.sample("z", dist.Categorical(w), infer=ENUM)
        numpyro.deterministic("mu", loc[z])
        numpyro.sample("obs", dist.Normal(loc[z], 1.0), obs=x[idx])


@pytest.mark.parametrize("model, match", [
    (_mixture_unmarked, r"Latent site 'z' is discrete and lies inside the subsample plate "
                        r"'data' but is not marked .*infer=\{'enumerate': 'parallel'\}"),
    (_local_site(lambda w: dist.Categorical(w), {"enumerate": "sequential"}),
     r"'z' .*not marked for parallel enumeration \(infer=\{'enumerate': 'sequential'\}\)"),
    (_global_discrete, r"Latent site 'k' is discrete and lies outside the subsample plate "
                       r"'data'.*Marginalise it out by hand"),
    (_local_continuous, r"plate 'data' has both continuous local latent sites \['u'\] and "
                        r"enumerated discrete sites \['z'\]"),
    (_local_site(lambda w: dist.Poisson(3.0), ENUM), r"'z' .*Poisson has no finite support"),
    (_local_site(lambda w: dist.Categorical(w), ENUM, inner=True),
     r"'z' is marked for enumeration .*also in the plate\(s\) \['pair'\].*one discrete value"),
    (_depends_outside, r"Deterministic site 'mu' depends on the enumerated site\(s\) 'z'"),
])
def test_unsupported_sites_are_refused(model, match):
    x = jnp.zeros((300, 1) if model is _mixture_unmarked else (300,), jnp.float32)
    with pytest.raises(ValueError, match=match):
        build_potential(model, _md(x), KEY)


# -- (f) the marginal per-datum log-likelihood ---------------------------------------------------
def two_observed(x1, x2, subsample_size=M):
    """Two observed sites sharing the datum's assignment z (dependent given θ)."""
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
    loc = numpyro.sample("loc", dist.Normal(jnp.array([-3.0, 3.0]), 1.0).to_event(1))
    with numpyro.plate("data", x1.shape[0], subsample_size=subsample_size) as idx:
        z = numpyro.sample("z", dist.Categorical(w), infer=ENUM)
        numpyro.sample("x1", dist.Normal(loc[z], 1.0), obs=x1[idx])
        numpyro.sample("x2", dist.Normal(-loc[z], 2.0), obs=x2[idx])


def test_log_likelihood_at_is_the_marginal():
    """``Potential.log_likelihood_at``: the MixtureSameFamily log-likelihood for one observed
    site; for two sites sharing z, x1's marginal then x2 | x1, summing to −f_i."""
    x = mixture_data(N=400, K=2, D=1, seed=5)
    md = _md(x)
    pot = build_potential(mixture_enum, md, KEY)
    ref = build_potential(mixture_msf, md, KEY)
    idx = jnp.arange(400)

    @jax.jit
    def both(theta, md):
        lat = pot.constrain(pot.unravel(theta), md)
        return (pot.log_likelihood_at(lat, idx, md)["obs"],
                ref.log_likelihood_at(lat, idx, md)["obs"])

    ours, expected = jax.vmap(both, in_axes=(0, None))(_thetas(pot), md)
    np.testing.assert_allclose(ours, expected, rtol=2e-5, atol=2e-5)
    x1, x2 = x[:, 0], mixture_data(N=400, K=2, D=1, seed=6)[:, 0]
    md2 = _md(x1, x2)
    pot2 = build_potential(two_observed, md2, KEY)
    theta = _thetas(pot2)[1]

    @jax.jit
    def at(theta, md2):
        lat = pot2.constrain(pot2.unravel(theta), md2)
        return lat, pot2.log_likelihood_at(lat, idx, md2), pot2.terms(theta, idx, md2)[1]

    lat, ll, fi = at(theta, md2)
    w, loc = np.asarray(lat["w"], np.float64), np.asarray(lat["loc"], np.float64)
    x1n, x2n = np.asarray(x1, np.float64)[:, None], np.asarray(x2, np.float64)[:, None]
    l1 = np.log(w) - 0.5 * ((x1n - loc) ** 2 + np.log(2 * np.pi))
    l2 = -0.5 * (((x2n + loc) / 2.0) ** 2 + np.log(2 * np.pi)) - np.log(2.0)
    marg1 = np.logaddexp(l1[:, 0], l1[:, 1])
    joint = np.logaddexp(l1[:, 0] + l2[:, 0], l1[:, 1] + l2[:, 1])
    np.testing.assert_allclose(ll["x1"], marg1, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ll["x1"] + ll["x2"], joint, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(-fi, joint, rtol=1e-5, atol=1e-4)


def test_to_arviz_log_likelihood_is_the_marginal(mix, sgld_run):
    thin = 500
    idata = ns_to_arviz(sgld_run, log_likelihood=True, log_likelihood_thin=thin, check=False)
    assert "z" not in idata.posterior
    ll = idata.log_likelihood["obs"].values  # (chains, draws // thin, N)
    samples = sgld_run.get_samples(group_by_chain=True)
    kept = {k: samples[k][:, ::thin].reshape((-1,) + samples[k].shape[2:])
            for k in ("w", "loc", "scale")}
    md = _md(mix)
    ref = build_potential(mixture_msf, md, KEY)
    expected = jax.jit(jax.vmap(lambda lat, md: ref.log_likelihood_at(lat, jnp.arange(N), md)[
        "obs"], in_axes=(0, None)))(kept, md)
    np.testing.assert_allclose(ll.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)


def test_variational_proxy_refuses_enumerated_sites(mix):
    """SVI on an enumerated model needs funsor's TraceEnum_ELBO: a clear error naming the site
    and the Laplace proxy, before any fit (not NumPyro's ImportError from inside the guide)."""
    kernel = SGLD(mixture_enum, proxy="variational", progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False)
    with pytest.raises(ValueError, match=r"enumeration \('z'\).*proxy='laplace'"):
        mcmc.run(jax.random.PRNGKey(0), mix)
