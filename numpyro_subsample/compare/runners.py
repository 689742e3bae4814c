"""Runs of the comparison: the NUTS reference, NumPyro's HMCECS, the package's kernels.

The single runs and their :class:`RunOutput` are in :mod:`~numpyro_subsample.compare.chains`
(re-exported here). This module caches the NUTS reference on disk (:func:`reference_run`), and
:func:`start_peer` runs the reference and HMCECS in a worker process while the calling process
runs the package's kernels.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax

from numpyro_subsample.compare.chains import (
    RunOutput,
    Settings,
    SharedProxy,
    _run_nuts,
    fit_shared_proxy,
    merge_warnings,
    run_hmcecs,
    run_kernel,
    run_nuts,
    settings_for,
)
from numpyro_subsample.compare.checks import DrawsRun, run_checks
from numpyro_subsample.compare.problems import Method, Problem
from numpyro_subsample.compare.store import (
    CorruptCacheError,
    RunStore,
    load_arrays,
    save_arrays,
    warn_corrupt,
)
from numpyro_subsample.compare.timing import (
    default_cache_root,
    setup_compile_cache,
    use_device,
    xla_optimized,
)

__all__ = [
    "InterruptLatch",
    "Peer",
    "RunOutput",
    "Settings",
    "SharedProxy",
    "fit_shared_proxy",
    "merge_warnings",
    "peer_runs",
    "reference_run",
    "run_hmcecs",
    "run_kernel",
    "run_nuts",
    "settings_for",
    "start_peer",
]


# -- the reference, cached on disk --------------------------------------------------------------
def reference_run(problem: Problem, settings: Settings, *, seed: int = 0,
                  cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                  progress: bool = False) -> tuple[RunOutput, bool]:
    """The NUTS reference (:func:`run_nuts`), cached on disk; returns ``(output, cached)``.

    The cache file is keyed by the data set's name, N, d, a hash of the data, the seed and
    the chain lengths, in ``cache_dir`` (default ``default_cache_root() / "reference"``); a
    cached reference keeps the timings of the run that made it. The file carries the SHA-256
    of its arrays (:func:`~numpyro_subsample.compare.store.save_arrays`): an unreadable or
    altered file is recomputed with a :class:`~numpyro_subsample.compare.store.CacheWarning`
    naming it. ``use_cache=False`` recomputes (and rewrites) it. It is compiled with XLA's
    optimisations even under ``--quick`` (:func:`~numpyro_subsample.compare.timing.xla_optimized`).
    """
    key = (f"v3_{problem.name}_N{problem.num_data}_d{problem.dim}_{problem.fingerprint()}"
           f"_seed{seed}_w{settings.nuts_warmup}_s{settings.reference_samples}")
    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_root() / "reference"
    path = folder / f"{key}.npz"
    if use_cache and path.is_file():
        try:
            z = load_arrays(path)
            samples = {k[2:]: z[k] for k in z if k.startswith("s_")}
            out = RunOutput(samples=samples, passes=z["passes"], seconds=z["seconds"],
                            sampling_s=float(z["sampling_s"]), preprocessing_s=0.0,
                            compile_s=float(z["compile_s"]), iterations=int(z["iterations"]),
                            note=str(z["note"]),
                            warnings=tuple(tuple(w) for w in json.loads(str(z["warnings"]))),
                            checks=run_checks(DrawsRun(samples, z["diverging"])))
            return out, True
        except (CorruptCacheError, KeyError, ValueError) as err:
            warn_corrupt(path, "NUTS reference cache", err)
    with xla_optimized():  # the longest loop of a comparison, also under --quick
        out, diverging = _run_nuts(problem, settings, seed=seed, progress=progress)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_arrays(path, {"passes": out.passes, "seconds": out.seconds,
                           "sampling_s": out.sampling_s, "compile_s": out.compile_s,
                           "iterations": out.iterations, "note": out.note,
                           "warnings": json.dumps(out.warnings), "diverging": diverging,
                           **{f"s_{k}": v for k, v in out.samples.items()}})
    except OSError as err:
        warnings.warn(f"could not write the NUTS reference cache {path}: {err}", stacklevel=2)
    return out, False


# -- the worker process -------------------------------------------------------------------------
def peer_runs(problem: Problem, settings: Settings, *, seed: int = 0,
              cache_dir: str | None = None, use_cache: bool = True, with_hmcecs: bool = True,
              compile_cache_dir: str | None = None, fast_compile: bool = False,
              store: RunStore | None = None, hmcecs_method: Method | None = None,
              progress: bool = False, device: str | None = None,
              ) -> tuple[tuple[RunOutput, bool], RunOutput | Exception | None]:
    """The NUTS reference and (``with_hmcecs``) HMCECS, as run in the worker process.

    Configures JAX as the main process does (``fast_compile``, the compilation cache in
    ``compile_cache_dir``, the ``device``) and fits the shared proxy itself (same seed: the
    same mode); ``progress``: NumPyro's progress bar for the reference. HMCECS's run is saved
    in ``store`` (as ``hmcecs_method``) as soon as it finishes. Returns
    ``((reference, cached), hmcecs)``, HMCECS's exception if it failed.
    """
    if fast_compile:
        jax.config.update("jax_disable_most_optimizations", True)
    if compile_cache_dir:
        setup_compile_cache(compile_cache_dir)
    with use_device(device):
        return _peer_runs(problem, settings, seed=seed, cache_dir=cache_dir,
                          use_cache=use_cache, with_hmcecs=with_hmcecs, store=store,
                          hmcecs_method=hmcecs_method, progress=progress)


def _peer_runs(problem: Problem, settings: Settings, *, seed: int, cache_dir: str | None,
               use_cache: bool, with_hmcecs: bool, store: RunStore | None,
               hmcecs_method: Method | None, progress: bool):
    ref = reference_run(problem, settings, seed=seed, cache_dir=cache_dir, use_cache=use_cache,
                        progress=progress)
    hmcecs: RunOutput | Exception | None = None
    if with_hmcecs:
        try:
            shared = fit_shared_proxy(problem, seed=seed)
            hmcecs = run_hmcecs(problem, settings, shared, seed=seed)
        except Exception as err:  # noqa: BLE001 - reported as the method's failure
            hmcecs = err
        if isinstance(hmcecs, RunOutput) and store is not None and hmcecs_method is not None:
            try:
                store.save(hmcecs_method, hmcecs)
            except OSError as err:
                warnings.warn(f"could not save the run of hmcecs in {store.folder}: {err}",
                              stacklevel=2)
    return ref, hmcecs


def _picklable(err: BaseException) -> BaseException:
    try:
        pickle.dumps(err)
        return err
    except Exception:  # noqa: BLE001 - any pickling failure: send the text instead
        return RuntimeError(f"{type(err).__name__}: {err}")


def _peer_main(results: multiprocessing.Queue, problem: Problem, settings: Settings,
               options: dict) -> None:
    """Entry point of the worker process: :func:`peer_runs`, its result put on ``results``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # on Ctrl-C the parent process stops it
    try:
        ref, hmcecs = peer_runs(problem, settings, **options)
        if isinstance(hmcecs, BaseException):
            hmcecs = _picklable(hmcecs)
        results.put(("ok", (ref, hmcecs)))
    except BaseException as err:  # noqa: BLE001 - reported by Peer.result in the parent
        results.put(("error", _picklable(err)))


