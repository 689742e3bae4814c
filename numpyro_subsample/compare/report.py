"""The comparison's outputs: the printed table, ``compare.csv``, ``compare.json`` and
``compare.png`` (errors of growing prefixes against data passes and wall seconds)."""

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
    "method_style",
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
    ("flags", "flags", "{}"),
]


def format_table(rows: list[dict]) -> str:
    """The rows as an aligned text table (``None`` printed as ``n/a``)."""
    cells = [[h for _, h, _ in COLUMNS]]
    for r in rows:
        cells.append([("-" if key == "flags" else "n/a") if r.get(key) in (None, "")
                      else fmt.format(r.get(key)) for key, _, fmt in COLUMNS])
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
    ref = meta.get("reference") or {}
    mc = ref.get("mc_error") or {}
    if mc:
        lines.append(
            f"reference: NUTS, {ref.get('draws')} draws (min ESS {_num(ref.get('min_ess'))});"
            f" its own Monte Carlo error (95 %) is {mc['mean_err']:.3f} sd in the mean and "
            f"{mc['sd_log_ratio']:.3f} in |log sd|: smaller errors cannot be resolved")
    lines.append(f"flags: failed run checks (ESS < 100, Rhat > 1.01, div: divergences), "
                 f"'mean'/'sd' when a worst error exceeds {meta.get('far_sd', 0.25):.2f} "
                 "posterior sds, and the warnings raised")
    ksd = meta.get("ksd")
    lines.append(f"KSD: {ksd['text'] if isinstance(ksd, dict) else ksd}")
    lines.append(f"device: {meta.get('device', 'n/a')}")
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


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def write_outputs(out: str | os.PathLike, rows: list[dict], curves: dict,
                  meta: dict) -> dict[str, Path]:
    """Write ``compare.csv`` (the table), ``compare.json`` (meta, rows, curves) and
    ``compare.png`` (:func:`plot_curves`) into the folder ``out``; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "compare.csv", "json": out / "compare.json", "png": out / "compare.png"}
    keys = [k for k, _, _ in COLUMNS] + ["status", "warnings", "checks", "ksd_draws",
                                         "iterations", "note"]
    with open(paths["csv"], "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})
    with open(paths["json"], "w") as fh:
        json.dump({"meta": meta, "rows": rows, "curves": curves}, fh, indent=1)
    plot_curves(paths["png"], curves, meta)
    return paths


#: Okabe and Ito's colour-blind-safe palette (2008), one colour per dynamic
DYNAMIC_COLOURS = {
    "sgld": "#0072B2", "sghmc": "#D55E00", "sgnht": "#009E73", "distributedsgld": "#CC79A7",
    "hmcecs": "#E69F00", "energyconservinghmc": "#56B4E9", "proxy": "#000000",
}
#: line style and marker per estimator (proxies: a marker only)
ESTIMATOR_STYLES = {
    "uniform": ("-", "o"), "cv": ("--", "s"), "preferential": (":", "^"),
    "cv-preferential": ("-.", "v"), "stratified": ((0, (6, 2, 1, 2, 1, 2)), "D"),
    "cv-stratified": ((0, (1, 1)), "P"), "saga": ((0, (8, 3)), "X"),
    "svrg": ((0, (3, 1, 3, 4)), "*"), "laplace-proxy": ("", "*"),
    "variational-proxy": ("", "X"),
}
_PANELS = (("mean_err", "worst |mean error| (posterior sds)"),
           ("sd_log_ratio", "worst |log sd ratio|"))
_AXES = (("passes", "data passes (preprocessing included)"),
         ("wall_s", "wall seconds, compilation included"))


def method_style(name: str) -> tuple[str, object, str]:
    """(colour, line style, marker) of a method by its registry name: the colour says the
    dynamic (SGLD, SGHMC, ..., the proxies in black), the line style and marker the
    estimator."""
    if name.endswith("-proxy"):
        return DYNAMIC_COLOURS["proxy"], *ESTIMATOR_STYLES[name]
    dynamic, _, estimator = name.partition("-")
    colour = DYNAMIC_COLOURS.get(dynamic, "#999999")
    return colour, *ESTIMATOR_STYLES.get(estimator or "uniform", ("-", "o"))


def _tick(v: float, _pos=None) -> str:
    """1, 20, 500, 1,000, 10⁴, 2·10⁴, ...: short labels that do not run into each other."""
    if v >= 1e4:
        e = int(np.floor(np.log10(v) + 1e-9))
        m = v / 10**e
        return f"$10^{{{e}}}$" if abs(m - 1) < 1e-6 else f"${m:g}\\cdot10^{{{e}}}$"
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


def _log_axis(axis, lo: float, hi: float) -> None:
    """Labels at 1, 2, 5 × 10^k over at most 2.5 decades, else at powers of ten only; no
    minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    wide = np.log10(max(hi, 1e-300) / max(lo, 1e-300)) > 2.5
    axis.set_major_locator(LogLocator(base=10, subs=(1.0,) if wide else (1.0, 2.0, 5.0),
                                      numticks=12))
    axis.set_major_formatter(FuncFormatter(_tick))
    axis.set_minor_formatter(NullFormatter())


