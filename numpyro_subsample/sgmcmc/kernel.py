"""Stochastic-gradient MCMC kernels for NumPyro: SGLD, SGHMC, SGNHT.

The functional core (:mod:`numpyro_subsample.sgmcmc.chain`: pure per-chain init and
``step(state, data)`` over :class:`SGMCMCState`) wrapped by the thin adapter of
:mod:`numpyro_subsample.core.adapter`; the classes here choose the dynamics, the step-size rule
and run the preprocessing (proxy, estimator, measured noise).

High-dimensional models: with a structured proxy (``proxy="diagonal"`` or ``"low-rank"``,
:func:`~numpyro_subsample.proxies.structured.fit_structured`, chosen by default above
:data:`MAX_DENSE_DIM` parameters) the whitening, the noise measurement and the sampling step
form no d × d array: every product with L is O(d·k) and the noise's largest eigenvalue comes
from Lanczos (:mod:`numpyro_subsample.estimators.noise`). The noise-corrected dynamics need
the d × d noise covariance, so they are off there and the uncorrected step-size rules apply.
"""

from __future__ import annotations

import copy
import inspect
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.util import is_prng_key

from numpyro_subsample.core.adapter import SubsampleKernel, default_progress, preprocess_keys
from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.options import check_options
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.core.rng import STEP_RNG
from numpyro_subsample.estimators.noise import (
    direction_errors,
    extend_noise,
    warn_if_noise_limited,
    whitened_noise,
)
from numpyro_subsample.estimators.registry import (
    NEEDS_PROXY,
    STATEFUL,
    check_estimator_request,
    configure_estimator,
)
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.laplace import fit_laplace
from numpyro_subsample.proxies.structured import (
    StructuredProxy,
    fit_structured,
    identity_scale,
    proxy_scale,
)
from numpyro_subsample.sgmcmc.chain import (
    Preprocessed,
    SamplerParams,
    SGMCMCState,
    Whitening,
    _Config,
    chain_programs,
)
from numpyro_subsample.sgmcmc.dynamics import (
    Dynamics,
    corrected_dynamics,
    injected_noise_scale,
    sghmc_dynamics,
    sgld_dynamics,
    sgnht_dynamics,
)
from numpyro_subsample.sgmcmc.stepsize import sghmc_step_size, sgld_step_size, sgnht_step_size

__all__ = [
    "SamplerParams",
    "SGMCMCState",
    "Preprocessed",
    "SGMCMCKernel",
    "SGLD",
    "SGHMC",
    "SGNHT",
    "MAX_NOISE_EXTENSIONS",
    "MAX_DENSE_DIM",
    "DEFAULT_RANK",
    "MAX_ZV_DEGREE2_DIM",
]

#: At most this many extra batches of 9 proxy draws (one data pass each) refine the noise
#: covariance of a noise-corrected dynamic (:meth:`SGMCMCKernel._refine_noise`): 8 + 54 draws.
MAX_NOISE_EXTENSIONS = 6

#: ``proxy="laplace"`` (the default) fits the dense Laplace proxy up to this many parameters
#: d, and the structured ``"low-rank"`` proxy above (its d × d Hessian, Cholesky factor and
#: noise covariance would take d² numbers each: 16 MB at d = 2000 in float32). Above it a
#: structured fit uses the empirical Fisher curvature (one data pass for its diagonal, one per
#: Fisher-vector product) unless ``proxy_kwargs`` set ``curvature`` or ``diagonal``: the exact
#: Hessian diagonal costs d Hessian-vector products per datum.
MAX_DENSE_DIM = 2000

#: The rank k of ``proxy="low-rank"`` unless ``proxy_kwargs={"rank": k}`` (capped at d − 1).
DEFAULT_RANK = 20

#: ``zv_degree=2`` streams d(d+3)/2 covariates and their (d(d+3)/2)² co-moments per chain: it
#: is refused above this d (5150 covariates, 2.7·10^7 co-moments at d = 100). Degree 1 keeps
#: d × d co-moments, whatever the proxy.
MAX_ZV_DEGREE2_DIM = 100

