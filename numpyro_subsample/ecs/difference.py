"""The difference estimator of the log-likelihood and its variance (Rønning and Hamelryck 2021,
"Perturbed method"; Quiroz et al. 2019), with uniform or Hansen-Hurwitz selection.

With d_i = ℓ_i − q_i (:mod:`~numpyro_subsample.ecs.likelihood_proxies`) and a subsample
u = (u_1, …, u_m) drawn i.i.d. with P(u_j = i) = p_i (uniform: p_i = 1/N), y_j = d_{u_j}/p_{u_j}:

    l̂(θ; u) = Σ_i q_i(θ) + (1/m) Σ_j y_j,      σ̂²(θ; u) = s²_u(y) / m   (ddof = 1),

unbiased for Σ_i ℓ_i(θ) and for Var_u[l̂] = (1/m)(Σ_i d_i²/p_i − (Σ_i d_i)²) respectively; for
uniform p, σ̂² = (N²/m) s²_u(d) as in the paper. The ``"preferential"`` law is
p_i ∝ (1 − λ) s_i / Σs + λ/N with s_i the rms of d_i over proxy draws (λ = ``uniform_mix``, so
every p_i > 0), drawn in O(1) per index from a Walker alias table.
"""

from __future__ import annotations

import time
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import map_data
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.ecs.likelihood_proxies import LikelihoodProxy, LikelihoodSpec, datum_terms
from numpyro_subsample.estimators.alias import alias_draw, build_alias_table
from numpyro_subsample.estimators.preferential import mix_with_uniform
from numpyro_subsample.proxies.whitening import whiten_matvec, whiten_solve

__all__ = [
    "SELECTIONS",
    "SelectionLaw",
    "SubsampleTerms",
    "uniform_selection",
    "preferential_selection",
    "draw_indices",
    "subsample_terms",
    "difference_estimate",
    "loglik_estimates",
    "variance_at_proxy_draws",
    "MAX_SIGMA2",
    "SIGMA2_DRAWS",
]

#: The largest median σ̂² at proxy draws that preprocessing accepts without a warning: σ̂ ≈ 1.7,
#: the upper end of the standard deviations of the log-likelihood estimator that Doucet, Pitt,
#: Deligiannidis and Kohn (2015) find efficient for pseudo-marginal MCMC (about 1.0-1.7).
MAX_SIGMA2 = 3.0
#: The proxy draws at which preprocessing measures σ̂² (:func:`variance_at_proxy_draws`).
SIGMA2_DRAWS = 16

SELECTIONS = ("uniform", "preferential")


class SelectionLaw(NamedTuple):
    """The arrays of the selection law: an alias table of p and r_i = 1/(N p_i) (N,), or
    ``None`` for both (uniform selection)."""

    table: tuple | None = None
    r: jax.Array | None = None


class SubsampleTerms(NamedTuple):
    """The proxy's terms for the subsample u: a (m,), b (m, d), C (m, d, d) (None when the
    proxy has no such term) and r (m,) = 1/(N p_{u_j}) (None for uniform selection)."""

    a: jax.Array
    b: jax.Array | None
    c: jax.Array | None
    r: jax.Array | None


def uniform_selection() -> SelectionLaw:
    return SelectionLaw()


def draw_indices(sel: SelectionLaw, key: jax.Array, n: int, num_data: int) -> jax.Array:
    """n i.i.d. indices from the selection law."""
    if sel.table is None:
        return jax.random.randint(key, (n,), 0, num_data)
    return alias_draw(sel.table, key, n)


def subsample_terms(
    potential: Potential, spec: LikelihoodSpec, lp: LikelihoodProxy, sel: SelectionLaw,
    idx: jax.Array, data: ModelData,
) -> SubsampleTerms:
    a, b, c = datum_terms(potential, spec, lp, idx, data)
    return SubsampleTerms(a=a, b=b, c=c, r=None if sel.r is None else sel.r[idx])


