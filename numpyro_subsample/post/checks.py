"""Mixing and bias checks of a finished run, with one warning that names the worst sites.

:func:`check_run` reads the draws an ``MCMC`` run already holds and computes, per scalar
coordinate of every latent site, ArviZ's rank-normalised bulk and tail ESS and, with two or more
chains, split R-hat (Vehtari, Gelman, Simpson, Carpenter and Bürkner 2021). It also reports
chains that stopped (a package kernel stops a chain whose state became non-finite or exploded,
:mod:`numpyro_subsample.sgmcmc.chain`), coordinates that never moved, the bias that the
kernel's default Richardson-Romberg probe found in its step
(:mod:`numpyro_subsample.sgmcmc.step_bias`), and, on request, the
step-halving check: a second run at half the step size, whose shift in posterior mean and sd
(in posterior sd units, against its Monte Carlo standard error) measures the discretisation
bias of a stochastic-gradient chain.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import arviz as az
import numpy as np

from numpyro_subsample.core.sites import coordinate_names
from numpyro_subsample.post.run_figures import (
    coordinate_figures,
    finite_extreme,
    flatten_draws,
    latent_draws,
    per_coordinate,
    rhat_thresholds,
)

__all__ = [
    "rhat_thresholds",
    "BiasCheck",
    "RunCheck",
    "RunDiagnosticsWarning",
    "check_run",
    "step_halving_check",
]


class RunDiagnosticsWarning(UserWarning):
    """A run that may be wrong: not mixed, chains disagreeing, stopped or biased."""


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


class RunCheck(NamedTuple):
    """The figures of :func:`check_run`; ``messages`` is empty when the run passed.

    Parameters
    ----------
    min_ess_bulk, min_ess_tail
        Smallest bulk and tail ESS over coordinates.
    max_rhat
        Largest split R-hat.
    worst_sites
        Coordinates of the failed checks.
    divergences
        Diverging (stopped) draws.
    num_draws
        Draws checked.
    num_chains
        Chains checked.
    ess_threshold
        The total bulk and tail ESS below which the run warns (``min_ess_per_chain`` times
        ``num_chains``).
    max_mcse_sd
        The largest Monte Carlo standard error of a posterior mean over coordinates (ArviZ
        ``mcse``), in posterior sd units.
    messages
        One line per failed check.
    bias
        The step-halving check, or None.
    step_bias
        The kernel's default probe of the step's bias
        (:class:`~numpyro_subsample.sgmcmc.step_bias.BiasProbe`, made in its preprocessing),
        or None.
    step_bias_skipped
        Why the kernel did not probe its step's bias ("" where it did, or where the kernel
        has no probe).

    References
    ----------
    Vehtari, Gelman, Simpson, Carpenter and Bürkner (2021).
    """

    min_ess_bulk: float
    min_ess_tail: float
    max_rhat: float
    worst_sites: tuple[str, ...]
    divergences: int
    num_draws: int
    num_chains: int
    ess_threshold: float
    max_mcse_sd: float
    messages: tuple[str, ...]
    bias: BiasCheck | None = None
    step_bias: Any = None
    step_bias_skipped: str = ""

    @property
    def ok(self) -> bool:
        return not self.messages

    def attrs(self) -> dict[str, Any]:
        """The figures as flat attributes (for ArviZ ``sample_stats.attrs``)."""
        out = {
            "min_ess_bulk": self.min_ess_bulk, "min_ess_tail": self.min_ess_tail,
            "max_rhat": self.max_rhat, "worst_sites": ", ".join(self.worst_sites),
            "ess_threshold": self.ess_threshold, "max_mcse_sd": self.max_mcse_sd,
            "num_divergent": self.divergences, "run_warnings": "\n".join(self.messages),
        }
        if self.step_bias is not None:
            p = self.step_bias
            out.update({"step_bias_step_size": p.step_size, "step_bias_kind": p.kind,
                        "step_bias_bias": p.bias, "step_bias_bias_se": p.bias_se,
                        "step_bias_coordinate": int(p.worst),
                        "step_bias_flagged": int(p.flagged),
                        "step_bias_resolution": p.resolution})
            if p.inconclusive:
                out["step_bias_inconclusive"] = p.inconclusive
        if self.step_bias_skipped:
            out["step_bias_skipped"] = self.step_bias_skipped
        if self.bias is not None:
            out.update({
                f"step_halving_{k}": ", ".join(v) if isinstance(v, tuple) else v
                for k, v in self.bias._asdict().items()
            })
        return out


_SMALLER_STEP = (
    "pass a smaller step_size (e.g. half), or let the kernel choose a smaller one (a smaller "
    "max_variance_inflation for SG kernels, a larger target_accept_prob for adapted HMC steps)"
)


def _failures(mcmc) -> list[str]:
    """One line per chain that a package kernel stopped (``fail_step`` ≥ 0)."""
    state = mcmc.last_state
    if not hasattr(state, "fail_step"):
        return []
    steps = np.atleast_1d(np.asarray(state.fail_step))
    coords = np.atleast_1d(np.asarray(state.fail_coord))
    try:
        names = coordinate_names(mcmc.sampler.potential)
    except Exception:  # noqa: BLE001  (labels are a courtesy; the figures stand without them)
        names = None
    lines = []
    for c, (s, k) in enumerate(zip(steps, coords, strict=True)):
        site = names[k] if names is not None and 0 <= k < len(names) else f"θ[{k}]"
        if s == 1:  # step 1 evaluates the first gradient estimate, at the chain's start
            lines.append(f"chain {c} stopped at its start: the gradient estimate along {site} "
                         "is not finite at the initial position; every draw repeats it")
        elif s >= 0:
            lines.append(f"chain {c} stopped at step {int(s)}: {site} became non-finite or "
                         "exploded; its later draws repeat the last valid state")
    if lines:
        lines.append(_SMALLER_STEP)
    return lines


def _mixing_remedy(mcmc, factor: float = float("nan")) -> str:
    """What to try when a run has not mixed, for the kernel at hand; ``factor``: the ratio of
    the ESS needed to the ESS reached (the ESS grows about linearly with the steps)."""
    kernel = mcmc.sampler
    tips = [f"run about {math.ceil(factor)}× more steps" if 1 < factor < 1e3
            else "run more steps"]
    if type(kernel).__name__ == "SGLD":
        tips.append("use SGHMC")
    try:
        kind = getattr(kernel.proxy, "kind", None)
    except Exception:  # noqa: BLE001  (kernels without a fitted proxy)
        kind = None
    if kind in ("laplace", "variational") and getattr(kernel, "adapt_proxy", None) is False:
        tips.append("leave AdaptationOptions.proxy at its default (pilot chains re-estimate "
                    "the proxy, which a joint mode or a first SVI fit places poorly in "
                    "hierarchical models)")
    elif kind == "adapted":
        tips.append("write hierarchical group effects in the other parameterisation (centred "
                    "or non-centred, numpyro.infer.reparam.LocScaleReparam) where the groups' "
                    "data are large (centred) or small (non-centred)")
    elif kind == "structured":
        tips.append("try proxy='low-rank' with a larger rank (proxy_kwargs={'rank': k}): a "
                    "structured proxy that misses correlated directions whitens them poorly")
    elif kind is not None:
        tips.append("check the proxy (kernel.proxy)")
    return ", or ".join(tips)


def _step_bias(mcmc) -> tuple[Any, str]:
    """The kernel's default probe of its step's bias (package SG kernels), or None, and why
    it did not run ("" where it did or the kernel has none)."""
    pre = getattr(mcmc.sampler, "_pre", None)
    return getattr(pre, "step_bias", None), str(getattr(pre, "step_bias_skipped", "") or "")


def _probe_message(mcmc, probe) -> str:
    try:
        site = coordinate_names(mcmc.sampler.potential)[probe.worst] + " (unconstrained)"
    except Exception:  # noqa: BLE001  (labels are a courtesy)
        site = f"θ[{probe.worst}]"
    return (f"the kernel's probe found that {probe.message.format(site=site)}: pass "
            f"step_size={probe.step_size / 2:.3g} or smaller, or a smaller "
            "max_variance_inflation")


def _step_size(mcmc) -> float | None:
    try:
        return float(mcmc.sampler.step_size)
    except Exception:  # noqa: BLE001  (kernels without a scalar step size)
        return None


def check_run(
    mcmc,
    *,
    min_ess_per_chain: float = 100.0,
    max_rhat: float = 1.01,
    warn: bool = True,
    check_bias: bool = False,
    bias_tolerance: float = 0.1,
    stacklevel: int = 2,
) -> RunCheck:
    """Check the draws of a finished ``MCMC`` run; warn once, naming the worst sites.

    Parameters
    ----------
    mcmc
        A ``numpyro.infer.MCMC`` after ``run`` (any kernel; package kernels also report
        stopped chains).
    min_ess_per_chain
        Warn when the smallest bulk or tail ESS over coordinates (of all chains together) is
        below this times the number of chains: 100 per chain, as Stan and ArviZ recommend
        (Vehtari et al. 2021), bounds the Monte Carlo standard error of each mean at
        0.1 posterior sd / sqrt(chains).
    max_rhat
        Warn when a rank-normalised split R-hat (two or more chains) exceeds this and the level
        that chains sampling one distribution reach by chance at that coordinate's ESS, over
        all coordinates (:func:`rhat_thresholds`).
    warn
        Emit a :class:`RunDiagnosticsWarning` listing every failed check.
    check_bias
        Also run :func:`step_halving_check` (a second run at half the step size; package
        stochastic-gradient kernels only) and warn when the posterior mean of a coordinate moves
        by more than ``bias_tolerance`` posterior sds, beyond three Monte Carlo standard errors:
        the full check. The kernel's default probe of its step
        (:mod:`~numpyro_subsample.sgmcmc.step_bias`, made in its preprocessing) is a short
        one; it is in ``RunCheck.step_bias`` (why it did not run in ``step_bias_skipped``),
        and a bias it found is listed in the warning.
    bias_tolerance
        Posterior sds of mean shift that ``check_bias`` tolerates.
    stacklevel
        ``stacklevel`` of the warning.

    Returns
    -------
    RunCheck
        The figures; ``messages`` is empty when the run passed.

    References
    ----------
    Vehtari, Gelman, Simpson, Carpenter and Bürkner (2021) (split R-hat, bulk and tail ESS).
    """
    x, names = flatten_draws(latent_draws(mcmc))
    chains, draws, _ = x.shape
    messages, divergences, frozen = _chain_failures(mcmc, x, names)
    fig = coordinate_figures(x, frozen, max_rhat)
    max_mcse = finite_extreme(np.nanmax, fig.mcse_sd)
    min_bulk = finite_extreme(np.nanmin, fig.ess_bulk)
    min_tail = finite_extreme(np.nanmin, fig.ess_tail)
    max_r = finite_extreme(np.nanmax, fig.rhat)
    worst = []
    threshold = float(min_ess_per_chain) * chains
    if min(min_bulk, min_tail) < threshold:
        order = np.argsort(np.minimum(fig.ess_bulk, fig.ess_tail))[:3]
        worst += [names[k] for k in order]
        messages.append(_ess_message(mcmc, [names[k] for k in order], min_bulk, min_tail,
                                     threshold, min_ess_per_chain, chains, draws, max_mcse))
    if np.nanmax(fig.excess, initial=-np.inf) > 0:
        order = np.argsort(-np.nan_to_num(fig.excess, nan=-np.inf))[:3]
        worst += [names[k] for k in order if names[k] not in worst]
        messages.append(
            f"max split R-hat {max_r:.3f} > {max_rhat:g} between {chains} chains at "
            f"{', '.join(names[k] for k in order)}: the chains disagree; run longer or check "
            "for several modes"
        )
    probe, skipped = _step_bias(mcmc)
    if probe is not None and probe.flagged:
        messages.append(_probe_message(mcmc, probe))
    bias = None
    if check_bias:
        bias = step_halving_check(mcmc)
        message = _bias_message(bias, bias_tolerance)
        if message:
            messages.append(message)
    result = RunCheck(
        min_ess_bulk=min_bulk, min_ess_tail=min_tail, max_rhat=max_r, worst_sites=tuple(worst),
        divergences=divergences, num_draws=chains * draws, num_chains=chains,
        ess_threshold=threshold, max_mcse_sd=max_mcse, messages=tuple(messages), bias=bias,
        step_bias=probe, step_bias_skipped=skipped,
    )
    if warn and messages:
        warnings.warn("This run may be wrong:\n  - " + "\n  - ".join(messages),
                      RunDiagnosticsWarning, stacklevel=stacklevel)
    return result


def _chain_failures(mcmc, x: np.ndarray, names: list[str]) -> tuple[list[str], int, np.ndarray]:
    """``(messages, divergences, frozen)``: the stopped chains of a package kernel, else the
    divergent draws; and the coordinates that never moved in a chain ((chains, coordinates),
    each named in a message, at most 12 messages in all)."""
    chains, draws, _ = x.shape
    messages = _failures(mcmc)
    extra = mcmc.get_extra_fields()
    divergences = int(np.sum(np.asarray(extra["diverging"]))) if "diverging" in extra else 0
    if divergences and not messages:
        messages.append(f"{divergences} of {chains * draws} draws diverged; {_SMALLER_STEP}")
    frozen = np.ptp(x, axis=1) == 0  # (chains, coordinates)
    for c, k in zip(*np.nonzero(frozen), strict=True):
        if len(messages) < 12:
            messages.append(f"{names[k]} never moved in chain {c}")
    return messages, divergences, frozen


def _ess_message(mcmc, worst: list[str], min_bulk: float, min_tail: float, threshold: float,
                 min_ess_per_chain: float, chains: int, draws: int, max_mcse: float) -> str:
    """The message of an ESS below ``threshold``, with the worst coordinates, the step size,
    the mean's Monte Carlo error and the remedy (:func:`_mixing_remedy`)."""
    h = _step_size(mcmc)
    step = "" if h is None else f" (step size {h:.3g})"
    per_chain = "" if chains == 1 else f" ({min_ess_per_chain:g} per chain × {chains})"
    mcse_note = "" if not np.isfinite(max_mcse) else (
        f", so a posterior mean may be off by {max_mcse:.2f} sd (Monte Carlo standard "
        "error)")
    return (
        f"min ESS {min_bulk:.0f} (bulk) / {min_tail:.0f} (tail) of {chains * draws} draws "
        f"< {threshold:g}{per_chain} at {', '.join(worst)}{step}"
        f"{mcse_note}: the chain has not mixed; "
        f"{_mixing_remedy(mcmc, threshold / max(min(min_bulk, min_tail), 1e-12))}"
    )


def _bias_message(bias: BiasCheck, bias_tolerance: float) -> str | None:
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
