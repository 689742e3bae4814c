"""Issue 35, items 1-2: SGRLD and the SG kernels on local-latent models at default arguments.

    python benchmarks/bench_defaults_simplex_local.py [--quick] [--only GROUP]

GROUP: lda, lda-rule, lda-sgld-steps, local-simplex or local (``lda-rule`` and
``lda-sgld-steps`` only with ``--only``).

Each row is a kernel built with the model only (plus the options the row names), run by the
package's ``MCMC`` with 4 vectorised chains, 1000 warm-up and 5000 sampling steps, against the
exact posterior: Dirichlet-categorical data (the posterior is Dirichlet(α + counts)) at several
K, N and n, a three-component mixture's weights (against 2·10⁴ full-data NUTS draws), and the
per-row random effect y_i ~ N(μ + z_i, 1), z_i ~ N(0, 0.5²) (μ's posterior in closed form: y_i
~ N(μ, 1.25)), a Dirichlet-categorical model with a per-row local site (exact posterior), and
LDA on ``bench_lda.py``'s quick corpus (1 chain; held-out perplexity against scikit-learn's
online LDA in place of the error columns). Columns: the estimator and step the kernel chose,
the largest |mean error| and the range of sd ratios over the coordinates (posterior sd units),
the minimum bulk ESS over the coordinates (all chains), wall time including compilation (the
preprocessing's share in brackets), data passes of the preprocessing, and the warnings of the
run.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import NUTS

from numpyro_subsample import MCMC, SGHMC, SGLD, SGRLD, LocalConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import add_device_option  # noqa: E402

CHAINS, WARMUP, SAMPLES = 4, 1000, 5000


def categorical(K: int, alpha0: float):
    def model(y, n=100):
        pi = numpyro.sample("pi", dist.Dirichlet(alpha0 * jnp.ones(K)))
        with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
            numpyro.sample("y", dist.Categorical(probs=pi), obs=y[idx])

    return model


def mixture(y, n=50, full=False):
    pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(3)))
    comps = dist.Normal(jnp.array([-2.0, 0.0, 2.0]), 1.0)
    with numpyro.plate("data", y.shape[0], subsample_size=None if full else n) as idx:
        obs = y if full else y[idx]
        numpyro.sample("y", dist.MixtureSameFamily(dist.Categorical(probs=pi), comps), obs=obs)


def random_effect(y, n=500):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
        z = numpyro.sample("z", dist.Normal(0.0, 0.5))
        numpyro.sample("y", dist.Normal(mu + z, 1.0), obs=y[idx])


def run(label, kernel, args, kwargs, site, mean, sd):
    t0 = time.perf_counter()
    mcmc = MCMC(kernel, num_warmup=WARMUP, num_samples=SAMPLES, num_chains=CHAINS,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
        draws = np.asarray(mcmc.get_samples(group_by_chain=True)[site], np.float64)
    wall = time.perf_counter() - t0
    flat = draws.reshape((-1,) + draws.shape[2:])
    z = np.abs(flat.mean(0) - mean) / sd
    ratio = flat.std(0) / sd
    ess = float(np.min(effective_sample_size(draws)))
    texts = sorted({f"{w.category.__name__}: {str(w.message)[:90]}" for w in seen
                    if issubclass(w.category, UserWarning)})
    pre = kernel.preprocessed
    step = pre.step_size
    return (f"| {label} | {kernel.estimator_name} | {step:.3g} | {np.max(z):.2f} | "
            f"{np.min(ratio):.2f}-{np.max(ratio):.2f} | {ess:.0f} | {wall:.1f} "
            f"({pre.seconds:.1f}) | {float(pre.data_passes):.0f} | "
            f"{'; '.join(texts) or 'none'} |")


def dirichlet_rows(quick: bool):
    cases = [(3, 3000, 50, 1.0), (8, 20000, 500, 1.0)]
    if not quick:
        cases += [(20, 50000, 200, 0.5), (12, 8000, 1000, 3.0)]
    for K, N, n, a0 in cases:
        rng = np.random.default_rng(K)
        y = rng.choice(K, size=N, p=rng.dirichlet(np.ones(K))).astype(np.int32)
        a = a0 + np.bincount(y, minlength=K)
        m = a / a.sum()
        sd = np.sqrt(m * (1 - m) / (a.sum() + 1))
        for opts in ({}, {"estimator": "uniform"}):
            name = ", ".join(f"{k}={v!r}" for k, v in opts.items())
            yield run(f"SGRLD({name or 'model'}) Dirichlet-categorical K={K} N={N} n={n} "
                      f"α={a0}", SGRLD(categorical(K, a0), **opts), (y,), {"n": n}, "pi", m, sd)
            if quick:
                break


def mixture_rows():
    rng = np.random.default_rng(7)
    y = rng.normal(np.array([-2.0, 0.0, 2.0])[rng.choice(3, 2000, p=[0.5, 0.3, 0.2])], 1.0)
    y = y.astype(np.float32)
    ref = numpyro.infer.MCMC(NUTS(mixture), num_warmup=1000, num_samples=20000,
                             progress_bar=False)
    ref.run(jax.random.PRNGKey(1), y, full=True)
    d = np.asarray(ref.get_samples()["pi"])
    yield run("SGRLD(model) mixture weights K=3 N=2000 n=50 (NUTS 2·10⁴ reference)",
              SGRLD(mixture), (y,), {}, "pi", d.mean(0), d.std(0))


def local_rows(quick: bool):
    cases = [(1000, 500), (2000, 200)]
    for N, n in cases:
        rng = np.random.default_rng(11)
        y = (1.3 + 0.5 * rng.normal(size=N) + rng.normal(size=N)).astype(np.float32)
        prec = 1.0 / 100.0 + N / 1.25
        mean, sd = y.sum() / 1.25 / prec, prec**-0.5
        kernels = [("SGLD(model)", lambda: SGLD(random_effect)),
                   ("SGLD(model, local=LocalConfig(nodes=0))",
                    lambda: SGLD(random_effect, local=LocalConfig(nodes=0))),
                   ("SGHMC(model)", lambda: SGHMC(random_effect))]
        for label, build in kernels[:2] if quick else kernels:
            yield run(f"{label} random effect N={N} n={n}", build(), (y,), {"n": n}, "mu",
                      mean, sd)


def lda_rows():
    """SGRLD(lda_model) and SGLD(lda_model) at default arguments on bench_lda.py's quick corpus:
    held-out perplexity (document completion, the posterior predictive over the second half's
    draws) against scikit-learn's online LDA at 10 passes."""
    from lda import (
        completion_probs,
        draws_perplexity,
        lda_model,
        perplexity,
        sklearn_online_lda,
        split_documents,
        synthetic_corpus,
        to_tokens,
    )

    K, n = 10, 50
    counts, true = synthetic_corpus(1400, 300, K, 80, seed=0)
    train, tokens = counts[:1000], to_tokens(counts[:1000])
    observed, held_out = split_documents(counts[1200:], 2)
    beta, secs = sklearn_online_lda(train, K, n, 10)
    ref = perplexity(completion_probs(beta, observed), held_out)
    truth = perplexity(completion_probs(true, observed), held_out)
    for label, build in (("SGRLD(lda_model)", lambda: SGRLD(lda_model)),
                         ("SGLD(lda_model)", lambda: SGLD(lda_model))):
        t0 = time.perf_counter()
        kernel = build()
        mcmc = MCMC(kernel, num_warmup=WARMUP, num_samples=SAMPLES, num_chains=1,
                    progress_bar=False)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                mcmc.run(jax.random.PRNGKey(0), train, tokens, K, n)
                b = np.asarray(mcmc.get_samples()["topics"])
                ppl = f"{draws_perplexity(b[SAMPLES // 2::SAMPLES // 40], observed, held_out):.1f}"
                pre = kernel.preprocessed
                step = f"{pre.step_size:.3g}"
            except Exception as err:  # noqa: BLE001 - report the refusal as the row
                ppl, step = f"{type(err).__name__}: {str(err)[:80]}", "–"
        texts = sorted({f"{w.category.__name__}: {str(w.message)[:90]}" for w in seen
                        if issubclass(w.category, UserWarning)})
        yield (f"| {label} LDA quick corpus (D=1000, V=300, K=10, n=50), 1 chain | "
               f"{kernel.estimator_name} | {step} | perplexity {ppl} (online LDA 10 passes "
               f"{ref:.1f} in {secs:.1f} s; true topics {truth:.1f}) | – | – | "
               f"{time.perf_counter() - t0:.1f} | – | {'; '.join(texts) or 'none'} |")


