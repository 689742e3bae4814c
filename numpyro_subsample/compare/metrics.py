"""Accuracy and efficiency of a run against the NUTS reference.

- errors in posterior-sd units: the worst standardised mean error max_j |m_j − m_ref,j| /
  s_ref,j and the worst |log(s_j / s_ref,j)| (:func:`standardised_errors`);
- the smallest bulk effective sample size over the coordinates, by ArviZ (:func:`min_ess`),
  and per second of wall time, compilation included;
- the kernel Stein discrepancy of Putcha, Nemeth and Fearnhead (2023, Eq. 20-21) of the same
  number of thinned draws for every row, with full-data scores (:class:`FullDataScore`,
  :func:`numpyro_subsample.post.diagnostics.ksd`);
- the reference's own Monte Carlo error (:func:`reference_mc_error`), below which errors
  cannot be resolved;
- the curves of the errors of growing prefixes of a chain against its data passes and
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
    "reference_mc_error",
    "standardised_errors",
    "thin",
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
    coordinate, and the worst coordinate is returned. Coordinates constant in the reference
    (fixed by the site's construction, as the unit diagonal of a correlation matrix) are left
    out.
    """
    moves = np.ptp(ref, axis=0) > 0
    if not moves.any():
        return math.nan, math.nan
    if not moves.all():
        draws, ref = draws[:, moves], ref[:, moves]
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
    ``checks``: a short code of its run checks (``check_details``: the ``RunCheck`` fields);
    ``flags``: what a reader must know before trusting the row (failed run checks, errors far
    from the reference, warnings; :func:`~numpyro_subsample.compare.checks.row_flags`);
    ``ksd_draws``: how many thinned draws the KSD used.
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
    ksd_draws: int = 0
    flags: str = ""
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


def reference_mc_error(ref: np.ndarray, *, level: float = 0.95, reps: int = 4000,
                       seed: int = 0) -> tuple[float, float]:
    """The reference's own Monte Carlo error: the ``level`` quantile of the worst standardised
    mean error and of the worst |log sd ratio| that draws with the reference's bulk ESS per
    coordinate make against the exact posterior.

    A coordinate's mean error is ≈ N(0, 1/ESS_j) in sd units and its log sd ratio
    ≈ N(0, 1/(2 ESS_j)) (Gaussian draws; Vehtari et al. 2021 for the ESS); the worst over the
    d coordinates is simulated ``reps`` times. Errors below these values cannot be resolved
    against this reference.
    """
    ess = az.ess(az.convert_to_dataset({"x": np.asarray(ref)[None]}), method="bulk")
    ess_j = np.maximum(np.asarray(ess["x"].values, float), 1.0)
    z = np.abs(np.random.default_rng(seed).standard_normal((reps, ess_j.size)))
    mean_q = float(np.quantile((z / np.sqrt(ess_j)).max(1), level))
    return mean_q, mean_q / math.sqrt(2.0)


def thin(draws: np.ndarray, num: int) -> np.ndarray:
    """``num`` evenly spaced draws of (S, D) ``draws`` (all of them if S ≤ num)."""
    S = draws.shape[0]
    if S <= num:
        return draws
    return draws[np.linspace(0, S - 1, num).round().astype(int)]


def evaluate(
    result: Result,
    trace: Trace,
    ref: np.ndarray,
    *,
    score: Callable[[np.ndarray], np.ndarray] | None = None,
    ksd_draws: int = 500,
    checkpoints: int = 12,
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
        The KSD is computed on this many evenly thinned draws (:func:`thin`): give every row
        the same number, since the KSD of a finite set of draws shrinks with its size.
    checkpoints
        Number of prefix lengths (geometric) of the curve: worst mean error and |log sd| of
        the first k draws against the data passes, the seconds without compilation and the
        wall seconds with it (``wall_s``: compilation counted before the first draw).
    """
    result.mean_err, result.sd_log_ratio = standardised_errors(trace.draws, ref)
    total = result.preprocessing_s + result.sampling_s + result.compile_s
    result.min_ess = min_ess(trace.draws)
    result.ess_per_s = result.min_ess / total if total > 0 else math.nan
    if ksd_draws and score is not None:
        kdraws = thin(trace.draws, ksd_draws)
        result.ksd = float(ksd(kdraws, score(kdraws)))
        result.ksd_draws = int(kdraws.shape[0])
    S = trace.draws.shape[0]
    lo = max(min(20, S), S // 100)
    points = np.unique(np.geomspace(lo, S, checkpoints).astype(int))
    compile_s = result.compile_s if math.isfinite(result.compile_s) else 0.0
    curve: dict[str, list] = {"draws": [], "passes": [], "seconds": [], "wall_s": [],
                              "mean_err": [], "sd_log_ratio": []}
    for k in points:
        mean_err, sd_err = standardised_errors(trace.draws[:k], ref)
        curve["draws"].append(int(k))
        curve["passes"].append(float(trace.passes[k - 1]))
        curve["seconds"].append(float(trace.seconds[k - 1]))
        curve["wall_s"].append(float(trace.seconds[k - 1]) + compile_s)
        curve["mean_err"].append(mean_err)
        curve["sd_log_ratio"].append(sd_err)
    result.curve = curve
    return result
