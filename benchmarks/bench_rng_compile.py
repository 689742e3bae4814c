"""XLA compile seconds of small programs with and without JAX random draws (CPU).

Each draw site of a JAX generator is lowered to its own copy of the generator's code, which
XLA then compiles: the reason the package draws one-off randomness (Adam's minibatch indices,
the potential's start, the noise-measurement points) with NumPy on the host and passes it in.
Each program is compiled once in this process after a warm-up compilation; rows are the
median of ``--repeats`` fresh programs (new shapes, so nothing is cached).

    python benchmarks/bench_rng_compile.py            # about 20 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp


def _compile_seconds(fn, *args) -> float:
    lowered = jax.jit(fn).lower(*args)
    t0 = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - t0


def _programs(impl: str, size: int):
    key = jax.random.key(0, impl=impl)
    x = jnp.ones(size)
    return {
        "no draw (tanh)": (lambda x: jnp.tanh(x) * 2.0, x),
        "split(key, 3)": (lambda k: jax.random.key_data(jax.random.split(k, 3)), key),
        "normal((d,))": (lambda k: jax.random.normal(k, (size,)), key),
        "randint((n,), 0, N)": (lambda k: jax.random.randint(k, (1000 + size,), 0, 10**6), key),
        "split + normal + randint": (
            lambda k: (lambda a, b: (jax.random.normal(a, (size,)),
                                     jax.random.randint(b, (1000 + size,), 0, 10**6)))(
                *jax.random.split(k)), key),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(ap)
    args = ap.parse_args(argv)
    _compile_seconds(lambda x: jnp.sin(x) @ x.T, jnp.ones((3, 3)))  # XLA's one-off start-up
    rows: dict[tuple[str, str], list[float]] = {}
    for r in range(args.repeats):
        for impl in ("threefry2x32", "philox4x32"):
            for name, (fn, arg) in _programs(impl, 21 + r).items():
                rows.setdefault((name, impl), []).append(_compile_seconds(fn, arg))
    print("| program | generator | compile (s) |\n|---|---|---|")
    for (name, impl), secs in rows.items():
        if name.startswith("no draw") and impl != "threefry2x32":
            continue  # the same program for both
        print(f"| {name} | {'–' if name.startswith('no draw') else impl} "
              f"| {statistics.median(secs):.3f} |")


if __name__ == "__main__":
    main()
