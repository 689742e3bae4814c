"""Hierarchical and scale models (issue 34): default kernels against long full-data NUTS.

Problems (``_hier_models.suite``): a centred hierarchical normal model with Uniform(0, 100)
scales and a non-centred one with HalfNormal scales (100 groups of 1 to ~1000 rows), a
hierarchical logistic regression with varying intercepts and slopes (80 groups), a sparse
logistic regression with Gamma(0.5, 0.5) scales and a horseshoe linear regression. Each is run
as a user runs it: ``SGLD(model)`` and ``SGHMC(model)`` at default arguments under the
package's ``MCMC`` (4 vectorized chains), and the proxies alone (Laplace, variational: draws,
no MCMC). The reference is NumPyro NUTS on the full data, 1000 + 10,000 draws
(``hier_refs.py``, cached).

Columns: worst-coordinate |mean error| and |log sd ratio| in reference posterior sds over the
compared sites (chains pooled), min bulk ESS, max split R-hat, wall seconds from the kernel's
construction to the draws (compilation and preprocessing included) beside NUTS's wall time for
the same number of draws, data passes, and the warnings raised (with the run checks).

    python benchmarks/bench_hierarchical.py                 # 4 chains x (1000 + 10,000)
    python benchmarks/bench_hierarchical.py --quick         # 4 chains x (500 + 2500)
    python benchmarks/bench_hierarchical.py --problems normal-centred --methods sgld
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _hier_models import suite  # noqa: E402
from _runs import (  # noqa: E402
    accuracy,
    add_device_option,
    fmt,
    json_default,
    run_kernel,
    run_proxy,
    warnings_cell,
)
from hier_refs import reference  # noqa: E402

from numpyro_subsample import (  # noqa: E402
    MCMC,
    SGHMC,
    SGLD,
    SGNHT,
    EnergyConservingHMC,
    centring_weights,
    partially_centred,
)
from numpyro_subsample.compare import flatten_draws  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KERNELS = {"sgld": SGLD, "sghmc": SGHMC}
#: kernels run on request only (``--methods``)
OTHER_KERNELS = {"sgnht": SGNHT, "ecs": EnergyConservingHMC,
                 "ecs-variational": partial(EnergyConservingHMC, proxy="variational")}
#: the same kernels on the model partially centred by `centring_weights` (its time is added)
CENTRED = {"sgld-pc": SGLD, "sghmc-pc": SGHMC}
PROXIES = {"laplace-proxy": "laplace", "variational-proxy": "variational"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_problem(problem, methods, *, warmup: int, samples: int, chains: int, seed: int):
    ref = reference(problem)
    ref_flat = flatten_draws(ref.samples, problem.sites)
    args = tuple(jnp.asarray(a) for a in problem.args)
    rows = []
    pc_model, pc_seconds = None, 0.0
    for m in methods:
        log(f"{problem.name}: {m}")
        if m in CENTRED and pc_model is None:
            t0 = time.perf_counter()
            centred = problem.centred_model or problem.model
            weights = centring_weights(SGLD(centred, seed=seed, progress_bar=False), args,
                                       problem.kwargs)
            pc_model, pc_seconds = partially_centred(centred, weights), time.perf_counter() - t0
            log(f"  centring weights in {pc_seconds:.1f} s: " + ", ".join(
                f"{k} {np.min(c):.2f}-{np.max(c):.2f}" for k, c in weights.items()))
        if m in CENTRED:
            def build(cls=CENTRED[m]):
                return cls(pc_model, seed=seed, progress_bar=False)

            run = run_kernel(m, build, args, problem.kwargs, num_warmup=warmup,
                             num_samples=samples, num_chains=chains, seed=seed,
                             mcmc_class=MCMC)
            run.wall_s += pc_seconds
        elif m in PROXIES:
            run = run_proxy(m, PROXIES[m], problem.model, args, problem.kwargs,
                            num_draws=chains * samples, seed=seed)
        else:
            def build(cls={**KERNELS, **OTHER_KERNELS}[m]):
                return cls(problem.model, seed=seed, progress_bar=False)

            run = run_kernel(m, build, args, problem.kwargs, num_warmup=warmup,
                             num_samples=samples, num_chains=chains, seed=seed,
                             mcmc_class=MCMC)
        acc = accuracy(run, ref_flat, problem.sites)
        nuts_s = ref.nuts_wall_s(chains * samples)
        rows.append({"problem": problem.name, "method": m, "wall_s": run.wall_s,
                     "compile_s": run.compile_s, "prep_s": run.prep_s,
                     "data_passes": run.data_passes, "step_size": run.step_size,
                     "cost": run.extra.get("cost", []),
                     "nuts_wall_s": nuts_s, "warnings": run.warnings, "checks": run.checks,
                     "error": run.error, **acc, "warnings_cell": warnings_cell(run, 200)})
        log(f"  wall {run.wall_s:.1f} s, mean err {fmt(acc.get('mean_err'))}, log-sd "
            f"{fmt(acc.get('sd_log_ratio'))}, ESS {fmt(acc.get('min_ess'), '.0f')}, "
            f"warnings {len(run.warnings)} {run.error}")
    res_mean, res_sd = ref.resolvable_sd()
    meta = {"reference_min_ess": ref.meta["min_ess"], "resolves": [res_mean, res_sd],
            "reference_divergences": ref.meta["divergences"],
            "num_data": int(problem.args[0].shape[0]), "info": problem.info}
    return rows, meta


def preprocessing_cell(cost) -> str:
    """The preprocessing's data passes, with those of the pilot chains (the adapted proxy's
    warm-up) and of the bias probe: "total (pilot; probe)"."""
    if not cost:
        return "–"
    stages = dict(cost)
    return (f"{sum(stages.values()):.1f} ({stages.get('pilot chains', 0.0):.1f}; "
            f"{stages.get('bias probe', 0.0):.1f})")


def markdown(rows, metas, command, started, wall, settings, settings_device,
             script: str = "bench_hierarchical.py") -> str:
    lines = [
        f"## {script}",
        "",
        f"`{command}` ({started}, {wall / 60:.0f} min; {platform.machine()}, "
        f"{os.cpu_count()} cores, device {settings_device}; the machine was shared "
        f"with other jobs: timings indicative). {settings}. Errors: worst coordinate over the "
        "compared sites, in reference posterior sds (chains pooled). Reference: full-data NUTS, "
        "1000 + 10,000 draws (target accept 0.9).",
        "",
    ]
    for name, meta in metas.items():
        lines.append(f"- {name}: N = {meta['num_data']}, {meta['info']}; reference min ESS "
                     f"{meta['reference_min_ess']:.0f} (resolves {meta['resolves'][0]:.3f} in "
                     f"the mean, {meta['resolves'][1]:.3f} in log sd), "
                     f"{meta['reference_divergences']} divergences")
    lines += ["", "| problem | method | mean err | log-sd err | min ESS | max R-hat | wall s "
              "(incl. compile) | NUTS wall s | data passes | of which preprocessing (pilot; "
              "probe) | step h | checks | warnings |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['problem']} | {r['method']} | {fmt(r.get('mean_err'), '.2f')} | "
            f"{fmt(r.get('sd_log_ratio'), '.2f')} | {fmt(r.get('min_ess'), '.0f')} | "
            f"{fmt(r.get('rhat'), '.3f')} | {fmt(r['wall_s'], '.1f')} | "
            f"{fmt(r['nuts_wall_s'], '.1f')} | {fmt(r['data_passes'], '.1f')} | "
            f"{preprocessing_cell(r.get('cost'))} | {fmt(r['step_size'], '.3g')} | "
            f"{r['checks'] or '–'} | {r['warnings_cell']} |")
    return "\n".join(lines)


def main(argv=None, *, problems: dict | None = None, script: str = "bench_hierarchical.py",
         methods: tuple = (*KERNELS, *PROXIES), description: str = __doc__) -> int:
    """The command line of this benchmark, or of another suite's (``bench_models.py``):
    ``problems`` (name → ``Problem``), the table's ``script`` name and default ``methods``."""
    p = argparse.ArgumentParser(description=description.split("\n")[0])
    problems = suite() if problems is None else problems
    p.add_argument("--problems", default=",".join(problems))
    p.add_argument("--methods", default=",".join(methods))
    p.add_argument("--num-warmup", type=int, default=None)
    p.add_argument("--num-samples", type=int, default=None)
    p.add_argument("--num-chains", type=int, default=4)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    add_device_option(p)
    args = p.parse_args(argv)
    names = [s for s in args.problems.split(",") if s]
    methods = [s for s in args.methods.split(",") if s]
    unknown = [n for n in names if n not in problems] + [
        m for m in methods
        if m not in KERNELS and m not in OTHER_KERNELS and m not in PROXIES and m not in CENTRED]
    if unknown:
        p.error(f"unknown problems or methods: {unknown}")
    W = args.num_warmup or (500 if args.quick else 1000)
    S = args.num_samples or (2500 if args.quick else 10_000)
    command = f"python benchmarks/{script} " + " ".join(
        argv if argv is not None else sys.argv[1:])
    started = time.strftime("%Y-%m-%d %H:%M")
    t0 = time.perf_counter()
    rows, metas = [], {}
    for name in names:
        try:
            r, meta = run_problem(problems[name], methods, warmup=W, samples=S,
                                  chains=args.num_chains, seed=args.seed)
        except Exception as err:  # noqa: BLE001 - a reference that fails must not stop the rest
            log(f"{name}: failed: {type(err).__name__}: {err}")
            continue
        rows += r
        metas[name] = meta
        # each compiled CPU program holds memory mappings: a run over many models reached the
        # kernel's vm.max_map_count (65530) at the twentieth of --batch 1 ("LLVM compilation
        # error: Cannot allocate memory"); the next problem compiles its own programs anyway
        jax.clear_caches()
    wall = time.perf_counter() - t0
    settings = f"{args.num_chains} chains x ({W} + {S}) steps, default options"
    text = markdown(rows, metas, command.strip(), started, wall, settings,
                    args.device or f"{jax.devices()[0].platform} (default)", script)
    print(text)
    out = Path(args.out) if args.out else RESULTS / f"{Path(script).stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "meta": metas, "markdown": text}, indent=1,
                              default=json_default))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
