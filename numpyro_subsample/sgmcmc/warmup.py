"""The proxy adapted on pilot chains: windowed warm-up before the sampling chains start.

A Gaussian proxy (θ̂, Σ̂) centres the control variates, whitens the dynamics and sets the step
through the measured noise. Fitted once at the joint mode it does all three badly where the
mode is a poor summary of the posterior (the degenerate mode of a centred hierarchical model,
the mode of a non-centred one far from the bulk, a sparsity prior's spike). As Stan adapts its
metric in windows of growing length during warm-up (Carpenter et al. 2017; Stan Reference
Manual, "HMC algorithm parameters"), the proxy is here re-estimated from the draws of ``P``
pilot chains (vectorized) in windows w = 1, …, W:

1. the chains run ``windows[w]`` steps of SGHMC's dynamics (the kernel's friction for SGHMC,
   1 for SGLD and SGNHT, whose own pilot chains stayed in a funnel's neck where a variational
   start put them) with the control-variate
   estimator (Baker et al. 2019, Eq. 4) centred at θ̂_w, whitened by L_w and with the diagonal
   scale of :mod:`~numpyro_subsample.sgmcmc.adaptation` adapted within the window (its step
   rule needs no noise measurement, so a poor proxy only slows the pilot down);
2. from the second half of the window's draws, pooled over chains, in the whitened coordinates
   w = L_w⁻¹(θ − θ̂_w): the mean m and a covariance C regularised towards the identity (the
   previous fit) by the draws' effective sample size
   (:func:`~numpyro_subsample.sgmcmc.pilot_moments.window_covariance`);
3. θ̂_{w+1} = θ̂_w + L_w m and Σ̂_{w+1} = L_w C L_wᵀ; one full-data pass at θ̂_{w+1} gives
   Σ_i ∇f_i(θ̂_{w+1}), the new control variates, and ∇²f(θ̂_{w+1}), in the Laplace fit's
   compiled program (a rerun whose windows move where the first run's did not compiles
   nothing new). Baker et al. (2019, Sect. 3.2) show that the
   control-variate noise grows with ‖θ − θ̂‖², so a centre at the posterior mean, rather than
   at a mode far from the bulk, minimises the noise over the posterior;
4. where the window's draws are too few for a dense covariance, its correlations come from
   the potential's Hessian at θ̂_{w+1} and its scales from the draws
   (:func:`~numpyro_subsample.sgmcmc.pilot_moments.hessian_whitened`; one more data pass
   where the centre did not move and no Hessian is known there).

The next window starts each chain where the last one stopped. Where the last window of the
schedule still moved the centre by more than :data:`SETTLED_SHIFT` of the proxy's sds, the
pilot adds windows of its length, one at a time, until one moves it less (at most
:data:`EXTRA_WINDOWS`). The adapted proxy then replaces
the fitted one for everything: the sampling chains start at its draws, its centre and
covariance set the estimator and the whitening, and the noise is measured at its draws for the
step size (:func:`~numpyro_subsample.sgmcmc.noise_refine.measured_preprocessed`). Cost: one
or two data passes per window that changes the proxy, plus the pilot's subsamples, which
:func:`pilot_schedule` bounds.

The start needs no positive-definite Hessian: where the Laplace fit fails, the pilot starts
from :func:`safe_start` (the potential's feasible start with a unit covariance in unconstrained
space) and the diagonal adaptation finds the scales.
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
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.proxies.base import Proxy, ProxyFitWarning
from numpyro_subsample.proxies.checks import newton_point
from numpyro_subsample.proxies.laplace import LaplaceFitError
from numpyro_subsample.sgmcmc.adaptation import adaptive_step_size
from numpyro_subsample.sgmcmc.centring import other_family_group_sites
from numpyro_subsample.sgmcmc.dynamics import Dynamics
from numpyro_subsample.sgmcmc.pilot_chains import (
    BLOCK,
    PilotSettings,
    ProxyAdaptationWarning,
    pilot_keys,
    run_window,
    warn_all_failed,
)
from numpyro_subsample.sgmcmc.pilot_moments import (
    hessian_whitened,
    window_changes,
    window_moments,
)
from numpyro_subsample.sgmcmc.pilot_structured import structured_pilot_proxy

__all__ = [
    "DEFAULT_WINDOWS",
    "EXTRA_WINDOWS",
    "SETTLED_SHIFT",
    "MAX_PILOT_PASSES",
    "MAX_START_DECREMENT",
    "PILOT_CHAINS",
    "ProxyAdaptationWarning",
    "adapt_proxy",
    "pilot_schedule",
    "proxy_at",
    "safe_start",
    "pilot_proxy",
    "start_proxy",
]

#: Steps of the pilot windows, of growing length as Stan's slow adaptation windows. The pilot
#: stops after the second window if neither that window nor the one before it moved the
#: proxy (:func:`~numpyro_subsample.sgmcmc.pilot_moments.window_moments`).
DEFAULT_WINDOWS = (100, 150, 250, 500)
#: Windows of the last scheduled length that the pilot adds, one at a time, while its last
#: window differed from its proxy by more than the Monte Carlo error
#: (:func:`~numpyro_subsample.sgmcmc.pilot_moments.window_changes`, the test of a trusted
#: start) and moved its centre by more than :data:`SETTLED_SHIFT` of the proxy's sds: a
#: pilot still drifting that far has not found the posterior.
EXTRA_WINDOWS = 4
#: The largest shift of the centre (in the proxy's sds, worst coordinate) of a window that
#: ends the pilot's schedule. Shifts of about one sd are common in the centred form of a
#: hierarchical model, whose pilot chains reach a few effective draws per window; a drift of
#: several sds per window is not (3-5 on a collapsed variational start).
SETTLED_SHIFT = 2.0
#: Pilot chains run side by side (vectorized).
PILOT_CHAINS = 4
#: At most this many data passes are spent on the pilot's subsamples (the windows shrink
#: in proportion when N/n is small; never below :data:`MIN_WINDOW` steps each). With at
#: most two full-data passes per window (recentring and Hessian), the dense proxy's warm-up
#: then costs at most 7 + 2 · 4 = 15 passes where neither floor binds: N ≥
#: :data:`MIN_PILOT_ROWS` / 7 (about 2.9 · 10^5 rows) and N ≥ 4 · :data:`MIN_WINDOW` ·
#: :data:`PILOT_CHAINS` · n / 7 (115 n). The structured proxy's windows add their Lanczos
#: passes (:mod:`~numpyro_subsample.sgmcmc.pilot_structured`).
MAX_PILOT_PASSES = 7.0
#: The shortest window.
MIN_WINDOW = 50
#: Below this many datum evaluations (rows) in all, the pilot keeps its full windows: on small
#: data sets a data pass costs less than the pilot's fixed overheads.
MIN_PILOT_ROWS = 2_000_000
#: Pilot draws of the last window at which the whitened curvature is measured.
CURVATURE_POINTS = 16
#: A Laplace fit that stopped with a Newton decrement above this many proxy sds (the distance
#: to the mode of its local quadratic) is not a start: Adam ran into a funnel's neck, where
#: the quadratic is poor and Newton's line search finds no way out, and pilot chains started
#: there adapt the proxy to the neck. The pilot starts from the variational fit instead.
MAX_START_DECREMENT = 1.0


class PilotWindow(NamedTuple):
    """What one window measured: its ``steps``, the draws' mean minus the centre (``shift``,
    in the previous proxy's sds, largest coordinate), the largest log ratio of the draws' sd to
    the previous proxy sd (``log_sd_change``), the chains that failed, and whether the centre
    ``moved`` and the covariance was ``rescaled``
    (:func:`~numpyro_subsample.sgmcmc.pilot_moments.window_moments`)."""

    steps: int
    shift: float
    log_sd_change: float
    failed_chains: int
    moved: bool
    rescaled: bool


def pilot_schedule(num_data: int, subsample_size: int,
                   windows: tuple[int, ...] = DEFAULT_WINDOWS,
                   num_chains: int = PILOT_CHAINS) -> tuple[int, ...]:
    """The windows' lengths: ``windows`` scaled down so that the pilot's subsamples cost at most
    :data:`MAX_PILOT_PASSES` data passes or :data:`MIN_PILOT_ROWS` datum evaluations, whichever
    is more: each window rounded down to whole blocks of steps and at least :data:`MIN_WINDOW`
    steps, the longest shortened where windows raised to that minimum exceed the budget."""
    rows = sum(windows) * num_chains * subsample_size
    allowed = max(MAX_PILOT_PASSES * num_data, MIN_PILOT_ROWS)
    scale = min(1.0, allowed / rows) if rows > 0 else 1.0
    lengths = [max(MIN_WINDOW, BLOCK * int(w * scale // BLOCK)) for w in windows]
    budget = allowed / max(1, num_chains * subsample_size)  # steps
    while sum(lengths) > budget and max(lengths) - BLOCK >= MIN_WINDOW:
        longest = int(np.argmax(lengths))  # windows raised to MIN_WINDOW: shorten the longest
        lengths[longest] -= BLOCK
    return tuple(lengths)


def proxy_at(potential: Potential, data: ModelData, centre: np.ndarray, cov: np.ndarray, *,
             chunk_size: int, kind: str, passes: float, seconds: float, info: dict) -> Proxy:
    """The Gaussian proxy N(``centre``, ``cov``) with the control variates' Σ_i ∇f_i at its
    centre and no per-datum table, in the potential's dtype, from one data pass by the Laplace
    fit's compiled program (:func:`~numpyro_subsample.proxies.checks.newton_point`), which also
    gives ∇²f there: ``info`` with ``"hessian"`` added.

    Raises
    ------
    ValueError
        The potential or its gradient is not finite at ``centre``.
    """
    dtype = potential.init_theta.dtype
    cov = np.asarray(cov, np.float64)
    theta = device_array(np.asarray(centre, dtype))
    cov = device_array((0.5 * (cov + cov.T)).astype(dtype))
    expansion = newton_point(potential, theta, data, chunk_size)
    sum_grads = expansion.grad - expansion.prior_grad
    if not (np.isfinite(float(expansion.value))
            and np.all(np.isfinite(np.asarray(sum_grads)))):
        raise ValueError("The potential is not finite at the adapted proxy's centre.")
    return Proxy(centre=theta, cov=cov, scale_tril=jnp.linalg.cholesky(cov), datum_grads=None,
                 sum_grads=sum_grads, num_data_passes=float(passes) + 1.0,
                 seconds=float(seconds), kind=kind,
                 info={**info, "hessian": np.asarray(expansion.hessian, np.float64)})


def safe_start(potential: Potential, data: ModelData, *, chunk_size: int,
               reason: str) -> Proxy:
    """The pilot's start where no Gaussian fit is usable: the potential's feasible start
    (prior mean plus jitter, :attr:`~numpyro_subsample.core.potential.Potential.init_theta`)
    with the unit covariance of the unconstrained space; ``reason`` goes to ``info``."""
    d = potential.dim
    return proxy_at(potential, data, np.asarray(potential.init_theta), np.eye(d),
                    chunk_size=chunk_size, kind="start", passes=0.0, seconds=0.0,
                    info={"reason": reason})


def start_proxy(fit: Callable[[str], Proxy], spec: str, potential: Potential,
                data: ModelData, *, chunk_size: int) -> Proxy:
    """The pilot's first proxy: ``fit(spec)`` (the kernel's proxy fit), its warnings kept in
    ``info["warnings"]`` instead of raised (the adapted proxy replaces it). Where the Laplace
    fit has no positive definite Hessian (:class:`~numpyro_subsample.proxies.laplace.
    LaplaceFitError`: the degenerate joint mode of a centred hierarchical model, a saddle) or
    whose fit stopped more than :data:`MAX_START_DECREMENT` proxy sds from its quadratic's mode,
    the start is ``fit("variational")`` (not with a local site integrated out of the terms);
    where that fails too, the unconverged Laplace fit, else :func:`safe_start`.

    A model with group effects of another family than the Normal
    (:func:`~numpyro_subsample.sgmcmc.centring.other_family_group_sites`: Beta rates, Gamma
    frailties, Dirichlet simplexes around a latent mean) starts from the variational fit, and
    from the Laplace fit only where that fails: the joint mode of such a hierarchy lies towards
    complete pooling, where the group effects' density grows as their spread shrinks, and
    partial centring, which removes that for Normal effects, cannot see them. On categorical
    rows of 50 groups with Dirichlet(α m) simplexes the Laplace fit converged at log α = 5.65,
    17 posterior sds above the posterior's 2.96, and pilot chains started there did not leave
    it in their windows."""
    tried, unconverged = [], None
    fallback = spec == "laplace" and not potential.integrated
    order = [spec, "variational"] if fallback else [spec]
    if fallback and other_family_group_sites(potential, data):
        order = ["variational", spec]
    for kind in order:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ProxyFitWarning)
            try:
                proxy = fit(kind)
            except (LaplaceFitError, np.linalg.LinAlgError) as err:
                tried.append(f"{kind}: {err}")
                continue
        for w in caught:
            if not issubclass(w.category, ProxyFitWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        found = [str(w.message) for w in caught if issubclass(w.category, ProxyFitWarning)]
        info = dict(proxy.info or {})
        info["warnings"] = found
        info["fallback_from"] = list(tried)
        proxy = proxy._replace(info=info)
        decrement = float(info.get("newton_decrement") or 0.0)
        if (fallback and kind == "laplace" and info.get("converged") is False
                and decrement > MAX_START_DECREMENT):
            tried.append(f"laplace: stopped {decrement:.3g} proxy sds from its quadratic's "
                         "mode")
            unconverged = proxy
            continue
        if unconverged is not None:  # the Laplace fit's passes were spent too
            proxy = proxy._replace(num_data_passes=proxy.num_data_passes
                                   + unconverged.num_data_passes)
        return proxy
    if unconverged is not None:
        return unconverged
    return safe_start(potential, data, chunk_size=chunk_size, reason="; ".join(tried))


def _trusted(start: Proxy) -> bool:
    """Whether the pilot may keep ``start`` where a window agrees with it: a fit that does
    not report a failure to converge (a guide given with its parameters reports nothing),
    raised no warning and was not a fallback."""
    info = start.info or {}
    return (start.kind in ("laplace", "variational") and bool(info.get("converged", True))
            and not info.get("warnings") and not info.get("fallback_from"))


def _window_record(proxy: Proxy, length: int, mean_w: np.ndarray, cov_w: np.ndarray,
                   failed: np.ndarray, moved: bool, rescaled: bool) -> PilotWindow:
    """The :class:`PilotWindow` of a window's moments in the proxy's whitened coordinates."""
    L = np.asarray(proxy.scale_tril, np.float64)
    old_sd = np.sqrt(np.diag(np.asarray(proxy.cov, np.float64)))
    return PilotWindow(
        steps=int(length), shift=float(np.max(np.abs(L @ mean_w) / old_sd)),
        log_sd_change=float(np.max(np.abs(np.log(np.sqrt(np.diag(L @ cov_w @ L.T))
                                                  / old_sd)))),
        failed_chains=int(failed.sum()), moved=moved, rescaled=rescaled,
    )


def _next_proxy(pilot: PilotSettings, proxy: Proxy, centre: np.ndarray, cov: np.ndarray,
                window_draws: np.ndarray, *, moved: bool, passes: float, elapsed: float):
    """The proxy after a window that moved or rescaled it: recentred (one data pass for the
    new control variates) or rescaled, then Hessian-whitened where the draws are too few for
    a dense covariance (:func:`~numpyro_subsample.sgmcmc.pilot_moments.hessian_whitened`).
    Returns the proxy and the passes so far."""
    dtype = proxy.centre.dtype
    if moved:
        proxy = proxy_at(pilot.potential, pilot.data, centre, cov, chunk_size=pilot.chunk_size,
                         kind="adapted", passes=passes, seconds=elapsed, info={})
        passes = proxy.num_data_passes
    else:
        chol = np.linalg.cholesky(0.5 * (cov + cov.T))
        proxy = proxy._replace(cov=device_array(cov.astype(dtype)),
                               scale_tril=device_array(chol.astype(dtype)), kind="adapted")
    proxy, spent = hessian_whitened(proxy, pilot.potential, pilot.data, window_draws,
                                    chunk_size=pilot.chunk_size)
    return proxy, passes + spent


def adapt_proxy(
    start: Proxy,
    potential: Potential,
    data: ModelData,
    rng_key: jax.Array,
    *,
    dynamics: Dynamics,
    rule: Callable[[float, float], float],
    windows: tuple[int, ...],
    num_chains: int = PILOT_CHAINS,
    chunk_size: int,
    replace: bool = True,
    extra_windows: int = EXTRA_WINDOWS,
) -> Proxy:
    """The proxy adapted from ``start`` by pilot chains in ``windows`` (module docstring).

    Parameters
    ----------
    start
        The first proxy (Laplace, variational or :func:`safe_start`); its draws start the
        pilot chains.
    dynamics
        The kernel's (uncorrected) dynamics.
    rule
        The kernel's step-size rule ``rule(noise, curvature)`` for the adapted diagonal scale
        (:func:`~numpyro_subsample.sgmcmc.adaptation.adaptive_step_size`).
    windows
        Steps per window (:func:`pilot_schedule`).
    extra_windows
        At most this many windows of ``windows[-1]`` steps follow, one at a time, while the
        last window moved the centre by more than :data:`SETTLED_SHIFT` proxy sds and its
        draws differ from the proxy by more than their Monte Carlo error (tested as for a
        trusted start, whatever the start).

    Returns
    -------
    Proxy
        ``kind="adapted"``; ``info`` holds the start's kind and info, the windows
        (:class:`PilotWindow`) and the pilot's data passes. If every pilot chain fails, the
        start is returned with a :class:`ProxyAdaptationWarning`.
    """
    t0 = time.perf_counter()
    n = int(potential.plate.subsample_size)
    pilot = PilotSettings(potential=potential, data=data, dynamics=dynamics,
                   step_size=adaptive_step_size(rule), num_warmup=max(windows),
                   num_chains=num_chains, chunk_size=chunk_size, replace=replace)
    proxy = start
    passes = float(start.num_data_passes)
    record: list[PilotWindow] = []
    keys = pilot_keys(rng_key, len(windows) + 1 + extra_windows, num_chains)
    theta_start = None
    schedule = list(windows)
    for k, length in enumerate(schedule):
        states, ws, failed, est_passes = run_window(pilot, proxy, length, keys[k], theta_start)
        passes += est_passes + float(length) * num_chains * n / potential.num_data
        if failed.all():
            warn_all_failed(num_chains, k + 1, "proxy", proxy.kind, stacklevel=4)
            return start if k == 0 else proxy
        mean_w, cov_w, moved, rescaled = window_moments(ws, _trusted(start))
        L = np.asarray(proxy.scale_tril, np.float64)
        window_draws = np.asarray(proxy.centre, np.float64) + ws @ L.T  # (steps, chains, d)
        thin = ws[:: max(1, ws.shape[0] // CURVATURE_POINTS)].reshape(-1, ws.shape[-1])
        last_draws = np.asarray(proxy.centre, np.float64) + thin[:CURVATURE_POINTS] @ L.T
        centre = np.asarray(proxy.centre, np.float64) + (L @ mean_w if moved else 0.0)
        cov = L @ cov_w @ L.T if rescaled else np.asarray(proxy.cov, np.float64)
        record.append(_window_record(proxy, length, mean_w, cov_w, failed, moved, rescaled))
        theta_last = np.asarray(proxy.centre)[None] + np.einsum(
            "ij,cj->ci", L, np.asarray(states.w, np.float64))
        theta_start = np.concatenate([theta_last[~failed],
                                      np.repeat(centre[None], failed.sum(), 0)])
        if not (moved or rescaled):
            if k >= 1:  # two windows agree with the proxy within their Monte Carlo error
                break
            continue
        if (k + 1 == len(schedule) < len(windows) + extra_windows
                and record[-1].shift > SETTLED_SHIFT
                and any(window_changes(ws, True))):  # still drifting: one more window
            schedule.append(schedule[-1])
        proxy, passes = _next_proxy(
            pilot, proxy, centre, cov, window_draws, moved=moved, passes=passes,
            elapsed=time.perf_counter() - t0 + start.seconds)
    adaptation = {"windows": record, "pilot_chains": num_chains, "step_size": pilot.step_size,
                  "draws": last_draws,
                  "start_passes": float(start.num_data_passes)}
    if proxy is start:  # no window disagreed with it
        return start._replace(info={**(start.info or {}), **adaptation},
                              num_data_passes=passes)
    info = {"start": start.kind, "start_info": start.info, **adaptation}
    if "hessian" in (proxy.info or {}):  # ∇²f at its centre (for measured_curvature)
        info["hessian"] = proxy.info["hessian"]
    return proxy._replace(info=info, num_data_passes=passes,
                          seconds=time.perf_counter() - t0 + start.seconds)


def pilot_proxy(fit: Callable[[str], Proxy], spec: str, potential: Potential, data: ModelData,
                rng_key: jax.Array, *, dynamics: Dynamics, rule: Callable[[float, float], float],
                chunk_size: int, replace: bool = True, structured: bool = False,
                alternative: bool = True) -> Proxy:
    """The kernel's adapted proxy: :func:`start_proxy` of ``fit`` and ``spec``, then
    :func:`adapt_proxy` over :func:`pilot_schedule`'s windows; for a ``structured`` fit,
    :func:`~numpyro_subsample.sgmcmc.pilot_structured.structured_pilot_proxy` (with its
    ``alternative``)."""
    windows = pilot_schedule(potential.num_data, potential.plate.subsample_size)
    if structured:
        return structured_pilot_proxy(fit, spec, potential, data, rng_key, dynamics=dynamics,
                                      rule=rule, windows=windows, num_chains=PILOT_CHAINS,
                                      chunk_size=chunk_size, replace=replace,
                                      alternative=alternative)
    start = start_proxy(fit, spec, potential, data, chunk_size=chunk_size)
    return adapt_proxy(start, potential, data, rng_key, dynamics=dynamics, rule=rule,
                       windows=windows, chunk_size=chunk_size, replace=replace)
