"""What the preprocessing of the default SG kernels costs on hierarchical models at large N.

The centred hierarchical normal model and the hierarchical logistic regression of
``bench_hierarchical.py`` (``_hier_models``: 100 and 80 groups of very unequal sizes) at
N = 10^6 and 10^7 rows, ``SGLD(model)`` / ``SGHMC(model)`` at their defaults with a subsample
of ``--subsample`` rows: ``kernel.preprocess`` alone (everything before the first step: the
proxy fit, the pilot chains of the adapted proxy, the curvature, the control variates, the noise
measurement, the bias probe, and the other form of the model that the partial centring was
chosen against), its data passes by stage (``kernel.preprocessed.cost``) and its seconds,
compilation included, in a fresh process per configuration. No reference posterior: the suite's
errors are those of ``bench_hierarchical.py`` at N = 15,000-20,000.

    python benchmarks/bench_warmup_cost.py
    python benchmarks/bench_warmup_cost.py --rows 1000000 --models logistic-varying
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import parse_args_or_run_worker  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STAGES = ("proxy fit", "pilot chains", "curvature", "control variate", "noise",
          "other forms of the model", "bias probe")


def worker(spec: dict) -> None:
    """One configuration in this fresh process: prints its row as JSON."""
    print(json.dumps(_preprocessing(**spec)))


def _preprocessing(model: str, kernel: str, rows: int, subsample: int, seed: int) -> dict:
    import _hier_models as H
    import jax
    import numpy as np

    from numpyro_subsample import SGHMC, SGLD

    make, fn = {"normal-centred": (H.grouped_normal_data, H.normal_centred),
                "logistic-varying": (H.varying_logistic_data, H.logistic_varying)}[model]
    args, _ = make(num_data=rows)
    args = tuple(jax.numpy.asarray(a) for a in args)
    cls = {"SGLD": SGLD, "SGHMC": SGHMC}[kernel]
    t0 = time.perf_counter()
    k = cls(fn, seed=seed, progress_bar=False)
    k.preprocess(args, {"subsample_size": subsample})
    pre = k.preprocessed
    seconds = time.perf_counter() - t0
    return {"model": model, "kernel": kernel, "rows": rows, "dim": int(pre.potential.dim),
            "seconds": seconds, "passes": float(pre.data_passes),
            "cost": [(s, float(p)) for s, p in pre.cost], "step_size": float(pre.step_size),
            "proxy": pre.proxy.kind, "centred_form_kept": "partially_centred" not in
            " ".join(pre.potential.latent_sites), "load": os.getloadavg()[0],
            "noise": float(pre.noise) if np.isfinite(pre.noise) else None}


def table(rows: list[dict]) -> str:
    head = ("| model | kernel | N | d | preprocessing s (incl. compile) | passes | "
            + " | ".join(STAGES) + " | step h |")
    lines = [head, "|" + "---|" * (6 + len(STAGES) + 1)]
    for r in rows:
        stages = dict(r["cost"])
        cells = " | ".join(f"{stages[s]:.2f}" if s in stages else "–" for s in STAGES)
        lines.append(f"| {r['model']} | {r['kernel']} | {r['rows']:.0e} | {r['dim']} | "
                     f"{r['seconds']:.1f} | {r['passes']:.2f} | {cells} | "
                     f"{r['step_size']:.3g} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--models", nargs="+", default=["normal-centred", "logistic-varying"])
    ap.add_argument("--kernels", nargs="+", default=["SGLD", "SGHMC"])
    ap.add_argument("--subsample", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = parse_args_or_run_worker(ap, argv, worker)
    if args is None:
        return 0
    started, t0, out = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter(), []
    for rows in args.rows:
        for model in args.models:
            for kernel in args.kernels:
                # a fresh process (its own compilation); --device's platform is inherited
                # through JAX_PLATFORMS (add_device_option)
                spec = {"model": model, "kernel": kernel, "rows": rows,
                        "subsample": args.subsample, "seed": args.seed}
                cmd = [sys.executable, __file__, "--worker", json.dumps(spec)]
                res = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if res.returncode != 0:
                    print(res.stderr[-3000:], file=sys.stderr)
                    return res.returncode
                out.append(json.loads(res.stdout.strip().splitlines()[-1]))
                r = out[-1]
                print(f"{model} {kernel} N={rows}: {r['seconds']:.1f} s, {r['passes']:.2f} "
                      f"passes {r['cost']}", flush=True)
    text = (f"`python benchmarks/bench_warmup_cost.py {' '.join(argv or sys.argv[1:])}`"
            f" ({started}, {(time.perf_counter() - t0) / 60:.0f} min; {platform.machine()}, "
            f"{os.cpu_count()} cores, device {args.device or 'default'})\n\n" + table(out))
    print(text)
    path = Path(args.out) if args.out else RESULTS / "bench_warmup_cost.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": out, "markdown": text}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
