"""Bayesian probabilistic matrix factorisation: SGLD-CV against SGLD at equal wall time.

Paper 002's BPMF experiment (Baker, Fearnhead, Fox and Nemeth 2019, "Control variates for
stochastic gradient MCMC", Sect. 5.2 of our copy, Figs. 3-4: MovieLens ml-100k, D = 20,
minibatches of 5000, the formulation of Chen et al. 2014 with Gaussian-Wishart hyperpriors
updated by Gibbs steps) on a synthetic low-rank rating matrix, with fixed prior precisions
instead of the hyperpriors:

    U_l ~ N(0, s² I_D)  (l = 1..L users),   V_m ~ N(0, s² I_D)  (m = 1..M items),
    r_k | U, V ~ N(U_{l_k}ᵀ V_{m_k}, σ²)      for the training ratings k (the data plate),

s = D^{-1/4} (so that E (U_lᵀV_m)² = 1) and σ = 0.5, the values that generated the data: true
factors U*, V* drawn from the priors, a fraction ``--density`` of the L × M entries observed
(uniformly, without repetition), r = U*ᵀV* + σ ε; ``--test-frac`` of the observed ratings held
out. About 40 training ratings per user and 80 per item at both sizes. d = (L + M)·D is above
the dense-proxy limit, so ``proxy="laplace"`` is fitted as the structured low-rank proxy
(``sgmcmc.preprocess``, rank 20) from ``init_theta`` = 0.1·N(0, I) (the prior median U = V = 0
is a saddle of the posterior), with the curvature of ``--proxies``: ``hessian`` (the package's
choice above d = 2000: Hessian, Hutchinson diagonal) or ``fisher`` (the empirical Fisher,
``proxy_kwargs={"curvature": "fisher"}``).
Subsample size n = 1000 (``--subsample-size``; 4-5 % of the training ratings, the paper's
5000 of 10^5 is 5 %): the step's O(d·k) whitening dominates its cost below n ≈ 1000, the
gradient above, and the step the noise rule allows grows like n.

Rows, per proxy (``numpyro_subsample.SGLD`` with the package's defaults otherwise:
preconditioning by the structured proxy with the diagonal preconditioner adapted during
warm-up, chains started at proxy draws, the adapted coordinates' step size):

- SGLD-CV (``estimator="cv"``) and SGLD (``estimator="uniform"``), default steps;
- both at common steps h = m·h_CV for the multipliers m of ``--step-multipliers`` (default
  10 with ``--quick``, none otherwise; ``kernel.with_step_size``: the preprocessing is shared
  and its time charged again);
- ZV post-processing of the predictions (Baker et al. 2019, Sect. 4, Eq. 14) with degree 1:
  the package's ``post.zv.zv_fit`` on the default runs' draws (above 2000 parameters one
  linearised covariate ∇g_t(θ̂)ᵀΣ̂ŝ per prediction, ``docs/zv.md``; its result or the error it
  raises is recorded), and a local version: each test
  prediction g = U_lᵀV_m corrected with the 2D stored gradient coordinates of U_l and V_m (a
  subset of the degree-1 control variates, still zero-mean), β by least squares on the
  window's draws, post-processing time added;
- the proxy alone: predictions at its centre θ̂ (Adam + L-BFGS, the MAP the package finds)
  and the mean over ``--proxy-draws`` draws from N(θ̂, Σ̂), timed as the fit inside the
  SGLD-CV preprocessing plus the predictions;
- MAP by alternating least squares (exact ridge solves per user and item, until the relative
  change of the log posterior is below 1e-7) and, as the reference posterior-mean RMSE, the
  exact blocked Gibbs sampler of BPMF (Salakhutdinov and Mnih 2008; Gaussian conditionals per
  user and item, full data per sweep, from a random start).

Each SG kernel runs in a fresh Python process (no compiled program shared), as one
``numpyro.infer.MCMC`` run of ``--chains`` vectorised chains × (W + ``--steps``) steps, W a
tenth of the steps of warm-up when the preconditioner adapts (else 0), ``--draws`` states kept
per chain. Wall time = setup (kernel construction and preprocessing: proxy fit, step size,
with compilation) + the chain's compilation + sampling; kept draw j of S is stamped setup +
compile + (W + (j + 1)/S × steps)/(W + steps) × sampling seconds (the compiled loop costs the
same per step); CPU seconds of the process likewise. Metric at a
checkpoint: RMSE on the test ratings of the posterior-mean prediction, the mean of U_lᵀV_m over
the last half of the draws so far, pooled over chains (the window of ``bench_paper002.py``).
Equal budgets, per proxy: B (wall) and B_cpu (CPU) = the smaller totals of its default SGLD-CV
and SGLD rows. Warnings raised are recorded per row (``RunDiagnosticsWarning`` from
``post.checks.check_run``, called after the timed run).

    python benchmarks/bench_bpmf.py           # 450 x 225, 20 % observed, 10^5 steps
    python benchmarks/bench_bpmf.py --quick   # 300 x 150, 30 % observed, 2·10^4 steps

Writes ``benchmarks/results/bench_bpmf[_quick].json`` and a markdown section (stdout and
``--md``).
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

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bpmf_model import (  # noqa: E402
    als_map,
    bpmf_model,
    gibbs,
    log,
    make_data,
    model_inputs,
    predict,
    rmse,
    window_rmse,
    zv_local,
)
from _bpmf_report import markdown  # noqa: E402
from _runs import json_default, parse_args_or_run_worker, write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ESTIMATORS = {"SGLD-CV": "cv", "SGLD": "uniform"}
#: the structured proxy's curvature (``proxy_kwargs``): the package's choice above
#: MAX_DENSE_DIM (the Hessian with a Hutchinson diagonal), or the empirical Fisher
PROXIES = {"fisher": {"curvature": "fisher"}, "hessian": {}}



# -- the SG workers (one fresh process per estimator) -------------------------------------------
def _warning_texts(caught) -> list[str]:
    counts: dict[str, int] = {}
    for w in caught:
        k = f"{w.category.__name__}: {' '.join(str(w.message).split())}"
        counts[k] = counts.get(k, 0) + 1
    return [k + (f" (x{c})" if c > 1 else "") for k, c in counts.items()]


def _sg_run(kernel, args, kwargs, spec, dd, prep: tuple[float, float], extra: dict) -> dict:
    """One timed MCMC run of ``kernel`` (preprocessed in ``prep`` = (wall, CPU) seconds), its
    RMSE curve, ZV and checks."""
    from numpyro.infer import MCMC

    from numpyro_subsample import check_run
    from numpyro_subsample.compare import CompileTimer

    # not in numpyro_subsample.compare.__all__: the run check's fields as the compare
    # command reports them
    from numpyro_subsample.compare.checks import CHECK_FIELDS

    steps, S = spec["steps"], spec["draws"]
    # the adapted preconditioner (the default with a structured proxy) needs a warm-up: a tenth
    # of the steps, before the kept ones, on the time axis
    warm = steps // 10 if kernel._adapts(kernel.preprocessed.potential) else 0
    prep_s, prep_cpu = prep
    row = {**extra, "steps": steps, "num_warmup": warm, "chains": spec["chains"],
           "prep_s": prep_s, "prep_cpu_s": prep_cpu}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc = MCMC(kernel, num_warmup=warm, num_samples=steps, num_chains=spec["chains"],
                    thinning=steps // S, chain_method="vectorized", progress_bar=False)
        with CompileTimer() as ct:
            t0, c0 = time.perf_counter(), time.process_time()
            mcmc.run(jax.random.PRNGKey(spec["seed"]), *args,
                     extra_fields=("data_passes", "grad"), **kwargs)
            draws = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
            run_s, run_cpu = time.perf_counter() - t0, time.process_time() - c0
        sampling_s = run_s - ct.seconds
        ef = mcmc.get_extra_fields(group_by_chain=True)
        passes = np.asarray(ef["data_passes"], np.float64).max(0)
        grad = np.asarray(ef["grad"])
        row["divergences"] = int(np.sum(np.asarray(ef.get("diverging", 0))))
        rc = check_run(mcmc, warn=True)
    row["warnings"] = _warning_texts(caught)
    row["checks"] = {f: getattr(rc, f) for f in CHECK_FIELDS}
    S = passes.shape[0]
    times = prep_s + ct.seconds + sampling_s * (warm + steps * np.arange(1, S + 1) / S) / (
        warm + steps)
    cpu_times = prep_cpu + run_cpu * (times - prep_s) / run_s  # CPU spread like the wall time
    u_te, v_te, r_te = dd["u_te"], dd["v_te"], dd["r_te"]
    P = np.asarray(predict(jnp.asarray(draws["U"]), jnp.asarray(draws["V"]),
                           jnp.asarray(u_te), jnp.asarray(v_te)))
    row.update(chain_compile_s=ct.seconds, sampling_s=sampling_s, wall_s=prep_s + run_s,
               cpu_s=prep_cpu + run_cpu, cpu_times=cpu_times,
               step_size=float(kernel.step_size), times=times, passes=passes,
               rmse=window_rmse(P, r_te),
               steps_per_s=spec["chains"] * (warm + steps) / sampling_s)
    # ZV at checkpoints: the draws of the window ⌊j/2⌋..j
    pot = kernel.preprocessed.potential
    C = grad.shape[0]
    g = jax.vmap(pot.unravel)(jnp.asarray(grad.reshape(C * S, -1)))
    gU = np.asarray(g["U"]).reshape(C, S, *draws["U"].shape[2:])
    gV = np.asarray(g["V"]).reshape(C, S, *draws["V"].shape[2:])
    zv_at = np.unique(np.linspace(S // spec["zv_points"], S, spec["zv_points"]).astype(int) - 1)
    zv_rows = []
    for j in zv_at:
        sl = slice(j // 2, j + 1)
        t0 = time.perf_counter()
        m, vr = zv_local(P[:, sl].reshape(-1, P.shape[-1]),
                         gU[:, sl].reshape(-1, *gU.shape[2:]),
                         gV[:, sl].reshape(-1, *gV.shape[2:]), u_te, v_te)
        zv_s = time.perf_counter() - t0
        zv_rows.append({"draw": int(j), "time": float(times[j]) + zv_s, "zv_s": zv_s,
                        "cpu_time": float(cpu_times[j]) + zv_s,
                        "rmse": rmse(m, r_te), "raw_rmse": float(row["rmse"][j]),
                        "median_vr": float(np.median(vr)), "passes": float(passes[j])})
    row["zv"] = zv_rows
    if "multiplier" not in extra:
        row["zv_package"] = _package_zv(mcmc, u_te, v_te, r_te)
    return row


def _package_zv(mcmc, u_te, v_te, r_te) -> dict:
    """The package's ZV degree 1 (``post.zv.zv_fit``) of the test predictions over all the
    run's draws: its result, or the error it raises."""
    from numpyro_subsample import zv_fit

    users, items = jnp.asarray(u_te), jnp.asarray(v_te)
    out: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        try:
            res = zv_fit(mcmc, lambda z: predict(z["U"], z["V"], users, items), 1)
            out.update(rmse=rmse(res.mean, r_te), raw_rmse=rmse(res.raw_mean, r_te),
                       median_vr=float(np.nanmedian(np.asarray(res.variance_reduction))))
        except Exception as err:  # noqa: BLE001 - recorded, the benchmark goes on
            out["error"] = f"{type(err).__name__}: {' '.join(str(err).split())}"
        out["seconds"] = time.perf_counter() - t0
    out["warnings"] = _warning_texts(caught)
    return out


