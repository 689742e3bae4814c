"""Distributed SGLD (paper 004) on 1, 2, 4 and 8 simulated CPU devices.

    /work/venv/bin/python benchmarks/bench_distributed.py [--N 20000] [--draws 400] [--tau 20]

Each device count runs in its own subprocess (XLA_FLAGS=--xla_force_host_platform_device_count
must be set before jax is imported). Printed per run: SGLD iterations per second (all chains,
excluding compilation), data passes per second, error of the posterior mean (max over
coordinates, in posterior sd) and sd ratio against the exact conjugate posterior, and the bytes
that move per trajectory (chain states) versus the bytes of data that stay on their devices.

Honesty note: simulated devices are threads of one process sharing this machine's cores (2
here), so more devices do NOT mean more compute; the numbers show the overhead of the
machinery (per-trajectory ppermute rendezvous) and that accuracy is unchanged, not a speed-up.
On real accelerators/hosts each shard has its own compute.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

WORKER = textwrap.dedent(
    r"""
    import os, sys, json, time
    S = int(sys.argv[1]); N = int(sys.argv[2]); draws = int(sys.argv[3]); tau = int(sys.argv[4])
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={S}"
    os.environ["CI"] = "1"
    sys.path.insert(0, sys.argv[5])
    import jax, numpy as np
    from numpyro.infer import MCMC
    from models import linreg_model, linreg_data, linreg_exact
    from numpyro_subsample.compare import CompileTimer
    from numpyro_subsample import DistributedSGLD

    X, y = linreg_data(N=N, d=8, seed=0)
    mean, sd = linreg_exact(X, y)
    chains = max(8, S)
    k = DistributedSGLD(linreg_model, num_shards=S, trajectory_length=tau, estimator="cv")
    t0 = time.perf_counter(); k.preprocess((X, y), {}); pre_s = time.perf_counter() - t0
    m = MCMC(k, num_warmup=0, num_samples=draws, num_chains=chains,
             chain_method="vectorized", progress_bar=False)
    t0 = time.perf_counter(); m.run(jax.random.PRNGKey(0), X, y)
    jax.block_until_ready(m.get_samples()); warm_s = time.perf_counter() - t0  # with compile
    m.post_warmup_state = m.last_state  # second run: NumPyro re-traces its loop; the
    with CompileTimer() as ct:          # compilation it costs is measured and subtracted
        t0 = time.perf_counter(); m.run(jax.random.PRNGKey(1), X, y)
        jax.block_until_ready(m.get_samples()); run_s = time.perf_counter() - t0 - ct.seconds
    b = np.asarray(m.get_samples()["beta"], np.float64)
    steps = draws * k.layout.cycle_length  # per chain
    comm = k.communication_bytes(m.last_state)
    print("RESULT " + json.dumps({
        "S": S, "N": N, "chains": chains, "tau": tau, "steps_per_chain": steps,
        "it_s": chains * steps / run_s, "passes_s": chains * steps * 100 / N / run_s,
        "run_s": run_s, "pre_s": pre_s, "compile_s": warm_s,
        "mean_err": float(np.max(np.abs(b.mean(0) - mean) / sd)),
        "sd_ratio": float(np.max(np.abs(b.std(0) / sd - 1))) + 1,
        "step": k.step_size, "comm_traj": comm["per_trajectory"],
        "data": comm["data_resident"],
    }))
    """
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, default=20_000)
    ap.add_argument("--draws", type=int, default=400)
    ap.add_argument("--tau", type=int, default=20)
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(ap)
    args = ap.parse_args()
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    rows = []
    for S in args.devices:
        proc = subprocess.run(
            [sys.executable, "-c", WORKER, str(S), str(args.N), str(args.draws), str(args.tau),
             tests],
            capture_output=True, text=True, env=env,
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not lines:
            print(f"S={S} failed:\n{proc.stderr[-3000:]}")
            continue
        rows.append(json.loads(lines[-1][7:]))
    head = (
        f"{'method':<16}{'S':>3}{'N':>8}{'chains':>7}{'tau':>5}{'it/s':>10}{'passes/s':>10}"
        f"{'run s':>8}{'pre s':>7}{'comp s':>8}{'mean err':>10}{'sd ratio':>9}"
        f"{'B moved/traj':>14}{'B data stays':>14}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{'DistributedSGLD':<16}{r['S']:>3}{r['N']:>8}{r['chains']:>7}{r['tau']:>5}"
            f"{r['it_s']:>10.0f}{r['passes_s']:>10.1f}{r['run_s']:>8.1f}{r['pre_s']:>7.1f}"
            f"{r['compile_s']:>8.1f}{r['mean_err']:>10.3f}{r['sd_ratio']:>9.3f}"
            f"{r['comm_traj']:>14}{r['data']:>14}"
        )
    print(
        "it/s: SGLD iterations of all chains per second (estimator cv, n=100); passes/s: "
        "it/s·n/N; mean err: max |mean − exact| / exact sd; sd ratio: worst sd / exact sd. "
        "Simulated devices share the machine's cores: no speed-up is expected or claimed."
    )


if __name__ == "__main__":
    main()
