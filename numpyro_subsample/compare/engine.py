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

The options and intermediate results are in :mod:`~numpyro_subsample.compare.options`,
phases 3 and 4 in :mod:`~numpyro_subsample.compare.evaluation`.
"""

from __future__ import annotations

import resource
import time

from numpyro_subsample.compare.evaluation import describe, evaluate_runs
from numpyro_subsample.compare.options import (
    CompareInterrupted,
    CompareOptions,
    Plan,
    Runs,
    log,
)
from numpyro_subsample.compare.problems import (
    Method,
    available_methods,
    check_dataset,
    make_problem,
    select_methods,
)
from numpyro_subsample.compare.proxy_runs import run_proxy
from numpyro_subsample.compare.report import write_outputs
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
    log(f"finished in {time.perf_counter() - t0:.0f} s: {_cpu_since(cpu0):.0f} s of CPU in "
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
    log(f"problem: {p.name} ({p.task}), N={p.num_data}, d={p.dim}, n={p.subsample_size}, "
         f"device {plan.device}; {len(plan.methods)} methods: "
         f"{', '.join(m.name for m in plan.methods)}")
    outputs: dict = {}
    resumed = _resume(plan, outputs)
    todo = [m for m in plan.runs if m.name not in outputs]
    hmcecs = next((m for m in todo if m.kind == "hmcecs"), None)
    peer, reference, shared = None, None, None
    try:
        if plan.jobs > 1:
            log(f"reference: NUTS on the full data, {s.nuts_warmup} + {s.reference_samples} steps"
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
    log(f"reference: NUTS on the full data, {s.nuts_warmup} + {s.reference_samples} steps "
         "(cached after the first run)")
    t0 = time.perf_counter()
    ref = reference_run(plan.problem, s, progress=plan.options.progress,
                        **_reference_options(plan.options))
    log(f"reference: {'read from the cache' if ref[1] else 'done'} "
         f"({time.perf_counter() - t0:.0f} s)")
    return ref


def _join_peer(peer: Peer, hmcecs: Method | None, outputs: dict) -> tuple[RunOutput, bool]:
    """Wait for the worker process; its HMCECS output goes into ``outputs``."""
    log("waiting for the second process (NUTS reference / hmcecs)")
    t0 = time.perf_counter()
    reference, peer_hmcecs = peer.result()
    if hmcecs is not None:
        outputs[hmcecs.name] = peer_hmcecs
    log(f"reference: {'read from the cache' if reference[1] else 'done'}"
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
        log(f"[{i}/{len(todo)}] {m.name}: {_steps(m, plan.settings)}")
        try:
            if shared is None and m.kind in ("hmcecs", "sg", "proxy"):
                shared = fit_shared_proxy(plan.problem, seed=plan.options.seed,
                                          progress=plan.options.progress)
                log(f"      Laplace proxy fitted once for every method using one: "
                     f"{shared.seconds:.2f} s + {shared.compile_s:.2f} s compile, "
                     f"{shared.proxy.num_data_passes:.1f} data passes")
            outputs[m.name] = out = _run_one(m, plan, shared)
        except Exception as err:  # noqa: BLE001 - one method failing must not stop the others
            outputs[m.name] = err
            log(f"      {m.name} failed: {type(err).__name__}: {_first_line(err)}")
            continue
        try:
            where = plan.store.save(m, out)
        except OSError as err:
            where = f"not saved ({err})"
        log(f"done: {m.name} in {time.perf_counter() - t0:.1f} s; saved in {where}")
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
            log(f"resume: {m.name}: result found in {path} ({why}); skipped")
        elif why.startswith("stale"):
            log(f"resume: {m.name}: {path} is {why}; recomputing")
        elif why == "corrupt":
            log(f"resume: {m.name}: saved result is corrupt; recomputing")
    return found