def _worker(spec: dict) -> None:
    """SGLD with one estimator: default run, runs at common steps, and (SGLD-CV) the proxy
    alone; writes a JSON of rows to ``spec["out"]``."""
    from numpyro_subsample import SGLD
    from numpyro_subsample.compare import CompileTimer

    dd = make_data(spec["L"], spec["M"], spec["D"], spec["density"], spec["test_frac"],
                   spec["seed"])
    args, kwargs = model_inputs(dd, spec["subsample_size"])
    est, variant = ESTIMATORS[spec["method"]], spec["proxy"]
    name = f"{spec['method']} [{variant}]"
    d = (dd["L"] + dd["M"]) * dd["D"]
    theta0 = 0.1 * jax.random.normal(jax.random.PRNGKey(spec["seed"] + 1), (d,))
    rows = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with CompileTimer() as ct:
            t0, c0 = time.perf_counter(), time.process_time()
            kernel = SGLD(bpmf_model, estimator=est,
                          proxy_kwargs={"init_theta": theta0, **PROXIES[variant]},
                          seed=spec["seed"], progress_bar=False)
            kernel.preprocess(args, kwargs)
            prep = (time.perf_counter() - t0, time.process_time() - c0)
    prep_warnings = _warning_texts(caught)
    pre = kernel.preprocessed
    info = pre.proxy.info
    common = {"estimator": est, "proxy": variant, "prep_compile_s": ct.seconds,
              "noise": float(pre.noise),
              "proxy_info": {k: info.get(k) for k in (
                  "structure", "rank", "curvature", "converged", "lbfgs_iterations",
                  "newton_decrement", "complement_curvature", "passes")},
              "whitened_curvature_mu": float(info["ritz_values"][info["rank"]]
                                             / max(info["complement_curvature"], 1e-30)),
              "proxy_s": float(pre.proxy.seconds), "preprocessing_passes": float(pre.data_passes)}
    log(f"[{name}] prep {prep[0]:.0f} s, h = {kernel.step_size:.3g}, noise v = {pre.noise:.3g}")
    row = _sg_run(kernel, args, kwargs, spec, dd, prep,
                  {"method": f"{name} (default h)", **common})
    row["warnings"] = prep_warnings + row["warnings"]
    rows.append(row)
    log(f"    rmse {row['rmse'][-1]:.4f} at {row['wall_s']:.0f} s")
    h_ref = spec.get("h_cv") or kernel.step_size
    for mult in spec["multipliers"]:
        h = mult * h_ref
        k2 = kernel.with_step_size(h)
        # with_step_size copies the kernel through SubsampleKernel.__getstate__, which drops the
        # cached data and potentials, so its first run would redo the whole preprocessing
        # (reported with the results); restored here so that the copy shares it as documented
        k2._pre_data, k2._potentials = kernel._pre_data, kernel._potentials
        row = _sg_run(k2, args, kwargs, spec, dd, prep,
                      {"method": f"{name}, h = {mult:g}·h_CV", **common, "multiplier": mult})
        rows.append(row)
        log(f"    h = {h:.3g}: rmse {row['rmse'][-1]:.4f} at {row['wall_s']:.0f} s")
    if est == "cv":
        rows += _proxy_rows(kernel, dd, spec, prep_warnings)
    out = {"rows": rows, "h_default": float(kernel.step_size)}
    Path(spec["out"]).write_text(json.dumps(out, default=json_default))


