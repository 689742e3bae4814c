"""The pilot chains of the adapted proxy (:mod:`~numpyro_subsample.sgmcmc.warmup`): P chains of
the kernel's pilot dynamics, vectorized, with the control-variate estimator at the current proxy,
run in blocks of one compiled program so that every window shares it."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import lru_cache, partial
from typing import NamedTuple

import jax
import numpy as np

from numpyro_subsample.core.compiling import fast_compile_jit
from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.core.rng import STEP_RNG, host_normals, raw_key
from numpyro_subsample.estimators.registry import configure_estimator
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.structured import StructuredProxy
from numpyro_subsample.proxies.whitening import is_structured, proxy_scale, whiten_matvec
from numpyro_subsample.sgmcmc.adaptation import adaptation_window
from numpyro_subsample.sgmcmc.chain import (
    SamplerParams,
    SGMCMCConfig,
    SGMCMCState,
    chain_programs,
)
from numpyro_subsample.sgmcmc.dynamics import Dynamics

__all__ = ["BLOCK", "PilotSettings", "ProxyAdaptationWarning", "pilot_keys", "run_window",
           "warn_all_failed"]

#: Steps of one compiled block; every window is a whole number of blocks, so that all windows
#: share one program.
BLOCK = 50


@partial(fast_compile_jit, static_argnums=(0, 1, 2))
def _window(step: Callable, num_steps: int, axes, states: SGMCMCState, data: ModelData):
    """``num_steps`` vectorized steps; returns the final states and the draws of w."""
    vstep = jax.vmap(step, in_axes=(axes, None), out_axes=axes)

    def body(s, _):
        s = vstep(s, data)
        return s, s.w

    return jax.lax.scan(body, states, None, length=num_steps)


def _state_axes() -> SGMCMCState:
    return SGMCMCState(**dict.fromkeys(SGMCMCState._fields, 0))._replace(params=None)


@lru_cache(maxsize=32)
def _vinit(init_one: Callable, potential: Potential) -> Callable:
    """The vectorized chain init at flat positions (P, d)."""
    def at(key, theta, data, params, draws):
        return init_one(key, potential.unravel(theta), data, params, draws)
    return fast_compile_jit(jax.vmap(at, in_axes=(0, 0, None, None, 0), out_axes=_state_axes()))


class ProxyAdaptationWarning(UserWarning):
    """Every pilot chain failed in a window, so the proxy was not adapted: the message names
    the window and a remedy."""


def pilot_keys(rng_key: jax.Array, rows: int, num_chains: int) -> np.ndarray:
    """``rows`` × ``num_chains`` raw keys (uint32 pairs) for the pilot's windows, from
    ``rng_key`` by NumPy's SeedSequence: shape (rows, num_chains, 2)."""
    bits = np.asarray(raw_key(rng_key), np.uint32)
    return np.random.SeedSequence([int(b) for b in bits]).generate_state(
        2 * num_chains * rows, np.uint32).reshape(rows, num_chains, 2)


def warn_all_failed(num_chains: int, window: int, what: str, kind: str,
                    stacklevel: int) -> None:
    """The :class:`ProxyAdaptationWarning` of a window (1-based) in which every pilot chain
    failed; ``what`` names the proxy ("proxy", "structured proxy"), ``kind`` the one kept."""
    warnings.warn(
        f"All {num_chains} pilot chains failed in window {window} of the {what}'s "
        f"adaptation (a step was non-finite or exploded); the proxy stays {kind!r}. Pass a "
        f"step_size, proxy_kwargs, or adaptation=AdaptationOptions(proxy=False).",
        ProxyAdaptationWarning, stacklevel=stacklevel + 1,
    )


class PilotSettings(NamedTuple):
    """What stays fixed over the pilot's windows."""

    potential: Potential
    data: ModelData
    dynamics: Dynamics
    step_size: float
    num_warmup: int
    num_chains: int
    chunk_size: int
    replace: bool


def run_window(pilot: PilotSettings, proxy: Proxy | StructuredProxy, length: int,
               keys: np.ndarray,
                theta_start: np.ndarray | None):
    """One window of ``length`` vectorized steps of the pilot's dynamics with the
    control-variate estimator at ``proxy``, from ``theta_start`` (draws of the proxy where
    None). Returns the final states, the second half of the draws of w (steps, P, d), which
    chains failed, and the estimator's data passes."""
    potential, data = pilot.potential, pilot.data
    dtype = proxy.centre.dtype
    est = configure_estimator("cv", potential, data, proxy, replace=pilot.replace,
                              chunk_size=pilot.chunk_size)
    cfg = SGMCMCConfig(
        potential=potential, estimate=est.estimate, dynamics=pilot.dynamics,
        rng_impl=STEP_RNG, init_strategy="proxy", precondition_draw=True, zv_degree=0,
        zv_fn=None, num_warmup=pilot.num_warmup,
        adapt_window=adaptation_window(pilot.num_warmup),
    )
    init_one, step = chain_programs(cfg)
    scale = proxy_scale(proxy)  # dense L, or a structured operator
    params = SamplerParams(
        centre=proxy.centre, scale_tril=scale,
        step_size=device_array(pilot.step_size, dtype), estimator=est.params,
        init_tril=scale, data_passes=device_array(0.0, dtype),
    )
    chain_keys = device_array(keys)
    draws = host_normals(chain_keys, (2, potential.dim), dtype)
    if theta_start is None:  # draws of the start proxy (on the host for a dense factor)
        if is_structured(scale):
            theta_start = np.asarray(proxy.centre + whiten_matvec(scale, draws[:, 0]))
        else:
            theta_start = (np.asarray(proxy.centre, np.float64)
                           + draws[:, 0].astype(np.float64) @ np.asarray(scale, np.float64).T)
        theta_start = np.asarray(theta_start, np.float64)
    states = _vinit(init_one, potential)(chain_keys, device_array(theta_start.astype(dtype)),
                                         data, params, device_array(draws))
    blocks, axes = [], _state_axes()
    for _ in range(int(length) // BLOCK):
        states, w_block = _window(step, BLOCK, axes, states, data)
        blocks.append(np.asarray(w_block))
    failed = np.asarray(states.fail_step) >= 0
    ws = np.concatenate(blocks).astype(np.float64)[int(length) // 2:, ~failed]
    return states, ws, failed, est.data_passes
