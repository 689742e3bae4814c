"""One run of each kind of method: NumPyro's NUTS and HMCECS, the package's kernels.

Every runner returns a :class:`RunOutput`: the draws, the cumulative data passes and seconds
at each draw, and the preprocessing, sampling and compilation seconds measured apart
(:class:`~numpyro_subsample.compare.timing.CompileTimer`). The Laplace proxy is fitted once
per problem (:func:`fit_shared_proxy`) and given to every method that uses one, each of them
being charged its seconds and data passes. Each run records the warnings it raised and its run
checks (:mod:`~numpyro_subsample.compare.checks`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import numpy as np
from numpyro.infer import HMCECS, MCMC, NUTS
from numpyro.util import fori_collect

from numpyro_subsample.compare.checks import DrawsRun, record_warnings, run_checks
from numpyro_subsample.compare.problems import Method, Problem
from numpyro_subsample.compare.timing import CompileTimer
from numpyro_subsample.core.adapter import constrained
from numpyro_subsample.core.potential import ModelData, Potential, build_potential
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.laplace import fit_laplace

__all__ = [
    "RunOutput",
    "Settings",
    "SharedProxy",
    "fit_shared_proxy",
    "merge_warnings",
    "run_hmcecs",
    "run_kernel",
    "run_nuts",
    "settings_for",
]


@dataclass
class Settings:
    """Chain lengths (warm-up, draws) and the KSD's thinning of one comparison.

    ``nuts_warmup``/``nuts_samples``: the NUTS-length chains (HMCECS, EnergyConservingHMC);
    ``ref_samples``: the NUTS reference's draws after ``nuts_warmup`` (``None``: as many as
    ``nuts_samples``); ``ksd_draws``: at most this many thinned draws per row enter the KSD.
    """

    sg_warmup: int
    sg_samples: int
    nuts_warmup: int
    nuts_samples: int
    ksd_draws: int
    checkpoints: int = 12
    ref_samples: int | None = None

    @property
    def reference_samples(self) -> int:
        """The NUTS reference's number of draws."""
        return int(self.ref_samples or self.nuts_samples)


def settings_for(quick: bool = False, *, num_samples: int | None = None,
                 nuts_samples: int | None = None, ref_samples: int | None = None,
                 ksd: bool = True) -> Settings:
    """Defaults: 1000 + 20,000 stochastic-gradient steps, 500 + 1000 HMCECS/ECS steps, a NUTS
    reference of 500 + 10^4 steps (enough to resolve errors of about 0.05 sd) and 500 KSD
    draws; ``quick``: 300 + 3000, 200 + 300, 200 + 10^4 and 150."""
    s = (Settings(300, 3000, 200, 300, 150, ref_samples=10_000) if quick
         else Settings(1000, 20_000, 500, 1000, 500, ref_samples=10_000))
    if num_samples:
        s.sg_samples = int(num_samples)
    if nuts_samples:
        s.nuts_samples = int(nuts_samples)
    if ref_samples:
        s.ref_samples = int(ref_samples)
    if not ksd:
        s.ksd_draws = 0
    return s


class RunOutput(NamedTuple):
    """Draws and costs of one run (seconds exclude JAX compilation), the warnings it raised
    (unique ``(category, message, count)``) and its run checks (``RunCheck`` as a dict)."""

    samples: dict  # site -> (S, ...) draws
    passes: np.ndarray  # (S,) cumulative data passes at each draw, preprocessing included
    seconds: np.ndarray  # (S,) cumulative seconds at each draw, preprocessing included
    sampling_s: float
    preprocessing_s: float
    compile_s: float
    iterations: int  # warm-up + draws
    note: str = ""
    warnings: tuple = ()
    checks: dict | None = None


def _collect(kernel, key: jax.Array, data: ModelData, warmup: int, samples: int,
             field: Callable, progress: bool) -> tuple[dict, Any]:
    """Run a NumPyro kernel for warm-up + draws in one compiled loop
    (:func:`numpyro.util.fori_collect`) that carries the data in its state, so they are an
    argument of the compiled program, not a constant. Returns the constrained draws after
    the warm-up and ``field(state)`` (a tuple of arrays) at every iteration, warm-up
    included."""
    args, kwargs = data.args_kwargs()
    state = kernel.init(key, warmup, None, args, kwargs)

    def body(val):
        chain, d = val
        a, k = d.args_kwargs()
        return kernel.sample(chain, a, k), d

    zs, values = fori_collect(0, warmup + samples, body, (state, data),
                              transform=lambda val: (val[0].z, field(val[0])), progbar=progress)
    draws = jax.vmap(kernel.postprocess_fn(args, kwargs))(jax.tree.map(lambda x: x[warmup:], zs))
    return {k: np.asarray(v) for k, v in draws.items()}, jax.tree.map(np.asarray, values)


