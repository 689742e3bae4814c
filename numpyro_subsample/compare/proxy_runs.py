"""The proxies as samplers: independent draws from N(θ̂, Σ̂), no MCMC.

The rows "Laplace proxy (no MCMC)" and "variational proxy (no MCMC)" of the comparison answer
whether a method needs MCMC at all: as many independent draws as a stochastic-gradient chain
has, from the Gaussian proxy in the potential's flat unconstrained space, mapped to the
constrained sites by the potential (:attr:`~numpyro_subsample.core.potential.Potential.constrain`),
and scored like every other run. The Laplace proxy is the shared one
(:func:`~numpyro_subsample.compare.runners.fit_shared_proxy`, fitted as the kernels fit it),
to which its row adds the chain check that a fit on its own runs
(:mod:`~numpyro_subsample.proxies.chain_check`); the variational one is fitted here by
:func:`~numpyro_subsample.proxies.variational.fit_variational` with its defaults. Each row is
charged its fit's seconds, compile seconds and data passes, the checks' included.
"""

from __future__ import annotations

import time
from functools import partial

import jax
import numpy as np

from numpyro_subsample.compare.checks import DrawsRun, record_warnings, run_checks
from numpyro_subsample.compare.problems import Problem
from numpyro_subsample.compare.runners import (
    RunOutput,
    Settings,
    SharedProxy,
    merge_warnings,
)
from numpyro_subsample.compare.timing import CompileTimer
from numpyro_subsample.core.datapass import DEFAULT_CHUNK
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.chain_check import (
    CHAIN_PASSES,
    chain_check,
    runs_chain_check,
)
from numpyro_subsample.proxies.checks import coordinate_labels, warn_proxy
from numpyro_subsample.proxies.variational import fit_variational

__all__ = ["PROXY_KINDS", "proxy_draws", "run_proxy"]

PROXY_KINDS = ("laplace", "variational")


@partial(jax.jit, static_argnames=("potential", "num"))
def _draws(potential: Potential, centre: jax.Array, scale_tril: jax.Array, key: jax.Array,
           num: int, data: ModelData) -> dict:
    eps = jax.random.normal(key, (num, centre.shape[0]), centre.dtype)
    thetas = centre + eps @ scale_tril.T
    return jax.vmap(lambda t: potential.constrain(potential.unravel(t), data))(thetas)


def proxy_draws(potential: Potential, data: ModelData, centre: jax.Array,
                scale_tril: jax.Array, key: jax.Array, num: int) -> dict:
    """``num`` independent draws θ = θ̂ + L ε, ε ~ N(0, I), as constrained sites
    ``{site: (num, ...)}`` (one compiled program; the data are its argument)."""
    out = _draws(potential, centre, scale_tril, key, int(num), data)
    return {k: np.asarray(v) for k, v in out.items()}


def run_proxy(kind: str, problem: Problem, settings: Settings, shared: SharedProxy, *,
              seed: int = 0, progress: bool = False) -> RunOutput:
    """Independent draws from the ``kind`` (``"laplace"``, ``"variational"``) proxy.

    ``settings.sg_samples`` draws. The Laplace proxy is ``shared.proxy``; the variational one
    is fitted on ``shared.potential`` with the shared fit's key. Preprocessing = the fit
    (seconds without compilation; its compile seconds are in ``compile_s``), sampling = the
    draws; the data passes are the fit's.
    """
    if kind not in PROXY_KINDS:
        raise ValueError(f"proxy kind must be one of {PROXY_KINDS}, got {kind!r}.")
    S = settings.sg_samples
    _, k_proxy, k_draws = jax.random.split(jax.random.PRNGKey(seed), 3)
    note = f"{S} independent draws from the {kind} proxy N(θ̂, Σ̂), no MCMC"
    if kind == "laplace":
        proxy = shared.proxy
        check = runs_chain_check(None, shared.potential.num_data)  # as fit_laplace's default
        with record_warnings() as caught, CompileTimer() as ct:
            t0 = time.perf_counter()
            if check:
                message, _ = chain_check(shared.potential, shared.data, proxy.centre,
                                         proxy.scale_tril, proxy.cov,
                                         coordinate_labels(shared.potential), DEFAULT_CHUNK,
                                         "Laplace")
                if message:
                    warn_proxy(message)
            fit_s = shared.seconds + time.perf_counter() - t0 - ct.seconds
        proxy = proxy._replace(
            num_data_passes=proxy.num_data_passes + (CHAIN_PASSES if check else 0))
        fit_compile_s = shared.compile_s + ct.seconds
        fit_warnings = merge_warnings(shared.warnings, tuple(caught))
    else:
        with record_warnings() as caught, CompileTimer() as ct:
            t0 = time.perf_counter()
            proxy = fit_variational(shared.potential, shared.data, k_proxy, progress=progress)
            jax.block_until_ready(proxy.scale_tril)
            fit_s = time.perf_counter() - t0 - ct.seconds
        fit_compile_s, fit_warnings = ct.seconds, tuple(caught)
        if proxy.info.get("converged") is False:
            note += f"; SVI stopped at max_steps ({proxy.info.get('svi_steps')} steps)"
    with record_warnings() as caught, CompileTimer() as ct:
        t0 = time.perf_counter()
        samples = proxy_draws(shared.potential, shared.data, proxy.centre, proxy.scale_tril,
                              k_draws, S)
        sampling_s = time.perf_counter() - t0 - ct.seconds
    passes = np.full(S, float(proxy.num_data_passes))
    seconds = fit_s + sampling_s * np.arange(1, S + 1) / S
    return RunOutput(samples=samples, passes=passes, seconds=seconds, sampling_s=sampling_s,
                     preprocessing_s=fit_s, compile_s=fit_compile_s + ct.seconds, iterations=S,
                     note=note, warnings=merge_warnings(fit_warnings, tuple(caught)),
                     checks=run_checks(DrawsRun(samples)))
