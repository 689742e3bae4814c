"""The adapted proxy above the dense limit: pilot chains with a structured whitening.

Above :data:`~numpyro_subsample.proxies.choice.MAX_DENSE_DIM` parameters the kernels' proxy is
the structured fit at the joint mode (:func:`~numpyro_subsample.proxies.structured.
fit_structured`, low-rank plus diagonal precision). As the dense proxy
(:mod:`~numpyro_subsample.sgmcmc.warmup`, after Stan's windowed warm-up, Carpenter et al.
2017), it is adapted on pilot chains, with every operation O(d·k) per draw:

1. the pilot starts from the fit where it is trusted (it converged and raised no warning) and
   the model has no hierarchical scale; else from the mean-field Gaussian N(m, diag(s²))
   fitted by SVI from the fit's point (:func:`variational_start`,
   :func:`~numpyro_subsample.proxies.variational.mean_field`): the joint mode of a model with
   a group scale is a biased centre for that scale (Papaspiliopoulos, Roberts and Sköld
   2007), while the ELBO averages over the group effects. Where the mean-field fit fails, the
   start is the fit's Adam point with the diagonal covariance of L-BFGS's scaling there
   (:func:`structured_start`);
2. in each window, P chains of the pilot dynamics run with the control-variate estimator
   (Baker et al. 2019, Eq. 4) centred at θ̂_w and whitened by Σ̂_w^(1/2), the diagonal scale of
   :mod:`~numpyro_subsample.sgmcmc.adaptation` adapted within the window;
3. the first window adapts an untrusted start; each later window only where the second half
   of its draws, pooled over chains, differ from the proxy by more than their Monte Carlo
   error (the tests of :func:`~numpyro_subsample.sgmcmc.pilot_moments.window_moments`):
   θ̂_{w+1} is their mean and Σ̂_{w+1} = R Σ̂_w R, R = diag(r): the correlations of Σ̂_w with
   each marginal sd moved to the draws', log r_j² = ESS_j / (ESS_j + 2) · log(v_j / Σ̂_w,jj),
   v_j the draws' variance (the sampling variance of a log variance is about 2 / ESS_j). One
   data pass at θ̂_{w+1} gives the new control variates' Σ_i ∇f_i(θ̂_{w+1}). After two
   windows in a row that agree with the proxy the pilot stops; it has settled where its last
   window agreed;
4. from the mean-field start, that start (with the Hessian's low-rank part) is returned
   beside the adapted proxy (``info["mean_field_start"]``), and the kernel keeps the adapted
   proxy unless the step it measures at the start is more than :data:`MEAN_FIELD_STEP_RATIO`
   times the adapted proxy's: where the gradient noise holds the pilot's effective
   steps (its diagonal scale adapted to the noise) far below the posterior's relaxation time,
   the windows' moments are the chains' transient, not the posterior's, and the proxy they
   give is much noisier than the start.

Where a window moved the centre, and for the mean-field start, the low-rank part is taken
from the Hessian at the centre (Lanczos on the Hessian scaled by the marginal sds,
:func:`_with_low_rank`), with the marginal sds kept: it is not estimated from the pilot's
draws, whose few hundred effective draws of thousands of coordinates leave sample principal
components below the Marchenko-Pastur edge indistinguishable from noise. The sampling chains
then take the step measured from the gradient noise at this proxy, with the curvature of
:func:`structured_curvature` and no diagonal preconditioner on top.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.datapass import value_grad_hessian
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.proxies.base import ProxyFitWarning
from numpyro_subsample.proxies.checks import prior_grad
from numpyro_subsample.proxies.choice import DEFAULT_RANK
from numpyro_subsample.proxies.covariance import (
    StructuredCovariance,
    diag_cov,
    rescaled,
    scale_matvec,
    scale_rmatvec,
    structured_covariance,
)
from numpyro_subsample.proxies.curvature import hessian_vector_product
from numpyro_subsample.proxies.lanczos import lanczos_eigh
from numpyro_subsample.proxies.lowrank import low_rank_precision
from numpyro_subsample.proxies.structured import StructuredProxy
from numpyro_subsample.proxies.variational import mean_field
from numpyro_subsample.proxies.whitening import whiten_matvec
from numpyro_subsample.sgmcmc.adaptation import adaptive_step_size
from numpyro_subsample.sgmcmc.centring import CENTRED_STEP_RATIO, has_group_scales
from numpyro_subsample.sgmcmc.dynamics import Dynamics
from numpyro_subsample.sgmcmc.pilot_chains import (
    PilotSettings,
    pilot_keys,
    run_window,
    warn_all_failed,
)
from numpyro_subsample.sgmcmc.pilot_moments import effective_sizes, window_changes

__all__ = ["CURVATURE_DRAWS", "CURVATURE_ITERATIONS", "LOW_RANK_FLOOR", "MAX_SD_CHANGE",
           "MEAN_FIELD_STEP_RATIO",
           "WhitenedHessian", "adapt_structured", "adapted_structured", "structured_at",
           "structured_curvature", "structured_pilot_proxy", "structured_start"]

#: Pilot draws (one per chain, at the last window's end) at which, with the centre, the
#: whitened curvature of the step-size rule is measured (:func:`structured_curvature`).
CURVATURE_DRAWS = 2
#: Lanczos iterations (data passes) per point of :func:`structured_curvature`.
CURVATURE_ITERATIONS = 12

#: The kernels keep the proxy adapted from a mean-field start unless the step they measure at
#: the start itself (with the Hessian's low-rank part) is larger by more than this factor: the
#: partial centring's (:data:`~numpyro_subsample.sgmcmc.centring.CENTRED_STEP_RATIO`).
MEAN_FIELD_STEP_RATIO = CENTRED_STEP_RATIO

#: The largest factor by which one window changes a marginal sd of the proxy.
MAX_SD_CHANGE = 100.0

#: Ritz values of the Hessian scaled by the draws' marginal sds below this are raised to it:
#: no direction gets more variance than its marginal sds give it. A centre that is not a mode
#: can have directions of negative or vanishing curvature, whose variance the draws bound but
#: the Hessian does not.
LOW_RANK_FLOOR = 1.0


def adapted_structured(proxy) -> bool:
    """Whether ``proxy`` is a structured proxy that pilot chains changed: the kernels then
    choose the step from its measured gradient noise, as with the dense adapted proxy, and
    adapt no diagonal preconditioner on top of it."""
    return isinstance(proxy, StructuredProxy) and proxy.kind == "adapted"


class WhitenedHessian(NamedTuple):
    """v ↦ Lᵀ ∇²f(θ) L v with L the square root of a structured Σ̂, one data pass per
    product, as a hashable matvec for :func:`~numpyro_subsample.proxies.lanczos.lanczos_eigh`
    (``operand = (theta, data, cov_op)``)."""

    potential: Potential
    chunk_size: int

    def __call__(self, operand, v: jax.Array) -> jax.Array:
        theta, data, op = operand
        hv = hessian_vector_product(self.potential, theta, scale_matvec(op, v), data,
                                    self.chunk_size)
        return scale_rmatvec(op, hv)


def structured_curvature(proxy: StructuredProxy, potential: Potential, data: ModelData, *,
                         chunk_size: int) -> tuple[float, float]:
    """μ of the step-size rule for an adapted structured proxy, and the data passes it cost:
    the largest eigenvalue of Lᵀ∇²f(θ)L, Σ̂ = L Lᵀ, over θ the centre and the pilot's last
    draws (``proxy.info["draws"]``; the prior's curvature, which carries a hierarchical
    model's variation, changes between them), each by :data:`CURVATURE_ITERATIONS` Lanczos
    iterations (the largest Ritz value converges first, from below); at least 1. The
    matrix-free counterpart of :func:`~numpyro_subsample.sgmcmc.curvature.measured_curvature`."""
    dtype = proxy.centre.dtype
    points = [proxy.centre] + [jnp.asarray(t, dtype) for t in (proxy.info or {}).get("draws", [])]
    num_iter = min(CURVATURE_ITERATIONS, potential.dim)
    mu = 1.0
    for k, theta in enumerate(points):
        lz = lanczos_eigh(WhitenedHessian(potential, chunk_size), (theta, data, proxy.cov_op),
                          jax.random.PRNGKey(k), potential.dim, 1, num_iter, dtype)
        top = float(np.asarray(lz.eigenvalues)[0])
        if np.isfinite(top):
            mu = max(mu, top)
    return mu, float(num_iter * len(points))


def structured_at(potential: Potential, data: ModelData, centre: np.ndarray,
                  cov_op: StructuredCovariance, *, chunk_size: int, kind: str, passes: float,
                  info: dict) -> StructuredProxy:
    """The structured proxy N(``centre``, ``cov_op``) with Σ_i ∇f_i at the centre (one chunked
    data pass, no (N, d) table).

    Raises
    ------
    ValueError
        The potential or its gradient is not finite at ``centre``.
    """
    dtype = potential.init_theta.dtype
    theta = device_array(np.asarray(centre, dtype))
    value, grad = value_grad_hessian(potential, theta, data, chunk_size, hessian=False)[:2]
    sum_grads = grad - prior_grad(potential, theta, data)
    if not (np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(sum_grads)))):
        raise ValueError("The potential is not finite at the adapted proxy's centre.")
    return StructuredProxy(centre=theta, cov_op=cov_op, datum_grads=None, sum_grads=sum_grads,
                           num_data_passes=float(passes) + 1.0, seconds=0.0, kind=kind,
                           info={"potential": float(value), **info})


def _with_low_rank(proxy: StructuredProxy, potential: Potential, data: ModelData,
                   rng_key: jax.Array, chunk_size: int,
                   rank: int = DEFAULT_RANK,
                   curvature: str = "hessian") -> tuple[StructuredProxy, float]:
    """The adapted proxy with the low-rank part of the Hessian at its (moved) centre: with
    v its marginal variances, m = min(2k + 10, d) Lanczos iterations (a data pass each) on
    diag(v)^(1/2) C diag(v)^(1/2) (C the fit's ``curvature``, k = ``rank``, the fit's,
    the complement at the largest discarded Ritz value), then the marginal sds moved back to
    v^(1/2) (:func:`~numpyro_subsample.proxies.covariance.rescaled`); the proxy unchanged
    where the Hessian has no converged Ritz pair."""
    d, dtype = potential.dim, proxy.centre.dtype
    rank = min(int(rank), d - 1)
    if rank < 1:
        return proxy, 0.0
    var = np.asarray(diag_cov(proxy.cov_op), np.float64)
    num_iter = min(2 * rank + 10, d)
    op, info, _ = low_rank_precision(
        potential, data, proxy.centre, jax.random.fold_in(rng_key, 1), 1.0 / var, float(d),
        LOW_RANK_FLOOR, rank=rank, num_iter=num_iter, complement="next", ritz_tol=0.1,
        curvature=curvature, chunk_size=chunk_size)
    ratio = var / np.asarray(diag_cov(op), np.float64)
    if info["rank"] == 0 or not np.all(np.isfinite(ratio) & (ratio > 0)):
        return proxy, float(num_iter)
    op = rescaled(op, jnp.asarray(np.sqrt(ratio), dtype))
    return proxy._replace(cov_op=op, info={**(proxy.info or {}), **info}), float(num_iter)


def structured_start(potential: Potential, data: ModelData, *, chunk_size: int, reason: str,
                     centre: jax.Array | None = None,
                     sd: np.ndarray | None = None) -> StructuredProxy:
    """The pilot's start N(``centre``, diag(``sd``²)): by default the potential's feasible
    start (:attr:`~numpyro_subsample.core.potential.Potential.init_theta`) with the unit
    covariance of the unconstrained space; ``reason`` goes to ``info``."""
    dtype = potential.init_theta.dtype
    centre = potential.init_theta if centre is None else centre
    sd = np.ones(potential.dim) if sd is None else np.asarray(sd, np.float64)
    if not (np.all(np.isfinite(np.asarray(centre))) and np.all(np.isfinite(sd) & (sd > 0))):
        centre, sd = potential.init_theta, np.ones(potential.dim)
    return structured_at(potential, data, np.asarray(centre),
                         structured_covariance(jnp.asarray(1.0 / sd**2, dtype)),
                         chunk_size=chunk_size, kind="start", passes=0.0,
                         info={"reason": reason})


def variational_start(potential: Potential, data: ModelData, rng_key: jax.Array, *,
                      init, chunk_size: int, reason: str) -> StructuredProxy | None:
    """The pilot's start N(m, diag(s²)) of the mean-field fit
    (:func:`~numpyro_subsample.proxies.variational.mean_field`) from ``init``; None where
    its ELBO or moments are not finite."""
    try:
        q = mean_field(potential, data, rng_key, init=None if init is None else np.asarray(init))
    except ValueError:
        return None
    if not (np.all(np.isfinite(q.mean)) and np.all(np.isfinite(q.sd) & (q.sd > 0))):
        return None
    start = structured_start(potential, data, chunk_size=chunk_size, reason=reason,
                             centre=q.mean, sd=q.sd)
    return start._replace(kind="mean-field", num_data_passes=start.num_data_passes + q.passes,
                          info={**start.info, "mean_field": q.info})


def _trusted(proxy: StructuredProxy, found: list[str]) -> bool:
    return not found and bool((proxy.info or {}).get("converged", True))


def structured_pilot_proxy(fit: Callable[[str], StructuredProxy], spec: str,
                           potential: Potential, data: ModelData, rng_key: jax.Array, *,
                           dynamics: Dynamics, rule: Callable[[float, float], float],
                           windows: tuple[int, ...], num_chains: int, chunk_size: int,
                           replace: bool = True, alternative: bool = True) -> StructuredProxy:
    """The structured fit ``fit(spec)`` adapted by :func:`adapt_structured`: from the fit
    where it is trusted and the model has no group scale (kept where no window disagrees with
    it), else from :func:`variational_start` at the fit's point, or :func:`structured_start`
    at its Adam point where that fails (module docstring). The fit's warnings are raised only
    where the adaptation fails at once and the fit is kept. ``alternative=False`` (a kernel
    with a given step, which has nothing to choose) leaves out the mean-field start's
    alternative (:func:`adapt_structured`)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ProxyFitWarning)
        fitted = fit(spec)
    found = [w for w in caught if issubclass(w.category, ProxyFitWarning)]
    for w in caught:
        if not issubclass(w.category, ProxyFitWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    trusted = _trusted(fitted, found)
    reason = "; ".join(str(w.message) for w in found) or "the structured fit did not converge"
    info = fitted.info or {}
    point = fitted.centre if trusted else info.get("adam_theta")
    start = None
    if not trusted or has_group_scales(potential, data):
        reason = reason if not trusted else "the joint mode of a model with a group scale"
        start = variational_start(potential, data, jax.random.fold_in(rng_key, 101),
                                  init=point, chunk_size=chunk_size, reason=reason)
        trusted = trusted and start is None  # a trusted fit stays the start where SVI fails
    if start is None:
        start = fitted if trusted else structured_start(
            potential, data, chunk_size=chunk_size, reason=reason,
            centre=point, sd=info.get("adam_sd"))
    adapted = adapt_structured(start, potential, data, rng_key, trusted=trusted,
                               rank=int(info.get("rank_requested") or info.get("rank")
                                        or DEFAULT_RANK),
                               curvature=info.get("curvature") or "hessian",
                               dynamics=dynamics, rule=rule, windows=windows,
                               num_chains=num_chains, chunk_size=chunk_size, replace=replace,
                               alternative=alternative)
    if adapted is None:  # every pilot chain failed at once: the fit, with its warnings
        for w in found:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return fitted
    if adapted.kind != "adapted":  # no window disagreed with the (trusted) fit
        return adapted
    info = {**adapted.info, "start_info": {"reason": None if trusted else reason,
                                           "fit_info": fitted.info},
            "start_passes": adapted.info["start_passes"] + fitted.num_data_passes}
    return adapted._replace(num_data_passes=adapted.num_data_passes + fitted.num_data_passes,
                            seconds=adapted.seconds + fitted.seconds, info=info)


def adapt_structured(start: StructuredProxy, potential: Potential, data: ModelData,
                     rng_key: jax.Array, *, trusted: bool, rank: int, curvature: str,
                     dynamics: Dynamics,
                     rule: Callable[[float, float], float], windows: tuple[int, ...],
                     num_chains: int, chunk_size: int, replace: bool = True,
                     alternative: bool = True) -> StructuredProxy | None:
    """The proxy adapted from ``start`` by pilot chains in ``windows`` (module docstring);
    None with a :class:`~numpyro_subsample.sgmcmc.pilot_chains.ProxyAdaptationWarning` if every
    pilot chain fails in the first window.

    ``rank`` and ``curvature`` are the structured fit's (those of the low-rank part taken at
    each new centre). A window moves the centre or rescales the covariance only where its
    draws differ from the proxy by more than their Monte Carlo error, as for the dense proxy
    (:func:`~numpyro_subsample.sgmcmc.pilot_moments.window_moments`), or always after a start
    that is not ``trusted`` (the first window; later ones are tested); after two windows in
    a row that agree with it, the pilot stops. From a ``"mean-field"`` start, that start with
    the Hessian's low-rank part is returned too, in ``info["mean_field_start"]`` (with
    ``alternative``; its Lanczos iterations cost up to 2k + 10 data passes).

    Returns
    -------
    StructuredProxy
        ``kind="adapted"`` if a window changed it, else ``start`` with the windows in its
        ``info``; ``info["windows"]`` holds, per window, its steps, the largest shift of the
        centre and the largest log change of an sd (both in the previous proxy's sds) and the
        failed chains; ``info["settled"]`` whether the last window agreed with its proxy;
        ``info["mean_field_start"]`` the alternative above (or None).
    """
    t0 = time.perf_counter()
    n = int(potential.plate.subsample_size)
    pilot = PilotSettings(potential=potential, data=data, dynamics=dynamics,
                          step_size=adaptive_step_size(rule), num_warmup=max(windows),
                          num_chains=num_chains, chunk_size=chunk_size, replace=replace)
    keys = pilot_keys(rng_key, len(windows), num_chains)
    proxy, passes, record, theta_start = start, float(start.num_data_passes), [], None
    agreed = 0  # windows in a row that agreed with the proxy
    for k, length in enumerate(windows):
        states, ws, failed, est_passes = run_window(pilot, proxy, length, keys[k], theta_start)
        passes += est_passes + float(length) * num_chains * n / potential.num_data
        if failed.all():
            warn_all_failed(num_chains, k + 1, "structured proxy", proxy.kind, stacklevel=5)
            break
        # an untrusted start is adapted by the first window; later windows are tested
        moved, rescaled_ = window_changes(ws, trusted or k > 0)
        op = proxy.cov_op
        dtype = proxy.centre.dtype
        draws = np.asarray(proxy.centre + whiten_matvec(op, jnp.asarray(ws, dtype)),
                           np.float64)  # (steps, chains, d)
        flat = draws.reshape(-1, draws.shape[-1])
        mean, var = flat.mean(0), flat.var(0) + 1e-300
        old_var = np.asarray(diag_cov(op), np.float64)
        ess = np.clip(effective_sizes(draws), 1.0, flat.shape[0])
        # a window moves an sd by at most MAX_SD_CHANGE (a coordinate that froze would
        # otherwise take a scale of 0)
        log_ratio = np.clip(np.log(var / old_var), -2 * np.log(MAX_SD_CHANGE),
                            2 * np.log(MAX_SD_CHANGE))
        old_sd = np.sqrt(old_var)
        centre = mean if moved else np.asarray(proxy.centre, np.float64)
        record.append({"steps": int(length),
                       "shift": float(np.max(np.abs(mean - np.asarray(proxy.centre)) / old_sd)),
                       "log_sd_change": float(np.max(np.abs(0.5 * log_ratio))),
                       "failed_chains": int(failed.sum()), "moved": moved,
                       "rescaled": rescaled_})
        last = np.asarray(proxy.centre + whiten_matvec(op, states.w), np.float64)
        last_draws = last[~failed][:CURVATURE_DRAWS]
        theta_start = np.where(failed[:, None], centre[None], last)
        if not (moved or rescaled_):
            agreed += 1
            if agreed >= 2:  # two windows agree with the proxy within their Monte Carlo error
                break
            continue
        agreed = 0
        if rescaled_:  # marginal sds to the draws', log ratio shrunk by ESS_j / (ESS_j + 2)
            op = rescaled(op, jnp.asarray(np.exp(0.5 * ess / (ess + 2.0) * log_ratio), dtype))
        if moved:
            proxy = structured_at(potential, data, centre, op, chunk_size=chunk_size,
                                  kind="adapted", passes=passes, info={})
            proxy, lanczos = _with_low_rank(proxy, potential, data,
                                            jax.random.fold_in(rng_key, k), chunk_size, rank,
                                            curvature)
            passes = proxy.num_data_passes + lanczos
        else:
            proxy = proxy._replace(cov_op=op, kind="adapted")
    if k == 0 and failed.all():
        return None
    settled = agreed >= 1
    other = None
    if alternative and start.kind == "mean-field" and proxy is not start:
        # the kernel measures the step at both (kernel_preprocess, MEAN_FIELD_STEP_RATIO)
        other, lanczos = _with_low_rank(start._replace(kind="adapted"), potential, data,
                                        jax.random.fold_in(rng_key, len(windows)),
                                        chunk_size, rank, curvature)
        passes += lanczos
        other = other._replace(info={**other.info, "draws": [], "windows": record,
                                     "start": start.kind})
    info = {"windows": record, "settled": settled, "pilot_chains": num_chains,
            "step_size": pilot.step_size, "draws": last_draws, "mean_field_start": other,
            "start_passes": float(start.num_data_passes)}
    if proxy is start:
        return start._replace(info={**(start.info or {}), **info}, num_data_passes=passes)
    return proxy._replace(info={**(proxy.info or {}), "start": start.kind, **info},
                          num_data_passes=passes, seconds=time.perf_counter() - t0)
