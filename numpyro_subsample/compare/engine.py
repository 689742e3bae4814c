"""The engine of ``numpyro-subsample compare``: plan, run, evaluate, write.

:func:`run_compare` chains four phases, each a named function:

1. :func:`plan_compare`: the problem, the chain settings, the methods and the store of saved
   runs, all checked before anything runs (:class:`Plan`);
2. :func:`run_methods`: the NUTS reference (cached on disk; in a worker process with
   ``jobs=2``) and every other method, each saved in ``<out>/runs`` as it finishes, with a
   line on stderr as each starts and ends (:class:`Runs`);
3. :func:`evaluate_runs`: the table's rows and the plot's curves against the reference: errors
   in posterior sds, ESS, the KSD on the same number of draws for every row, and the flags;
4. :func:`describe` + :func:`~numpyro_subsample.compare.report.write_outputs`: the settings,
   machine and device, and the files.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from numpyro_subsample.compare.checks import FAR_SD, check_code, row_flags
from numpyro_subsample.compare.metrics import (
    FullDataScore,
    Result,
    Trace,
    evaluate,
    flatten_draws,
    reference_mc_error,
)
from numpyro_subsample.compare.problems import (
    Method,
    Problem,
    available_methods,
    check_dataset,
    make_problem,
    select_methods,
)
from numpyro_subsample.compare.proxy_runs import run_proxy
from numpyro_subsample.compare.report import machine_info, write_outputs
from numpyro_subsample.compare.runners import (
    InterruptLatch,
    Peer,
    RunOutput,
    Settings,
    SharedProxy,
    fit_shared_proxy,
    reference_run,
    run_hmcecs,
    run_kernel,
    settings_for,
    start_peer,
)
from numpyro_subsample.compare.store import RunStore, check_out_dir
from numpyro_subsample.compare.timing import use_device, xla_fast_compile

__all__ = [
    "CompareInterrupted",
    "CompareOptions",
    "Plan",
    "Runs",
    "describe",
    "evaluate_runs",
    "plan_compare",
    "run_compare",
    "run_methods",
]


@dataclass
class CompareOptions:
    """Settings of :func:`run_compare` (the flags of ``numpyro-subsample compare``).

    ``jobs``: 2 (default) runs the reference and HMCECS in a worker process while this one
    runs the other methods, 1 runs everything here (cleaner timings, longer wall time);
    ``fast_compile``: XLA without most optimisations (default: ``quick``);
    ``compile_cache_dir``: the persistent compilation cache in use (from
    :func:`~numpyro_subsample.compare.timing.setup_compile_cache`), recorded and passed to the
    worker; ``device``: JAX platform to run on (``"cpu"``, ``"gpu"``, ``"tpu"``; default
    JAX's); ``resume``: reuse the runs saved in ``<out>/runs`` for the same problem and
    settings; ``command``: recorded.
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
    ref_samples: int | None = None
    ksd: bool = True
    jobs: int | None = None
    cache_dir: str | None = None
    use_cache: bool = True
    compile_cache_dir: str | None = None
    fast_compile: bool | None = None
    device: str | None = None
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


@dataclass
class Plan:
    """What :func:`run_compare` will do, checked before anything runs."""

    options: CompareOptions
    problem: Problem
    settings: Settings
    methods: list[Method]
    jobs: int
    fast: bool
    store: RunStore
    out: Path
    device: str

    @property
    def runs(self) -> list[Method]:
        """The methods other than the reference."""
        return [m for m in self.methods if m.kind != "nuts"]


@dataclass
class Runs:
    """What :func:`run_methods` leaves: the reference, each method's output (or the error it
    raised), the shared Laplace proxy, and which runs were cached or resumed."""

    reference: RunOutput
    cached: bool
    outputs: dict = field(default_factory=dict)
    shared: SharedProxy | None = None
    resumed: list = field(default_factory=list)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_compare(options: CompareOptions | None = None) -> dict:
    """Run the comparison; returns ``{"rows", "curves", "meta", "paths"}``.

    Raises ``ValueError``/``FileNotFoundError`` for unknown methods, data sets or devices, an
    invalid subsample size or an ``out`` that is not a writable folder, before running
    anything. A method that fails is reported as ``FAILED`` with its error; the others still
    run. Each finished run is saved in ``<out>/runs`` at once; on Ctrl-C,
    :class:`CompareInterrupted` (a ``KeyboardInterrupt``) lists them.
    """
    o = options or CompareOptions()
    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    fast = o.quick if o.fast_compile is None else bool(o.fast_compile)
    with use_device(o.device) as device, xla_fast_compile(fast):
        plan = plan_compare(o, fast, device)
        try:
            with InterruptLatch().installed() as latch:
                runs = run_methods(plan, latch)
                rows, curves, mc = evaluate_runs(plan, runs)
        except CompareInterrupted:
            raise
        except KeyboardInterrupt:  # while evaluating: every run is saved
            raise CompareInterrupted([m.name for m in plan.runs if plan.store.has(m)],
                                     plan.store.folder) from None
        meta = describe(plan, runs, rows, mc)
        paths = write_outputs(plan.out, rows, curves, meta)
    _log(f"finished in {time.perf_counter() - t0:.0f} s: {_cpu_since(cpu0):.0f} s of CPU in "
         f"this process, {_cpu_children():.0f} s in the second")
    return {"rows": rows, "curves": curves, "meta": meta, "paths": paths}


def _cpu_since(before) -> float:
    now = resource.getrusage(resource.RUSAGE_SELF)
    return now.ru_utime + now.ru_stime - before.ru_utime - before.ru_stime


def _cpu_children() -> float:
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ch.ru_utime + ch.ru_stime


def plan_compare(o: CompareOptions, fast: bool, device: str) -> Plan:
    """Check the options and build the problem, settings, methods and run store."""
    methods = select_methods(available_methods(), o.methods, o.quick)
    check_dataset(o.dataset)
    out = check_out_dir(o.out)
    problem = make_problem(o.dataset, num_data=o.num_data, subsample_size=o.subsample_size,
                           data_dir=o.data_dir, seed=o.seed, quick=o.quick)
    settings = settings_for(o.quick, num_samples=o.num_samples, nuts_samples=o.nuts_samples,
                            ref_samples=o.ref_samples, ksd=o.ksd)
    store = RunStore.for_problem(out, problem, settings, seed=o.seed, fast_compile=fast)
    jobs = o.jobs or 2
    return Plan(o, problem, settings, methods, jobs, fast, store, out, device)


# -- phase 2: the runs --------------------------------------------------------------------------
def run_methods(plan: Plan, latch: InterruptLatch) -> Runs:
    """Run the reference and every other method (see :func:`run_compare`)."""
    o, p, s = plan.options, plan.problem, plan.settings
    _log(f"problem: {p.name} ({p.task}), N={p.num_data}, d={p.dim}, n={p.subsample_size}, "
         f"device {plan.device}; {len(plan.methods)} methods: "
         f"{', '.join(m.name for m in plan.methods)}")
    outputs: dict = {}
    resumed = _resume(plan, outputs)
    todo = [m for m in plan.runs if m.name not in outputs]
    hmcecs = next((m for m in todo if m.kind == "hmcecs"), None)
    peer, reference, shared = None, None, None
    try:
        if plan.jobs > 1:
            _log(f"reference: NUTS on the full data, {s.nuts_warmup} + {s.reference_samples} steps"
                 f"{' and hmcecs' if hmcecs else ''}, in a second process")
            peer = start_peer(p, s, with_hmcecs=hmcecs is not None,
                              compile_cache_dir=o.compile_cache_dir, fast_compile=plan.fast,
                              store=plan.store, hmcecs_method=hmcecs, progress=o.progress,
                              device=o.device, **_reference_options(o))
            todo = [m for m in todo if m is not hmcecs]
        else:
            reference = _reference(plan)
        shared = _run_local(plan, todo, outputs, latch)
        latch.check()
        if peer is not None:
            reference = _join_peer(peer, hmcecs, outputs)
    except KeyboardInterrupt:
        if peer is not None:
            peer.terminate()
        raise CompareInterrupted([m.name for m in plan.runs if plan.store.has(m)],
                                 plan.store.folder) from None
    except BaseException:
        if peer is not None:
            peer.terminate()
        raise
    return Runs(reference[0], reference[1], outputs, shared, resumed)


def _reference_options(o: CompareOptions) -> dict:
    return {"seed": o.seed, "cache_dir": o.cache_dir, "use_cache": o.use_cache}


def _reference(plan: Plan) -> tuple[RunOutput, bool]:
    """The NUTS reference in this process, announced and timed on stderr."""
    s = plan.settings
    _log(f"reference: NUTS on the full data, {s.nuts_warmup} + {s.reference_samples} steps "
         "(cached after the first run)")
    t0 = time.perf_counter()
    ref = reference_run(plan.problem, s, progress=plan.options.progress,
                        **_reference_options(plan.options))
    _log(f"reference: {'read from the cache' if ref[1] else 'done'} "
         f"({time.perf_counter() - t0:.0f} s)")
    return ref


def _join_peer(peer: Peer, hmcecs: Method | None, outputs: dict) -> tuple[RunOutput, bool]:
    """Wait for the worker process; its HMCECS output goes into ``outputs``."""
    _log("waiting for the second process (NUTS reference / hmcecs)")
    t0 = time.perf_counter()
    reference, peer_hmcecs = peer.result()
    if hmcecs is not None:
        outputs[hmcecs.name] = peer_hmcecs
    _log(f"reference: {'read from the cache' if reference[1] else 'done'}"
         f" (waited {time.perf_counter() - t0:.0f} s)")
    return reference


def _run_local(plan: Plan, todo: list[Method], outputs: dict,
               latch: InterruptLatch) -> SharedProxy | None:
    """Run ``todo`` in this process, one line on stderr as each starts and ends; returns the
    shared Laplace proxy (fitted before the first method that uses one)."""
    shared = None
    for i, m in enumerate(todo, 1):
        latch.check()
        t0 = time.perf_counter()
        _log(f"[{i}/{len(todo)}] {m.name}: {_steps(m, plan.settings)}")
        try:
            if shared is None and m.kind in ("hmcecs", "sg", "proxy"):
                shared = fit_shared_proxy(plan.problem, seed=plan.options.seed,
                                          progress=plan.options.progress)
                _log(f"      Laplace proxy fitted once for every method using one: "
                     f"{shared.seconds:.2f} s + {shared.compile_s:.2f} s compile, "
                     f"{shared.proxy.num_data_passes:.1f} data passes")
            outputs[m.name] = out = _run_one(m, plan, shared)
        except Exception as err:  # noqa: BLE001 - one method failing must not stop the others
            outputs[m.name] = err
            _log(f"      {m.name} failed: {type(err).__name__}: {_first_line(err)}")
            continue
        try:
            where = plan.store.save(m, out)
        except OSError as err:
            where = f"not saved ({err})"
        _log(f"done: {m.name} in {time.perf_counter() - t0:.1f} s; saved in {where}")
    return shared


def _steps(m: Method, s: Settings) -> str:
    if m.kind == "proxy":
        return f"{s.sg_samples} independent draws"
    if m.kind == "sg":
        return f"{s.sg_warmup} + {s.sg_samples} steps"
    return f"{s.nuts_warmup} + {s.nuts_samples} steps"


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0][:200] if str(err) else ""


