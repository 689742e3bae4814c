"""The proxy of the stochastic-gradient kernels: its choice, fit and whitening, and the checks
of a kernel's options made before it is fitted (a model with local latent sites, which has no
proxy: :mod:`~numpyro_subsample.sgmcmc.local_preprocess`).

Plain functions of explicit arguments, called by
:class:`~numpyro_subsample.sgmcmc.kernel.SGMCMCKernel`. A structured proxy (``"diagonal"``,
``"low-rank"``, :func:`~numpyro_subsample.proxies.structured.fit_structured`) replaces the
default dense Laplace proxy above :data:`MAX_DENSE_DIM` parameters; the whitening and the
sampling step then form no d × d array.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.estimators.base import GradientEstimator
from numpyro_subsample.estimators.registry import STATEFUL, check_estimator_request
from numpyro_subsample.estimators.zv import check_covariates, covariate_choice
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.choice import (
    DEFAULT_RANK,
    MAX_DENSE_DIM,
    STRUCTURED,
    fit_kernel_structured,
    structured_choice,
)
from numpyro_subsample.proxies.laplace import fit_laplace
from numpyro_subsample.proxies.structured import StructuredProxy
from numpyro_subsample.proxies.whitening import identity_scale, proxy_scale
from numpyro_subsample.sgmcmc.chain import (
    Preprocessed,
    SamplerParams,
    Whitening,
    initial_estimates,
)

__all__ = [
    "DEFAULT_RANK",
    "MAX_DENSE_DIM",
    "MAX_ZV_DEGREE2_DIM",
    "STRUCTURED",
    "ProxyRequest",
    "check_given_start",
    "check_dimension",
    "check_request",
    "fit_proxy",
    "proxy_choice",
    "unmeasured_preprocessed",
    "whitened_curvature",
    "whitening",
    "whitening_cost",
]

#: ``ZVOptions(degree=2)`` streams d(d+3)/2 covariates and their (d(d+3)/2)² co-moments per
#: chain: it is refused above this d (5150 covariates, 2.7·10^7 co-moments at d = 100).
#: Degree 1 keeps d × d co-moments, whatever the proxy.
MAX_ZV_DEGREE2_DIM = 100


class ProxyRequest(NamedTuple):
    """A kernel's options of the proxy fit: ``spec`` (its ``proxy`` argument),
    ``kwargs`` (``proxy_kwargs``), ``chunk_size``, ``store_datum_grads``, ``progress``
    (``progress_bar``) and ``needed`` (whether a proxy is fitted when none is given)."""

    spec: str | Proxy | StructuredProxy
    kwargs: dict
    chunk_size: int
    store_datum_grads: bool
    progress: bool
    needed: bool


def check_request(
    label: str,
    proxy: str | Proxy | StructuredProxy,
    estimator: str,
    estimator_options: dict,
    *,
    step_size: float | None,
    preconditioning: bool,
    replace: bool,
    noise_correction: bool | None,
    supports_structured: bool,
    adapt_preconditioner: bool | None = False,
    supports_adaptation: bool = True,
    kernel_params: Sequence[str] = (),
) -> bool:
    """Checks of a kernel's options that need no data (the kernel class ``label``; its
    ``supports_structured``; its keyword arguments ``kernel_params``, the close matches offered
    for a misspelt option); returns whether ``proxy`` is structured.

    Raises
    ------
    ValueError
        A combination of options the kernel does not support, naming the fix.
    """
    structured = isinstance(proxy, StructuredProxy) or (
        isinstance(proxy, str) and proxy in STRUCTURED)
    if structured and not supports_structured:
        given = "a StructuredProxy" if isinstance(proxy, StructuredProxy) else repr(proxy)
        raise ValueError(
            f"proxy={given} (a structured proxy) is supported by SGLD, SGHMC and SGNHT, not "
            f"by {label}; pass proxy='laplace'."
        )
    if adapt_preconditioner and not supports_adaptation:
        raise ValueError(
            f"AdaptationOptions(preconditioner=True) is supported by SGLD, SGHMC and SGNHT, "
            f"not by {label}; leave it out."
        )
    if adapt_preconditioner and noise_correction:
        raise ValueError(
            "NoiseOptions(correction=True) needs the noise covariance in fixed whitened "
            "coordinates, which AdaptationOptions(preconditioner=True) rescales during "
            "warm-up; leave the correction out (None: off with the adapted preconditioner)."
        )
    adapts = supports_adaptation and adapt_preconditioner is not False
    if step_size is None and not preconditioning and not adapts:
        raise ValueError(
            "step_size=None needs preconditioning=True (the default rule works in "
            "whitened coordinates) or the adapted preconditioner (AdaptationOptions("
            "preconditioner=None or True)); pass a step_size."
        )
    check_estimator_request(estimator, estimator_options, replace=replace,
                            kernel=(label, tuple(kernel_params)))
    if noise_correction and estimator in STATEFUL:
        raise ValueError(
            f"NoiseOptions(correction=True) is not supported by estimator={estimator!r} (its "
            "gradient noise changes with the chain's state, the correction assumes a fixed "
            "noise covariance); leave it out."
        )
    if noise_correction and structured:
        raise ValueError(
            "NoiseOptions(correction=True) needs the d × d noise covariance of the estimator, "
            "which a structured proxy (proxy='diagonal', 'low-rank' or a StructuredProxy) "
            "does not form; leave it out (None: off with a structured proxy) or use "
            "proxy='laplace'."
        )
    return structured


def check_dimension(
    dim: int,
    *,
    zv_degree: int,
    structured: bool,
    noise_correction_requested: bool,
    zv_covariates: str = "auto",
) -> None:
    """Checks of a kernel's options that need the model's dimension ``dim``, before the proxy
    fit: ``zv_degree`` (0 without ``zv_stream``) with ``zv_covariates``, and an explicit
    ``NoiseOptions(correction=True)`` (with preconditioning) with a structured proxy."""
    if zv_degree == 1 and covariate_choice(zv_covariates, 1, dim) == "gradient":
        check_covariates(dim, 1)
    if zv_degree == 2:
        covariate_choice(zv_covariates, 2, dim)  # raises for 'linearised'
    if zv_degree == 2 and dim > MAX_ZV_DEGREE2_DIM:
        raise ValueError(
            f"ZVOptions(degree=2) streams d(d+3)/2 = {dim * (dim + 3) // 2} covariates and "
            f"their co-moments per chain for this model's d={dim} parameters, above "
            f"MAX_ZV_DEGREE2_DIM={MAX_ZV_DEGREE2_DIM} (numpyro_subsample.sgmcmc.kernel); "
            "use ZVOptions(degree=1)."
        )
    if structured and noise_correction_requested:
        raise ValueError(
            f"NoiseOptions(correction=True) needs the d × d noise covariance; proxy='laplace' "
            f"is fitted as the structured proxy='low-rank' for d={dim} > MAX_DENSE_DIM="
            f"{MAX_DENSE_DIM} (numpyro_subsample.sgmcmc.kernel). Leave the correction "
            "out, or pass a fitted dense Proxy."
        )


def proxy_choice(spec: str | Proxy | StructuredProxy, dim: int, supports_structured: bool) -> str:
    """The proxy for a model of ``dim`` parameters: ``"laplace"``, ``"variational"``,
    ``"diagonal"``, ``"low-rank"`` (also ``"laplace"`` above :data:`MAX_DENSE_DIM` when the
    kernel ``supports_structured``), ``"given"`` (a Proxy) or ``"given-structured"`` (a
    StructuredProxy)."""
    if isinstance(spec, StructuredProxy):
        return "given-structured"
    if isinstance(spec, Proxy):
        return "given"
    return (structured_choice(spec, dim) if supports_structured else None) or spec


def _fit_structured(request: ProxyRequest, potential: Potential, data: ModelData, key: Any,
                    structure: str) -> StructuredProxy:
    return fit_kernel_structured(
        potential, data, key, structure, request.kwargs,
        laplace_requested=request.spec == "laplace", chunk_size=request.chunk_size,
        store_datum_grads=request.store_datum_grads, progress=request.progress,
        label="the SG kernel",
    )


def fit_proxy(request: ProxyRequest, choice: str, potential: Potential, data: ModelData,
              key: Any) -> Proxy | StructuredProxy | None:
    """The proxy of ``request`` (``choice``: :func:`proxy_choice`), fitted with ``key``
    unless given; None when none is given nor ``request.needed``."""
    proxy = request.spec
    store = request.store_datum_grads
    if isinstance(proxy, (Proxy, StructuredProxy)):
        if proxy.centre.shape != (potential.dim,):
            raise ValueError(
                f"The given proxy has dimension {proxy.centre.shape}, the model "
                f"{potential.dim}."
            )
    elif not request.needed:
        return None
    elif choice in STRUCTURED:
        proxy = _fit_structured(request, potential, data, key, choice)
    elif proxy == "variational":
        from numpyro_subsample.proxies.variational import MAX_FULL_RANK_DIM, fit_variational

        kwargs = dict(request.kwargs)
        if potential.dim <= kwargs.get("max_full_rank_dim", MAX_FULL_RANK_DIM):
            kwargs.setdefault("covariance", "expected_hessian")
        kwargs.setdefault("check_chain", False)  # the pilot is that chain, and adapts to it
        proxy = fit_variational(
            potential, data, key, chunk_size=request.chunk_size, store_datum_grads=store,
            progress=request.progress, **kwargs,
        )
    else:
        kwargs = dict(request.kwargs)
        kwargs.setdefault("check_chain", False)  # the pilot is that chain, and adapts to it
        proxy = fit_laplace(
            potential, data, key, chunk_size=request.chunk_size, store_datum_grads=store,
            progress=request.progress, **kwargs,
        )
    if not store and proxy.datum_grads is not None:
        proxy = proxy._replace(datum_grads=None)
    return proxy


def whitening(proxy: Proxy | StructuredProxy | None, potential: Potential, *,
              preconditioning: bool, structured: bool) -> Whitening:
    """The proxy and the coordinates θ = θ̂ + L w the chain moves in (L dense triangular,
    or structured when the proxy is: then I is a structured identity, not a d × d eye)."""
    d = potential.dim

    def eye(dtype):
        return identity_scale(d, dtype) if structured else jnp.eye(d, dtype=dtype)

    if preconditioning:
        centre, tril = proxy.centre, proxy_scale(proxy)
    else:
        centre = proxy.centre if proxy is not None else potential.init_theta
        tril = eye(centre.dtype)
    init_tril = proxy_scale(proxy) if proxy is not None else eye(centre.dtype)
    passes = proxy.num_data_passes if proxy is not None else 0.0
    return Whitening(proxy=proxy, centre=centre, scale_tril=tril, init_tril=init_tril,
                     data_passes=float(passes))


def whitened_curvature(proxy: Proxy | StructuredProxy | None, preconditioning: bool) -> float:
    """μ of the step-size rules, the largest curvature of the target at θ̂ in whitened
    coordinates: 1 for a dense proxy (Σ̂ is the inverse Hessian there) and the diagonal
    one (unit diagonal); for a low-rank fit max(1, μ_{k+1}/c), its first discarded Ritz
    value over the curvature c it puts on the complement (module docstring of
    :mod:`~numpyro_subsample.proxies.structured`)."""
    info = getattr(proxy, "info", None) or {}
    if not isinstance(proxy, StructuredProxy) or not preconditioning:
        return 1.0
    ritz, k = info.get("ritz_values"), int(info.get("rank") or 0)
    c = info.get("complement_curvature")
    if ritz is None or c is None or len(ritz) <= k:
        return 1.0
    c = max(float(c), float(info.get("eigenvalue_floor", 0.0)))
    return max(1.0, float(ritz[k]) / c) if c > 0 else 1.0


def whitening_cost(wh: Whitening) -> tuple[tuple[str, float], ...]:
    """The data passes of ``wh`` by stage: the proxy fit, the pilot chains that adapted it
    (``info["start_passes"]``), and the rest (the curvature's measurement)."""
    proxy = wh.proxy
    if proxy is None:
        return (("whitening", float(wh.data_passes)),) if wh.data_passes else ()
    total = float(proxy.num_data_passes)
    start = (proxy.info or {}).get("start_passes")
    stages = ([("proxy fit", total)] if start is None
              else [("proxy fit", float(start)), ("pilot chains", total - float(start))])
    if wh.data_passes != total:  # measured on this whitening
        stages.append(("curvature", float(wh.data_passes) - total))
    return tuple(stages)


def unmeasured_preprocessed(potential: Potential, wh: Whitening, estimator: GradientEstimator,
                            step_size: float, started: float) -> Preprocessed:
    """The preprocessing's end without a noise measurement (the adapted preconditioner,
    :mod:`~numpyro_subsample.sgmcmc.adaptation`, and local latent sites): the noise figure is
    NaN and the time step is ``step_size``; ``started`` is the preprocessing's
    ``time.perf_counter()`` at its start."""
    dtype = wh.centre.dtype
    passes = wh.data_passes + estimator.data_passes
    params = SamplerParams(
        centre=wh.centre, scale_tril=wh.scale_tril, step_size=device_array(step_size, dtype),
        estimator=estimator.params, init_tril=wh.init_tril, data_passes=device_array(passes, dtype),
    )
    return Preprocessed(potential=potential, proxy=wh.proxy, estimator=estimator,
                        step_size=float(step_size), noise=float("nan"), centre=wh.centre,
                        scale_tril=wh.scale_tril, seconds=time.perf_counter() - started,
                        data_passes=passes, params=params,
                        cost=(*whitening_cost(wh), ("control variate", estimator.data_passes)))


def check_given_start(pre: Preprocessed, params: SamplerParams, w: jax.Array,
                      data: ModelData) -> None:
    """Raise a ``ValueError`` when the gradient estimate of ``pre.estimator`` is not finite at
    the chains' whitened starts ``w`` ((d,) or (chains, d)), made from given ``init_params``
    (the state's ``params``, whose estimator arrays may be placed on devices, give the
    whitening)."""
    est = pre.estimator
    d = params.centre.shape[0]
    grads = initial_estimates(est.estimate, params._replace(estimator=est.params),
                              jnp.reshape(w, (-1, d)), data)
    bad = ~np.isfinite(np.asarray(grads)).all(axis=1)
    if bad.any():
        raise ValueError(
            f"The gradient estimate is not finite at the initial position given by "
            f"init_params (chain {int(np.flatnonzero(bad)[0])}); pass init_params inside the "
            "support of every site, or leave them out (the chains then start from draws of "
            "the proxy)."
        )
