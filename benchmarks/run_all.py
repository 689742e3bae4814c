"""Run every benchmark script and collect their tables into ``benchmarks/RESULTS.md``.

Scripts: every ``benchmarks/bench_*.py`` (bench_sgld, bench_preferential, bench_stratified,
bench_ecs, bench_distributed, bench_realdata, bench_hierarchical, ...) and ``zv_benchmark.py``.
bench_realdata and bench_hierarchical read the NUTS references cached by
``python benchmarks/_refs.py --compute all`` (computed on the spot, slowly, if missing).

    python benchmarks/run_all.py            # full benchmarks (long; run on an idle machine)
    python benchmarks/run_all.py --quick    # each script's small version

Each script prints a markdown section on stdout (progress on stderr); this runner stores them
with the machine information, the exact commands and wall times. A script that fails is
recorded with its exit status and the tail of its stderr; the others still run.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXTRA_SCRIPTS = ("zv_benchmark.py",)
# Small versions for scripts without a ``--quick`` flag.
QUICK_ARGS = {"bench_distributed.py": ["--N", "4000", "--draws", "100", "--devices", "1", "4"],
              "bench_step.py": ["--sizes", "10000,100000", "--steps", "3000"],
              # bench_hierarchical's command line, whose --quick the script passes on
              "bench_models.py": ["--quick"],
              "bench_wide_hierarchical.py": ["--groups", "300", "--num-samples", "2000",
                                             "--reference-draws", "2000"]}


def benchmark_scripts() -> list[Path]:
    """Every bench_*.py plus the extra scripts, in name order."""
    found = set(HERE.glob("bench_*.py")) | {HERE / n for n in EXTRA_SCRIPTS if (HERE / n).is_file()}
    return sorted(found, key=lambda p: p.name)


def script_args(script: Path, quick: bool) -> list[str]:
    """``--quick`` if the script accepts it, else its entry in QUICK_ARGS (full size: none)."""
    if not quick:
        return []
    if script.name in QUICK_ARGS:
        return list(QUICK_ARGS[script.name])
    return ["--quick"] if '"--quick"' in script.read_text() else []


def machine_info() -> list[str]:
    lines = [
        f"- python {platform.python_version()} on {platform.platform()}",
        f"- CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores",
    ]
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")),
                         None)
        if model:
            lines.append(f"- CPU model: {model}")
    except OSError:
        pass
    try:
        import blackjax
        import jax
        import numpyro

        lines.append(f"- jax {jax.__version__} ({', '.join(str(d) for d in jax.devices())}), "
                     f"numpyro {numpyro.__version__}, blackjax {blackjax.__version__}")
    except Exception as err:  # noqa: BLE001
        lines.append(f"- (library versions unavailable: {err})")
    try:
        load = os.getloadavg()
        lines.append(f"- load average at start: {load[0]:.1f} (1 min), {load[1]:.1f} (5 min)")
    except OSError:
        pass
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="pass --quick to every script")
    p.add_argument("--only", default=None, help="comma list of script names (bench_x.py)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per script")
    p.add_argument("--output", default=str(HERE / "RESULTS.md"))
    p.add_argument("--device", default=None, metavar="PLATFORM",
                   help="pass --device PLATFORM (cpu, gpu, tpu) to every script")
    args = p.parse_args(argv)
    scripts = benchmark_scripts()
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        scripts = [s for s in scripts if s.name in wanted]
    if not scripts:
        print(f"no benchmark scripts found (--only {args.only!r}?)", file=sys.stderr)
        return 1
    command = ("python benchmarks/run_all.py" + (" --quick" if args.quick else "")
               + (f" --device {args.device}" if args.device else ""))
    sections = [
        "# Benchmark results",
        "",
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d %H:%M')}"
        + (" (quick versions: small sizes, not the issues' targets)." if args.quick else "."),
        "",
        "## Machine",
        "",
        *machine_info(),
        "",
    ]
    failures = 0
    for script in scripts:
        extra = script_args(script, args.quick) + (["--device", args.device]
                                                    if args.device else [])
        cmd = [sys.executable, str(script), *extra]
        print(f"== {script.name}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            res = subprocess.run(cmd, capture_output=True, text=True,
                                 timeout=args.timeout, cwd=HERE.parent)
            code, out, err = res.returncode, res.stdout, res.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = "timeout", exc.stdout or "", f"timed out after {args.timeout} s"
            out = out.decode() if isinstance(out, bytes) else out
        wall = time.perf_counter() - t0
        tail_err = err[-2000:] if isinstance(err, str) else ""
        sys.stderr.write(tail_err + ("" if tail_err.endswith("\n") else "\n"))
        sections += [f"## {script.name}", "",
                     f"`python benchmarks/{' '.join([script.name, *extra])}` "
                     f"— wall time {wall:.0f} s, exit status {code}", ""]
        if code != 0:
            failures += 1
            tail = "\n".join(str(err).strip().splitlines()[-15:])
            sections += ["FAILED. Last lines of stderr:", "", "```", tail, "```", ""]
        sections += [out.strip(), ""]
    Path(args.output).write_text("\n".join(sections) + "\n")
    print(f"wrote {args.output} ({len(scripts)} scripts, {failures} failed)", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
