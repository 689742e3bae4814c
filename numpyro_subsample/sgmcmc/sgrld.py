"""SGRLD: stochastic gradient Riemannian Langevin dynamics on the probability simplex.

Patterson and Teh (2013), expanded-mean parameterisation with mirroring, for models whose
latent sites are all global Dirichlet sites (outside the subsample plate), with the
likelihood's gradient estimated from a uniform subsample (Welling and Teh 2011) or a
stratified one over k-means clusters (CP-SGRLD, Fu and Zhang 2023, Eq. 10 and Sect. 4.3).
The functional core (states, pure ``init_one`` and ``step``) is
:mod:`numpyro_subsample.sgmcmc.simplex`; :class:`SGRLD` wraps it in the thin adapter of
:mod:`numpyro_subsample.core.adapter`, so it runs under ``numpyro.infer.MCMC``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to

from numpyro_subsample.core.adapter import SubsampleKernel
from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.datapass import DEFAULT_CHUNK
from numpyro_subsample.core.options import suggest_keywords
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.core.rng import STEP_RNG
from numpyro_subsample.estimators.local import LocalConfig
from numpyro_subsample.estimators.selection import SamplingDesign
from numpyro_subsample.estimators.stratified import Strata
from numpyro_subsample.sgmcmc.options import (
    NoiseOptions,
    StepSchedule,
    StrataOptions,
    check_record,
    legacy_records,
)
from numpyro_subsample.sgmcmc.simplex import (
    SGRLDConfig,
    SGRLDParams,
    SGRLDState,
    sgrld_programs,
)
from numpyro_subsample.sgmcmc.simplex_model import (
    check_positive,
    check_simplex_model,
    dirichlet_base,
    draw_values,
    reference_totals,
)
from numpyro_subsample.sgmcmc.simplex_probe import probe_simplex, simplex_labels
from numpyro_subsample.sgmcmc.simplex_step import (
    EM_ITERATIONS,
    MAX_AUTO_STRATA,
    MAX_FEATURE_NUMBERS,
    NOISE_LIMIT_FACTOR,
    dirichlet_concentrations,
    simplex_step,
)
from numpyro_subsample.sgmcmc.step_bias import AfterRunProbing

__all__ = [
    "EM_ITERATIONS",
    "MAX_AUTO_STRATA",
    "MAX_FEATURE_NUMBERS",
    "NOISE_LIMIT_FACTOR",
    "SGRLD",
    "SGRLDPreprocessed",
    "check_simplex_model",
    "dirichlet_base",
    "reference_totals",
]

#: Keywords of the previous release (:func:`~numpyro_subsample.sgmcmc.options.legacy_records`).
_DEPRECATED = ("max_variance_inflation", "decay_offset", "decay_power", "num_strata", "features",
               "kmeans_iters", "strata_seed", "local_update", "local_steps")


class SGRLDPreprocessed(NamedTuple):
    """Everything computed once per data set: the design of the subsample and its estimator's
    name (``"uniform"`` or ``"stratified"``), the Dirichlet concentrations α, the schedule
    (a, b, c), the strata (stratified estimator), the measured noise (max_k V_k / θ*_k of
    :class:`SGRLD`'s step rule; NaN when not measured), the arrays the step reads
    (``params``), the largest relaxation rate λ of the step rule (NaN when not measured) and
    why the step's bias was not probed (for the run check's record; it is probed after the
    run, :meth:`SGRLD.probe_after_run`)."""

    potential: Potential
    design: SamplingDesign
    alpha: dict
    step_size: float
    schedule: tuple[float, float, float]
    strata: Strata | None
    data_passes: float
    seconds: float
    params: SGRLDParams
    estimator: str = "uniform"
    noise: float = float("nan")
    rate: float = float("nan")
    step_bias_skipped: str = "SGRLD probes its step after the run"


class SGRLD(AfterRunProbing, SubsampleKernel):
    """Stochastic gradient Riemannian Langevin dynamics on the probability simplex
    (Patterson and Teh 2013), expanded-mean parameterisation with mirroring.

    Every latent site must be a global Dirichlet site (``Dirichlet``, expanded by plates or
    ``expand(...).to_event(...)``; the last axis is the simplex); the likelihood is the
    observed sites of ``numpyro.plate(name, N, subsample_size=n)``, n data per step. Each
    Dirichlet(α) value π is carried as θ, θ_k ~ Gamma(α_k, 1), π = θ / Σθ, and moves by
    θ ← |θ + (ε_t/2)(α − θ + θ ĝ) + sqrt(ε_t θ) ξ|
    (:func:`~numpyro_subsample.sgmcmc.simplex.mirrored_langevin`). The draws (``get_samples``)
    are the simplex values π under each site's name, with the deterministic sites outside the
    plate. ``init_params``, if given, are simplex values per site.

    Parameters
    ----------
    model
        A NumPyro model as above.
    step_size
        a of ε_t = a (1 + t/b)^(−c), t the iteration (warmup included). ``None``: a from the
        measured gradient noise, so that the stationary variance of a locally linear drift is
        inflated by about δ = ``noise.max_variance_inflation`` (the analogue of the SG
        kernels' rule, :mod:`~numpyro_subsample.sgmcmc.stepsize`). Linearised at θ*, simplex
        row r relaxes at the rate λ_r = 1 + max_k F_k / θ*_k at most (time units ε/2; 1 from
        the Gamma prior, F_k = Σ_i h_ik² the empirical Fisher information of the likelihood in
        the metric diag(θ), h_i = θ ⊙ ∇_θ log p(x_i | π): N/S for categorical counts,
        :func:`~numpyro_subsample.sgmcmc.simplex.relaxation_rates`), so the Euler step
        inflates the variance by ε λ_r / 4; the subsample adds ε²V_k/4 to the injected
        ε θ_k, a further ε V_k / (4 θ_k), V_k the design's variance of Σ_j w_j h_{i_j, k}
        (:func:`~numpyro_subsample.sgmcmc.simplex.drift_noise`). Hence
        a = 4δ / max_k (λ_r + V_k / θ*_k), the analogue of h = 2δ / (v + μ(1 + δ)). The
        point is π* after at most ``EM_ITERATIONS`` scoring steps from the prior mean
        (:func:`~numpyro_subsample.sgmcmc.simplex.em_point`, whose fixed point is the zero
        of the noise-free drift: the posterior mean for categorical counts), θ* = S_r π*
        with S_r of :func:`reference_totals` (E[1/S] of the total S = Σθ, which every chain
        starts at Σα_r: S only sets the clock of π's diffusion). With local latent sites the
        drifts h_i(z_i) draw z_i by the inner update ``local``
        (:mod:`~numpyro_subsample.sgmcmc.simplex_local`: V then holds their spread over
        z_i). A step that the noise makes ``NOISE_LIMIT_FACTOR`` times smaller than the
        noise-free one warns (``NoiseLimitedStepWarning``), naming the noise and the remedy.
    estimator
        ``"auto"`` (default), ``"uniform"`` (weights N/n, with or without replacement) or
        ``"stratified"`` (Fu and Zhang 2023, Eq. 10: k-means strata, b_j of n_j drawn without
        replacement, weights n_j / b_j, Neyman allocation of their Eq. 14; through
        :func:`~numpyro_subsample.estimators.stratified.make_strata`). ``"auto"`` measures
        the noise max_k V_k / θ*_k of both designs at π* and takes the one with the larger
        default step; its strata are the distinct feature rows when there are at most
        ``MAX_AUTO_STRATA`` of them and at most n/2 (categorical data: no subsample noise),
        else ``strata.num_strata`` k-means strata. With local latent sites the default
        features are the drifts h_i(z_i), z_i drawn by their inner update
        (:func:`~numpyro_subsample.sgmcmc.simplex_local.local_datum_drifts`); ``"auto"`` is
        ``"stratified"`` with your ``strata.features``, and ``"uniform"`` when the default
        features would exceed ``MAX_FEATURE_NUMBERS`` numbers or (local sites) a
        ``step_size`` is given.
    replace
        Uniform subsample with replacement (default) or without.
    schedule
        A :class:`~numpyro_subsample.sgmcmc.options.StepSchedule` (default constant: the
        default a already bounds the inflation by δ), or its ``kind`` alone
        (``"constant"`` or ``"polynomial"``).
    strata
        A :class:`~numpyro_subsample.sgmcmc.options.StrataOptions`: the k-means strata of
        ``"stratified"`` (default ``StrataOptions()``).
    noise
        A :class:`~numpyro_subsample.sgmcmc.options.NoiseOptions`: δ of the default
        ``step_size`` (``max_variance_inflation``, default 0.05); SGRLD has no noise
        correction.
    local
        A :class:`~numpyro_subsample.estimators.local.LocalConfig`: local latent sites
        (continuous sites inside the plate, e.g. LDA's per-document topic proportions;
        :mod:`~numpyro_subsample.estimators.local`) are moved given π before each gradient,
        by its ``update(rng_key, rows, values, idx, *model_args, **model_kwargs) -> rows`` (an
        exact conditional; ``values`` the simplex values π) or by its ``steps`` MALA steps
        (default ``LocalConfig()``). ``"stratified"`` with a given ``step_size`` then needs
        ``strata.features``; the draws hold π only.
    chunk_size
        Data per vmapped evaluation in the full-data passes.
    bias_probe
        Probe the constant step's bias after the run, in its check (default True;
        :meth:`probe_after_run`): coupled pairs of chains at ε and ε/2 (Durmus et al. 2016,
        Sect. 3) from the run's last states, which warn (``StepBiasWarning``) where a bias of
        0.2 posterior sd of a mean (or 20 % of an sd) is significant.
    seed
        Seed of the preprocessing (the model trace, the local sites' draws).
    **deprecated
        Keywords of the previous release, accepted with a ``DeprecationWarning`` naming the
        record that replaces them (the draws are the same): ``max_variance_inflation``
        (``noise``), ``decay_offset``, ``decay_power`` (``schedule``), ``num_strata``,
        ``features``, ``kmeans_iters``, ``strata_seed`` (``strata``), ``local_update``,
        ``local_steps`` (``local``).

    References
    ----------
    Patterson and Teh (2013) (SGRLD in the expanded-mean parameterisation, with
    mirroring); Fu and Zhang (2023), Sect. 4.3 (CP-SGRLD) and Eq. 10, 14.
    """

    sample_field = "pi"
    default_fields = ("pi", "diverging")
    supports_local = True

    @suggest_keywords(deprecated=_DEPRECATED)
    def __init__(
        self,
        model: Callable,
        *,
        step_size: float | None = None,
        estimator: str = "auto",
        replace: bool = True,
        schedule: str | StepSchedule = "constant",
        strata: StrataOptions | None = None,
        noise: NoiseOptions | None = None,
        local: LocalConfig | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        bias_probe: bool = True,
        seed: int = 0,
        **deprecated: Any,
    ) -> None:
        kind = schedule if isinstance(schedule, str) else None
        records = legacy_records("SGRLD", deprecated, noise=noise, local=local,
                                 schedule=None if kind is not None else schedule,
                                 strata=strata)
        for name, record in records.items():
            check_record("SGRLD", name, record)
        if kind is not None:
            given = records["schedule"] or StepSchedule()
            records["schedule"] = StepSchedule(kind=kind, decay_offset=given.decay_offset,
                                               decay_power=given.decay_power)
        noise = records["noise"] or NoiseOptions()
        if noise.correction:
            raise ValueError("SGRLD: NoiseOptions(correction=True) is not supported (the "
                             "simplex dynamics inject no corrected noise); leave it out.")
        local = records["local"] or LocalConfig()
        if estimator not in ("auto", "uniform", "stratified"):
            raise ValueError(f"SGRLD: estimator must be 'auto', 'uniform' or 'stratified', "
                             f"got {estimator!r}.")
        check_positive("step_size", step_size, none=True)
        check_positive("max_variance_inflation", noise.max_variance_inflation)
        if not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or (
                chunk_size < 1):
            raise ValueError(f"SGRLD: chunk_size must be a positive integer, got "
                             f"{chunk_size!r}.")
        if not isinstance(bias_probe, (bool, np.bool_)):
            raise TypeError(f"SGRLD: bias_probe must be True or False (whether the step's bias "
                            f"is probed after the run), got {bias_probe!r}. Pass True or "
                            "False.")
        super().__init__(model, seed=seed)
        self.bias_probe = bool(bias_probe)
        self._step_size = None if step_size is None else float(step_size)
        self._estimator_request, self.replace = estimator, bool(replace)
        self.schedule = records["schedule"]
        self.strata_options = records["strata"] or StrataOptions()
        self.max_variance_inflation = float(noise.max_variance_inflation)
        self.chunk_size = int(chunk_size)
        self.local = local._replace(steps=int(local.steps))

    @property
    def step_size(self) -> float:
        """a, the initial step of the schedule in use."""
        return self.preprocessed.step_size

    @property
    def estimator_name(self) -> str:
        """The estimator: as requested, or once preprocessed the one in use (``"auto"``
        resolved to ``"uniform"`` or ``"stratified"``)."""
        return self._estimator_request if self._pre is None else self._pre.estimator

    @property
    def strata(self) -> Strata | None:
        """The strata of the stratified estimator (None for ``"uniform"``)."""
        return self.preprocessed.strata

    def get_diagnostics_str(self, state: SGRLDState) -> str:
        return f"step size {float(np.asarray(state.step_size).max()):.2e}"

    def potential_for(self, data: ModelData) -> Potential:
        if data.signature() not in self._potentials:
            check_simplex_model(self._model, data)
        return super().potential_for(data)

    def _preprocess(self, potential: Potential, data: ModelData) -> SGRLDPreprocessed:
        t0 = time.perf_counter()
        request = self._estimator_request
        if potential.local and request == "stratified" and (
                self.strata_options.features is None and self._step_size is not None):
            raise ValueError(
                f"SGRLD: the model has local latent sites {list(potential.local_sites)} inside "
                f"the subsample plate '{potential.plate.name}': estimator='stratified' with "
                "a given step_size needs StrataOptions(features=...) (e.g. the documents' word "
                "frequencies); without step_size the features are the drifts measured with "
                "the local sites drawn by their inner update."
            )
        dtype = potential.init_theta.dtype
        alpha = dirichlet_concentrations(potential, data)
        chosen = simplex_step(
            potential, data, alpha, request=request, step_size=self._step_size,
            max_variance_inflation=self.max_variance_inflation, replace=self.replace,
            strata=self.strata_options, local=self.local, chunk_size=self.chunk_size,
            seed=self.seed)
        sch = self.schedule
        b, c = (sch.decay_offset, sch.decay_power) if sch.kind == "polynomial" else (1, 0)
        schedule = (chosen.step_size, float(b), float(c))
        passes = chosen.data_passes
        params = SGRLDParams(alpha=alpha, design=chosen.design.params,
                             schedule=device_array(schedule, dtype),
                             data_passes=device_array(passes, dtype))
        return SGRLDPreprocessed(
            potential=potential, design=chosen.design, alpha=alpha,
            step_size=chosen.step_size, schedule=schedule, strata=chosen.strata,
            data_passes=passes, seconds=time.perf_counter() - t0, params=params,
            estimator=chosen.estimator, noise=chosen.noise, rate=chosen.rate,
            step_bias_skipped=(
                "bias_probe=False" if not self.bias_probe
                else "SGRLD probes its step after the run" if sch.kind == "constant"
                else "the step decays (schedule='polynomial'): no constant step to probe"))

    @property
    def probes_after_run(self) -> bool:
        """Whether the step's bias is probed after a run (:meth:`probe_after_run`): with
        ``bias_probe`` and a constant step."""
        pre = self._pre
        return (pre is not None and self.bias_probe and self.schedule.kind == "constant")

    def _after_run_probe_of(self, state: SGRLDState, draws: np.ndarray):
        """The pairs at ε and ε/2 of
        :func:`~numpyro_subsample.sgmcmc.simplex_probe.probe_simplex` from the run's last
        states, in units of the draws' sds of π (``draws``: the Dirichlet sites'
        stick-breaking coordinates, mapped back to π); the labels of the simplex values."""
        pre = self._pre
        to_pi = biject_to(constraints.simplex)
        x = jnp.asarray(draws)
        flat = x.reshape((-1, x.shape[-1]))
        pi = jax.vmap(lambda t: {k: to_pi(v) for k, v in pre.potential.unravel(t).items()})(flat)
        pi = {k: np.asarray(v).reshape(x.shape[:2] + v.shape[1:]) for k, v in pi.items()}
        probe = probe_simplex(self._config(pre, traced=False), pre.params, self._pre_data,
                              state=state, pi_draws=pi, rate=pre.rate, seed=self.seed)
        labels = simplex_labels({k: v[0, 0] for k, v in pi.items()})
        return probe._replace(labels=tuple(labels)), labels

    def _config(self, pre: SGRLDPreprocessed, traced: bool) -> SGRLDConfig:
        """The static configuration of the programs (Threefry keys where NumPyro traces the
        step, as the SG kernels' :meth:`~.SGMCMCKernel._config`)."""
        return SGRLDConfig(potential=pre.potential, draw=pre.design.draw, size=pre.design.size,
                           rng_impl="threefry2x32" if traced else STEP_RNG, local=self.local)

    def _programs(self, pre: SGRLDPreprocessed, *, num_warmup: int, traced: bool):
        del num_warmup
        init_one, step = sgrld_programs(self._config(pre, traced))
        return init_one, step, pre.params

    def _state_axes(self) -> SGRLDState:
        return SGRLDState(**dict.fromkeys(SGRLDState._fields, 0))._replace(params=None)

    def postprocess_fn(self, model_args, model_kwargs) -> Callable[[dict], dict]:
        return self.draw_fn(draw_values, model_args, model_kwargs)
