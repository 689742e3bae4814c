"""Real data (issue 15): every estimator and dynamic against a long full-data NUTS reference.

Data: covtype_subset20k, a9a (train), ijcnn1 (train), w8a (train) from ``shared/data``
(``np.load`` of the ``.npz``) and a synthetic logistic regression with rare binary features
(``numpyro_subsample.datasets.generators.make_rare_features``, N = 2·10^5, d = 21).
Model (``_ref_models.py``): continuous features z-scored, binary features centred on their 0/1
scale (Gelman et al. 2008), α ~ N(0, 2.5²), β_j ~ N(0, 1), Bernoulli-logit; the same model for
NUTS and the subsampling kernels.

Rows: SGLD with every estimator (uniform, cv, preferential, cv-preferential, stratified,
cv-stratified, cv adaptive), SGHMC and SGNHT with cv, each with the package's defaults (step
size from the measured gradient noise), and the Laplace and variational proxies alone
(independent draws, no MCMC). Columns: the worst-coordinate |mean error| and |log sd ratio|
in reference posterior-sd units, min ESS (ArviZ, bulk), wall time from the kernel's
construction to the draws INCLUDING compilation and preprocessing, its ratio to NUTS's wall
time for the same number of draws (from the reference run: compile + warm-up + per-draw
seconds), data passes, and the warnings raised (and the run checks, where the package has
them).

    python benchmarks/bench_realdata.py                      # defaults (~20 min with cached refs)
    python benchmarks/bench_realdata.py --quick              # synthetic + covtype, short chains
    python benchmarks/bench_realdata.py --datasets a9a --methods sgld-cv,laplace-proxy

References are computed (slow) if not cached: ``python benchmarks/_refs.py --compute all``.
Writes ``benchmarks/results/bench_realdata[_quick].json`` and prints a markdown section.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ref_models  # noqa: E402
import _refs  # noqa: E402
from _runs import Run, accuracy, fmt, json_default, run_kernel, run_proxy, warnings_cell  # noqa: E402

from numpyro_subsample import SGLD  # noqa: E402
from numpyro_subsample.compare import available_methods, flatten_draws  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SG_METHODS = ("sgld-uniform", "sgld-cv", "sgld-preferential", "sgld-cv-preferential",
              "sgld-stratified", "sgld-cv-stratified", "sgld-cv-adaptive", "sghmc-cv",
              "sgnht-cv")
PROXY_METHODS = {"laplace-proxy": ("laplace", "Laplace proxy (no MCMC)"),
                 "variational-proxy": ("variational", "variational proxy (no MCMC)")}
ALL_METHODS = SG_METHODS + tuple(PROXY_METHODS)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def subsample_size(N: int) -> int:
    """n = min(1000, max(N / 100, 10)), the rule of ``numpyro-subsample compare``."""
    return min(1000, max(N // 100, 10))


def kernel_builder(name: str, model, seed: int):
    """``() -> kernel`` for a method name: the compare registry's kernels with the package's
    defaults, and ``sgld-cv-adaptive`` = ``SGLD(estimator="cv", adaptive=True)`` unless the
    registry has it."""
    registry = available_methods()
    if name in registry:
        return lambda: registry[name].build(model, seed=seed, progress_bar=False)
    if name == "sgld-cv-adaptive":
        return lambda: SGLD(model, estimator="cv", adaptive=True, seed=seed, progress_bar=False)
    raise ValueError(f"--methods: unknown method {name!r}; choose from {', '.join(ALL_METHODS)}.")


def run_dataset(name: str, methods: list[str], num_warmup: int, num_samples: int, seed: int,
                data_dir: str | None, n_override: int | None, quick: bool) -> dict:
    data = _ref_models.load_logistic(name, data_dir)
    N = data.num_data
    n = n_override or subsample_size(N)
    ref = _refs.logistic_reference(data, compute=False)
    if ref is None and quick:
        short = _refs.RefSettings(num_warmup=500, num_samples=2000,
                                  dense_mass=_refs.REFERENCE_PLAN[name].dense_mass)
        ref = _refs.logistic_reference(data, settings=short)
    if ref is None:
        log(f"{name}: no cached reference; computing it now (slow: "
            "`python benchmarks/_refs.py --compute all` does it ahead)")
        ref = _refs.logistic_reference(data)
    sites = sorted(ref.samples)
    ref_flat = flatten_draws(ref.samples, sites)
    args = (jnp.asarray(data.Z), jnp.asarray(data.y))
    kwargs = {"subsample_size": n}
    nuts_s = ref.nuts_wall_s(num_samples)
    res_mean, res_sd = ref.resolvable_sd()
    log(f"{name}: N={N}, d={data.dim}, n={n}; reference {ref.meta['settings']} "
        f"(min ESS {ref.meta['min_ess']:.0f}); NUTS for {num_samples} draws ~{nuts_s:.0f} s")
    rows = []
    for m in methods:
        log(f"  {name}: {m}")
        if m in PROXY_METHODS:
            kind, label = PROXY_METHODS[m]
            run = run_proxy(label, kind, _ref_models.logistic_model, args, kwargs,
                            num_draws=num_samples, seed=seed)
        else:
            run = run_kernel(m, kernel_builder(m, _ref_models.logistic_model, seed), args, kwargs,
                             num_warmup=num_warmup, num_samples=num_samples, seed=seed)
        acc = accuracy(run, ref_flat, sites)
        row = _row(run, acc, nuts_s)
        rows.append(row)
        if run.error:
            log(f"    failed: {run.error}\n{run.extra.get('traceback', '')}")
        else:
            log(f"    wall {run.wall_s:.1f} s (compile {run.compile_s:.1f}), mean err "
                f"{fmt(acc.get('mean_err'))}, log-sd err {fmt(acc.get('sd_log_ratio'))}, "
                f"min ESS {fmt(acc.get('min_ess'), '.0f')}, warnings {len(run.warnings)}")
    return {
        "dataset": name, "N": N, "dim": data.dim, "subsample_size": n,
        "data_info": data.info, "reference": {**ref.meta, "cached": ref.cached},
        "reference_resolution": {"mean_err": res_mean, "sd_log_ratio": res_sd},
        "nuts_wall_s_same_draws": nuts_s, "num_warmup": num_warmup, "num_samples": num_samples,
        "rows": rows,
    }


def _row(run: Run, acc: dict, nuts_s: float) -> dict:
    return {
        "method": run.method, "wall_s": run.wall_s, "compile_s": run.compile_s,
        "prep_s": run.prep_s, "data_passes": run.data_passes, "step_size": run.step_size,
        "divergences": run.divergences, "warnings": run.warnings, "checks": run.checks,
        "checks_detail": run.extra.get("checks"), "error": run.error,
        "wall_over_nuts": run.wall_s / nuts_s, **acc,
        "warnings_cell": warnings_cell(run),
    }


def markdown(results: list[dict], command: str, started: str, wall: float) -> str:
    lines = [
        "## Real data (issue 15)",
        "",
        f"`{command}` ({started}, {wall / 60:.0f} min; 2 cores shared with other jobs: "
        "timings indicative). Model: continuous features z-scored, binary features centred "
        "(0/1 scale), α ~ N(0, 2.5²), β_j ~ N(0, 1), "
        "Bernoulli-logit (the same for NUTS). Errors: worst coordinate, in reference posterior "
        "sd; wall: construction to draws, compilation and preprocessing included; NUTS: the "
        "reference's compile + warm-up + per-draw seconds for the same number of draws; "
        "target wall / NUTS ≤ 0.2.",
        "",
    ]
    for r in results:
        ref = r["reference"]
        s = ref["settings"]
        lines += [
            f"### {r['dataset']}: N = {r['N']}, d = {r['dim']}, n = {r['subsample_size']}, "
            f"{r['num_warmup']} + {r['num_samples']} steps",
            "",
            f"Reference: NUTS {s['num_warmup']} + {s['num_samples']} draws, "
            f"{ref.get('mass', 'dense mass' if s['dense_mass'] else 'diagonal mass')}, "
            f"{ref['mean_steps_per_draw']:.1f} leapfrog steps/draw, min ESS "
            f"{ref['min_ess']:.0f}, {ref['divergences']} divergences; it resolves errors of about "
            f"{r['reference_resolution']['mean_err']:.3f} (mean) and "
            f"{r['reference_resolution']['sd_log_ratio']:.3f} (log sd). NUTS for "
            f"{r['num_samples']} draws: {r['nuts_wall_s_same_draws']:.0f} s "
            f"({'cached reference, ' if ref['cached'] else ''}run {ref.get('time', '?')}).",
            "",
            "| method | mean err | log-sd err | min ESS | wall s (incl. compile) | compile s | "
            "wall / NUTS | data passes | step h | check_run | warnings |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in r["rows"]:
            lines.append(
                f"| {row['method']} | {fmt(row.get('mean_err'))} | "
                f"{fmt(row.get('sd_log_ratio'))} | {fmt(row.get('min_ess'), '.0f')} | "
                f"{fmt(row['wall_s'], '.1f')} | {fmt(row['compile_s'], '.1f')} | "
                f"{fmt(row['wall_over_nuts'], '.3f')} | {fmt(row['data_passes'], '.1f')} | "
                f"{fmt(row['step_size'], '.2e')} | {row['checks'] or '–'} | "
                f"{row['warnings_cell']} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", default=",".join(_ref_models.ALL_LOGISTIC),
                   help=f"comma list of {', '.join(_ref_models.ALL_LOGISTIC)}")
    p.add_argument("--methods", default="all", help=f"comma list of {', '.join(ALL_METHODS)}")
    p.add_argument("--num-samples", type=int, default=None,
                   help="SG steps after warm-up (default 20,000; --quick 3000)")
    p.add_argument("--num-warmup", type=int, default=None, help="default 1000; --quick 300")
    p.add_argument("--subsample-size", type=int, default=None,
                   help="n (default min(1000, max(N/100, 10)))")
    p.add_argument("--quick", action="store_true",
                   help="synthetic and covtype only, short chains (a short reference if none "
                   "is cached)")
    p.add_argument("--data-dir", default=None, help="folder holding <name>/<name>.npz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(p)
    args = p.parse_args(argv)
    names = [s.strip() for s in args.datasets.split(",") if s.strip()]
    if args.quick and args.datasets == p.get_default("datasets"):
        names = [_ref_models.SYNTHETIC, "covtype_subset20k"]
    unknown = [s for s in names if s not in _ref_models.ALL_LOGISTIC]
    if unknown:
        p.error(f"--datasets: unknown {unknown}; choose from {', '.join(_ref_models.ALL_LOGISTIC)}")
    methods = list(ALL_METHODS) if args.methods == "all" else [
        s.strip() for s in args.methods.split(",") if s.strip()]
    bad = [m for m in methods if m not in ALL_METHODS]
    if bad:
        p.error(f"--methods: unknown {bad}; choose from {', '.join(ALL_METHODS)}")
    num_samples = args.num_samples or (3000 if args.quick else 20_000)
    num_warmup = args.num_warmup if args.num_warmup is not None else (300 if args.quick
                                                                       else 1000)
    command = "python benchmarks/bench_realdata.py " + " ".join(argv or sys.argv[1:])
    started = time.strftime("%Y-%m-%d %H:%M")
    t0 = time.perf_counter()
    results = [run_dataset(nm, methods, num_warmup, num_samples, args.seed, args.data_dir,
                           args.subsample_size, args.quick) for nm in names]
    wall = time.perf_counter() - t0
    text = markdown(results, command.strip(), started, wall)
    print(text)
    out = Path(args.out) if args.out else RESULTS / (
        f"bench_realdata{'_quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": command.strip(), "started": started, "wall_s": wall,
            "device": args.device,
            "machine": f"{platform.platform()}, {os.cpu_count()} cores, jax {jax.__version__}",
            "load_average_at_end": os.getloadavg()}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1,
                              default=json_default))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
