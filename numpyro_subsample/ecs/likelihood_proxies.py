"""Proxies q_i(θ) ≈ ℓ_i(θ) = log p(x_i | θ) of the per-datum log-likelihood (Rønning and
Hamelryck 2021).

Every proxy here is a quadratic in whitened coordinates w (θ = θ_ref + L w):

    q_i(w) = a_i + b_iᵀw + ½ wᵀC_i w,   Σ_i q_i(w) = A + Bᵀw + ½ wᵀCw,

with B = Σb_i and C = ΣC_i computed once (a :class:`LikelihoodProxy` holds the arrays), and the
per-datum terms (a_i, b_i, C_i) computed by :func:`datum_terms` for the indices of the subsample
only. The kinds (a static :class:`LikelihoodSpec`):

- ``taylor`` (order 1 or 2): the Taylor expansion of ℓ_i at θ_ref (Dang et al. 2019; Rønning and
  Hamelryck 2021, "Perturbed method"); no per-datum tables.
- ``variational``: q_i(θ) = e_i + G(θ)/N with e_i = E_q[ℓ_i] and the global ELBO terms
  G(θ) = E_q[log π] − E_q[log q] + log q(θ) − log π(θ) (Rønning and Hamelryck 2021, Eq. 2-4:
  Eq. 2 + Eq. 3 give log p(x | θ) ≈ Σ_i e_i + G(θ); G/N per datum is the split that gives
  every datum the same θ-dependence). In the difference estimator the G of Σ_i q_i cancels
  against the subsample's, so only the θ-free table e_i (N,) is kept: the control variate
  ignores the state of the chain.
- ``hybrid`` order 1: q_i(θ) = e_i + ḡ_iᵀ(θ − μ), ḡ_i = E_q[∇ℓ_i] (Bonnet's theorem: the
  gradient of the q-smoothed likelihood), tables e (N,) and ḡ (N, d).
- ``hybrid`` order 2: the L²(q) projection of ℓ_i onto quadratics. With z ~ N(0, I) the degree-2
  Hermite truncation is q_i(z) = E[ℓ_i] + E[∇ℓ_i]ᵀz + ½ zᵀE[∇²ℓ_i]z − ½ tr E[∇²ℓ_i] (Stein's
  lemma gives the coefficients, and E[∇²ℓ_i] = E[∇ℓ_i zᵀ] needs gradients only). The moments
  use S moment-matched antithetic draws z_s shared by all data, computed per datum on the fly;
  B and C come from S full-data gradient passes with the same draws, so Σ_i q_i matches the
  per-datum terms exactly.

All passes are module-level jitted programs with the potential static and the data an argument.
With a structured posterior proxy (diagonal or low-rank Σ̂ = L Lᵀ, L never formed) only the
first-order Taylor proxy is available: it needs B = Lᵀ Σ_i ∇ℓ_i(θ_ref) (one gradient pass) and
per datum b_i = Lᵀ∇ℓ_i(θ_ref), O(d·k) each; the second-order terms are d × d.
"""

from __future__ import annotations

import time
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, map_data, value_grad_hessian
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.structured import StructuredProxy
from numpyro_subsample.proxies.whitening import (
    Scale,
    is_structured,
    proxy_scale,
    whiten_matvec,
    whiten_rmatvec,
    whiten_solve,
)

__all__ = [
    "LIKELIHOOD_PROXIES",
    "LikelihoodSpec",
    "LikelihoodProxy",
    "datum_terms",
    "fit_likelihood_proxy",
    "moment_matched_normal",
    "variational_expectations",
    "proxy_constant",
    "proxy_total",
]

LIKELIHOOD_PROXIES = ("taylor", "hybrid", "variational")


class LikelihoodSpec(NamedTuple):
    """Static description of the proxy: ``kind`` in :data:`LIKELIHOOD_PROXIES`, ``order``
    (1 or 2 for taylor and hybrid, 0 for variational)."""

    kind: str
    order: int


