"""High-dimensional experiments (issue): SG kernels with a structured (matrix-free) proxy.

1. Gaussian linear mixed model with J random intercepts, τ and σ known:
   y_ij = x_ijᵀβ + u_j + ε, u_j ~ N(0, τ²), ε ~ N(0, σ²), β ~ N(0, s² I), x_ij = (1, 4
   standard normal covariates), τ = 0.5, σ = 1, s = 2, groups drawn uniformly (N/J rows on
   average). The posterior of θ = (β, u) is Gaussian with precision
   P = [[I/s² + XᵀX/σ², XᵀZ/σ²], [ZᵀX/σ², diag(1/τ² + n_j/σ²)]] (an arrow matrix); the exact
   mean and marginal sds come from the Schur complement of the diagonal u-block (p × p
   solves only; no (p+J)² array), checked against a sparse direct solve (scipy.sparse).
   Rows: SGLD-CV and SGHMC-CV with ``proxy="low-rank"`` and ``"diagonal"`` (Hessian curvature,
   Hutchinson diagonal; the preconditioner adapted during warm-up, the default with a
   structured proxy, and one SGLD-CV row with ``AdaptationOptions(preconditioner=False)``,
   the measured-noise step rule), the structured proxies alone (θ̂ + L ξ, ``scale_matvec``),
   with ``--lmm-ecs WARMUP SAMPLES`` ``EnergyConservingHMC`` with the first structure
   (first-order Taylor likelihood proxy, one chain, its σ̂²), and a short NUTS timing
   (full-data gradients; too slow at this size to be a peer). Metrics over
   the fixed effects and over 200 random effects drawn at random: worst |mean error| and
   worst |log sd ratio| in exact posterior-sd units, min bulk ESS (ArviZ, over the stored
   thinned draws of those coordinates), wall time including compilation and preprocessing,
   data passes.
2. Bayesian neural network on scikit-learn's ``digits`` (binary: digit ≥ 5), one hidden layer
   of 50 tanh units, N(0, 1) priors (``--bnn-prior fan-in``: N(0, 1/fan-in) on the weight
   matrices, N(0, 1) on the biases), Bernoulli-logit output (Chen, Fox and Guestrin 2014,
   Sect. 4; Springenberg et al. 2016); features standardised with the training statistics;
   seeded 60/15/25 train/validation/test split. Rows: SGHMC with ``estimator="uniform"`` and
   ``"stratified"`` (Fu and Zhang 2023) and the low-rank proxy (Fisher curvature, fitted from
   a random start; preconditioner adapted during warm-up, the default), the same without the
   adaptation, and without any proxy (``preconditioning=False``: the adapted diagonal scale
   alone, chains from the model's initial values), the MAP (Optax Adam, full batch), BlackJAX
   SGHMC with its ``grad_estimator`` and a constant step chosen from three by the validation
   log-likelihood (same gradient budget as the package's SGHMC), the low-rank proxy alone (500 draws
   θ̂ + Lξ), and the exact answer: full-data NumPyro
   NUTS started at MAPs (``--bnn-nuts-draws``). Metrics: test accuracy and test
   log-likelihood per point of the posterior predictive (predictive probabilities averaged
   over draws), the mean distance of the predictive probabilities from NUTS's, wall time
   including compilation, iterations per second.
3. ``--experiments prior``: the same BNN's MAP (two Adam seeds) and full-data NUTS for weight
   prior sds c/√fan-in, c in ``--bnn-prior-scan`` (default 1 2 4 8): validation and test
   accuracy and log-likelihood, i.e. whether the exact posterior predictive beats the MAP
   under the prior that validation picks.

    python benchmarks/bench_highdim.py            # J = 2·10^4, N = 4·10^5
    python benchmarks/bench_highdim.py --quick    # J = 2000, N = 4·10^4

Writes ``benchmarks/results/bench_highdim[_quick].json`` and a markdown section (stdout and
``--md``).
"""


