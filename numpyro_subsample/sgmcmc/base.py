"""The stochastic-gradient kernel shared by SGLD, SGHMC and SGNHT: the NumPyro ``MCMCKernel``.

:class:`SGMCMCKernel` wraps the functional core (:mod:`numpyro_subsample.sgmcmc.chain`: pure
per-chain init and ``step(state, data)`` over :class:`SGMCMCState`) in the thin adapter of
:mod:`numpyro_subsample.core.adapter`, and runs the preprocessing (proxy, estimator, measured
noise, step size) with the methods of its base
:class:`~numpyro_subsample.sgmcmc.kernel_preprocess.SGMCMCPreprocessing`; its subclasses
(:mod:`numpyro_subsample.sgmcmc.kernel`) choose the dynamics and the step-size rule.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import numpy as np
from numpyro.util import is_prng_key

from numpyro_subsample.core.adapter import (
    SubsampleKernel,
    concrete_under_pmap,
)
from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.datapass import DEFAULT_CHUNK
from numpyro_subsample.core.options import check_options, keyword_params
from numpyro_subsample.core.rng import STEP_RNG
from numpyro_subsample.estimators.local import LocalConfig
from numpyro_subsample.estimators.noise import (
    CurvatureLimitedStepWarning,
    NoiseLimitedStepWarning,
    NonFiniteNoiseError,
)
from numpyro_subsample.estimators.registry import (
    STATEFUL,
    check_estimator_request,
)
from numpyro_subsample.estimators.zv import covariate_choice
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.laplace import LaplaceFitError
from numpyro_subsample.proxies.structured import StructuredProxy
from numpyro_subsample.sgmcmc import adaptation, centring, step_bias
from numpyro_subsample.sgmcmc import preprocess as prep
from numpyro_subsample.sgmcmc.chain import (
    Preprocessed,
    SamplerParams,
    SGMCMCConfig,
    SGMCMCState,
    chain_programs,
    initial_draws,
)
from numpyro_subsample.sgmcmc.dynamics import Dynamics, corrected_dynamics, sgld_dynamics
from numpyro_subsample.sgmcmc.kernel_preprocess import SGMCMCPreprocessing
from numpyro_subsample.sgmcmc.noise_refine import with_time_step
from numpyro_subsample.sgmcmc.options import (
    AdaptationOptions,
    NoiseOptions,
    ZVOptions,
    check_record,
    legacy_records,
)
from numpyro_subsample.sgmcmc.pilot_structured import adapted_structured
from numpyro_subsample.sgmcmc.stepsize import sgld_step_size

__all__ = ["SGMCMCKernel"]


def with_cost_of(pre: Preprocessed, others: list[Preprocessed],
                 failed: float = 0.0) -> Preprocessed:
    """``pre`` with the data passes and seconds of the preprocessings ``others`` (of other
    forms of the model, run to choose ``pre``'s) and the passes ``failed`` of those that
    raised added to its own."""
    if not others and not failed:
        return pre
    spent = sum(float(o.data_passes) for o in others) + float(failed)
    passes = pre.data_passes + spent
    params = pre.params._replace(data_passes=device_array(passes, pre.params.data_passes.dtype))
    return pre._replace(data_passes=passes, params=params,
                        seconds=pre.seconds + sum(o.seconds for o in others),
                        cost=(*pre.cost, ("other forms of the model", spent)))


def _recorded(fn: Callable[[], Any]) -> tuple[Any, list]:
    """``fn()`` and the warnings it raised, held back (re-raised once its result is used)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, list(caught)


def _not_about_its_step(caught: list) -> list:
    """The warnings of a form of the model that is not sampled, without those about its own
    step (:class:`~numpyro_subsample.estimators.noise.NoiseLimitedStepWarning`,
    :class:`~numpyro_subsample.estimators.noise.CurvatureLimitedStepWarning`): they do not
    hold for the form sampled."""
    return [w for w in caught if not issubclass(
        w.category, (NoiseLimitedStepWarning, CurvatureLimitedStepWarning))]


class SGMCMCKernel(SGMCMCPreprocessing, step_bias.AfterRunProbing, SubsampleKernel):
    """Stochastic-gradient MCMC for a NumPyro model with a subsample plate.

    Parameters
    ----------
    model
        A NumPyro model whose likelihood sits in ``numpyro.plate(name, N, subsample_size=n)``;
        n is the subsample size per step.
    estimator
        The gradient estimator: a name of
        :data:`~numpyro_subsample.estimators.registry.ESTIMATORS` (``"uniform"``, Welling and
        Teh 2011; ``"cv"``, Baker et al. 2019; ``"preferential"``, ``"cv-preferential"``,
        Putcha et al. 2023; ``"stratified"``, ``"cv-stratified"``, Fu and Zhang 2023;
        ``"saga"``, ``"svrg"``, Dubey et al. 2016, whose control variate moves with each chain:
        :mod:`~numpyro_subsample.estimators.variance_reduced`; SAGA keeps an N×d table per
        vectorized chain, SVRG's option ``update_every`` is the steps between its data passes).
        Default ``"cv"``; with local latent sites ``"cv"`` or ``"uniform"`` only (default
        ``"cv"`` while its N × d table is small:
        :func:`~numpyro_subsample.sgmcmc.local_preprocess.local_preprocessing`).
    step_size
        The time step h of the diffusion in whitened coordinates, for every dynamic:
        SGLD moves w ← w + h ∇log π(w) + sqrt(2h) ξ (BlackJAX's ``step_size``; the ε of
        Putcha et al. 2023, Eq. 4, is 2h). ``None`` picks h from the measured gradient noise
        so that the stationary variance of a Gaussian target is inflated by at most
        ``noise.max_variance_inflation`` (:mod:`numpyro_subsample.sgmcmc.stepsize`; with the
        adapted preconditioner, from its rule).
    proxy
        ``"laplace"`` (mode and inverse Hessian; default), ``"variational"`` (an autoguide
        fitted by SVI, :func:`~numpyro_subsample.proxies.variational.fit_variational`;
        ``guide=`` in ``proxy_kwargs``), a :class:`~numpyro_subsample.proxies.base.Proxy`, or
        for large d a structured proxy (no d × d array on the sampling path; the
        preconditioner then adapts by default): ``"diagonal"``, ``"low-rank"`` (precision diag
        + rank k, ``proxy_kwargs={"rank": k}``) or a
        :class:`~numpyro_subsample.proxies.structured.StructuredProxy`. ``"laplace"`` becomes
        ``"low-rank"`` above :data:`~numpyro_subsample.proxies.choice.MAX_DENSE_DIM`
        parameters (:mod:`numpyro_subsample.proxies.choice`).
    preconditioning
        Sample in coordinates whitened by the proxy covariance.
    replace
        Draw subsample indices with replacement (default) or without.
    proxy_kwargs
        Options of the proxy fit.
    chunk_size
        Data per vmapped evaluation in full-data passes.
    store_datum_grads
        Keep the N×d table of ∇f_i(θ̂) and gather its rows each step, or (default) recompute
        ∇f_i(θ̂) on the subsample, which shares the gathered data rows with the first
        evaluation (per-step costs in ``benchmarks/RESULTS.md``).
    init_strategy
        ``"proxy"`` (each chain starts at a draw from N(θ̂, Σ̂), made by NumPy from the bits of
        the chain's key) or ``"centre"``. The first step evaluates the gradient at the start
        without moving: with ``num_warmup=0`` the first draw is the start.
    seed
        Seed of the preprocessing (proxy fit, noise measurement), done once per data set and
        shared by all chains and runs.
    progress_bar
        Progress bars of the preprocessing (proxy fit). Default None: those of the
        package's ``MCMC`` running the kernel follow its ``progress_bar``; otherwise on, off
        under CI.
    adaptation
        An :class:`~numpyro_subsample.sgmcmc.options.AdaptationOptions`: whether warm-up
        adapts a diagonal preconditioner and the proxy (default: as described there).
    noise
        A :class:`~numpyro_subsample.sgmcmc.options.NoiseOptions`: the noise correction and
        the δ of the default step-size rule (default ``NoiseOptions()``).
    zv
        A :class:`~numpyro_subsample.sgmcmc.options.ZVOptions`: accumulate the zero-variance
        statistics (Baker et al. 2019, Sect. 4) of the post-warmup draws in the sampling
        loop; read them with :func:`~numpyro_subsample.post.zv.zv_mean` (default None: off).
    local
        A :class:`~numpyro_subsample.estimators.local.LocalConfig`, for a model with local
        latent sites (one value per datum inside the plate): an exact conditional
        ``update(rng_key, rows, values, idx, *model_args, **model_kwargs) -> rows``, else
        ``steps`` MALA steps, move the subsample's sites before its gradient
        (:mod:`~numpyro_subsample.estimators.local`, ``docs/local_latents.md``; default
        ``LocalConfig()``). Such models take ``estimator="cv"`` (default, control variates at
        a stochastic-approximation pilot's end) or ``"uniform"``, and by default the step of
        the adapted preconditioner
        (:func:`~numpyro_subsample.sgmcmc.local_preprocess.local_preprocessing`); a proxy,
        ``proxy_kwargs``, the noise correction or ZV are refused (they need p(x_i | θ)).
    bias_probe
        Probe the bias of the time step h after choosing it (default True): coupled pairs of
        chains at h and h/2 (Richardson-Romberg, Durmus et al. 2016, Sect. 3;
        :mod:`~numpyro_subsample.sgmcmc.step_bias`) estimate the bias of each coordinate's
        posterior mean and sd at h. A step the kernel's rule chose and the gradient noise
        does not limit (at least half the noise-free rule's) is reduced, to h · 0.1 / |b|
        (at most 4-fold), where a bias |b| of 0.15 posterior sd (of a mean; 15 % of an sd)
        or more is beyond 3 standard errors and 0.1 or more two standard
        errors below its estimate (up to 8 more pairs sharpen estimates of 0.1 or more
        first); a
        :class:`~numpyro_subsample.sgmcmc.step_bias.StepBiasWarning` names the step and a
        smaller one when a bias of 0.2 or more is significant at the step the run takes (a
        given ``step_size``, or a reduction capped at 4-fold), or when the chains at h
        diverge. It costs 3 × 4 pairs × 200-1000 gradient estimates of the run's subsample
        size once per data set (at most 0.27 × those of 4 chains × 11,000 steps, 0.45 × where
        it refines, 0.82 × where an estimate of 0.2 or more stays undecided; compiling it
        costs about as much as compiling the sampling loop) and is recorded in
        ``kernel.preprocessed.step_bias``. With the adapted preconditioner (whose scale is
        fixed only at the warm-up's end), a structured proxy or local latent sites drawn by
        their inner update, the pairs run after the run instead, in its check
        (:meth:`probe_after_run`, from the chains' last draws with their final
        preconditioner and estimator state; the same warning, no step reduction; in
        ``mcmc.run_check.step_bias``). Where it cannot run (e.g. an estimator state too
        large for the pairs to hold) the reason is in
        ``kernel.preprocessed.step_bias_skipped`` and the run check's record, without a
        warning.
    steps_per_draw
        Steps of the dynamics per recorded draw (each draw is the chain's state after k
        steps, as with NumPyro's ``thinning`` but inside the compiled step; the data passes
        count every step). Default None: 1 for a given ``step_size``; else k = round(h_1 / h)
        (at most 8) where the step h the kernel chose is below SGLD's unit-curvature step
        h_1 = 2δ/(1 + δ) (the curvature's spread, the bias probe or the gradient noise took it
        there), so that a draw mixes about as far as one of SGLD at h_1 (SGHMC's and SGNHT's
        rules take h ≥ h_1 but where noise or curvature limit them)
        (:func:`~numpyro_subsample.sgmcmc.stepsize.steps_per_draw`); read it from
        :attr:`steps_per_draw`.
    **estimator_options
        Further options of the estimator (see its module). The keywords of the previous
        release (``zv_stream``, ``zv_degree``, ``zv_covariates``, ``zv_fn``,
        ``adapt_preconditioner``, ``adapt_proxy``, ``noise_correction``,
        ``max_variance_inflation``, ``local_update``, ``local_steps``) are accepted with a
        ``DeprecationWarning`` naming the record that replaces them.

    References
    ----------
    Baker et al. (2019), Eq. 4; Putcha et al. (2023), Eq. 3-19; Fu and Zhang (2023), Eq. 10.
    """

    sample_field = "z"
    _dynamics_name = "sgld"
    #: This class's preprocessing fits structured proxies (no d × d array), adapts the
    #: diagonal preconditioner and the proxy, and draws local latent sites; a subclass with
    #: its own preprocessing or programs (DistributedSGLD) sets what it lacks to False.
    supports_local: ClassVar[bool] = True
    supports_structured: ClassVar[bool] = True
    supports_adaptation: ClassVar[bool] = True
    supports_proxy_adaptation: ClassVar[bool] = True
    def __init__(
        self,
        model: Callable,
        *,
        estimator: str | None = None,
        step_size: float | None = None,
        proxy: str | Proxy | StructuredProxy = "laplace",
        proxy_kwargs: dict | None = None,
        preconditioning: bool = True,
        replace: bool = True,
        init_strategy: str = "proxy",
        chunk_size: int = DEFAULT_CHUNK,
        store_datum_grads: bool = False,
        adaptation: AdaptationOptions | None = None,
        noise: NoiseOptions | None = None,
        zv: ZVOptions | None = None,
        local: LocalConfig | None = None,
        seed: int = 0,
        progress_bar: bool | None = None,
        bias_probe: bool = True,
        steps_per_draw: int | None = None,
        **estimator_options: Any,
    ) -> None:
        label = type(self).__name__
        records = legacy_records(label, estimator_options, adaptation=adaptation, noise=noise,
                                 zv=zv, local=local)
        for name, record in records.items():
            check_record(label, name, record)
        adaptation = records["adaptation"] or AdaptationOptions()
        noise = records["noise"] or NoiseOptions()
        zv, local = records["zv"], records["local"] or LocalConfig()
        local = local._replace(steps=int(local.steps), nodes=int(local.nodes))
        check_options(
            "SGMCMCKernel", label=label, step_size=step_size,
            preconditioning=preconditioning, replace=replace, proxy_kwargs=proxy_kwargs,
            chunk_size=chunk_size, store_datum_grads=store_datum_grads,
            init_strategy=init_strategy, seed=seed, progress_bar=progress_bar,
            bias_probe=bias_probe, steps_per_draw=steps_per_draw,
            **({} if isinstance(proxy, (Proxy, StructuredProxy)) else {"proxy": proxy}),
        )
        self._estimator_request = estimator
        estimator = "cv" if estimator is None else estimator
        structured = prep.check_request(
            label, proxy, estimator, estimator_options, step_size=step_size,
            preconditioning=preconditioning, replace=replace, noise_correction=noise.correction,
            supports_structured=self.supports_structured,
            adapt_preconditioner=adaptation.preconditioner,
            supports_adaptation=self.supports_adaptation,
            kernel_params=keyword_params(type(self), SGMCMCKernel),
        )
        noise_correction = noise.correction
        self._noise_correction_given = noise_correction
        if noise_correction is None:
            noise_correction = (estimator not in STATEFUL and not structured
                                and adaptation.preconditioner is not True)
        super().__init__(model, seed=seed)
        #: per data signature: the centred form a model written non-centred is preprocessed in
        #: first, and its potential (:func:`~numpyro_subsample.sgmcmc.centring.unwrapped`)
        self._unwrapped: dict = {}
        #: the data signatures whose centred form's step the partially centred one's did not
        #: reach (:func:`~numpyro_subsample.sgmcmc.centring.centring_pays`): kept centred
        self._centred_kept: set = set()
        self.estimator_options = estimator_options
        self._step_size = None if step_size is None else float(step_size)
        self._proxy_spec = proxy
        self.preconditioning = bool(preconditioning)
        self.adaptation, self.noise, self.zv, self.local = adaptation, noise, zv, local
        self.adapt_preconditioner = adaptation.preconditioner
        self.adapt_proxy = adaptation.proxy
        self.centring = adaptation.centring
        self.max_variance_inflation = float(noise.max_variance_inflation)
        self.replace = bool(replace)
        self.proxy_kwargs = dict(proxy_kwargs or {})
        self.chunk_size = int(chunk_size)
        self.store_datum_grads = bool(store_datum_grads)
        self._noise_correction = bool(noise_correction) and self.preconditioning
        self.init_strategy = init_strategy
        self.progress_bar = progress_bar
        self.zv_stream = zv is not None
        zv = zv or ZVOptions()
        self.zv_degree, self.zv_covariates, self.zv_fn = zv.degree, zv.covariates, zv.fn
        self.bias_probe = bool(bias_probe)
        self._steps_per_draw = None if steps_per_draw is None else int(steps_per_draw)

    # -- what a subclass chooses ------------------------------------------------------------
    _diffusion = 1.0  # c of the injected noise N(0, 2ch I)

    def _corrected(self, corrected: bool | None) -> bool:
        return self.noise_correction if corrected is None else bool(corrected)

    def _dynamics(self, corrected: bool | None = None) -> Dynamics:
        return corrected_dynamics("sgld") if self._corrected(corrected) else sgld_dynamics()

    def _default_step_size(self, noise: float, corrected: bool | None = None,
                           curvature: float = 1.0) -> float:
        return sgld_step_size(noise, self.max_variance_inflation, curvature,
                              corrected=self._corrected(corrected))

    # -- properties users read ----------------------------------------------------------------
    @property
    def estimator_name(self) -> str:
        """The estimator: as given, else ``"cv"`` (``"uniform"`` for a model with local latent
        sites whose control variate's N × d table would be too large,
        :func:`~numpyro_subsample.estimators.local_start.local_estimator_choice`)."""
        if self._estimator_request is not None or self._pre is None:
            return self._estimator_request or "cv"
        return "cv" if self._pre.estimator.name in ("cv", "local-cv") else "uniform"

    @property
    def default_fields(self) -> tuple[str, ...]:
        return ("z", "diverging")

    @property
    def proxy(self) -> Proxy | StructuredProxy | None:
        """The fitted proxy: ``centre`` (θ̂, flat unconstrained), ``cov`` or ``cov_op`` (Σ̂)."""
        return self.preprocessed.proxy

    @property
    def noise_correction(self) -> bool:
        """Whether the dynamics inject N(0, 2ch I − h²V) (as resolved once preprocessed)."""
        if self._pre is not None:
            return bool(self._pre.noise_corrected)
        return self._noise_correction

    @property
    def step_size(self) -> float:
        """The time step h in use (see the class docstring)."""
        return self.preprocessed.step_size

    @property
    def steps_per_draw(self) -> int:
        """The steps of the dynamics per draw (the ``steps_per_draw`` given, else as the
        class docstring says)."""
        k = self.preprocessed.params.steps_per_draw
        return 1 if k is None else int(k)

    def with_step_size(self, step_size: float) -> SGMCMCKernel:
        """A copy with time step ``step_size`` sharing the preprocessing (step-halving)."""
        h = float(step_size)
        if not (np.isfinite(h) and h > 0):
            raise ValueError(f"step_size must be a positive number, got {step_size!r}.")
        new = copy.copy(self)
        new._step_size, new._step, new._after_run_probe = h, None, None
        if self._pre is not None:  # the bias probe was of the old step
            new._pre = with_time_step(self._pre, h, new._diffusion)._replace(
                step_bias=None, step_bias_skipped="the step was changed after its probe")
        return new

    @property
    def probes_after_run(self) -> bool:
        """Whether the step's bias is probed after a run (:meth:`probe_after_run`): where the
        preprocessing could not (the adapted preconditioner, a structured proxy), with
        ``bias_probe`` (:func:`~numpyro_subsample.sgmcmc.step_bias.after_run_reason`)."""
        pre = self._pre
        return pre is not None and step_bias.after_run_reason(
            pre, self._dynamics(pre.noise_corrected), self.bias_probe,
            self._pre_data) is None

    def _after_run_probe_of(self, state: SGMCMCState, draws: np.ndarray):
        """The pairs of :func:`~numpyro_subsample.sgmcmc.step_bias.probe_after_run` from the
        run's last draws, with its final adapted preconditioner (``state.adapt``), estimator
        state (``state.est_state``), whitening, dynamics, estimator and step; the labels of
        the flat unconstrained coordinates."""
        from numpyro_subsample.core.sites import coordinate_names

        pre = self._pre
        adapt = getattr(state, "adapt", None)
        probe = step_bias.probe_after_run(
            pre, self._pre_data, draws=draws,
            precond=None if adapt is None else np.asarray(adapt.scale),
            dynamics=self._dynamics(pre.noise_corrected), diffusion=self._diffusion,
            seed=self.seed, est_state=state.est_state)
        return probe, coordinate_names(pre.potential)

    def without_centring(self, model: Callable | None = None) -> SGMCMCKernel:
        """A copy that samples ``model`` (default: the kernel's) as written
        (``AdaptationOptions(centring=False)``), with its own preprocessing."""
        new = copy.copy(self)
        new.centring = False
        new._pre, new._pre_data, new._step, new._potentials = None, None, None, {}
        new._unwrapped, new._centred_kept = {}, set()
        if model is not None:
            new._model = model
        return new

    def _preprocess_data(self, data: ModelData):
        if self._pre is not None and data.same_values(self._pre_data):
            return self._pre
        self._defer_probe = centring.centres(self)  # probe only the form kept
        try:
            pre, caught = self._chosen_form(data)
        finally:
            self._defer_probe = False
        pre, probe_caught = _recorded(lambda: self._deferred_probe(pre, data))
        self._pre = pre
        for w in [*caught, *probe_caught]:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return pre

    def _chosen_form(self, data: ModelData) -> tuple[Preprocessed, list]:
        """The preprocessing of the form of the model the kernel samples (as written, or
        partially centred, :mod:`~numpyro_subsample.sgmcmc.centring`), with the data passes and
        seconds of every form it preprocessed, and the warnings held back."""
        form, sig = None, data.signature()
        if sig not in self._unwrapped:  # a model the user wrote non-centred, found once
            self._unwrapped[sig] = centring.unwrapped(self, data)
            if self._unwrapped[sig] is not None:  # preprocessed first in its centred form
                form, self._potentials[sig] = self._unwrapped[sig]
        # on new data of the same shapes the potential (and the weights) of the first are kept
        if form is not None and form.hand:
            pre, caught, failed = self._preprocess_hand_form(data)
            if pre is None:  # its centred form failed: the model as written, its warnings
                form = None
                pre, caught = self._as_written(data, sig)
                pre = with_cost_of(pre, [], failed)
        else:
            try:
                pre, caught = _recorded(lambda: super(SGMCMCKernel, self)._preprocess_data(data))
            except NonFiniteNoiseError as err:  # the model as written; its non-centred form
                fallback = self._noncentred_fallback(data, sig, failed=err.passes)
                if fallback is None:
                    raise
                return fallback
        potential = (None if sig in self._centred_kept
                     else centring.centred_potential(self, pre, data, form))
        if potential is None:
            return pre, caught
        dropped = [pre]  # preprocess again, on the partially centred model
        try:
            partial, partial_caught = _recorded(lambda: self._preprocess(potential, data))
        except (LaplaceFitError, NonFiniteNoiseError) as err:  # that form fails
            self._centred_kept.add(sig)
            failed = float(getattr(err, "passes", 0.0))
            if form is None or not form.hand:  # the form preprocessed first is kept
                return with_cost_of(pre, [], failed), caught
            written, caught = self._as_written(data, sig)  # as the user wrote it
            return with_cost_of(written, [pre], failed), caught
        if centring.centring_pays(pre, partial):  # the weights' warnings stand too
            caught = [*_not_about_its_step(caught), *partial_caught]
        else:  # the centred form's step is better
            self._centred_kept.add(sig)
            potential = centring.centred_potential(self, pre, data, form, centred=True)
            dropped.append(partial)
            if potential is not None:  # a form the user wrote: its centred form
                partial, caught = _recorded(lambda: self._preprocess(potential, data))
            else:
                dropped, partial = [partial], pre
        if potential is not None:
            self._potentials[sig] = potential
        return with_cost_of(partial, dropped), caught

    def _noncentred_fallback(self, data: ModelData, sig,
                             failed: float) -> tuple[Preprocessed, list] | None:
        """The preprocessing of the model with its group effects non-centred
        (:func:`~numpyro_subsample.sgmcmc.centring.noncentred_potential`), or partially
        centred at the weights of that form's proxy
        (:func:`~numpyro_subsample.sgmcmc.centring.weights_from_noncentred`) where its measured
        step is not smaller (:func:`~numpyro_subsample.sgmcmc.centring.centring_pays`), and its
        warnings, for a model written centred whose own preprocessing raised a
        :class:`~numpyro_subsample.estimators.noise.NonFiniteNoiseError` after ``failed`` data
        passes (counted with the forms dropped); None where the model has no such form or that
        form fails too."""
        potential = centring.noncentred_potential(self, self.potential_for(data), data)
        if potential is None:
            return None
        try:
            pre, caught = _recorded(lambda: self._preprocess(potential, data))
        except (LaplaceFitError, NonFiniteNoiseError):
            return None
        dropped = []
        weights = centring.weights_from_noncentred(pre)
        if weights:  # partially centred at the weights its proxy gives, if that pays
            partial = centring.partially_centred_potential(self, weights, data)
            try:
                partial_pre, partial_caught = _recorded(lambda: self._preprocess(partial, data))
            except LaplaceFitError:
                partial_pre = None
            except NonFiniteNoiseError as err:
                partial_pre, failed = None, failed + err.passes
            if partial_pre is not None and centring.centring_pays(pre, partial_pre):
                dropped, pre, caught = [pre], partial_pre, partial_caught
                potential = partial
            elif partial_pre is not None:
                dropped = [partial_pre]
        self._potentials[sig] = potential
        self._centred_kept.discard(sig)
        return with_cost_of(pre, dropped, failed), caught

    def _preprocess_hand_form(self, data: ModelData
                              ) -> tuple[Preprocessed | None, list, float]:
        """The preprocessing of the centred form of group effects written non-centred by hand
        (:func:`~numpyro_subsample.sgmcmc.centring.centred_form`) and its warnings, held back
        until its weights are used; None, silently, and the data passes it spent, where the
        centred form cannot be preprocessed (a degenerate joint mode, a proxy whose draws
        overflow): the model is then sampled as written, which the user chose."""
        def attempt() -> tuple[Preprocessed | None, float]:
            try:
                return super(SGMCMCKernel, self)._preprocess_data(data), 0.0
            except (LaplaceFitError, NonFiniteNoiseError) as err:
                return None, float(getattr(err, "passes", 0.0))

        (pre, failed), caught = _recorded(attempt)
        return pre, caught, failed

    def _as_written(self, data: ModelData, sig) -> tuple[Preprocessed, list]:
        """The preprocessing of the model as the user wrote it and its warnings, where a
        form the kernel derived from it (the centred form of group effects written
        non-centred by hand, or its partially centred form) cannot be preprocessed; that
        model's other forms are not tried again."""
        self._unwrapped[sig] = None
        self._potentials.pop(sig, None)
        self._pre = None
        return _recorded(lambda: super(SGMCMCKernel, self)._preprocess_data(data))

    def get_diagnostics_str(self, state: SGMCMCState) -> str:
        k = self.steps_per_draw
        steps = f" × {k} per draw" if k > 1 else ""
        return (f"step size {self.step_size:.2e}{steps}. "
                f"n={int(np.asarray(state.subsample_size).max())}")

    def _config(self, pre: Preprocessed, num_warmup: int, traced: bool) -> SGMCMCConfig:
        local = bool(pre.potential.local)
        init_strategy = self.init_strategy if self._needs_proxy() and not local else "centre"
        est = pre.estimator
        adapt = self._adapts(pre.potential) and not adapted_structured(pre.proxy)
        return SGMCMCConfig(
            potential=pre.potential, estimate=est.estimate,
            dynamics=self._dynamics(pre.noise_corrected),
            rng_impl="threefry2x32" if traced else STEP_RNG, init_strategy=init_strategy,
            precondition_draw=self.preconditioning and not local,
            zv_degree=self.zv_degree if self.zv_stream else 0, zv_fn=self.zv_fn,
            num_warmup=int(num_warmup) if self.zv_stream or adapt else 0,
            init_state=est.init_state, update=est.update,
            adapt_window=adaptation.adaptation_window(num_warmup) if adapt else 0,
            zv_linearised=self.zv_stream and covariate_choice(
                self.zv_covariates, self.zv_degree, pre.potential.dim) == "linearised",
        )

    def _programs(self, pre: Preprocessed, *, num_warmup: int, traced: bool):
        init_one, step = chain_programs(self._config(pre, num_warmup, traced))
        return init_one, step, pre.params

    def _state_axes(self) -> SGMCMCState:
        axes = SGMCMCState(**dict.fromkeys(SGMCMCState._fields, 0))._replace(params=None)
        if self._pre is not None and self._pre.estimator.update is not None:
            axes = axes._replace(est_state=self._pre.estimator.state_axes)
        return axes

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        data = ModelData.from_args(model_args, model_kwargs)
        with concrete_under_pmap(rng_key):
            potential = self.potential_for(data)
        vectorized = not (isinstance(rng_key, jax.core.Tracer) or is_prng_key(rng_key))
        if self.estimator_name == "saga" and vectorized:  # one table per chain, checked early
            check_estimator_request(self.estimator_name, self.estimator_options,
                                    replace=self.replace, potential=potential,
                                    num_chains=int(rng_key.shape[0]))
        if self._adapts(potential):
            adaptation.check_adaptation_warmup(type(self).__name__, num_warmup)
        state = super().init(rng_key, num_warmup, init_params, model_args, model_kwargs)
        if init_params is not None and not isinstance(rng_key, jax.core.Tracer):
            prep.check_given_start(self.preprocessed, state.params, state.w, data)
        return state

    def _init_draws(self, rng_key: Any, params: SamplerParams) -> tuple:
        return initial_draws(rng_key, params)
