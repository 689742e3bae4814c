"""Stratified (clustering-based) subsampling: CP-SGMCMC of Fu and Zhang (2023).

The N data are partitioned once, in preprocessing, into k strata C_1..C_k by k-means. Each step
draws b_j indices without replacement from stratum j, independently over strata, and the
gradient estimate is Fu and Zhang (2023, Eq. 10),

    ĝ(θ) = ∇f0(θ) + Σ_j (n_j / b_j) Σ_{i∈B_j} ∇f_i(θ),

i.e. a :class:`~numpyro_subsample.estimators.selection.SamplingDesign` with weight n_j/b_j on
the slots of stratum j, plugged into the package's single estimator formula
(:func:`~numpyro_subsample.estimators.base.weighted_gradient`). It is unbiased for any
partition (Lemma 3.3). The batch sizes follow Theorem 3.2, Eq. (14): b_j ∝ n_j·sqrt(v_j), v_j
the mean squared distance of stratum j's features to their centroid (Neyman allocation).

``"cv-stratified"`` applies the same design to the control-variate residuals
∇f_i(θ) − ∇f_i(θ̂) of Baker, Fearnhead, Fox and Nemeth (2019, Eq. 4).

What is clustered (option ``features``):

- ``"stratified"`` default: the whitened per-datum gradients Lᵀ∇f_i(θ̂) at the proxy centre,
  the quantity whose within-stratum spread makes the variance of Eq. (10) (Lemma 3.4), in the
  sampler's whitened coordinates; model agnostic.
- ``"cv-stratified"`` default: the whitened residuals Lᵀ[∇f_i(θ̂ + L u_m) − ∇f_i(θ̂)] at
  ``num_probes`` (default 2) points u_m ~ N(0, I), concatenated (one data pass per probe).
- a user array of shape (N, p), e.g. the covariates x_i as in the paper.

With a structured proxy (:class:`~numpyro_subsample.proxies.structured.StructuredProxy`) L is
applied matrix-free, O(d·k) per datum; the default features are then N × d (``"stratified"``)
or N × num_probes·d (``"cv-stratified"``) numbers, and k-means costs O(N · d) per iteration.

The partition (k-means) and the allocation are :mod:`numpyro_subsample.estimators.strata`.

The batch sizes b_j are static (they fix the shapes of the draw); the compiled draw is cached
by them, while the strata themselves (index order, sizes, weights) are the design's arrays.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, datum_values_and_grads
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.base import (
    GradientEstimator,
    control_variate_from_proxy,
    make_estimator,
)
from numpyro_subsample.estimators.floyd import DRAW_METHODS, draw_positions, resolve_method
from numpyro_subsample.estimators.selection import DesignMoments, SamplingDesign
from numpyro_subsample.estimators.strata import (
    Strata,
    allocate_batch_sizes,
    distinct_rows,
    kmeans_labels,
    make_strata,
)
from numpyro_subsample.proxies.whitening import proxy_scale, whiten_matvec, whiten_rmatvec

__all__ = [
    "Strata",
    "StratifiedParams",
    "kmeans_labels",
    "distinct_rows",
    "allocate_batch_sizes",
    "make_strata",
    "stratified_design",
    "stratified_features",
    "build_stratified",
    "build_cv_stratified",
    "strata_of",
]


class StratifiedParams(NamedTuple):
    """The arrays of a stratified design: ``order`` (N,), ``starts`` and ``sizes`` (k,), and
    the weight n_j / b_j of every slot (n,)."""

    order: jax.Array
    starts: jax.Array
    sizes: jax.Array
    weights: jax.Array


@lru_cache(maxsize=256)
def _stratified_draw(batch_sizes: tuple[int, ...], method: str) -> Callable:
    b = np.asarray(batch_sizes, np.int64)

    def draw(params: StratifiedParams, key: jax.Array):
        pos = draw_positions(key, b, params.sizes, params.starts, method)
        return params.order[pos], params.weights

    return draw


@lru_cache(maxsize=256)
def _stratified_moments(batch_sizes: tuple[int, ...]) -> Callable:
    """Second moments of the design (:class:`~numpyro_subsample.estimators.selection.
    DesignMoments`): b_j of n_j without replacement, weight w_j = n_j/b_j, independently over
    strata, so Cov = Σ_j w_j² b_j (n_j − b_j)/(n_j (n_j − 1)) [Σ_{i∈C_j} h_i h_iᵀ − H_j H_jᵀ/n_j]
    (Fu and Zhang 2023, Lemma 3.4, with the finite-population factor (n_j − b_j)/(n_j − 1) of
    sampling without replacement; 0 for a stratum drawn whole)."""
    b = np.asarray(batch_sizes, np.int64)
    first = np.concatenate([[0], np.cumsum(b)[:-1]])
    k = b.shape[0]

    def moments(params: StratifiedParams) -> DesignMoments:
        dtype = params.weights.dtype
        n_j, b_j = params.sizes.astype(dtype), jnp.asarray(b, dtype)
        w = params.weights[first]
        a = jnp.where(n_j > 1, w * w * b_j * (n_j - b_j) / (n_j * jnp.maximum(n_j - 1, 1)), 0.0)
        N = params.order.shape[0]
        labels = jnp.zeros((N,), jnp.int32).at[params.order].set(
            jnp.repeat(jnp.arange(k, dtype=jnp.int32), params.sizes, total_repeat_length=N)
        )
        return DesignMoments(datum_weight=a[labels], group_weight=a / n_j, labels=labels)

    return jax.jit(moments)


def stratified_design(strata: Strata, dtype=None, draw_method: str = "auto") -> SamplingDesign:
    """The design of Fu and Zhang (2023, Eq. 10): b_j draws without replacement from stratum j,
    weights n_j / b_j; all strata in one draw of static size n = Σ b_j (``draw_method``:
    ``"auto"``, ``"loop"`` or ``"sort"``, see
    :func:`~numpyro_subsample.estimators.floyd.draw_positions`)."""
    dtype = dtype or jnp.result_type(float)
    b = np.asarray(strata.batch_sizes, np.int64)
    sizes = np.asarray(strata.sizes, np.int64)
    method = resolve_method(b, draw_method)
    slot_stratum = np.repeat(np.arange(b.shape[0]), b)
    params = StratifiedParams(
        order=jnp.asarray(strata.order, jnp.int32),
        starts=jnp.asarray(strata.starts, jnp.int32),
        sizes=jnp.asarray(sizes, jnp.int32),
        weights=jnp.asarray((sizes / b)[slot_stratum], dtype),
    )
    b_key = tuple(int(x) for x in b)
    draw = _stratified_draw(b_key, method)
    return SamplingDesign(draw=draw, size=int(b.sum()), num_data=int(sizes.sum()), params=params,
                          moments=_stratified_moments(b_key))


def strata_of(obj: Any) -> Strata | None:
    """The :class:`Strata` of a stratified estimator, or of a kernel's estimator; else None.

    Parameters
    ----------
    obj
        A stratified estimator or a kernel.

    Returns
    -------
    Strata or None
        The partition.

    References
    ----------
    Fu and Zhang (2023), Eq. 10.
    """
    if not isinstance(obj, GradientEstimator):
        obj = getattr(getattr(obj, "preprocessed", None), "estimator", None)
    if not isinstance(obj, GradientEstimator) or not obj.info:
        return None
    return obj.info.get("strata")


# -- features and builders --------------------------------------------------------------------
def stratified_features(
    name: str,
    potential: Potential,
    data: ModelData,
    proxy,
    *,
    num_probes: int = 2,
    seed: int = 0,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[np.ndarray, float]:
    """Default features to cluster (module docstring) as a float32 (N, p) array, and the data
    passes they cost."""
    if proxy is None:
        raise ValueError(
            f"estimator={name!r} clusters the per-datum gradients at a proxy centre by default: "
            "use a proxy (e.g. proxy='laplace'), or pass features=<(N, p) array>."
        )
    tril = proxy_scale(proxy)
    passes = 0.0
    centre_grads = proxy.datum_grads
    if centre_grads is None:
        centre_grads = datum_values_and_grads(potential, proxy.centre, data, chunk_size)[1]
        passes += 1.0
    if name == "stratified":
        return np.asarray(whiten_rmatvec(tril, centre_grads), np.float32), passes
    probes = jax.random.normal(jax.random.PRNGKey(seed), (num_probes, proxy.centre.shape[0]))
    feats = []
    for u in probes:
        theta = proxy.centre + whiten_matvec(tril, u.astype(proxy.centre.dtype))
        grads = datum_values_and_grads(potential, theta, data, chunk_size)[1]
        feats.append(np.asarray(whiten_rmatvec(tril, grads - centre_grads), np.float32))
    return np.concatenate(feats, axis=1), passes + num_probes


def build_stratified(
    potential: Potential, data: ModelData, proxy=None, *,
    subsample_size: int, replace: bool = True, rng_key: jax.Array | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    num_strata: int = 10,
    features: Any = None,
    kmeans_iters: int = 5,
    num_probes: int = 2,
    strata_seed: int = 0,
    draw_method: str = "auto",
    control_variate: bool = False,
) -> GradientEstimator:
    """CP-SGMCMC's estimator (Fu and Zhang 2023, Eq. 10 with the allocation of Eq. 14) or, with
    ``control_variate=True``, the same on the residuals of the Taylor control variate (Baker et
    al. 2019, Eq. 4).

    Parameters
    ----------
    num_strata
        k (default 10, as in the paper).
    features
        An (N, p) array to cluster instead of the default (module docstring).
    kmeans_iters
        Lloyd iterations (early termination, default 5).
    num_probes
        Proxy draws for the ``"cv-stratified"`` default features.
    strata_seed
        Seed of k-means and of the probes.
    draw_method
        ``"auto"``, ``"loop"`` or ``"sort"`` (the within-stratum draw).
    control_variate
        Fixed by the registration: ``False`` for ``"stratified"``, ``True`` for
        ``"cv-stratified"`` (:data:`build_cv_stratified`); not a user option.

    Draws are always without replacement within a stratum (the paper's design; never worse
    than with replacement, same cost), so ``replace`` does not apply. ``info["strata"]`` is the
    :class:`Strata`; ``info["design"]`` the design.
    """
    del replace, rng_key
    t0 = time.perf_counter()
    name = "cv-stratified" if control_variate else "stratified"
    n = int(subsample_size)
    N = potential.num_data
    if not isinstance(num_strata, (int, np.integer)) or num_strata < 1:
        raise ValueError(f"num_strata must be a positive integer, got {num_strata!r}.")
    if num_strata > n:
        raise ValueError(
            f"num_strata={num_strata} exceeds the subsample size {n}: each stratum needs at "
            "least one draw per step. Lower num_strata or raise the plate's subsample_size."
        )
    if draw_method not in DRAW_METHODS:
        raise ValueError(f"draw_method must be one of {DRAW_METHODS}, got {draw_method!r}.")
    if not isinstance(num_probes, (int, np.integer)) or num_probes < 1:
        raise ValueError(f"num_probes must be a positive integer, got {num_probes!r}.")
    if control_variate and proxy is None:
        raise ValueError(f"estimator={name!r} needs a proxy (its centre θ̂ and ∇f_i(θ̂)).")
    if features is None:
        feats, passes = stratified_features(
            name, potential, data, proxy, num_probes=num_probes, seed=strata_seed,
            chunk_size=chunk_size,
        )
        kind = "cv-residuals" if control_variate else "gradients"
    else:
        feats, passes, kind = np.asarray(features), 0.0, "user"
        if feats.ndim == 1:
            feats = feats[:, None]
        if feats.ndim != 2 or feats.shape[0] != N:
            raise ValueError(
                f"features must have shape (N, p) with N={N} (the size of plate "
                f"'{potential.plate.name}'), got {feats.shape}."
            )
    strata = make_strata(feats, int(num_strata), n, kmeans_iters=kmeans_iters, seed=strata_seed)
    design = stratified_design(strata, potential.init_theta.dtype, draw_method)
    cv = control_variate_from_proxy(proxy) if control_variate else None
    info = {"strata": strata, "design": design, "features": kind, "data_passes": passes,
            "seconds": time.perf_counter() - t0}
    return make_estimator(potential, design, cv, name=name, data_passes=passes, info=info)


#: Fu and Zhang (2023, Eq. 10) on the control-variate residuals: :func:`build_stratified` with
#: the Taylor control variate (Baker et al. 2019, Eq. 4); options as there.
build_cv_stratified = partial(build_stratified, control_variate=True)
