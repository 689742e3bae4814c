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
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.adapter import SubsampleKernel, constrained
from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.datapass import DEFAULT_CHUNK
from numpyro_subsample.core.options import suggest_keywords
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.core.rng import STEP_RNG
from numpyro_subsample.estimators.local import LocalConfig
from numpyro_subsample.estimators.noise import NoiseLimitedStepWarning
from numpyro_subsample.estimators.selection import SamplingDesign, uniform_design
from numpyro_subsample.estimators.stratified import (
    Strata,
    distinct_rows,
    make_strata,
    stratified_design,
)
from numpyro_subsample.sgmcmc.options import check_record, legacy_records
from numpyro_subsample.sgmcmc.simplex import (
    SGRLDConfig,
    SGRLDParams,
    SGRLDState,
    datum_drifts,
    drift_noise,
    em_point,
    flatten_sites,
    relaxation_rates,
    sgrld_programs,
    to_simplex,
)
from numpyro_subsample.sgmcmc.simplex_model import (
    check_positive,
    check_simplex_model,
    dirichlet_base,
    draw_values,
    reference_totals,
    site_values,
)

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

#: At most this many scoring steps (:func:`~numpyro_subsample.sgmcmc.simplex.em_point`, one
#: data pass each, stopped when π changes by under 2 %) from the prior mean to the point where
#: the default step's gradient noise is measured.
EM_ITERATIONS = 10

#: ``estimator="auto"`` tries the stratified design only while the default features (the
#: per-datum drifts, N × d numbers) stay below this many numbers.
MAX_FEATURE_NUMBERS = 2**25

#: ``estimator="auto"`` gives each distinct feature row its own stratum (no subsample noise)
#: when there are at most this many of them (and at most half the subsample size).
MAX_AUTO_STRATA = 100

#: A default step that the gradient noise makes this many times smaller than the noise-free
#: rule's warns (:class:`~numpyro_subsample.estimators.noise.NoiseLimitedStepWarning`): the
#: chain then needs over 10/δ steps per independent draw of the stiffest simplex row.
NOISE_LIMIT_FACTOR = 10.0

class SGRLDPreprocessed(NamedTuple):
    """Everything computed once per data set: the design of the subsample and its estimator's
    name (``"uniform"`` or ``"stratified"``), the Dirichlet concentrations α, the schedule
    (a, b, c), the strata (stratified estimator), the measured noise (max_k V_k / θ*_k of
    :class:`SGRLD`'s step rule; NaN when not measured) and the arrays the step reads
    (``params``)."""

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


