"""LDA with SGRLD (Patterson and Teh 2013) and CP-SGRLD (Fu and Zhang 2023, Fig. 4) against
scikit-learn's online variational LDA (Hoffman, Blei and Bach 2010) on a synthetic corpus.

    python benchmarks/bench_lda.py [--quick]

The model (:mod:`lda`): topics global Dirichlet (SGRLD), each document's topic proportions a
local site drawn by an exact Gibbs step given the topics for the documents of each subsample
(``LocalConfig.update``), or by the package's default MALA steps. Measured on held-out documents by
document completion: θ_d folded in from a random half of each document's tokens with the
topics fixed (the same procedure for every method), perplexity on the other half. Rows: each
method's wall time including compilation, data passes, perplexity of the posterior predictive
(averaged over the draws of the second half of the run) and topic recovery (mean L1 distance
from each true topic to the nearest estimated one); scikit-learn at several numbers of passes
(its wall time grows with them), so the comparison at equal wall time reads off the table; the
Fig. 4 curve: perplexity of single draws against the iteration for SGRLD and CP-SGRLD.
The step a of ε_t = a (1 + t/b)^(−0.55) is chosen for SGRLD from a grid by the perplexity on
separate validation documents (a short run each) and shared by CP-SGRLD, as in paper 001.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import jax
import numpy as np
from _runs import run_kernel, warnings_cell, write_results
from lda import (
    completion_probs,
    draws_perplexity,
    lda_local_gibbs,
    lda_model,
    perplexity,
    sklearn_online_lda,
    split_documents,
    synthetic_corpus,
    to_tokens,
    topic_recovery,
)

from numpyro_subsample import SGRLD, LocalConfig, StrataOptions

RESULTS = Path(__file__).parent / "results"


def sizes(quick: bool) -> dict:
    if quick:
        return dict(docs=1000, vocab=300, topics=10, length=80, test=200, subsample=50,
                    steps=2000, tune_steps=500, strata=5, passes=(1, 2, 5, 10),
                    seeds=(0, 1, 2, 3, 4))
    return dict(docs=5000, vocab=1000, topics=20, length=100, test=500, subsample=50,
                steps=10000, tune_steps=1000, strata=5, passes=(1, 2, 5, 10, 20, 50),
                seeds=(0, 1, 2, 3, 4))


def sgrld_run(method: str, train, tokens, K: int, n: int, steps: int, a: float, *,
              local_update, estimator: str = "uniform", features=None, num_strata: int = 5,
              seed: int = 0):
    kw = {} if features is None else {"strata": StrataOptions(features=features,
                                                               num_strata=num_strata)}
    return run_kernel(
        method,
        lambda: SGRLD(lda_model, step_size=a, schedule="polynomial", estimator=estimator,
                      local=LocalConfig(update=local_update), **kw),
        (train, tokens, K, n), {}, num_warmup=0, num_samples=steps, seed=seed,
    )


def evaluate(run, observed, held_out, true, curve_points: int = 20) -> dict:
    if run.error:
        return {"error": run.error}
    betas = run.samples["topics"][0]  # (S, K, V)
    S = betas.shape[0]
    second = betas[S // 2 :: max(1, (S // 2) // 20)]
    every = max(1, S // curve_points)
    curve = [(int(t + 1), perplexity(completion_probs(betas[t], observed), held_out))
             for t in range(every - 1, S, every)]
    return {
        "perplexity": draws_perplexity(second, observed, held_out),
        "recovery": topic_recovery(second.mean(0), true),
        "curve": curve,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small corpus (minutes)")
    p.add_argument("--out", help="JSON output (default benchmarks/results/bench_lda.json)")
    p.add_argument("--md", help="also write the markdown table here")
    p.add_argument("--methods", help="comma-separated substrings: run only the SGRLD rows "
                   "whose name contains one (e.g. 'MALA')")
    p.add_argument("--step", type=float, help="skip the tuning grid and use this step a")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(p)
    args = p.parse_args(argv)
    cfg = sizes(args.quick)
    K, n = cfg["topics"], cfg["subsample"]
    counts, true = synthetic_corpus(cfg["docs"] + 2 * cfg["test"], cfg["vocab"], K,
                                    cfg["length"], seed=0)
    train = counts[: cfg["docs"]]
    valid_obs, valid_ho = split_documents(counts[cfg["docs"]: cfg["docs"] + cfg["test"]], 1)
    observed, held_out = split_documents(counts[cfg["docs"] + cfg["test"]:], 2)
    tokens = to_tokens(train)
    res: dict = {"config": cfg, "true_topics": perplexity(completion_probs(true, observed),
                                                            held_out)}

    sk = []
    for passes in cfg["passes"]:
        beta, secs = sklearn_online_lda(train, K, n, passes)
        sk.append({"passes": passes, "wall_s": secs,
                   "perplexity": perplexity(completion_probs(beta, observed), held_out),
                   "recovery": topic_recovery(beta, true)})
        print(f"sklearn {passes} passes: {secs:.1f} s, perplexity {sk[-1]['perplexity']:.2f}")
    res["sklearn"] = sk

    grid = {}
    t0 = time.perf_counter()
    for a in (0.003, 0.01, 0.03, 0.1) if args.step is None else ():
        run = sgrld_run("tune", train, tokens, K, n, cfg["tune_steps"], a,
                        local_update=lda_local_gibbs)
        if run.error:
            grid[a] = math.inf
            continue
        last = run.samples["topics"][0][-cfg["tune_steps"] // 4:: 25]
        grid[a] = draws_perplexity(last, valid_obs, valid_ho)
        print(f"tune a={a}: validation perplexity {grid[a]:.2f}")
    a = min(grid, key=grid.get) if args.step is None else args.step
    res["tuning"] = {"grid": grid, "chosen": a, "seconds": time.perf_counter() - t0}

    freq = train / np.maximum(train.sum(1, keepdims=True), 1.0)
    rows = {}
    for method, kw, seeds in (
        ("SGRLD, Gibbs locals", dict(local_update=lda_local_gibbs), cfg["seeds"]),
        ("CP-SGRLD, Gibbs locals", dict(local_update=lda_local_gibbs, estimator="stratified",
                                        features=freq, num_strata=cfg["strata"]),
         cfg["seeds"]),
        ("SGRLD, MALA locals (default 5 steps)", dict(local_update=None), (0,)),
    ):
        wanted = args.methods.split(",") if args.methods else [""]
        if not any(w in method for w in wanted):
            continue
        for seed in seeds:
            run = sgrld_run(method, train, tokens, K, n, cfg["steps"], a, seed=seed, **kw)
            row = {"seed": seed, "wall_s": run.wall_s, "compile_s": run.compile_s,
                   "data_passes": run.data_passes, "warnings": warnings_cell(run),
                   **evaluate(run, observed, held_out, true)}
            rows.setdefault(method, []).append(row)
            print(f"{method}, seed {seed}: {row.get('perplexity', math.nan):.2f} in "
                  f"{run.wall_s:.1f} s")
    res["sgrld"] = rows
    write_results(res, "bench_lda", markdown, quick=args.quick, out=args.out, md=args.md,
                  argv=argv, folder=RESULTS)


def markdown(res: dict, command: str) -> str:
    cfg = res["config"]
    out = [f"`{command}` ({time.strftime('%Y-%m-%d %H:%M')}):", "",
           f"Synthetic corpus from LDA with {cfg['topics']} known topics: {cfg['docs']} "
           f"training documents, vocabulary {cfg['vocab']}, mean length {cfg['length']}; "
           f"{cfg['test']} held-out documents (document completion); n = {cfg['subsample']} "
           f"documents per step (CP: k = {cfg['strata']} k-means strata of the documents' word "
           f"frequencies, as paper 001), {cfg['steps']} SGRLD steps (no warm-up discarded; the "
           "predictive averages draws of the second half). Perplexity with the true topics: "
           f"{res['true_topics']:.2f}. Step a = {res['tuning']['chosen']} chosen from "
           f"{ {k: round(v, 2) for k, v in res['tuning']['grid'].items()} } (validation "
           f"perplexity, {cfg['tune_steps']} steps each, {res['tuning']['seconds']:.0f} s).", "",
           "| method | wall s (incl. compile) | data passes | held-out perplexity | "
           "topic recovery (L1) | warnings |", "|---|---|---|---|---|---|"]
    for r in res["sklearn"]:
        out.append(f"| scikit-learn online LDA, {r['passes']} passes | {r['wall_s']:.1f} | "
                   f"{r['passes']} | {r['perplexity']:.2f} | {r['recovery']:.3f} | – |")
    for method, runs in res["sgrld"].items():
        for r in runs:
            label = f"{method}, seed {r['seed']}"
            if "error" in r:
                out.append(f"| {label} | – | – | – | – | **failed**: {r['error'][:120]} |")
                continue
            out.append(f"| {label} | {r['wall_s']:.1f} ({r['compile_s']:.1f}) | "
                       f"{r['data_passes']:.1f} | {r['perplexity']:.2f} | "
                       f"{r['recovery']:.3f} | {r['warnings']} |")
    out += ["", "Over the seeds (perplexity / recovery): " + "; ".join(
        f"{m}: median {np.median([r['perplexity'] for r in runs if 'perplexity' in r]):.2f} / "
        f"{np.median([r['recovery'] for r in runs if 'recovery' in r]):.3f}, worst "
        f"{max(r['perplexity'] for r in runs if 'perplexity' in r):.2f}"
        for m, runs in res["sgrld"].items() if any("perplexity" in r for r in runs))]
    ok = {m: [r for r in runs if "curve" in r] for m, runs in res["sgrld"].items()}
    ok = {m: runs for m, runs in ok.items() if runs}
    out += ["", "Perplexity of single draws against the iteration (paper 001, Fig. 4), mean "
            "over the seeds:", "", "| iteration | " + " | ".join(ok) + " |",
            "|---" * (1 + len(ok)) + "|"]
    curves = [{t: np.mean([dict(r["curve"])[t] for r in runs]) for t in dict(runs[0]["curve"])}
              for runs in ok.values()]
    for t in sorted(curves[0]) if curves else []:
        out.append(f"| {t} | " + " | ".join(f"{c.get(t, math.nan):.2f}" for c in curves) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    jax.config.update("jax_platforms", "cpu")
    main()
