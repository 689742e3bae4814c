"""Paper 002's logistic-regression experiment (Baker, Fearnhead, Fox and Nemeth 2019, Sect. 5.1,
Fig. 1): test log predictive density against wall time for SGLD, SGLD-CV, SAGA and SVRG at
three training-set sizes, setup cost included.

Data: ``covtype_subset20k`` (20,000 rows of covertype, ``shared/data``), rows permuted with
``--seed``, the first ``--test-frac`` (20 %) held out as the test set, the rest the training
pool; the three fits use the first 10 %, 30 % and 100 % of the pool (the paper: about 1 % to
100 % of the 581,012 rows). Features standardised on the whole training pool with the rule of
``_refs.standardise`` (continuous columns z-scored, binary columns centred on their 0/1 scale,
columns constant on the pool dropped); the same transform is applied to the test rows.
Model: ``_refs.logistic_model`` (α ~ N(0, 2.5²), β_j ~ N(0, 1), Bernoulli-logit; the paper
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
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _refs  # noqa: E402

if TYPE_CHECKING:
    from numpyro_subsample import SGLD, Proxy

RESULTS = HERE / "results"
DATASET = "covtype_subset20k"
SG_METHODS = {"sgld": "uniform", "sgld-cv": "cv", "sgld-saga": "saga", "sgld-svrg": "svrg"}
LABELS = {"sgld": "SGLD", "sgld-cv": "SGLD-CV", "sgld-saga": "SGLD-SAGA",
          "sgld-svrg": "SGLD-SVRG", "laplace": "Laplace proxy (no MCMC)", "nuts": "NUTS"}
COLOURS = {"sgld": "tab:blue", "sgld-cv": "tab:orange", "sgld-saga": "tab:green",
           "sgld-svrg": "tab:red", "laplace": "tab:purple", "nuts": "black"}
TOLERANCES = (0.01, 0.001)
MAX_CHECKPOINTS = 200


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- data -------------------------------------------------------------------------------------
def fit_standardiser(X: np.ndarray) -> dict:
    """The parameters of ``_refs.standardise`` on the rows ``X``: kept columns, centre, scale."""
    X = np.asarray(X, np.float64)
    sd = X.std(0)
    keep = sd > 0
    Xk = X[:, keep]
    binary = np.array([np.unique(Xk[:, j]).size == 2 for j in range(Xk.shape[1])], bool)
    return {"keep": keep, "mean": Xk.mean(0), "scale": np.where(binary, np.ptp(Xk, 0), sd[keep])}


def apply_standardiser(params: dict, X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, np.float64)[:, params["keep"]]
    return ((X - params["mean"]) / params["scale"]).astype(np.float32)


def load_split(data_dir: str | None, test_frac: float, seed: int) -> dict:
    """Permuted rows of covtype_subset20k: test set and training pool, standardised on the
    pool (the transform of ``_refs.standardise``, checked against it)."""
    path = Path(data_dir or _refs.DATA_DIR) / DATASET / f"{DATASET}.npz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; pass --data-dir (the folder holding "
                                f"{DATASET}/{DATASET}.npz).")
    with np.load(path) as z:
        X, y = np.asarray(z["X"]), np.asarray(z["y"], np.float32)
    perm = np.random.default_rng(seed).permutation(X.shape[0])
    num_test = int(round(test_frac * X.shape[0]))
    test, pool = perm[:num_test], perm[num_test:]
    params = fit_standardiser(X[pool])
    Z_pool = apply_standardiser(params, X[pool])
    np.testing.assert_allclose(Z_pool, _refs.standardise(X[pool])[0], rtol=1e-5, atol=1e-5)
    return {"Z_pool": Z_pool, "y_pool": y[pool], "Z_test": apply_standardiser(params, X[test]),
            "y_test": y[test], "source": str(path), "rows": int(X.shape[0]),
            "dropped_columns": int((~params["keep"]).sum())}


def train_size(pool_rows: int, frac: float) -> int:
    return int(round(frac * pool_rows))


# -- one method in a fresh process ---------------------------------------------------------------
def start_proxy(args: tuple, kwargs: dict, seed: int) -> Proxy:
    """A ``Proxy`` at the prior median θ0 (the model's initial point) with identity covariance
    and Σ_i ∇f_i(θ0) (one data pass): SAGA's table and SVRG's anchor then start at θ0, where
    the chain starts, as in Dubey et al. (2016), instead of at the Laplace mode."""
    import jax

    from numpyro_subsample import ModelData, Proxy, build_potential

    # not public: one full-data pass for value, gradient and Hessian
    from numpyro_subsample.core.datapass import value_grad_hessian

    data = ModelData.from_args(args, kwargs)
    pot = build_potential(_refs.logistic_model, data, jax.random.PRNGKey(seed))
    theta0 = pot.init_theta
    full = value_grad_hessian(pot, theta0, data, hessian=False)[1]
    sum_grads = full - jax.grad(lambda t: pot.prior(t, data))(theta0)
    eye = jax.numpy.eye(theta0.shape[0], dtype=theta0.dtype)
    return Proxy(theta0, eye, eye, None, sum_grads, 1.0, 0.0, "start", {})


def build_kernel(method: str, spec: dict, args: tuple, kwargs: dict) -> SGLD:
    """The kernel of ``method`` in ``spec["setting"]``: ``"default"``, the package's defaults;
    ``"paper"``, no preconditioning and the common constant step ``spec["step_size"]``, SGLD,
    SAGA and SVRG starting at the prior median θ0 (SAGA's table and SVRG's anchor there too)
    and SGLD-CV at the Laplace mode θ̂ (its centring value), as Baker et al. (2019, Sect. 5)."""
    from numpyro_subsample import SGLD  # noqa: F811 - imported here, in the worker only

    est = SG_METHODS[method]
    common = {"estimator": est, "seed": spec["seed"], "progress_bar": False}
    if spec["setting"] == "default":
        return SGLD(_refs.logistic_model, **common)
    paper = {**common, "preconditioning": False, "step_size": spec["step_size"],
             "init_strategy": "centre"}
    if est in ("uniform", "cv"):
        return SGLD(_refs.logistic_model, **paper)
    return SGLD(_refs.logistic_model, proxy=start_proxy(args, kwargs, spec["seed"]), **paper)


def _worker(spec: dict) -> None:
    """Run one method on one size; write its draws (``.npz``) and facts (``.json``)."""
    import jax
    import jax.numpy as jnp
    from _runs import run_proxy
    from numpyro.infer import MCMC

    from numpyro_subsample.compare import CompileTimer

    split = load_split(spec["data_dir"], spec["test_frac"], spec["seed"])
    N = spec["num_data"]
    args = (jnp.asarray(split["Z_pool"][:N]), jnp.asarray(split["y_pool"][:N]))
    cpu0 = time.process_time()
    kwargs = {"subsample_size": spec["subsample_size"]}
    method, out = spec["method"], Path(spec["out"])
    meta: dict = {"method": method}
    if method == "laplace":
        run = run_proxy("laplace", "laplace", _refs.logistic_model, args, kwargs,
                        num_draws=spec["proxy_draws"], seed=spec["seed"])
        if run.error:
            raise RuntimeError(run.error)
        samples = {k: v[0] for k, v in run.samples.items()}
        S = samples["alpha"].shape[0]
        meta.update(setup_s=run.prep_s, wall_s=run.wall_s, compile_s=run.compile_s,
                    warnings=run.warnings)
        times = np.full(S, run.wall_s)
        passes = np.full(S, run.data_passes)
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with CompileTimer() as ct_prep:
                t0 = time.perf_counter()
                kernel = build_kernel(method, spec, args, kwargs)
                kernel.preprocess(args, kwargs)
                prep_s = time.perf_counter() - t0
            mcmc = MCMC(kernel, num_warmup=0, num_samples=spec["steps"],
                        thinning=spec["thin"], progress_bar=False)
            with CompileTimer() as ct_run:
                t1 = time.perf_counter()
                mcmc.run(jax.random.PRNGKey(spec["seed"]), *args, extra_fields=("data_passes",),
                         **kwargs)
                samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
                run_s = time.perf_counter() - t1
        passes = np.asarray(mcmc.get_extra_fields()["data_passes"], np.float64)
        S = passes.shape[0]
        sampling_s = run_s - ct_run.seconds
        setup_s = prep_s + ct_run.seconds
        times = setup_s + sampling_s * np.arange(1, S + 1) / S
        # the explicit step of the paper-like setting raises SGLD's DeprecationWarning about
        # the step-size convention (h, not ε = 2h): not a finding, left out
        texts = sorted({f"{w.category.__name__}: {' '.join(str(w.message).split())}"
                        for w in caught if not issubclass(w.category, DeprecationWarning)})
        meta.update(setup_s=setup_s, prep_s=prep_s, chain_compile_s=ct_run.seconds,
                    compile_s=ct_prep.seconds + ct_run.seconds, sampling_s=sampling_s,
                    wall_s=prep_s + run_s, step_size=float(kernel.step_size),
                    preprocessing_passes=float(kernel.preprocessed.data_passes),
                    warnings=texts, steps=spec["steps"], thin=spec["thin"])
        if SG_METHODS[method] == "svrg":
            meta["update_every"] = int(kernel.preprocessed.estimator.info["update_every"])
    meta.update(setting=spec["setting"], cpu_s=time.process_time() - cpu0)
    np.savez(out.with_suffix(".npz"), times=times, passes=passes, **samples)
    out.with_suffix(".json").write_text(json.dumps(meta, default=float))


def run_in_subprocess(spec: dict, tmp: Path) -> tuple[dict, dict]:
    """``_worker(spec)`` in a fresh interpreter; returns (facts, arrays) or raises."""
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
                              _refs.logistic_model,
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
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(p)
    args = p.parse_args(argv)
    if args.worker:
        _worker(json.loads(args.worker))
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
