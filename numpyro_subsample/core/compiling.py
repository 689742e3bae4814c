"""XLA options for the programs of a run's preprocessing.

A default run compiles a handful of programs that run once or a few times before the sampling
loop (the pilot chains' windows, the Adam blocks of the Laplace fit, the gradient-noise
moments, the bias probe). At moderate N their compilation, not their run, is most of the
preprocessing's time. :func:`preprocessing_jit` compiles them with the options
:data:`PREPROCESSING_OPTIONS`, which shorten XLA's compilation without slowing these programs;
the sampling loop (compiled by NumPyro's ``MCMC``) keeps XLA's defaults. The measurements are
in ``benchmarks/RESULTS.md`` (``bench_compile.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

__all__ = ["PREPROCESSING_OPTIONS", "preprocessing_jit"]

#: XLA debug options, names valid on every backend. ``xla_cpu_use_fusion_emitters=False``:
#: XLA's CPU backend generates its fused loops with its elemental emitters instead of its MLIR
#: fusion emitters, which compiles a pilot window, an Adam block or the noise moments in about
#: 0.6× the time; they then run as fast. The two round some transcendental functions
#: differently in the last bit, so a preprocessing result (and the draws of a chain started
#: from it) can differ at rounding level from one compiled with XLA's defaults. Not used for
#: the Laplace fit's Newton pass, whose data pass ran 2-3× slower under it at N = 10^6.
#: Turning LLVM's optimisations off (``jax_disable_most_optimizations``) compiles faster
#: still, but these programs then run 3-10× slower (the bias probe's 80,000 gradient
#: estimates, the data passes at N = 10^6) and round differently (no fused multiply-adds).
PREPROCESSING_OPTIONS: dict[str, Any] = {
    "xla_cpu_use_fusion_emitters": False,
}


def preprocessing_jit(fun: Callable | None = None, **jit_kwargs: Any) -> Callable:
    """``jax.jit`` with :data:`PREPROCESSING_OPTIONS`, for a program run once or a few times
    before sampling (``@preprocessing_jit`` or
    ``@partial(preprocessing_jit, static_argnames=...)``)."""
    if fun is None:
        return lambda f: preprocessing_jit(f, **jit_kwargs)
    return jax.jit(fun, compiler_options=dict(PREPROCESSING_OPTIONS), **jit_kwargs)
