"""The preprocessing steps of :class:`~numpyro_subsample.sgmcmc.base.SGMCMCKernel`: which
proxy, preconditioner and adaptation a model gets, the proxy's fit and whitening, and the
preprocessing of a model without or with local latent sites.

:class:`SGMCMCPreprocessing` is a base class of the kernel holding these methods; it reads the
kernel's options (``estimator_name``, ``preconditioning``, ``adapt_preconditioner``, ...) and
its dynamics (``_dynamics``, ``_default_step_size``, ``_diffusion``), which the kernel defines.
The steps themselves are the functions of :mod:`numpyro_subsample.sgmcmc.preprocess`,
:mod:`numpyro_subsample.sgmcmc.local_preprocess` and
:mod:`numpyro_subsample.sgmcmc.noise_refine`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax.numpy as jnp

from numpyro_subsample.core.adapter import preprocess_keys, resolve_progress
from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.core.quadrature import check_quadrature, integrable_site, integrate_local
from numpyro_subsample.core.sites import coordinate_names
from numpyro_subsample.estimators.local_start import local_estimator_choice
from numpyro_subsample.estimators.noise import NonFiniteNoiseError
from numpyro_subsample.estimators.registry import (
    NEEDS_PROXY,
    check_estimator_request,
    configure_estimator,
)
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.whitening import whiten_rmatvec
from numpyro_subsample.sgmcmc import adaptation, centring, step_bias, warmup
from numpyro_subsample.sgmcmc import preprocess as prep
from numpyro_subsample.sgmcmc.chain import Preprocessed, Whitening
from numpyro_subsample.sgmcmc.curvature import measured_curvature
from numpyro_subsample.sgmcmc.dynamics import Dynamics, sghmc_dynamics
from numpyro_subsample.sgmcmc.local_preprocess import local_preprocessing
from numpyro_subsample.sgmcmc.noise_refine import measured_preprocessed
from numpyro_subsample.sgmcmc.options import NoiseOptions
from numpyro_subsample.sgmcmc.pilot_structured import (
    MEAN_FIELD_STEP_RATIO,
    adapted_structured,
    structured_curvature,
)
from numpyro_subsample.sgmcmc.stepsize import sghmc_step_size, sgld_step_size, steps_per_draw

__all__ = ["SGMCMCPreprocessing"]


class SGMCMCPreprocessing:
    """The preprocessing methods of the stochastic-gradient kernels (module docstring)."""

    #: while the kernel preprocesses two forms of a model to choose one (partial centring), the
    #: step's probe waits for the one kept (:meth:`_deferred_probe`)
    _defer_probe: bool = False

    def _integrated(self, potential: Potential) -> Potential:
        """With one local site of one scalar value per datum, the potential with that site
        integrated out of each f_i by adaptive Gauss-Hermite quadrature
        (:mod:`~numpyro_subsample.core.quadrature`; ``LocalConfig.nodes``, 0 draws it)."""
        if (self.supports_local and self.local.update is None and self.local.nodes > 0
                and integrable_site(potential) is not None):
            return integrate_local(potential, self.local.nodes)
        return potential

    def _needs_proxy(self) -> bool:
        return self.preconditioning or self.estimator_name in NEEDS_PROXY

    def _adapts(self, potential: Potential) -> bool:
        """As given, else with a structured proxy, or without preconditioning and step_size."""
        if potential.local:  # no proxy: adapted unless a step_size is given
            return self.adapt_preconditioner or (
                self.adapt_preconditioner is None and self._step_size is None)
        if self.adapt_preconditioner is None:
            return self.supports_adaptation and (self._is_structured(potential.dim) or (
                not self.preconditioning and self._step_size is None))
        return bool(self.adapt_preconditioner)

    def _proxy_choice(self, dim: int) -> str:
        """The proxy for ``dim`` parameters (:func:`.preprocess.proxy_choice`)."""
        return prep.proxy_choice(self._proxy_spec, dim, self.supports_structured)

    def _is_structured(self, dim: int) -> bool:
        return self._proxy_choice(dim) in (*prep.STRUCTURED, "given-structured")

    def _adapts_proxy(self, potential: Potential, data: ModelData) -> bool:
        """Whether pilot chains adapt the proxy (:mod:`~numpyro_subsample.sgmcmc.warmup`): as
        given, else for a dense proxy that this kernel fits and whitens with, and for the
        structured Laplace fit above MAX_DENSE_DIM of a model with a hierarchical scale
        (:func:`~numpyro_subsample.sgmcmc.centring.has_group_scales`) unless the
        preconditioner's adaptation is given
        (:mod:`~numpyro_subsample.sgmcmc.pilot_structured`): elsewhere (a neural network's
        weights) the adapted structured proxy's measured step has not been shown to do better
        than the fit's path."""
        structured = self._is_structured(potential.dim)
        eligible = (self.supports_proxy_adaptation and self.preconditioning
                    and not potential.local and isinstance(self._proxy_spec, str)
                    and ((structured and self._proxy_spec == "laplace"
                          and self.adapt_preconditioner is None)
                         or (not structured and not self._adapts(potential))))
        if self.adapt_proxy and not eligible:
            raise ValueError(
                f"{type(self).__name__}(adaptation=AdaptationOptions(proxy=True)) needs "
                "preconditioning, a proxy that the kernel fits (proxy='laplace' or "
                "'variational' with no adapted preconditioner up to MAX_DENSE_DIM "
                "parameters, proxy='laplace' with AdaptationOptions.preconditioner left out "
                "above) and no local latent sites; leave AdaptationOptions.proxy out.")
        if self.adapt_proxy is not None:
            return bool(self.adapt_proxy)
        return eligible and (not structured or centring.has_group_scales(potential, data))

    def _pilot_dynamics(self) -> tuple[Dynamics, Callable[[float, float], float]]:
        """The pilot chains' dynamics and step rule ``rule(v, μ)``
        (:mod:`~numpyro_subsample.sgmcmc.warmup`): SGHMC's, with the kernel's friction for
        SGHMC and friction 1 for SGLD and SGNHT. Started in a centred hierarchical model's
        funnel by a collapsed variational fit, pilot chains of SGLD's dynamics (which cross a
        posterior about four times more slowly per step) and of SGNHT's stayed in its neck;
        the partial-centring weights taken there all came out near 0. Their δ is at most the
        default 0.05: the pilot's draws estimate the posterior's moments, which a larger δ
        would inflate."""
        own = self._dynamics_name == "sghmc"
        friction = self.friction if own else 1.0
        delta = (self.max_variance_inflation if own else
                 min(self.max_variance_inflation, NoiseOptions().max_variance_inflation))
        return sghmc_dynamics(friction), lambda v, mu: sghmc_step_size(v, friction, delta, mu)

    def _whitening(self, potential: Potential, data: ModelData, key) -> Whitening:
        """The proxy (fitted with ``key`` unless given, then adapted on pilot chains where
        :meth:`_adapts_proxy`) and the coordinates the chain moves in
        (:func:`~numpyro_subsample.sgmcmc.preprocess.whitening`)."""
        structured = self._is_structured(potential.dim)
        adapts = self._adapts_proxy(potential, data)

        def fit(kind: str) -> Proxy:
            given = kind == self._proxy_spec  # else a fallback start: q's own covariance
            kwargs = self.proxy_kwargs if given else {"covariance": "guide"}
            request = prep.ProxyRequest(spec=kind, kwargs=kwargs, chunk_size=self.chunk_size,
                                        store_datum_grads=self.store_datum_grads and not adapts,
                                        progress=resolve_progress(self.progress_bar),
                                        needed=self._needs_proxy())
            choice = self._proxy_choice(potential.dim) if given else kind
            return prep.fit_proxy(request, choice, potential, data, key)

        pilot_dynamics, pilot_rule = self._pilot_dynamics()
        proxy = warmup.pilot_proxy(
            fit, self._proxy_spec, potential, data, key, dynamics=pilot_dynamics,
            rule=pilot_rule, structured=structured,
            chunk_size=self.chunk_size, replace=self.replace,
            alternative=self._step_size is None,  # a given step: nothing to choose
        ) if adapts else fit(self._proxy_spec)
        return prep.whitening(proxy, potential, preconditioning=self.preconditioning,
                              structured=structured)

    def _preprocessed_core(self, potential: Potential, data: ModelData) -> Preprocessed:
        if potential.local:
            return self._preprocess_local(potential, data)
        t0 = time.perf_counter()
        _, k_proxy, k_est, k_noise = preprocess_keys(self.seed)
        check_estimator_request(self.estimator_name, self.estimator_options,
                                replace=self.replace, potential=potential)
        structured = self._is_structured(potential.dim)
        prep.check_dimension(
            potential.dim, zv_degree=self.zv_degree if self.zv_stream else 0,
            zv_covariates=self.zv_covariates, structured=structured,
            noise_correction_requested=bool(self._noise_correction_given) and self.preconditioning,
        )
        corrected = self._noise_correction and not structured
        wh = self._whitening(potential, data, k_proxy)
        estimator = self._estimator(potential, data, wh.proxy, k_est)
        if self._adapts(potential) and not adapted_structured(wh.proxy):
            step_size = self._step_size or adaptation.adaptive_step_size(
                lambda v, mu: self._default_step_size(v, False, mu))
            pre = prep.unmeasured_preprocessed(potential, wh, estimator, step_size, t0)
            return step_bias.not_probed(  # probed after the run (step_bias.probe_after_run)
                pre, step_bias.ADAPTED_SKIP if self.bias_probe else "bias_probe=False")
        curvature = prep.whitened_curvature(wh.proxy, self.preconditioning) if structured else 1.0
        along = -1  # the coordinate of θ along which the measured curvature is largest
        if adapted_structured(wh.proxy):
            curvature, passes = structured_curvature(wh.proxy, potential, data,
                                                     chunk_size=self.chunk_size)
            wh = wh._replace(data_passes=wh.data_passes + passes)
        elif wh.proxy is not None and "draws" in (wh.proxy.info or {}):
            curvature, passes, along = measured_curvature(wh.proxy, potential, data,
                                                          chunk_size=self.chunk_size)
            wh = wh._replace(data_passes=wh.data_passes + passes)
        try:
            pre = self._measured(potential, data, wh, estimator, k_noise, corrected=corrected,
                                 curvature=curvature, started=t0,
                                 curvature_site=coordinate_names(potential)[along]
                                 if along >= 0 else "")
        except NonFiniteNoiseError as err:  # with the passes spent before it
            raise NonFiniteNoiseError(str(err), passes=wh.data_passes + err.passes) from None
        if adapted_structured(wh.proxy):
            pre, curvature = self._mean_field_choice(pre, wh, curvature, potential, data,
                                                     k_est, k_noise, t0)
        noise_free = self._default_step_size(0.0, corrected, curvature)
        if self._step_size is None:
            pre = pre._replace(noise_free_step=float(noise_free))
        if not self.bias_probe:
            return step_bias.not_probed(pre, "bias_probe=False")
        if self._defer_probe:
            return step_bias.not_probed(pre, step_bias.DEFERRED_SKIP)
        return self._probe(pre, data, noise_free, stacklevel=7)

    def _estimator(self, potential: Potential, data: ModelData, proxy, key):
        """The kernel's gradient estimator with its options, its control variates at
        ``proxy`` (:func:`~numpyro_subsample.estimators.registry.configure_estimator`)."""
        return configure_estimator(self.estimator_name, potential, data, proxy,
                                   replace=self.replace, rng_key=key,
                                   chunk_size=self.chunk_size, **self.estimator_options)

    def _measured(self, potential: Potential, data: ModelData, wh: Whitening, estimator,
                  key, *, corrected: bool, curvature: float, started: float,
                  curvature_site: str = "") -> Preprocessed:
        """The preprocessing's end with the estimator's noise measured in ``wh`` and the
        kernel's step (:func:`~numpyro_subsample.sgmcmc.noise_refine.measured_preprocessed`)."""
        return measured_preprocessed(
            potential, wh, estimator, key, data, corrected=corrected, step_size=self._step_size,
            rule=self._default_step_size, curvature=curvature, diffusion=self._diffusion,
            max_variance_inflation=self.max_variance_inflation, chunk_size=self.chunk_size,
            started=started, curvature_site=curvature_site)

    def _probe(self, pre: Preprocessed, data: ModelData, noise_free: float, *,
               stacklevel: int) -> Preprocessed:
        """``pre`` with the probe of its step (:func:`~numpyro_subsample.sgmcmc.step_bias.
        probed`), which may reduce a step the kernel chose, ``noise_free`` its rule's step
        without gradient noise."""
        # a step the gradient noise limits (under half the noise-free rule's) already mixes
        # slowly: cutting it further would leave the run unmixed, so the probe only warns
        reduce_step = self._step_size is None and pre.step_size >= 0.5 * noise_free
        return step_bias.probed(pre, data, dynamics=self._dynamics(pre.noise_corrected),
                                diffusion=self._diffusion, seed=self.seed,
                                kernel=type(self).__name__, reduce_step=reduce_step,
                                stacklevel=stacklevel)

    def _deferred_probe(self, pre: Preprocessed, data: ModelData) -> Preprocessed:
        """``pre`` whose probe was deferred (:data:`~numpyro_subsample.sgmcmc.step_bias.
        DEFERRED_SKIP`: the kernel chose between two forms of the model first), probed, with
        its steps per draw for the probed step; other ``pre`` as given."""
        if pre.step_bias_skipped != step_bias.DEFERRED_SKIP:
            return pre
        probed = self._probe(pre, data, pre.noise_free_step, stacklevel=5)
        if probed.step_size == pre.step_size:
            return probed
        return self._with_steps_per_draw(probed._replace(
            params=probed.params._replace(steps_per_draw=None)))

    def _mean_field_choice(self, pre: Preprocessed, wh, curvature: float,
                           potential: Potential, data: ModelData, k_est, k_noise,
                           t0: float) -> tuple[Preprocessed, float]:
        """``pre`` of the structured proxy adapted from a mean-field start, or that of the
        start itself (``proxy.info["mean_field_start"]``) where its measured step is more
        than :data:`~numpyro_subsample.sgmcmc.pilot_structured.MEAN_FIELD_STEP_RATIO` times
        larger (with the kernel's own step only); with the curvature μ of the one kept and the
        passes of both measurements."""
        alt = (wh.proxy.info or {}).get("mean_field_start")
        if alt is None:  # none from this start, or with a given step (nothing to choose)
            return pre, curvature
        mu, passes = structured_curvature(alt, potential, data, chunk_size=self.chunk_size)
        wh_alt = prep.whitening(alt, potential, preconditioning=self.preconditioning,
                                structured=True)._replace(data_passes=wh.data_passes + passes)
        pre_alt = self._measured(potential, data, wh_alt,
                                 self._estimator(potential, data, alt, k_est), k_noise,
                                 corrected=False, curvature=mu, started=t0)
        choice = {"adapted": float(pre.step_size), "mean_field_start": float(pre_alt.step_size)}
        if pre_alt.step_size > MEAN_FIELD_STEP_RATIO * pre.step_size:
            kept, other, curvature = pre_alt, pre, mu
        else:
            kept, other = pre, pre_alt
        spent = other.data_passes - wh.data_passes  # the other's measurement
        proxy = kept.proxy._replace(info={**(kept.proxy.info or {}), "step_choice": choice,
                                          "mean_field_start": None})
        return kept._replace(proxy=proxy, data_passes=kept.data_passes + spent,
                             cost=(*kept.cost, ("other proxy's measurement", spent))), curvature

    def _preprocess(self, potential: Potential, data: ModelData) -> Preprocessed:
        """The preprocessing, with the steps of the dynamics per draw: the ``steps_per_draw``
        given, else where the kernel chose the step on the measured path (its noise-free
        step is known) and it is below SGLD's unit-curvature one 2δ/(1 + δ),
        :func:`~numpyro_subsample.sgmcmc.stepsize.steps_per_draw`."""
        pre = self._preprocessed_core(potential, data)
        if potential.integrated:
            centre = potential.init_theta if pre.centre is None else pre.centre
            check_quadrature(potential, centre, data, type(self).__name__,
                             whiten=lambda g: g if pre.scale_tril is None else
                             whiten_rmatvec(pre.scale_tril, g), stacklevel=5)
        return self._with_steps_per_draw(pre)

    def _with_steps_per_draw(self, pre: Preprocessed) -> Preprocessed:
        """``pre`` with the ``steps_per_draw`` given, else, where the kernel chose the step on
        the measured path, :func:`~numpyro_subsample.sgmcmc.stepsize.steps_per_draw`."""
        k = self._steps_per_draw
        if k is None and pre.noise_free_step > 0:
            unit = sgld_step_size(0.0, self.max_variance_inflation, 1.0, corrected=True)
            k = steps_per_draw(pre.step_size, unit)
        if k is None or k == 1:
            return pre
        return pre._replace(params=pre.params._replace(
            steps_per_draw=jnp.asarray(k, jnp.int32)))

    def _preprocess_local(self, potential: Potential, data: ModelData) -> Preprocessed:
        """A model with local latent sites (:func:`.local_preprocess.local_preprocessing`)."""
        estimator = self._estimator_request or local_estimator_choice(potential)
        given = dict(estimator=estimator, estimator_options=self.estimator_options,
                     step_size=self._step_size, zv_stream=self.zv_stream, proxy=self._proxy_spec,
                     proxy_kwargs=self.proxy_kwargs, noise_correction=self._noise_correction_given,
                     adapt_preconditioner=self._adapts(potential))
        pre = local_preprocessing(
            type(self).__name__, potential, given, self.replace, self.local,
            self._is_structured(potential.dim),
            adapted_step=adaptation.adaptive_step_size(
                lambda v, mu: self._default_step_size(v, False, mu)),
            data=data, rng_key=preprocess_keys(self.seed)[2], chunk_size=self.chunk_size)
        return step_bias.not_probed(  # probed after the run (step_bias.probe_after_run)
            pre, step_bias.LOCAL_SKIP if self.bias_probe else "bias_probe=False")