_STRUCTURED = ("diagonal", "low-rank")
# options of fit_structured that a kernel sets itself
_FIT_OPTIONS = frozenset(inspect.signature(fit_structured).parameters) - {
    "potential", "data", "rng_key", "structure", "chunk_size", "store_datum_grads", "progress"}


class SGMCMCKernel(SubsampleKernel):
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
    step_size
        The time step h of the diffusion in whitened coordinates, for every dynamic:
        SGLD moves w ← w + h ∇log π(w) + sqrt(2h) ξ (BlackJAX's ``step_size``; the ε of
        Putcha et al. 2023, Eq. 4, is 2h). ``None`` picks h from the measured gradient noise
        so that the stationary variance of a Gaussian target is inflated by at most
        ``max_variance_inflation`` (:mod:`numpyro_subsample.sgmcmc.stepsize`).
    proxy
        ``"laplace"`` (mode and inverse Hessian; default), ``"variational"`` (an autoguide
        fitted by SVI, :func:`~numpyro_subsample.proxies.variational.fit_variational`;
        ``guide=`` in ``proxy_kwargs``; up to its ``max_full_rank_dim`` centred at the guide's
        mean with ``covariance="expected_hessian"``, the inverse full-data Hessian averaged
        over the guide, which does not collapse where a variational fit may), a
        :class:`~numpyro_subsample.proxies.base.Proxy`, or a structured proxy for large d:
        ``"diagonal"`` or ``"low-rank"`` (precision diag + rank k, ``proxy_kwargs={"rank":
        k}``, default :data:`DEFAULT_RANK`; other ``proxy_kwargs`` are options of
        :func:`~numpyro_subsample.proxies.structured.fit_structured`) or a
        :class:`~numpyro_subsample.proxies.structured.StructuredProxy`. ``"laplace"`` is
        dense up to :data:`MAX_DENSE_DIM` parameters and ``"low-rank"`` above (pass a fitted
        ``Proxy`` to keep a dense one). A structured proxy forms no d × d array on the
        sampling path; the step-size rules then take the largest whitened curvature the
        low-rank fit reports (its first discarded Ritz value over the complement's curvature,
        at least 1), and 1 for the diagonal proxy, which assumes weakly correlated parameters.
    preconditioning
        Sample in coordinates whitened by the proxy covariance.
    max_variance_inflation
        δ of the default step-size rule (default 0.05).
    noise_correction
        Inject N(0, 2ch I − h²V) instead of N(0, 2ch I), V the estimator's noise covariance
        (whitened, measured exactly at proxy draws, :mod:`numpyro_subsample.estimators.noise`),
        c the diffusion coefficient: the total noise per step is then the diffusion's, as in
        stochastic-gradient Fisher scoring (Ahn, Korattikara and Welling 2012) and SGHMC's
        B̂ correction (Chen, Fox and Guestrin 2014, Eq. 9), so the default step is larger for
        the same variance inflation (:mod:`numpyro_subsample.sgmcmc.stepsize`). Default
        (None) on, except for ``"saga"`` and ``"svrg"``, whose noise changes with their state,
        and with a structured proxy, which does not form the d × d matrices V and S (True
        raises for both; ``"laplace"`` above :data:`MAX_DENSE_DIM` turns it off by default and
        raises at preprocessing if True); needs preconditioning (V is measured in whitened
        coordinates).
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
        ``"proxy"`` (each chain starts at a draw from N(θ̂, Σ̂)) or ``"centre"``.
    seed
        Seed of the preprocessing (proxy fit, noise measurement), done once per data set and
        shared by all chains and runs.
    progress_bar
        Progress bars for preprocessing (default: on, off under CI).
    zv_stream, zv_degree, zv_fn
        Accumulate the zero-variance statistics (Baker et al. 2019, Sect. 4) of the
        post-warmup draws inside the sampling loop, with polynomial degree 1 or 2 and the
        function g of the constrained sample (default: every coordinate and its square); read
        them with :func:`~numpyro_subsample.post.zv.zv_mean`. Degree 1 keeps d × d
        co-moments per chain (whatever the proxy); degree 2 is refused above
        :data:`MAX_ZV_DEGREE2_DIM` parameters.
    **estimator_options
        Further options of the estimator (see its module).
    """

    sample_field = "z"
    _dynamics_name = "sgld"

    def __init__(
        self,
        model: Callable,
        *,
        estimator: str = "cv",
        step_size: float | None = None,
        proxy: str | Proxy | StructuredProxy = "laplace",
        preconditioning: bool = True,
        max_variance_inflation: float = 0.05,
        replace: bool = True,
        proxy_kwargs: dict | None = None,
        chunk_size: int = 2048,
        store_datum_grads: bool = False,
        noise_correction: bool | None = None,
        init_strategy: str = "proxy",
        seed: int = 0,
        progress_bar: bool | None = None,
        zv_stream: bool = False,
        zv_degree: int = 1,
        zv_fn: Callable | None = None,
        **estimator_options: Any,
    ) -> None:
        check_options(
            "SGMCMCKernel", label=type(self).__name__, step_size=step_size,
            preconditioning=preconditioning,
            max_variance_inflation=max_variance_inflation, replace=replace,
            proxy_kwargs=proxy_kwargs, chunk_size=chunk_size,
            store_datum_grads=store_datum_grads, noise_correction=noise_correction,
            init_strategy=init_strategy, seed=seed,
            progress_bar=progress_bar, zv_stream=zv_stream, zv_degree=zv_degree, zv_fn=zv_fn,
            **({} if isinstance(proxy, (Proxy, StructuredProxy)) else {"proxy": proxy}),
        )
        structured = isinstance(proxy, StructuredProxy) or (
            isinstance(proxy, str) and proxy in _STRUCTURED)
        if structured and not self._supports_structured():
            label = "a StructuredProxy" if isinstance(proxy, StructuredProxy) else repr(proxy)
            raise ValueError(
                f"proxy={label} (a structured proxy) is supported by SGLD, SGHMC and SGNHT, not "
                f"by {type(self).__name__}; pass proxy='laplace'."
            )
        if step_size is None and not preconditioning:
            raise ValueError(
                "step_size=None needs preconditioning=True (the default rule works in "
                "whitened coordinates); pass a step_size."
            )
        check_estimator_request(estimator, estimator_options, replace=replace)
        if noise_correction and estimator in STATEFUL:
            raise ValueError(
                f"noise_correction=True is not supported by estimator={estimator!r} (its gradient "
                "noise changes with the chain's state, the correction assumes a fixed noise "
                "covariance); leave it out."
            )
        if noise_correction and structured:
            raise ValueError(
                "noise_correction=True needs the d × d noise covariance of the estimator, which "
                "a structured proxy (proxy='diagonal', 'low-rank' or a StructuredProxy) does "
                "not form; leave it out (None: off with a structured proxy) or use "
                "proxy='laplace'."
            )
        self._noise_correction_given = noise_correction
        if noise_correction is None:
            noise_correction = estimator not in STATEFUL and not structured
        super().__init__(model, seed=seed)
        self.estimator_name = estimator
        self.estimator_options = estimator_options
        self._step_size = None if step_size is None else float(step_size)
        self._proxy_spec = proxy
        self.preconditioning = bool(preconditioning)
        self.max_variance_inflation = float(max_variance_inflation)
        self.replace = bool(replace)
        self.proxy_kwargs = dict(proxy_kwargs or {})
        self.chunk_size = int(chunk_size)
        self.store_datum_grads = bool(store_datum_grads)
        self._noise_correction = bool(noise_correction) and self.preconditioning
        self.init_strategy = init_strategy
        self.progress_bar = default_progress() if progress_bar is None else progress_bar
        self.zv_stream, self.zv_degree, self.zv_fn = bool(zv_stream), zv_degree, zv_fn

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

    def _noise_scale(self, noise_cov, step_size: float, dtype,
                     corrected: bool | None = None) -> jax.Array | None:
        """S of the corrected dynamic's injected noise S ξ (None without correction); warns
        when the gradient noise alone exceeds the diffusion in some direction."""
        if not self._corrected(corrected):
            return None
        s, clipped = injected_noise_scale(noise_cov, step_size, self._diffusion)
        if clipped:
            warnings.warn(
                f"step_size {step_size:.3g}: in {clipped} direction(s) the estimator's gradient "
                f"noise h²v exceeds the injected 2ch (c = {self._diffusion:g}), so the noise "
                "correction cannot remove it and the posterior there is too wide; pass a "
                "smaller step_size or leave it to the default rule.",
                UserWarning,
                stacklevel=4,
            )
        return jnp.asarray(np.asarray(s, dtype))

    # -- properties users read ----------------------------------------------------------------
    @property
    def default_fields(self) -> tuple[str, ...]:
        return ("z", "diverging", "subsample_size", "data_passes")

    @property
    def proxy(self) -> Proxy | StructuredProxy | None:
        """The fitted proxy: ``proxy.centre`` (θ̂, flat unconstrained), ``proxy.cov`` (Σ̂) or,
        for a structured proxy, ``proxy.cov_op``."""
        return self.preprocessed.proxy

    @property
    def noise_correction(self) -> bool:
        """Whether the dynamics inject N(0, 2ch I − h²V): as resolved for the data once
        preprocessed (off when ``"laplace"`` became ``"low-rank"`` above
        :data:`MAX_DENSE_DIM`), as requested before."""
        if self._pre is not None:
            return bool(self._pre.noise_corrected)
        return self._noise_correction

    @property
    def step_size(self) -> float:
        """The time step h in use (see the class docstring)."""
        return self.preprocessed.step_size

    def with_step_size(self, step_size: float) -> SGMCMCKernel:
        """A copy of this kernel with time step ``step_size`` that shares its preprocessing
        (proxy, estimator, data), for the step-halving check."""
        h = float(step_size)
        if not (np.isfinite(h) and h > 0):
            raise ValueError(f"step_size must be a positive number, got {step_size!r}.")
        new = copy.copy(self)
        new._step_size, new._step = h, None
        if self._pre is not None:
            pre = self._pre
            dtype = pre.centre.dtype
            h_arr = jnp.asarray(np.asarray(h, dtype))
            scale = new._noise_scale(pre.noise_cov, h, dtype, pre.noise_corrected)
            new._pre = pre._replace(
                step_size=h, params=pre.params._replace(step_size=h_arr, noise_scale=scale)
            )
        return new

    def get_diagnostics_str(self, state: SGMCMCState) -> str:
        return f"step size {self.step_size:.2e}. n={int(np.asarray(state.subsample_size).max())}"

    # -- preprocessing --------------------------------------------------------------------------
    def _needs_proxy(self) -> bool:
        return self.preconditioning or self.estimator_name in NEEDS_PROXY

    @classmethod
    def _supports_structured(cls) -> bool:
        """Structured proxies need this class's preprocessing (a subclass with its own, such
        as DistributedSGLD, keeps the dense one)."""
        return cls._preprocess is SGMCMCKernel._preprocess

    def _proxy_choice(self, dim: int) -> str:
        """The proxy for a model of ``dim`` parameters: ``"laplace"``, ``"variational"``,
        ``"diagonal"``, ``"low-rank"`` (also ``"laplace"`` above :data:`MAX_DENSE_DIM`),
        ``"given"`` (a Proxy) or ``"given-structured"`` (a StructuredProxy)."""
        spec = self._proxy_spec
        if isinstance(spec, StructuredProxy):
            return "given-structured"
        if isinstance(spec, Proxy):
            return "given"
        if spec == "laplace" and dim > MAX_DENSE_DIM and self._supports_structured():
            return "low-rank"
        return spec

    def _is_structured(self, dim: int) -> bool:
        return self._proxy_choice(dim) in (*_STRUCTURED, "given-structured")

    def _fit_structured(self, potential: Potential, data: ModelData, key, structure: str):
        d = potential.dim
        kwargs = dict(self.proxy_kwargs)
        allowed = _FIT_OPTIONS
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            why = (f"proxy='laplace' is fitted as proxy='low-rank' for d={d} > MAX_DENSE_DIM="
                   f"{MAX_DENSE_DIM} (numpyro_subsample.sgmcmc.kernel); "
                   if self._proxy_spec == "laplace" else "")
            raise ValueError(
                f"{why}proxy_kwargs {unknown} are not options of the structured fit "
                f"(fit_structured; the structure is chosen by proxy=); valid: {sorted(allowed)}."
                + (" Pass a fitted Proxy to keep a dense proxy." if why else "")
            )
        if structure == "low-rank":
            kwargs.setdefault("rank", min(DEFAULT_RANK, d - 1))
        if d > MAX_DENSE_DIM and "diagonal" not in kwargs:
            # the exact Hessian diagonal costs d Hessian-vector products per datum
            kwargs.setdefault("curvature", "fisher")
        return fit_structured(
            potential, data, key, structure=structure, chunk_size=self.chunk_size,
            store_datum_grads=self.store_datum_grads, progress=self.progress_bar, **kwargs,
        )

    def _fit_proxy(self, potential: Potential, data: ModelData, key):
        proxy = self._proxy_spec
        store = self.store_datum_grads
        choice = self._proxy_choice(potential.dim)
        if isinstance(proxy, (Proxy, StructuredProxy)):
            if proxy.centre.shape != (potential.dim,):
                raise ValueError(
                    f"The given proxy has dimension {proxy.centre.shape}, the model "
                    f"{potential.dim}."
                )
        elif not self._needs_proxy():
            return None
        elif choice in _STRUCTURED:
            proxy = self._fit_structured(potential, data, key, choice)
        elif proxy == "variational":
            from numpyro_subsample.proxies.variational import MAX_FULL_RANK_DIM, fit_variational

            kwargs = dict(self.proxy_kwargs)
            if potential.dim <= kwargs.get("max_full_rank_dim", MAX_FULL_RANK_DIM):
                kwargs.setdefault("covariance", "expected_hessian")
            proxy = fit_variational(
                potential, data, key, chunk_size=self.chunk_size, store_datum_grads=store,
                progress=self.progress_bar, **kwargs,
            )
        else:
            proxy = fit_laplace(
                potential, data, key, chunk_size=self.chunk_size, store_datum_grads=store,
                progress=self.progress_bar, **self.proxy_kwargs,
            )
        if not store and proxy.datum_grads is not None:
            proxy = proxy._replace(datum_grads=None)
        return proxy

    def _whitening(self, potential: Potential, data: ModelData, key) -> Whitening:
        """The proxy and the coordinates θ = θ̂ + L w the chain moves in (L dense triangular,
        or structured when the proxy is: then I is a structured identity, not a d × d eye)."""
        d = potential.dim
        proxy = self._fit_proxy(potential, data, key)
        structured = self._is_structured(d)

        def eye(dtype):
            return identity_scale(d, dtype) if structured else jnp.eye(d, dtype=dtype)

        if self.preconditioning:
            centre, tril = proxy.centre, proxy_scale(proxy)
        else:
            centre = proxy.centre if proxy is not None else potential.init_theta
            tril = eye(centre.dtype)
        init_tril = proxy_scale(proxy) if proxy is not None else eye(centre.dtype)
        passes = proxy.num_data_passes if proxy is not None else 0.0
        return Whitening(proxy, centre, tril, init_tril, float(passes))

    def _chosen_step_size(self, noise: float, corrected: bool | None = None,
                          curvature: float = 1.0) -> float:
        if self._step_size is not None:
            return self._step_size
        return self._default_step_size(noise, corrected, curvature)

    def _whitened_curvature(self, proxy) -> float:
        """μ of the step-size rules, the largest curvature of the target at θ̂ in whitened
        coordinates: 1 for a dense proxy (Σ̂ is the inverse Hessian there) and the diagonal
        one (unit diagonal); for a low-rank fit max(1, μ_{k+1}/c), its first discarded Ritz
        value over the curvature c it puts on the complement (module docstring of
        :mod:`~numpyro_subsample.proxies.structured`)."""
        info = getattr(proxy, "info", None) or {}
        if not isinstance(proxy, StructuredProxy) or not self.preconditioning:
            return 1.0
        ritz, k = info.get("ritz_values"), int(info.get("rank") or 0)
        c = info.get("complement_curvature")
        if ritz is None or c is None or len(ritz) <= k:
            return 1.0
        c = max(float(c), float(info.get("eigenvalue_floor", 0.0)))
        return max(1.0, float(ritz[k]) / c) if c > 0 else 1.0

    def _check_request(self, potential: Potential, structured: bool) -> None:
        """Checks of the kernel's options that need d, before the proxy fit."""
        d = potential.dim
        if self.zv_stream and self.zv_degree == 2 and d > MAX_ZV_DEGREE2_DIM:
            raise ValueError(
                f"zv_degree=2 streams d(d+3)/2 = {d * (d + 3) // 2} covariates and their "
                f"co-moments per chain for this model's d={d} parameters, above "
                f"MAX_ZV_DEGREE2_DIM={MAX_ZV_DEGREE2_DIM} (numpyro_subsample.sgmcmc.kernel); "
                "use zv_degree=1."
            )
        if structured and self._noise_correction_given and self.preconditioning:
            raise ValueError(
                f"noise_correction=True needs the d × d noise covariance; proxy='laplace' is "
                f"fitted as the structured proxy='low-rank' for d={d} > MAX_DENSE_DIM="
                f"{MAX_DENSE_DIM} (numpyro_subsample.sgmcmc.kernel). Leave noise_correction "
                "out, or pass a fitted dense Proxy."
            )

    def _correction_step_cap(self, errors) -> float:
        """The largest h at which the noise correction's own error, h·se(λ̂)/(2c) in the
        stationary variance along each eigen-direction of the measured noise (``errors``: the
        standard errors se over the proxy draws,
        :func:`~numpyro_subsample.estimators.noise.direction_errors`), stays within
        ``max_variance_inflation``."""
        worst = float(errors.max()) if errors.size else 0.0
        if not worst > 0:
            return float("inf")
        return 2.0 * self._diffusion * self.max_variance_inflation / worst

    def _refine_noise(self, estimator, wh: Whitening, key, data: ModelData, measured):
        """More proxy draws for the noise covariance (batches of 9, at most
        :data:`MAX_NOISE_EXTENSIONS` batches) while its standard error limits the step below
        the one the rule would choose (:meth:`_correction_step_cap`): the correction removes up
        to half of the injected variance, so a mean over few draws of a heavy-tailed V(θ) would
        bias the posterior variance by up to half its relative error."""
        for i in range(MAX_NOISE_EXTENSIONS):
            cap = self._correction_step_cap(direction_errors(measured)[1])
            if self._chosen_step_size(measured.largest, True) <= cap:
                break
            measured = extend_noise(
                estimator, measured, wh.scale_tril, jax.random.fold_in(key, i + 1), data,
                point_tril=wh.init_tril, chunk_size=self.chunk_size,
            )
        return measured

    def _preprocess(self, potential: Potential, data: ModelData) -> Preprocessed:
        t0 = time.perf_counter()
        _, k_proxy, k_est, k_noise = preprocess_keys(self.seed)
        check_estimator_request(self.estimator_name, self.estimator_options,
                                replace=self.replace, potential=potential)
        structured = self._is_structured(potential.dim)
        self._check_request(potential, structured)
        corrected = self._noise_correction and not structured
        wh = self._whitening(potential, data, k_proxy)
        estimator = configure_estimator(
            self.estimator_name, potential, data, wh.proxy, replace=self.replace,
            rng_key=k_est, chunk_size=self.chunk_size, **self.estimator_options,
        )
        measured = whitened_noise(
            estimator, wh.centre, wh.scale_tril, k_noise, data, point_tril=wh.init_tril,
            chunk_size=self.chunk_size,
        )
        if corrected:
            measured = self._refine_noise(estimator, wh, k_noise, data, measured)
        noise = measured.largest
        curvature = self._whitened_curvature(wh.proxy) if structured else 1.0
        step_size = self._chosen_step_size(noise, corrected, curvature)
        errors = direction_errors(measured)[1]  # one eigendecomposition of the final V̂
        if corrected and self._step_size is None:
            step_size = min(step_size, self._correction_step_cap(errors))
        if self._step_size is None:
            warn_if_noise_limited(estimator, noise, step_size)
        passes = wh.data_passes + estimator.data_passes + measured.data_passes
        dtype = wh.centre.dtype
        params = SamplerParams(
            wh.centre, wh.scale_tril, jnp.asarray(np.asarray(step_size, dtype)),
            estimator.params, wh.init_tril, jnp.asarray(np.asarray(passes, dtype)),
            self._noise_scale(measured.cov, step_size, dtype, corrected),
        )
        return Preprocessed(
            potential, wh.proxy, estimator, float(step_size), noise, wh.centre, wh.scale_tril,
            time.perf_counter() - t0, passes, params, noise_cov=measured.cov,
            noise_draws=int(measured.points.shape[0] - 1),
            noise_errors=errors, noise_corrected=corrected,
        )

    # -- the functional core --------------------------------------------------------------------
    def _config(self, pre: Preprocessed, num_warmup: int, traced: bool) -> _Config:
        init_strategy = self.init_strategy if self._needs_proxy() else "centre"
        est = pre.estimator
        return _Config(
            pre.potential, est.estimate, self._dynamics(pre.noise_corrected),
            "threefry2x32" if traced else STEP_RNG, init_strategy, self.preconditioning,
            self.zv_degree if self.zv_stream else 0, self.zv_fn,
            int(num_warmup) if self.zv_stream else 0, est.init_state, est.update,
        )

    def _programs(self, pre: Preprocessed, *, num_warmup: int, traced: bool):
        init_one, step = chain_programs(self._config(pre, num_warmup, traced))
        return init_one, step, pre.params

    def _state_axes(self) -> SGMCMCState:
        axes = SGMCMCState(*([0] * len(SGMCMCState._fields)))._replace(params=None)
        if self._pre is not None and self._pre.estimator.update is not None:
            axes = axes._replace(est_state=self._pre.estimator.state_axes)
        return axes

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        vectorized = not (isinstance(rng_key, jax.core.Tracer) or is_prng_key(rng_key))
        if self.estimator_name == "saga" and vectorized:
            # one table per chain, checked before anything is built (the preprocessing checks
            # one, for sequential and parallel chains)
            data = ModelData.from_args(model_args, model_kwargs)
            check_estimator_request(self.estimator_name, self.estimator_options,
                                    replace=self.replace, potential=self.potential_for(data),
                                    num_chains=int(rng_key.shape[0]))
        state = super().init(rng_key, num_warmup, init_params, model_args, model_kwargs)
        if isinstance(state.grad, jax.core.Tracer):
            return state
        if not np.isfinite(np.asarray(state.grad)).all():
            raise ValueError(
                "The gradient estimate is not finite at the initial position; check the "
                "model and init_params."
            )
        return state