def _run_one(m: Method, plan: Plan, shared: SharedProxy | None) -> RunOutput:
    p, s, o = plan.problem, plan.settings, plan.options
    if m.kind == "hmcecs":
        return run_hmcecs(p, s, shared, seed=o.seed, progress=o.progress)
    if m.kind == "proxy":
        return run_proxy(m.options["proxy"], p, s, shared, seed=o.seed, progress=o.progress)
    return run_kernel(m, p, s, shared=shared, seed=o.seed, progress=o.progress)


def _resume(plan: Plan, outputs: dict) -> list[str]:
    """Load the saved runs into ``outputs`` (with ``resume``); their names."""
    if not plan.options.resume:
        return []
    found = []
    for m in plan.runs:
        out, why = plan.store.load(m, RunOutput)
        path = plan.store.paths(m.name)[0]
        if out is not None:
            outputs[m.name] = out
            found.append(m.name)
            _log(f"resume: {m.name}: result found in {path} ({why}); skipped")
        elif why.startswith("stale"):
            _log(f"resume: {m.name}: {path} is {why}; recomputing")
        elif why == "corrupt":
            _log(f"resume: {m.name}: saved result is corrupt; recomputing")
    return found


# -- phase 3: evaluation ------------------------------------------------------------------------
def evaluate_runs(plan: Plan, runs: Runs) -> tuple[list[dict], dict, dict]:
    """The table's rows, the plot's curves and the reference's Monte Carlo error.

    Every row's KSD uses the same number of thinned draws: the smallest of
    ``settings.ksd_draws`` and every run's draw count; the reference's own value, on as many
    draws, is the floor. A row is flagged ``mean``/``sd`` when its error exceeds
    :data:`~numpyro_subsample.compare.checks.FAR_SD` or the reference's Monte Carlo error,
    whichever is larger.
    """
    _log("evaluating: errors against the reference, ESS"
         + (", KSD" if plan.settings.ksd_draws else ""))
    sites = sorted(runs.reference.samples)
    ref = flatten_draws(runs.reference.samples, sites)
    mean_mc, sd_mc = reference_mc_error(ref)
    ev = _Evaluator(plan, sites, ref, far=max(FAR_SD, mean_mc), ksd_draws=_ksd_count(plan, runs))
    note = "cached reference: timings from the run that made it" if runs.cached else ""
    rows, curves = [ev.row(None, runs.reference, note).row()], {}
    for m in plan.runs:
        out = runs.outputs.get(m.name)
        if out is None:
            continue
        if isinstance(out, BaseException):
            rows.append(_failed(m, out))
            continue
        try:
            res = ev.row(m, out, "resumed: saved run" if m.name in runs.resumed else "")
        except Exception as err:  # noqa: BLE001 - one row failing must not lose the others
            rows.append(_failed(m, err))
            continue
        rows.append(res.row())
        curves[res.method] = {"name": m.name, **res.curve}
    mc = {"mean_err": mean_mc, "sd_log_ratio": sd_mc, "far": ev.far, "ksd_draws": ev.ksd_draws}
    return rows, curves, mc