from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _highdim_bnn import BNN_PRIOR, _prior_text, _warn, experiment_bnn, prior_scan  # noqa: E402
from _highdim_lmm import experiment_lmm, log  # noqa: E402
from _runs import fmt, write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def markdown(res: dict, cmd: str) -> str:
    lm, bn = res.get("lmm"), res.get("bnn")
    out = ["## High-dimensional experiments (`bench_highdim.py`)", "",
           f"Command: `{cmd}` ({res['date']}). Machine: {res['machine']}.", ""]
    if lm:
        out += [f"### Linear mixed model, J = {lm['J']} random intercepts, N = {lm['N']}, "
                f"d = {lm['d']} (exact Gaussian posterior)", "",
                f"τ = {lm['tau']}, σ = {lm['sigma']} known, β ~ N(0, {lm['prior_sd']}² I), "
                f"p = {lm['p']}; n = {lm['subsample_size']} per step; {lm['chains']} chains × "
                f"({lm['num_warmup']} + {lm['num_samples']}) steps, thinned by "
                f"{lm['thinning']} (ESS is of the stored draws); low-rank k = {lm['rank']}; "
                f"proxy fit: {lm['proxy_kwargs']}. Exact posterior (Schur complement) in "
                f"{lm['exact_s']:.2f} s, agreeing with a sparse LU solve to "
                f"{lm['sparse_check']:.1e}. Errors: worst coordinate, |mean error| in exact "
                "posterior sds and |log(sd / exact sd)|, over the fixed effects (β) and over "
                "200 random effects chosen at random (u).", "",
                "| method | mean err β | log sd β | mean err u | log sd u | min ESS | "
                "wall s | prep s | data passes | step h | warnings |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in lm["rows"]:
            if "s_per_draw" in r or (r.get("error") and r["method"].startswith("NUTS")):
                continue
            out.append(
                f"| {r['method']} | {fmt(r.get('mean_err_fixed'))} | "
                f"{fmt(r.get('sd_log_ratio_fixed'))} | {fmt(r.get('mean_err_random'))} | "
                f"{fmt(r.get('sd_log_ratio_random'))} | {fmt(r.get('min_ess'), '.0f')} | "
                f"{fmt(r.get('wall_s'), '.1f')} | {fmt(r.get('prep_s'), '.1f')} | "
                f"{fmt(r.get('data_passes'), '.1f')} | {fmt(r.get('step_size'), '.2e')} | "
                f"{_warn(r)} |")
        for r in lm["rows"]:
            if "sigma2_chain" in r:
                out += ["", f"{r['method']}: median σ̂² {r['sigma2_chain']:.3g} along the chain, "
                            f"{r['sigma2_proxy']:.3g} at proxy draws; "
                            f"{r['leapfrog']:.0f} leapfrog steps per iteration."]
            if r["method"].startswith("NUTS"):
                out += ["", (f"NUTS (peer): {r['method']}: failed, {r['error']}"
                             if r.get("error") else
                             f"NUTS (peer): {r['method']}: {r['wall_s']:.1f} s, "
                             f"{r['compile_s']:.1f} s of it compilation, "
                             f"{r['s_per_draw']:.2f} s per iteration without it, "
                             f"{r['mean_leapfrog_steps']:.0f} leapfrog steps (full-data "
                             "gradients) per post-warm-up draw on average (a short warm-up: "
                             "an adapted run takes more); 1000 + 1000 iterations would "
                             f"take ≈ {2000 * r['s_per_draw'] / 60:.0f} min. The exact "
                             "posterior is the reference.")]
        out.append("")
    if bn:
        out += [f"### Bayesian neural network, digits (≥ 5 vs < 5), d = {bn['d']}", "",
                f"One hidden layer of {bn['hidden']} tanh units, {_prior_text(bn)}; "
                f"N_train = {bn['N_train']}, validation {bn['N_val']}, test {bn['N_test']}; "
                f"minibatch n = {bn['subsample_size']}; package SGHMC: {bn['chains']} chains × "
                f"({bn['num_warmup']} + {bn['num_samples']}) steps, low-rank proxy k = "
                f"{bn['rank']} (Fisher curvature, random start), 500 draws kept; BlackJAX "
                f"SGHMC: {bn['chains']} chains × {bn['blackjax_iterations']} iterations of "
                f"{bn['blackjax_integration_steps']} leapfrog steps (the same minibatch "
                "gradients), second half kept, 500 draws; step chosen from "
                f"{[r['step_size'] for r in bn['blackjax_tried']]} by the validation "
                "log-likelihood (validation log-lik: "
                + ", ".join(f"{r['step_size']:g}: {r['val_ll']:.3f}"
                            for r in bn["blackjax_tried"]) + "). Test metrics: accuracy and "
                "mean log-likelihood per point of the posterior predictive.", "",
                "| method | test acc | test log-lik | mean abs Δp vs NUTS | wall s | it/s | "
                "data passes | step h | warnings |", "|---|---|---|---|---|---|---|---|---|"]
        for r in bn["rows"]:
            out.append(
                f"| {r['method']} | {fmt(r.get('test_acc'), '.4f')} | "
                f"{fmt(r.get('test_ll'), '.4f')} | {fmt(r.get('dp_nuts'), '.4f')} | "
                f"{fmt(r.get('wall_s'), '.1f')} | "
                f"{fmt(r.get('steps_per_s'), '.0f')} | {fmt(r.get('data_passes'), '.0f')} | "
                f"{fmt(r.get('step_size'), '.2e')} | {_warn(r)} |")
        for r in bn["rows"]:
            if r["method"].startswith("NUTS"):
                out += ["", f"NUTS reference: {r['divergences']} divergences, "
                        f"{r['mean_leapfrog_steps']:.0f} leapfrog steps per iteration, per-draw "
                        f"test log-lik {r['draw_ll_mean']:.3f} (bulk ESS "
                        f"{r['ess_draw_ll']:.0f}, R-hat {r['rhat_draw_ll']:.3f}); data passes: "
                        "full-data gradients after the warm-up. Mean abs Δp: mean over "
                        "the test points of |p̄ − p̄_NUTS|, the predictive probabilities' "
                        "distance from the reference's."]
        out += ["", "it/s: iterations (summed over chains) per second after preprocessing for "
                "the package kernels, over the whole run for MAP and BlackJAX (one BlackJAX "
                "iteration is "
                f"{bn['blackjax_integration_steps']} leapfrog steps)."]
    pr = res.get("prior")
    if pr:
        out += ["### BNN: MAP against the exact posterior predictive, by prior scale", "",
                "Weight prior sd c/√fan-in on W1 (fan-in 64) and W2 (50), N(0, 1) on the "
                "biases; c = 8 is close to the N(0, 1) prior of the main table. MAP: Optax "
                "Adam, two seeds; NUTS: full data, started at the two MAPs.", "",
                "| c | method | val acc | val log-lik | test acc | test log-lik | wall s |",
                "|---|---|---|---|---|---|---|"]
        for r in pr["rows"]:
            out.append(f"| {r['scale']:g} | {r['method']} | {r['val_acc']:.4f} | "
                       f"{r['val_ll']:.4f} | {r['test_acc']:.4f} | {r['test_ll']:.4f} | "
                       f"{r['wall_s']:.1f} |")
        out.append("")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--experiments", default="lmm,bnn")
    p.add_argument("--lmm-proxies", default="low-rank,diagonal")
    p.add_argument("--lmm-warmup", type=int, default=None)
    p.add_argument("--lmm-samples", type=int, default=None)
    p.add_argument("--subsample-size", type=int, default=1000)
    p.add_argument("--lmm-ecs", type=int, nargs=2, default=None, metavar=("WARMUP", "SAMPLES"),
                   help="add an EnergyConservingHMC row (first structure, one chain)")
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--chains", type=int, default=2)
    p.add_argument("--nuts-draws", type=int, default=20, help="0: no NUTS timing")
    p.add_argument("--bnn-batch", type=int, default=100)
    p.add_argument("--bnn-nuts-draws", type=int, default=400,
                   help="NUTS reference draws per chain (warm-up half that); 0: none")
    p.add_argument("--bjx-steps", type=float, nargs=3, default=[3e-3, 1e-2, 3e-2])
    p.add_argument("--bnn-prior", choices=("unit", "fan-in"), default="unit",
                   help="BNN weight prior sd: 1 (default) or 1/sqrt(fan-in)")
    p.add_argument("--bnn-prior-scan", type=float, nargs="*", default=None,
                   help="experiment 'prior': MAP and NUTS with weight prior sd c/sqrt(fan-in) "
                        "for each c")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--md", default="/tmp/scratch/highdim_results.md")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(p)
    a = p.parse_args(argv)
    exps = [s.strip() for s in a.experiments.split(",")]
    BNN_PRIOR["scale"] = None if a.bnn_prior == "unit" else 1.0
    res = {"date": time.strftime("%Y-%m-%d %H:%M"),
           "device": a.device,
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
                      f"(load average at start {os.getloadavg()[0]:.1f}), JAX {jax.__version__} on "
                      f"{jax.default_backend()}, float"
                      f"{64 if jax.config.jax_enable_x64 else 32}",
           "args": vars(a)}
    t0 = time.perf_counter()
    if "lmm" in exps:
        res["lmm"] = experiment_lmm(a)
    if "bnn" in exps:
        res["bnn"] = experiment_bnn(a)
    if "prior" in exps:
        a.bnn_prior_scan = a.bnn_prior_scan or [1.0, 2.0, 4.0, 8.0]
        res["prior"] = prior_scan(a)
    res["total_s"] = time.perf_counter() - t0
    out = write_results(res, "bench_highdim", markdown, quick=a.quick, out=a.out, md=a.md,
                        argv=argv, folder=RESULTS)
    log(f"wrote {out} ({res['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