def run_nuts(problem: Problem, settings: Settings, *, seed: int = 0,
             progress: bool = False) -> RunOutput:
    """NumPyro NUTS on the full data, warm-up and draws in one compiled loop.

    ``NUTS.init``/``NUTS.sample`` under :func:`numpyro.util.fori_collect` with the warm-up
    collected (what ``MCMC.warmup(collect_warmup=True)`` + ``MCMC.run`` do, compiled once
    instead of twice), so that its leapfrog steps count as data passes: one per step.
    """
    return _run_nuts(problem, settings, seed=seed, progress=progress)[0]


def _run_nuts(problem: Problem, settings: Settings, *, seed: int,
              progress: bool) -> tuple[RunOutput, np.ndarray]:
    """:func:`run_nuts` and the divergence flags of its draws."""
    W, S = settings.nuts_warmup, settings.reference_samples
    with record_warnings() as caught, CompileTimer() as ct:
        t0 = time.perf_counter()
        samples, (steps, div) = _collect(
            NUTS(problem.model), jax.random.PRNGKey(seed), problem.data(full=True), W, S,
            lambda s: (s.num_steps, s.diverging), progress)
        total = time.perf_counter() - t0 - ct.seconds
    cum = np.cumsum(np.asarray(steps, float))
    passes = cum[W:]
    out = RunOutput(samples=samples, passes=passes, seconds=total * passes / cum[-1],
                    sampling_s=total, preprocessing_s=0.0, compile_s=ct.seconds, iterations=W + S,
                    note=_divergence_note(div[W:]), warnings=tuple(caught),
                    checks=run_checks(DrawsRun(samples, div[W:])))
    return out, np.asarray(div[W:], bool)


def _divergence_note(diverging: np.ndarray) -> str:
    n = int(np.sum(diverging))
    return f"{n} divergent transitions" if n else ""


class SharedProxy(NamedTuple):
    """The Laplace proxy fitted once per problem for every method that uses one.

    The same proxy each stochastic-gradient kernel would fit itself (the seed split and
    settings of ``SGMCMCKernel``'s preprocessing); fitting it once saves the repeated fit and
    its compilation. Each method is still charged ``seconds`` and the proxy's data passes.
    """

    proxy: Proxy
    potential: Potential
    data: ModelData
    seconds: float  # wall time without compilation
    compile_s: float
    warnings: tuple = ()  # raised by the fit, unique (category, message, count)


def fit_shared_proxy(problem: Problem, *, seed: int = 0, progress: bool = False) -> SharedProxy:
    """Fit the kernels' default Laplace proxy (no N×d table of ∇f_i(θ̂)) on the problem, as
    the kernels do: without the chain check (the Laplace proxy's own row runs it)."""
    k_model, k_proxy, _ = jax.random.split(jax.random.PRNGKey(seed), 3)
    data = problem.data()
    with record_warnings() as caught, CompileTimer() as ct:
        t0 = time.perf_counter()
        potential = build_potential(problem.model, data, k_model)
        proxy = fit_laplace(potential, data, k_proxy, store_datum_grads=False,
                            check_chain=False, progress=progress)
        jax.block_until_ready(proxy.centre)
        seconds = time.perf_counter() - t0 - ct.seconds
    return SharedProxy(proxy=proxy, potential=potential, data=data, seconds=seconds,
                       compile_s=ct.seconds, warnings=tuple(caught))


def _chain_seconds(pre_s: float, sampling_s: float, warmup: int, draws: int) -> np.ndarray:
    """Cumulative seconds at each draw, sampling time spread evenly over the iterations."""
    return pre_s + sampling_s * (warmup + np.arange(1, draws + 1)) / (warmup + draws)


def run_hmcecs(problem: Problem, settings: Settings, shared: SharedProxy, *, seed: int = 0,
               progress: bool = False) -> RunOutput:
    """NumPyro HMCECS (NUTS inner kernel) with ``taylor_proxy`` at the shared proxy's mode.

    Charged the proxy fit (seconds and data passes) + one full pass (the Taylor proxy's
    per-datum terms in HMCECS's init); each iteration, warm-up included, costs n/N per
    leapfrog step and per Gibbs proposal.
    """
    N, n = problem.num_data, problem.subsample_size
    z_hat = shared.potential.unravel(shared.proxy.centre)
    ref_params = {k: v for k, v in constrained(shared.potential, z_hat, shared.data).items()
                  if k in z_hat}
    kernel = HMCECS(NUTS(problem.model), num_blocks=100 if n >= 100 else 1,
                    proxy=HMCECS.taylor_proxy(ref_params))
    W, S = settings.nuts_warmup, settings.nuts_samples
    with record_warnings() as caught, CompileTimer() as ct:
        t0 = time.perf_counter()
        samples, (steps, div) = _collect(
            kernel, jax.random.PRNGKey(seed), problem.data(), W, S,
            lambda s: (s.hmc_state.num_steps, s.hmc_state.diverging), progress)
        sampling_s = time.perf_counter() - t0 - ct.seconds
    cost = np.cumsum(np.asarray(steps, float) + 1) * n / N
    passes = shared.proxy.num_data_passes + 1.0 + cost[W:]
    note = "; ".join(x for x in ("taylor_proxy at the shared Laplace mode",
                                 _divergence_note(div[W:])) if x)
    return RunOutput(samples=samples, passes=passes,
                     seconds=_chain_seconds(shared.seconds, sampling_s, W, S),
                     sampling_s=sampling_s, preprocessing_s=shared.seconds,
                     compile_s=shared.compile_s + ct.seconds, iterations=W + S, note=note,
                     warnings=merge_warnings(shared.warnings, tuple(caught)),
                     checks=run_checks(DrawsRun(samples, div[W:])))


