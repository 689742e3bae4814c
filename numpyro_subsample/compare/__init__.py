"""Compare every sampler of the package with NumPyro's NUTS and HMCECS on one problem.

:func:`run_compare` is the engine of ``numpyro-subsample compare``: it runs NUTS on the full
data (the reference, cached on disk), NumPyro's HMCECS with ``taylor_proxy`` and the package's
kernels (:func:`~numpyro_subsample.compare.problems.available_methods`) and independent draws
from the Laplace and variational proxies (no MCMC), and reports for each: preprocessing,
sampling and compilation seconds, data passes, iterations/s, the smallest bulk ESS and ESS per
second (compilation included), the worst errors of the mean and sd in posterior-sd units
against the reference, the kernel Stein discrepancy (Putcha, Nemeth and Fearnhead 2023,
Eq. 20-21), the warnings the run raised and its run checks; it writes ``compare.csv``,
``compare.json`` and ``compare.png``.

Restartable: each method's run is saved in ``<out>/runs`` as soon as it finishes
(:class:`~numpyro_subsample.compare.store.RunStore`); ``resume=True`` reuses the runs saved for
the same problem and settings, and Ctrl-C raises :class:`CompareInterrupted` listing the runs
kept. Modules: :mod:`.problems` (problems, method registry), :mod:`.runners`,
:mod:`.proxy_runs`, :mod:`.metrics`, :mod:`.checks` (warnings, run checks), :mod:`.store`
(saved runs, checked caches), :mod:`.report`, :mod:`.timing` (compile time, the persistent
compilation cache). See ``docs/cli_benchmarks.md``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from numpyro_subsample.compare.checks import check_code
from numpyro_subsample.compare.metrics import (
    FullDataScore,
    Result,
    Trace,
    evaluate,
    flatten_draws,
    min_ess,
    standardised_errors,
)
from numpyro_subsample.compare.problems import (
    Method,
    Problem,
    available_methods,
    check_dataset,
    dataset_names,
    make_problem,
    select_methods,
)
from numpyro_subsample.compare.proxy_runs import run_proxy
from numpyro_subsample.compare.report import (
    format_summary,
    format_table,
    machine_info,
    plot_curves,
    write_outputs,
)
from numpyro_subsample.compare.runners import (
    InterruptLatch,
    RunOutput,
    Settings,
    SharedProxy,
    fit_shared_proxy,
    reference_run,
    run_hmcecs,
    run_kernel,
    run_nuts,
    settings_for,
    start_peer,
)
from numpyro_subsample.compare.store import CacheWarning, RunStore, check_out_dir
from numpyro_subsample.compare.timing import (
    CompileTimer,
    default_cache_root,
    setup_compile_cache,
    xla_fast_compile,
)

__all__ = [
    "CacheWarning",
    "CompareInterrupted",
    "CompareOptions",
    "CompileTimer",
    "FullDataScore",
    "Method",
    "Problem",
    "Result",
    "RunOutput",
    "Settings",
    "SharedProxy",
    "Trace",
    "RunStore",
    "available_methods",
    "check_out_dir",
    "dataset_names",
    "default_cache_root",
    "evaluate",
    "fit_shared_proxy",
    "flatten_draws",
    "format_summary",
    "format_table",
    "machine_info",
    "make_problem",
    "min_ess",
    "plot_curves",
    "reference_run",
    "run_compare",
    "run_hmcecs",
    "run_kernel",
    "run_nuts",
    "run_proxy",
    "select_methods",
    "settings_for",
    "setup_compile_cache",
    "standardised_errors",
    "write_outputs",
    "xla_fast_compile",
]


@dataclass
class CompareOptions:
    """Settings of :func:`run_compare` (the flags of ``numpyro-subsample compare``).

    ``jobs``: 2 runs the reference and HMCECS in a worker process (default 2 with ``quick``,
    else 1); ``fast_compile``: XLA without most optimisations (default: ``quick``);
    ``compile_cache_dir``: the persistent compilation cache in use (from
    :func:`setup_compile_cache`), recorded and passed to the worker; ``resume``: reuse the
    runs saved in ``<out>/runs`` for the same problem and settings; ``command``: recorded.
    """

    dataset: str = "default"
    data_dir: str | None = None
    methods: str = "default"
    seed: int = 0
    out: str = "outputs"
    num_data: int | None = None
    subsample_size: int | None = None
    num_samples: int | None = None
    nuts_samples: int | None = None
    ksd: bool = True
    jobs: int | None = None
    cache_dir: str | None = None
    use_cache: bool = True
    compile_cache_dir: str | None = None
    fast_compile: bool | None = None
    quick: bool = False
    progress: bool = False
    resume: bool = False
    command: str = ""


class CompareInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_compare`: ``saved`` names the methods whose runs are kept in
    ``folder`` (``<out>/runs``), for a rerun with ``resume=True``."""

    def __init__(self, saved: list[str], folder: Path):
        super().__init__(f"interrupted; runs kept in {folder}: {', '.join(saved) or 'none'}")
        self.saved, self.folder = list(saved), Path(folder)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


