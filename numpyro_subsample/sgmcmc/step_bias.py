"""The step's bias, probed by default: coupled Richardson-Romberg pairs in the preprocessing.

A stochastic-gradient chain at time step h samples π_h, whose expectations differ from the
posterior's by a bias that is first order in h for the Euler-type steps of SGLD, SGHMC and SGNHT
(including the part the gradient noise adds, h·V): π_h(f) − π(f) = C(f)·h + O(h²). Durmus,
Şimşekli, Moulines, Badeau and Richard (2016) run the chain at h and at h/2 side by side and
combine them, 2π_{h/2}(f) − π_h(f) = π(f) + O(h²) (their Richardson-Romberg
estimator, Sect. 3), with the two chains' Brownian increments synchronously coupled: the chain at
h takes the standard normal draw (ξ_{2k−1} + ξ_{2k})/√2 where the chain at h/2 takes ξ_{2k−1}
and ξ_{2k} (Sect. 3). The same difference measures the bias of the run:

    π_h(f) − π(f) ≈ 2 (π_h(f) − π_{h/2}(f)) = −2 D(f),   D(f) = π_{h/2}(f) − π_h(f).

The coupling keeps the two chains a distance O(h) apart, so D(f) is estimated with a standard
error of the same order as D itself from a few hundred steps: its signal-to-noise ratio does
not fall as h falls.

:func:`probe_bias` runs, after the step h is chosen, ``PROBE_PAIRS`` such pairs (vectorised,
one compiled loop in which the estimator is traced once), started at the pilot's last draws (or
at proxy draws), in the kernel's whitened coordinates, with its dynamics (their given-noise
step, :attr:`~numpyro_subsample.sgmcmc.dynamics.Dynamics.step_noise`) and its gradient
estimator; the chain at h takes the first of the two subsamples of the chain at h/2. For each
coordinate θ_j it estimates the bias at h of the mean, in posterior sds, and of the sd,
relative, with standard errors from the pairs' series of batch means and their effective
sample size. Where the step may be reduced (below) and the four pairs leave a bias of
:data:`REFINE_FROM` or more within reach (beyond :data:`REFINE_Z` standard errors), up to
:data:`REFINE_ROUNDS` further rounds of four pairs, from other pilot draws, run in the same
compiled program (within :data:`MAX_ESTIMATES` gradient estimates in all) and the estimates
pool all the pairs. Where an estimate is then still between noise and a cut (:func:`undecided`:
at least :data:`ESCALATE_FROM` beyond :data:`ESCALATE_Z` standard errors, not enough to reduce
the step below), rounds go on until none is, within :data:`MAX_ESCALATED_ESTIMATES`: a slowly
mixing group scale's estimate has standard errors several times its coordinates' others.

Where the kernel chose h by its rule (no ``step_size`` given) and the gradient noise does not
limit it (the kernel's test), a bias of :data:`REDUCE_FROM` or
more beyond :data:`REDUCE_Z` standard errors, and at least :data:`BIAS_TARGET` two standard
errors below its estimate, reduces the step to the one at which the first
order bias is :data:`BIAS_TARGET`, h' = h · BIAS_TARGET / |b| (:attr:`BiasProbe.bias_limited_step`,
at least h / :data:`MAX_REDUCTION`): the bias of the Euler-type steps is linear in h (Durmus et
al. 2016, Eq. 5); the run then mixes more slowly per step (SGLD takes more steps per draw,
:func:`~numpyro_subsample.sgmcmc.stepsize.steps_per_draw`; otherwise its ESS check reports it).
:func:`warn_if_biased` raises a :class:`StepBiasWarning` when, at the step the run takes, one
of the estimates is at least :data:`FLAG_BIAS` and beyond :func:`significance` standard errors
(a given step, or a reduction capped at h / :data:`MAX_REDUCTION`), or when the chains at h
became non-finite or exploded. An estimate flagged by one round of pairs is flagged only if it
stays so with a second round's pairs pooled in: the batch means' standard error of a short,
slowly mixing series (a noise-limited step, whose probe covers a short time) is too small,
which made single rounds flag runs that were right. Its cost, ``3 · PROBE_PAIRS`` gradient
estimates of the run's subsample size per probe step and round (:func:`probe_steps`: at most
0.27 × those of a run of 4 chains × 11,000 steps per round), is recorded in :class:`BiasProbe`
and added to the preprocessing's data passes and seconds. With the preconditioner adapted in
the warm-up (fixed only at its end) or a structured proxy, the same pairs run after the run
instead (:func:`probe_after_run`, called by the run check through the kernel's
``probe_after_run``): from the chains' last draws, with their final diagonal preconditioner, in
units of the draws' sds; they warn the same way but leave the step as it was. So do models
with local latent sites drawn by their inner update (:data:`LOCAL_SKIP`). A stateful
estimator's pairs carry a state per chain (SAGA's table, SVRG's anchor; the local sites'
table, from the chain that starts the pair after a run), both chains of a pair drawing their
subsample (and local sites) with one key
(:func:`~numpyro_subsample.sgmcmc.coupled_pairs.run_pairs`); SVRG's refreshes add their full
data passes to the probe's cost. Where it cannot
run (:func:`skip_reason`: an estimator state too large for the pairs to hold,
:func:`state_reason`) or resolves only biases
above :data:`BIAS_TOLERANCE` (:attr:`BiasProbe.resolution`, e.g. with a noise-limited step
whose two chains' subsamples differ a lot) the run check's record says so
(``step_bias_skipped``, ``step_bias_resolution`` of its ArviZ attributes), without a warning.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.core.rng import STEP_RNG as PROBE_RNG
from numpyro_subsample.proxies.whitening import Scale
from numpyro_subsample.sgmcmc.coupled_pairs import (
    BATCHES,
    batch_estimates,
    run_pairs,
    start_positions,
)
from numpyro_subsample.sgmcmc.dynamics import Dynamics, injected_noise_scale

__all__ = [
    "AfterRunProbing",
    "BIAS_TARGET",
    "BIAS_TOLERANCE",
    "ESCALATE_FROM",
    "ESCALATE_Z",
    "FLAG_BIAS",
    "MAX_ESCALATED_ESTIMATES",
    "MAX_ESTIMATES",
    "MAX_REDUCTION",
    "PROBE_PAIRS",
    "REDUCE_FROM",
    "REDUCE_LOWER_SE",
    "REDUCE_Z",
    "REFINE_FROM",
    "REFINE_ROUNDS",
    "REFINE_Z",
    "ADAPTED_SKIP",
    "LOCAL_SKIP",
    "MAX_PROBE_STATE_BYTES",
    "STRUCTURED_SKIP",
    "DEFERRED_SKIP",
    "BiasProbe",
    "StepBiasWarning",
    "after_run_reason",
    "probe_after_run",
    "probe_bias",
    "probe_rounds",
    "probe_steps",
    "not_probed",
    "probed",
    "significance",
    "skip_reason",
    "state_reason",
    "undecided",
    "warn_if_biased",
]

#: Coupled pairs run side by side (vectorised).
PROBE_PAIRS = 4
#: The probe's steps: about ``RELAXATION_STEPS / h`` (``h`` the time step: the whitened
#: posterior relaxes in a time of order 1), between ``MIN_STEPS`` and ``MAX_STEPS``, a whole
#: number of ``BATCHES``.
RELAXATION_STEPS = 30.0
MIN_STEPS = 200
MAX_STEPS = 1000
#: The probe warns only where the series of the flagged function has at least this effective
#: sample size (of ``PROBE_PAIRS · (BATCHES − BURN_IN_BATCHES)`` batch means).
MIN_ESS = 20.0
#: The probe warns when an estimated bias (of a mean, in posterior sds; of an sd, relative) is
#: at least this and significant (:func:`significance`).
FLAG_BIAS = 0.2
#: The bias the probe is built to find (in posterior sds): it warns from :data:`FLAG_BIAS`.
BIAS_TOLERANCE = 0.3
#: Further rounds of ``PROBE_PAIRS`` pairs where some estimate is at least ``REFINE_FROM`` and
#: beyond ``REFINE_Z`` standard errors.
REFINE_FROM = 0.1
REFINE_Z = 1.5
REFINE_ROUNDS = 2
#: The probe's gradient estimates, refinement included, stay within this many: 0.45 × those of
#: a default run of 4 chains × 11,000 steps.
MAX_ESTIMATES = 19_800
#: A bias estimated at least ``REDUCE_FROM`` and beyond ``REDUCE_Z`` standard errors
#: reduces a step the kernel chose to one with an estimated bias of ``BIAS_TARGET``, by at most
#: a factor ``MAX_REDUCTION``.
REDUCE_FROM = 0.15
#: The standard errors of that bias: not corrected for the number of coordinates (as
#: :func:`significance` is): a reduction that was not needed costs gradient estimates (SGLD's
#: further steps per draw) or effective samples, not correctness, and the lower bound below
#: keeps estimates with wide errors from cutting.
REDUCE_Z = 3.0
#: ... and whose lower bound |b| − 2 se is at least ``BIAS_TARGET``: a bias of at least 0.1
#: with about 98 % confidence, so that an estimate near 0.15 with a wide error does not cut.
REDUCE_LOWER_SE = 2.0
BIAS_TARGET = 0.1
MAX_REDUCTION = 4.0
#: Where a step the kernel chose has an estimate of at least ``ESCALATE_FROM`` beyond
#: ``ESCALATE_Z`` standard errors that neither reduces it nor is dominated by one that does,
#: further rounds of pairs run until none is left, within ``MAX_ESCALATED_ESTIMATES`` gradient
#: estimates in all (0.8 × those of a default run of 4 chains × 11,000 steps): a slowly
#: mixing scale's bias of 0.3 sd has a standard error of about 0.1 from 8 pairs.
ESCALATE_FROM = 0.2
ESCALATE_Z = 2.0
MAX_ESCALATED_ESTIMATES = 36_000


#: The preprocessing's reasons not to probe that :func:`probe_after_run` makes up for.
ADAPTED_SKIP = "the preconditioner is adapted in the warm-up"
STRUCTURED_SKIP = "the proxy is structured"
LOCAL_SKIP = "the model has local latent sites"
#: A stateful estimator's states of the probe's chains (two per pair, each as large as a run's
#: chain's: SAGA's N × d table, the local sites' N rows) are kept within this many bytes; a
#: larger state is not probed (the reason is recorded).
MAX_PROBE_STATE_BYTES = 1 << 30
#: A preprocessing whose probe waits until the kernel has chosen between two forms of the model
#: (:meth:`~numpyro_subsample.sgmcmc.kernel_preprocess.SGMCMCPreprocessing._deferred_probe`).
DEFERRED_SKIP = "the probe waits for the kernel's choice of the model's form"
#: Post-warm-up draws per chain (evenly spaced) whose sds give the units of the probe after a
#: run and whose last ones start its pairs.
AFTER_RUN_DRAWS = 256


class StepBiasWarning(UserWarning):
    """The default Richardson-Romberg probe found that the time step biases the posterior:
    the message names the site, the estimated bias in posterior sds ± its standard error, the
    step and the remedy (:mod:`~numpyro_subsample.sgmcmc.step_bias`)."""


class BiasProbe(NamedTuple):
    """What :func:`probe_bias` measured.

    Parameters
    ----------
    step_size
        The time step h probed (against h/2).
    mean_bias, mean_bias_se
        Per flat unconstrained coordinate: the estimated bias of the posterior mean at h,
        −2 D(θ_j) / sd_j, in posterior sds, and its standard error.
    sd_bias, sd_bias_se
        Per coordinate: the estimated relative bias of the posterior sd at h,
        sd_h/sd − 1 ≈ −D(var θ_j) / sd_j², and its standard error.
    worst, kind
        The flat coordinate of the largest bias (:func:`worst_coordinate`), and whether it is
        that of its ``"mean"`` or of its ``"sd"``; ``"diverged-h"`` or ``"diverged"`` when the
        chains at h (or at h and h/2) failed (:func:`probe_bias`).
    flagged
        Whether the probe warns (:func:`warn_if_biased`).
    pairs, steps
        Coupled pairs (over all rounds) and probe steps (each: one step at h and two at h/2
        per pair).
    gradient_evaluations
        Gradient estimates made (3 · pairs · steps), each of the run's subsample size.
    data_passes
        Their data evaluations / N.
    seconds
        Wall time of the probe, compilation included.
    ess
        Per coordinate: the smaller effective sample size of the two differences' series of
        batch means (the probe warns only from :data:`MIN_ESS`).
    chosen_step
        The step the kernel took instead of the one its rule chose,
        :attr:`bias_limited_step`; None where it kept ``step_size``.
    after_run
        Whether the pairs ran after the run (:func:`probe_after_run`: the adapted
        preconditioner, a structured proxy, drawn local latent sites; SGRLD's), from its last
        draws, rather than in the preprocessing.
    labels
        The coordinates' labels where they are not the potential's flat unconstrained ones
        (SGRLD's simplex values, :mod:`~numpyro_subsample.sgmcmc.simplex_probe`), else None.

    References
    ----------
    Durmus, Şimşekli, Moulines, Badeau and Richard (2016), Sect. 3 (the Richardson-Romberg
    pair of chains at h and h/2 with coupled Gaussian increments).
    """

    step_size: float
    mean_bias: np.ndarray
    mean_bias_se: np.ndarray
    sd_bias: np.ndarray
    sd_bias_se: np.ndarray
    worst: int
    kind: str
    flagged: bool
    pairs: int
    steps: int
    gradient_evaluations: int
    data_passes: float
    seconds: float
    ess: np.ndarray | None = None
    chosen_step: float | None = None
    after_run: bool = False
    labels: tuple[str, ...] | None = None

    @property
    def bias(self) -> float:
        """The estimated bias at :attr:`worst` (posterior sds for a mean, relative for an sd)."""
        arr = self.mean_bias if self.kind == "mean" else self.sd_bias
        return float(arr[self.worst])

    @property
    def bias_se(self) -> float:
        """The standard error of :attr:`bias`."""
        arr = self.mean_bias_se if self.kind == "mean" else self.sd_bias_se
        return float(arr[self.worst])

    @property
    def bias_limited_step(self) -> float | None:
        """h · :data:`BIAS_TARGET` / |b| for the largest estimate |b| (of a mean, in posterior
        sds; of an sd, relative) that is at least :data:`REDUCE_FROM`, beyond :data:`REDUCE_Z`
        standard errors, with |b| − :data:`REDUCE_LOWER_SE` se ≥ :data:`BIAS_TARGET`, and
        from at least :data:`MIN_ESS` batch means; at least h / :data:`MAX_REDUCTION`. None
        where no estimate qualifies or the chains diverged."""
        if self.kind.startswith("diverged") or self.ess is None:
            return None
        b, se, ess = _flat(self.mean_bias, self.mean_bias_se, self.sd_bias, self.sd_bias_se,
                           self.ess)
        ok = _reducing(b, se, ess)
        if not ok.any():
            return None
        return self.step_size * max(BIAS_TARGET / float(np.max(b[ok])), 1.0 / MAX_REDUCTION)

    @property
    def resolution(self) -> float:
        """The smallest bias the probe would flag at its least precise coordinate (posterior
        sds for a mean, relative for an sd): the largest of :data:`FLAG_BIAS` and
        :func:`significance` standard errors; above :data:`BIAS_TOLERANCE` the probe's silence
        does not rule out a bias it was built to find. Infinite after a divergence."""
        if self.kind.startswith("diverged"):
            return float("inf")
        _, se, _ = _flat(self.mean_bias, self.mean_bias_se, self.sd_bias, self.sd_bias_se)
        worst = float(np.nanmax(se)) if se.size and np.isfinite(se).any() else float("inf")
        return max(FLAG_BIAS, significance(len(self.mean_bias)) * worst)

    @property
    def inconclusive(self) -> str:
        """Why the probe's silence does not clear the step ("" where it does): its
        :attr:`resolution` is above :data:`BIAS_TOLERANCE`."""
        r = self.resolution
        if self.flagged or r <= BIAS_TOLERANCE:
            return ""
        return (f"the probe resolves only biases of {r:.2g} or more (posterior sd for a mean, "
                f"relative for an sd), above the {BIAS_TOLERANCE} it is built to find; "
                "check_bias=True runs the full check")

    @property
    def message(self) -> str:
        """What the probe found, in words (for the warnings)."""
        h = self.step_size
        if self.kind.startswith("diverged"):
            who = ("the chains at h (not those at h/2)" if self.kind == "diverged-h"
                   else "the chains at h and h/2")
            return (f"the time step h = {h:.3g} is too large: in coupled runs at h and h/2 "
                    f"{who} became non-finite or exploded")
        what = "posterior mean" if self.kind == "mean" else "posterior sd"
        unit = "posterior sd" if self.kind == "mean" else "(relative)"
        runs = ("coupled runs at h and h/2 from the run's last draws" if self.after_run
                else "coupled runs at h and h/2")
        found = (f"the time step h = {h:.3g} biases the {what} of {{site}} by about "
                 f"{self.bias:+.2f} ± {self.bias_se:.2f} {unit} ({runs}, "
                 "Richardson-Romberg, Durmus et al. 2016)")
        if self.chosen_step is None:
            return found
        left = self.bias * self.chosen_step / h
        return (f"{found}; the step was reduced {h / self.chosen_step:.3g}-fold to "
                f"{self.chosen_step:.3g}, where about {left:+.2f} is left")


class AfterRunProbing:
    """A kernel's probe of its step's bias after a run, made once per final state and warned
    about: the kernel gives :attr:`probes_after_run` (whether it applies) and
    ``_after_run_probe_of(state, draws) -> (BiasProbe, labels of its coordinates)``."""

    #: (the last state of a run, its probe by :meth:`probe_after_run`)
    _after_run_probe: tuple | None = None
    probes_after_run: bool

    def probe_after_run(self, state: Any, draws: np.ndarray, *, warn: bool = True,
                        stacklevel: int = 2) -> BiasProbe | None:
        """The probe of the step's bias after a run (:attr:`probes_after_run`, else None): the
        kernel's coupled Richardson-Romberg pairs at h and h/2 (Durmus et al. 2016, Sect. 3)
        from the run's last state and draws; a :class:`StepBiasWarning` where it is flagged
        (with ``warn``). Made once per final ``state`` (the run check and ``to_arviz`` share
        it).

        Parameters
        ----------
        state
            The run's last state (``mcmc.last_state``; chains on the leading axis).
        draws
            Flat unconstrained draws (chains, draws, d) after warm-up, e.g. 256 evenly
            spaced per chain.
        warn, stacklevel
            Warn where the probe is flagged, at this ``stacklevel``.

        Returns
        -------
        BiasProbe or None
            The probe (``after_run=True``), or None where it does not apply.
        """
        cached = self._after_run_probe
        if cached is not None and cached[0] is state:
            return cached[1]
        if not self.probes_after_run:
            return None
        probe, labels = self._after_run_probe_of(state, draws)
        self._after_run_probe = (state, probe)
        if warn:
            warn_if_biased(probe, labels, type(self).__name__, stacklevel=stacklevel + 1)
        return probe

    def _after_run_probe_of(self, state: Any, draws: np.ndarray) -> tuple[BiasProbe, list]:
        raise NotImplementedError


def probe_steps(step_size: float) -> int:
    """Probe steps for time step h = ``step_size``: ``RELAXATION_STEPS / h`` (the whitened
    posterior relaxes in a time of order 1) within [``MIN_STEPS``, ``MAX_STEPS``], rounded up
    to a whole number of ``BATCHES``. At ``MAX_STEPS`` the probe's 3 · ``PROBE_PAIRS`` gradient
    estimates per step are 0.27 × those of a default run of 4 chains × 11,000 steps, each of
    the run's subsample size."""
    steps = min(max(RELAXATION_STEPS / max(float(step_size), 1e-12), MIN_STEPS), MAX_STEPS)
    return BATCHES * int(math.ceil(steps / BATCHES))


def significance(dim: int) -> float:
    """The number of standard errors an estimated bias must exceed: (2 log 4d)^(1/2) + 1, a
    Bonferroni-like bound over the 2d functions (means and sds of d coordinates), as the
    pilot's window test (:mod:`~numpyro_subsample.sgmcmc.warmup`), and at least 3.5."""
    return max(3.5, math.sqrt(2.0 * math.log(4.0 * max(int(dim), 1))) + 1.0)


def probe_bias(
    potential: Potential,
    data: ModelData,
    *,
    estimate: Any,
    estimator_params: Any,
    dynamics: Dynamics,
    centre: jax.Array,
    scale_tril: Scale,
    step_size: float,
    diffusion: float,
    noise_cov: Any = None,
    proxy: Any = None,
    seed: int = 0,
    pairs: int = PROBE_PAIRS,
    steps: int | None = None,
    refine: bool = False,
    sd: np.ndarray | None = None,
    starts: Callable[[int, np.random.Generator], np.ndarray] | None = None,
    precond: np.ndarray | None = None,
    update: Any = None,
    state: Any = None,
    state_axes: Any = 0,
    rng_impl: str = PROBE_RNG,
) -> BiasProbe:
    """Run the coupled Richardson-Romberg pairs at h = ``step_size`` and h/2 (module docstring).

    Parameters
    ----------
    potential, data
        The model's potential and data.
    estimate, estimator_params
        The kernel's gradient estimator ``estimate(params, key, θ, data)``.
    dynamics
        The kernel's dynamics (with ``step_noise``); a noise-corrected one injects S_h ξ with
        S_h S_hᵀ = 2ch I − h²V for V = ``noise_cov`` and c = ``diffusion``, at each of h and h/2.
    centre, scale_tril
        The whitening θ = θ̂ + L w.
    step_size
        The kernel's time step h.
    proxy
        The proxy, whose covariance gives the sd units and whose pilot draws (``info["draws"]``)
        start the pairs.
    seed
        Seed of the probe's draws.
    pairs, steps
        Coupled pairs, probe steps (default :func:`probe_steps`).
    refine
        Run up to :data:`REFINE_ROUNDS` further rounds of ``pairs`` pairs where
        :func:`suspect`, within :data:`MAX_ESTIMATES` gradient estimates in all.
    sd
        Per coordinate, the units of the figures the pairs record, m = (θ − θ̂)/sd (default
        sqrt(diag(L Lᵀ)) of a dense L). The estimates are ratios to the pairs' own sd at h/2
        (:func:`~numpyro_subsample.sgmcmc.coupled_pairs.batch_estimates`), so ``sd`` only
        keeps the figures of order one: any scale of the posterior's will do.
    starts
        ``starts(round, rng)``: the pairs' whitened start positions u (pairs, d) of each round
        (default: the pilot's draws, or proxy draws, :func:`start_positions`).
    precond
        Per pair, the diagonal preconditioner s (pairs, d) of an adapted run, w = s ⊙ u
        (:mod:`~numpyro_subsample.sgmcmc.adaptation`; default: none).
    update, state, state_axes
        A stateful estimator's ``update`` (used instead of ``estimate``), the state each
        pair's two chains start from in every round (pairs on the leading axis of the leaves
        with a chains axis) and the vmap axes of its leaves (its ``state_axes``).
    rng_impl
        The implementation of the pairs' keys (default Philox, as the chains').

    Returns
    -------
    BiasProbe
        Flagged with ``kind="diverged-h"`` when a chain at h became non-finite or left
        ``MAX_PROXY_SD`` proxy sds while those at h/2 did not, ``"diverged"`` when a chain at
        h/2 failed too (the run's chains at h would fail as well); the estimates are then NaN.

    References
    ----------
    Durmus, Şimşekli, Moulines, Badeau and Richard (2016), Sect. 3 (the
    Richardson-Romberg estimator and the coupling of the two chains' Gaussian increments).
    """
    t0 = time.perf_counter()
    h = float(step_size)
    dtype = centre.dtype
    d = potential.dim
    n = int(potential.plate.subsample_size)
    steps = int(steps or probe_steps(h))
    batch_len = max(steps // BATCHES, 1)
    steps = batch_len * BATCHES
    rng = np.random.default_rng([int(seed), 0xB1A5])
    if starts is None or sd is None:
        tril = np.asarray(scale_tril, np.float64)
        sd = np.sqrt(np.sum(tril * tril, axis=1)) if sd is None else sd  # sqrt(diag(L Lᵀ))
        if starts is None:
            def starts(r, g):
                return start_positions(proxy, np.asarray(centre, np.float64), tril, pairs, g,
                                       shift=r)
    scale_h = scale_half = None
    if dynamics.name.endswith("-corrected"):
        scale_h = device_array(injected_noise_scale(noise_cov, h, diffusion)[0], dtype)
        scale_half = device_array(injected_noise_scale(noise_cov, 0.5 * h, diffusion)[0], dtype)

    def run_round(r: int):  # the keys from the host generator: no eager key op to compile
        w0 = starts(r, rng)
        xi0 = rng.standard_normal((pairs, d))
        bits = rng.integers(0, 2**32, 2, dtype=np.uint32)
        key = jax.random.wrap_key_data(device_array(bits), impl=rng_impl)
        return run_pairs(
            estimate, dynamics, batch_len, estimator_params, centre, scale_tril, sd, h,
            (scale_h, scale_half), (w0, xi0), key, data, precond, update=update, state=state,
            state_axes=state_axes)

    return probe_rounds(run_round, step_size=h, dim=d, pairs=pairs, steps=steps,
                        estimate_passes=n / potential.num_data, refine=refine, started=t0)


def probe_rounds(run_round: Callable[[int], tuple[np.ndarray, np.ndarray, float]], *,
                 step_size: float, dim: int, pairs: int, steps: int, estimate_passes: float,
                 refine: bool, started: float) -> BiasProbe:
    """The rounds of coupled pairs of :func:`probe_bias` and what they measured:
    ``run_round(r)`` runs round r's ``pairs`` pairs for ``steps`` steps (round 0 first, the
    others from other starts) and returns their batch means (pairs, batches, 4, dim), whether
    the chains at h and at h/2 stayed healthy and the full data passes spent beyond the
    gradient estimates (each ``estimate_passes`` of a pass). With ``refine``, up to
    :data:`REFINE_ROUNDS` further rounds where :func:`suspect`, then while :func:`undecided`
    (within :data:`MAX_ESTIMATES` and :data:`MAX_ESCALATED_ESTIMATES`); a first round's
    alarm stands only if a second round's pairs pooled in keep it."""
    h, d = float(step_size), int(dim)
    extra: list[float] = []  # full data passes of the estimator's updates (SVRG's refreshes)

    def run(r: int):
        sums, ok, passes = run_round(r)
        extra.append(float(passes))
        return sums, ok

    def diverged(ok, total_pairs):  # a chain became non-finite or exploded: no estimate
        nan = np.full(d, np.nan)
        evaluations = 3 * total_pairs * steps
        return BiasProbe(h, nan, nan, nan, nan, 0, "diverged-h" if ok[1] else "diverged",
                         True, total_pairs, steps, evaluations,
                         float(evaluations * estimate_passes + sum(extra)),
                         time.perf_counter() - started, nan)

    sums, ok = run(0)
    if not ok.all():
        return diverged(ok, pairs)
    estimates = batch_estimates(sums)
    affordable = MAX_ESTIMATES // (3 * pairs * steps) - 1
    rounds = min(REFINE_ROUNDS, affordable) if refine and suspect(*estimates[:4]) else 0

    def more_rounds(r: int) -> bool:  # the refinement's rounds, then while an estimate is open
        return r < rounds or (refine and undecided(*estimates)
                              and 3 * pairs * (r + 2) * steps <= MAX_ESCALATED_ESTIMATES)

    r = 0
    while more_rounds(r):  # more pairs from other starts, the same program
        r += 1
        more, ok = run(r)
        if not ok.all():
            return diverged(ok, pairs * (r + 1))
        sums = np.concatenate([sums, more], axis=0)
        if r >= rounds:
            estimates = batch_estimates(sums)
    worst, kind, flagged = _flag(estimates)
    if flagged and r == 0:  # one round's alarm stands only if the pairs of a second keep it
        r = 1
        more, ok = run(r)
        if not ok.all():
            return diverged(ok, pairs * 2)
        sums = np.concatenate([sums, more], axis=0)
        estimates = batch_estimates(sums)
        worst, kind, flagged = _flag(estimates)
    pairs *= r + 1
    evaluations = 3 * pairs * steps
    passes = evaluations * estimate_passes + sum(extra)
    mean_bias, mean_se, sd_bias, sd_se, ess = estimates
    return BiasProbe(h, mean_bias, mean_se, sd_bias, sd_se, worst, kind, flagged, pairs,
                     steps, evaluations, float(passes), time.perf_counter() - started, ess)


def _flat(mean_bias, mean_se, sd_bias, sd_se, ess=None):
    """|bias|, standard errors and ESS of the means' and the sds' estimates, one flat array
    each (the means' first; ``ess`` per coordinate, repeated; None without it)."""
    b = np.abs(np.concatenate([np.ravel(mean_bias), np.ravel(sd_bias)]))
    se = np.concatenate([np.ravel(mean_se), np.ravel(sd_se)])
    return b, se, None if ess is None else np.concatenate([np.ravel(ess)] * 2)


def _reducing(b, se, ess) -> np.ndarray:
    """Which estimates (|b|, se, ess) may reduce the step (:attr:`BiasProbe.bias_limited_step`)."""
    return ((b >= REDUCE_FROM) & (b > REDUCE_Z * se)
            & (b - REDUCE_LOWER_SE * se >= BIAS_TARGET) & (ess >= MIN_ESS))


def undecided(mean_bias, mean_se, sd_bias, sd_se, ess) -> bool:
    """Whether some estimate is at least :data:`ESCALATE_FROM`, beyond :data:`ESCALATE_Z`
    standard errors and larger than every estimate that may reduce the step, but may not
    itself (:attr:`BiasProbe.bias_limited_step`): the probe then runs further rounds of pairs,
    within :data:`MAX_ESCALATED_ESTIMATES` gradient estimates."""
    b, se, ess = _flat(mean_bias, mean_se, sd_bias, sd_se, ess)
    b = np.nan_to_num(b, nan=0.0)
    cuts = _reducing(b, se, ess)
    largest = float(np.max(b[cuts])) if cuts.any() else 0.0
    open_ = (b >= ESCALATE_FROM) & (b > ESCALATE_Z * se) & ~cuts & (b > largest)
    return bool(open_.any())


def suspect(mean_bias, mean_se, sd_bias, sd_se) -> bool:
    """Whether some estimate is at least :data:`REFINE_FROM` and beyond :data:`REFINE_Z`
    standard errors: the probe then runs :data:`REFINE_ROUNDS` more rounds of pairs."""
    b, se, _ = _flat(mean_bias, mean_se, sd_bias, sd_se)
    return bool(np.any((b >= REFINE_FROM) & (b > REFINE_Z * se)))


def _flag(estimates: tuple) -> tuple[int, str, bool]:
    """:func:`worst_coordinate` of the estimates of :func:`~numpyro_subsample.sgmcmc.
    coupled_pairs.batch_estimates`, flagged only where its series has :data:`MIN_ESS`."""
    mean_bias, mean_se, sd_bias, sd_se, ess = estimates
    worst, kind, flagged = worst_coordinate(mean_bias, mean_se, sd_bias, sd_se)
    return worst, kind, flagged and bool(ess[worst] >= MIN_ESS)


def worst_coordinate(mean_bias, mean_se, sd_bias, sd_se) -> tuple[int, str, bool]:
    """The coordinate and kind (``"mean"`` or ``"sd"``) of the largest bias that is
    significant (beyond :func:`significance` standard errors), else of the largest |bias|;
    and whether it is flagged: at least :data:`FLAG_BIAS` and significant."""
    z = significance(len(mean_bias))
    mb, ms = np.abs(np.asarray(mean_bias)), np.asarray(mean_se)
    sb, ss = np.abs(np.asarray(sd_bias)), np.asarray(sd_se)
    # the lower confidence bound of each |bias|: the largest one is the worst
    low = np.concatenate([mb - z * ms, sb - z * ss])
    low = np.nan_to_num(low, nan=-np.inf)
    k = int(np.argmax(low))
    d = len(mb)
    kind, j = ("mean", k) if k < d else ("sd", k - d)
    value = (mb if kind == "mean" else sb)[j]
    se = (ms if kind == "mean" else ss)[j]
    flagged = bool(value >= FLAG_BIAS and value > z * se)
    return j, kind, flagged


def warn_if_biased(probe: BiasProbe | None, names: list[str], kernel: str, *,
                   stacklevel: int = 2) -> None:
    """A :class:`StepBiasWarning` when ``probe`` is flagged, naming the coordinate (``names``:
    the flat coordinates' labels), the bias ± its standard error, the step and the remedy."""
    if probe is None or not probe.flagged:
        return
    site = names[probe.worst] if 0 <= probe.worst < len(names) else f"θ[{probe.worst}]"
    h = probe.chosen_step or probe.step_size
    warnings.warn(
        f"{kernel}: {probe.message.format(site=site)}; pass "
        f"step_size={h / 2:.3g} or smaller with more num_samples, or a smaller "
        "max_variance_inflation (bias_probe=False turns this check off).",
        StepBiasWarning, stacklevel=stacklevel,
    )


def _per_chain(axes: Any, fn: Callable, *trees: Any) -> Any:
    """``fn`` mapped over the leaves of ``trees`` that the vmap axes ``axes`` (a pytree prefix
    of them, :attr:`~numpyro_subsample.estimators.base.GradientEstimator.state_axes`) give
    a chains axis; the leaves common to the chains (axis None) as in ``trees[0]``."""
    return jax.tree.map(lambda ax, *sub: sub[0] if ax is None else jax.tree.map(fn, *sub),
                        axes, *trees, is_leaf=lambda a: a is None)


def state_reason(estimator: Any, state: Any, pairs: int = PROBE_PAIRS) -> str | None:
    """Why the probe cannot carry the state of the stateful ``estimator`` (a
    :class:`~numpyro_subsample.estimators.base.GradientEstimator`; ``state``: one chain's, or
    its shapes), or None: two per-chain states per pair above :data:`MAX_PROBE_STATE_BYTES`."""
    if estimator.update is None:
        return None
    sizes = _per_chain(estimator.state_axes,
                       lambda a: int(np.prod(np.shape(a))) * np.dtype(a.dtype).itemsize, state)
    size = sum(v for v in jax.tree.leaves(sizes) if isinstance(v, int))
    if 2 * pairs * size > MAX_PROBE_STATE_BYTES:
        return (f"the estimator {estimator.name!r} keeps a state of {size / 2**20:.0f} MB per "
                f"chain, {2 * pairs} of which the probe's pairs would hold")
    return None


def skip_reason(pre: Any, dynamics: Dynamics, data: ModelData | None = None) -> str | None:
    """Why the probe cannot run on the preprocessing ``pre``, or None: a stateful estimator
    whose state the pairs cannot carry (:func:`state_reason`; its shapes from ``data``), a
    structured proxy (the starts and sd units of :func:`probe_bias` are those of a dense L:
    :func:`probe_after_run` probes it after the run), dynamics without ``step_noise``."""
    est = pre.estimator
    if est.update is not None:
        if data is None:
            return f"the estimator {est.name!r} keeps a state per chain"
        shapes = jax.eval_shape(lambda p, x: est.init_state(p, x)[0], est.params, data)
        reason = state_reason(est, shapes)
        if reason is not None:
            return reason
    if not (isinstance(pre.scale_tril, jax.Array) and pre.scale_tril.ndim == 2):
        return STRUCTURED_SKIP
    if dynamics.step_noise is None:
        return f"the dynamics {dynamics.name!r} take no given noise"
    return None


def not_probed(pre: Any, reason: str) -> Any:
    """``pre`` (a :class:`~numpyro_subsample.sgmcmc.chain.Preprocessed`) recording in
    ``step_bias_skipped`` why its step's bias was not probed (for the run check's record)."""
    return pre._replace(step_bias=None, step_bias_skipped=str(reason))


def probed(pre: Any, data: ModelData, *, dynamics: Dynamics, diffusion: float, seed: int,
           kernel: str, reduce_step: bool = False, stacklevel: int = 2,
           rng_impl: str = PROBE_RNG) -> Any:
    """``pre`` (a :class:`~numpyro_subsample.sgmcmc.chain.Preprocessed`) with the probe of its
    step in ``step_bias`` and its cost added to ``data_passes`` and ``seconds``; with
    ``reduce_step`` (a step the kernel's rule chose), at the probe's
    :attr:`~BiasProbe.bias_limited_step` where it has one (recorded in the probe's
    ``chosen_step``); warns (:func:`warn_if_biased`). Where :func:`skip_reason` gives a
    reason, ``pre`` with that reason in ``step_bias_skipped`` (:func:`not_probed`)."""
    from numpyro_subsample.core.sites import coordinate_names
    from numpyro_subsample.sgmcmc.noise_refine import with_time_step

    reason = skip_reason(pre, dynamics, data)
    if reason is not None:
        return not_probed(pre, reason)
    est = pre.estimator
    state, state_passes = None, 0.0
    if est.update is not None:  # every pair starts from a new chain's state, as the run's
        one, state_passes = est.init_state(est.params, data)
        state = _per_chain(est.state_axes,
                           lambda a: jax.numpy.broadcast_to(a, (PROBE_PAIRS,) + a.shape), one)
    probe = probe_bias(
        pre.potential, data, estimate=est.estimate,
        estimator_params=est.params, dynamics=dynamics, centre=pre.centre,
        scale_tril=pre.scale_tril, step_size=pre.step_size, diffusion=diffusion,
        noise_cov=pre.noise_cov, proxy=pre.proxy, seed=seed, refine=reduce_step,
        update=est.update, state=state, state_axes=est.state_axes, rng_impl=rng_impl,
    )
    probe = probe._replace(data_passes=probe.data_passes + float(state_passes))
    new_h = probe.bias_limited_step if reduce_step else None
    if new_h is not None:
        capped = new_h <= probe.step_size / MAX_REDUCTION * (1 + 1e-9)
        left = abs(probe.bias) * new_h / probe.step_size
        probe = probe._replace(chosen_step=float(new_h),
                               flagged=bool(capped and left >= FLAG_BIAS and probe.flagged))
        pre = with_time_step(pre, new_h, diffusion)
    warn_if_biased(probe, coordinate_names(pre.potential), kernel, stacklevel=stacklevel + 1)
    passes = pre.data_passes + probe.data_passes
    params = pre.params._replace(data_passes=device_array(passes, pre.centre.dtype))
    return pre._replace(step_bias=probe, step_bias_skipped="", data_passes=passes, params=params,
                        seconds=pre.seconds + probe.seconds,
                        cost=(*pre.cost, ("bias probe", float(probe.data_passes))))


def after_run_reason(pre: Any, dynamics: Dynamics, bias_probe: bool = True,
                     data: ModelData | None = None) -> str | None:
    """None where :func:`probe_after_run` applies to a run with the preprocessing ``pre``: its
    own probe was skipped for the adapted preconditioner, a structured proxy or local latent
    sites (:data:`ADAPTED_SKIP`, :data:`STRUCTURED_SKIP`, :data:`LOCAL_SKIP`), with
    ``bias_probe``, a stateless estimator or one whose per-chain state the pairs carry
    (:func:`state_reason`, its shapes from ``data``) and ``dynamics`` with ``step_noise`` and
    no noise correction; else why the step's bias is not probed (as recorded)."""
    if not bias_probe:
        return "bias_probe=False"
    if pre.step_bias is not None or pre.step_bias_skipped not in (
            ADAPTED_SKIP, STRUCTURED_SKIP, LOCAL_SKIP):
        return pre.step_bias_skipped or "the step was probed in the preprocessing"
    reason = skip_reason(pre, dynamics, data)
    if reason not in (None, STRUCTURED_SKIP):  # the preprocessing's own reasons, bar the proxy's
        return reason
    if pre.noise_corrected:
        return f"the dynamics {dynamics.name!r} take no given noise"
    return None


def probe_after_run(pre: Any, data: ModelData, *, draws: np.ndarray,
                    precond: np.ndarray | None, dynamics: Dynamics, diffusion: float,
                    seed: int, pairs: int = PROBE_PAIRS, est_state: Any = None) -> BiasProbe:
    """The probe of :func:`probe_bias` after a run whose preprocessing could not make it: the
    adapted preconditioner (fixed only at the warm-up's end) or a structured proxy.

    The Richardson-Romberg pairs at h and h/2 (Durmus, Şimşekli, Moulines, Badeau and Richard
    2016, Sect. 3) take the run's step h, dynamics and estimator and move as its chains did:
    u with θ = θ̂ + L (s ⊙ u), L the proxy's whitening (dense or structured, only applied),
    s the final diagonal preconditioner of the chain whose draws start the pair
    (:mod:`~numpyro_subsample.sgmcmc.adaptation`; ones without one). They start at the
    chains' last draws (pair p at chain p mod C; further pairs and rounds at earlier draws),
    which are already near π_h. The figures are in units of the draws' per-coordinate sds,
    not of diag(L Lᵀ) (which a structured proxy does not form); the estimates are ratios to
    the pairs' own sd at h/2 in any case. A stateful estimator's pairs (both chains) start
    from the state of the chain whose draws start them (``est_state``: local sites' last
    draws, SAGA's table), where :func:`state_reason` allows. The step is not changed (the run
    is done): a flagged probe's remedy is a smaller ``step_size``. Costs as
    :func:`probe_bias`.

    Parameters
    ----------
    pre
        The run's :class:`~numpyro_subsample.sgmcmc.chain.Preprocessed`.
    data
        The model's data.
    draws
        Flat unconstrained draws (chains, draws, d) of the run after warm-up (a thinned
        subset will do: :data:`AFTER_RUN_DRAWS` per chain).
    precond
        The chains' adapted diagonal preconditioner s (chains, d) from their last state, or
        None.
    dynamics, diffusion
        The kernel's dynamics and the c of its injected noise.
    seed
        Seed of the probe's draws.
    pairs
        Coupled pairs per round.
    est_state
        A stateful estimator's last states of the chains (chains on the leading axis), or
        None.

    Returns
    -------
    BiasProbe
        With ``after_run=True`` (``chosen_step`` None).

    References
    ----------
    Durmus, Şimşekli, Moulines, Badeau and Richard (2016), Sect. 3.
    """
    from numpyro_subsample.proxies.whitening import whiten_solve

    x = np.asarray(draws, np.float64)
    d = x.shape[-1]
    x = x.reshape(-1, x.shape[-2], d)
    chains, n = x.shape[:2]
    sd = x.reshape(-1, d).std(0)
    sd = np.where(np.isfinite(sd) & (sd > 0), sd, 1.0)
    owner = np.arange(pairs) % chains  # pair p starts from chain p mod C, with its s
    s = (np.ones((pairs, d)) if precond is None
         else np.asarray(precond, np.float64).reshape(-1, d)[owner % np.shape(precond)[0]])
    per_chain = -(-pairs // chains)  # pairs per chain and round
    spacing = max(n // ((REFINE_ROUNDS + 1) * per_chain), 1)
    centre = np.asarray(pre.centre, np.float64)

    def starts(r: int, rng: np.random.Generator) -> np.ndarray:
        back = np.arange(pairs) // chains + r * per_chain
        theta = x[owner, np.clip(n - 1 - back * spacing, 0, n - 1)] - centre
        w = np.asarray(whiten_solve(pre.scale_tril, device_array(theta, pre.centre.dtype)))
        return w / s

    est = pre.estimator
    state = None
    if est.update is not None:  # one chain's state has no chains axis: add it
        one = jax.eval_shape(lambda p, x: est.init_state(p, x)[0], est.params, data)
        state = _per_chain(
            est.state_axes,
            lambda a, ref: (a if np.ndim(a) > len(ref.shape) else a[None])[owner % chains],
            est_state, one)
    probe = probe_bias(pre.potential, data, estimate=est.estimate,
                       estimator_params=est.params, dynamics=dynamics,
                       centre=pre.centre, scale_tril=pre.scale_tril, step_size=pre.step_size,
                       diffusion=diffusion, seed=seed, pairs=pairs, sd=sd, starts=starts,
                       precond=s, update=est.update, state=state,
                       state_axes=est.state_axes)
    return probe._replace(after_run=True)
