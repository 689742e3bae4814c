"""The markdown table and the figure of ``bench_paper002.py`` from its result JSON."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paper002_worker import DATASET  # noqa: E402

LABELS = {"sgld": "SGLD", "sgld-cv": "SGLD-CV", "sgld-saga": "SGLD-SAGA",
          "sgld-svrg": "SGLD-SVRG", "laplace": "Laplace proxy (no MCMC)", "nuts": "NUTS"}
COLOURS = {"sgld": "tab:blue", "sgld-cv": "tab:orange", "sgld-saga": "tab:green",
           "sgld-svrg": "tab:red", "laplace": "tab:purple", "nuts": "black"}


def _f(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


SETTING_NOTES = {
    "default": "package defaults: Laplace proxy, preconditioning, start at a proxy draw, step "
               "from the measured gradient noise (δ = 0.05)",
    "paper": "paper-like: no preconditioning, one constant step h = κ·λ_min(Σ_NUTS) for all four "
             "(κ = {kappa}), SGLD/SAGA/SVRG start at the prior median θ0 = 0 (SAGA's table and "
             "SVRG's anchor at θ0, one data pass), SGLD-CV at the Laplace mode θ̂",
}


def markdown(result: dict) -> str:
    s = result["settings"]
    notes = "; ".join(f"**{k}** = {SETTING_NOTES[k].format(kappa=s['paper_kappa'])}"
                      for k in s["settings"])
    lines = [
        f"### Paper 002 (Baker et al. 2019, Sect. 5.1, Fig. 1): {DATASET}, log predictive "
        "density vs wall time",
        "",
        f"Test set {s['num_test']} rows ({s['test_frac']:.0%}, seed {s['seed']}); training sizes "
        f"{', '.join(str(r['num_data']) for r in result['sizes'])} of a {s['pool_rows']}-row pool; "
        f"d = {s['dim']}; subsample n = {s['subsample_size']} for every size (with "
        f"replacement); {s['steps']} steps, every {s['thin']}th state kept; NUTS "
        f"{s['nuts']['num_warmup']} + {s['nuts']['num_samples']} draws (dense mass). Settings: "
        f"{notes}. lpd = mean over test rows of log of the mean likelihood over the last half of "
        "the draws so far (nats/row); gap = lpd − NUTS's lpd; 'within' = time from which the "
        "curve stays within that many nats/row of NUTS's value (– never). Times include setup "
        "and compilation, each method in a fresh process; CPU s = the process's CPU seconds "
        "(all threads); 2 cores shared with other jobs.",
        "",
        "| N | method | setting | step h | setup s | total wall s | CPU s | data passes | "
        "final lpd | gap | within 0.01 (s) | within 0.001 (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size in result["sizes"]:
        for key, r in size["rows"].items():
            method = key.split("@")[0]
            setting = r.get("setting", "-")
            head = f"| {size['num_data']} | {LABELS[method]} | {setting} |"
            if "error" in r:
                lines.append(f"{head} **failed**: {r['error'][:80]} | | | | | | | | |")
                continue
            setup = (r["compile_s"] + r["warmup_s"]) if method == "nuts" else r["setup_s"]
            lines.append(
                f"{head} {_f(r.get('step_size'), '.3g')} | {setup:.1f} | {r['wall_s']:.1f} | "
                f"{_f(r.get('cpu_s'), '.1f')} | {r['data_passes']:.0f} | "
                f"{r['final_lpd']:.4f} | {r['gap']:+.4f} | "
                f"{_f(r.get('time_within_0.01'), '.1f')} | "
                f"{_f(r.get('time_within_0.001'), '.1f')} |"
            )
    cached = any(z["rows"]["nuts"].get("cached") for z in result["sizes"])
    lines += ["", "NUTS: setup = compile + warm-up, data passes = leapfrog steps (warm-up + "
              "sampling), lpd from all its draws" + (" (cached run: its recorded timings)"
                                                     if cached else "")
              + ". Laplace proxy: setup = the fit with compilation, then "
              f"{s['proxy_draws']} independent draws."]
    warn = sorted({f"{LABELS[k.split('@')[0]]} ({r.get('setting')}): {w}"
                   for z in result["sizes"] for k, r in z["rows"].items()
                   for w in r.get("warnings", [])})
    if warn:
        lines += ["", "Warnings raised: " + "; ".join(w[:200] for w in warn)]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes, settings = result["sizes"], result["settings"]["settings"]
    fig, axes = plt.subplots(len(settings), len(sizes), figsize=(5 * len(sizes),
                                                                 4 * len(settings)),
                             squeeze=False)
    for row_axes, setting in zip(axes, settings, strict=True):
        for ax, size in zip(row_axes, sizes, strict=True):
            ref = size["reference_lpd"]
            ax.axhline(ref, color="black", lw=1, label="NUTS (reference)")
            ax.axhspan(ref - 0.01, ref + 0.01, color="grey", alpha=0.15, label="± 0.01")
            lo = ref - 0.03
            for key, r in size["rows"].items():
                method = key.split("@")[0]
                if "curve" not in r or r.get("setting") not in (setting, "-"):
                    continue
                c = r["curve"]
                if method == "laplace":
                    ax.plot(c["wall_s"], c["lpd"], "D", color=COLOURS[method],
                            label=LABELS[method])
                    continue
                ax.plot(c["wall_s"], c["lpd"], color=COLOURS[method], label=LABELS[method])
                ax.axvline(r["setup_s"], color=COLOURS[method], ls=":", lw=0.8)
                lo = min(lo, float(np.percentile(c["lpd"], 10)) - 0.005)
            ax.plot([size["rows"]["nuts"]["wall_s"]], [ref], "*", color="black", ms=10,
                    label="NUTS wall time")
            ax.set_xscale("log")
            ax.set_ylim(max(lo, ref - 0.2), ref + 0.02)
            ax.set_title(f"{setting}: N = {size['num_data']} "
                         f"({size['fraction']:.0%} of the pool)", fontsize=10)
            ax.set_xlabel("wall time incl. setup and compilation (s)")
            ax.set_ylabel("test log predictive density (nats/row)")
        row_axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{DATASET}: dotted lines = end of each method's setup")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
