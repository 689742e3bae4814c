"""Runs of the comparison: the NUTS reference, NumPyro's HMCECS, the package's kernels.

Every runner returns a :class:`RunOutput`: the draws, the cumulative data passes and seconds
at each draw, and the preprocessing, sampling and compilation seconds measured apart
(:class:`~numpyro_subsample.compare.timing.CompileTimer`). The Laplace proxy is fitted once
per problem (:func:`fit_shared_proxy`) and given to every method that uses one, each of them
being charged its seconds and data passes. :func:`start_peer` runs the reference and HMCECS in
a worker process while the calling process runs the package's kernels.
"""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
from numpyro.infer import HMCECS, MCMC, NUTS
from numpyro.util import fori_collect

from numpyro_subsample.compare.problems import Method, Problem
from numpyro_subsample.compare.timing import (
    CompileTimer,
    default_cache_root,
    quiet,
    setup_compile_cache,
)
from numpyro_subsample.core.potential import ModelData, Potential, build_potential
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.laplace import fit_laplace

__all__ = [
    "RunOutput",
    "Settings",
    "SharedProxy",
    "fit_shared_proxy",
    "peer_runs",
    "reference_run",
    "run_hmcecs",
    "run_kernel",
    "run_nuts",
    "settings_for",
    "start_peer",
]


@dataclass
class Settings:
    """Chain lengths (warm-up, draws) and the KSD's thinning of one comparison."""

    sg_warmup: int
    sg_samples: int
    nuts_warmup: int
    nuts_samples: int
    ksd_draws: int
    checkpoints: int = 12
    ksd_points: int = 5


def settings_for(quick: bool = False, *, num_samples: int | None = None,
                 nuts_samples: int | None = None, ksd: bool = True) -> Settings:
    """Defaults: 1000 + 20,000 stochastic-gradient steps, 500 + 1000 NUTS/HMCECS steps and
    500 KSD draws; ``quick``: 300 + 3000, 200 + 300 and 150."""
    s = (Settings(300, 3000, 200, 300, 150, ksd_points=3) if quick
         else Settings(1000, 20_000, 500, 1000, 500))
    if num_samples:
        s.sg_samples = int(num_samples)
    if nuts_samples:
        s.nuts_samples = int(nuts_samples)
    if not ksd:
        s.ksd_draws = 0
    return s


class RunOutput(NamedTuple):
    """Draws and costs of one run (seconds exclude JAX compilation)."""

    samples: dict  # site -> (S, ...) draws
    passes: np.ndarray  # (S,) cumulative data passes at each draw, preprocessing included
    seconds: np.ndarray  # (S,) cumulative seconds at each draw, preprocessing included
    sampling_s: float
    preprocessing_s: float
    compile_s: float
    iterations: int  # warm-up + draws
    note: str = ""


def _collect(kernel, key: jax.Array, data: ModelData, warmup: int, samples: int,
             field: Callable, progress: bool) -> tuple[dict, np.ndarray]:
    """Run a NumPyro kernel for warm-up + draws in one compiled loop
    (:func:`numpyro.util.fori_collect`) that carries the data in its state, so they are an
    argument of the compiled program, not a constant. Returns the constrained draws after
    the warm-up and ``field(state)`` at every iteration, warm-up included."""
    args, kwargs = data.args_kwargs()
    state = kernel.init(key, warmup, None, args, kwargs)

    def body(val):
        chain, d = val
        a, k = d.args_kwargs()
        return kernel.sample(chain, a, k), d

    zs, values = fori_collect(0, warmup + samples, body, (state, data),
                              transform=lambda val: (val[0].z, field(val[0])), progbar=progress)
    draws = jax.vmap(kernel.postprocess_fn(args, kwargs))(jax.tree.map(lambda x: x[warmup:], zs))
    return {k: np.asarray(v) for k, v in draws.items()}, np.asarray(values, float)