def _ksd_count(plan: Plan, runs: Runs) -> int:
    """The common number of thinned draws of every row's KSD (0: no KSD)."""
    if not plan.settings.ksd_draws:
        return 0
    sizes = [len(next(iter(o.samples.values()))) for o in runs.outputs.values()
             if isinstance(o, RunOutput) and o.samples]
    sizes.append(len(next(iter(runs.reference.samples.values()))))
    return int(min([plan.settings.ksd_draws, *sizes]))


class _Evaluator:
    """Builds one :class:`~numpyro_subsample.compare.metrics.Result` per run."""

    def __init__(self, plan: Plan, sites: list[str], ref: np.ndarray, *, far: float,
                 ksd_draws: int) -> None:
        self.plan, self.sites, self.ref, self.far = plan, sites, ref, far
        self.ksd_draws = ksd_draws
        self.score = (FullDataScore(plan.problem.model, plan.problem.data())
                      if ksd_draws else None)

    def row(self, m: Method | None, out: RunOutput, note: str = "") -> Result:
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
        trace = Trace(flatten_draws(out.samples, self.sites), np.asarray(out.passes, float),
                      np.asarray(out.seconds, float))
        evaluate(res, trace, self.ref, score=self.score, ksd_draws=self.ksd_draws,
                 checkpoints=self.plan.settings.checkpoints)
        res.flags = row_flags(checks=res.checks, warning_messages=res.warning_messages,
                              mean_err=res.mean_err, sd_log_ratio=res.sd_log_ratio,
                              far=self.far)
        return res


