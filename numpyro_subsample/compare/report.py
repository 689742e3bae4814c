"""The comparison's outputs: the printed table, ``compare.csv``, ``compare.json`` and
``compare.png`` (error and KSD of growing prefixes against data passes and seconds)."""

from __future__ import annotations

import csv
import json
import os
import platform
from pathlib import Path

import jax
import numpy as np
import numpyro

from numpyro_subsample.compare.checks import shorten

__all__ = [
    "COLUMNS",
    "check_lines",
    "format_summary",
    "format_table",
    "machine_info",
    "plot_curves",
    "warning_lines",
    "write_outputs",
]

#: (key of a row, header, format) of the table's columns
COLUMNS = [
    ("method", "method", "{}"),
    ("preprocessing_s", "prep s", "{:.2f}"),
    ("sampling_s", "sampling s", "{:.2f}"),
    ("compile_s", "compile s", "{:.2f}"),
    ("data_passes", "passes", "{:.1f}"),
    ("it_per_s", "it/s", "{:.0f}"),
    ("min_ess", "min ESS", "{:.0f}"),
    ("ess_per_s", "ESS/s", "{:.1f}"),
    ("mean_err", "mean err", "{:.3f}"),
    ("sd_log_ratio", "|log sd|", "{:.3f}"),
    ("ksd", "KSD", "{:.3g}"),
    ("warnings", "warn", "{}"),
    ("checks", "checks", "{}"),
    ("status", "status", "{}"),
]


def format_table(rows: list[dict]) -> str:
    """The rows as an aligned text table (``None`` printed as ``n/a``)."""
    cells = [[h for _, h, _ in COLUMNS]]
    for r in rows:
        cells.append(["n/a" if r.get(key) is None else fmt.format(r.get(key))
                      for key, _, fmt in COLUMNS])
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    out = []
    for j, c in enumerate(cells):
        out.append("  ".join(x.ljust(w) if i == 0 else x.rjust(w)
                             for i, (x, w) in enumerate(zip(c, widths, strict=True))))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def warning_lines(rows: list[dict], width: int = 100) -> list[str]:
    """``  <method>: <category>: <message, first line shortened> (xcount)`` for each row's
    warnings (``warning_messages``)."""
    return [f"  {r['method']}: {w['category']}: {shorten(w['message'], width)}"
            + (f" (x{w['count']})" if w["count"] > 1 else "")
            for r in rows for w in r.get("warning_messages") or []]


def check_lines(rows: list[dict], width: int = 110) -> list[str]:
    """``  <method>: <message>`` for each run check that failed (``check_details``)."""
    out = []
    for r in rows:
        d = r.get("check_details") or {}
        msgs = d.get("messages") or ([d["error"]] if "error" in d else [])
        out.extend(f"  {r['method']}: {shorten(str(msg), width)}" for msg in msgs)
    return out


def format_summary(result: dict) -> str:
    """What the command prints: the table, the rows' notes, warnings and failed run checks,
    the KSD setting, a warning on the timings of a fast-compiled or two-process run, and the
    files written."""
    rows, meta = result["rows"], result["meta"]
    lines = [format_table(rows)]
    notes = [f"  {r['method']}: {r['note']}" for r in rows if r.get("note")]
    if notes:
        lines.append("notes:\n" + "\n".join(notes))
    for title, extra in (("warnings raised (full text in compare.json)", warning_lines(rows)),
                         ("run checks that failed", check_lines(rows))):
        if extra:
            lines.append(f"{title}:\n" + "\n".join(extra))
    lines.append(f"KSD: {meta['ksd']}")
    why = [w for w, on in (
        ("--quick compiles with most XLA optimisations off (fast compile, slower steps)",
         meta.get("fast_compile")),
        ("the NUTS reference and HMCECS ran in a second process at the same time",
         meta.get("jobs", 1) > 1)) if on]
    if why:
        lines.append(f"timings: {'; '.join(why)}; use --optimized-xla --jobs 1 or a full run "
                     "for speed comparisons")
    lines.append("saved: " + ", ".join(str(p) for p in result["paths"].values()))
    return "\n".join(lines)


def write_outputs(out: str | os.PathLike, rows: list[dict], curves: dict,
                  meta: dict) -> dict[str, Path]:
    """Write ``compare.csv`` (the table), ``compare.json`` (meta, rows, curves) and
    ``compare.png`` (:func:`plot_curves`) into the folder ``out``; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "compare.csv", "json": out / "compare.json", "png": out / "compare.png"}
    keys = [k for k, _, _ in COLUMNS] + ["iterations", "note"]
    with open(paths["csv"], "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})
    with open(paths["json"], "w") as fh:
        json.dump({"meta": meta, "rows": rows, "curves": curves}, fh, indent=1)
    plot_curves(paths["png"], curves, meta)
    return paths


def plot_curves(path: str | os.PathLike, curves: dict, meta: dict) -> None:
    """Log-log plot of each method's worst mean error (and KSD, if any) against data passes
    and seconds, one colour per method; ``meta`` gives the title (dataset, N, d, n)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_ksd = any(any(v is not None for v in c.get("ksd", [])) for c in curves.values())
    metrics = [("mean_err", "worst standardised mean error")]
    if has_ksd:
        metrics.append(("ksd", "KSD"))
    fig, axes = plt.subplots(len(metrics), 2, figsize=(11, 3.8 * len(metrics)), squeeze=False)
    colours = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(curves)}
    for row, (metric, label) in enumerate(metrics):
        for col, (xkey, xlabel) in enumerate([("passes", "data passes"), ("seconds", "seconds")]):
            ax = axes[row, col]
            for name, c in curves.items():
                pts = [(x, y) for x, y in zip(c[xkey], c.get(metric, []), strict=False)
                       if y is not None and x is not None and np.isfinite(x) and x > 0]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, marker="o", ms=3, label=name, color=colours[name])
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
    if curves:
        axes[0, 1].legend(fontsize=7)  # the seconds panel has every method
    fig.suptitle(f"{meta['dataset']}: N={meta['num_data']}, d={meta['dim']}, "
                 f"n={meta['subsample_size']} (vs NUTS reference)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_info() -> dict:
    """Python, platform, CPU, JAX and NumPyro versions and devices (for ``meta``)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
        "devices": [str(d) for d in jax.devices()],
    }
