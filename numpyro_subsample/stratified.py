"""Stratified (clustering-based) subsampling: CP-SGMCMC of paper 001 (Fu & Zhang).

The N data are partitioned once, in preprocessing, into k strata C_1..C_k by k-means. Each step
draws b_j indices without replacement from stratum j, independently over strata, and the
gradient estimate is paper 001 Eq. (10),

    ĝ(θ) = ∇f0(θ) + Σ_j (n_j / b_j) Σ_{i∈B_j} ∇f_i(θ),

i.e. a :class:`~numpyro_subsample.selection.SamplingDesign` with weight n_j/b_j on the slots of
stratum j, plugged into the package's single estimator formula
(:func:`~numpyro_subsample.estimators.weighted_gradient`). It is unbiased for any partition
(paper 001 Lemma 3.3). The batch sizes follow Theorem 3.2, Eq. (14): b_j ∝ n_j·sqrt(v_j), v_j
the mean squared distance of stratum j's features to their centroid (Neyman allocation).

``"cv-stratified"`` (not in the paper) applies the same design to the control-variate
residuals ∇f_i(θ) − ∇f_i(θ̂) of paper 002 Eq. (4).

What is clustered (option ``features``):

- ``"stratified"`` default: the whitened per-datum gradients Lᵀ∇f_i(θ̂) at the proxy centre
  (``proxy.datum_grads``), the quantity whose within-stratum spread the variance of Eq. (10)
  (Lemma 3.4) is made of, measured in the sampler's whitened coordinates; model agnostic.
- ``"cv-stratified"`` default: the whitened residuals Lᵀ[∇f_i(θ̂ + L u_m) − ∇f_i(θ̂)] at
  ``num_probes`` (default 2) points u_m ~ N(0, I) of the proxy, concatenated; these are the
  terms whose spread the cv-stratified variance is made of (one data pass per probe).
- a user array of shape (N, p), e.g. the covariates x_i as in the paper.

k-means implementation (measured, 2-core CPU, N = 10^6, k = 10, 5 Lloyd iterations from
k-means++ seeding): scikit-learn ``KMeans(n_init=1)`` 0.8 s (d = 5) / 1.3-2.3 s (d = 20);
a jitted JAX Lloyd with k-means++ seeding 0.7 s / 1.1 s once compiled but 4.6 s cold (compile
for each new data shape, and k-means runs once per data set, so cold is what users pay);
``MiniBatchKMeans`` 4-6 s. scikit-learn's ``KMeans`` is therefore used (the field's library,
multithreaded Lloyd, and no compile). Early termination (paper 001 Sect. 4.1): ``max_iter =
kmeans_iters`` (default 5) Lloyd iterations.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .estimators import GradientEstimator, control_variate_from_proxy, make_estimator
from .potential import Potential
from .selection import SamplingDesign

__all__ = [
    "Strata",
    "kmeans_labels",
    "allocate_batch_sizes",
    "make_strata",
    "stratified_design",
    "stratified_features",
    "configure_stratified",
    "strata_of",
]


class Strata(NamedTuple):
    """A partition of the plate indices and the per-stratum batch sizes.

    ``order``: plate indices sorted by stratum; stratum j occupies
    ``order[starts[j] : starts[j] + sizes[j]]``. ``batch_sizes`` b_j (sum n), ``spreads`` v_j
    of Eq. (14), ``seconds`` the k-means wall time, ``inertia`` its within-cluster sum of
    squares.
    """

    labels: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray
    batch_sizes: np.ndarray
    spreads: np.ndarray
    seconds: float
    inertia: float


def kmeans_labels(
    features: np.ndarray, num_strata: int, *, kmeans_iters: int = 5, seed: int = 0
) -> tuple[np.ndarray, float, float]:
    """k-means++ seeding + ``kmeans_iters`` Lloyd iterations (scikit-learn, early termination).

    Returns (labels (N,), wall seconds, inertia).
    """
    from sklearn.cluster import KMeans

    t0 = time.perf_counter()
    km = KMeans(
        n_clusters=num_strata, init="k-means++", n_init=1, max_iter=int(kmeans_iters),
        random_state=int(seed),
    )
    labels = km.fit_predict(features)
    return labels.astype(np.int64), time.perf_counter() - t0, float(km.inertia_)


def allocate_batch_sizes(sizes: np.ndarray, spreads: np.ndarray, n: int) -> np.ndarray:
    """Integer b_j ≈ n·n_j√v_j / Σ n_l√v_l (paper 001 Eq. 14) with Σ b_j = n, 1 ≤ b_j ≤ n_j.

    Rounding: first the continuous allocation with the bounds, t_j = clip(c·n_j√v_j, 1, n_j),
    with c found by bisection so that Σ t_j = n (the bounded optimum of Eq. 13, "water
    filling"); then b_j = ⌊t_j⌋ and the remaining units go, one each, to the strata with the
    largest fractional parts t_j − ⌊t_j⌋ that are below n_j (largest-remainder rounding).
    If every v_j is 0 the allocation is proportional (b_j ∝ n_j).
    """
    sizes = np.asarray(sizes, np.int64)
    k = sizes.shape[0]
    if n < k:
        raise ValueError(
            f"The subsample size {n} is smaller than the number of non-empty strata {k}: "
            "each stratum needs at least one draw. Lower num_strata or raise subsample_size."
        )
    if n > sizes.sum():
        raise ValueError(f"Subsample size {n} exceeds the number of data {int(sizes.sum())}.")
    a = sizes * np.sqrt(np.maximum(np.asarray(spreads, np.float64), 0.0))
    if not np.any(a > 0):
        a = sizes.astype(np.float64)
    a = np.where(a > 0, a, 0.0)

    def total(c):
        return np.clip(c * a, 1, sizes).sum()

    lo, hi = 0.0, 1.0
    while total(hi) < n and hi < 1e300:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total(mid) < n else (lo, mid)
    t = np.clip(hi * a, 1, sizes)
    b = np.floor(t).astype(np.int64)
    b = np.clip(b, 1, sizes)
    frac = t - np.floor(t)
    while b.sum() > n:  # bisection overshoot by rounding: take from the smallest fractions
        j = np.argmin(np.where(b > 1, frac, np.inf))
        b[j] -= 1
        frac[j] = np.inf
    order = np.argsort(-frac, kind="stable")
    i = 0
    while b.sum() < n:
        j = order[i % k]
        if b[j] < sizes[j]:
            b[j] += 1
        i += 1
    return b


def make_strata(
    features: np.ndarray,
    num_strata: int,
    subsample_size: int,
    *,
    kmeans_iters: int = 5,
    seed: int = 0,
) -> Strata:
    """Cluster ``features`` (N, p) and allocate ``subsample_size`` draws over the strata."""
    features = np.asarray(features)
    if features.ndim == 1:
        features = features[:, None]
    N = features.shape[0]
    if not (isinstance(num_strata, (int, np.integer)) and 1 <= num_strata <= N):
        raise ValueError(f"num_strata must be an integer in [1, N={N}], got {num_strata!r}.")
    if not np.all(np.isfinite(features)):
        raise ValueError("The stratification features contain NaN or inf; pass finite features.")
    if num_strata == 1:
        labels, secs, inertia = np.zeros(N, np.int64), 0.0, float("nan")
    else:
        labels, secs, inertia = kmeans_labels(
            features, num_strata, kmeans_iters=kmeans_iters, seed=seed
        )
    # drop empty clusters, relabel 0..k-1
    _, labels = np.unique(labels, return_inverse=True)
    k = int(labels.max()) + 1
    sizes = np.bincount(labels, minlength=k)
    f64 = features.astype(np.float64)
    sums = np.zeros((k, f64.shape[1]))
    np.add.at(sums, labels, f64)
    cents = sums / sizes[:, None]
    sq = np.sum((f64 - cents[labels]) ** 2, axis=1)
    spreads = np.bincount(labels, weights=sq, minlength=k) / sizes  # v_j of Eq. (14)
    batch = allocate_batch_sizes(sizes, spreads, int(subsample_size))
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return Strata(labels, order, starts, sizes, batch, spreads, secs, inertia)


def _redraw_until_distinct(key, randpos, duplicated):
    """Draw all slots, then redraw every slot that repeats an earlier one until none does."""

    def body(carry):
        key, pos, dup = carry
        key, sub = jax.random.split(key)
        pos = jnp.where(dup, randpos(sub), pos)
        return key, pos, duplicated(pos)

    key, sub = jax.random.split(key)
    pos = randpos(sub)
    _, pos, _ = jax.lax.while_loop(lambda c: jnp.any(c[2]), body, (key, pos, duplicated(pos)))
    return pos


# Above this many pairwise comparisons per round (k · b_max²) duplicates are found by a sort.
_DENSE_LIMIT = 65_536


def _draw_positions(key, b, sizes, starts):
    """Positions in the stratum-sorted index array: b_j distinct ones per stratum j, as a
    flat (Σ b_j,) array, stratum by stratum.

    Written by hand because :func:`~numpyro_subsample.selection.sample_without_replacement`
    draws from one population; here stratum j has its own range [start_j, start_j + n_j).
    Same method: draw every slot uniformly in its stratum, then redraw every slot whose value
    repeats an earlier slot's of the same stratum (keeping the first) until all are distinct.
    Within a stratum the procedure commutes with relabelling, so it gives a uniform
    b_j-subset, independently over strata. Strata with b_j = n_j take all their positions.
    Repeats are found by comparing the slots of each stratum pairwise on a padded (k, b_max)
    array (O(k·b_max²) vector work per round, no sort: ~20x faster than a sort for the
    paper's sizes), or by one sort of the n slots when that would be large; either way each
    round is independent of N, never an O(N) permutation.
    """
    b = np.asarray(b, np.int64)
    k, b_max = b.shape[0], int(b.max())
    full = b == sizes
    if k * b_max * b_max <= _DENSE_LIMIT:
        valid = np.arange(b_max)[None, :] < b[:, None]
        pop = jnp.asarray(np.where(valid, sizes[:, None], 1), jnp.int32)
        offset = jnp.asarray(np.broadcast_to(np.arange(b_max), (k, b_max)), jnp.int32)
        fixed = jnp.asarray(full[:, None] | ~valid)
        earlier = jnp.asarray(np.tril(np.ones((b_max, b_max), bool), -1))
        flat = np.flatnonzero(valid.ravel())

        def randpos(kk):
            return jnp.where(fixed, offset, jax.random.randint(kk, (k, b_max), 0, pop))

        def duplicated(r):  # padding and whole strata are fixed and never repeat
            same = (r[:, :, None] == r[:, None, :]) & earlier  # [j, s, l]: slot l < s equal
            return jnp.any(same, axis=-1) & ~fixed

        r = _redraw_until_distinct(key, randpos, duplicated)
        return (jnp.asarray(starts, jnp.int32)[:, None] + r).reshape(-1)[flat]

    slot = np.repeat(np.arange(k), b)
    n = slot.shape[0]
    slot_start = jnp.asarray(starts[slot], jnp.int32)
    slot_pop = jnp.asarray(sizes[slot], jnp.int32)
    slot_full = jnp.asarray(full[slot])
    slot_offset = jnp.asarray(np.concatenate([np.arange(bj) for bj in b]), jnp.int32)

    def randpos_flat(kk):
        r = jax.random.randint(kk, (n,), 0, slot_pop)
        return slot_start + jnp.where(slot_full, slot_offset, r)

    def duplicated_flat(pos):  # ranges of strata are disjoint: repeats are within a stratum
        order = jnp.argsort(pos, stable=True)
        srt = pos[order]
        dup_sorted = jnp.concatenate([jnp.zeros((1,), bool), srt[1:] == srt[:-1]])
        return jnp.zeros((n,), bool).at[order].set(dup_sorted)

    return _redraw_until_distinct(key, randpos_flat, duplicated_flat)


def stratified_design(strata: Strata, dtype=None) -> SamplingDesign:
    """The design of paper 001 Eq. (10): b_j draws without replacement from stratum j,
    weights n_j / b_j. All strata in one vectorised draw of static size n = Σ b_j."""
    dtype = dtype or jnp.result_type(float)
    b = np.asarray(strata.batch_sizes, np.int64)
    sizes = np.asarray(strata.sizes, np.int64)
    starts = np.asarray(strata.starts, np.int64)
    slot_stratum = np.repeat(np.arange(b.shape[0]), b)
    weights = jnp.asarray((sizes / b)[slot_stratum], dtype)
    order = jnp.asarray(strata.order, jnp.int32)

    def draw(key):
        pos = _draw_positions(key, b, sizes, starts)
        return order[pos], weights

    draw.strata = strata  # read by strata_of()
    return SamplingDesign(draw, int(b.sum()), int(sizes.sum()))


def strata_of(obj: Any) -> Strata | None:
    """The :class:`Strata` behind a stratified design or estimator (or a kernel's), else None."""
    if hasattr(obj, "preprocessed"):
        obj = obj.preprocessed.estimator
    if isinstance(obj, GradientEstimator):
        obj = obj.design
    return getattr(getattr(obj, "draw", None), "strata", None)


def stratified_features(
    name: str,
    potential: Potential,
    proxy,
    *,
    num_probes: int = 2,
    seed: int = 0,
    chunk_size: int = 2048,
) -> np.ndarray:
    """Default features to cluster (module docstring), as a float32 (N, p) array."""
    from .datapass import datum_values_and_grads

    if proxy is None:
        raise ValueError(
            f"estimator={name!r} clusters the per-datum gradients at a proxy centre by default: "
            "use a proxy (e.g. proxy='laplace'), or pass features=<(N, p) array>."
        )
    tril = proxy.scale_tril
    grads_at = jax.jit(lambda t: datum_values_and_grads(potential, t, chunk_size)[1])
    centre_grads = proxy.datum_grads
    if centre_grads is None:
        centre_grads = grads_at(proxy.centre)
    if name == "stratified":
        return np.asarray(centre_grads @ tril, np.float32)
    probes = jax.random.normal(jax.random.PRNGKey(seed), (num_probes, proxy.centre.shape[0]))
    feats = [
        np.asarray((grads_at(proxy.centre + tril @ u.astype(tril.dtype)) - centre_grads) @ tril,
                   np.float32)
        for u in probes
    ]
    return np.concatenate(feats, axis=1)


def configure_stratified(
    name: str,
    potential: Potential,
    proxy,
    n: int,
    replace: bool = True,
    *,
    num_strata: int = 10,
    features: Any = None,
    kmeans_iters: int = 5,
    num_probes: int = 2,
    strata_seed: int = 0,
) -> GradientEstimator:
    """``"stratified"`` (paper 001 Eq. 10, 14) or ``"cv-stratified"`` (Eq. 10 on the residuals
    of the Taylor control variate, paper 002 Eq. 4).

    Options (kernel keyword arguments): ``num_strata`` k (default 10, as in the paper);
    ``features`` an (N, p) array to cluster instead of the default (module docstring);
    ``kmeans_iters`` Lloyd iterations (early termination, default 5); ``num_probes`` proxy
    draws for the cv-stratified default features; ``strata_seed``.

    Draws are always without replacement within a stratum (the paper's design; it is never
    worse than with replacement and costs the same), so ``replace`` does not apply here.
    """
    del replace
    N = potential.num_data
    if name not in ("stratified", "cv-stratified"):
        raise ValueError(f"configure_stratified got estimator {name!r}.")
    if not isinstance(num_strata, (int, np.integer)) or num_strata < 1:
        raise ValueError(f"num_strata must be a positive integer, got {num_strata!r}.")
    if num_strata > n:
        raise ValueError(
            f"num_strata={num_strata} exceeds the subsample size {n}: each stratum needs at "
            "least one draw per step. Lower num_strata or raise the plate's subsample_size."
        )
    if features is None:
        feats = stratified_features(name, potential, proxy, num_probes=num_probes,
                                    seed=strata_seed)
    else:
        feats = np.asarray(features)
        if feats.ndim == 1:
            feats = feats[:, None]
        if feats.ndim != 2 or feats.shape[0] != N:
            raise ValueError(
                f"features must have shape (N, p) with N={N} (the size of plate "
                f"'{potential.plate.name}'), got {feats.shape}."
            )
    strata = make_strata(feats, int(num_strata), n, kmeans_iters=kmeans_iters, seed=strata_seed)
    design = stratified_design(strata, potential.init_theta.dtype)
    cv = None
    if name == "cv-stratified":
        if proxy is None:
            raise ValueError(f"estimator={name!r} needs a proxy (its centre θ̂ and ∇f_i(θ̂)).")
        cv = control_variate_from_proxy(proxy)
    return make_estimator(potential, design, cv)
