"""The gradient estimator: one weighted control-variate formula, many configurations.

With f = −log posterior (paper 000 notation) every estimator of the package is

    g(θ) = ∇f0(θ) + Σ_i ∇c_i(θ) + Σ_{j∈S} w_j [∇f_{i_j}(θ) − ∇c_{i_j}(θ)],

where (S, w) comes from a :class:`~numpyro_subsample.selection.SamplingDesign` and c_i is the
control variate:

- no control variate, uniform w = N/n: Welling-Teh SGLD, paper 000 Eq. (3);
- c_i(θ) = ∇f_i(θ̂)ᵀθ (first-order Taylor term at the proxy centre θ̂), whose gradient sum is
  the stored full gradient Σ_i ∇f_i(θ̂): SGLD-CV, paper 000 Eq. (5) / paper 002 Eq. (4);
- non-uniform w = 1/(n p_i): paper 000 Eq. (8) (SGLD-PS) and Eq. (12) (SGLD-CV-PS).

It is unbiased for ∇f(θ) whenever the design is (E Σ_j w_j h_{i_j} = Σ_i h_i).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .potential import Potential
from .selection import SamplingDesign

__all__ = ["ControlVariate", "GradientEstimator", "weighted_gradient", "make_estimator"]


class ControlVariate(NamedTuple):
    """First-order Taylor control variate at the centre θ̂ (paper 002 Eq. 4).

    ``sum_grads`` = Σ_i ∇f_i(θ̂); ``datum_grads`` = the (N, d) table of ∇f_i(θ̂), or None to
    recompute ∇f_i(θ̂) on each subsample (one more model evaluation, no N·d memory).
    """

    centre: jax.Array
    sum_grads: jax.Array
    datum_grads: jax.Array | None = None


class GradientEstimator(NamedTuple):
    """``estimate(key, θ) -> (g, n)``: an estimate of ∇f(θ) and the number of data used."""

    estimate: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
    design: SamplingDesign
    control_variate: ControlVariate | None


def weighted_gradient(
    potential: Potential,
    theta: jax.Array,
    idx: jax.Array,
    weights: jax.Array,
    cv: ControlVariate | None = None,
) -> jax.Array:
    """g(θ) = ∇f0(θ) + Σ_i ∇c_i + Σ_j w_j [∇f_{i_j}(θ) − ∇c_{i_j}] (module docstring)."""
    weights = weights.astype(theta.dtype)

    def weighted(t):
        f0, fi = potential.terms(t, idx)
        return f0 + jnp.dot(weights, fi)

    g = jax.grad(weighted)(theta)
    if cv is None:
        return g
    if cv.datum_grads is not None:
        batch_at_centre = weights @ cv.datum_grads[idx]
    else:
        batch_at_centre = jax.grad(lambda t: jnp.dot(weights, potential.data_terms(t, idx)))(
            cv.centre
        )
    return g + cv.sum_grads - batch_at_centre


def make_estimator(
    potential: Potential, design: SamplingDesign, cv: ControlVariate | None = None
) -> GradientEstimator:
    """Bind a potential, a selection law and a control variate into an estimator."""

    def estimate(key, theta):
        idx, w = design.draw(key)
        return weighted_gradient(potential, theta, idx, w, cv), jnp.asarray(design.size)

    return GradientEstimator(estimate, design, cv)


ESTIMATORS = ("uniform", "cv", "preferential", "cv-preferential", "stratified", "cv-stratified")


def configure_estimator(
    name: str,
    potential: Potential,
    proxy=None,
    *,
    subsample_size: int | None = None,
    replace: bool = True,
    **options,
) -> GradientEstimator:
    """Build the named estimator configuration.

    ``"uniform"``: uniform design, no control variate (paper 000 Eq. 3).
    ``"cv"``: uniform design, Taylor control variate at the proxy centre (Eq. 5).
    Further names and ``options`` are documented by the modules that implement them.
    """
    from .selection import uniform_design

    N = potential.num_data
    n = int(subsample_size or potential.plate.subsample_size)
    dtype = potential.init_theta.dtype
    if name not in ESTIMATORS:
        raise ValueError(f"Unknown estimator {name!r}; choose one of {ESTIMATORS}.")
    if name in ("preferential", "cv-preferential"):
        from .preferential import configure_preferential

        return configure_preferential(name, potential, proxy, n, replace, **options)
    if name in ("stratified", "cv-stratified"):
        from .stratified import configure_stratified

        return configure_stratified(name, potential, proxy, n, replace, **options)
    if options.pop("adaptive", False):
        # ASGLD-CV (paper 000 Algorithm 2); "uniform" gets a clear error there
        from .adaptive import configure_adaptive

        return configure_adaptive(name, potential, proxy, n, replace, **options)
    if options:
        raise ValueError(
            f"Unknown option(s) {sorted(options)} for estimator {name!r}."
        )
    if name == "uniform":
        return make_estimator(potential, uniform_design(N, n, replace, dtype))
    if proxy is None:
        raise ValueError(f"estimator={name!r} needs a proxy (its centre θ̂ and ∇f_i(θ̂)).")
    cv = control_variate_from_proxy(proxy)
    return make_estimator(potential, uniform_design(N, n, replace, dtype), cv)


def control_variate_from_proxy(proxy) -> ControlVariate:
    """The Taylor control variate at a proxy's centre."""
    return ControlVariate(proxy.centre, proxy.sum_grads, proxy.datum_grads)