class SGRLD(SubsampleKernel):
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
        inflated by about ``max_variance_inflation`` δ (the analogue of the SG kernels' rule,
        :mod:`~numpyro_subsample.sgmcmc.stepsize`). Linearised at θ*, simplex row r relaxes
        at the rate λ_r = 1 + max_k F_k / θ*_k at most (time units ε/2; 1 from the Gamma
        prior, F_k = Σ_i h_ik² the empirical Fisher information of the likelihood in the
        metric diag(θ), h_i = θ ⊙ ∇_θ log p(x_i | π): N/S for categorical counts,
        :func:`~numpyro_subsample.sgmcmc.simplex.relaxation_rates`), so the Euler step
        inflates the variance by ε λ_r / 4; the subsample adds ε²V_k/4 to the injected
        ε θ_k, a further ε V_k / (4 θ_k), V_k the design's variance of Σ_j w_j h_{i_j, k}
        (:func:`~numpyro_subsample.sgmcmc.simplex.drift_noise`). Hence
        a = 4δ / max_k (λ_r + V_k / θ*_k), the analogue of h = 2δ / (v + μ(1 + δ)). The
        point is π* after at most ``EM_ITERATIONS`` scoring steps from the prior mean
        (:func:`~numpyro_subsample.sgmcmc.simplex.em_point`, whose fixed point is the zero
        of the noise-free drift: the posterior mean for categorical counts), θ* = S_r π*
        with S_r of :func:`reference_totals` (E[1/S] of the total S = Σθ, which every chain
        starts at Σα_r: S only sets the clock of π's diffusion). A step that the noise
        makes ``NOISE_LIMIT_FACTOR`` times smaller than the noise-free one warns
        (``NoiseLimitedStepWarning``), naming the noise and the remedy.
    max_variance_inflation
        δ of the default ``step_size`` (default 0.05).
    schedule
        ``"constant"`` (default; ε_t = a: the default a already bounds the inflation by δ) or
        ``"polynomial"`` (Patterson and Teh's decaying ε_t, which lowers the inflation further
        and slows the mixing by the same factor).
    decay_offset, decay_power
        b (default 1000) and c (default 0.55, in (0.5, 1] as Σε_t = ∞, Σε_t² < ∞ ask) of the
        polynomial schedule.
    estimator
        ``"auto"`` (default), ``"uniform"`` (weights N/n, with or without replacement) or
        ``"stratified"`` (Fu and Zhang 2023, Eq. 10: k-means strata, b_j of n_j drawn without
        replacement, weights n_j / b_j, Neyman allocation of their Eq. 14; through
        :func:`~numpyro_subsample.estimators.stratified.make_strata`). ``"auto"`` measures
        the noise max_k V_k / θ*_k of both designs at π* and takes the one with the larger
        default step; its strata are the distinct feature rows when there are at most
        ``MAX_AUTO_STRATA`` of them and at most n/2 (categorical data: no subsample noise),
        else ``num_strata`` k-means strata. It is ``"uniform"`` with local latent sites
        (``"stratified"`` with your ``features``) and when the default features would exceed
        ``MAX_FEATURE_NUMBERS`` numbers.
    replace
        Uniform subsample with replacement (default) or without.
    num_strata, kmeans_iters, strata_seed
        k (default 10), Lloyd iterations and seed of the k-means of ``"stratified"``.
    features
        An (N, p) array to cluster for ``"stratified"``; default: the per-datum
        θ ⊙ ∇_θ log p(x_i | π̄) at the prior mean π̄ (one data pass, N × d numbers; pass
        smaller features, e.g. per-document word counts, when d is large).
    chunk_size
        Data per vmapped evaluation in the full-data passes.
    seed
        Seed of the preprocessing's model trace.
    local
        A :class:`~numpyro_subsample.estimators.local.LocalConfig`: local latent sites
        (continuous sites inside the plate, e.g. LDA's per-document topic proportions;
        :mod:`~numpyro_subsample.estimators.local`) are moved given π before each gradient,
        by its ``update(rng_key, rows, values, idx, *model_args, **model_kwargs) -> rows`` (an
        exact conditional; ``values`` the simplex values π) or by its ``steps`` MALA steps
        (default ``LocalConfig()``). Such models need an explicit ``step_size`` and, for
        ``"stratified"``, ``features``; the draws hold π only.
    **deprecated
        ``local_update`` and ``local_steps`` of the previous release, accepted with a
        ``DeprecationWarning`` (pass ``local=LocalConfig(update=..., steps=...)``).

    References
    ----------
    Patterson and Teh (2013) (SGRLD in the expanded-mean parameterisation, with
    mirroring); Fu and Zhang (2023), Sect. 4.3 (CP-SGRLD) and Eq. 10, 14.
    """

    sample_field = "pi"
    default_fields = ("pi", "diverging")
    supports_local = True

    @suggest_keywords(deprecated=("local_update", "local_steps"))
    def __init__(
        self,
        model: Callable,
        *,
        step_size: float | None = None,
        max_variance_inflation: float = 0.05,
        schedule: str = "constant",
        decay_offset: float = 1000.0,
        decay_power: float = 0.55,
        estimator: str = "auto",
        replace: bool = True,
        num_strata: int = 10,
        features: Any = None,
        kmeans_iters: int = 5,
        strata_seed: int = 0,
        chunk_size: int = DEFAULT_CHUNK,
        seed: int = 0,
        local: LocalConfig | None = None,
        **deprecated: Any,
    ) -> None:
        local = legacy_records("SGRLD", deprecated, local=local)["local"]
        check_record("SGRLD", "local", local)
        local = local or LocalConfig()
        local = local._replace(steps=int(local.steps))
        if schedule not in ("polynomial", "constant"):
            raise ValueError(f"SGRLD: schedule must be 'polynomial' or 'constant', got "
                             f"{schedule!r}.")
        if estimator not in ("auto", "uniform", "stratified"):
            raise ValueError(f"SGRLD: estimator must be 'auto', 'uniform' or 'stratified', "
                             f"got {estimator!r}.")
        check_positive("step_size", step_size, none=True)
        check_positive("max_variance_inflation", max_variance_inflation)
        check_positive("decay_offset", decay_offset)
        check_positive("decay_power", decay_power, zero=True)
        for name, v in (("num_strata", num_strata), ("kmeans_iters", kmeans_iters),
                        ("chunk_size", chunk_size)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"SGRLD: {name} must be a positive integer, got {v!r}.")
        super().__init__(model, seed=seed)
        self._step_size = None if step_size is None else float(step_size)
        self.max_variance_inflation = float(max_variance_inflation)
        self.schedule = schedule
        self.decay_offset, self.decay_power = float(decay_offset), float(decay_power)
        self._estimator_request, self.replace = estimator, bool(replace)
        self.num_strata, self.kmeans_iters = int(num_strata), int(kmeans_iters)
        self.features, self.strata_seed = features, int(strata_seed)
        self.chunk_size = int(chunk_size)
        self.local = local

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
        if potential.local:
            needs = [] if self._step_size is not None else ["an explicit step_size"]
            if request == "stratified" and self.features is None:
                needs.append("features (e.g. the documents' word frequencies) for 'stratified'")
            if needs:
                raise ValueError(
                    f"SGRLD: the model has local latent sites {list(potential.local_sites)} "
                    f"inside the subsample plate '{potential.plate.name}', which needs "
                    f"{' and '.join(needs)}: the default step rule and features need "
                    "p(x_i | π), an integral over the local sites."
                )
        dtype = potential.init_theta.dtype
        medians = constrained(potential, potential.unravel(potential.init_theta), data)
        pi0 = {k: medians[k] for k in potential.latent_sites}
        alpha = site_values(potential, pi0, data)[0]
        tilt = {k: v * jnp.linspace(1.0, 2.0, v.shape[-1], dtype=v.dtype) for k, v in pi0.items()}
        alpha_tilted = site_values(potential, to_simplex(tilt), data)[0]
        for name in potential.latent_sites:
            a = np.asarray(alpha[name])
            if not np.array_equal(a, np.asarray(alpha_tilted[name])):
                raise ValueError(
                    f"The concentration of Dirichlet site '{name}' depends on other latent "
                    "sites; SGRLD needs concentrations fixed by the data and constants."
                )
            if not (np.all(np.isfinite(a)) and np.all(a > 0)):
                raise ValueError(f"Dirichlet site '{name}' has concentrations that are not "
                                 "all positive and finite.")
        alpha = {k: jnp.asarray(v, dtype) for k, v in alpha.items()}
        N, n = potential.num_data, potential.plate.subsample_size
        d = sum(int(np.prod(v.shape)) for v in alpha.values())
        measure = not potential.local and (self._step_size is None or request == "auto")
        passes, pi_star, at_star = 0.0, to_simplex(alpha), None
        uniform = uniform_design(N, n, self.replace, dtype)
        ref = reference_totals(alpha)
        if measure:
            pi_star, at_star, steps = em_point(potential, pi_star, alpha, ref, data,
                                               uniform.moments(uniform.params),
                                               EM_ITERATIONS, self.chunk_size)
            passes += steps + 2.0
        names = ["uniform", "stratified"] if request == "auto" else [request]
        if request == "auto" and self.features is None and (
                potential.local or N * d > MAX_FEATURE_NUMBERS or n < 2):
            names = ["uniform"]
        elif request == "auto" and self.features is not None and potential.local:
            names = ["stratified"]
        candidates = []
        for name in names:
            if name == "uniform":
                candidates.append((name, uniform, None, at_star))
                continue
            strata, used = self._strata(potential, pi_star, data, auto=request == "auto")
            design = stratified_design(strata, dtype)
            dm = None
            if measure:
                dm = drift_noise(potential, pi_star, data, design.moments(design.params),
                                 self.chunk_size)
                used += 2.0
            passes += used
            candidates.append((name, design, strata, dm))
        noise, a = float("nan"), self._step_size
        if measure:
            theta_star = flatten_sites(ref) * flatten_sites(pi_star)
            rate = relaxation_rates(np.asarray(at_star.fisher, np.float64), theta_star, pi_star)
            free = 4.0 * self.max_variance_inflation / float(np.max(rate))
            scored = []
            for cand in candidates:
                ratio = np.asarray(cand[3].noise, np.float64) / np.maximum(theta_star, 1e-300)
                scored.append((4.0 * self.max_variance_inflation / float(np.max(rate + ratio)),
                               float(np.max(ratio))))
            best = int(np.argmax([sc[0] for sc in scored]))
            candidates = [candidates[best]]
            step, noise = scored[best]
            if a is None:
                a = step
                if step * NOISE_LIMIT_FACTOR < free:
                    self._warn_noise_limited(candidates[0][0], n, N, noise,
                                             float(np.max(rate)), step, free)
        name, design, strata, _ = candidates[0]
        b, c = (self.decay_offset, self.decay_power) if self.schedule == "polynomial" else (1, 0)
        schedule = (float(a), float(b), float(c))
        params = SGRLDParams(alpha=alpha, design=design.params,
                             schedule=device_array(schedule, dtype),
                             data_passes=device_array(passes, dtype))
        return SGRLDPreprocessed(
            potential=potential, design=design, alpha=alpha, step_size=float(a),
            schedule=schedule, strata=strata, data_passes=passes,
            seconds=time.perf_counter() - t0, params=params, estimator=name, noise=noise)

    def _strata(self, potential: Potential, pi: dict, data: ModelData, *,
                auto: bool) -> tuple[Strata, float]:
        """The strata of the stratified design (the class docstring) and the data passes
        their features cost."""
        N, n = potential.num_data, potential.plate.subsample_size
        k, passes = self.num_strata, 0.0
        if self.features is None:
            feats = np.asarray(datum_drifts(potential, pi, data, self.chunk_size))
            passes = 1.0
        else:
            feats = np.asarray(self.features)
            feats = feats[:, None] if feats.ndim == 1 else feats
            if feats.ndim != 2 or feats.shape[0] != N:
                raise ValueError(f"SGRLD: features must have shape (N, p) with N={N}, "
                                 f"got {feats.shape}.")
        if auto:  # equal rows up to float rounding (chunked passes) count as one value
            scale = np.maximum(np.max(np.abs(feats), axis=0), np.finfo(np.float64).tiny)
            feats = np.round(feats / scale, 5) * scale
            distinct = distinct_rows(feats)
            k = distinct if distinct <= min(MAX_AUTO_STRATA, n // 2) else min(k, n // 2)
        elif k > n:
            raise ValueError(f"SGRLD: num_strata={k} exceeds the subsample size {n}; each "
                             "stratum needs a draw per step.")
        strata = make_strata(feats, k, n, kmeans_iters=self.kmeans_iters, seed=self.strata_seed)
        return strata, passes

    @staticmethod
    def _warn_noise_limited(name: str, n: int, N: int, noise: float, rate: float,
                            step: float, free: float) -> None:
        warnings.warn(
            f"SGRLD: the gradient noise of estimator={name!r} (subsample size {n} of {N}), "
            f"max_k V_k/θ_k = {noise:.3g} against the relaxation rate 1 + F/θ = {rate:.3g} "
            f"of the likelihood, makes the default step a = {step:.3g}, "
            f"{free / step:.0f}× smaller than without noise ({free:.3g}): the chain needs "
            f"about {4.0 / (step * rate):.3g} steps per independent draw of the stiffest "
            "simplex row. Use a larger subsample_size (V ∝ 1/n), or estimator='stratified' "
            "with features= that group data of similar gradients (e.g. the observed values), "
            "or run that many more steps.",
            NoiseLimitedStepWarning,
            stacklevel=4,
        )

    def _programs(self, pre: SGRLDPreprocessed, *, num_warmup: int, traced: bool):
        del num_warmup
        cfg = SGRLDConfig(potential=pre.potential, draw=pre.design.draw, size=pre.design.size,
                          rng_impl="threefry2x32" if traced else STEP_RNG, local=self.local)
        init_one, step = sgrld_programs(cfg)
        return init_one, step, pre.params

    def _state_axes(self) -> SGRLDState:
        return SGRLDState(**dict.fromkeys(SGRLDState._fields, 0))._replace(params=None)

    def postprocess_fn(self, model_args, model_kwargs) -> Callable[[dict], dict]:
        return self.draw_fn(draw_values, model_args, model_kwargs)