def _failed(m: Method, err: BaseException) -> dict:
    res = Result(m.title, name=m.name, status="failed", flags="FAILED",
                 note=f"{type(err).__name__}: {_first_line(err)}")
    _log(f"note: {m.title} failed: {res.note}")
    return res.row()


# -- phase 4: what is recorded ------------------------------------------------------------------
def describe(plan: Plan, runs: Runs, rows: list[dict], mc: dict) -> dict:
    """``compare.json``'s ``meta``: the command, problem, settings, reference, KSD, device
    and machine."""
    o, p, shared = plan.options, plan.problem, runs.shared
    ref_row = rows[0]
    return {
        "command": o.command, "dataset": p.name, "task": p.task, "num_data": p.num_data,
        "dim": p.dim, "subsample_size": p.subsample_size, "problem_info": _plain_info(p.info),
        "seed": o.seed, "quick": bool(o.quick), "settings": asdict(plan.settings),
        "reference": {"method": "NUTS, full data, 1 chain", "cached": runs.cached,
                      "draws": len(next(iter(runs.reference.samples.values()))),
                      "min_ess": ref_row.get("min_ess"),
                      "cost": {"passes": ref_row.get("data_passes"),
                               "wall_s": _wall(ref_row)},
                      "mc_error": {"mean_err": mc["mean_err"],
                                   "sd_log_ratio": mc["sd_log_ratio"]}},
        "far_sd": mc["far"],
        "ksd": _ksd_meta(mc["ksd_draws"], ref_row.get("ksd")),
        "shared_proxy": None if shared is None else {
            "kind": shared.proxy.kind, "seconds": shared.seconds, "compile_s": shared.compile_s,
            "data_passes": shared.proxy.num_data_passes},
        "runs": {"folder": str(plan.store.folder), "resumed": runs.resumed},
        "compile_cache": o.compile_cache_dir, "fast_compile": plan.fast, "jobs": plan.jobs,
        "device": plan.device, "machine": machine_info(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _wall(row: dict) -> float | None:
    parts = [row.get(k) for k in ("preprocessing_s", "sampling_s", "compile_s")]
    return None if any(v is None for v in parts) else float(sum(parts))


def _ksd_meta(draws: int, floor: float | None) -> dict:
    if not draws:
        return {"draws": 0, "floor": None, "text": "KSD disabled (--no-ksd)"}
    fl = "n/a" if floor is None or not math.isfinite(floor) else f"{floor:.3g}"
    return {"draws": draws, "floor": floor,
            "text": f"IMQ kernel Stein discrepancy of {draws} evenly thinned draws per row, "
                    f"full-data scores; the reference's own value ({fl}) is the floor: rows "
                    "near it cannot be ranked by KSD"}


def _plain_info(info: dict) -> dict:
    """``problem.info`` with arrays as lists (for ``compare.json``)."""
    return {k: (np.asarray(v).tolist() if isinstance(v, (np.ndarray, tuple)) else v)
            for k, v in info.items() if isinstance(v, (int, float, str, tuple, np.ndarray))}
