"""The step-halving check of a stochastic-gradient run: a second run at half the step size,
whose shift in posterior mean and sd (in posterior sd units, against its Monte Carlo standard
error) measures the discretisation bias of the chain (Vollmer, Zygalakis and Teh 2016)."""

from __future__ import annotations

from typing import NamedTuple

import arviz as az
import numpy as np

from numpyro_subsample.post.run_figures import flatten_draws, latent_draws, per_coordinate

__all__ = ["BiasCheck", "step_halving_check", "bias_message"]


class BiasCheck(NamedTuple):
    """The step-halving check: a run at ``step_size`` (half the original) against the original.

    ``mean_shift``, ``log_sd_shift``: the largest shift over coordinates, in posterior sd
    units (mean) and in log sd; ``*_se``: their Monte Carlo standard errors at those
    coordinates (from the bulk ESS of both runs); ``worst_sites``: the coordinates of the
    largest mean shifts, then the largest sd shift.

    Parameters
    ----------
    step_size
        Step of the rerun.
    mean_shift, mean_shift_se
        Largest mean shift (posterior sds) and its standard error.
    log_sd_shift, log_sd_shift_se
        Largest log-sd shift and its standard error.
    worst_sites
        The coordinates of the largest shifts.

    References
    ----------
    Vollmer, Zygalakis and Teh (2016).
    """

    step_size: float
    mean_shift: float
    mean_shift_se: float
    log_sd_shift: float
    log_sd_shift_se: float
    worst_sites: tuple[str, ...]


def step_halving_check(mcmc, *, num_samples: int | None = None, seed: int = 1) -> BiasCheck:
    """Rerun ``mcmc``'s stochastic-gradient kernel at half its step size and compare.

    The rerun has the same warmup, chains and (by default) number of draws, and reuses the
    kernel's preprocessing; it costs as much as the original run.

    Parameters
    ----------
    mcmc
        A finished ``MCMC`` run of a package stochastic-gradient kernel.
    num_samples
        Draws of the rerun (default: as the run).
    seed
        Seed of the rerun.

    Returns
    -------
    BiasCheck
        The shifts and their standard errors.

    References
    ----------
    Vollmer, Zygalakis and Teh (2016) (the O(h) bias of SGLD that halving the step exposes).
    """
    import jax
    from numpyro.infer import MCMC as NumPyroMCMC

    kernel = mcmc.sampler
    if not hasattr(kernel, "with_step_size"):
        raise TypeError(
            f"check_bias needs a stochastic-gradient kernel of the package (SGLD, SGHMC, "
            f"SGNHT); got {type(kernel).__name__}."
        )
    h = 0.5 * float(kernel.step_size)
    half = NumPyroMCMC(
        kernel.with_step_size(h), num_warmup=mcmc.num_warmup,
        num_samples=int(num_samples or mcmc.num_samples), num_chains=mcmc.num_chains,
        chain_method=mcmc.chain_method, thinning=mcmc.thinning, progress_bar=False,
    )
    half.run(jax.random.PRNGKey(seed), *mcmc._args, **mcmc._kwargs)  # noqa: SLF001
    x1, names = flatten_draws(latent_draws(mcmc))
    x2, _ = flatten_draws(latent_draws(half))
    flat1, flat2 = x1.reshape(-1, x1.shape[2]), x2.reshape(-1, x2.shape[2])
    sd = flat1.std(0)
    sd = np.where(sd > 0, sd, np.inf)
    shift = np.abs(flat1.mean(0) - flat2.mean(0)) / sd
    se = np.sqrt(per_coordinate(az.mcse, x1) ** 2 + per_coordinate(az.mcse, x2) ** 2) / sd
    log_sd = np.abs(np.log(flat2.std(0) / sd))
    ess1 = np.maximum(per_coordinate(az.ess, x1, method="bulk"), 1.0)
    ess2 = np.maximum(per_coordinate(az.ess, x2, method="bulk"), 1.0)
    log_sd_se = np.sqrt(0.5 / ess1 + 0.5 / ess2)  # sd of log s for a Gaussian, ESS draws
    k, j = int(np.nanargmax(shift)), int(np.nanargmax(log_sd))
    worst = [names[i] for i in np.argsort(-shift)[:2]]
    worst += [names[j]] if names[j] not in worst else []
    return BiasCheck(step_size=h, mean_shift=float(shift[k]), mean_shift_se=float(se[k]),
                     log_sd_shift=float(log_sd[j]), log_sd_shift_se=float(log_sd_se[j]),
                     worst_sites=tuple(worst))


def bias_message(bias: BiasCheck, bias_tolerance: float) -> str | None:
    """The message of a step-halving check whose mean or log sd moved by more than
    ``bias_tolerance`` and three Monte Carlo standard errors, else None."""
    mean_moved = bias.mean_shift > max(bias_tolerance, 3 * bias.mean_shift_se)
    sd_moved = bias.log_sd_shift > max(bias_tolerance, 3 * bias.log_sd_shift_se)
    if not (mean_moved or sd_moved):
        return None
    return (
        f"halving the step to {bias.step_size:.3g} moved the posterior mean by "
        f"{bias.mean_shift:.2f} ± {bias.mean_shift_se:.2f} sd and the log sd by "
        f"{bias.log_sd_shift:.2f} ± {bias.log_sd_shift_se:.2f} (at "
        f"{', '.join(bias.worst_sites)}): the step is too large for "
        f"{bias_tolerance:g}-sd accuracy; pass step_size={bias.step_size:.3g} or a "
        "smaller max_variance_inflation"
    )
