"""XLA options for the programs a default run compiles.

A default run compiles a handful of programs before its first draw (the pilot chains'
windows, the Adam blocks of the Laplace fit, the gradient-noise moments, the bias probe, the
chains' start) and the sampling loop. At moderate N their compilation, not their run, is most
of a run's time. :func:`fast_compile_jit` compiles them with the options
:data:`FAST_COMPILE_OPTIONS`, which shorten XLA's compilation without slowing these programs.
The Laplace fit's Newton pass keeps XLA's defaults. The measurements are in
``benchmarks/RESULTS.md`` (``bench_compile.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

__all__ = ["FAST_COMPILE_OPTIONS", "fast_compile_jit"]

#: XLA debug options, names valid on every backend. ``xla_cpu_use_fusion_emitters=False``:
#: XLA's CPU backend generates its fused loops with its elemental emitters instead of its MLIR
#: fusion emitters, which compiles a pilot window, an Adam block, the noise moments or the
#: sampling loop in about 0.6× the time; they then run as fast. The two round some
#: transcendental functions differently in the last bit, so a result (and the draws of a
#: chain) can differ at rounding level from one compiled with XLA's defaults. Not used for
#: the Laplace fit's Newton pass, whose data pass ran 2-3× slower under it at N = 10^6.
#: Turning LLVM's optimisations off (``jax_disable_most_optimizations``) compiles faster
#: still, but these programs then run 3-10× slower (the bias probe's 80,000 gradient
#: estimates, the data passes at N = 10^6) and round differently (no fused multiply-adds).
FAST_COMPILE_OPTIONS: dict[str, Any] = {
    "xla_cpu_use_fusion_emitters": False,
}


def fast_compile_jit(fun: Callable | None = None, **jit_kwargs: Any) -> Callable:
    """``jax.jit`` with :data:`FAST_COMPILE_OPTIONS` (``@fast_compile_jit`` or
    ``@partial(fast_compile_jit, static_argnames=...)``), for a program called from the host:
    JAX accepts compiler options only on a top-level ``jit``, not on one called inside
    another's trace (``pmap``, ``vmap`` of a ``jit``, a user's ``jit``)."""
    if fun is None:
        return lambda f: fast_compile_jit(f, **jit_kwargs)
    return jax.jit(fun, compiler_options=dict(FAST_COMPILE_OPTIONS), **jit_kwargs)
