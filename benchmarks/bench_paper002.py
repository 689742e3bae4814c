"""Paper 002's logistic-regression experiment (Baker, Fearnhead, Fox and Nemeth 2019, Sect. 5.1,
Fig. 1): test log predictive density against wall time for SGLD, SGLD-CV, SAGA and SVRG at
three training-set sizes, setup cost included.

Data: ``covtype_subset20k`` (20,000 rows of covertype, ``shared/data``), rows permuted with
``--seed``, the first ``--test-frac`` (20 %) held out as the test set, the rest the training
pool; the three fits use the first 10 %, 30 % and 100 % of the pool (the paper: about 1 % to
100 % of the 581,012 rows). Features standardised on the whole training pool with the rule of
``_ref_models.standardise`` (continuous columns z-scored, binary columns centred on their 0/1 scale,
columns constant on the pool dropped); the same transform is applied to the test rows.
Model: ``_ref_models.logistic_model`` (α ~ N(0, 2.5²), β_j ~ N(0, 1), Bernoulli-logit; the paper
puts a Laplace(0, 1) prior on β and no separate intercept).

Methods: ``numpyro_subsample.SGLD`` with only the estimator changed: ``uniform`` (SGLD),
``cv`` (SGLD-CV), ``saga``, ``svrg`` (anchor refreshed every ⌈N/n⌉ steps), in two settings
(``--settings``):

- ``default``: the package's defaults (Laplace proxy, preconditioning, start at a proxy draw,
  step size from the measured gradient noise with δ = 0.05, noise correction for uniform and
  cv);
- ``paper``: as Baker et al. (2019, Sect. 5), no preconditioning and a constant step, here one
  step for all four, h = κ·λ_min(Σ_NUTS) (κ = 0.1 over the posterior's largest curvature, read
  offline from the NUTS reference and not timed, as the paper's grid search is not; the paper
  tunes each method, with values in an appendix our copy lacks); SGLD, SAGA and SVRG start at
  the prior median θ0 = 0, SAGA's table and SVRG's anchor at θ0 too (Dubey et al. 2016;
  :func:`start_proxy`, one data pass, timed), and SGLD-CV starts at its centring value, the
  Laplace mode (found by a full-data optimiser, where the paper uses SGD).

Subsample size: fixed across the three sizes as in the paper (500 for all its sizes); here n =
1 % of the largest training size (160 by default, ``--subsample-size``), drawn with
replacement. Also the Laplace proxy alone (independent draws from N(θ̂, Σ̂),
``_runs.run_proxy``) and full-data NUTS (dense mass, ``_refs.get_reference``, cached in
``benchmarks/results/reference_cache``), whose posterior predictive is the reference.

Each method runs in a fresh Python process (no compiled program or fitted proxy shared with
another method), as one ``numpyro.infer.MCMC`` run of ``--steps`` steps (no warm-up: the
burn-in, if any, is in the curve), keeping every ``--thin``-th state (the paper evaluates every
10 iterations). Wall time = setup (kernel construction and preprocessing: proxy fit, noise
measurement, step size, all with their compilation) + the run (compilation of the chain, then
sampling). Draw j of S gets the time stamp setup + chain compile + (j + 1)/S × sampling
seconds: the compiled loop runs at a constant cost per step, so its draws are spread evenly
over its sampling seconds. Data passes are the kernels' ``data_passes`` field at each draw. The
process's CPU seconds are recorded beside the wall seconds (on a shared machine their ratio
shows how much of the wall time the process had the CPU).

Metric at a checkpoint (draw j): the average over test rows of log p(y*|x*, draws), the
posterior predictive being the mean of the likelihood over the last half of the draws so far
(draws ⌊j/2⌋..j: a growing window that drops the early half, as a warm-up would). NUTS's value
uses all its draws. Reported per size and method: setup s, total wall s, data passes, final
value, its gap to NUTS's, and the time from which the curve stays within 0.01 (and 0.001)
nats/row of NUTS's value.

    python benchmarks/bench_paper002.py            # full: 3 sizes, 20,000 steps (~15 min)
    python benchmarks/bench_paper002.py --quick    # 2 sizes, 3,000 steps, NUTS 300 + 1,000

Writes ``benchmarks/results/bench_paper002[_quick].json`` and ``.png`` and prints a markdown
section on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _ref_models  # noqa: E402
import _refs  # noqa: E402
from _paper002_report import SETTING_NOTES, markdown, plot  # noqa: E402
from _paper002_worker import (  # noqa: E402
    DATASET,
    SG_METHODS,
    load_split,
    log,
    run_worker,
    train_size,
)
from _runs import parse_args_or_run_worker  # noqa: E402

RESULTS = HERE / "results"
TOLERANCES = (0.01, 0.001)
MAX_CHECKPOINTS = 200


def run_in_subprocess(spec: dict, tmp: Path) -> tuple[dict, dict]:
    """``run_worker(spec)`` (``_paper002_worker.py``) in a fresh interpreter; returns (facts,
    arrays) or raises."""
    spec = {**spec, "out": str(tmp / f"{spec['method']}_{spec['setting']}_{spec['num_data']}")}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker",
                           json.dumps(spec)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed ({proc.returncode}): {proc.stderr[-3000:]}")
    out = Path(spec["out"])
    meta = json.loads(out.with_suffix(".json").read_text())
    with np.load(out.with_suffix(".npz")) as z:
        arrays = {k: np.asarray(z[k]) for k in z.files}
    return meta, arrays


# -- metric -------------------------------------------------------------------------------------
def test_loglik(alpha: np.ndarray, beta: np.ndarray, Z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """log p(y_t | x_t, θ_s), (S, T), float64."""
    logits = np.asarray(alpha, np.float64)[:, None] + np.asarray(beta, np.float64) @ \
        np.asarray(Z, np.float64).T
    sign = np.where(np.asarray(y) > 0.5, 1.0, -1.0)
    return -np.logaddexp(0.0, -sign * logits)


def predictive_lpd(ll: np.ndarray) -> float:
    """(1/T) Σ_t log((1/S) Σ_s p(y_t | x_t, θ_s)) for the rows ``ll`` (S, T)."""
    m = ll.max(0)
    return float(np.mean(m + np.log(np.mean(np.exp(ll - m), 0))))


def curve(ll: np.ndarray, max_points: int = MAX_CHECKPOINTS) -> tuple[np.ndarray, np.ndarray]:
    """Checkpoint draw indices j and the predictive lpd of draws ⌊j/2⌋..j at each."""
    S = ll.shape[0]
    idx = np.unique(np.r_[np.linspace(0, S - 1, max_points).round().astype(int), S - 1])
    return idx, np.array([predictive_lpd(ll[j // 2: j + 1]) for j in idx])


def time_within(times: np.ndarray, gaps: np.ndarray, tol: float) -> float | None:
    """First checkpoint time from which |gap| ≤ tol up to the end (None if never)."""
    bad = np.flatnonzero(np.abs(gaps) > tol)
    start = 0 if bad.size == 0 else bad[-1] + 1
    return None if start >= len(times) else float(times[start])


# -- driver -------------------------------------------------------------------------------------
def nuts_reference(split: dict, N: int, settings, seed_tag: str) -> tuple[dict, dict]:
    import jax.numpy as jnp

    ref = _refs.get_reference(f"paper002_{DATASET}_{seed_tag}_N{N}", "logistic_std",
                              _ref_models.logistic_model,
                              (jnp.asarray(split["Z_pool"][:N]), jnp.asarray(split["y_pool"][:N])),
                              {"subsample_size": N}, settings)
    m = ref.meta
    facts = {"wall_s": m["wall_s"], "compile_s": m["compile_s"], "warmup_s": m["warmup_s"],
             "sampling_s": m["sampling_s"], "min_ess": m["min_ess"], "cached": ref.cached,
             "divergences": m["divergences"], "settings": m["settings"],
             "data_passes": m["warmup_leapfrog_steps"] + m["sampling_leapfrog_steps"],
             "cpu_s": m["cpu_s_warmup_incl_compile"] + m["cpu_s_sampling_incl_compile"]}
    return facts, ref.samples


def run_size(split: dict, frac: float, args, tmp: Path, nuts_settings) -> dict:
    N = train_size(split["Z_pool"].shape[0], frac)
    Zt, yt = split["Z_test"], split["y_test"]
    seed_tag = f"test{args.test_frac}_seed{args.seed}"
    log(f"N={N}: NUTS reference {nuts_settings.tag()} ...")
    nuts_facts, nuts_samples = nuts_reference(split, N, nuts_settings, seed_tag)
    ref_lpd = predictive_lpd(test_loglik(nuts_samples["alpha"], nuts_samples["beta"], Zt, yt))
    log(f"N={N}: NUTS lpd {ref_lpd:.5f} ({'cached' if nuts_facts['cached'] else 'computed'}, "
        f"{nuts_facts['wall_s']:.0f} s)")
    rows = {"nuts": {**nuts_facts, "final_lpd": ref_lpd, "gap": 0.0, "setting": "-"}}
    flat = np.concatenate([nuts_samples["alpha"][:, None], nuts_samples["beta"]], 1)
    lam_min = float(np.linalg.eigvalsh(np.cov(flat, rowvar=False)).min())
    paper_h = args.paper_kappa * lam_min  # κ / λ_max of the posterior precision
    spec = {"data_dir": args.data_dir, "test_frac": args.test_frac, "seed": args.seed,
            "num_data": N, "subsample_size": args.n, "steps": args.steps, "thin": args.thin,
            "proxy_draws": args.proxy_draws, "step_size": paper_h}
    jobs = [(m, st) for st in args.settings for m in args.methods if m != "laplace"]
    jobs += [("laplace", "-")] if "laplace" in args.methods else []
    for method, setting in jobs:
        key = row_key(method, setting)
        log(f"N={N}: {key} ...")
        try:
            meta, arr = run_in_subprocess({**spec, "method": method, "setting": setting}, tmp)
        except RuntimeError as err:
            log(f"  failed: {err}")
            rows[key] = {"error": str(err)[-600:], "setting": setting}
            continue
        ll = test_loglik(arr["alpha"], arr["beta"], Zt, yt)
        if method == "laplace":
            idx, lpd = np.array([ll.shape[0] - 1]), np.array([predictive_lpd(ll)])
        else:
            idx, lpd = curve(ll)
        gaps = lpd - ref_lpd
        row = {**meta, "final_lpd": float(lpd[-1]), "gap": float(gaps[-1]),
               "data_passes": float(arr["passes"][-1]),
               "curve": {"draw": idx.tolist(), "wall_s": arr["times"][idx].tolist(),
                         "data_passes": arr["passes"][idx].tolist(), "lpd": lpd.tolist(),
                         "single_draw_lpd": ll[idx].mean(1).tolist()}}
        for tol in TOLERANCES:
            row[f"time_within_{tol}"] = time_within(arr["times"][idx], gaps, tol)
        rows[key] = row
        log(f"  setup {meta['setup_s']:.1f} s, wall {meta['wall_s']:.1f} s, passes "
            f"{row['data_passes']:.0f}, lpd {row['final_lpd']:.5f} (gap {row['gap']:+.5f})"
            + (f", h {meta['step_size']:.3g}" if "step_size" in meta else ""))
    return {"num_data": N, "fraction": frac, "reference_lpd": ref_lpd, "paper_step_size": paper_h,
            "nuts_cov_min_eigenvalue": lam_min, "rows": rows}


def row_key(method: str, setting: str) -> str:
    return f"{method}@paper" if setting == "paper" else method


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="sizes 10 %% and 100 %%, 3,000 steps, NUTS 300 + 1,000")
    p.add_argument("--sizes", default=None, help="fractions of the training pool (0.1,0.3,1)")
    p.add_argument("--methods", default="sgld,sgld-cv,sgld-saga,sgld-svrg,laplace")
    p.add_argument("--settings", default="default,paper",
                   help="default (package defaults) and/or paper (paper-like, see the docstring)")
    p.add_argument("--paper-kappa", type=float, default=0.1,
                   help="paper-like step h = κ·λ_min(Σ_NUTS) (default 0.1)")
    p.add_argument("--steps", type=int, default=None, help="steps per chain (20,000; quick 3,000)")
    p.add_argument("--thin", type=int, default=10)
    p.add_argument("--subsample-size", type=int, default=None,
                   help="n for every size (default 1 %% of the largest training size)")
    p.add_argument("--test-frac", type=float, default=0.2)
    p.add_argument("--proxy-draws", type=int, default=1000)
    p.add_argument("--nuts-warmup", type=int, default=None, help="500 (quick 300)")
    p.add_argument("--nuts-samples", type=int, default=None, help="2000 (quick 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None, help="JSON path (the PNG goes beside it)")
    args = parse_args_or_run_worker(p, argv, run_worker)
    if args is None:
        return 0
    q = args.quick
    fracs = [float(f) for f in (args.sizes or ("0.1,1" if q else "0.1,0.3,1")).split(",")]
    args.steps = args.steps or (3000 if q else 20_000)
    args.methods = [m.strip() for m in args.methods.split(",")]
    args.settings = [x.strip() for x in args.settings.split(",")]
    if set(args.settings) - set(SETTING_NOTES):
        p.error(f"--settings: choose from {list(SETTING_NOTES)}")
    unknown = set(args.methods) - set(SG_METHODS) - {"laplace"}
    if unknown:
        p.error(f"unknown methods {sorted(unknown)}; choose from {[*SG_METHODS, 'laplace']}")
    nuts_settings = _refs.RefSettings(num_warmup=args.nuts_warmup or (300 if q else 500),
                                      num_samples=args.nuts_samples or (1000 if q else 2000),
                                      dense_mass=True, seed=args.seed)
    split = load_split(args.data_dir, args.test_frac, args.seed)
    pool = split["Z_pool"].shape[0]
    args.n = args.subsample_size or max(10, train_size(pool, max(fracs)) // 100)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        sizes = [run_size(split, f, args, Path(tmp), nuts_settings) for f in fracs]
    result = {
        "benchmark": "bench_paper002",
        "command": "python benchmarks/bench_paper002.py " + " ".join(sys.argv[1:] if argv is None
                                                                     else argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "total_s": time.perf_counter() - t0,
        "device": args.device,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {"dataset": DATASET, "source": split["source"], "seed": args.seed,
                     "test_frac": args.test_frac, "num_test": int(split["Z_test"].shape[0]),
                     "pool_rows": pool, "dim": int(split["Z_pool"].shape[1]) + 1,
                     "dropped_constant_columns": split["dropped_columns"],
                     "fractions": fracs, "subsample_size": args.n, "steps": args.steps,
                     "thin": args.thin, "methods": args.methods, "settings": args.settings,
                     "paper_kappa": args.paper_kappa, "proxy_draws": args.proxy_draws,
                     "nuts": {"num_warmup": nuts_settings.num_warmup,
                              "num_samples": nuts_settings.num_samples, "dense_mass": True},
                     "quick": q},
        "sizes": sizes,
    }
    out = Path(args.out) if args.out else RESULTS / f"bench_paper002{'_quick' if q else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=float))
    plot(result, out.with_suffix(".png"))
    log(f"wrote {out} and {out.with_suffix('.png')} ({result['total_s']:.0f} s)")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