class Peer:
    """The worker process started by :func:`start_peer`.

    :meth:`result` waits for ``((reference, cached), hmcecs)`` and re-raises the worker's
    error; :meth:`terminate` stops the worker (on Ctrl-C in the parent).
    """

    def __init__(self, process, results) -> None:
        self._process, self._results = process, results

    def result(self):
        """The worker's result (blocks; raises if the worker failed or died)."""
        while True:
            try:
                status, value = self._results.get(timeout=0.5)
                break
            except queue.Empty:
                if not self._process.is_alive():
                    try:
                        status, value = self._results.get(timeout=2.0)
                        break
                    except queue.Empty:
                        raise RuntimeError(
                            "the worker process (NUTS reference / HMCECS) exited with code "
                            f"{self._process.exitcode} without a result") from None
        self._process.join()
        if status == "error":
            raise value
        return value

    def terminate(self) -> None:
        """Stop the worker process if it is still running."""
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(10)


def start_peer(problem: Problem, settings: Settings, **options: Any) -> Peer:
    """Start :func:`peer_runs` (``options`` are its keywords) in a spawned worker process.

    A cold run is mostly single-threaded compilation, so the reference and HMCECS overlap
    with the package's kernels; both processes share the CPU, so timings are noisier. The
    worker ignores SIGINT: the parent stops it with :meth:`Peer.terminate`.
    """
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=_peer_main, args=(results, problem, settings, options),
                          daemon=True)
    process.start()
    return Peer(process, results)


class InterruptLatch:
    """Remembers a Ctrl-C (SIGINT) inside :meth:`installed`, so that one swallowed on its way
    (a ``KeyboardInterrupt`` raised inside a finaliser or a garbage-collection callback, such
    as JAX's, is printed as "Exception ignored" and lost) still stops the run at the next
    :meth:`check`."""

    def __init__(self) -> None:
        self.hit = False

    def _handler(self, signum, frame) -> None:
        self.hit = True
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[InterruptLatch]:
        """The latch as the SIGINT handler inside the block (main thread with Python's default
        handler only; elsewhere the block runs unchanged)."""
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            yield self
            return
        signal.signal(signal.SIGINT, self._handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if a Ctrl-C arrived since :meth:`installed`."""
        if self.hit:
            raise KeyboardInterrupt
