"""The markdown report of ``bench_bpmf.py``: RMSE at equal wall or CPU budgets, the table and
the RMSE-against-time curves.
"""

from __future__ import annotations

import numpy as np
from _bpmf_model import SIGMA
from _runs import fmt


def at_budget(row: dict, B: float, clock: str = "times") -> dict:
    """The row's state at wall (``clock="times"``) or CPU (``"cpu_times"``) time B: its last
    checkpoint stamped ≤ B (empty if none)."""
    t = np.asarray(row[clock])
    k = int(np.searchsorted(t, B, side="right")) - 1
    if k < 0:
        return {}
    out = {"rmse": float(row["rmse"][k]), "passes": float(row["passes"][k]),
           "time": float(t[k]), "draw": k}
    key = "time" if clock == "times" else "cpu_time"
    zv = [z for z in row.get("zv", []) if z[key] <= B]
    if zv:
        out["zv"] = zv[-1]
    return out


def _warn_cell(row: dict, limit: int = 400) -> str:
    w = "; ".join(row.get("warnings", [])).replace("|", "/")
    return (w[: limit - 1] + "…" if len(w) > limit else w) or "none"


def markdown(res: dict, cmd: str) -> str:
    cfg, budgets = res["config"], res["budgets"]
    out = ["## BPMF: SGLD-CV against SGLD at equal wall time (`bench_bpmf.py`)", "",
           f"Command: `{cmd}` ({res['date']}). Machine: {res['machine']}; load average at "
           f"start {res['load_start']}, at end {res['load_end']}. Total {res['total_s']:.0f} s.",
           "",
           f"Synthetic ratings: L = {cfg['L']} users × M = {cfg['M']} items, rank D = "
           f"{cfg['D']}, {100 * cfg['density']:g} % observed ({cfg['num_ratings']} ratings), "
           f"σ = {SIGMA}, {cfg['N_train']} training and {cfg['N_test']} test ratings; "
           f"d = {cfg['d']}; fixed prior precisions (s = D^-1/4, not the paper's "
           f"Gaussian-Wishart hyperpriors); n = {cfg['subsample_size']} per step; "
           f"{cfg['chains']} chains × {cfg['steps']} steps, {cfg['draws']} kept per chain. "
           f"Test RMSE of the truth U*ᵀV*: {res['oracle_rmse']:.4f}; of predicting 0: "
           f"{res['zero_rmse']:.4f}.", "",
           "Equal budgets per proxy: wall B and CPU B_cpu = the smaller totals of its two "
           "default SG rows (" + "; ".join(f"{v}: B = {b[0]:.1f} s, B_cpu = {b[1]:.1f} s"
                                           for v, b in budgets.items())
           + "). RMSE of the posterior-mean prediction (window: last half of the draws so far) "
           "at the last checkpoint within the budget; – if none. Proxy [hessian]: the package's "
           "default above d = 2000 (Hessian curvature, Hutchinson diagonal); [fisher]: "
           "`proxy_kwargs={'curvature': 'fisher'}` (the empirical Fisher).", "",
           "| method | RMSE at B | steps by B | RMSE at B_cpu | RMSE at end | wall s | CPU s "
           "| setup s | sampling s | data passes (end) | step h | warnings |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["sg_rows"]:
        B, Bc = budgets[r["proxy"]]
        b, bc = at_budget(r, B), at_budget(r, Bc, "cpu_times")
        steps_b = (b["draw"] + 1) * r["steps"] // len(r["times"]) if b else 0
        setup = r["prep_s"] + r["chain_compile_s"]
        out.append(
            f"| {r['method']} | {fmt(b.get('rmse'), '.4f')} | {steps_b} | "
            f"{fmt(bc.get('rmse'), '.4f')} | {float(r['rmse'][-1]):.4f} | {r['wall_s']:.1f} | "
            f"{r['cpu_s']:.1f} | {setup:.1f} | {r['sampling_s']:.1f} | "
            f"{float(r['passes'][-1]):.0f} | {r['step_size']:.3g} | {_warn_cell(r)} |")
    for r in res["sg_rows"]:
        B, Bc = budgets[r["proxy"]]
        z, zc, zl = (at_budget(r, B).get("zv"), at_budget(r, Bc, "cpu_times").get("zv"),
                     r["zv"][-1])
        out.append(
            f"| {r['method']} + local ZV-1 | {fmt(z['rmse'] if z else None, '.4f')} | – | "
            f"{fmt(zc['rmse'] if zc else None, '.4f')} | {zl['rmse']:.4f} | {zl['time']:.1f} | "
            f"{zl['cpu_time']:.1f} | – | – | {zl['passes']:.0f} | {r['step_size']:.3g} | "
            f"median Var g / Var g̃ {fmt(z['median_vr'] if z else None, '.2f')} at B, "
            f"{zl['median_vr']:.2f} at end |")
    B_all = min(b[0] for b in budgets.values())
    for r in res["other_rows"]:
        B = budgets[r["proxy"]][0] if "proxy" in r else B_all
        b = at_budget(r, B) if "times" in r else {}
        rb = (fmt(b.get("rmse"), ".4f") if "times" in r
              else (f"{r['rmse_final']:.4f}" if r["wall_s"] <= B else "–"))
        out.append(f"| {r['method']} | {rb} | – | – | {r['rmse_final']:.4f} | "
                   f"{r['wall_s']:.1f} | – | – | – | {fmt(r.get('data_passes'), '.0f')} | – | "
                   f"{_warn_cell(r)} |")
    zp = next(r["zv_package"] for r in res["sg_rows"] if "zv_package" in r)
    zp_text = (f"raised {zp['error']}" if "error" in zp else
               f"ran: RMSE {zp['rmse']:.4f} (raw {zp['raw_rmse']:.4f}), median Var g / Var g̃ "
               f"{zp['median_vr']:.3g}, {zp['seconds']:.1f} s")
    out.append(f"| ZV degree 1, package (`post.zv.zv_fit` on the first default run's draws) | "
               f"{zp_text.replace('|', '/')} | | | | | | | | | | |")
    out += ["", "Setup = kernel construction + preprocessing + chain compilation; rows at a "
            "common step h = m·h_CV share the preprocessing of their estimator's default row "
            "and are charged its time. CPU s: process CPU seconds (the machine is shared; "
            "CPU time does not count the time other processes held the cores). Local ZV-1: "
            "per test rating, the 2D gradient coordinates of U_l and V_m as control variates "
            "(module docstring); its times add the post-processing. Proxy and MAP rows: "
            "predictions at a point or averaged over independent proxy draws (no chain).", ""]
    for r in res["sg_rows"]:
        if "(default h)" in r["method"]:
            pi = r["proxy_info"]
            out.append(f"- {r['method']}: measured noise v = {r['noise']:.3g} (largest "
                       f"eigenvalue, whitened), whitened curvature μ = "
                       f"{r['whitened_curvature_mu']:.2f}; preprocessing {r['prep_s']:.1f} s "
                       f"wall, {r['prep_cpu_s']:.1f} s CPU ({r['preprocessing_passes']:.0f} "
                       f"data passes; proxy fit {r['proxy_s']:.1f} s, L-BFGS "
                       f"{pi['lbfgs_iterations']} iterations, converged {pi['converged']}, "
                       f"Newton decrement {pi['newton_decrement']:.3g}); "
                       f"{r['steps_per_s']:.0f} chain-steps/s; run checks: min bulk ESS "
                       f"{r['checks']['min_ess_bulk']:.0f}, max R-hat "
                       f"{r['checks']['max_rhat']:.2f}.")
    curve = ["", "RMSE against wall time (s):"]
    grid = np.linspace(B_all / 5, max(b[0] for b in budgets.values()), 6)
    for r in res["sg_rows"] + [x for x in res["other_rows"] if "times" in x]:
        vals = [at_budget(r, t).get("rmse") for t in grid]
        curve.append(f"- {r['method']}: " + ", ".join(
            f"{t:.0f}: {fmt(v, '.4f')}" for t, v in zip(grid, vals, strict=True)))
    return "\n".join(out + curve) + "\n"
