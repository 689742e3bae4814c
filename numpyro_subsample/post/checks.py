"""Mixing and bias checks of a finished run, with one warning that names the worst sites.

:func:`check_run` reads the draws an ``MCMC`` run already holds and computes, per scalar
coordinate of every latent site, ArviZ's rank-normalised bulk and tail ESS and, with two or more
chains, split R-hat (Vehtari, Gelman, Simpson, Carpenter and Bürkner 2021). It also reports
chains that stopped (a package kernel stops a chain whose state became non-finite or exploded,
:mod:`numpyro_subsample.sgmcmc.chain`), coordinates that never moved, the bias that the
kernel's default Richardson-Romberg probe found in its step
(:mod:`numpyro_subsample.sgmcmc.step_bias`), and, on request, the step-halving check
(:mod:`numpyro_subsample.post.step_halving`): a second run at half the step size, whose shift
in posterior mean and sd (in posterior sd units, against its Monte Carlo standard error)
measures the discretisation bias of a stochastic-gradient chain. The warning's lines are
written in :mod:`numpyro_subsample.post.check_messages`.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from numpyro_subsample.post.check_messages import (
    chain_failures,
    ess_message,
    kernel_probe,
    probe_message,
)
from numpyro_subsample.post.protocol import run_data, unconstrain
from numpyro_subsample.post.run_figures import (
    coordinate_figures,
    finite_extreme,
    flatten_draws,
    latent_draws,
    rhat_thresholds,
)
from numpyro_subsample.post.step_halving import BiasCheck, bias_message, step_halving_check

__all__ = [
    "rhat_thresholds",
    "BiasCheck",
    "RunCheck",
    "RunDiagnosticsWarning",
    "check_run",
    "probe_after_run",
    "step_halving_check",
]

#: Draws per chain (evenly spaced) handed to the kernel's probe after the run.
AFTER_RUN_DRAWS = 256


class RunDiagnosticsWarning(UserWarning):
    """A run that may be wrong: not mixed, chains disagreeing, stopped or biased."""


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
        (:class:`~numpyro_subsample.sgmcmc.step_bias.BiasProbe`, made in its preprocessing,
        or after the run where the preprocessing could not: its ``after_run``), or None.
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
            if p.chosen_step is not None:
                out["step_bias_chosen_step"] = p.chosen_step
            if getattr(p, "after_run", False):
                out["step_bias_after_run"] = 1
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
        and a bias it found is listed in the warning. Where the preprocessing could not make
        it (the adapted preconditioner, a structured proxy, local latent sites drawn by their
        inner update, SGRLD), it is made here, after the run
        (:func:`probe_after_run`), and a bias it finds also raises a
        :class:`~numpyro_subsample.sgmcmc.step_bias.StepBiasWarning` (with ``warn``).
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
    messages, divergences, frozen = chain_failures(mcmc, x, names)
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
        messages.append(ess_message(mcmc, [names[k] for k in order], min_bulk, min_tail,
                                     threshold, min_ess_per_chain, chains, draws, max_mcse))
    if np.nanmax(fig.excess, initial=-np.inf) > 0:
        order = [k for k in np.argsort(-np.nan_to_num(fig.excess, nan=-np.inf))[:3]
                 if fig.excess[k] > 0]
        worst += [names[k] for k in order if names[k] not in worst]
        messages.append(
            f"max split R-hat {max_r:.3f} > {max_rhat:g} between {chains} chains at "
            f"{', '.join(names[k] for k in order)}: the chains disagree; run longer or check "
            "for several modes"
        )
    probe, skipped = kernel_probe(mcmc)
    if probe is None:  # made after the run where the preprocessing could not
        probe = probe_after_run(mcmc, warn=warn, stacklevel=stacklevel + 1)
        skipped = "" if probe is not None else skipped
    if probe is not None and probe.flagged:
        messages.append(probe_message(mcmc, probe))
    bias = None
    if check_bias:
        bias = step_halving_check(mcmc)
        message = bias_message(bias, bias_tolerance)
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


def probe_after_run(mcmc, *, warn: bool = True, stacklevel: int = 2) -> Any:
    """The kernel's probe of its step's bias made after the run, where its preprocessing could
    not make it (a package kernel whose ``probes_after_run`` is true: the adapted
    preconditioner, a structured proxy, local latent sites drawn by their inner update,
    SGRLD; else None): the kernel's ``probe_after_run`` on the run's last state and
    :data:`AFTER_RUN_DRAWS` evenly spaced unconstrained draws per chain
    (:func:`~numpyro_subsample.sgmcmc.step_bias.probe_after_run`,
    :func:`~numpyro_subsample.sgmcmc.simplex_probe.probe_simplex`; Richardson-Romberg pairs,
    Durmus et al. 2016, Sect. 3). Made once per run."""
    kernel = getattr(mcmc, "sampler", None)
    if not getattr(kernel, "probes_after_run", False):
        return None
    pot = kernel.potential
    samples = mcmc.get_samples(group_by_chain=True)
    if not all(k in samples for k in pot.latent_sites):
        return None  # the draws do not hold the coordinates the kernel moves
    chains, n = np.shape(samples[pot.latent_sites[0]])[:2]
    idx = np.unique(np.linspace(0, n - 1, min(n, AFTER_RUN_DRAWS)).round().astype(int))
    latent = {k: jnp.asarray(np.asarray(samples[k])[:, idx]).reshape(
        (chains * idx.size,) + np.shape(samples[k])[2:]) for k in pot.latent_sites}
    theta = np.asarray(unconstrain(pot, latent, run_data(mcmc))).reshape(chains, idx.size, -1)
    return kernel.probe_after_run(mcmc.last_state, theta, warn=warn, stacklevel=stacklevel + 1)