def merge_warnings(*groups: tuple) -> tuple:
    """Unique ``(category, message, count)`` over several groups, counts added."""
    counts: dict[tuple[str, str], int] = {}
    for group in groups:
        for c, m, k in group:
            counts[(c, m)] = counts.get((c, m), 0) + int(k)
    return tuple((c, m, k) for (c, m), k in counts.items())


def _passes_from_steps(kernel, num_steps, warmup: int, draws: int) -> np.ndarray:
    """Cumulative data passes of a subsampling HMC kernel without a ``data_passes`` field
    (EnergyConservingHMC): its preprocessing's passes, then n/N per leapfrog step and per
    Gibbs update of the subsample; the warm-up's steps are not recorded and are counted at the
    post-warm-up mean. NaN if the kernel reports neither."""
    pre = getattr(kernel, "preprocessed", None)
    n = getattr(pre, "subsample_size", None)
    if num_steps is None or n is None or not hasattr(pre, "data_passes"):
        return np.full(draws, math.nan)
    per_iter = (np.asarray(num_steps, float).reshape(draws) + 1.0) * n / pre.potential.num_data
    return float(pre.data_passes) + warmup * per_iter.mean() + np.cumsum(per_iter)


def run_kernel(method: Method, problem: Problem, settings: Settings, *,
               shared: SharedProxy | None = None, seed: int = 0,
               progress: bool = False) -> RunOutput:
    """A package kernel under ``numpyro.infer.MCMC``, preprocessing timed apart.

    Stochastic-gradient kernels get ``proxy=shared.proxy`` and are charged its seconds and
    compile seconds (its data passes are counted by the kernel); other kernels run NUTS-length
    chains.
    """
    pre_s, fit_compile_s, fit_warnings = 0.0, 0.0, ()
    with record_warnings() as caught:
        if method.kind == "sg":
            extra: dict[str, Any] = {}
            if shared is not None:
                extra["proxy"], pre_s = shared.proxy, shared.seconds
                fit_compile_s, fit_warnings = shared.compile_s, shared.warnings
            kernel = method.build(problem.model, seed=seed, progress_bar=progress, **extra)
            W, S = settings.sg_warmup, settings.sg_samples
        else:
            kernel = method.build(problem.model, seed=seed, progress_bar=progress)
            W, S = settings.nuts_warmup, settings.nuts_samples
        mcmc = MCMC(kernel, num_warmup=W, num_samples=S, progress_bar=False)
        with CompileTimer() as ct_pre:
            t0 = time.perf_counter()
            kernel.preprocess(problem.args(), problem.kwargs())
            pre_s += time.perf_counter() - t0 - ct_pre.seconds
        with CompileTimer() as ct:
            t1 = time.perf_counter()
            mcmc.run(jax.random.PRNGKey(seed), *problem.args(), **problem.kwargs(),
                     extra_fields=("data_passes",) if method.kind == "sg" else ("num_steps",))
            samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
            sampling_s = time.perf_counter() - t1 - ct.seconds
    extra_fields = mcmc.get_extra_fields()
    notes = []
    if "data_passes" in extra_fields:
        passes = np.asarray(extra_fields["data_passes"], float).reshape(S)
    else:
        passes = _passes_from_steps(kernel, extra_fields.get("num_steps"), W, S)
        notes.append("data passes approximate: (leapfrog steps + 1) × n/N per iteration, "
                     "warm-up at the post-warm-up mean" if np.isfinite(passes[-1])
                     else "kernel reports no data_passes")
    diverging = int(np.sum(np.asarray(extra_fields.get("diverging", 0))))
    if diverging:
        notes.append(f"{diverging} diverging steps")
    return RunOutput(samples=samples, passes=passes,
                     seconds=_chain_seconds(pre_s, sampling_s, W, S), sampling_s=sampling_s,
                     preprocessing_s=pre_s, compile_s=fit_compile_s + ct_pre.seconds + ct.seconds,
                     iterations=W + S, note="; ".join(notes),
                     warnings=merge_warnings(fit_warnings, tuple(caught)), checks=run_checks(mcmc))