def difference_estimate(
    potential: Potential, lp: LikelihoodProxy, w: jax.Array, idx: jax.Array,
    terms: SubsampleTerms, data: ModelData,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(f0(θ), l̂(θ; u) − A, σ̂²(θ; u)) at θ = θ_ref + L w (module docstring; A = Σ_i a_i)."""
    theta = lp.ref + whiten_matvec(lp.tril, w)
    f0, fi = potential.terms(theta, idx, data)
    q_sub = terms.a
    total = jnp.zeros((), theta.dtype)
    if terms.b is not None:
        q_sub = q_sub + terms.b @ w
        total = total + lp.sum_b @ w
    if terms.c is not None:
        q_sub = q_sub + 0.5 * jnp.einsum("jkl,k,l->j", terms.c, w, w)
        total = total + 0.5 * w @ lp.sum_c @ w
    y = potential.num_data * (-fi - q_sub)
    if terms.r is not None:
        y = y * terms.r
    return f0, total + jnp.mean(y), jnp.var(y, ddof=1) / idx.shape[0]


@partial(jax.jit, static_argnames=("potential", "spec", "subsample_size", "num_subsamples"))
def loglik_estimates(
    potential: Potential,
    spec: LikelihoodSpec,
    subsample_size: int,
    num_subsamples: int,
    lp: LikelihoodProxy,
    sel: SelectionLaw,
    theta: jax.Array,
    rng_key: jax.Array,
    data: ModelData,
) -> tuple[jax.Array, jax.Array]:
    """l̂(θ; u) − A and σ̂²(θ; u) for ``num_subsamples`` fresh subsamples u (the keys are
    ``jax.random.split(rng_key, num_subsamples)``)."""
    w = whiten_solve(lp.tril, theta - lp.ref)

    def one(key):
        idx = draw_indices(sel, key, subsample_size, potential.num_data)
        terms = subsample_terms(potential, spec, lp, sel, idx, data)
        return difference_estimate(potential, lp, w, idx, terms, data)[1:]

    keys = jax.random.split(rng_key, num_subsamples)
    return jax.lax.map(one, keys, batch_size=min(num_subsamples, 100))


@partial(jax.jit, static_argnames=("potential", "spec", "chunk_size"))
def _error_scale(potential, spec, chunk_size, lp, zs, data):
    """s_i = sqrt(mean_s d_i(θ_ref + L z_s)²) for every datum, one chunked pass (S evaluations)."""

    def chunk(idx):
        a, b, c = datum_terms(potential, spec, lp, idx, data)
        vals = jax.vmap(
            lambda z: -potential.data_terms(lp.ref + whiten_matvec(lp.tril, z), idx, data))(zs)
        q = jnp.broadcast_to(a, vals.shape)
        if b is not None:
            q = q + zs @ b.T
        if c is not None:
            q = q + 0.5 * jnp.einsum("sk,jkl,sl->sj", zs, c, zs)
        return jnp.sqrt(jnp.mean((vals - q) ** 2, 0))

    return map_data(chunk, potential.num_data, chunk_size)


def preferential_selection(
    potential: Potential,
    spec: LikelihoodSpec,
    lp: LikelihoodProxy,
    data: ModelData,
    rng_key: jax.Array,
    *,
    num_draws: int,
    uniform_mix: float,
    chunk_size: int,
) -> tuple[SelectionLaw, float, dict]:
    """The Hansen-Hurwitz law p_i ∝ (1 − λ) s_i / Σs + λ/N with s_i the rms of the proxy error
    d_i over ``num_draws`` draws z_s ~ N(0, I) of the whitened proxy. Returns
    ``(SelectionLaw, data passes, info)``."""
    t0 = time.perf_counter()
    zs = jax.random.normal(rng_key, (int(num_draws), potential.dim), lp.ref.dtype)
    scale = np.asarray(_error_scale(potential, spec, chunk_size, lp, zs, data), np.float64)
    if not np.all(np.isfinite(scale)):
        bad = int(np.flatnonzero(~np.isfinite(scale))[0])
        raise ValueError(
            f"selection='preferential': the proxy error of datum {bad} is not finite at some "
            "proxy draws; use selection='uniform' or check that row of the data."
        )
    table = build_alias_table(mix_with_uniform(scale, uniform_mix))
    r = 1.0 / (potential.num_data * np.asarray(table.probs, np.float64))
    info = {"selection_probs": table.probs, "selection_seconds": time.perf_counter() - t0}
    return SelectionLaw(table=table, r=jnp.asarray(r, lp.ref.dtype)), float(num_draws), info


@partial(jax.jit, static_argnames=("potential", "spec", "subsample_size", "num_draws"))
def variance_at_proxy_draws(
    potential: Potential, spec: LikelihoodSpec, subsample_size: int, num_draws: int,
    lp: LikelihoodProxy, sel: SelectionLaw, rng_key: jax.Array, data: ModelData,
) -> jax.Array:
    """σ̂²(θ; u) at ``num_draws`` draws θ = θ_ref + L z, z ~ N(0, I), one fresh subsample u
    each: the variance of the estimator where the chain will be."""
    k_z, k_u = jax.random.split(rng_key)
    zs = jax.random.normal(k_z, (num_draws, lp.ref.shape[0]), lp.ref.dtype)

    def one(args):
        z, key = args
        idx = draw_indices(sel, key, subsample_size, potential.num_data)
        terms = subsample_terms(potential, spec, lp, sel, idx, data)
        return difference_estimate(potential, lp, z, idx, terms, data)[2]

    return jax.lax.map(one, (zs, jax.random.split(k_u, num_draws)))