def run_nuts(problem: Problem, settings: Settings, *, seed: int = 0,
             progress: bool = False) -> RunOutput:
    """NumPyro NUTS on the full data, warm-up and draws in one compiled loop.

    ``NUTS.init``/``NUTS.sample`` under :func:`numpyro.util.fori_collect` with the warm-up
    collected (what ``MCMC.warmup(collect_warmup=True)`` + ``MCMC.run`` do, compiled once
    instead of twice), so that its leapfrog steps count as data passes: one per step.
    """
    W, S = settings.nuts_warmup, settings.nuts_samples
    with quiet(), CompileTimer() as ct:
        t0 = time.perf_counter()
        samples, steps = _collect(NUTS(problem.model), jax.random.PRNGKey(seed),
                                  problem.data(full=True), W, S, lambda s: s.num_steps, progress)
        total = time.perf_counter() - t0 - ct.seconds
    cum = np.cumsum(steps)
    passes = cum[W:]
    return RunOutput(samples, passes, total * passes / cum[-1], total, 0.0, ct.seconds, W + S)


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


def fit_shared_proxy(problem: Problem, *, seed: int = 0, progress: bool = False) -> SharedProxy:
    """Fit the kernels' default Laplace proxy (no N×d table of ∇f_i(θ̂)) on the problem."""
    k_model, k_proxy, _ = jax.random.split(jax.random.PRNGKey(seed), 3)
    data = problem.data()
    with quiet(), CompileTimer() as ct:
        t0 = time.perf_counter()
        potential = build_potential(problem.model, data, k_model)
        proxy = fit_laplace(potential, data, k_proxy, store_datum_grads=False, progress=progress)
        jax.block_until_ready(proxy.centre)
        seconds = time.perf_counter() - t0 - ct.seconds
    return SharedProxy(proxy, potential, data, seconds, ct.seconds)


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
    ref_params = {k: v for k, v in shared.potential.constrain(z_hat, shared.data).items()
                  if k in z_hat}
    kernel = HMCECS(NUTS(problem.model), num_blocks=100 if n >= 100 else 1,
                    proxy=HMCECS.taylor_proxy(ref_params))
    W, S = settings.nuts_warmup, settings.nuts_samples
    with quiet(), CompileTimer() as ct:
        t0 = time.perf_counter()
        samples, steps = _collect(kernel, jax.random.PRNGKey(seed), problem.data(), W, S,
                                  lambda s: s.hmc_state.num_steps, progress)
        sampling_s = time.perf_counter() - t0 - ct.seconds
    cost = np.cumsum(steps + 1) * n / N
    passes = shared.proxy.num_data_passes + 1.0 + cost[W:]
    return RunOutput(samples, passes, _chain_seconds(shared.seconds, sampling_s, W, S),
                     sampling_s, shared.seconds, ct.seconds, W + S,
                     "taylor_proxy at the shared Laplace mode")


def run_kernel(method: Method, problem: Problem, settings: Settings, *,
               shared: SharedProxy | None = None, seed: int = 0,
               progress: bool = False) -> RunOutput:
    """A package kernel under ``numpyro.infer.MCMC``, preprocessing timed apart.

    Stochastic-gradient kernels get ``proxy=shared.proxy`` and are charged its seconds (its
    data passes are counted by the kernel); other kernels run NUTS-length chains.
    """
    pre_s = 0.0
    if method.kind == "sg":
        extra: dict[str, Any] = {}
        if shared is not None:
            extra["proxy"], pre_s = shared.proxy, shared.seconds
        kernel = method.build(problem.model, seed=seed, progress_bar=progress, **extra)
        W, S = settings.sg_warmup, settings.sg_samples
    else:
        kernel = method.build(problem.model, seed=seed, progress_bar=progress)
        W, S = settings.nuts_warmup, settings.nuts_samples
    mcmc = MCMC(kernel, num_warmup=W, num_samples=S, progress_bar=False)
    with quiet():
        with CompileTimer() as ct_pre:
            t0 = time.perf_counter()
            kernel.preprocess(problem.args(), problem.kwargs())
            pre_s += time.perf_counter() - t0 - ct_pre.seconds
        with CompileTimer() as ct:
            t1 = time.perf_counter()
            mcmc.run(jax.random.PRNGKey(seed), *problem.args(), **problem.kwargs())
            samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
            sampling_s = time.perf_counter() - t1 - ct.seconds
    extra_fields = mcmc.get_extra_fields()
    notes = []
    if "data_passes" in extra_fields:
        passes = np.asarray(extra_fields["data_passes"], float).reshape(S)
    else:
        passes = np.full(S, math.nan)
        notes.append("kernel reports no data_passes")
    diverging = int(np.sum(np.asarray(extra_fields.get("diverging", 0))))
    if diverging:
        notes.append(f"{diverging} rejected non-finite steps")
    return RunOutput(samples, passes, _chain_seconds(pre_s, sampling_s, W, S), sampling_s,
                     pre_s, ct_pre.seconds + ct.seconds, W + S, "; ".join(notes))


