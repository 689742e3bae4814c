"""Preferential subsampling (paper 000, Sect. 3): SGLD-PS and SGLD-CV-PS.

The subsample is drawn *with replacement* from a fixed non-uniform law p and every drawn term
is reweighted by 1/(n p_i), so the estimator stays unbiased (Eq. 8 without, Eq. 12 with the
Taylor control variate):

- ``"preferential"`` (SGLD-PS): p_i ∝ ||∇f_i(θ̂)|| (Eq. 11), from the proxy's stored gradients;
- ``"cv-preferential"`` (SGLD-CV-PS): p_i ∝ sqrt(tr(∇²f_i(θ̂) Σ̂ ∇²f_i(θ̂)ᵀ)) = ||∇²f_i(θ̂) L||_F
  with Σ̂ = L Lᵀ (Eq. 16). The per-datum Hessians are streamed: vmapped over a chunk of data,
  ``lax.map`` over chunks, so memory is O(N + chunk · d²) (never N · d²); cost O(N d³)
  (Appendix D), reported in ``estimator.info``.

Both laws are mixed with the uniform one, p = (1 − λ) p_w + λ/N (default λ = 0.05), so that
every datum keeps a positive probability (the papers need p_i > 0) and no importance weight
exceeds N/(λ n); the mixture costs at most a factor 1/(1 − λ) in variance.

Drawing n indices from the fixed law costs O(n) per step with Walker's alias table (built once
on the host); ``weights="exact"`` (Eq. 10 / Eq. 14: the state-dependent optimal law) needs all
N per-datum gradients at every step, i.e. one data pass per step, and is meant for diagnostics
(Fig. 1), not for sampling at scale.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, map_data
from numpyro_subsample.estimators.base import (
    GradientEstimator,
    control_variate_from_proxy,
    make_estimator,
    weighted_gradient,
)
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.estimators.selection import SamplingDesign

__all__ = [
    "DEFAULT_UNIFORM_MIX",
    "AliasTable",
    "build_alias_table",
    "alias_draw",
    "alias_design",
    "mix_with_uniform",
    "gradient_norm_weights",
    "hessian_weights",
    "preferential_probabilities",
    "PreferentialEstimator",
    "configure_preferential",
    "analytic_pseudo_variance",
]

DEFAULT_UNIFORM_MIX = 0.05


class PreferentialEstimator(GradientEstimator):
    """A :class:`GradientEstimator` that also carries ``info`` (a dict, set after construction):
    the selection probabilities ``probs`` (N,), preprocessing ``seconds`` and ``data_passes``,
    and the options used. (A subclass without ``__slots__``, so it has a ``__dict__``.)"""


def _with_info(est: GradientEstimator, info: dict) -> PreferentialEstimator:
    out = PreferentialEstimator(*est)
    out.info = info
    return out


# -- O(n) draws from a fixed law: Walker's alias table ------------------------------------------
class AliasTable(NamedTuple):
    """Alias table (Walker 1977, Vose 1991) of a law on {0..N−1}.

    ``threshold[j]``: probability of keeping column j (else take ``alias[j]``);
    ``probs``: the law the table *realises*, recomputed from the stored float32 thresholds so
    the importance weights 1/(n p_i) match the draws exactly.
    """

    threshold: jax.Array
    alias: jax.Array
    probs: jax.Array


def build_alias_table(p: np.ndarray) -> AliasTable:
    """Vose's O(N) construction, in NumPy on the host (once per data set).

    Written by hand because neither JAX nor NumPyro provides one; an alias table (not a
    float32 CDF + searchsorted) because a float32 CDF cannot resolve probabilities below
    ~1e-7 of the total, which at N ~ 10^6 would silently drop or double data and bias the
    estimator, while here the realised law is recomputed exactly from the table.
    """
    p = np.asarray(p, np.float64)
    N = p.shape[0]
    if p.ndim != 1 or N == 0 or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError("The selection weights must be a non-empty, finite, non-negative vector.")
    scaled = p * (N / p.sum())
    threshold = np.ones(N)
    alias = np.arange(N)
    small = list(np.flatnonzero(scaled < 1.0))
    large = list(np.flatnonzero(scaled >= 1.0))
    while small and large:
        s, g = small.pop(), large.pop()
        threshold[s] = scaled[s]
        alias[s] = g
        scaled[g] = (scaled[g] + scaled[s]) - 1.0
        (small if scaled[g] < 1.0 else large).append(g)
    # leftovers are 1 up to round-off
    thr32 = threshold.astype(np.float32)
    realised = thr32.astype(np.float64).copy()
    np.add.at(realised, alias, 1.0 - thr32.astype(np.float64))
    realised /= N
    return AliasTable(
        jnp.asarray(thr32), jnp.asarray(alias, jnp.int32), jnp.asarray(realised, jnp.float32)
    )


def alias_draw(table: AliasTable, key: jax.Array, n: int) -> jax.Array:
    """n i.i.d. indices from the table's law, O(n): a uniform column, then keep or alias."""
    N = table.threshold.shape[0]
    k_col, k_u = jax.random.split(key)
    col = jax.random.randint(k_col, (n,), 0, N)
    u = jax.random.uniform(k_u, (n,), jnp.float32)
    return jnp.where(u < table.threshold[col], col, table.alias[col])