class LikelihoodProxy(NamedTuple):
    """The arrays of q_i(w) = a_i + b_iᵀw + ½ wᵀC_i w with θ = ``ref`` + ``tril`` w (``tril``
    a :data:`~numpyro_subsample.proxies.whitening.Scale`: dense triangular or structured).

    ``sum_b`` (d,) and ``sum_c`` (d, d) are B and C in whitened coordinates (None when the
    proxy has no such term); ``a`` (N,) and ``b`` (N, d) are per-datum tables (variational and
    first-order hybrid); ``draws`` (S, d) are the whitened draws z_s of the second-order hybrid.
    """

    ref: jax.Array
    tril: Scale
    sum_b: jax.Array | None = None
    sum_c: jax.Array | None = None
    a: jax.Array | None = None
    b: jax.Array | None = None
    draws: jax.Array | None = None


def _loglik(potential: Potential, theta: jax.Array, i: jax.Array, data: ModelData) -> jax.Array:
    """ℓ_i(θ) of one datum (i a scalar index)."""
    return -potential.data_terms(theta, i[None], data)[0]


def datum_terms(
    potential: Potential, spec: LikelihoodSpec, lp: LikelihoodProxy, idx: jax.Array,
    data: ModelData,
) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """(a, b, C) of the data ``idx`` (k,): shapes (k,), (k, d) or None, (k, d, d) or None."""
    ref, tril = lp.ref, lp.tril
    if spec.kind == "taylor":
        def one(i):
            f = lambda z: _loglik(potential, ref + whiten_matvec(tril, z), i, data)  # noqa: E731
            z0 = jnp.zeros_like(ref)
            a, b = jax.value_and_grad(f)(z0)
            return a, b, (jax.hessian(f)(z0) if spec.order == 2 else None)

        return jax.vmap(one)(idx)
    if spec.kind == "hybrid" and spec.order == 2:
        zs = lp.draws
        S = zs.shape[0]

        def one(i):
            f = lambda z: _loglik(potential, ref + tril @ z, i, data)  # noqa: E731
            vals, g = jax.vmap(jax.value_and_grad(f))(zs)
            c = g.T @ zs / S
            c = 0.5 * (c + c.T)
            return jnp.mean(vals) - 0.5 * jnp.trace(c), jnp.mean(g, 0), c

        return jax.vmap(one)(idx)
    return lp.a[idx], (None if lp.b is None else lp.b[idx]), None


