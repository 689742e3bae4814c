"""Compare every sampler of the package with NumPyro's NUTS and HMCECS on one problem.

:func:`run_compare` is the engine of ``numpyro-subsample compare``: it runs NUTS on the full
data (the reference, cached on disk), NumPyro's HMCECS with ``taylor_proxy`` and the package's
kernels (:func:`~numpyro_subsample.compare.problems.available_methods`), and reports for each:
preprocessing, sampling and compilation seconds, data passes, iterations/s, ESS/s, the worst
errors of the mean and sd in posterior-sd units against the reference, and the kernel Stein
discrepancy (Putcha, Nemeth and Fearnhead 2023, Eq. 20-21); it writes ``compare.csv``,
``compare.json`` and ``compare.png``. Modules: :mod:`.problems` (problems, method registry),
:mod:`.runners`, :mod:`.metrics`, :mod:`.report`, :mod:`.timing` (compile time, the
persistent compilation cache). See ``docs/cli_benchmarks.md``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

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
    make_problem,
    select_methods,
)
from numpyro_subsample.compare.report import (
    format_summary,
    format_table,
    machine_info,
    plot_curves,
    write_outputs,
)
from numpyro_subsample.compare.runners import (
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
from numpyro_subsample.compare.timing import (
    CompileTimer,
    default_cache_root,
    setup_compile_cache,
    xla_fast_compile,
)

__all__ = [
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
    "available_methods",
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
    :func:`setup_compile_cache`), recorded and passed to the worker; ``command``: recorded.
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
    command: str = ""


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
    subsample size or an ``out`` that is not a folder, before running anything. A method that
    fails is reported as ``failed`` with its error; the others still run.
    """
    o = options or CompareOptions()
    jobs = o.jobs or (2 if o.quick else 1)
    fast = o.quick if o.fast_compile is None else bool(o.fast_compile)
    methods = select_methods(available_methods(), o.methods, o.quick)
    check_dataset(o.dataset)
    if Path(o.out).exists() and not Path(o.out).is_dir():
        raise ValueError(f"--out {o.out!r} exists and is not a folder; pass a folder.")
    with xla_fast_compile(fast):
        problem = make_problem(o.dataset, num_data=o.num_data, subsample_size=o.subsample_size,
                               data_dir=o.data_dir, seed=o.seed, quick=o.quick)
        settings = settings_for(o.quick, num_samples=o.num_samples, nuts_samples=o.nuts_samples,
                                ksd=o.ksd)
        rows, curves, shared, cached = _run_all(o, problem, settings, methods, jobs, fast)
    ksd_note = ("IMQ kernel Stein discrepancy on thinned draws, full-data scores"
                if settings.ksd_draws else "KSD disabled (--no-ksd)")
    meta = {
        "command": o.command,
        "dataset": problem.name,
        "task": problem.task,
        "num_data": problem.num_data,
        "dim": problem.dim,
        "subsample_size": problem.subsample_size,
        "seed": o.seed,
        "quick": bool(o.quick),
        "settings": asdict(settings),
        "reference": {"method": "NUTS, full data, 1 chain", "cached": cached},
        "shared_proxy": None if shared is None else {
            "kind": shared.proxy.kind, "seconds": shared.seconds, "compile_s": shared.compile_s,
            "data_passes": shared.proxy.num_data_passes},
        "compile_cache": o.compile_cache_dir,
        "fast_compile": fast,
        "jobs": jobs,
        "ksd": ksd_note,
        "machine": machine_info(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    paths = write_outputs(Path(o.out), rows, curves, meta)
    return {"rows": rows, "curves": curves, "meta": meta, "paths": paths}


def _run_all(o: CompareOptions, problem: Problem, settings: Settings, methods: list[Method],
             jobs: int, fast: bool):
    """The runs and their evaluation: (rows, curves, shared proxy, reference cached)."""
    if not settings.ksd_draws:
        _log("note: KSD disabled (--no-ksd)")
    _log(f"problem: {problem.name} ({problem.task}), N={problem.num_data}, d={problem.dim}, "
         f"n={problem.subsample_size}; methods: {', '.join(m.name for m in methods)}")
    score = FullDataScore(problem.model, problem.data()) if settings.ksd_draws else None
    runs = [m for m in methods if m.kind != "nuts"]
    bar = tqdm(total=len(runs) + 1, desc="compare", disable=not o.progress, file=sys.stderr)
    ref_opts = {"seed": o.seed, "cache_dir": o.cache_dir, "use_cache": o.use_cache}
    peer = None
    if jobs > 1:
        peer = start_peer(problem, settings, with_hmcecs=any(m.kind == "hmcecs" for m in runs),
                          compile_cache_dir=o.compile_cache_dir, fast_compile=fast, **ref_opts)
    else:
        bar.set_postfix_str("reference: NUTS on the full data")
        reference = reference_run(problem, settings, progress=o.progress, **ref_opts)
        bar.update(1)
    outputs: dict[str, RunOutput | Exception | None] = {}
    shared = None
    for m in runs:
        if m.kind == "hmcecs" and peer is not None:
            continue  # runs in the worker process
        bar.set_postfix_str(m.name)
        try:
            if shared is None and m.kind in ("hmcecs", "sg"):
                shared = fit_shared_proxy(problem, seed=o.seed, progress=o.progress)
                _log(f"note: Laplace proxy fitted once for all methods using one: "
                     f"{shared.seconds:.2f} s + {shared.compile_s:.2f} s compile, "
                     f"{shared.proxy.num_data_passes:.1f} data passes")
            if m.kind == "hmcecs":
                outputs[m.name] = run_hmcecs(problem, settings, shared, seed=o.seed,
                                             progress=o.progress)
            else:
                outputs[m.name] = run_kernel(m, problem, settings, shared=shared, seed=o.seed,
                                             progress=o.progress)
        except Exception as err:  # noqa: BLE001 - one method failing must not stop the others
            outputs[m.name] = err
        bar.update(1)
    if peer is not None:
        bar.set_postfix_str("waiting for the reference / HMCECS process")
        reference, outputs["hmcecs"] = peer.result()
        bar.update(1)
    bar.close()
    ref_out, cached = reference
    sites = sorted(ref_out.samples)
    ref = flatten_draws(ref_out.samples, sites)

    def row(name: str, out: RunOutput, note: str = "") -> dict:
        res = Result(name, note="; ".join(x for x in (note, out.note) if x),
                     preprocessing_s=out.preprocessing_s, sampling_s=out.sampling_s,
                     compile_s=out.compile_s, data_passes=float(out.passes[-1]),
                     iterations=out.iterations,
                     it_per_s=out.iterations / out.sampling_s if out.sampling_s > 0 else np.nan)
        trace = Trace(flatten_draws(out.samples, sites), np.asarray(out.passes, float),
                      np.asarray(out.seconds, float))
        evaluate(res, trace, ref, score=score, ksd_draws=settings.ksd_draws,
                 checkpoints=settings.checkpoints, ksd_points=settings.ksd_points)
        return res

    ref_note = "cached reference: timings from the run that made it" if cached else ""
    rows, curves = [row("nuts (reference)", ref_out, ref_note).row()], {}
    for m in runs:
        out = outputs.get(m.name)
        if isinstance(out, BaseException):
            rows.append(_failed(m.name, out))
        elif out is not None:
            try:
                res = row(m.name, out)
            except Exception as err:  # noqa: BLE001
                rows.append(_failed(m.name, err))
                continue
            rows.append(res.row())
            curves[m.name] = res.curve
    return rows, curves, shared, cached
