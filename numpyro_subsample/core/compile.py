"""XLA compiler options of the package's compiled programs.

Most of a cold run's wall time is XLA compilation (``benchmarks/RESULTS.md``, "Compilation and
reruns"), and on CPU most of that is LLVM's optimisation of the generated code. Programs that
run once per preprocessing on small inputs and make no pass over the data (the model's
prototype trace, a chain's initial state, the proxy draws of the noise measurement) are
compiled without LLVM optimisation: about half the compile time, for a run time that stays
negligible. Data passes and the sampling step keep XLA's defaults.
"""

from __future__ import annotations

__all__ = ["RUN_ONCE"]

#: ``compiler_options`` of :func:`jax.jit` for programs that run once on small inputs.
RUN_ONCE: dict[str, int] = {"xla_backend_optimization_level": 0}