def _failed(name: str, err: BaseException) -> dict:
    res = Result(name, status="failed",
                 note=f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")
    _log(f"note: {name} failed: {res.note}")
    return res.row()


def run_compare(options: CompareOptions | None = None) -> dict:
    """Run the comparison; returns ``{"rows", "curves", "meta", "paths"}``.

    Raises ``ValueError``/``FileNotFoundError`` for unknown methods or data sets, an invalid
    subsample size or an ``out`` that is not a writable folder, before running anything. A
    method that fails is reported as ``failed`` with its error; the others still run. Each
    finished run is saved in ``<out>/runs`` at once; on Ctrl-C, :class:`CompareInterrupted`
    (a ``KeyboardInterrupt``) lists them.
    """
    o = options or CompareOptions()
    jobs = o.jobs or (2 if o.quick else 1)
    fast = o.quick if o.fast_compile is None else bool(o.fast_compile)
    methods = select_methods(available_methods(), o.methods, o.quick)
    check_dataset(o.dataset)
    out = check_out_dir(o.out)
    with xla_fast_compile(fast):
        problem = make_problem(o.dataset, num_data=o.num_data, subsample_size=o.subsample_size,
                               data_dir=o.data_dir, seed=o.seed, quick=o.quick)
        settings = settings_for(o.quick, num_samples=o.num_samples, nuts_samples=o.nuts_samples,
                                ksd=o.ksd)
        store = RunStore.for_problem(out, problem, settings, seed=o.seed, fast_compile=fast)
        try:
            with InterruptLatch().installed() as latch:
                return _compare(o, problem, settings, methods, jobs, fast, store, out, latch)
        except CompareInterrupted:
            raise
        except KeyboardInterrupt:  # while evaluating or writing: every run is saved
            raise CompareInterrupted([m.name for m in methods if store.has(m)],
                                     store.folder) from None


def _compare(o: CompareOptions, problem: Problem, settings: Settings, methods: list[Method],
             jobs: int, fast: bool, store: RunStore, out: Path, latch: InterruptLatch) -> dict:
    """The runs, their evaluation and the files written (see :func:`run_compare`)."""
    rows, curves, shared, cached, resumed = _run_all(o, problem, settings, methods, jobs, fast,
                                                     store, latch)
    ksd_note = ("IMQ kernel Stein discrepancy on thinned draws, full-data scores"
                if settings.ksd_draws else "KSD disabled (--no-ksd)")
    meta = {
        "command": o.command,
        "dataset": problem.name,
        "task": problem.task,
        "num_data": problem.num_data,
        "dim": problem.dim,
        "subsample_size": problem.subsample_size,
        "problem_info": _plain_info(problem.info),
        "seed": o.seed,
        "quick": bool(o.quick),
        "settings": asdict(settings),
        "reference": {"method": "NUTS, full data, 1 chain", "cached": cached},
        "shared_proxy": None if shared is None else {
            "kind": shared.proxy.kind, "seconds": shared.seconds, "compile_s": shared.compile_s,
            "data_passes": shared.proxy.num_data_passes},
        "runs": {"folder": str(store.folder), "resumed": resumed},
        "compile_cache": o.compile_cache_dir,
        "fast_compile": fast,
        "jobs": jobs,
        "ksd": ksd_note,
        "machine": machine_info(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    paths = write_outputs(out, rows, curves, meta)
    return {"rows": rows, "curves": curves, "meta": meta, "paths": paths}


def _plain_info(info: dict) -> dict:
    """``problem.info`` with arrays as lists (for ``compare.json``)."""
    return {k: (np.asarray(v).tolist() if isinstance(v, (np.ndarray, tuple)) else v)
            for k, v in info.items() if isinstance(v, (int, float, str, tuple, np.ndarray))}


def _run_one(m: Method, problem: Problem, settings: Settings, shared: SharedProxy | None,
             o: CompareOptions) -> RunOutput:
    if m.kind == "hmcecs":
        return run_hmcecs(problem, settings, shared, seed=o.seed, progress=o.progress)
    if m.kind == "proxy":
        return run_proxy(m.options["proxy"], problem, settings, shared, seed=o.seed,
                         progress=o.progress)
    return run_kernel(m, problem, settings, shared=shared, seed=o.seed, progress=o.progress)


def _resume(store: RunStore, runs: list[Method], outputs: dict, resume: bool) -> list[str]:
    """Load the saved runs of ``runs`` into ``outputs`` (with ``resume``); their names."""
    if not resume:
        return []
    found = []
    for m in runs:
        out, why = store.load(m, RunOutput)
        path = store.paths(m.name)[0]
        if out is not None:
            outputs[m.name] = out
            found.append(m.name)
            _log(f"resume: {m.name}: result found in {path} ({why}); skipped")
        elif why.startswith("stale"):
            _log(f"resume: {m.name}: {path} is {why}; recomputing")
        elif why == "corrupt":
            _log(f"resume: {m.name}: saved result is corrupt; recomputing")
    return found


def _run_all(o: CompareOptions, problem: Problem, settings: Settings, methods: list[Method],
             jobs: int, fast: bool, store: RunStore, latch: InterruptLatch):
    """The runs and their evaluation: (rows, curves, shared proxy, reference cached,
    resumed method names)."""
    if not settings.ksd_draws:
        _log("note: KSD disabled (--no-ksd)")
    _log(f"problem: {problem.name} ({problem.task}), N={problem.num_data}, d={problem.dim}, "
         f"n={problem.subsample_size}; methods: {', '.join(m.name for m in methods)}")
    runs = [m for m in methods if m.kind != "nuts"]
    outputs: dict[str, RunOutput | BaseException | None] = {}
    resumed = _resume(store, runs, outputs, o.resume)
    todo = [m for m in runs if m.name not in outputs]
    bar = tqdm(total=len(todo) + 1, desc="compare", disable=not o.progress, file=sys.stderr)
    ref_opts = {"seed": o.seed, "cache_dir": o.cache_dir, "use_cache": o.use_cache}
    peer, shared = None, None
    hmcecs = next((m for m in todo if m.kind == "hmcecs"), None)
    try:
        if jobs > 1:
            peer = start_peer(problem, settings, with_hmcecs=hmcecs is not None,
                              compile_cache_dir=o.compile_cache_dir, fast_compile=fast,
                              store=store, hmcecs_method=hmcecs, **ref_opts)
        else:
            bar.set_postfix_str("reference: NUTS on the full data")
            reference = reference_run(problem, settings, progress=o.progress, **ref_opts)
            bar.update(1)
        for m in todo:
            latch.check()
            if m.kind == "hmcecs" and peer is not None:
                continue  # runs in the worker process, which saves it
            bar.set_postfix_str(m.name)
            try:
                if shared is None and m.kind in ("hmcecs", "sg", "proxy"):
                    shared = fit_shared_proxy(problem, seed=o.seed, progress=o.progress)
                    _log(f"note: Laplace proxy fitted once for all methods using one: "
                         f"{shared.seconds:.2f} s + {shared.compile_s:.2f} s compile, "
                         f"{shared.proxy.num_data_passes:.1f} data passes")
                outputs[m.name] = out = _run_one(m, problem, settings, shared, o)
            except Exception as err:  # noqa: BLE001 - one method failing must not stop the others
                outputs[m.name] = err
            else:
                try:
                    _log(f"done: {m.name}; saved in {store.save(m, out)}")
                except OSError as err:
                    _log(f"note: could not save the run of {m.name} in {store.folder}: {err}")
            bar.update(1)
        latch.check()
        if peer is not None:
            bar.set_postfix_str("waiting for the reference / HMCECS process")
            reference, peer_hmcecs = peer.result()
            if hmcecs is not None:
                outputs[hmcecs.name] = peer_hmcecs
            bar.update(1)
    except KeyboardInterrupt:
        if peer is not None:
            peer.terminate()
        raise CompareInterrupted([m.name for m in runs if store.has(m)], store.folder) from None
    except BaseException:
        if peer is not None:
            peer.terminate()
        raise
    finally:
        bar.close()
    ref_out, cached = reference
    sites = sorted(ref_out.samples)
    ref = flatten_draws(ref_out.samples, sites)
    score = FullDataScore(problem.model, problem.data()) if settings.ksd_draws else None

    def row(m: Method | None, out: RunOutput, note: str = "") -> Result:
        res = Result(m.title if m else "nuts (reference)", name=m.name if m else "nuts",
                     note="; ".join(x for x in (note, out.note) if x),
                     preprocessing_s=out.preprocessing_s, sampling_s=out.sampling_s,
                     compile_s=out.compile_s, data_passes=float(out.passes[-1]),
                     iterations=out.iterations,
                     it_per_s=out.iterations / out.sampling_s if out.sampling_s > 0 else np.nan,
                     warnings=len(out.warnings),
                     warning_messages=[{"category": c, "message": msg, "count": k}
                                       for c, msg, k in out.warnings],
                     checks=check_code(out.checks), check_details=out.checks)
        trace = Trace(flatten_draws(out.samples, sites), np.asarray(out.passes, float),
                      np.asarray(out.seconds, float))
        evaluate(res, trace, ref, score=score, ksd_draws=settings.ksd_draws,
                 checkpoints=settings.checkpoints, ksd_points=settings.ksd_points)
        return res

    ref_note = "cached reference: timings from the run that made it" if cached else ""
    rows, curves = [row(None, ref_out, ref_note).row()], {}
    for m in runs:
        out = outputs.get(m.name)
        if isinstance(out, BaseException):
            rows.append(_failed(m.title, out))
        elif out is not None:
            try:
                res = row(m, out, "resumed: saved run" if m.name in resumed else "")
            except Exception as err:  # noqa: BLE001
                rows.append(_failed(m.title, err))
                continue
            rows.append(res.row())
            curves[res.method] = res.curve
    return rows, curves, shared, cached, resumed

