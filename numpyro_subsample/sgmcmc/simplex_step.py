"""SGRLD's preprocessing: the Dirichlet concentrations, the subsample design and the default
step a from the measured gradient noise (the rule of :class:`~numpyro_subsample.sgmcmc.sgrld.
SGRLD`'s ``step_size``), with local latent sites drawn by their inner update
(:mod:`~numpyro_subsample.sgmcmc.simplex_local`).
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.adapter import constrained
from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.estimators.local import LocalConfig, init_local_state
from numpyro_subsample.estimators.noise import NoiseLimitedStepWarning
from numpyro_subsample.estimators.selection import SamplingDesign, uniform_design
from numpyro_subsample.estimators.stratified import (
    Strata,
    distinct_rows,
    make_strata,
    stratified_design,
)
from numpyro_subsample.sgmcmc.options import StrataOptions
from numpyro_subsample.sgmcmc.simplex import (
    datum_drifts,
    drift_noise,
    em_point,
    flatten_sites,
    relaxation_rates,
    to_simplex,
)
from numpyro_subsample.sgmcmc.simplex_local import (
    LOCAL_SWEEPS,
    local_datum_drifts,
    local_drift_moments,
)
from numpyro_subsample.sgmcmc.simplex_model import reference_totals, site_values

__all__ = [
    "EM_ITERATIONS",
    "MAX_AUTO_STRATA",
    "MAX_FEATURE_NUMBERS",
    "NOISE_LIMIT_FACTOR",
    "SimplexStep",
    "dirichlet_concentrations",
    "simplex_step",
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

#: Data passes of one measurement with local sites: the inner updates and two of drifts.
LOCAL_PASSES = LOCAL_SWEEPS + 2.0


class SimplexStep(NamedTuple):
    """The estimator's name, design and strata, the step a, the measured noise
    max_k V_k / θ*_k, the largest relaxation rate λ of the step rule (both NaN when not
    measured) and the data passes spent."""

    estimator: str
    design: SamplingDesign
    strata: Strata | None
    step_size: float
    noise: float
    data_passes: float
    rate: float = float("nan")


def dirichlet_concentrations(potential: Potential, data: ModelData) -> dict:
    """The concentrations α of every Dirichlet site, checked fixed (not depending on other
    latent sites), positive and finite."""
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
    return {k: jnp.asarray(v, dtype) for k, v in alpha.items()}


def _strata(potential: Potential, pi: dict, data: ModelData, opts: StrataOptions,
            chunk_size: int, *, auto: bool, drifts: Any = None) -> tuple[Strata, float]:
    """The strata of the stratified design (the SGRLD docstring) and the data passes their
    features cost; ``drifts``: the measurement with local sites (:func:`_local_measure`),
    whose per-datum table h_i(z_i) are then the default features."""
    N, n = potential.num_data, potential.plate.subsample_size
    k, passes = opts.num_strata, 0.0
    if opts.features is None and drifts is not None:
        feats = np.asarray(drifts.table(pi))
        passes = LOCAL_PASSES - 1.0
    elif opts.features is None:
        feats = np.asarray(datum_drifts(potential, pi, data, chunk_size))
        passes = 1.0
    else:
        feats = np.asarray(opts.features)
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
    return make_strata(feats, k, n, kmeans_iters=opts.kmeans_iters, seed=opts.seed), passes


def _local_measure(potential: Potential, local: LocalConfig, data: ModelData, seed: int,
                   chunk_size: int) -> Any:
    """``measure(pi, moments)`` of the drift moments with the local sites drawn by their
    inner update (:func:`~numpyro_subsample.sgmcmc.simplex_local.local_drift_moments`), their
    warm starts carried from call to call; ``measure.table(pi)``: the per-datum drifts
    (:func:`~numpyro_subsample.sgmcmc.simplex_local.local_datum_drifts`); ``measure.calls``
    counts the calls of both."""
    dtype = potential.init_theta.dtype
    carry = {"state": init_local_state(potential.local, potential.num_data, dtype,
                                       local.init_step)}
    key = jax.random.PRNGKey(seed)

    def measure(pi, moments):
        dm, carry["state"] = local_drift_moments(
            potential, local, pi, carry["state"], jax.random.fold_in(key, measure.calls),
            data, moments, chunk_size)
        measure.calls += 1
        return dm

    def table(pi):
        out, carry["state"] = local_datum_drifts(
            potential, local, pi, carry["state"], jax.random.fold_in(key, measure.calls),
            data, chunk_size)
        measure.calls += 1
        return out

    measure.calls, measure.table = 0, table
    return measure


def simplex_step(potential: Potential, data: ModelData, alpha: dict, *, request: str,
                 step_size: float | None, max_variance_inflation: float, replace: bool,
                 strata: StrataOptions, local: LocalConfig, chunk_size: int,
                 seed: int = 0) -> SimplexStep:
    """The design (``request``: ``"auto"``, ``"uniform"`` or ``"stratified"``) and the step a
    of SGRLD (its docstring): the noise is measured unless ``step_size`` is given with a
    named estimator; with local sites, at a point reached by scoring steps whose drifts draw
    the local sites by their inner update ``local``."""
    N, n = potential.num_data, potential.plate.subsample_size
    dtype = potential.init_theta.dtype
    d = sum(int(np.prod(v.shape)) for v in alpha.values())
    measure = step_size is None or request == "auto"
    passes, pi_star, at_star = 0.0, to_simplex(alpha), None
    uniform = uniform_design(N, n, replace, dtype)
    ref = reference_totals(alpha)
    drifts = _local_measure(potential, local, data, seed, chunk_size) if (
        potential.local and measure) else None
    if measure:
        m = uniform.moments(uniform.params)
        pi_star, at_star, steps = em_point(
            potential, pi_star, alpha, ref, data, m, EM_ITERATIONS, chunk_size,
            measure=None if drifts is None else (lambda p, _: drifts(p, m)))
        passes += steps + 2.0 if drifts is None else (steps + 1.0) * LOCAL_PASSES
    names = ["uniform", "stratified"] if request == "auto" else [request]
    if request == "auto" and strata.features is None and (N * d > MAX_FEATURE_NUMBERS or n < 2
                                                          or (potential.local and not measure)):
        names = ["uniform"]
    elif request == "auto" and strata.features is not None and potential.local:
        names = ["stratified"]
    candidates = []
    for name in names:
        if name == "uniform":
            candidates.append((name, uniform, None, at_star))
            continue
        made, used = _strata(potential, pi_star, data, strata, chunk_size,
                             auto=request == "auto", drifts=drifts)
        design = stratified_design(made, dtype)
        dm = None
        if measure:
            mo = design.moments(design.params)
            dm = (drift_noise(potential, pi_star, data, mo, chunk_size) if drifts is None
                  else drifts(pi_star, mo))
            used += 2.0 if drifts is None else LOCAL_PASSES
        passes += used
        candidates.append((name, design, made, dm))
    noise, a, max_rate = float("nan"), step_size, float("nan")
    if measure:
        theta_star = flatten_sites(ref) * flatten_sites(pi_star)
        rate = relaxation_rates(np.asarray(at_star.fisher, np.float64), theta_star, pi_star)
        max_rate = float(np.max(rate))
        free = 4.0 * max_variance_inflation / max_rate
        scored = []
        for cand in candidates:
            ratio = np.asarray(cand[3].noise, np.float64) / np.maximum(theta_star, 1e-300)
            scored.append((4.0 * max_variance_inflation / float(np.max(rate + ratio)),
                           float(np.max(ratio))))
        best = int(np.argmax([sc[0] for sc in scored]))
        candidates = [candidates[best]]
        step, noise = scored[best]
        if a is None:
            a = step
            if step * NOISE_LIMIT_FACTOR < free:
                _warn_noise_limited(candidates[0][0], n, N, noise, float(np.max(rate)), step,
                                    free)
    name, design, made, _ = candidates[0]
    return SimplexStep(estimator=name, design=design, strata=made, step_size=float(a),
                       noise=noise, data_passes=passes, rate=max_rate)


def _warn_noise_limited(name: str, n: int, N: int, noise: float, rate: float,
                        step: float, free: float) -> None:
    warnings.warn(
        f"SGRLD: the gradient noise of estimator={name!r} (subsample size {n} of {N}), "
        f"max_k V_k/θ_k = {noise:.3g} against the relaxation rate 1 + F/θ = {rate:.3g} "
        f"of the likelihood, makes the default step a = {step:.3g}, "
        f"{free / step:.0f}× smaller than without noise ({free:.3g}): the chain needs "
        f"about {4.0 / (step * rate):.3g} steps per independent draw of the stiffest "
        "simplex row. Use a larger subsample_size (V ∝ 1/n), or estimator='stratified' "
        "with StrataOptions(features=...) that group data of similar gradients (e.g. the "
        "observed values), or run that many more steps.",
        NoiseLimitedStepWarning,
        stacklevel=5,
    )
