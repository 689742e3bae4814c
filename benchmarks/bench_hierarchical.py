"""Hierarchical logistic regression (issue 15): centred and non-centred, every kernel against
a long full-data NUTS reference, split R-hat over 4 chains.

Data (``_refs.make_hierarchical``): N = 2·10^4 rows in 100 groups of unequal sizes (5 to ~600
rows), 3 covariates, τ = 0.7. Model (``_refs.hier_model``): μ ~ N(0, 2.5²), τ ~ HalfNormal(1),
β ~ N(0, I), a_g ~ N(μ, τ²), Bernoulli-logit; non-centred with
``numpyro.handlers.reparam(model, config={"a": LocScaleReparam(0)})``. Both are compared on
(a, β, μ, τ) with the same reference: NUTS on the centred model (the same posterior).

Rows, for each parameterisation: SGLD, SGHMC, SGNHT with ``estimator="cv"`` and
EnergyConservingHMC (package defaults: Laplace proxy), SGLD and SGHMC with
``proxy="variational"`` (``-vi``), 4 chains (vectorized), and the Laplace and variational
proxies alone (independent draws). Columns: worst-coordinate |mean error| and
|log sd ratio| in reference posterior-sd units (chains pooled), the largest split R-hat and
the smallest bulk ESS (ArviZ), wall time including compilation and preprocessing, data
passes, ``check_run``'s verdict and the warnings raised.

    python benchmarks/bench_hierarchical.py            # 4 chains x (1000 + 10,000) SG steps
    python benchmarks/bench_hierarchical.py --quick    # 4 chains x (300 + 2000)

EnergyConservingHMC (NUTS inside) runs 4 chains x (500 + 500) iterations (--quick 200 + 200).
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
import _refs  # noqa: E402
from _runs import accuracy, fmt, json_default, run_kernel, run_proxy, warnings_cell  # noqa: E402

from numpyro_subsample import SGHMC, SGLD, SGNHT, EnergyConservingHMC  # noqa: E402
from numpyro_subsample.compare import flatten_draws  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KERNELS = {"sgld-cv": (SGLD, {"estimator": "cv"}), "sghmc-cv": (SGHMC, {"estimator": "cv"}),
           "sgnht-cv": (SGNHT, {"estimator": "cv"}),
           "energyconservinghmc": (EnergyConservingHMC, {}),
           "sgld-cv-vi": (SGLD, {"estimator": "cv", "proxy": "variational"}),
           "sghmc-cv-vi": (SGHMC, {"estimator": "cv", "proxy": "variational"})}
PROXIES = {"laplace-proxy": ("laplace", "Laplace proxy (no MCMC)"),
           "variational-proxy": ("variational", "variational proxy (no MCMC)")}
MODELS = {"centred": _refs.hier_model, "non-centred": _refs.hier_model_noncentred}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", default="all",
                   help=f"comma list of {', '.join([*KERNELS, *PROXIES])}")
    p.add_argument("--models", default="centred,non-centred")
    p.add_argument("--num-samples", type=int, default=None,
                   help="SG draws per chain after warm-up (default 10,000; --quick 2000)")
    p.add_argument("--ecs-samples", type=int, default=None,
                   help="EnergyConservingHMC draws per chain (default 500; --quick 200)")
    p.add_argument("--ecs-warmup", type=int, default=None,
                   help="EnergyConservingHMC warm-up per chain (default 500; --quick 200)")
    p.add_argument("--num-warmup", type=int, default=None, help="default 1000; --quick 300")
    p.add_argument("--num-chains", type=int, default=4)
    p.add_argument("--subsample-size", type=int, default=200)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(p)
    args = p.parse_args(argv)
    methods = [*KERNELS, *PROXIES] if args.methods == "all" else [
        s.strip() for s in args.methods.split(",") if s.strip()]
    bad = [m for m in methods if m not in KERNELS and m not in PROXIES]
    models = [s.strip() for s in args.models.split(",") if s.strip()]
    if bad or any(m not in MODELS for m in models):
        p.error(f"unknown methods {bad} or models {models}")
    S = args.num_samples or (2000 if args.quick else 10_000)
    S_ecs = args.ecs_samples or (200 if args.quick else 500)
    W_ecs = args.ecs_warmup or (200 if args.quick else 500)
    W = args.num_warmup if args.num_warmup is not None else (300 if args.quick else 1000)
    C, n = args.num_chains, args.subsample_size

    data = _refs.make_hierarchical()
    ref = _refs.hier_reference(data, compute=False)
    if ref is None and args.quick:
        ref = _refs.hier_reference(data, settings=_refs.RefSettings(500, 2000))
    if ref is None:
        log("no cached hierarchical reference; computing it now (slow)")
        ref = _refs.hier_reference(data)
    sites = list(_refs.HIER_SITES)
    ref_flat = flatten_draws(ref.samples, sites)
    model_args = (jnp.asarray(data.X), jnp.asarray(data.g), jnp.asarray(data.y))
    kwargs = {"subsample_size": n, "num_groups": data.num_groups}
    command = "python benchmarks/bench_hierarchical.py " + " ".join(argv or sys.argv[1:])
    started = time.strftime("%Y-%m-%d %H:%M")
    t_all = time.perf_counter()
    rows = []
    for model_name in models:
        model = MODELS[model_name]
        for m in methods:
            log(f"{model_name}: {m}")
            if m in PROXIES:
                kind, label = PROXIES[m]
                run = run_proxy(label, kind, model, model_args, kwargs, num_draws=C * S,
                                seed=args.seed)
                draws = C * S
            else:
                cls, opts = KERNELS[m]
                ecs = cls is EnergyConservingHMC
                samples, warmup = (S_ecs, W_ecs) if ecs else (S, W)

                def build(cls=cls, opts=opts, model=model):
                    return cls(model, seed=args.seed, progress_bar=False, **opts)

                run = run_kernel(m, build, model_args, kwargs, num_warmup=warmup,
                                 num_samples=samples, num_chains=C, seed=args.seed)
                draws = C * samples
            acc = accuracy(run, ref_flat, sites)
            nuts_s = ref.nuts_wall_s(draws)
            rows.append({
                "model": model_name, "method": run.method, "draws": draws,
                "wall_s": run.wall_s, "compile_s": run.compile_s, "prep_s": run.prep_s,
                "data_passes": run.data_passes,
                "data_passes_note": run.extra.get("data_passes_note", ""),
                "step_size": run.step_size,
                "divergences": run.divergences, "warnings": run.warnings,
                "checks": run.checks, "checks_detail": run.extra.get("checks"),
                "error": run.error, "nuts_wall_s_same_draws": nuts_s,
                "wall_over_nuts": run.wall_s / nuts_s, **acc,
                "warnings_cell": warnings_cell(run),
            })
            if run.error:
                log(f"  failed: {run.error}\n{run.extra.get('traceback', '')}")
            else:
                log(f"  wall {run.wall_s:.1f} s, mean err {fmt(acc.get('mean_err'))}, log-sd "
                    f"{fmt(acc.get('sd_log_ratio'))}, R-hat {fmt(acc.get('rhat'))}, "
                    f"ESS {fmt(acc.get('min_ess'), '.0f')}, warnings {len(run.warnings)}")
    wall = time.perf_counter() - t_all
    res_mean, res_sd = ref.resolvable_sd()
    s = ref.meta["settings"]
    lines = [
        "## Hierarchical logistic (issue 15)",
        "",
        f"`{command.strip()}` ({started}, {wall / 60:.0f} min; 2 cores shared with other jobs: "
        f"timings indicative). N = {data.num_data}, {data.num_groups} groups (sizes "
        f"{data.info['group_sizes_min_median_max']} min/median/max), 3 covariates, true τ = "
        f"{data.info['true_tau']}; n = {n}; {C} chains x ({W} + {S}) SG steps, EnergyConservingHMC "
        f"{C} x ({W_ecs} + {S_ecs}). Errors on (a, β, μ, τ), chains pooled, in reference posterior "
        "sd. Reference: NUTS on the centred model, "
        f"{s['num_warmup']} + {s['num_samples']} draws, "
        f"{ref.meta.get('mass', 'dense mass' if s['dense_mass'] else 'diagonal mass')}, "
        f"min ESS {ref.meta['min_ess']:.0f} "
        f"(resolves about {res_mean:.3f} in the mean, {res_sd:.3f} in log sd), "
        f"{ref.meta['divergences']} divergences. wall / NUTS: against the reference's "
        "compile + warm-up + per-draw seconds for the same total number of draws.",
        "",
        "| model | method | mean err | log-sd err | max R-hat | min ESS | wall s (incl. compile) "
        "| wall / NUTS | data passes | step h | check_run | warnings |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['method']} | {fmt(r.get('mean_err'))} | "
            f"{fmt(r.get('sd_log_ratio'))} | {fmt(r.get('rhat'))} | "
            f"{fmt(r.get('min_ess'), '.0f')} | {fmt(r['wall_s'], '.1f')} | "
            f"{fmt(r['wall_over_nuts'], '.3f')} | "
            f"{'≈' if r['data_passes_note'] else ''}{fmt(r['data_passes'], '.1f')} | "
            f"{fmt(r['step_size'], '.2e')} | {r['checks'] or '–'} | {r['warnings_cell']} |")
    print("\n".join(lines))
    out = Path(args.out) if args.out else RESULTS / (
        f"bench_hierarchical{'_quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": command.strip(), "started": started, "wall_s": wall,
            "device": args.device,
            "machine": f"{platform.platform()}, {os.cpu_count()} cores, jax {jax.__version__}",
            "data_info": data.info, "reference": {**ref.meta, "cached": ref.cached},
            "reference_resolution": {"mean_err": res_mean, "sd_log_ratio": res_sd},
            "load_average_at_end": os.getloadavg()}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=json_default))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
