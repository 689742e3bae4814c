"""Latent Dirichlet allocation as a NumPyro model with local latent sites, for SGRLD.

Topics β_k ~ Dirichlet(η 1_V) are global Dirichlet sites (SGRLD, Patterson and Teh 2013); a
document's topic proportions θ_d ~ Dirichlet(α 1_K) is a local site inside the subsample plate;
the word-topic assignments are summed out, so that the word counts c_d of a document are
Multinomial(Σ_w c_dw, θ_d β). :func:`lda_local_gibbs` is the exact conditional update of θ_d
given β (data augmentation: the assignment counts given θ_d, then θ_d given them), the Gibbs step
of paper 002's LDA experiment. Also: a synthetic corpus from known topics, scikit-learn's online
variational LDA (Hoffman, Blei and Bach 2010) as the peer, and document-completion perplexity.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

ALPHA = 0.1  # document-topic concentration
ETA = 0.05  # topic-word concentration


def lda_model(counts, tokens, num_topics: int, subsample_size: int, alpha: float = ALPHA,
              eta: float = ETA):
    """LDA with the word-topic assignments summed out; ``counts`` is (D, V); ``tokens`` (the
    same documents as word ids, (D, L), −1 padding) is read by :func:`lda_local_gibbs` only."""
    del tokens
    D, V = counts.shape
    with numpyro.plate("topic", num_topics):
        beta = numpyro.sample("topics", dist.Dirichlet(jnp.full((V,), eta)))
    with numpyro.plate("doc", D, subsample_size=subsample_size) as idx:
        theta = numpyro.sample("theta", dist.Dirichlet(jnp.full((num_topics,), alpha)))
        c = counts[idx]
        numpyro.sample("words", dist.Multinomial(c.sum(-1), theta @ beta), obs=c)


def lda_local_gibbs(rng_key, rows, values, idx, counts, tokens, num_topics, subsample_size,
                    alpha=ALPHA, eta=ETA, sweeps: int = 2):
    """``sweeps`` Gibbs sweeps of θ_d given β for the documents ``idx`` (the ``LocalConfig.update``
    of SGRLD): each token's topic z ~ Categorical(θ_d ⊙ β_·w), then θ_d ~ Dirichlet(α + n_d·),
    n_dk the tokens of document d with topic k."""
    del counts, subsample_size, eta
    beta = values["topics"]  # (K, V)
    tok = tokens[idx]  # (m, L)
    mask = (tok >= 0).astype(beta.dtype)
    log_beta = jnp.log(jnp.maximum(beta.T[jnp.maximum(tok, 0)], jnp.finfo(beta.dtype).tiny))
    theta = rows["theta"]
    tiny = jnp.finfo(theta.dtype).tiny
    for key in jax.random.split(rng_key, sweeps):
        k_z, k_t = jax.random.split(key)
        logits = jnp.log(jnp.maximum(theta, tiny))[:, None, :] + log_beta  # (m, L, K)
        z = jax.random.categorical(k_z, logits, axis=-1)
        nk = jnp.einsum("mlk,ml->mk", jax.nn.one_hot(z, num_topics, dtype=beta.dtype), mask)
        theta = jax.random.dirichlet(k_t, alpha + nk)
        theta = jnp.maximum(theta, tiny)
        theta = theta / theta.sum(-1, keepdims=True)
    return {"theta": theta}


def synthetic_corpus(num_docs: int, vocab: int, num_topics: int, mean_length: int,
                     seed: int = 0, alpha: float = ALPHA, eta: float = ETA):
    """Word counts (num_docs, vocab) drawn from LDA with known topics (num_topics, vocab)."""
    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(vocab, eta), size=num_topics)
    theta = rng.dirichlet(np.full(num_topics, alpha), size=num_docs)
    lengths = np.maximum(rng.poisson(mean_length, size=num_docs), 2)
    probs = theta @ topics
    counts = np.stack([rng.multinomial(n, p / p.sum())
                       for n, p in zip(lengths, probs, strict=True)])
    return counts.astype(np.float32), topics


def to_tokens(counts: np.ndarray) -> np.ndarray:
    """Word counts (D, V) -> word ids (D, L), L the longest document, −1 padding."""
    counts = counts.astype(np.int64)
    L = int(counts.sum(1).max())
    out = np.full((counts.shape[0], L), -1, np.int32)
    for d, row in enumerate(counts):
        ids = np.repeat(np.arange(row.shape[0]), row)
        out[d, : ids.shape[0]] = ids
    return out


def split_documents(counts: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each held-out document's tokens split at random into two halves (observed, held out)."""
    rng = np.random.default_rng(seed)
    first = rng.binomial(counts.astype(np.int64), 0.5)
    return first.astype(np.float32), (counts - first).astype(np.float32)


@jax.jit
def _fold_in(beta, observed, alpha):
    """θ_d given topics β for each document's observed counts: the fixed point θ ∝ α + n̂_d·
    of the expected topic counts (the mean-field update, 100 iterations)."""
    K = beta.shape[0]
    theta = jnp.full((observed.shape[0], K), 1.0 / K, beta.dtype)

    def body(_, theta):
        p = theta[:, :, None] * beta[None]  # (D, K, V)
        resp = p / jnp.maximum(p.sum(1, keepdims=True), 1e-30)
        nk = jnp.einsum("dkv,dv->dk", resp, observed)
        t = nk + alpha
        return t / t.sum(-1, keepdims=True)

    return jax.lax.fori_loop(0, 100, body, theta)


def completion_probs(beta: np.ndarray, observed: np.ndarray, alpha: float = ALPHA):
    """p(w | d) = θ̂_d β, θ̂_d folded in from the observed half of each document."""
    beta = jnp.asarray(beta, jnp.float32)
    theta = _fold_in(beta, jnp.asarray(observed), alpha)
    return np.asarray(theta @ beta)


def perplexity(probs: np.ndarray, held_out: np.ndarray) -> float:
    """exp(−Σ c_dw log p(w | d) / Σ c_dw) on the held-out halves."""
    ll = np.sum(held_out * np.log(np.maximum(probs, 1e-30)))
    return float(np.exp(-ll / held_out.sum()))


def draws_perplexity(betas: np.ndarray, observed: np.ndarray, held_out: np.ndarray,
                     alpha: float = ALPHA) -> float:
    """Perplexity of the posterior predictive averaged over topic draws ``betas`` (S, K, V)."""
    probs = np.mean([completion_probs(b, observed, alpha) for b in betas], axis=0)
    return perplexity(probs, held_out)


def topic_recovery(beta: np.ndarray, true: np.ndarray) -> float:
    """Mean over true topics of the smallest L1 distance to an estimated topic (0: exact)."""
    dist_ = np.abs(true[:, None, :] - beta[None]).sum(-1)
    return float(dist_.min(1).mean())


def sklearn_online_lda(train: np.ndarray, num_topics: int, batch_size: int, passes: int,
                       seed: int = 0, alpha: float = ALPHA, eta: float = ETA):
    """scikit-learn's online variational LDA (Hoffman et al. 2010); (topics, seconds)."""
    from sklearn.decomposition import LatentDirichletAllocation

    t0 = time.perf_counter()
    lda = LatentDirichletAllocation(
        n_components=num_topics, doc_topic_prior=alpha, topic_word_prior=eta,
        learning_method="online", batch_size=batch_size, max_iter=passes,
        total_samples=train.shape[0], random_state=seed,
    )
    lda.fit(train)
    beta = lda.components_ / lda.components_.sum(1, keepdims=True)
    return beta, time.perf_counter() - t0
