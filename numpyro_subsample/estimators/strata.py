"""The strata of stratified subsampling (Fu and Zhang 2023): a k-means partition of the N
data by their features and the Neyman allocation of the subsample over the strata (Eq. 14),
b_j ∝ n_j·sqrt(v_j), v_j the mean squared distance of stratum j's features to their centroid.

k-means is scikit-learn's ``KMeans`` (k-means++ seeding, one initialisation) stopped after
``kmeans_iters`` Lloyd iterations (early termination, Fu and Zhang 2023, Sect. 4.1), run on
the distinct feature rows weighted by their multiplicities (rows with at most k distinct
values are their own strata): it runs once per data set and compiles nothing. The design
that draws from the strata is :mod:`numpyro_subsample.estimators.stratified`.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

__all__ = ["Strata", "kmeans_labels", "distinct_rows", "allocate_batch_sizes", "make_strata"]


class Strata(NamedTuple):
    """A partition of the plate indices and the per-stratum batch sizes (host arrays).

    ``order``: plate indices sorted by stratum; stratum j occupies
    ``order[starts[j] : starts[j] + sizes[j]]``. ``batch_sizes`` b_j (sum n), ``spreads`` v_j
    of Eq. (14), ``seconds`` the k-means wall time, ``inertia`` its within-cluster sum of
    squares.

    Parameters
    ----------
    labels, order, starts, sizes, batch_sizes, spreads, seconds, inertia
        As above; ``labels`` the stratum of each datum.

    References
    ----------
    Fu and Zhang (2023), Eq. 10, 14.
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
    """k-means++ seeding + ``kmeans_iters`` Lloyd iterations (scikit-learn, early termination)
    of the distinct rows of ``features``, each weighted by its multiplicity: rows that fall
    into at most ``num_strata`` distinct values (categorical data) give one stratum per value,
    with no k-means and no within-stratum spread.

    Returns (labels (N,), wall seconds, inertia).
    """
    t0 = time.perf_counter()
    distinct, inverse, counts = np.unique(features, axis=0, return_inverse=True,
                                          return_counts=True)
    inverse = np.reshape(inverse, -1)
    if distinct.shape[0] <= num_strata:
        return inverse.astype(np.int64), time.perf_counter() - t0, 0.0
    from sklearn.cluster import KMeans

    km = KMeans(
        n_clusters=num_strata, init="k-means++", n_init=1, max_iter=int(kmeans_iters),
        random_state=int(seed),
    )
    km.fit(distinct, sample_weight=counts)
    labels = km.labels_[inverse]
    return labels.astype(np.int64), time.perf_counter() - t0, float(km.inertia_)


def distinct_rows(features: np.ndarray) -> int:
    """The number of distinct rows of the (N, p) ``features``."""
    features = np.asarray(features)
    return int(np.unique(features.reshape(features.shape[0], -1), axis=0).shape[0])


def allocate_batch_sizes(sizes: np.ndarray, spreads: np.ndarray, n: int) -> np.ndarray:
    """Integer b_j ≈ n·n_j√v_j / Σ n_l√v_l (Fu and Zhang 2023, Eq. 14), Σ b_j = n, 1 ≤ b_j ≤ n_j.

    First the continuous allocation with the bounds, t_j = clip(c·n_j√v_j, 1, n_j), with c
    found by bisection so that Σ t_j = n (the bounded optimum of Eq. 13, "water filling");
    then b_j = ⌊t_j⌋ and the remaining units go, one each, to the strata with the largest
    fractional parts that are below n_j (largest-remainder rounding). If every v_j is 0 the
    allocation is proportional (b_j ∝ n_j).
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
    b = np.clip(np.floor(t).astype(np.int64), 1, sizes)
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
    _, labels = np.unique(labels, return_inverse=True)  # drop empty clusters, relabel 0..k-1
    k = int(labels.max()) + 1
    sizes = np.bincount(labels, minlength=k)
    f64 = features.astype(np.float64)
    sums = np.zeros((k, f64.shape[1]))
    np.add.at(sums, labels, f64)
    sq = np.sum((f64 - (sums / sizes[:, None])[labels]) ** 2, axis=1)
    spreads = np.bincount(labels, weights=sq, minlength=k) / sizes  # v_j of Eq. (14)
    batch = allocate_batch_sizes(sizes, spreads, int(subsample_size))
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return Strata(labels=labels, order=order, starts=starts, sizes=sizes, batch_sizes=batch,
                  spreads=spreads, seconds=secs, inertia=inertia)
