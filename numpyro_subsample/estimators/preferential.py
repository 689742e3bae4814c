"""Preferential subsampling: SGLD-PS and SGLD-CV-PS (Putcha, Nemeth and Fearnhead 2023, Sect. 3).

The subsample is drawn *with replacement* from a fixed non-uniform law p and every drawn term
is reweighted by 1/(n p_i), so the estimator stays unbiased (Putcha et al. 2023, Eq. 8 without
and Eq. 12 with the Taylor control variate):

- ``"preferential"`` (SGLD-PS): p_i ∝ ||∇f_i(θ̂)|| (Eq. 11), from the proxy's stored gradients
  or one data pass;
- ``"cv-preferential"`` (SGLD-CV-PS): p_i ∝ sqrt(tr(∇²f_i(θ̂) Σ̂ ∇²f_i(θ̂)ᵀ)) = ||∇²f_i(θ̂) L||_F
  with Σ̂ = L Lᵀ (Eq. 16). The per-datum Hessians are streamed over chunks of data, so memory
  is O(N + chunk · d²), never N · d²; cost O(N d³) (Appendix D). With a structured proxy
  (:class:`~numpyro_subsample.proxies.structured.StructuredProxy`, large d) no Hessian is
  formed: ||H_i L||_F² = E_z ||H_i L z||² over Rademacher z is estimated with
  :data:`STRUCTURED_WEIGHT_PROBES` probes z_m shared by all data (Hutchinson 1989), i.e. that
  many Hessian-vector products per datum (forward over reverse mode) and O(d·k) for each L z_m.
  The estimate is unbiased for p_i² up to normalisation; for a rank-one H_i = c x xᵀ (a GLM)
  its relative standard deviation is at most sqrt(2/M), so p_i is within about sqrt(1/(2M))
  (12.5% at M = 32) of Eq. 16, which costs the estimator little variance and no bias (the
  importance weights 1/(n p_i) use the realised law).

Both laws are mixed with the uniform one, p = (1 − λ) p_w + λ/N (default λ = 0.05), so that
every datum keeps a positive probability and no importance weight exceeds N/(λ n); the mixture
costs at most a factor 1/(1 − λ) in variance.

Drawing n indices from the fixed law costs O(n) per step with Walker's alias table
(:mod:`numpyro_subsample.estimators.alias`, built once on the host; its arrays are the
estimator's ``params``). ``weights="exact"`` (Eq. 10 / Eq. 14, the state-dependent optimal
law) needs all N per-datum gradients at every step, i.e. one data pass per step, and is meant
for diagnostics (Fig. 1), not for sampling at scale.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, map_data
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.alias import alias_design, build_alias_table, importance_moments
from numpyro_subsample.estimators.base import (
    EstimatorMoments,
    GradientEstimator,
    control_variate_from_proxy,
    make_estimator,
    pair_control_variate,
    weighted_gradient,
)
from numpyro_subsample.proxies.whitening import Scale, is_structured, proxy_scale, whiten_matvec

__all__ = [
    "DEFAULT_UNIFORM_MIX",
    "STRUCTURED_WEIGHT_PROBES",
    "mix_with_uniform",
    "gradient_norm_weights",
    "hessian_weights",
    "preferential_probabilities",
    "build_preferential",
    "build_cv_preferential",
    "analytic_pseudo_variance",
]

DEFAULT_UNIFORM_MIX = 0.05

#: Probes of the Hutchinson estimate of the Eq. 16 weights with a structured proxy (module
#: docstring): Hessian-vector products per datum.
STRUCTURED_WEIGHT_PROBES = 32


# -- the weights --------------------------------------------------------------------------------
def mix_with_uniform(p: np.ndarray, uniform_mix: float) -> np.ndarray:
    """p = (1 − λ) p_w / Σp_w + λ/N; an all-zero p_w gives the uniform law."""
    p = np.asarray(p, np.float64)
    N = p.shape[0]
    total = p.sum()
    if not total > 0:
        return np.full(N, 1.0 / N)
    return (1.0 - uniform_mix) * p / total + uniform_mix / N


def _datum_grads(potential: Potential, theta: jax.Array, idx: jax.Array, data: ModelData):
    """∇f_i(θ) for i in idx, (len(idx), d)."""
    return jax.vmap(
        lambda i: jax.grad(lambda t: potential.data_terms(t, i[None], data)[0])(theta)
    )(idx)


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def _gradient_norms(potential, centre, data, chunk_size):
    norms = lambda idx: jnp.linalg.norm(_datum_grads(potential, centre, idx, data), axis=-1)  # noqa: E731
    return map_data(norms, potential.num_data, chunk_size)


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def _hessian_norms(potential, centre, scale_tril, data, chunk_size):
    def one(i):
        h = jax.hessian(lambda t: potential.data_terms(t, i[None], data)[0])(centre)
        return jnp.sqrt(jnp.sum((h @ scale_tril) ** 2))

    return map_data(jax.vmap(one), potential.num_data, chunk_size)


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def _hutchinson_hessian_norms(potential, centre, probes, data, chunk_size):
    """sqrt(mean_m ||H_i v_m||²) per datum, v_m the rows of ``probes`` (M, d)."""

    def one(i):
        grad = jax.grad(lambda t: potential.data_terms(t, i[None], data)[0])
        hv = jax.vmap(lambda v: jax.jvp(grad, (centre,), (v,))[1])(probes)
        return jnp.sqrt(jnp.mean(jnp.sum(hv**2, -1)))

    return map_data(jax.vmap(one), potential.num_data, chunk_size)


def gradient_norm_weights(
    potential: Potential, data: ModelData, proxy, chunk_size: int = DEFAULT_CHUNK
) -> tuple[np.ndarray, float]:
    """||∇f_i(θ̂)|| (Putcha et al. 2023, Eq. 11, unnormalised) and the data passes it cost
    (0 when the proxy stores ∇f_i(θ̂), else 1)."""
    if proxy.datum_grads is not None:
        return np.asarray(jnp.linalg.norm(proxy.datum_grads, axis=-1), np.float64), 0.0
    out = _gradient_norms(potential, proxy.centre, data, int(chunk_size))
    return np.asarray(out, np.float64), 1.0


def hessian_weights(
    potential: Potential,
    data: ModelData,
    centre: jax.Array,
    scale_tril: Scale,
    chunk_size: int = DEFAULT_CHUNK,
    rng_key: jax.Array | None = None,
) -> np.ndarray:
    """sqrt(tr(H_i Σ̂ H_iᵀ)) = ||H_i L||_F with H_i = ∇²f_i(θ̂) (Putcha et al. 2023, Eq. 16,
    unnormalised): one data pass, memory O(chunk · d²), cost O(N d³) (Appendix D).

    With a structured L, the Hutchinson estimate of the module docstring
    (:data:`STRUCTURED_WEIGHT_PROBES` Rademacher probes from ``rng_key``, default key 0): one
    data pass, memory O(chunk · M · d), no d × d array."""
    d = centre.shape[0]
    if is_structured(scale_tril):
        m = STRUCTURED_WEIGHT_PROBES
        key = jax.random.PRNGKey(0) if rng_key is None else rng_key
        z = jax.random.rademacher(key, (m, d), centre.dtype)
        probes = whiten_matvec(scale_tril, z)
        chunk = max(1, min(int(chunk_size), (2**24) // max(m * d, 1)))
        return np.asarray(_hutchinson_hessian_norms(potential, centre, probes, data, chunk),
                          np.float64)
    chunk = max(1, min(int(chunk_size), (2**24) // max(d * d, 1)))
    return np.asarray(_hessian_norms(potential, centre, scale_tril, data, chunk), np.float64)


def _check_user_weights(weights, num_data: int) -> np.ndarray:
    w = np.asarray(weights, np.float64)
    if w.shape != (num_data,):
        raise ValueError(
            f"weights must be 'approx', 'exact' or an array of length N={num_data}; got shape "
            f"{w.shape}."
        )
    if not np.all(np.isfinite(w)):
        raise ValueError("weights contains non-finite values; pass finite, positive weights.")
    bad = np.flatnonzero(w <= 0)
    if bad.size:
        raise ValueError(
            f"weights must be strictly positive (preferential subsampling needs p_i > 0): "
            f"{bad.size} entries are zero or negative, the first at index {int(bad[0])}. Add a "
            "floor, or use uniform_mix > 0 with computed weights."
        )
    return w


def _check_mix(uniform_mix, default: float) -> float:
    lam = default if uniform_mix is None else float(uniform_mix)
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"uniform_mix must be in [0, 1], got {uniform_mix!r}.")
    return lam


def preferential_probabilities(
    name: str,
    potential: Potential,
    data: ModelData,
    proxy,
    *,
    weights: Any = "approx",
    uniform_mix: float | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    rng_key: jax.Array | None = None,
) -> tuple[np.ndarray, dict]:
    """The static selection law of ``name`` ("preferential": Eq. 11; "cv-preferential":
    Eq. 16, estimated from ``rng_key``'s probes with a structured proxy; or a user array),
    mixed with the uniform law. Returns (p (N,), info)."""
    t0 = time.perf_counter()
    passes = 0.0
    if isinstance(weights, str):
        if weights != "approx":
            raise ValueError(f"weights must be 'approx', 'exact' or an array, got {weights!r}.")
        if proxy is None:
            raise ValueError(
                f"estimator={name!r} needs a proxy (θ̂, Σ̂) to compute its weights; pass "
                "proxy='laplace' or weights=<array of N positive weights>."
            )
        lam = _check_mix(uniform_mix, DEFAULT_UNIFORM_MIX)
        if name == "preferential":
            raw, passes = gradient_norm_weights(potential, data, proxy, chunk_size)
            kind = "eq11-gradient-norm"
        else:
            raw = hessian_weights(potential, data, proxy.centre, proxy_scale(proxy),
                                  chunk_size, rng_key)
            passes = 1.0
            kind = "eq16-hutchinson" if is_structured(proxy) else "eq16-hessian"
        if not np.all(np.isfinite(raw)):
            raise ValueError(
                f"The {kind} weights are not finite for some data; check the data or pass "
                "weights=<array>."
            )
    else:
        raw = _check_user_weights(weights, potential.num_data)
        kind = "user"
        lam = _check_mix(uniform_mix, 0.0)
    if lam == 0.0 and np.any(raw <= 0):
        raise ValueError(
            f"Some {kind} weights are zero and uniform_mix=0: those data could never be drawn. "
            "Use uniform_mix > 0."
        )
    info = {"weights": kind, "uniform_mix": lam, "seconds": time.perf_counter() - t0,
            "data_passes": passes}
    return mix_with_uniform(raw, lam), info


# -- exact (state-dependent) weights, Eq. 10 / Eq. 14 ----------------------------------------------
def _exact_cdf(potential: Potential, theta, data, lam, cv, chunk_size: int) -> jax.Array:
    """The unnormalised CDF of (1 − λ) ||r_i(θ)|| / Σ_l ||r_l(θ)|| + λ/N (Eq. 10 / Eq. 14),
    r_i the (control-variate) residuals at θ: one data pass."""
    N = potential.num_data

    def residual_norms(idx):
        g = _datum_grads(potential, theta, idx, data)
        if cv is not None:
            at_centre = (cv.datum_grads[idx] if cv.datum_grads is not None
                         else _datum_grads(potential, cv.centre, idx, data))
            g = g - at_centre
        return jnp.linalg.norm(g, axis=-1)

    norms = map_data(residual_norms, N, chunk_size)
    total = jnp.sum(norms)
    pw = jnp.where(total > 0, norms / jnp.where(total > 0, total, 1.0), 1.0 / N)
    return jnp.cumsum((1.0 - lam) * pw + lam / N)


@lru_cache(maxsize=64)
def _exact_moments(potential: Potential, n: int, chunk_size: int) -> Callable:
    """Second moments of the state-dependent law at θ: the interval widths of its CDF, as
    the draws of :func:`_exact_estimate` realise them."""

    def design(params, theta, data):
        lam, cv = params
        cdf = _exact_cdf(potential, theta, data, lam, cv, chunk_size)
        probs = jnp.diff(cdf, prepend=jnp.zeros((1,), cdf.dtype)) / cdf[-1]
        return importance_moments(probs, n)

    return design


@lru_cache(maxsize=64)
def _exact_estimate(potential: Potential, n: int, chunk_size: int) -> Callable:
    """The optimal state-dependent law recomputed at every θ: O(N) per step (diagnostics).

    ``params = (λ, control variate or None)``. Draws use a CDF and ``searchsorted`` (the CDF
    is rebuilt at every step anyway); the weights use the interval widths the draws realise,
    so the estimator is unbiased up to data whose probability is below float resolution.
    """
    N = potential.num_data

    def estimate(params, key, theta, data):
        lam, cv = params
        cdf = _exact_cdf(potential, theta, data, lam, cv, chunk_size)
        u = jax.random.uniform(key, (n,), cdf.dtype) * cdf[-1]
        idx = jnp.clip(jnp.searchsorted(cdf, u, side="right"), 0, N - 1)
        lower = jnp.where(idx > 0, cdf[jnp.maximum(idx - 1, 0)], 0.0)
        w = 1.0 / (n * (cdf[idx] - lower) / cdf[-1])
        return weighted_gradient(potential, theta, idx, w, data, cv), jnp.asarray(N + n)

    return estimate


# -- the builders (registered in estimators.registry) ------------------------------------------
def _check_request(name, potential, proxy, replace, weights, uniform_mix) -> None:
    """Cheap checks of a request, before any data pass."""
    if not replace:
        raise ValueError(
            f"estimator={name!r} draws the subsample with replacement (Putcha et al. 2023, "
            "Sect. 3); got replace=False. Pass replace=True."
        )
    if isinstance(weights, str):
        if weights not in ("approx", "exact"):
            raise ValueError(f"weights must be 'approx', 'exact' or an array, got {weights!r}.")
        _check_mix(uniform_mix, DEFAULT_UNIFORM_MIX)
    else:
        _check_user_weights(weights, potential.num_data)
        _check_mix(uniform_mix, 0.0)
    needs_proxy = name == "cv-preferential" or (isinstance(weights, str) and weights == "approx")
    if needs_proxy and proxy is None:
        raise ValueError(
            f"estimator={name!r} needs a proxy (its centre θ̂, Σ̂ and ∇f_i(θ̂)); pass "
            "proxy='laplace' or a Proxy."
        )


def build_preferential(
    potential: Potential, data: ModelData, proxy=None, *,
    subsample_size: int, replace: bool = True, rng_key: jax.Array | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    weights: Any = "approx",
    uniform_mix: float | None = None,
    control_variate: bool = False,
) -> GradientEstimator:
    """SGLD-PS (Putcha et al. 2023, Eq. 8 with the weights of Eq. 11) or, with
    ``control_variate=True``, SGLD-CV-PS (Eq. 12 with the weights of Eq. 16): the Taylor
    control variate at θ̂ and p_i ∝ ||∇²f_i(θ̂) L||_F.

    Parameters
    ----------
    weights
        ``"approx"`` (p_i ∝ ||∇f_i(θ̂)||, Eq. 11, or Eq. 16 with the control variate; default),
        ``"exact"`` (the optimal state-dependent law, Eq. 10 or Eq. 14: one data pass per step,
        for diagnostics) or an array of N positive weights.
    uniform_mix
        λ in p = (1 − λ) p_w + λ/N; default 0.05 for computed weights, 0 for a user array.
    control_variate
        Fixed by the registration: ``False`` for ``"preferential"``, ``True`` for
        ``"cv-preferential"`` (:data:`build_cv_preferential`); not a user option.

    ``info``: the realised law ``probs``, the ``alias_table``, the ``design``, ``weights``,
    ``uniform_mix``, preprocessing ``seconds`` and ``data_passes``.
    """
    name = "cv-preferential" if control_variate else "preferential"
    n = subsample_size
    _check_request(name, potential, proxy, replace, weights, uniform_mix)
    cv = control_variate_from_proxy(proxy) if control_variate else None
    dtype = potential.init_theta.dtype
    if isinstance(weights, str) and weights == "exact":
        lam = _check_mix(uniform_mix, DEFAULT_UNIFORM_MIX)
        info = {"weights": "exact", "uniform_mix": lam, "probs": None, "seconds": 0.0,
                "data_passes": 0.0}
        moments = EstimatorMoments(
            potential=potential, design=_exact_moments(potential, int(n), int(chunk_size)),
            control_variate=pair_control_variate, passes_per_point=1.0,
        )
        return GradientEstimator(
            estimate=_exact_estimate(potential, int(n), int(chunk_size)),
            params=(jnp.asarray(lam, dtype), cv), name=name, subsample_size=int(n),
            num_data=potential.num_data, data_passes=0.0, info=info, moments=moments,
        )
    p, info = preferential_probabilities(
        name, potential, data, proxy, weights=weights, uniform_mix=uniform_mix,
        chunk_size=chunk_size, rng_key=rng_key,
    )
    table = build_alias_table(p)
    design = alias_design(table, n, dtype)
    info.update(probs=table.probs, alias_table=table, design=design)
    return make_estimator(potential, design, cv, name=name, data_passes=info["data_passes"],
                          info=info)


#: SGLD-CV-PS (Putcha et al. 2023, Eq. 12): :func:`build_preferential` with the Taylor
#: control variate; options and ``info`` as there.
build_cv_preferential = partial(build_preferential, control_variate=True)


def analytic_pseudo_variance(
    residuals: np.ndarray, probs: np.ndarray | None, n: int
) -> float:
    """Exact pseudo-variance (Putcha et al. 2023, Eq. 6) of Σ_j h_{i_j}/(n p_{i_j}) for n i.i.d.
    draws: (1/n)[Σ_i ||h_i||²/p_i − ||Σ_i h_i||²] (Appendix A.2). ``residuals`` (N, d) are the
    h_i (∇f_i(θ), or ∇f_i(θ) − ∇f_i(θ̂) with control variates); ``probs=None`` is uniform."""
    h = np.asarray(residuals, np.float64)
    N = h.shape[0]
    p = np.full(N, 1.0 / N) if probs is None else np.asarray(probs, np.float64)
    return float((np.sum(np.sum(h**2, -1) / p) - np.sum(h.sum(0) ** 2)) / n)
