"""Compare every sampler of the package with NumPyro's NUTS and HMCECS on one problem.

:func:`run_compare` is the engine of ``numpyro-subsample compare``: it runs NUTS on the full
data (the reference, cached on disk), NumPyro's HMCECS with ``taylor_proxy`` and the package's
kernels (:func:`~numpyro_subsample.compare.problems.available_methods`) and independent draws
from the Laplace and variational proxies (no MCMC), and reports for each: preprocessing,
sampling and compilation seconds, data passes, iterations/s, the smallest bulk ESS and ESS per
second (compilation included), the worst errors of the mean and sd in posterior-sd units
against the reference, the kernel Stein discrepancy (Putcha, Nemeth and Fearnhead 2023,
Eq. 20-21) on the same number of draws for every row, and one "flags" column with the failed
run checks, the errors far from the reference and the warnings raised; it writes ``compare.csv``,
``compare.json`` and ``compare.png``.

Restartable: each method's run is saved in ``<out>/runs`` as soon as it finishes
(:class:`~numpyro_subsample.compare.store.RunStore`); ``resume=True`` reuses the runs saved for
the same problem and settings, and Ctrl-C raises :class:`CompareInterrupted` listing the runs
kept. Modules: :mod:`.problems` (problems, method registry), :mod:`.runners`,
:mod:`.proxy_runs`, :mod:`.metrics`, :mod:`.checks` (warnings, run checks), :mod:`.store`
(saved runs, checked caches), :mod:`.report`, :mod:`.timing` (compile time, the persistent
compilation cache, the device), :mod:`.engine` (:func:`run_compare` and its phases),
:mod:`.options` (its options and intermediate results), :mod:`.evaluation` (rows, curves,
meta). See ``docs/cli_benchmarks.md``.
"""

from __future__ import annotations

from numpyro_subsample.compare.engine import (
    CompareInterrupted,
    CompareOptions,
    Plan,
    Runs,
    describe,
    evaluate_runs,
    plan_compare,
    run_compare,
    run_methods,
)
from numpyro_subsample.compare.metrics import (
    FullDataScore,
    Result,
    Trace,
    evaluate,
    flatten_draws,
    min_ess,
    reference_mc_error,
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
    RunOutput,
    Settings,
    SharedProxy,
    fit_shared_proxy,
    reference_run,
    run_hmcecs,
    run_kernel,
    run_nuts,
    settings_for,
)
from numpyro_subsample.compare.store import CacheWarning, RunStore, check_out_dir
from numpyro_subsample.compare.timing import (
    CompileTimer,
    default_cache_root,
    setup_compile_cache,
    use_device,
    xla_fast_compile,
)

__all__ = [
    "CacheWarning",
    "CompareInterrupted",
    "CompareOptions",
    "CompileTimer",
    "FullDataScore",
    "Method",
    "Plan",
    "Problem",
    "Result",
    "RunOutput",
    "Runs",
    "RunStore",
    "Settings",
    "SharedProxy",
    "Trace",
    "available_methods",
    "check_dataset",
    "check_out_dir",
    "dataset_names",
    "default_cache_root",
    "describe",
    "evaluate",
    "evaluate_runs",
    "fit_shared_proxy",
    "flatten_draws",
    "format_summary",
    "format_table",
    "machine_info",
    "make_problem",
    "min_ess",
    "plan_compare",
    "plot_curves",
    "reference_mc_error",
    "reference_run",
    "run_compare",
    "run_hmcecs",
    "run_kernel",
    "run_methods",
    "run_nuts",
    "run_proxy",
    "select_methods",
    "settings_for",
    "setup_compile_cache",
    "standardised_errors",
    "use_device",
    "write_outputs",
    "xla_fast_compile",
]