class SGLD(SGMCMCKernel):
    """Stochastic gradient Langevin dynamics (Welling and Teh 2011; Putcha et al. 2023, Eq. 4),
    preconditioned by the proxy.

    ``step_size`` is the time step h: w ← w + h ∇log π(w) + sqrt(2h) ξ, so the ε of Putcha et
    al. (Eq. 4) is 2h. Earlier releases took ε here; an explicit ``step_size`` therefore raises
    a ``DeprecationWarning`` for one release (pass ``step_size=ε/2``). See
    :class:`SGMCMCKernel` for the other arguments. Example::

        kernel = SGLD(model, estimator="cv")
        mcmc = MCMC(kernel, num_warmup=1000, num_samples=5000)
        mcmc.run(jax.random.PRNGKey(0), X, y)
    """

    def __init__(self, model: Callable, **kwargs: Any) -> None:
        if kwargs.get("step_size") is not None:
            warnings.warn(
                "SGLD's step_size is now the time step h of w + h∇log π + sqrt(2h)ξ (BlackJAX's "
                "convention, shared with SGHMC and SGNHT); it used to be ε = 2h of Putcha et "
                "al. (2023, Eq. 4). Pass step_size=ε/2 for the old value.",
                DeprecationWarning,
                stacklevel=2,
            )
        super().__init__(model, **kwargs)


