"""Ten million rows end to end: default SGLD and SGHMC on N × d data, in memory and memory-mapped.

Bayesian linear regression (prior N(0, 10²), noise sd 1: exact conjugate posterior) and logistic
regression (prior N(0, 10²); reference: the Laplace approximation at the full-data mode, found
by Newton in float64, checked by importance sampling: the sd of the log importance weights of
64 Laplace draws, which bounds its error in posterior sds roughly by that sd), float32 data.
Each run is ``SGLD(model)`` or ``SGHMC(model)`` with every default under the package's ``MCMC``
(``--warmup`` + ``--samples`` steps, the model's plate has ``subsample_size=--subsample``), in
a fresh process, so that its peak memory (VmHWM) is its own. Columns: preprocessing (seconds,
data passes), wall time of ``run`` including compilation, of which compilation, the process's
CPU seconds (2 cores: up to twice the wall time) and the load average at the run's start and
end (the machine may be shared), data passes of the whole run, the worst |mean error| and
|log sd error| in exact posterior sds, min ESS, peak memory and its ratio to the data's bytes.
Storage ``memory``: the data are a JAX array; ``mmap``: ``np.load(path, mmap_mode="r")``
passed as is (on CPU, JAX aliases the mapping).

NUTS is not run at full size: its time is estimated as (seconds per full-data gradient,
measured) × (leapfrog steps per draw of a NumPyro NUTS run on the first ``--nuts-rows`` rows)
× (1000 warm-up + the draws that reach the SG run's min ESS at the subset run's ESS per draw).

    python benchmarks/bench_scale.py                       # N = 10^7, d = 50 (~2 GB)
    python benchmarks/bench_scale.py --rows 100000         # a quick check
    python benchmarks/bench_scale.py --device gpu --models linear --kernels SGLD
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import add_device_option  # noqa: E402

PRIOR_SD, NOISE_SD, CHUNK, IS_DRAWS = 10.0, 1.0, 1 << 16, 64


# -- data and references (NumPy, chunked: memory O(chunk · d)) -------------------------------
def make_data(folder: Path, model: str, rows: int, dim: int, seed: int = 0) -> tuple[Path, Path]:
    """X (rows, dim: an intercept and N(0, 1) features) and y as float32 .npy files."""
    xp, yp = folder / f"{model}_X.npy", folder / f"{model}_y.npy"
    if xp.exists() and yp.exists():
        return xp, yp
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=dim) * (1.0 if model == "linear" else 0.3)
    xt, yt = xp.with_suffix(".part"), yp.with_suffix(".part")  # renamed when complete
    X = np.lib.format.open_memmap(xt, "w+", np.float32, (rows, dim))
    y = np.lib.format.open_memmap(yt, "w+", np.float32, (rows,))
    for s in range(0, rows, CHUNK):
        e = min(rows, s + CHUNK)
        X[s:e, 0], X[s:e, 1:] = 1.0, rng.standard_normal((e - s, dim - 1), np.float32)
        eta = X[s:e].astype(np.float64) @ beta
        y[s:e] = (eta + NOISE_SD * rng.standard_normal(e - s) if model == "linear"
                  else rng.random(e - s) < 1 / (1 + np.exp(-eta)))
    X.flush(), y.flush()
    del X, y
    xt.rename(xp), yt.rename(yp)
    return xp, yp


def _chunks(X, y):
    for s in range(0, X.shape[0], CHUNK):
        yield np.asarray(X[s:s + CHUNK], np.float64), np.asarray(y[s:s + CHUNK], np.float64)


def reference(model: str, X, y) -> dict:
    """Posterior mean and sd: exact (linear) or Laplace with its importance-sampling check."""
    d = X.shape[1]
    prior = np.eye(d) / PRIOR_SD**2
    if model == "linear":
        H, b = prior.copy(), np.zeros(d)
        for xc, yc in _chunks(X, y):
            H += xc.T @ xc / NOISE_SD**2
            b += xc.T @ yc / NOISE_SD**2
        cov = np.linalg.inv(H)
        return {"mean": cov @ b, "sd": np.sqrt(np.diag(cov)), "check": "exact"}
    beta = np.zeros(d)
    for _ in range(30):  # Newton on the full data
        g, H = -prior @ beta, prior.copy()
        for xc, yc in _chunks(X, y):
            p = 1 / (1 + np.exp(-(xc @ beta)))
            g += xc.T @ (yc - p)
            H += (xc * (p * (1 - p))[:, None]).T @ xc
        step = np.linalg.solve(H, g)
        beta = beta + step
        if np.max(np.abs(step) * np.sqrt(np.diag(H))) < 1e-6:
            break
    cov = np.linalg.inv(H)
    L = np.linalg.cholesky(cov)
    xi = np.random.default_rng(1).standard_normal((d, IS_DRAWS))
    thetas = beta[:, None] + L @ xi
    logw = -0.5 * np.sum(thetas**2, 0) / PRIOR_SD**2 + 0.5 * np.sum(xi**2, 0)
    for xc, yc in _chunks(X, y):
        eta = xc @ thetas
        logw += yc @ eta - np.logaddexp(0, eta).sum(0)
    return {"mean": beta, "sd": np.sqrt(np.diag(cov)),
            "check": f"Laplace, sd(log w) = {np.std(logw):.3f} over {IS_DRAWS} draws"}


# -- one run, in its own process ----------------------------------------------------------------
def _peak_gb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _models(subsample: int):
    import numpyro
    import numpyro.distributions as dist

    def linear(X, y=None):
        beta = numpyro.sample("beta", dist.Normal(0, PRIOR_SD).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ beta, NOISE_SD), obs=y[idx])

    def logistic(X, y=None):
        beta = numpyro.sample("beta", dist.Normal(0, PRIOR_SD).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])

    return {"linear": linear, "logistic": logistic}


def _read_aligned(path: str) -> np.ndarray:
    """A .npy file read into a 64-byte aligned array (which JAX on CPU uses without a copy)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                           else np.lib.format.read_array_header_2_0(f))
        nbytes = int(np.prod(shape)) * dtype.itemsize
        raw = np.empty(nbytes + 64, np.uint8)
        start = -raw.ctypes.data % 64
        out = raw[start:start + nbytes].view(dtype).reshape(shape)
        f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
    return out


