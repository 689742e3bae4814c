"""Per-coordinate figures of a run's draws for :func:`~numpyro_subsample.post.checks.check_run`:
bulk and tail ESS, split R-hat and its chance level, the Monte Carlo standard error of each
mean (Vehtari, Gelman, Simpson, Carpenter and Bürkner 2021, through ArviZ)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import arviz as az
import numpy as np
from scipy.stats import chi2

from numpyro_subsample.core.sites import site_label

__all__ = ["CoordinateFigures", "coordinate_figures", "finite_extreme", "flatten_draws",
           "latent_draws", "per_coordinate", "rhat_thresholds"]


def latent_draws(mcmc) -> dict[str, np.ndarray]:
    """Draws (chains, draws, ...) of the latent sites (deterministic sites left out)."""
    samples = mcmc.get_samples(group_by_chain=True)
    z = getattr(mcmc.last_state, mcmc.sampler.sample_field, None)
    if isinstance(z, dict):
        samples = {k: v for k, v in samples.items() if k in z}
    return {k: np.asarray(v, np.float64) for k, v in samples.items()}


def flatten_draws(draws: dict[str, np.ndarray]) -> tuple[np.ndarray, list[str]]:
    """(chains, draws, coordinates) and the coordinates' labels."""
    cols, names = [], []
    for name in sorted(draws):
        v = draws[name]
        shape = v.shape[2:]
        cols.append(v.reshape(v.shape[0], v.shape[1], -1))
        names += [site_label(name, shape, i) for i in range(int(np.prod(shape, dtype=int)))]
    return np.concatenate(cols, axis=2), names


def per_coordinate(fn, x: np.ndarray, **kwargs) -> np.ndarray:
    ds = az.convert_to_dataset({"x": x})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(fn(ds, **kwargs)["x"].values, np.float64).reshape(-1)


def rhat_thresholds(ess_bulk: np.ndarray, chains: int, draws: int, max_rhat: float = 1.01,
                    level: float = 0.01, num_coordinates: int | None = None) -> np.ndarray:
    """Per-coordinate split R-hat thresholds: ``max_rhat``, raised to the (1 − level/d)
    quantile of split R-hat over chains that sample one distribution (Bonferroni over the d
    coordinates), so that a long well-mixed run of many coordinates does not warn by chance.
    ``ess_bulk``: the sum over chains of each chain's own bulk ESS (:func:`check_run`), of
    some of the ``num_coordinates`` coordinates (default: all, ``ess_bulk.size``).

    For M = 2·``chains`` split chains of ``draws``/2 draws and a bulk ESS S per coordinate,
    R̂² = 1 + (B/W − 1)/n with B/W ≈ (n/n_e)·F, F ~ χ²_{M−1}/(M−1) and n_e = S/M (Vehtari
    et al. 2021, Sect. 3-4): the quantile is sqrt(1 + F_q/n_e − 1/n).
    """
    ess = np.asarray(ess_bulk, np.float64)
    m = 2 * int(chains)
    n = max(int(draws) // 2, 1)
    d = ess.size if num_coordinates is None else int(num_coordinates)
    f = chi2.isf(level / max(d, 1), m - 1) / (m - 1)
    n_e = np.maximum(np.nan_to_num(ess, nan=1.0) / m, 1.0)
    return np.maximum(max_rhat, np.sqrt(np.maximum(1.0 + f / n_e - 1.0 / n, 1.0)))


def finite_extreme(reduce: Callable, values: np.ndarray) -> float:
    """``reduce`` (np.nanmin or np.nanmax) of the finite ``values``, or NaN if none is."""
    return float(reduce(values)) if np.isfinite(values).any() else float("nan")


class CoordinateFigures(NamedTuple):
    """Per coordinate: bulk and tail ESS (0 where a chain is frozen), split R-hat, the Monte
    Carlo standard error of the mean in posterior sds, and R-hat's excess over its chance
    level (NaN where not computed, and where R-hat is at most ``max_rhat``)."""

    ess_bulk: np.ndarray
    ess_tail: np.ndarray
    rhat: np.ndarray
    mcse_sd: np.ndarray
    excess: np.ndarray


def coordinate_figures(x: np.ndarray, frozen: np.ndarray, max_rhat: float) -> CoordinateFigures:
    """The :class:`CoordinateFigures` of draws ``x`` (chains, draws, coordinates): ESS and
    MCSE from 4 draws, R-hat from 2 chains (Vehtari et al. 2021, through ArviZ)."""
    chains, draws, num = x.shape
    ess_bulk = ess_tail = rhat = np.full(num, np.nan)
    if draws >= 4:
        ess_bulk = per_coordinate(az.ess, x, method="bulk")
        ess_tail = per_coordinate(az.ess, x, method="tail")
        ess_bulk = np.where(frozen.any(0), 0.0, ess_bulk)
        ess_tail = np.where(frozen.any(0), 0.0, ess_tail)
        if chains >= 2:
            rhat = per_coordinate(az.rhat, x)
    sd = x.reshape(chains * draws, -1).std(0)
    mcse_sd = np.full(num, np.nan)
    if draws >= 4:
        mcse = per_coordinate(az.mcse, x, method="mean")
        mcse_sd = np.where(sd > 0, mcse / np.where(sd > 0, sd, 1.0), np.nan)
    excess = np.full(num, np.nan)
    above = np.flatnonzero(np.nan_to_num(rhat, nan=-np.inf) > max_rhat)
    if above.size:  # the chance level from each chain's own ESS (a disagreement between the
        # chains lowers the pooled ESS, and would raise its own threshold); at most max_rhat
        # elsewhere, where R-hat cannot exceed it
        within = sum(per_coordinate(az.ess, x[c:c + 1][..., above], method="bulk")
                     for c in range(chains))
        excess[above] = rhat[above] - rhat_thresholds(within, chains, draws, max_rhat,
                                                      num_coordinates=num)
    return CoordinateFigures(ess_bulk=ess_bulk, ess_tail=ess_tail, rhat=rhat, mcse_sd=mcse_sd,
                    excess=excess)