class SGHMC(SGMCMCKernel):
    """Stochastic gradient HMC (Chen, Fox and Guestrin 2014) on whitened coordinates, with
    BlackJAX's ``diffusions.sghmc`` (update in :mod:`numpyro_subsample.sgmcmc.dynamics`).

    Parameters
    ----------
    friction
        α of dp = ∇log π dt − αp dt + sqrt(2α) dW in whitened units (default 1.0, see
        :func:`~numpyro_subsample.sgmcmc.stepsize.sghmc_step_size`).
    **kwargs
        As :class:`SGMCMCKernel` (``step_size`` is the time step h); the momentum is the
        state's ``momentum`` field.
    """

    _default_friction = 1.0

    def __init__(self, model: Callable, *, friction: float | None = None, **kwargs: Any) -> None:
        friction = self._default_friction if friction is None else friction
        check_options("SGHMC", label=type(self).__name__, friction=friction)
        self.friction = float(friction)
        super().__init__(model, **kwargs)

    @property
    def _diffusion(self) -> float:
        return self.friction

    def _dynamics(self, corrected: bool | None = None) -> Dynamics:
        if self._corrected(corrected):
            return corrected_dynamics("sghmc", self.friction)
        return sghmc_dynamics(self.friction)

    def _default_step_size(self, noise: float, corrected: bool | None = None,
                           curvature: float = 1.0) -> float:
        return sghmc_step_size(noise, self.friction, self.max_variance_inflation, curvature,
                               corrected=self._corrected(corrected))


class SGNHT(SGHMC):
    """Stochastic gradient Nosé-Hoover thermostat (Ding et al. 2014) on whitened coordinates,
    with BlackJAX's ``diffusions.sgnht``; the thermostat ξ is the state's ``thermostat`` field.

    Parameters
    ----------
    friction
        The diffusion A of the injected noise; ξ starts at A and adapts so that the mean
        kinetic energy per coordinate is 1/2 (default 0.5: the default step is about 2δ/ξ, so
        a smaller A allows a larger step).
    **kwargs
        As :class:`SGMCMCKernel` (``step_size`` is the time step h, default from
        :func:`~numpyro_subsample.sgmcmc.stepsize.sgnht_step_size`).
    """

    _default_friction = 0.5

    def _dynamics(self, corrected: bool | None = None) -> Dynamics:
        if self._corrected(corrected):
            return corrected_dynamics("sgnht", self.friction)
        return sgnht_dynamics(self.friction)

    def _default_step_size(self, noise: float, corrected: bool | None = None,
                           curvature: float = 1.0) -> float:
        return sgnht_step_size(noise, self.friction, self.max_variance_inflation, curvature,
                               corrected=self._corrected(corrected))