def load(cfg: dict):
    """The data as the run's storage says: JAX arrays, or the memory-mapped files as given."""
    import jax

    if cfg["storage"] == "mmap":
        return np.load(cfg["X"], mmap_mode="r"), np.load(cfg["y"], mmap_mode="r")
    return jax.device_put(_read_aligned(cfg["X"])), jax.device_put(_read_aligned(cfg["y"]))


def run_sg(cfg: dict) -> dict:
    """One default SGLD / SGHMC run under the package's MCMC."""
    import warnings

    import jax
    from numpyro.diagnostics import effective_sample_size

    import numpyro_subsample as ns
    from numpyro_subsample.compare import CompileTimer

    out = {k: cfg[k] for k in ("model", "kernel", "storage", "rows", "dim")}
    out["device"] = str(jax.devices()[0])
    X, y = load(cfg)
    kernel = getattr(ns, cfg["kernel"])(_models(cfg["subsample"])[cfg["model"]])
    mcmc = ns.MCMC(kernel, num_warmup=cfg["warmup"], num_samples=cfg["samples"],
                   progress_bar=False)
    with warnings.catch_warnings(record=True) as caught, CompileTimer() as ct:
        warnings.simplefilter("always")
        t0, c0, load0 = time.perf_counter(), time.process_time(), os.getloadavg()[0]
        mcmc.run(jax.random.PRNGKey(0), X, y)
        draws = np.asarray(jax.block_until_ready(mcmc.get_samples()["beta"]), np.float64)
        out["wall_s"] = time.perf_counter() - t0
        out["cpu_s"] = time.process_time() - c0
        out["load"] = (load0, os.getloadavg()[0])
    out["compile_s"] = ct.seconds
    out["warnings"] = sorted({" ".join(str(w.message).split())[:200] for w in caught})
    pre = kernel.preprocessed
    out["pre_s"], out["pre_passes"] = float(pre.seconds), float(pre.data_passes)
    out["passes"] = float(np.asarray(mcmc.last_state.data_passes))
    ref = np.load(cfg["ref"])
    out["mean_err"] = float(np.max(np.abs(draws.mean(0) - ref["mean"]) / ref["sd"]))
    out["logsd_err"] = float(np.max(np.abs(np.log(draws.std(0) / ref["sd"]))))
    out["min_ess"] = float(np.min(effective_sample_size(draws[None])))
    out["peak_gb"] = _peak_gb()
    return out


def run_nuts(cfg: dict) -> dict:
    """Seconds per full-data gradient, and NUTS's steps and ESS per draw on a subset."""
    import jax
    from numpyro.diagnostics import effective_sample_size
    from numpyro.infer import MCMC, NUTS
    from numpyro.infer.util import potential_energy

    model = _models(None)[cfg["model"]]  # subsample_size=None: the full-data model
    X, y = load(cfg)
    grad = jax.jit(jax.grad(lambda b, X, y: potential_energy(model, (X, y), {}, {"beta": b})))
    b = jax.numpy.zeros(X.shape[1], jax.numpy.float32)
    jax.block_until_ready(grad(b, X, y))
    t0 = time.perf_counter()
    for _ in range(3):
        jax.block_until_ready(grad(b, X, y))
    out = {"model": cfg["model"], "grad_s": (time.perf_counter() - t0) / 3}
    n = min(cfg["nuts_rows"], X.shape[0])
    nuts = MCMC(NUTS(model), num_warmup=500, num_samples=500, progress_bar=False)
    nuts.run(jax.random.PRNGKey(0), jax.numpy.asarray(np.asarray(X[:n])),
             jax.numpy.asarray(np.asarray(y[:n])), extra_fields=("num_steps",))
    out["steps"] = float(np.mean(nuts.get_extra_fields()["num_steps"]))
    beta = np.asarray(nuts.get_samples()["beta"])
    out["ess_per_draw"] = float(np.min(effective_sample_size(beta[None]))) / beta.shape[0]
    return out