def lda_sgld_step_rows():
    """SGLD on the LDA quick corpus at the default step and at 1/2, 1/8 and 1/32 of it (the
    adapted preconditioner kept): the step at which the chain stopped (non-finite or exploded
    in NumPyro's stick-breaking coordinates of the sparse Dirichlet topics, η = 0.05)."""
    from lda import lda_model, synthetic_corpus, to_tokens

    from numpyro_subsample import AdaptationOptions

    counts, _ = synthetic_corpus(1400, 300, 10, 80, seed=0)
    train, tokens = counts[:1000], to_tokens(counts[:1000])
    for h in (None, 0.0476, 0.0119, 0.003):
        kernel = SGLD(lda_model, step_size=h,
                      adaptation=AdaptationOptions(preconditioner=True) if h else None)
        mcmc = MCMC(kernel, num_warmup=WARMUP, num_samples=SAMPLES, num_chains=1,
                    progress_bar=False)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mcmc.run(jax.random.PRNGKey(0), train, tokens, 10, 50)
        fail = int(np.asarray(mcmc.last_state.fail_step).max())
        yield (f"| SGLD(lda_model{'' if h is None else f', step_size={h}'}) LDA quick corpus "
               f"| {kernel.estimator_name} | {kernel.step_size:.3g} | stopped at step "
               f"{fail if fail >= 0 else 'never'} of {WARMUP + SAMPLES} | – | – | "
               f"{time.perf_counter() - t0:.1f} | – | – |")