# -- preprocessing passes ---------------------------------------------------------------------
@partial(jax.jit, static_argnames=("num", "dim"))
def moment_matched_normal(key: jax.Array, num: int, dim: int) -> jax.Array:
    """``num`` (even) antithetic standard-normal draws with sample mean 0 and covariance I.

    Shared by all data, the Monte Carlo error of e_i = E_q[ℓ_i] then has no first- or
    second-order term (odd moments vanish, second moments are exact); that error enters σ̂²
    multiplied by N²/m.
    """
    half = jax.random.normal(key, (num // 2, dim))
    cov = half.T @ half / (num // 2)
    chol = jnp.linalg.cholesky(cov + 1e-9 * jnp.eye(dim))
    half = jax.scipy.linalg.solve_triangular(chol, half.T, lower=True).T
    return jnp.concatenate([half, -half], 0)


@partial(jax.jit, static_argnames=("potential", "chunk_size", "second"))
def _taylor_sums(potential, chunk_size, second, ref, tril, data):
    """B = Lᵀ Σ∇ℓ_i(θ_ref) and C = Lᵀ Σ∇²ℓ_i(θ_ref) L: one data pass, the prior removed."""
    _, g_all, h_all = value_grad_hessian(potential, ref, data, chunk_size, hessian=second)
    prior = lambda t: potential.prior(t, data)  # noqa: E731
    sum_b = whiten_rmatvec(tril, -(g_all - jax.grad(prior)(ref)))
    sum_c = tril.T @ -(h_all - jax.hessian(prior)(ref)) @ tril if second else None
    return sum_b, sum_c


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def _stein_sums(potential, chunk_size, ref, tril, zs, data):
    """B = mean_s ∇_z Σℓ_i(μ + L z_s), C = sym(mean_s ∇_z Σℓ_i z_sᵀ): S data passes."""

    def lik_grad(z):
        th = ref + tril @ z
        _, g, _ = value_grad_hessian(potential, th, data, chunk_size, hessian=False)
        return -(tril.T @ (g - jax.grad(lambda t: potential.prior(t, data))(th)))

    grads = jax.lax.map(lik_grad, zs)  # (S, d)
    sum_c = grads.T @ zs / zs.shape[0]
    return grads.mean(0), 0.5 * (sum_c + sum_c.T)


@partial(jax.jit, static_argnames=("potential", "grads", "chunk_size", "draw_chunk"))
def variational_expectations(
    potential: Potential,
    draws: jax.Array,
    data: ModelData,
    grads: bool = False,
    chunk_size: int = DEFAULT_CHUNK,
    draw_chunk: int = 16,
) -> tuple[jax.Array, jax.Array | None]:
    """e_i = mean_s ℓ_i(φ_s) (N,) and, if ``grads``, ḡ_i = mean_s ∇ℓ_i(φ_s) (N, d).

    Chunked over data and over draws: memory O(N + chunk_size · draw_chunk) (plus the (N, d)
    output for ``grads``); S data passes (2S with gradients).
    """
    S, d = draws.shape
    pad = (-S) % draw_chunk
    w = (jnp.concatenate([jnp.ones(S), jnp.zeros(pad)]) / S).astype(draws.dtype)
    phis = jnp.concatenate([draws, jnp.broadcast_to(draws[:1], (pad, d))], 0)
    phis, w = phis.reshape(-1, draw_chunk, d), w.reshape(-1, draw_chunk)

    def on_chunk(idx):
        def over_draws(acc, xs):
            ph, ww = xs
            vals = jax.vmap(lambda t: -potential.data_terms(t, idx, data))(ph)  # (D, k)
            e = acc[0] + ww @ vals
            if not grads:
                return (e, None), None
            g = jax.vmap(lambda t: jax.vmap(
                jax.grad(lambda tt, i: _loglik(potential, tt, i, data)), in_axes=(None, 0)
            )(t, idx))(ph)  # (D, k, d)
            return (e, acc[1] + jnp.einsum("s,skd->kd", ww, g)), None

        init = (jnp.zeros(idx.shape, draws.dtype),
                jnp.zeros((idx.shape[0], d), draws.dtype) if grads else None)
        return jax.lax.scan(over_draws, init, (phis, w))[0]

    return map_data(on_chunk, potential.num_data, chunk_size)


def _is_gaussian(proxy: Proxy) -> bool:
    """A Laplace or user proxy is N(centre, cov); a variational one says whether its guide is."""
    return bool(proxy.info.get("gaussian", True))


def fit_likelihood_proxy(
    potential: Potential,
    data: ModelData,
    proxy: Proxy | StructuredProxy,
    spec: LikelihoodSpec,
    rng_key: jax.Array,
    *,
    num_mc_draws: int,
    chunk_size: int,
) -> tuple[LikelihoodProxy, float, dict]:
    """The arrays of the proxy ``spec`` around the posterior proxy ``proxy`` (centre θ_ref,
    square root L of its covariance). Returns ``(LikelihoodProxy, data passes, info)``."""
    t0 = time.perf_counter()
    ref, tril = proxy.centre, proxy_scale(proxy)
    d, S = potential.dim, int(num_mc_draws)
    info: dict = {"dim": d}
    if is_structured(tril) and spec != ("taylor", 1):
        raise ValueError(
            f"likelihood_proxy={spec.kind!r} of order {spec.order} needs d × d terms "
            f"(per-datum Hessians or second moments), and this run's posterior proxy is "
            f"structured ({proxy.kind}, d = {d}, no d × d array): use the first-order Taylor "
            "proxy (likelihood_proxy='taylor', taylor_order=1, the default with a structured "
            "proxy), or pass a dense proxy."
        )
    if spec.kind == "taylor":
        sum_b, sum_c = _taylor_sums(potential, chunk_size, spec.order == 2, ref, tril, data)
        lp, passes = LikelihoodProxy(ref=ref, tril=tril, sum_b=sum_b, sum_c=sum_c), 1.0
    elif spec.kind == "hybrid" and spec.order == 2:
        if S // 2 < d:
            raise ValueError(
                f"likelihood_proxy='hybrid' with hybrid_order=2 needs num_mc_draws >= 2·dim = "
                f"{2 * d} (moment-matched draws), got num_mc_draws={S}; raise num_mc_draws."
            )
        if not _is_gaussian(proxy):
            raise ValueError(
                "hybrid_order=2 needs a Gaussian proxy (e.g. the guide AutoMultivariateNormal); "
                "the given guide is not Gaussian: use hybrid_order=1."
            )
        zs = moment_matched_normal(rng_key, S, d).astype(ref.dtype)
        sum_b, sum_c = _stein_sums(potential, chunk_size, ref, tril, zs, data)
        lp = LikelihoodProxy(ref=ref, tril=tril, sum_b=sum_b, sum_c=sum_c, draws=zs)
        passes = float(S)
        info["draws"] = ref + zs @ tril.T
    else:
        hybrid = spec.kind == "hybrid"
        if _is_gaussian(proxy):
            draws = ref + moment_matched_normal(rng_key, S, d).astype(ref.dtype) @ tril.T
        else:
            draws = jnp.asarray(proxy.info["sample"](rng_key, S), ref.dtype)
        e, gbar = variational_expectations(potential, draws, data, hybrid, chunk_size)
        bad = ~np.asarray(jnp.isfinite(e))
        if bad.any():
            raise ValueError(
                f"E_q[log p(x_i | θ)] is not finite for datum {int(np.flatnonzero(bad)[0])} of "
                f"plate '{potential.plate.name}'; check the data and the proxy."
            )
        if hybrid:
            table_b = gbar @ tril  # whitened: Lᵀ ḡ_i for every datum
            lp = LikelihoodProxy(ref=ref, tril=tril, sum_b=jnp.sum(table_b, 0), sum_c=None, a=e,
                                 b=table_b)
        else:
            lp = LikelihoodProxy(ref=ref, tril=tril, a=e)
        passes = S * (2.0 if hybrid else 1.0)
        info.update(draws=draws, sum_e=float(jnp.sum(e)))
    info.update(num_mc_draws=S if spec.kind != "taylor" else 0,
                seconds=time.perf_counter() - t0)
    return lp, passes, info


# -- diagnostics ----------------------------------------------------------------------------------
@partial(jax.jit, static_argnames=("potential", "spec", "chunk_size"))
def proxy_constant(
    potential: Potential, spec: LikelihoodSpec, lp: LikelihoodProxy, data: ModelData,
    chunk_size: int = DEFAULT_CHUNK,
) -> jax.Array:
    """A = Σ_i a_i, the constant that the estimator's ``loglik_estimate`` leaves out."""
    if spec.kind == "taylor":
        value, _, _ = value_grad_hessian(potential, lp.ref, data, chunk_size, hessian=False)
        return potential.prior(lp.ref, data) - value
    if lp.a is not None:
        return jnp.sum(lp.a)
    per = map_data(lambda i: datum_terms(potential, spec, lp, i, data)[0],
                   potential.num_data, chunk_size)
    return jnp.sum(per)


@partial(jax.jit, static_argnames=("potential", "spec", "chunk_size"))
def proxy_total(
    potential: Potential, spec: LikelihoodSpec, lp: LikelihoodProxy, theta: jax.Array,
    data: ModelData, draws: jax.Array | None = None, chunk_size: int = DEFAULT_CHUNK,
) -> jax.Array:
    """Σ_i q_i(θ), the constant and (variational) G(θ) included.

    For ``variational`` this is ELBO + log q(θ) − log π(θ), the right-hand side of Rønning and
    Hamelryck (2021, Eq. 2 with Eq. 3), for q = N(θ_ref, LLᵀ) (``draws`` from q give
    E_q[log π]); for the others A + Bᵀw (+ ½ wᵀCw).
    """
    w = whiten_solve(lp.tril, theta - lp.ref)
    total = proxy_constant(potential, spec, lp, data, chunk_size)
    if spec.kind != "variational":
        if lp.sum_b is not None:
            total = total + lp.sum_b @ w
        if lp.sum_c is not None:
            total = total + 0.5 * w @ lp.sum_c @ w
        return total
    d = theta.shape[0]
    logdet = jnp.sum(jnp.log(jnp.diag(lp.tril)))
    log_q = -0.5 * w @ w - logdet - 0.5 * d * jnp.log(2 * jnp.pi)
    e_log_q = -0.5 * d - logdet - 0.5 * d * jnp.log(2 * jnp.pi)
    prior = lambda t: potential.prior(t, data)  # noqa: E731
    e_log_prior = -jnp.mean(jax.vmap(prior)(draws))
    return total + e_log_prior - e_log_q + log_q + prior(theta)