# -- the reference, cached on disk --------------------------------------------------------------
def reference_run(problem: Problem, settings: Settings, *, seed: int = 0,
                  cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                  progress: bool = False) -> tuple[RunOutput, bool]:
    """The NUTS reference (:func:`run_nuts`), cached on disk; returns ``(output, cached)``.

    The cache file is keyed by the data set's name, N, d, a hash of the data, the seed and
    the chain lengths, in ``cache_dir`` (default ``default_cache_root() / "reference"``); a
    cached reference keeps the timings of the run that made it. ``use_cache=False``
    recomputes (and rewrites) it.
    """
    key = (f"v2_{problem.name}_N{problem.num_data}_d{problem.dim}_{problem.fingerprint()}"
           f"_seed{seed}_w{settings.nuts_warmup}_s{settings.nuts_samples}")
    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_root() / "reference"
    path = folder / f"{key}.npz"
    if use_cache and path.is_file():
        with np.load(path, allow_pickle=False) as z:
            out = RunOutput(
                {k[2:]: z[k] for k in z.files if k.startswith("s_")}, z["passes"], z["seconds"],
                float(z["sampling_s"]), 0.0, float(z["compile_s"]), int(z["iterations"]),
            )
        return out, True
    out = run_nuts(problem, settings, seed=seed, progress=progress)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, passes=out.passes, seconds=out.seconds, sampling_s=out.sampling_s,
                 compile_s=out.compile_s, iterations=out.iterations,
                 **{f"s_{k}": v for k, v in out.samples.items()})
    except OSError as err:
        print(f"note: could not write the reference cache {path}: {err}", file=sys.stderr)
    return out, False


# -- the worker process -------------------------------------------------------------------------
def peer_runs(problem: Problem, settings: Settings, *, seed: int = 0,
              cache_dir: str | None = None, use_cache: bool = True, with_hmcecs: bool = True,
              compile_cache_dir: str | None = None, fast_compile: bool = False,
              ) -> tuple[tuple[RunOutput, bool], RunOutput | Exception | None]:
    """The NUTS reference and (``with_hmcecs``) HMCECS, as run in the worker process.

    Configures JAX as the main process does (``fast_compile``, the compilation cache in
    ``compile_cache_dir``) and fits the shared proxy itself (same seed: the same mode).
    Returns ``((reference, cached), hmcecs)``, HMCECS's exception if it failed.
    """
    if fast_compile:
        jax.config.update("jax_disable_most_optimizations", True)
    if compile_cache_dir:
        setup_compile_cache(compile_cache_dir)
    ref = reference_run(problem, settings, seed=seed, cache_dir=cache_dir, use_cache=use_cache)
    hmcecs: RunOutput | Exception | None = None
    if with_hmcecs:
        try:
            shared = fit_shared_proxy(problem, seed=seed)
            hmcecs = run_hmcecs(problem, settings, shared, seed=seed)
        except Exception as err:  # noqa: BLE001 - reported as the method's failure
            hmcecs = err
    return ref, hmcecs


def start_peer(problem: Problem, settings: Settings, **options: Any) -> concurrent.futures.Future:
    """Start :func:`peer_runs` (``options`` are its keywords) in a spawned worker process.

    A cold run is mostly single-threaded compilation, so the reference and HMCECS overlap
    with the package's kernels; both processes share the CPU, so timings are noisier.
    """
    pool = concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn"))
    future = pool.submit(peer_runs, problem, settings, **options)
    pool.shutdown(wait=False)
    return future
