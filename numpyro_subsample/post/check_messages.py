"""The lines of a run check's warning: stopped chains and frozen coordinates, an ESS too
small (with the remedy for the kernel at hand) and a bias the kernel's probe found; for
:func:`~numpyro_subsample.post.checks.check_run`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from numpyro_subsample.core.sites import coordinate_names
from numpyro_subsample.sgmcmc.centring import (
    hand_noncentred_remedy,
    other_family_group_sites,
    rewritable_sites,
)

__all__ = ["chain_failures", "ess_message", "kernel_probe", "probe_message",
           "structural_constants"]

_SMALLER_STEP = (
    "pass a smaller step_size (e.g. half), or let the kernel choose a smaller one (a smaller "
    "max_variance_inflation for SG kernels, a larger target_accept_prob for adapted HMC steps)"
)


def _failures(mcmc) -> list[str]:
    """One line per chain that a package kernel stopped (``fail_step`` ≥ 0)."""
    state = mcmc.last_state
    if not hasattr(state, "fail_step"):
        return []
    steps = np.atleast_1d(np.asarray(state.fail_step))
    coords = np.atleast_1d(np.asarray(state.fail_coord))
    try:
        names = coordinate_names(mcmc.sampler.potential)
    except Exception:  # noqa: BLE001  (labels are a courtesy; the figures stand without them)
        names = None
    lines = []
    for c, (s, k) in enumerate(zip(steps, coords, strict=True)):
        site = names[k] if names is not None and 0 <= k < len(names) else f"θ[{k}]"
        if s == 1:  # step 1 evaluates the first gradient estimate, at the chain's start
            lines.append(f"chain {c} stopped at its start: the gradient estimate along {site} "
                         "is not finite at the initial position; every draw repeats it")
        elif s >= 0:
            lines.append(f"chain {c} stopped at step {int(s)}: {site} became non-finite or "
                         "exploded; its later draws repeat the last valid state")
    if lines:
        lines.append(_SMALLER_STEP)
    return lines


def _noise_limited_step(kernel) -> str:
    """A tip where the kernel's own step is well under its rule's noise-free step (the
    subsample's gradient noise limits it; not a step the bias probe cut), else ""."""
    pre = getattr(kernel, "_pre", None)
    free, h = getattr(pre, "noise_free_step", math.nan), getattr(pre, "step_size", math.nan)
    probe = getattr(pre, "step_bias", None)
    if not (h < 0.5 * free) or getattr(probe, "chosen_step", None) is not None:
        return ""
    return (f"use a larger subsample_size (the subsample's gradient noise limits the step to "
            f"{h:.3g}, against {free:.3g} without it)")


def _partially_centred(kernel) -> bool:
    try:
        return any(s.endswith("_partially_centred") for s in kernel.potential.latent_sites)
    except Exception:  # noqa: BLE001  (kernels without a potential yet)
        return False


def _hand_noncentred(kernel) -> tuple[str, ...]:
    """:func:`~numpyro_subsample.sgmcmc.centring.rewritable_sites` of the kernel's model
    and data, () for kernels without them."""
    potential, data = getattr(kernel, "_pre", None), getattr(kernel, "_pre_data", None)
    potential = getattr(potential, "potential", None)
    if potential is None or data is None:
        return ()
    return rewritable_sites(potential, data)


def _other_family_groups(kernel) -> tuple[str, ...]:
    """:func:`~numpyro_subsample.sgmcmc.centring.other_family_group_sites` of the kernel's
    model and data, () for kernels without them."""
    potential, data = getattr(kernel, "_pre", None), getattr(kernel, "_pre_data", None)
    potential = getattr(potential, "potential", None)
    if potential is None or data is None:
        return ()
    return other_family_group_sites(potential, data)


def _mixing_remedy(mcmc, factor: float = float("nan")) -> str:
    """What to try when a run has not mixed, for the kernel at hand; ``factor``: the ratio of
    the ESS needed to the ESS reached (the ESS grows about linearly with the steps)."""
    kernel = mcmc.sampler
    tips = [f"run about {math.ceil(factor)}× more steps" if 1 < factor < 1e3
            else "run more steps"]
    noise_limited = _noise_limited_step(kernel)
    if noise_limited:
        tips.append(noise_limited)
    if type(kernel).__name__ == "SGLD":
        tips.append("use SGHMC")
    try:
        kind = getattr(kernel.proxy, "kind", None)
    except Exception:  # noqa: BLE001  (kernels without a fitted proxy)
        kind = None
    if kind != "structured" and _partially_centred(kernel):
        kind = "centred"  # its group effects are sampled partially centred already
    if kind in ("laplace", "variational") and getattr(kernel, "adapt_proxy", None) is False:
        tips.append("leave AdaptationOptions.proxy at its default (pilot chains re-estimate "
                    "the proxy, which a joint mode or a first SVI fit places poorly in "
                    "hierarchical models)")
    hand = _hand_noncentred(kernel) if kind not in ("centred", "structured") else ()
    if hand:  # the remedy that changes most: first
        tips.insert(0, hand_noncentred_remedy(hand))
    elif kind == "adapted":
        others = _other_family_groups(kernel)
        if others:  # Normal group effects are sampled partially centred already
            tips.append(
                f"write the group effects {', '.join(others)}, whose prior is not a univariate "
                "Normal, as a Normal on an unconstrained scale (e.g. log w ~ Normal(m, s) for a "
                "Gamma frailty w; m + L z with z ~ Normal(0, 1) for a multivariate Normal): the "
                "kernels sample Normal group effects with a latent scale partially centred per "
                "group (docs/adapted_proxy.md)")
    elif kind == "structured":
        tips.append("try proxy='low-rank' with a larger rank (proxy_kwargs={'rank': k}): a "
                    "structured proxy that misses correlated directions whitens them poorly")
    elif kind not in (None, "centred"):
        tips.append("check the proxy (kernel.proxy)")
    return ", or ".join(tips)


def kernel_probe(mcmc) -> tuple[Any, str]:
    """The kernel's default probe of its step's bias made in its preprocessing (package SG
    kernels), or None, and why it did not run there ("" where it did or the kernel has none;
    :func:`~numpyro_subsample.post.checks.probe_after_run` makes up for some reasons)."""
    pre = getattr(mcmc.sampler, "_pre", None)
    return getattr(pre, "step_bias", None), str(getattr(pre, "step_bias_skipped", "") or "")


def probe_message(mcmc, probe) -> str:
    try:
        site = (probe.labels[probe.worst] if probe.labels is not None else
                coordinate_names(mcmc.sampler.potential)[probe.worst] + " (unconstrained)")
    except Exception:  # noqa: BLE001  (labels are a courtesy)
        site = f"θ[{probe.worst}]"
    return (f"the kernel's probe found that {probe.message.format(site=site)}: pass "
            f"step_size={probe.step_size / 2:.3g} or smaller, or a smaller "
            "max_variance_inflation")


def _step_size(mcmc) -> float | None:
    try:
        return float(mcmc.sampler.step_size)
    except Exception:  # noqa: BLE001  (kernels without a scalar step size)
        return None


def structural_constants(x: np.ndarray) -> np.ndarray:
    """The coordinates of draws ``x`` (chains, draws, coordinates) that are constant by the
    site's construction, not by a stuck chain: one value in every draw of every chain (chains
    start apart, so stuck chains differ), or, with one chain, a constant 0 or 1 (the fixed
    entries of a Cholesky factor of a correlation matrix, ``dist.LKJCholesky``)."""
    flat = x.reshape(-1, x.shape[-1])
    constant = np.ptp(flat, axis=0) == 0
    if x.shape[0] >= 2:
        return constant
    return constant & np.isin(flat[0], (0.0, 1.0))


def chain_failures(mcmc, x: np.ndarray, names: list[str]) -> tuple[list[str], int, np.ndarray]:
    """``(messages, divergences, frozen)``: the stopped chains of a package kernel, else the
    divergent draws; and the coordinates that never moved in a chain ((chains, coordinates),
    each named in a message, at most 12 messages in all; :func:`structural_constants` left
    out)."""
    chains, draws, _ = x.shape
    messages = _failures(mcmc)
    extra = mcmc.get_extra_fields()
    divergences = int(np.sum(np.asarray(extra["diverging"]))) if "diverging" in extra else 0
    if divergences and not messages:
        messages.append(f"{divergences} of {chains * draws} draws diverged; {_SMALLER_STEP}")
    frozen = (np.ptp(x, axis=1) == 0) & ~structural_constants(x)  # (chains, coordinates)
    for c, k in zip(*np.nonzero(frozen), strict=True):
        if len(messages) < 12:
            messages.append(f"{names[k]} never moved in chain {c}")
    return messages, divergences, frozen


def ess_message(mcmc, worst: list[str], min_bulk: float, min_tail: float, threshold: float,
                 min_ess_per_chain: float, chains: int, draws: int, max_mcse: float) -> str:
    """The message of an ESS below ``threshold``, with the worst coordinates, the step size,
    the mean's Monte Carlo error and the remedy (:func:`_mixing_remedy`)."""
    h = _step_size(mcmc)
    step = "" if h is None else f" (step size {h:.3g})"
    per_chain = "" if chains == 1 else f" ({min_ess_per_chain:g} per chain × {chains})"
    mcse_note = "" if not np.isfinite(max_mcse) else (
        f", so a posterior mean may be off by {max_mcse:.2f} sd (Monte Carlo standard "
        "error)")
    return (
        f"min ESS {min_bulk:.0f} (bulk) / {min_tail:.0f} (tail) of {chains * draws} draws "
        f"< {threshold:g}{per_chain} at {', '.join(worst)}{step}"
        f"{mcse_note}: the chain has not mixed; "
        f"{_mixing_remedy(mcmc, threshold / max(min(min_bulk, min_tail), 1e-12))}"
    )
