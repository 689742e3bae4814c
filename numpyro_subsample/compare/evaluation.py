"""Phases 3 and 4 of ``numpyro-subsample compare``: the rows and curves of every run against
the NUTS reference (:func:`evaluate_runs`) and the record of the settings (:func:`describe`)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict

import numpy as np

from numpyro_subsample.compare.checks import FAR_SD, check_code, row_flags, shorten
from numpyro_subsample.compare.metrics import (
    FullDataScore,
    Result,
    Trace,
    evaluate,
    flatten_draws,
    reference_mc_error,
)
from numpyro_subsample.compare.options import Plan, Runs, log
from numpyro_subsample.compare.problems import Method
from numpyro_subsample.compare.report import machine_info
from numpyro_subsample.compare.runners import RunOutput

__all__ = ["describe", "evaluate_runs"]


def evaluate_runs(plan: Plan, runs: Runs) -> tuple[list[dict], dict, dict]:
    """The table's rows, the plot's curves and the reference's Monte Carlo error.

    Every row's KSD uses the same number of thinned draws: the smallest of
    ``settings.ksd_draws`` and every run's draw count; the reference's own value, on as many
    draws, is the floor. A row is flagged ``mean``/``sd`` when its error exceeds
    :data:`~numpyro_subsample.compare.checks.FAR_SD` or the reference's Monte Carlo error,
    whichever is larger.
    """
    log("evaluating: errors against the reference, ESS"
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
        trace = Trace(draws=flatten_draws(out.samples, self.sites),
                      passes=np.asarray(out.passes, float), seconds=np.asarray(out.seconds, float))
        evaluate(res, trace, self.ref, score=self.score, ksd_draws=self.ksd_draws,
                 checkpoints=self.plan.settings.checkpoints)
        res.flags = row_flags(checks=res.checks, warning_messages=res.warning_messages,
                              mean_err=res.mean_err, sd_log_ratio=res.sd_log_ratio,
                              far=self.far)
        return res


def _failed(m: Method, err: BaseException) -> dict:
    res = Result(m.title, name=m.name, status="failed", flags="FAILED",
                 note=f"{type(err).__name__}: {shorten(str(err), 200)}")
    log(f"note: {m.title} failed: {res.note}")
    return res.row()


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
