"""The measured gradient noise of the noise-corrected dynamics: its refinement, the step cap
its uncertainty sets, and the injected noise it leaves.

The corrected dynamics (:func:`~numpyro_subsample.sgmcmc.dynamics.corrected_dynamics`) inject
N(0, 2ch I − h²V̂), V̂ the estimator's noise covariance measured in whitened coordinates at
proxy draws (:mod:`numpyro_subsample.estimators.noise`). An error λ̂ − λ along an
eigen-direction of V̂ changes the stationary variance there by the fraction h(λ − λ̂)/(2c), so
V̂ is refined by more draws, and h capped, until that error is within δ
(``max_variance_inflation``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.estimators.base import GradientEstimator
from numpyro_subsample.estimators.noise import (
    WhitenedNoise,
    direction_errors,
    extend_noise,
    warn_if_noise_limited,
    whitened_noise,
)
from numpyro_subsample.sgmcmc.centring import hand_noncentred_remedy, rewritable_sites
from numpyro_subsample.sgmcmc.chain import Preprocessed, SamplerParams, Whitening
from numpyro_subsample.sgmcmc.dynamics import injected_noise_scale
from numpyro_subsample.sgmcmc.preprocess import whitening_cost

__all__ = [
    "MAX_NOISE_EXTENSIONS",
    "correction_step_cap",
    "corrected_noise_scale",
    "measured_preprocessed",
    "refine_noise",
    "with_time_step",
]

#: At most this many extra batches of 9 proxy draws (one data pass each) refine the noise
#: covariance of a noise-corrected dynamic (:func:`refine_noise`): 8 + 54 draws.
MAX_NOISE_EXTENSIONS = 6


def correction_step_cap(errors: np.ndarray, diffusion: float,
                        max_variance_inflation: float) -> float:
    """The largest h at which the noise correction's own error, h·se(λ̂)/(2c) in the
    stationary variance along each eigen-direction of the measured noise (``errors``: the
    standard errors se over the proxy draws,
    :func:`~numpyro_subsample.estimators.noise.direction_errors`), stays within
    ``max_variance_inflation``; c is the ``diffusion``."""
    worst = float(errors.max()) if errors.size else 0.0
    if not worst > 0:
        return float("inf")
    return 2.0 * diffusion * max_variance_inflation / worst


def refine_noise(
    estimator: GradientEstimator,
    wh: Whitening,
    key: jax.Array,
    data: ModelData,
    measured: WhitenedNoise,
    *,
    step_size_of: Callable[[float], float],
    diffusion: float,
    max_variance_inflation: float,
    chunk_size: int,
) -> WhitenedNoise:
    """More proxy draws for the noise covariance (batches of 9, at most
    :data:`MAX_NOISE_EXTENSIONS` batches) while its standard error limits the step below
    the one the rule ``step_size_of`` (of the largest noise eigenvalue) would choose
    (:func:`correction_step_cap`): the correction removes up to half of the injected variance,
    so a mean over few draws of a heavy-tailed V(θ) would bias the posterior variance by up to
    half its relative error."""
    for i in range(MAX_NOISE_EXTENSIONS):
        cap = correction_step_cap(direction_errors(measured)[1], diffusion,
                                  max_variance_inflation)
        if step_size_of(measured.largest) <= cap:
            break
        measured = extend_noise(
            estimator, measured, wh.scale_tril, jax.random.fold_in(key, i + 1), data,
            point_tril=wh.init_tril, chunk_size=chunk_size,
        )
    return measured


def corrected_noise_scale(noise_cov: Any, step_size: float, dtype: Any, diffusion: float, *,
                          stacklevel: int = 2) -> jax.Array:
    """S of the corrected dynamic's injected noise S ξ, as a ``dtype`` array; warns when the
    gradient noise alone exceeds the diffusion c = ``diffusion`` in some direction
    (``stacklevel`` as in :func:`warnings.warn`, counted from this function)."""
    s, clipped = injected_noise_scale(noise_cov, step_size, diffusion)
    if clipped:
        warnings.warn(
            f"step_size {step_size:.3g}: in {clipped} direction(s) the estimator's gradient "
            f"noise h²v exceeds the injected 2ch (c = {diffusion:g}), so the noise "
            "correction cannot remove it and the posterior there is too wide; pass a "
            "smaller step_size or leave it to the default rule.",
            UserWarning,
            stacklevel=stacklevel,
        )
    return device_array(s, dtype)


def _model_remedy(potential: Potential, data: ModelData) -> str:
    sites = rewritable_sites(potential, data)
    return hand_noncentred_remedy(sites) if sites else ""


def measured_preprocessed(
    potential: Potential,
    wh: Whitening,
    estimator: GradientEstimator,
    key: jax.Array,
    data: ModelData,
    *,
    corrected: bool,
    step_size: float | None,
    rule: Callable[[float, bool, float], float],
    curvature: float,
    diffusion: float,
    max_variance_inflation: float,
    chunk_size: int,
    started: float,
    curvature_site: str = "",
) -> Preprocessed:
    """The preprocessing's end with a measured noise: the estimator's gradient noise at proxy
    draws in whitened coordinates (:func:`~numpyro_subsample.estimators.noise.whitened_noise`,
    refined by :func:`refine_noise` for a ``corrected`` dynamic), the time step (``step_size``
    if given, else ``rule(noise, corrected, curvature)``, the dynamic's step-size rule of the
    largest noise eigenvalue, capped by :func:`correction_step_cap` for a corrected dynamic; a
    default step limited by the noise or by the ``curvature`` μ warns,
    :func:`~numpyro_subsample.estimators.noise.warn_if_noise_limited`, naming
    ``curvature_site``, the coordinate along which μ was measured), the corrected dynamic's
    injected-noise scale and the sampler's arrays. ``started`` is the preprocessing's
    ``time.perf_counter()`` at its start."""

    def chosen(noise: float, corr: bool, mu: float = 1.0) -> float:
        return step_size if step_size is not None else rule(noise, corr, mu)

    measured = whitened_noise(
        estimator, wh.centre, wh.scale_tril, key, data, point_tril=wh.init_tril,
        chunk_size=chunk_size,
    )
    if corrected:
        measured = refine_noise(
            estimator, wh, key, data, measured, step_size_of=lambda v: chosen(v, True),
            diffusion=diffusion, max_variance_inflation=max_variance_inflation,
            chunk_size=chunk_size,
        )
    noise = measured.largest
    h = chosen(noise, corrected, curvature)
    errors = direction_errors(measured)[1]  # one eigendecomposition of the final V̂
    if corrected and step_size is None:
        h = min(h, correction_step_cap(errors, diffusion, max_variance_inflation))
    if step_size is None:
        warn_if_noise_limited(estimator, noise, h, curvature=curvature, stacklevel=3,
                              model_remedy=lambda: _model_remedy(potential, data),
                              noise_free_step=chosen(0.0, corrected, curvature),
                              curvature_site=curvature_site)
    passes = wh.data_passes + estimator.data_passes + measured.data_passes
    dtype = wh.centre.dtype
    scale = (corrected_noise_scale(measured.cov, h, dtype, diffusion, stacklevel=5)
             if corrected else None)
    params = SamplerParams(
        centre=wh.centre, scale_tril=wh.scale_tril, step_size=device_array(h, dtype),
        estimator=estimator.params, init_tril=wh.init_tril, data_passes=device_array(passes, dtype),
        noise_scale=scale,
    )
    return Preprocessed(
        potential=potential, proxy=wh.proxy, estimator=estimator, step_size=float(h), noise=noise,
        centre=wh.centre, scale_tril=wh.scale_tril, seconds=time.perf_counter() - started,
        data_passes=passes, params=params, noise_cov=measured.cov,
        noise_draws=int(measured.points.shape[0] - 1), noise_errors=errors,
        noise_corrected=corrected,
        cost=(*whitening_cost(wh), ("control variate", float(estimator.data_passes)),
              ("noise", float(measured.data_passes))),
    )


def with_time_step(pre: Preprocessed, step_size: float, diffusion: float) -> Preprocessed:
    """``pre`` with time step ``step_size`` (and, for a noise-corrected dynamic, the injected
    noise's scale for it, :func:`corrected_noise_scale`)."""
    dtype = pre.centre.dtype
    h_arr = device_array(step_size, dtype)
    scale = (corrected_noise_scale(pre.noise_cov, step_size, dtype, diffusion, stacklevel=5)
             if pre.noise_corrected else None)
    return pre._replace(step_size=float(step_size),
                        params=pre.params._replace(step_size=h_arr, noise_scale=scale))