# -- driver --------------------------------------------------------------------------------------
def _spawn(cfg: dict, device: str | None) -> dict:
    """Run ``cfg`` in a fresh process (its peak memory); ``add_device_option`` has put the
    chosen platform in ``JAX_PLATFORMS``, which the worker inherits."""
    env = {**os.environ, "CI": "1"}
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(cfg)],
                          capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"run {cfg} failed:\n{proc.stderr[-3000:]}")


def table(runs: list[dict], nuts: dict, refs: dict, data_gb: float) -> str:
    head = ("| model | kernel | data | device | preprocessing s (passes) | wall s (compile s) "
            "| CPU s | load | run passes | mean err (sd) | log-sd err | min ESS "
            "| peak GB (× data) | NUTS est. s to same ESS | warnings |")
    lines = [head, "|" + "---|" * 15]
    for r in runs:
        nu = nuts.get(r["model"])
        est = (f"{nu['grad_s'] * nu['steps'] * (1000 + r['min_ess'] / nu['ess_per_draw']):.0f}"
               if nu else "–")
        lines.append(
            f"| {r['model']} | {r['kernel']} | {r['storage']} | {r['device']} | "
            f"{r['pre_s']:.1f} ({r['pre_passes']:.1f}) | {r['wall_s']:.1f} ({r['compile_s']:.1f}) "
            f"| {r.get('cpu_s', float('nan')):.1f} | "
            f"{'-'.join(f'{x:.1f}' for x in r.get('load', ()))} | {r['passes']:.1f} | "
            f"{r['mean_err']:.3f} | {r['logsd_err']:.3f} | "
            f"{r['min_ess']:.0f} | {r['peak_gb']:.2f} ({r['peak_gb'] / data_gb:.2f}) | {est} | "
            f"{'; '.join(r['warnings']) or '–'} |")
    for m, nu in nuts.items():
        lines.append(f"\nNUTS on {m}: {nu['grad_s'] * 1e3:.0f} ms per full-data gradient, "
                     f"{nu['steps']:.1f} leapfrog steps per draw and ESS/draw "
                     f"{nu['ess_per_draw']:.2f} (subset run); reference: {refs[m]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dim", type=int, default=50)
    ap.add_argument("--subsample", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--models", nargs="+", default=["linear", "logistic"])
    ap.add_argument("--kernels", nargs="*", default=["SGLD", "SGHMC"])
    ap.add_argument("--storage", nargs="+", default=["memory", "mmap"])
    ap.add_argument("--nuts-rows", type=int, default=20_000)
    ap.add_argument("--no-nuts", action="store_true")
    ap.add_argument("--workdir", default=None,
                    help="folder that keeps the .npy files and references (default: temporary)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    add_device_option(ap)
    args = ap.parse_args(argv)
    if args.worker:
        cfg = json.loads(args.worker)
        out = run_nuts(cfg) if cfg["kernel"] == "NUTS" else run_sg(cfg)
        print("RESULT " + json.dumps(out), flush=True)
        return [out]
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.workdir or tmp) / f"{args.rows}x{args.dim}"
        folder.mkdir(parents=True, exist_ok=True)
        runs, nuts, refs = [], {}, {}
        for model in args.models:
            t0 = time.perf_counter()
            xp, yp = make_data(folder, model, args.rows, args.dim)
            if not (folder / f"{model}_ref.npz").exists():
                ref = reference(model, np.load(xp, mmap_mode="r"), np.load(yp, mmap_mode="r"))
                np.savez(folder / f"{model}_ref.npz", **ref)
            refs[model] = str(np.load(folder / f"{model}_ref.npz")["check"])
            print(f"{model}: data and reference in {time.perf_counter() - t0:.0f} s "
                  f"({refs[model]})", file=sys.stderr, flush=True)
            base = dict(model=model, rows=args.rows, dim=args.dim, X=str(xp), y=str(yp),
                        ref=str(folder / f"{model}_ref.npz"), subsample=args.subsample,
                        warmup=args.warmup, samples=args.samples, nuts_rows=args.nuts_rows)
            for kernel in args.kernels:
                for storage in args.storage:
                    runs.append(_spawn({**base, "kernel": kernel, "storage": storage},
                                       args.device))
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
            if not args.no_nuts:
                nuts[model] = _spawn({**base, "kernel": "NUTS", "storage": "memory"},
                                     args.device)
                print(json.dumps(nuts[model]), file=sys.stderr, flush=True)
    data_gb = args.rows * (args.dim + 1) * 4 / 2**30
    print(f"N = {args.rows:,}, d = {args.dim}: data {data_gb:.3f} GB (float32); "
          f"{args.warmup} warm-up + {args.samples} draws, n = {args.subsample}\n")
    print(table(runs, nuts, refs, data_gb))
    print(f"\nbenchmark wall time {time.perf_counter() - t_all:.0f} s")
    return runs


if __name__ == "__main__":
    main()
