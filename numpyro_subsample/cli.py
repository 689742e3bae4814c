"""The ``numpyro-subsample`` command: argument parsing for :mod:`numpyro_subsample.compare`.

``numpyro-subsample compare`` runs every sampler/estimator of the package on one problem
(default: a synthetic Bayesian logistic regression with rare binary features and high-leverage
rows, N = 5·10^4, d = 21), NumPyro NUTS on the full data (the reference), NumPyro HMCECS and
independent draws from the Laplace and variational proxies, prints one table and saves it as
CSV, JSON and a PNG plot in ``--out`` (:func:`numpyro_subsample.compare.run_compare`). Each
method's run is saved in ``--out``/runs as soon as it finishes; after Ctrl-C (exit status 130)
``--resume`` reruns only the missing methods. See ``docs/cli_benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from numpyro_subsample import compare

__all__ = ["build_parser", "main"]

QUICK_ENV = "NUMPYRO_SUBSAMPLE_QUICK"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process stopped by Ctrl-C
_EPILOG = (
    "JAX's persistent compilation cache is on by default (in ~/.cache/numpyro_subsample/jax, "
    "or --compile-cache-dir; --no-compile-cache opts out): NumPyro's MCMC compiles its "
    "sampling loop again on every run, and with the cache a rerun finds it there instead of "
    "recompiling. See docs/cli_benchmarks.md for reruns on new data."
)


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage + message and exit with 2
        self.print_usage(sys.stderr)
        raise _UsageError(message)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``numpyro-subsample`` and its ``compare`` subcommand."""
    parser = _Parser(prog="numpyro-subsample",
                     description="Stochastic-gradient MCMC for NumPyro models.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    c = sub.add_parser(
        "compare",
        help="compare every available sampler with NUTS and HMCECS on one problem",
        description="Run every available sampler/estimator of the package, NumPyro NUTS on the "
        "full data (the reference) and NumPyro HMCECS on one problem; print a table and save "
        "CSV, JSON and a PNG plot in --out.",
        epilog=_EPILOG,
    )
    c.add_argument("--quick", action="store_true",
                   help=f"small run (N=10^4, short chains; about a minute); also ${QUICK_ENV}=1")
    c.add_argument("--dataset", default="default",
                   help="default (synthetic logistic regression with rare binary features and "
                   "high-leverage rows, N=5e4, d=21), synthetic (Gaussian-like logistic "
                   "regression, N=5e4, d=21), casp, covtype, covtype_subset20k, a9a, ijcnn1, "
                   "w8a, skin, or a file path (.npz, CASP .csv, LIBSVM)")
    c.add_argument("--data-dir", default=None,
                   help="folder holding the named data sets (default $NUMPYRO_SUBSAMPLE_DATA or "
                   "./data)")
    c.add_argument("--methods", default="default",
                   help="comma-separated method names, 'default' or 'all'; see --list-methods")
    c.add_argument("--list-methods", action="store_true", help="list available methods and exit")
    c.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    c.add_argument("--out", default="outputs",
                   help="output folder (default ./outputs); each method's run is saved in "
                   "<out>/runs as soon as it finishes")
    c.add_argument("--resume", action="store_true",
                   help="reuse the runs saved in <out>/runs for the same problem and settings "
                   "(e.g. after Ctrl-C) and run only the others")
    c.add_argument("--num-data", type=_positive_int, default=None,
                   help="N of the synthetic problem, or a random subset of a data set")
    c.add_argument("--subsample-size", type=_positive_int, default=None,
                   help="subsample size n (default min(1000, N/100))")
    c.add_argument("--num-samples", type=_positive_int, default=None,
                   help="draws per stochastic-gradient chain (default 20000; quick 3000)")
    c.add_argument("--nuts-samples", type=_positive_int, default=None,
                   help="draws of HMCECS and EnergyConservingHMC (default 1000; quick 300)")
    c.add_argument("--reference-samples", type=_positive_int, default=None,
                   help="draws of the NUTS reference (default 10000: enough to resolve errors "
                   "of about 0.05 posterior sd; cached on disk after the first run)")
    c.add_argument("--no-ksd", action="store_true", help="skip the KSD column (faster)")
    c.add_argument("--jobs", type=_positive_int, default=None,
                   help="processes: 2 (default) runs the NUTS reference and HMCECS in a second "
                        "process while the package's kernels run; 1 runs them one after the "
                        "other (longer, but timings not shared with a concurrent run)")
    c.add_argument("--cache-dir", default=None,
                   help="reference cache folder (default ~/.cache/numpyro_subsample/reference)")
    c.add_argument("--no-cache", action="store_true", help="recompute the NUTS reference")
    c.add_argument("--compile-cache-dir", default=None,
                   help="folder of JAX's persistent compilation cache, on by default "
                   "(default ~/.cache/numpyro_subsample/jax); reruns skip most compilation")
    c.add_argument("--no-compile-cache", action="store_true",
                   help="opt out: do not read or write the persistent compilation cache")
    c.add_argument("--optimized-xla", action="store_true",
                   help="with --quick: compile with XLA's full optimisations (slower to compile, "
                   "faster to run; --quick otherwise compiles fast, unoptimised code)")
    c.add_argument("--device", default=None,
                   help="JAX platform to run on: cpu, gpu (cuda, rocm) or tpu (default: JAX's "
                   "default device); the table's summary names the device")
    c.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="progress bars (default: on when stderr is a terminal)")
    c.add_argument("--no-progress", dest="progress", action="store_false")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``numpyro-subsample``; returns the exit status (2: bad usage or input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as err:
        print(f"numpyro-subsample: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as err:  # --help
        return int(err.code or 0)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.list_methods:
        for m in compare.available_methods().values():
            print(f"{m.name}{'' if m.default else '   (not in default)'}")
        return 0
    quick = args.quick or os.environ.get(QUICK_ENV, "") not in ("", "0")
    progress = (sys.stderr.isatty() and "CI" not in os.environ) if args.progress is None \
        else args.progress
    options = compare.CompareOptions(
        dataset=args.dataset, data_dir=args.data_dir, methods=args.methods, seed=args.seed,
        out=args.out, num_data=args.num_data, subsample_size=args.subsample_size,
        num_samples=args.num_samples, nuts_samples=args.nuts_samples,
        ref_samples=args.reference_samples, ksd=not args.no_ksd,
        jobs=args.jobs, cache_dir=args.cache_dir, use_cache=not args.no_cache,
        fast_compile=quick and not args.optimized_xla, quick=quick, progress=progress,
        device=args.device,
        resume=args.resume, command="numpyro-subsample " + " ".join(argv),
    )
    try:
        options.compile_cache_dir = compare.setup_compile_cache(
            args.compile_cache_dir, enabled=not args.no_compile_cache)
        result = compare.run_compare(options)
    except (ValueError, FileNotFoundError, PermissionError, IsADirectoryError) as err:
        print(f"numpyro-subsample: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        _report_interrupt(err, argv)
        return EXIT_INTERRUPTED
    print(compare.format_summary(result))
    return 0


def _report_interrupt(err: KeyboardInterrupt, argv: list[str]) -> None:
    """Print which runs were kept and the command that resumes."""
    resume = "numpyro-subsample " + " ".join(shlex.quote(a) for a in argv)
    if "--resume" not in argv:
        resume += " --resume"
    if isinstance(err, compare.CompareInterrupted):
        kept = (f"kept the finished runs ({', '.join(err.saved)}) in {err.folder}"
                if err.saved else f"no run had finished (nothing kept in {err.folder})")
    else:
        kept = "no run had finished"
    print(f"numpyro-subsample: interrupted; {kept}.\nresume with: {resume}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