def lda_rule_rows():
    """SGRLD's step rule on LDA measured at scikit-learn's topics (online LDA, 10 passes), the
    documents' proportions drawn by the exact Gibbs update: the relaxation rate
    max(1 + F_k/θ_k), the uniform design's noise max V_k/θ_k, the step a = 4δ/max(rate +
    noise) and the noise-free one 4δ/max(rate) (δ = 0.05)."""
    from lda import lda_local_gibbs, lda_model, sklearn_online_lda, synthetic_corpus, to_tokens

    from numpyro_subsample import ModelData

    # not public: the benchmark measures SGRLD's step rule term by term (relaxation rates,
    # the local sites' drift moments), which only these internals expose
    from numpyro_subsample.estimators.local import init_local_state
    from numpyro_subsample.estimators.selection import uniform_design
    from numpyro_subsample.sgmcmc.simplex import flatten_sites, relaxation_rates
    from numpyro_subsample.sgmcmc.simplex_local import local_drift_moments
    from numpyro_subsample.sgmcmc.simplex_model import reference_totals
    from numpyro_subsample.sgmcmc.simplex_step import dirichlet_concentrations

    counts, _ = synthetic_corpus(1400, 300, 10, 80, seed=0)
    train, tokens = counts[:1000], to_tokens(counts[:1000])
    beta, _ = sklearn_online_lda(train, 10, 50, 10)
    kernel = SGRLD(lda_model, local=LocalConfig(update=lda_local_gibbs))
    data = ModelData.from_args((train, tokens, 10, 50), {})
    pot = kernel.potential_for(data)
    ref = reference_totals(dirichlet_concentrations(pot, data))
    design = uniform_design(1000, 50, True, jnp.float32)
    state = init_local_state(pot.local, 1000, jnp.float32, 0.1)
    pi = {"topics": jnp.asarray(beta / beta.sum(1, keepdims=True), jnp.float32)}
    for rep in range(2):  # the second measurement from the first one's local draws
        dm, state = local_drift_moments(pot, kernel.local, pi, state, jax.random.PRNGKey(rep),
                                        data, design.moments(design.params), 2048)
    theta = flatten_sites(ref) * flatten_sites(pi)
    rate = relaxation_rates(np.asarray(dm.fisher, np.float64), theta, pi)
    ratio = np.asarray(dm.noise, np.float64) / theta
    yield (f"| SGRLD rule on LDA at online LDA's topics (Gibbs locals) | uniform | "
           f"{0.2 / np.max(rate + ratio):.3g} | rate {rate.max():.3g}, noise {ratio.max():.3g},"
           f" noise-free step {0.2 / rate.max():.3g} | – | – | – | – | – |")


def local_simplex_rows():
    """SGRLD(model) on a Dirichlet-categorical model with a per-row local site (the model of
    tests/test_sgrld.py::test_default_step_with_local_sites_matches_the_exact_posterior)."""
    def model(y, w, n=1000):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(3)))
        with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
            numpyro.sample("w", dist.Normal(z, 1.0), obs=w[idx])
            numpyro.sample("y", dist.Categorical(probs=pi), obs=y[idx])

    rng = np.random.default_rng(1)
    y = rng.choice(3, size=2000, p=[0.5, 0.3, 0.2]).astype(np.int32)
    w = (rng.normal(size=2000) * np.sqrt(2.0)).astype(np.float32)
    a = 1.0 + np.bincount(y, minlength=3)
    m = a / a.sum()
    sd = np.sqrt(m * (1 - m) / (a.sum() + 1))
    yield run("SGRLD(model) Dirichlet-categorical K=3 N=2000 n=1000 + local z_i",
              SGRLD(model), (y, w), {}, "pi", m, sd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rows")
    p.add_argument("--only", choices=("lda", "lda-rule", "lda-sgld-steps", "local-simplex",
                                      "local"),
                   help="only these rows")
    add_device_option(p)
    args = p.parse_args()
    quick = args.quick
    print("| kernel, model | estimator | step | max abs mean error (sd) | sd ratio | min ESS "
          "| wall s incl. compile (preprocessing) | preprocessing data passes | warnings |")
    print("|---|---|---|---|---|---|---|---|---|")
    groups = {"lda": [lda_rows()], "lda-rule": [lda_rule_rows()],
              "lda-sgld-steps": [lda_sgld_step_rows()],
              "local-simplex": [local_simplex_rows()],
              "local": [local_rows(quick)]}.get(args.only) or (
        dirichlet_rows(quick), mixture_rows(), local_simplex_rows(), local_rows(quick), lda_rows())
    for rows in groups:
        for row in rows:
            print(row, flush=True)


if __name__ == "__main__":
    main()