def alias_design(table: AliasTable, n: int, dtype=None) -> SamplingDesign:
    """With-replacement design from an alias table, weights 1/(n p_i) (paper 000 Eq. 8)."""
    dtype = dtype or jnp.result_type(float)
    num_data = int(table.threshold.shape[0])

    def draw(key):
        idx = alias_draw(table, key, n)
        return idx, (1.0 / (n * table.probs[idx])).astype(dtype)

    return SamplingDesign(draw, n, num_data)


# -- the weights --------------------------------------------------------------------------------
def mix_with_uniform(p: np.ndarray, uniform_mix: float) -> np.ndarray:
    """p = (1 − λ) p_w / Σp_w + λ/N; an all-zero p_w gives the uniform law."""
    p = np.asarray(p, np.float64)
    N = p.shape[0]
    total = p.sum()
    if not total > 0:
        return np.full(N, 1.0 / N)
    return (1.0 - uniform_mix) * p / total + uniform_mix / N


def gradient_norm_weights(
    potential: Potential, proxy, chunk_size: int = DEFAULT_CHUNK
) -> tuple[np.ndarray, float]:
    """||∇f_i(θ̂)|| (paper 000 Eq. 11, unnormalised) and the data passes it cost (0 if stored)."""
    if proxy.datum_grads is not None:
        return np.asarray(jnp.linalg.norm(proxy.datum_grads, axis=-1), np.float64), 0.0

    def norms(idx):
        g = jax.vmap(lambda i: jax.grad(lambda t: potential.data_terms(t, i[None])[0])(
            proxy.centre))(idx)
        return jnp.linalg.norm(g, axis=-1)

    out = jax.jit(lambda: map_data(norms, potential.num_data, chunk_size))()
    return np.asarray(out, np.float64), 1.0


