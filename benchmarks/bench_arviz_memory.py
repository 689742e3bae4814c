"""Memory and time of the pointwise log-likelihood of ``to_arviz(mcmc, log_likelihood=True)``.

Synthetic logistic regression (the CLI's default problem, d = 21, n = 1000) at N = 10^5: a
real ``SGLD`` run of 100 draws whose draws are tiled to S = 10^4, then the package's pass
(:func:`numpyro_subsample.post.arviz.log_likelihood_pass`, what ``to_arviz`` calls) with the
default ``chunk_memory`` (256 MB), a small one (32 MB), the default with
``log_likelihood_thin=10``, and, for reference, the previous implementation (one compiled
program vmapped over all S draws, then a host copy), each in a fresh process.

Columns: wall time of the pass (compilation included; its share from JAX's monitoring
events), the output's size (S × N float32), the peak RSS growth during the pass beyond the
output (sampled every 2 ms with psutil), the peak of NumPy allocations beyond the output
(tracemalloc; XLA's buffers are not traced), and the number of chunks of draws.

    python benchmarks/bench_arviz_memory.py            # about 3 minutes, needs ~10 GB free
    python benchmarks/bench_arviz_memory.py --quick    # N = 10^4, S = 2000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings
from functools import partial
from pathlib import Path

import numpy as np

CONFIGS = {
    "default": {"chunk_memory": "256MB", "thin": 1},
    "small": {"chunk_memory": "32MB", "thin": 1},
    "thin10": {"chunk_memory": "256MB", "thin": 10},
    "before": {"chunk_memory": None, "thin": 1},
}
LABELS = {
    "default": "default `chunk_memory=\"256MB\"`",
    "small": "`chunk_memory=\"32MB\"`",
    "thin10": "default bound, `log_likelihood_thin=10`",
    "before": "previous implementation (all draws in one program)",
}


class PeakRSS:
    """Peak resident set size (bytes) inside a ``with`` block, sampled by a thread."""

    def __init__(self, interval: float = 0.002):
        import psutil

        self.proc, self.interval, self.peak = psutil.Process(), interval, 0

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self):
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def _before_pass(potential, latent, data, chunk_size=1024):
    """The log-likelihood pass as it was before chunking over draws: one program vmapped over
    all S draws (data in chunks of ≤ 2²²/S), its (S, N) result transposed, copied to NumPy."""
    import jax
    import jax.numpy as jnp
    from numpyro import handlers

    # not public: the benchmark rebuilds the package's former pass from its internal pieces
    from numpyro_subsample.core.datapass import map_data
    from numpyro_subsample.core.potential import in_plate, per_datum
    from numpyro_subsample.post.protocol import model_at

    @partial(jax.jit, static_argnames=("potential", "chunk"))
    def run(potential, latent, data, chunk):
        plate = potential.plate
        args, kwargs = data.args_kwargs()

        def one(sample, idx):
            model = handlers.substitute(handlers.seed(model_at(potential, idx), 0), data=sample)
            tr = handlers.trace(model).get_trace(*args, **kwargs)
            return {n: per_datum(s["fn"].log_prob(s["value"]), plate, idx.shape[0], n)
                    for n, s in tr.items()
                    if s["type"] == "sample" and s["is_observed"] and in_plate(s, plate.name)}

        def chunk_fn(idx):
            return jax.tree.map(jnp.transpose, jax.vmap(one, in_axes=(0, None))(latent, idx))

        return jax.tree.map(jnp.transpose, map_data(chunk_fn, plate.size, chunk))

    num_draws = next(iter(latent.values())).shape[0]
    chunk = int(max(1, min(chunk_size, 2**22 // num_draws)))
    out = run(potential, {k: jnp.asarray(v) for k, v in latent.items()}, data, chunk)
    return {k: np.array(v) for k, v in out.items()}


def worker(config: str, num_data: int, num_draws: int) -> dict:
    import jax
    from numpyro.infer import MCMC

    from numpyro_subsample import SGLD
    from numpyro_subsample.compare import CompileTimer, make_problem

    # not public: the benchmark measures these internal passes (what to_arviz calls) and the
    # memory-size parser of their chunking
    from numpyro_subsample.post.arviz import log_likelihood_chunks, log_likelihood_pass
    from numpyro_subsample.post.predictive import parse_memory

    cfg = CONFIGS[config]
    problem = make_problem("default", num_data=num_data, subsample_size=1000)
    kernel = SGLD(problem.model, progress_bar=False)
    mcmc = MCMC(kernel, num_warmup=100, num_samples=100, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(jax.random.PRNGKey(0), *problem.args(), **problem.kwargs())
    draws = mcmc.get_samples()
    pot = kernel.potential
    rows = np.arange(num_draws) % next(iter(draws.values())).shape[0]
    latent = {k: np.asarray(draws[k])[rows][:: cfg["thin"]] for k in pot.latent_sites}
    kept = next(iter(latent.values())).shape[0]
    data = problem.data()
    out_bytes = kept * num_data * 4
    tracemalloc.start()
    tracemalloc.reset_peak()
    traced0 = tracemalloc.get_traced_memory()[0]
    with PeakRSS() as rss, CompileTimer() as ct:
        t0 = time.perf_counter()
        if cfg["chunk_memory"] is None:
            out = _before_pass(pot, latent, data)
        else:
            out = log_likelihood_pass(pot, latent, data, chunk_memory=cfg["chunk_memory"])
        wall = time.perf_counter() - t0
    traced_peak = tracemalloc.get_traced_memory()[1] - traced0
    tracemalloc.stop()
    ll = out["y"]
    assert ll.shape == (kept, num_data) and np.isfinite(ll).all()
    if cfg["chunk_memory"] is None:
        chunks = 1
    else:
        per_chunk = log_likelihood_chunks(kept, num_data, 4, 1024,
                                          parse_memory(cfg["chunk_memory"]))[0]
        chunks = -(-kept // per_chunk)
    return {
        "config": config, "N": num_data, "draws": kept, "wall_s": wall, "compile_s": ct.seconds,
        "output_mb": out_bytes / 2**20, "rss_beyond_mb": (rss.peak - rss.start - out_bytes) / 2**20,
        "numpy_beyond_mb": (traced_peak - out_bytes) / 2**20, "chunks": chunks,
        "checksum": float(ll[::97, ::89].sum()),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="N = 10^4, S = 2000")
    p.add_argument("--N", type=int, default=None)
    p.add_argument("--draws", type=int, default=None)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(p)
    args = p.parse_args(argv)
    N = args.N or (10_000 if args.quick else 100_000)
    S = args.draws or (2_000 if args.quick else 10_000)
    if args.worker:
        print(json.dumps(worker(args.worker, N, S)))
        return 0
    import psutil

    results = []
    for config in args.configs.split(","):
        need = 3 * S * N * 4 + 2**30
        if config == "before" and psutil.virtual_memory().available < need:
            print(f"skip {config}: needs {need / 2**30:.1f} GB free", file=sys.stderr)
            continue
        print(f"== {config}", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--worker", config, "--N", str(N), "--draws", str(S)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stderr[-3000:], file=sys.stderr)
            continue
        results.append(json.loads(res.stdout.strip().splitlines()[-1]))
    sums = [r["checksum"] for r in results if r["config"] != "thin10"]
    spread = (max(sums) - min(sums)) / max(abs(min(sums)), 1e-30) if sums else 0.0
    print(f"Command: `python benchmarks/bench_arviz_memory.py{' --quick' if args.quick else ''}` "
          f"({time.strftime('%Y-%m-%d %H:%M')}). Logistic regression d = 21, N = {N:,}, "
          f"S = {S:,} draws (a real SGLD run of 100 draws, tiled). The bound is on temporaries "
          "beyond the output array. A checksum of the values agrees between the unthinned rows "
          f"to a relative {spread:.1e} (float32 rounding of differently shaped programs).")
    print()
    print("| configuration | draws | chunks of draws | wall (s) | of which compile (s) | "
          "output (MB) | peak RSS beyond output (MB) | NumPy peak beyond output (MB) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {LABELS[r['config']]} | {r['draws']:,} | {r['chunks']} | {r['wall_s']:.1f} | "
              f"{r['compile_s']:.1f} | {r['output_mb']:.0f} | {r['rss_beyond_mb']:.0f} | "
              f"{r['numpy_beyond_mb']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
