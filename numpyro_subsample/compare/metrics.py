"""Accuracy and efficiency of a run against the NUTS reference.

- errors in posterior-sd units: the worst standardised mean error max_j |m_j − m_ref,j| /
  s_ref,j and the worst |log(s_j / s_ref,j)| (:func:`standardised_errors`);
- the smallest bulk effective sample size over the coordinates, by ArviZ (:func:`min_ess`),
  and per second of wall time, compilation included;
- the kernel Stein discrepancy of Putcha, Nemeth and Fearnhead (2023, Eq. 20-21) of thinned
  draws with full-data scores (:class:`FullDataScore`,
  :func:`numpyro_subsample.post.diagnostics.ksd`);
- the curves of error and KSD of growing prefixes of a chain against its data passes and
  seconds (:func:`evaluate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK
from numpyro_subsample.core.potential import ModelData, build_potential
from numpyro_subsample.post.diagnostics import full_data_scores, ksd

__all__ = [
    "FullDataScore",
    "Result",
    "Trace",
    "evaluate",
    "flatten_draws",
    "min_ess",
    "standardised_errors",
]


def flatten_draws(samples: dict, sites: Sequence[str]) -> np.ndarray:
    """Draws of the given sites as one (S, D) float64 array, sites in the given order."""
    parts = []
    for k in sites:
        v = np.asarray(samples[k], np.float64)
        parts.append(v.reshape(v.shape[0], -1))
    return np.concatenate(parts, axis=1)


def standardised_errors(draws: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Worst standardised mean error and worst |log sd ratio| of ``draws`` against ``ref``.

    Both (S, D); errors are in units of the reference's posterior sd, coordinate by
    coordinate, and the worst coordinate is returned.
    """
    sd = ref.std(0)
    mean_err = np.abs(draws.mean(0) - ref.mean(0)) / sd
    sd_err = np.abs(np.log(draws.std(0) / sd))
    return float(mean_err.max()), float(sd_err.max())


def min_ess(draws: np.ndarray) -> float:
    """Smallest bulk effective sample size (ArviZ ``ess``) over the columns of (S, D) draws."""
    ess = az.ess(az.convert_to_dataset({"x": np.asarray(draws)[None]}), method="bulk")
    values = np.asarray(ess["x"].values, float)
    return float(np.nanmin(values)) if np.isfinite(values).any() else math.nan


class FullDataScore:
    """∇log π(θ) with the full data at many θ at once (the scores of the KSD).

    Builds the model's potential once for ``data`` and calls
    :func:`numpyro_subsample.post.diagnostics.full_data_scores` (one chunked data pass per
    θ). θ is the flat unconstrained vector; for the comparison's regression models it equals
    the flattened draws.
    """

    def __init__(self, model: Callable, data: ModelData, chunk_size: int = DEFAULT_CHUNK):
        self.potential = build_potential(model, data, jax.random.PRNGKey(0))
        self.data = data
        self.chunk_size = int(chunk_size)

    def __call__(self, thetas: np.ndarray) -> np.ndarray:
        thetas = jnp.asarray(thetas, self.potential.init_theta.dtype)
        scores = full_data_scores(self.potential, thetas, self.data, chunk_size=self.chunk_size)
        return np.asarray(scores)


class Trace(NamedTuple):
    """What a run leaves for the metrics."""

    draws: np.ndarray  # (S, D), flattened in the reference's site order
    passes: np.ndarray  # (S,) cumulative data passes at each draw (preprocessing included)
    seconds: np.ndarray  # (S,) cumulative seconds (preprocessing + sampling, no compilation)


@dataclass
class Result:
    """One row of the table (NaN: not measured).

    ``method``: the row's title, ``name``: the method's registry name; ``warnings``: how many
    distinct warnings the run raised (``warning_messages``: their full text and counts);
    ``checks``: a short code of its run checks (``check_details``: the ``RunCheck`` fields).
    """

    method: str
    status: str = "ok"
    note: str = ""
    name: str = ""
    preprocessing_s: float = math.nan
    sampling_s: float = math.nan
    compile_s: float = math.nan
    data_passes: float = math.nan
    iterations: int = 0
    it_per_s: float = math.nan
    min_ess: float = math.nan
    ess_per_s: float = math.nan
    mean_err: float = math.nan
    sd_log_ratio: float = math.nan
    ksd: float = math.nan
    warnings: int = 0
    checks: str = "n/a"
    warning_messages: list = field(default_factory=list)
    check_details: dict | None = None
    curve: dict = field(default_factory=dict)

    def row(self) -> dict:
        """The columns as a dict (no curve), non-finite numbers as ``None``."""
        return _finite_or_none({k: v for k, v in self.__dict__.items() if k != "curve"})


def _finite_or_none(x):
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def evaluate(
    result: Result,
    trace: Trace,
    ref: np.ndarray,
    *,
    score: Callable[[np.ndarray], np.ndarray] | None = None,
    ksd_draws: int = 500,
    checkpoints: int = 12,
    ksd_points: int = 5,
) -> Result:
    """Fill ``result``'s accuracy columns and curve from ``trace`` against ``ref`` draws.

    Parameters
    ----------
    result
        A row with ``preprocessing_s``, ``sampling_s`` and ``compile_s`` set (ESS/s is the
        smallest bulk ESS over their sum).
    score
        θ (K, D) → ∇log π (K, D), e.g. :class:`FullDataScore`; ``None`` or ``ksd_draws=0``
        skips the KSD.
    ksd_draws
        At most this many evenly thinned draws enter the KSD.
    checkpoints, ksd_points
        Prefix lengths of the curve (geometric), and how many of them get a KSD (each
        distinct number of thinned draws compiles the KSD once).
    """
    S = trace.draws.shape[0]
    result.mean_err, result.sd_log_ratio = standardised_errors(trace.draws, ref)
    total = result.preprocessing_s + result.sampling_s + result.compile_s
    result.min_ess = min_ess(trace.draws)
    result.ess_per_s = result.min_ess / total if total > 0 else math.nan
    thin_idx = kdraws = scores = None
    if ksd_draws and score is not None:
        thin_idx = np.unique(np.linspace(0, S - 1, min(ksd_draws, S)).astype(int))
        kdraws = trace.draws[thin_idx]
        scores = score(kdraws)
        result.ksd = float(ksd(kdraws, scores))
    lo = max(min(20, S), S // 100)
    points = np.unique(np.geomspace(lo, S, checkpoints).astype(int))
    pick = np.linspace(0, len(points) - 1, ksd_points).astype(int)
    ksd_at = set(points[np.unique(pick)].tolist())
    curve = {"draws": [], "passes": [], "seconds": [], "mean_err": [], "ksd": []}
    for k in points:
        curve["draws"].append(int(k))
        curve["passes"].append(float(trace.passes[k - 1]))
        curve["seconds"].append(float(trace.seconds[k - 1]))
        curve["mean_err"].append(standardised_errors(trace.draws[:k], ref)[0])
        if kdraws is not None:
            m = int(np.searchsorted(thin_idx, k - 1, side="right"))
            ok = m >= 2 and int(k) in ksd_at
            curve["ksd"].append(float(ksd(kdraws[:m], scores[:m])) if ok else None)
    result.curve = curve
    return result
