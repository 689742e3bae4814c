"""Timed runs of ``bench_realdata.py`` and ``bench_hierarchical.py`` (issue 15): a package
kernel under ``numpyro.infer.MCMC`` or independent draws from a proxy alone, with wall time
including compilation, data passes, the warnings raised and the run checks; and the rows'
accuracy against a NUTS reference, with the metrics of :mod:`numpyro_subsample.compare`.

The benchmarks use the public API: ``numpyro_subsample.__all__``, its ``datasets`` and the
comparison harness of the ``compare`` command (the names of ``numpyro_subsample.compare.__all__``:
timing, problems, references, ESS and errors). An import of anything else says why beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import arviz as az
import jax
import numpy as np
from numpyro.infer import MCMC

from numpyro_subsample import (
    EnergyConservingHMC,
    ModelData,
    build_potential,
    fit_laplace,
    fit_variational,
)
from numpyro_subsample.compare import CompileTimer, flatten_draws, min_ess, standardised_errors

# not in numpyro_subsample.compare.__all__: the compare command's own run checks, warning
# recorder and proxy draws, so that these rows are checked and drawn as its rows are
from numpyro_subsample.compare.checks import check_code, record_warnings, run_checks, shorten
from numpyro_subsample.compare.proxy_runs import proxy_draws
from numpyro_subsample.core.quadrature import integrable_site, integrate_local


@dataclass
class Run:
    """One row: draws grouped by chain (site → (C, S, ...)) and what the run cost."""

    method: str
    samples: dict = field(default_factory=dict)
    wall_s: float = math.nan  # everything, compilation included
    compile_s: float = math.nan
    prep_s: float = math.nan  # preprocessing (proxy fit, estimator, step size), compile incl.
    data_passes: float = math.nan
    step_size: float = math.nan
    warnings: list = field(default_factory=list)
    checks: str = ""
    divergences: int = 0
    error: str = ""
    extra: dict = field(default_factory=dict)


def _warning_texts(recorded) -> list[str]:
    """``Category: message`` (whitespace collapsed) of each distinct warning, with a count."""
    return [f"{c}: {' '.join(str(m).split())}" + (f" (x{k})" if k > 1 else "")
            for c, m, k in recorded]


def run_kernel(method: str, build: Callable, args: tuple, kwargs: dict, *, num_warmup: int,
               num_samples: int, num_chains: int = 1, seed: int = 0,
               mcmc_class: type = MCMC) -> Run:
    """Build the kernel, preprocess and run ``mcmc_class`` (NumPyro's ``MCMC`` or the
    package's; vectorized chains), all timed together
    from construction to draws in NumPy, compilation included; the warnings raised are
    recorded, then ``check_run`` is called (not timed).

    Data passes: the kernel's ``data_passes`` field; for a kernel without it that reports
    ``num_steps`` (EnergyConservingHMC), approximately the preprocessing's passes + (leapfrog
    steps + 1 Gibbs update) × m/N per iteration, the warm-up counted at the post-warm-up mean.
    """
    run = Run(method)
    with record_warnings() as recorded:
        try:
            with CompileTimer() as ct:
                t0 = time.perf_counter()
                kernel = build()
                kernel.preprocess(args, kwargs)
                run.prep_s = time.perf_counter() - t0
                mcmc = mcmc_class(kernel, num_warmup=num_warmup, num_samples=num_samples,
                            num_chains=num_chains, chain_method="vectorized",
                            progress_bar=False)
                fields = (("num_steps",) if isinstance(kernel, EnergyConservingHMC)
                          else ("data_passes",))
                mcmc.run(jax.random.PRNGKey(seed), *args, extra_fields=fields, **kwargs)
                run.samples = {k: np.asarray(v)
                               for k, v in mcmc.get_samples(group_by_chain=True).items()}
                run.wall_s = time.perf_counter() - t0
            run.compile_s = ct.seconds
        except Exception as err:  # noqa: BLE001 - one method failing must not stop the others
            run.error = f"{type(err).__name__}: {shorten(str(err), 300)}"
            run.extra["traceback"] = traceback.format_exc()
    run.warnings = _warning_texts(recorded)
    if run.error:
        return run
    ef = mcmc.get_extra_fields(group_by_chain=True)
    if "data_passes" in ef:
        run.data_passes = float(np.max(np.asarray(ef["data_passes"])[..., -1]))
    elif "num_steps" in ef:
        pre = kernel.preprocessed
        m, N = getattr(pre, "subsample_size", None), pre.potential.num_data
        if m is not None and hasattr(pre, "data_passes"):
            per_chain = (np.asarray(ef["num_steps"], float) + 1.0).sum(-1) * m / N
            run.data_passes = float(pre.data_passes) + float(
                per_chain.max() * (num_warmup + num_samples) / num_samples)
            run.extra["data_passes_note"] = "approximate (warm-up at the post-warm-up mean)"
    if "diverging" in ef:
        run.divergences = int(np.sum(np.asarray(ef["diverging"])))
    # the preprocessing's data passes by stage (SG kernels: Preprocessed.cost)
    run.extra["cost"] = [(s, float(p)) for s, p in getattr(kernel.preprocessed, "cost", ())]
    try:
        run.step_size = float(kernel.step_size)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        pass
    checks = run_checks(mcmc)
    run.checks = check_code(checks)
    run.extra["checks"] = checks
    return run


def run_proxy(method: str, kind: str, model: Callable, args: tuple, kwargs: dict, *,
              num_draws: int, seed: int = 0) -> Run:
    """Independent draws from the proxy alone (no MCMC): N(θ̂, Σ̂) of ``kind`` ``"laplace"``
    (:func:`~numpyro_subsample.fit_laplace`) or ``"variational"``
    (:func:`~numpyro_subsample.fit_variational`, its defaults), constrained like the model's
    draws (``compare.proxy_runs.proxy_draws``), a scalar local site integrated out as the
    kernels do (:mod:`numpyro_subsample.core.quadrature`); timed from the model trace to the
    draws, compilation included."""
    run = Run(method)
    k_model, k_fit, k_draw = jax.random.split(jax.random.PRNGKey(seed), 3)
    with record_warnings() as recorded:
        try:
            with CompileTimer() as ct:
                t0 = time.perf_counter()
                data = ModelData.from_args(args, kwargs)
                potential = build_potential(model, data, k_model)
                if integrable_site(potential) is not None:  # as SGLD / SGHMC / SGNHT do
                    potential = integrate_local(potential)
                fit = fit_laplace if kind == "laplace" else fit_variational
                proxy = fit(potential, data, k_fit, store_datum_grads=False)
                jax.block_until_ready(proxy.scale_tril)
                run.prep_s = time.perf_counter() - t0
                draws = proxy_draws(potential, data, proxy.centre, proxy.scale_tril, k_draw,
                                    num_draws)
                run.samples = {k: np.asarray(v)[None] for k, v in draws.items()}
                run.wall_s = time.perf_counter() - t0
            run.compile_s = ct.seconds
            run.data_passes = float(proxy.num_data_passes)
        except Exception as err:  # noqa: BLE001
            run.error = f"{type(err).__name__}: {shorten(str(err), 300)}"
            run.extra["traceback"] = traceback.format_exc()
    run.warnings = _warning_texts(recorded)
    run.checks = "n/a"
    return run


# -- accuracy -----------------------------------------------------------------------------------
def split_rhat(chains: np.ndarray) -> float:
    """Largest rank-normalised split R-hat (ArviZ) over the columns of (C, S, D) draws."""
    r = az.rhat(az.convert_to_dataset({"x": chains}))["x"].values
    return float(np.nanmax(r)) if np.isfinite(r).any() else math.nan


def multi_chain_min_ess(chains: np.ndarray) -> float:
    """Smallest bulk ESS (ArviZ) over the columns of (C, S, D) draws, chains pooled by ArviZ."""
    e = az.ess(az.convert_to_dataset({"x": chains}), method="bulk")["x"].values
    return float(np.nanmin(e)) if np.isfinite(e).any() else math.nan


def accuracy(run: Run, ref_flat: np.ndarray, sites) -> dict:
    """Worst-coordinate errors (posterior-sd units) of the pooled draws against the reference,
    min ESS, and (with several chains) split R-hat."""
    if run.error or not run.samples:
        return {}
    chains = np.stack([flatten_draws({k: run.samples[k][c] for k in sites}, sites)
                       for c in range(next(iter(run.samples.values())).shape[0])])
    pooled = chains.reshape(-1, chains.shape[-1])
    if not np.all(np.isfinite(pooled)):
        return {"mean_err": math.inf, "sd_log_ratio": math.inf, "min_ess": math.nan,
                "nonfinite_draws": int((~np.isfinite(pooled)).any(1).sum())}
    mean_err, sd_err = standardised_errors(pooled, ref_flat)
    out = {"mean_err": mean_err, "sd_log_ratio": sd_err}
    if chains.shape[0] > 1:
        out["min_ess"] = multi_chain_min_ess(chains)
        out["rhat"] = split_rhat(chains)
    else:
        out["min_ess"] = min_ess(chains[0])
    return out


def fmt(x, spec: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, spec)


def warnings_cell(run: Run, limit: int = 160) -> str:
    """The warnings of a row for a markdown cell."""
    if run.error:
        return f"**failed**: {run.error}"[:limit]
    if not run.warnings:
        return "none"
    text = "; ".join(run.warnings).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def json_default(x):
    """JSON for NumPy scalars and arrays (and ``str`` of anything else)."""
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def write_results(res: dict, script: str, markdown: Callable[[dict, str], str], *, quick: bool,
                  out: str | None, md: str | None, argv: list[str] | None,
                  folder: Path) -> Path:
    """Write ``res`` as JSON (``out``, default ``folder/<script>[_quick].json``), print its
    markdown (``markdown(res, command)``) and write it to ``md`` if given; returns the JSON
    path."""
    folder.mkdir(exist_ok=True)
    path = Path(out) if out else folder / f"{script}{'_quick' if quick else ''}.json"
    path.write_text(json.dumps(res, indent=1, default=json_default))
    cmd = f"python benchmarks/{script}.py " + " ".join(argv if argv else sys.argv[1:])
    text = markdown(res, cmd.strip())
    print(text)
    if md:
        Path(md).parent.mkdir(parents=True, exist_ok=True)
        Path(md).write_text(text)
    return path


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--device PLATFORM`` to a benchmark's parser: the script runs on the first device
    of JAX's ``PLATFORM`` (``cpu``, ``gpu``, ``cuda``, ``rocm``, ``tpu``; default JAX's default
    device), which is printed on stdout above the tables; ``args.device`` holds its
    description for the results (e.g. ``"cpu (TFRT_CPU_0, 1 of 1)"``). An unknown platform is
    a usage error naming the platforms present."""
    parser.add_argument("--device", type=_select_device, default="", metavar="PLATFORM",
                        help="JAX platform to run on: cpu, gpu (cuda, rocm) or tpu (default: "
                        "JAX's default device); reported with the tables")


def parse_args_or_run_worker(parser: argparse.ArgumentParser, argv, worker: Callable[[dict], None]):
    """Parse a benchmark's arguments, with ``--device`` (:func:`add_device_option`) and a hidden
    ``--worker SPEC``: the benchmark's fresh process for one method, which runs
    ``worker(json.loads(SPEC))`` and returns None; otherwise the parsed arguments."""
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    add_device_option(parser)
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return None
    return args


def _select_device(platform: str) -> str:
    try:
        devices = jax.devices(platform or None)
    except RuntimeError as err:
        present = sorted({d.platform for d in jax.devices()})
        raise argparse.ArgumentTypeError(
            f"JAX has no platform {platform!r} here ({str(err).splitlines()[0]}); platforms "
            f"present: {present} (a GPU needs jax installed with its CUDA or ROCm plugin)"
        ) from None
    jax.config.update("jax_default_device", devices[0])
    if platform:  # worker processes the script starts run there too
        os.environ["JAX_PLATFORMS"] = devices[0].platform
    text = f"{devices[0].platform} ({devices[0]}, 1 of {len(devices)})"
    print(f"device: {text}", flush=True)
    return text
