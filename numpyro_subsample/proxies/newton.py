"""The damped Newton phase of the Laplace fit on the full data.

Each evaluation is one chunked data pass giving f, ∇f and ∇²f (:func:`.checks.newton_pass`);
the step solves with the Cholesky factor of ∇²f, damped until positive definite, and a
backtracking line search accepts the first candidate that passes the Armijo test, or, where
float rounding of the full-data sum hides the decrease of f, whose Newton decrement is smaller
(Nocedal and Wright 2006, Ch. 3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from numpyro_subsample.core.data import device_array
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.checks import newton_point
from numpyro_subsample.proxies.progress import finish_bar, progress_bar

__all__ = ["NewtonResult", "damped_newton_step", "line_search", "newton_phase"]


class NewtonResult(NamedTuple):
    """The end of the Newton phase: θ, f, ∇f, ∇²f there, the steps taken, why it stopped
    (None: converged) and the data passes, those of the Newton phase added."""

    theta: jax.Array
    f: jax.Array
    g: jax.Array
    h: jax.Array
    steps: int
    stop: str | None
    passes: float


def newton_phase(potential: Potential, data: ModelData, theta: jax.Array, chunk_size: int,
                  max_newton_steps: int, progress: bool, passes: float) -> NewtonResult:
    """Damped Newton steps on the full data from ``theta`` with a backtracking line search
    (:func:`line_search`), until the Newton decrement λ² is below 1e-8·d, no finite
    derivatives or no decrease, or ``max_newton_steps``."""
    # the Newton passes skip the excursions (of the final centre, _fit_messages) in the same
    # compiled program
    def vgh(t):
        return newton_point(potential, t, data, chunk_size)[:3]  # f, ∇f, ∇²f

    f, g, h = vgh(theta)
    passes += 1
    bar = progress_bar(max_newton_steps, "proxy: Newton on full data", progress)
    steps = 0
    stop = f"the Newton iterations were exhausted (max_newton_steps={max_newton_steps})"
    for _ in range(max_newton_steps):
        hn = np.asarray(h, np.float64)
        gn = np.asarray(g, np.float64)
        if not (np.isfinite(f) and np.all(np.isfinite(gn)) and np.all(np.isfinite(hn))):
            stop = "the potential or its derivatives were not finite"
            break
        chol, step, decrement = damped_newton_step(hn, gn)
        if decrement < 1e-8 * max(1, theta.shape[0]):
            stop = None
            break
        # Rounding of the full-data sum f (about eps·|f|·sqrt(chunks)) hides the decrease of a
        # step close to the mode; there the Newton decrement at the candidate (from gradients,
        # which keep their precision) decides instead of the Armijo test on f.
        f_resolution = 4 * np.finfo(np.dtype(theta.dtype)).eps * abs(float(f)) * np.sqrt(
            max(1, potential.num_data // chunk_size)
        )
        found, passes = line_search(vgh, theta, f, step, chol, decrement, f_resolution,
                                     passes)
        steps += 1
        bar.update(1)
        if found is None:
            stop = "the line search found no decrease"
            break
        theta, f, g, h = found
    finish_bar(bar, f"converged at step {steps}" if stop is None else (
        f"stopped at step {steps}: {stop}" if steps < max_newton_steps
        else "not converged"))
    return NewtonResult(theta=theta, f=f, g=g, h=h, steps=steps, stop=stop, passes=passes)


def damped_newton_step(hn: np.ndarray, gn: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The Cholesky factor of ∇²f + λI (λ = 0, else raised until it is positive definite),
    the Newton step and the Newton decrement λ² = ∇fᵀ step (squared distance in Σ̂ units)."""
    damping = 0.0
    while True:
        try:
            chol = np.linalg.cholesky(hn + damping * np.eye(hn.shape[0]))
            break
        except np.linalg.LinAlgError:
            damping = max(1e-6 * np.abs(np.diag(hn)).max(), 10 * damping)
    step = np.linalg.solve(chol.T, np.linalg.solve(chol, gn))
    return chol, step, float(gn @ step)


def line_search(vgh: Callable, theta: jax.Array, f: jax.Array, step: np.ndarray,
                 chol: np.ndarray, decrement: float, f_resolution: float, passes: float,
                 ) -> tuple[tuple | None, float]:
    """Backtracking from the full step (halving down to 1e-6): ``((θ, f, ∇f, ∇²f) of the
    first candidate that passes the Armijo test, or None; passes)``, one data pass added per
    evaluation. Where the decrease of f is below its rounding ``f_resolution``, the candidate
    passes if its Newton decrement is below ``decrement``."""
    t = 1.0
    while t > 1e-6:
        cand = device_array((np.asarray(theta) - t * step).astype(theta.dtype))  # on the host
        fc, gc, hc = vgh(cand)
        passes += 1
        if not np.isfinite(fc):
            t *= 0.5
            continue
        armijo = float(fc) <= float(f) - 1e-4 * t * decrement
        unresolved = abs(float(fc) - float(f)) <= f_resolution + 1e-4 * t * decrement
        if not armijo and unresolved:
            gcn = np.asarray(gc, np.float64)
            armijo = float(gcn @ np.linalg.solve(chol.T, np.linalg.solve(chol, gcn))) < (
                decrement
            )
        if armijo:
            return (cand, fc, gc, hc), passes
        t *= 0.5
    return None, passes
