"""Issue 35, item 2: how much of the uniform estimator's noise a control variate can remove
on models with local sites.

    python benchmarks/bench_local_cv_share.py

The per-datum gradient (Fisher identity, local sites drawn from their exact conditionals at a
point θ̂ near the posterior) varies within a datum, over the local draws, E_i Var(h_i | x_i, θ̂),
and between the data, Var_i E[h_i | x_i, θ̂]. A control variate at θ̂ removes the between
share (up to residuals that vanish at θ̂) and leaves the within share. Models: the per-row
random effect y_i ~ N(μ + z_i, 1), z_i ~ N(0, 0.5²) (gradient in μ), and LDA on the quick
synthetic corpus of ``bench_lda.py`` at the true topics (the expanded-mean drift of the
topics, summed over coordinates; θ_d by the exact Gibbs update ``lda_local_gibbs``).
"""
import time

import jax
import jax.numpy as jnp
import numpy as np
from lda import lda_local_gibbs, synthetic_corpus, to_tokens


def lda_share(D=1000, V=300, K=10, L=80, draws=40, burn=20, thin=2, seed=0):
    counts, topics = synthetic_corpus(D, V, K, L, seed=seed)
    tokens = jnp.asarray(to_tokens(counts))
    beta = jnp.asarray(topics, jnp.float32)
    c = jnp.asarray(counts, jnp.float32)
    idx = jnp.arange(D)

    @jax.jit
    def sweep(key, theta):
        return lda_local_gibbs(key, {"theta": theta}, {"topics": beta}, idx, c, tokens, K, D,
                               sweeps=thin)["theta"]

    @jax.jit
    def drift(theta):
        p = theta @ beta  # (D, V)
        grad = theta[:, :, None] * (c / p)[:, None, :]  # (D, K, V): d log p / d beta
        inner = jnp.sum(beta[None] * grad, -1, keepdims=True)
        return beta[None] * (grad - inner)  # h_d (D, K, V)

    theta = jnp.full((D, K), 1.0 / K)
    keys = jax.random.split(jax.random.PRNGKey(seed), burn + draws)
    for k in keys[:burn]:
        theta = sweep(k, theta)
    s1 = s2 = 0.0
    for k in keys[burn:]:
        theta = sweep(k, theta)
        h = drift(theta)
        s1, s2 = s1 + h, s2 + h * h
    m = s1 / draws
    within = float(jnp.sum(s2 / draws - m * m)) * draws / (draws - 1) / D
    between = float(jnp.sum(jnp.var(m, axis=0)))
    return within, between


def intercept_share(N=1000, draws=200, seed=0):
    rng = np.random.default_rng(seed)
    mu = 1.3
    y = mu + 0.5 * rng.normal(size=N) + rng.normal(size=N)
    # z | y, mu ~ N((y - mu) / 5, 1 / 5); d/dmu of -log p(y | mu + z) = -(y - mu - z)
    z = (y - mu)[:, None] / 5 + rng.normal(size=(N, draws)) / np.sqrt(5)
    g = -(y[:, None] - mu - z)
    return float(g.var(1, ddof=1).mean()), float(g.mean(1).var())


if __name__ == "__main__":
    t = time.time()
    w, b = intercept_share()
    print(f"random effect (N=1000, at the posterior mode): within {w:.3f} between {b:.3f} "
          f"-> CV leaves >= {w / (w + b):.1%}")
    w, b = lda_share()
    print(f"LDA quick corpus (D=1000, V=300, K=10, L=80, true topics): within {w:.4g} "
          f"between {b:.4g} -> CV leaves >= {w / (w + b):.1%}  ({time.time() - t:.0f}s)")