def hessian_weights(
    potential: Potential, centre: jax.Array, scale_tril: jax.Array,
    chunk_size: int = DEFAULT_CHUNK,
) -> np.ndarray:
    """sqrt(tr(H_i Σ̂ H_iᵀ)) = ||H_i L||_F with H_i = ∇²f_i(θ̂) (paper 000 Eq. 16, unnormalised).

    Per-datum Hessians by autodiff, vmapped over a chunk and ``lax.map``-ed over chunks:
    memory O(chunk · d²), one data pass, cost O(N d³) (Appendix D).
    """
    d = centre.shape[0]
    chunk = max(1, min(int(chunk_size), max(1, (2**24) // max(d * d, 1))))

    def one(i):
        h = jax.hessian(lambda t: potential.data_terms(t, i[None])[0])(centre)
        return jnp.sqrt(jnp.sum((h @ scale_tril) ** 2))

    out = jax.jit(lambda: map_data(jax.vmap(one), potential.num_data, chunk))()
    return np.asarray(out, np.float64)


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
            f"weights must be strictly positive (paper 000 needs p_i > 0): {bad.size} entries "
            f"are zero or negative, the first at index {int(bad[0])}. Add a floor, or use "
            "uniform_mix > 0 with computed weights."
        )
    return w


def preferential_probabilities(
    name: str,
    potential: Potential,
    proxy,
    *,
    weights: Any = "approx",
    uniform_mix: float | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[np.ndarray, dict]:
    """The static selection law of ``name`` ("preferential": Eq. 11; "cv-preferential": Eq. 16;
    or a user array), mixed with the uniform law. Returns (p (N,), info)."""
    t0 = time.perf_counter()
    N = potential.num_data
    passes = 0.0
    if isinstance(weights, str):
        if weights != "approx":
            raise ValueError(f"weights must be 'approx', 'exact' or an array, got {weights!r}.")
        if proxy is None:
            raise ValueError(f"estimator={name!r} needs a proxy (θ̂, Σ̂) to compute its weights.")
        if name == "preferential":
            raw, passes = gradient_norm_weights(potential, proxy, chunk_size)
            kind = "eq11-gradient-norm"
        else:
            raw = hessian_weights(potential, proxy.centre, proxy.scale_tril, chunk_size)
            passes = 1.0
            kind = "eq16-hessian"
        if not np.all(np.isfinite(raw)):
            raise ValueError(
                f"The {kind} weights are not finite for some data; check the data or pass "
                "weights=<array>."
            )
        lam = DEFAULT_UNIFORM_MIX if uniform_mix is None else float(uniform_mix)
    else:
        raw = _check_user_weights(weights, N)
        kind = "user"
        lam = 0.0 if uniform_mix is None else float(uniform_mix)
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"uniform_mix must be in [0, 1], got {uniform_mix}.")
    if lam == 0.0 and np.any(raw <= 0):
        raise ValueError(
            f"Some {kind} weights are zero and uniform_mix=0: those data could never be drawn. "
            "Use uniform_mix > 0."
        )
    p = mix_with_uniform(raw, lam)
    info = {
        "weights": kind, "uniform_mix": lam, "seconds": time.perf_counter() - t0,
        "data_passes": passes,
    }
    return p, info


# -- exact (state-dependent) weights, Eq. 10 / Eq. 14 ----------------------------------------------
def _exact_estimator(
    name: str, potential: Potential, proxy, n: int, uniform_mix: float, chunk_size: int
) -> GradientEstimator:
    """Optimal state-dependent law recomputed at every θ: O(N) per step (diagnostics only).

    Draws use a float32 CDF + searchsorted (the CDF must be rebuilt anyway); the weights use
    the interval widths the draws actually realise, so the estimator is unbiased up to data
    whose probability is below float32 resolution.
    """
    N = potential.num_data
    cv = control_variate_from_proxy(proxy) if name == "cv-preferential" else None
    design = SamplingDesign(None, n, N)  # the law depends on θ; no static draw

    def per_datum_norms(theta):
        def chunk(idx):
            g = jax.vmap(lambda i: jax.grad(lambda t: potential.data_terms(t, i[None])[0])(
                theta))(idx)
            if cv is not None:
                if cv.datum_grads is not None:
                    g = g - cv.datum_grads[idx]
                else:
                    g = g - jax.vmap(lambda i: jax.grad(
                        lambda t: potential.data_terms(t, i[None])[0])(cv.centre))(idx)
            return jnp.linalg.norm(g, axis=-1)

        return map_data(chunk, N, chunk_size)

    def estimate(key, theta):
        norms = per_datum_norms(theta)
        total = jnp.sum(norms)
        pw = jnp.where(total > 0, norms / jnp.where(total > 0, total, 1.0), 1.0 / N)
        p = (1.0 - uniform_mix) * pw + uniform_mix / N
        cdf = jnp.cumsum(p)
        u = jax.random.uniform(key, (n,), cdf.dtype) * cdf[-1]
        idx = jnp.clip(jnp.searchsorted(cdf, u, side="right"), 0, N - 1)
        lower = jnp.where(idx > 0, cdf[jnp.maximum(idx - 1, 0)], 0.0)
        realised = (cdf[idx] - lower) / cdf[-1]
        w = 1.0 / (n * realised)
        return weighted_gradient(potential, theta, idx, w, cv), jnp.asarray(N + n)

    return GradientEstimator(estimate, design, cv)


# -- entry point used by estimators.configure_estimator ----------------------------------------
def configure_preferential(
    name: str,
    potential: Potential,
    proxy,
    n: int,
    replace: bool = True,
    *,
    weights: Any = "approx",
    uniform_mix: float | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    adaptive: bool = False,
    **options: Any,
) -> GradientEstimator:
    """Build ``"preferential"`` (SGLD-PS, Eq. 8 + Eq. 11) or ``"cv-preferential"``
    (SGLD-CV-PS, Eq. 12 + Eq. 16).

    :param weights: ``"approx"`` (the static weights of Eq. 11 / Eq. 16, default),
        ``"exact"`` (the optimal state-dependent weights Eq. 10 / Eq. 14, recomputed at each
        step: one data pass per step, for diagnostics), or an array of N positive weights.
    :param uniform_mix: λ in p = (1 − λ) p_w + λ/N; default 0.05 for computed weights, 0 for a
        user array.
    :param adaptive: ``"cv-preferential"`` only: choose n per step by Eq. 19 (ASGLD-CV-PS); see
        :func:`numpyro_subsample.adaptive.configure_adaptive` for its options.
    """
    if name not in ("preferential", "cv-preferential"):
        raise ValueError(f"configure_preferential does not build {name!r}.")
    if not replace:
        raise ValueError(
            f"estimator={name!r} draws the subsample with replacement (paper 000 Sect. 3); "
            "pass replace=True."
        )
    if proxy is None:
        raise ValueError(f"estimator={name!r} needs a proxy (its centre θ̂, Σ̂ and ∇f_i(θ̂)).")
    if adaptive:
        if name != "cv-preferential":
            raise ValueError(
                "adaptive=True needs a control variate (paper 000 Eq. 18-19): use "
                "estimator='cv-preferential' or 'cv'."
            )
        if isinstance(weights, str) and weights == "exact":
            raise ValueError("adaptive=True works with static weights; drop weights='exact'.")
        from numpyro_subsample.estimators.adaptive import configure_adaptive

        return configure_adaptive(
            name, potential, proxy, n, replace, weights=weights, uniform_mix=uniform_mix,
            chunk_size=chunk_size, **options,
        )
    if options:
        raise ValueError(f"Unknown option(s) {sorted(options)} for estimator {name!r}.")
    dtype = potential.init_theta.dtype
    if isinstance(weights, str) and weights == "exact":
        lam = DEFAULT_UNIFORM_MIX if uniform_mix is None else float(uniform_mix)
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"uniform_mix must be in [0, 1], got {uniform_mix}.")
        est = _exact_estimator(name, potential, proxy, n, lam, chunk_size)
        return _with_info(est, {"weights": "exact", "uniform_mix": lam, "probs": None,
                                "seconds": 0.0, "data_passes": 0.0})
    p, info = preferential_probabilities(
        name, potential, proxy, weights=weights, uniform_mix=uniform_mix, chunk_size=chunk_size
    )
    table = build_alias_table(p)
    cv = control_variate_from_proxy(proxy) if name == "cv-preferential" else None
    est = make_estimator(potential, alias_design(table, n, dtype), cv)
    info["probs"] = table.probs
    info["alias_table"] = table
    return _with_info(est, info)


def analytic_pseudo_variance(
    residuals: np.ndarray, probs: np.ndarray | None, n: int
) -> float:
    """Exact pseudo-variance (paper 000 Eq. 6) of Σ_j h_{i_j}/(n p_{i_j}) for n i.i.d. draws:
    (1/n)[Σ_i ||h_i||²/p_i − ||Σ_i h_i||²] (Appendix A.2). ``residuals`` (N, d) are the h_i
    (∇f_i(θ), or ∇f_i(θ) − ∇f_i(θ̂) with control variates); ``probs=None`` means uniform."""
    h = np.asarray(residuals, np.float64)
    N = h.shape[0]
    p = np.full(N, 1.0 / N) if probs is None else np.asarray(probs, np.float64)
    return float((np.sum(np.sum(h**2, -1) / p) - np.sum(h.sum(0) ** 2)) / n)