def _proxy_rows(kernel, dd: dict, spec: dict, prep_warnings) -> list[dict]:
    """The proxy of the SGLD-CV kernel alone: predictions at θ̂ and over draws from it."""
    # not public: the structured covariance's matrix-free L ξ
    from numpyro_subsample.proxies.covariance import scale_matvec

    prox, pot = kernel.proxy, kernel.preprocessed.potential
    u_te, v_te, r_te = (jnp.asarray(dd[k]) for k in ("u_te", "v_te", "r_te"))
    base = {"proxy_s": float(prox.seconds), "data_passes": float(prox.num_data_passes),
            "warnings": [w for w in prep_warnings if "ProxyFit" in w]}
    t0 = time.perf_counter()
    c = pot.unravel(prox.centre)
    variant = spec["proxy"]
    base["proxy"] = variant
    centre = {**base, "method": f"proxy [{variant}] centre θ̂ (Adam + L-BFGS MAP)",
              "rmse_final": rmse(predict(c["U"], c["V"], u_te, v_te), np.asarray(r_te))}
    centre["wall_s"] = float(prox.seconds) + time.perf_counter() - t0
    t0 = time.perf_counter()
    K, batch = spec["proxy_draws"], 100

    @jax.jit
    def batch_pred(key, centre, op, users, items):
        xi = jax.random.normal(key, (batch, centre.shape[0]), centre.dtype)
        z = jax.vmap(pot.unravel)(centre + jax.vmap(lambda x: scale_matvec(op, x))(xi))
        return jnp.sum(predict(z["U"], z["V"], users, items), 0)

    total = sum(batch_pred(k, prox.centre, prox.cov_op, u_te, v_te)
                for k in jax.random.split(jax.random.PRNGKey(spec["seed"] + 2), K // batch))
    draws = {**base, "method": f"proxy [{variant}] alone, mean over {K} draws N(θ̂, Σ̂)",
             "rmse_final": rmse(total / (K // batch * batch), np.asarray(r_te))}
    draws["wall_s"] = float(prox.seconds) + time.perf_counter() - t0
    return [centre, draws]


def run_worker(spec: dict, tmp: Path) -> dict:
    """``_worker(spec)`` in a fresh interpreter; returns its JSON or raises."""
    spec = {**spec, "out": str(tmp / f"{spec['method']}_{spec['proxy']}.json")}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker",
                           json.dumps(spec)], capture_output=True, text=True, check=False)
    sys.stderr.write("".join(ln + "\n" for ln in proc.stderr.splitlines()
                             if ln.startswith(("[", "    "))))
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(Path(spec["out"]).read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--users", type=int, default=None)
    p.add_argument("--items", type=int, default=None)
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--density", type=float, default=None)
    p.add_argument("--test-frac", type=float, default=0.15)
    p.add_argument("--subsample-size", type=int, default=1000)
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--draws", type=int, default=400, help="kept per chain")
    p.add_argument("--step-multipliers", type=float, nargs="*", default=None,
                   help="default: 10 with --quick, none otherwise")
    p.add_argument("--proxies", nargs="+", choices=sorted(PROXIES), default=["fisher", "hessian"])
    p.add_argument("--zv-points", type=int, default=8)
    p.add_argument("--proxy-draws", type=int, default=1000)
    p.add_argument("--gibbs-sweeps", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--md", default="/tmp/scratch/bpmf/bpmf_results.md")
    a = parse_args_or_run_worker(p, argv, _worker)
    if a is None:
        return 0
    L = a.users or (300 if a.quick else 450)
    M = a.items or (150 if a.quick else 225)
    density = a.density or (0.3 if a.quick else 0.2)
    steps = a.steps or (20_000 if a.quick else 100_000)
    if a.step_multipliers is None:
        a.step_multipliers = [10.0] if a.quick else []
    steps -= steps % a.draws
    dd = make_data(L, M, a.rank, density, a.test_frac, a.seed)
    cfg = {"L": L, "M": M, "D": a.rank, "density": density, "test_frac": a.test_frac,
           "num_ratings": len(dd["r_tr"]) + len(dd["r_te"]), "N_train": len(dd["r_tr"]),
           "N_test": len(dd["r_te"]), "d": (L + M) * a.rank, "subsample_size": a.subsample_size,
           "chains": a.chains, "steps": steps, "draws": a.draws,
           "step_multipliers": a.step_multipliers}
    res = {"date": time.strftime("%Y-%m-%d %H:%M"),
           "device": a.device,
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
                      f"(shared, `nice -n 19`), JAX {jax.__version__} on "
                      f"{jax.default_backend()}, float"
                      f"{64 if jax.config.jax_enable_x64 else 32}",
           "load_start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
           "args": vars(a), "config": cfg,
           "oracle_rmse": rmse(np.sum(dd["U"][dd["u_te"]] * dd["V"][dd["v_te"]], 1),
                               dd["r_te"]),
           "zero_rmse": rmse(np.zeros_like(dd["r_te"]), dd["r_te"])}
    log(f"BPMF {L} x {M}, D = {a.rank}: N_train = {cfg['N_train']}, d = {cfg['d']}")
    t0 = time.perf_counter()
    spec = {"L": L, "M": M, "D": a.rank, "density": density, "test_frac": a.test_frac,
            "seed": a.seed, "subsample_size": a.subsample_size, "chains": a.chains,
            "steps": steps, "draws": a.draws, "multipliers": a.step_multipliers,
            "zv_points": a.zv_points, "proxy_draws": a.proxy_draws}
    sg_rows, other = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in a.proxies:
            cv = run_worker({**spec, "method": "SGLD-CV", "proxy": variant}, Path(tmp))
            sgld = run_worker({**spec, "method": "SGLD", "proxy": variant,
                               "h_cv": cv["h_default"]}, Path(tmp))
            sg_rows += [r for r in cv["rows"] + sgld["rows"] if "times" in r]
            other += [r for r in cv["rows"] if "times" not in r]
    sg_rows.sort(key=lambda r: (a.proxies.index(r["proxy"]), r.get("multiplier", 0),
                                r["estimator"] != "cv"))
    log("[MAP] ALS")
    other.append(als_map(dd, a.seed))
    log(f"[Gibbs] {a.gibbs_sweeps} sweeps")
    other.append(gibbs(dd, a.seed, a.gibbs_sweeps))
    res["sg_rows"], res["other_rows"] = sg_rows, other
    res["budgets"] = {v: [min(r[k] for r in sg_rows if r["proxy"] == v and "multiplier" not in r)
                          for k in ("wall_s", "cpu_s")] for v in a.proxies}
    res["total_s"] = time.perf_counter() - t0
    res["load_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    out = write_results(res, "bench_bpmf", markdown, quick=a.quick, out=a.out, md=a.md,
                        argv=argv, folder=RESULTS)
    log(f"wrote {out} ({res['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