def _draw_panel(ax, curves: dict, metric: str, xkey: str) -> list[str]:
    """One panel; returns the titles of the methods without this x value (not drawn)."""
    missing = []
    for title, c in curves.items():
        pts = [(x, y) for x, y in zip(c.get(xkey, []), c.get(metric, []), strict=False)
               if x is not None and y is not None and np.isfinite(x) and x > 0 and y > 0]
        if not pts:
            missing.append(title)
            continue
        colour, ls, marker = method_style(c.get("name", title))
        if not ls:  # independent draws (a proxy): the value of all of them, one marker
            pts = pts[-1:]
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, color=colour, ls=ls or "none", marker=marker, ms=4 if ls else 8,
                lw=1.6, label=title)
    return missing


def _reference_marks(ax, meta: dict, metric: str, xkey: str) -> None:
    """The reference's Monte Carlo error as a grey band, the flag threshold, and the
    reference's own cost as a vertical line."""
    ref = meta.get("reference", {})
    mc = (ref.get("mc_error") or {}).get(metric)
    if mc:
        ax.axhspan(1e-9, mc, color="0.82", zorder=0,
                   label="NUTS reference's Monte Carlo error (95 %)")
    if meta.get("far_sd"):
        ax.axhline(meta["far_sd"], color="0.35", ls=(0, (2, 2)), lw=1,
                   label="flag threshold (row flagged above it)")
    cost = (ref.get("cost") or {}).get(xkey)
    if cost:
        ax.axvline(cost, color="0.35", ls="-", lw=1, label="NUTS reference's own cost")


def plot_curves(path: str | os.PathLike, curves: dict, meta: dict) -> None:
    """2 × 2 log-log panels: worst mean error and worst |log sd| of each method's first k
    draws against data passes and against wall seconds (compilation included).

    Colour-blind-safe colours by dynamic and line styles by estimator
    (:func:`method_style`); the reference's Monte Carlo error as a grey band; the legend
    outside the panels; methods missing from a panel are named under it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), squeeze=False)
    for i, (metric, ylabel) in enumerate(_PANELS):
        for j, (xkey, xlabel) in enumerate(_AXES):
            ax = axes[i, j]
            _reference_marks(ax, meta, metric, xkey)
            missing = _draw_panel(ax, curves, metric, xkey)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, which="major", alpha=0.3)
            _set_ylim(ax, curves, metric, meta)
            _log_axis(ax.xaxis, *ax.get_xlim())
            _log_axis(ax.yaxis, *ax.get_ylim())
            if missing:
                ax.text(0.01, 0.01, "not shown (no " + xlabel.split(" (")[0].split(",")[0]
                        + "): " + ", ".join(missing), transform=ax.transAxes, fontsize=7,
                        va="bottom", ha="left", color="0.25")
    handles, labels = axes[0, 1].get_legend_handles_labels()
    for ax in axes.flat:  # methods drawn in another panel only
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.97), fontsize=8,
               frameon=False, title="colour: dynamic; line: estimator")
    fig.suptitle(f"{meta['dataset']}: N={meta['num_data']}, d={meta['dim']}, "
                 f"n={meta['subsample_size']}; errors against NUTS "
                 f"({meta.get('reference', {}).get('draws', '?')} draws) on "
                 f"{meta.get('device', 'cpu')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _set_ylim(ax, curves: dict, metric: str, meta: dict) -> None:
    """y from below the band to above the largest error."""
    ys = [y for c in curves.values() for y in c.get(metric, []) if y is not None and y > 0]
    mc = ((meta.get("reference") or {}).get("mc_error") or {}).get(metric)
    lo = min([*ys, mc or np.inf, 1.0]) / 2
    hi = max([*ys, meta.get("far_sd") or 0.0, lo * 10]) * 1.5
    ax.set_ylim(lo, hi)


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
