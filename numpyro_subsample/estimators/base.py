"""The gradient estimator: one weighted control-variate formula, many configurations.

With f = −log posterior (notation of Putcha, Nemeth and Fearnhead 2023) every estimator of
the package is

    g(θ) = ∇f0(θ) + Σ_i ∇c_i(θ) + Σ_{j∈S} w_j [∇f_{i_j}(θ) − ∇c_{i_j}(θ)],

where (S, w) comes from a :class:`~numpyro_subsample.estimators.selection.SamplingDesign` and
c_i is the control variate:

- no control variate, uniform w = N/n: Welling and Teh (2011), Putcha et al. (2023, Eq. 3);
- c_i(θ) = ∇f_i(θ̂)ᵀθ (first-order Taylor term at the proxy centre θ̂), whose gradient sum is
  the stored full gradient Σ_i ∇f_i(θ̂): SGLD-CV, Baker, Fearnhead, Fox and Nemeth (2019,
  Eq. 4), Putcha et al. (2023, Eq. 5);
- non-uniform w = 1/(n p_i): Putcha et al. (2023, Eq. 8, SGLD-PS, and Eq. 12, SGLD-CV-PS).

It is unbiased for ∇f(θ) whenever the design is (E Σ_j w_j h_{i_j} = Σ_i h_i), and its noise
is the design's sum applied to the residuals r_i = ∇f_i(θ) − ∇c_i(θ), whose covariance the
design's second moments give exactly (:class:`EstimatorMoments`,
:mod:`numpyro_subsample.estimators.noise`).

An estimator is *data*: a pure function ``estimate(params, key, θ, data) -> (g, n)`` that closes
over static configuration only (the potential, sizes), and the arrays ``params`` it reads.
Because the arrays travel as arguments, a compiled sampling loop is reused on new data of the
same shapes with new proxy centres, weights or strata, and compiles nothing.

An estimator may also carry a per-chain *state* that its estimates update (the control variate
then moves with the chain: SAGA's table of past gradients, SVRG's anchor, Dubey et al. 2016;
:mod:`numpyro_subsample.estimators.variance_reduced`): ``init_state`` and ``update`` of
:class:`GradientEstimator`, a closed NamedTuple state that the chain threads through its steps.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.selection import DesignMoments, SamplingDesign

__all__ = [
    "ControlVariate",
    "EstimatorMoments",
    "GradientEstimator",
    "weighted_gradient",
    "make_estimator",
    "control_variate_from_proxy",
    "pair_control_variate",
]


class ControlVariate(NamedTuple):
    """First-order Taylor control variate at the centre θ̂ (Baker et al. 2019, Eq. 4).

    ``sum_grads`` = Σ_i ∇f_i(θ̂); ``datum_grads`` = the (N, d) table of ∇f_i(θ̂), or None to
    recompute ∇f_i(θ̂) on each subsample (one more model evaluation, no N·d memory).

    Parameters
    ----------
    centre
        θ̂.
    sum_grads
        Σ_i ∇f_i(θ̂).
    datum_grads
        The (N, d) table of ∇f_i(θ̂), or None.

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Eq. 4.
    """

    centre: jax.Array
    sum_grads: jax.Array
    datum_grads: jax.Array | None = None


class EstimatorMoments(NamedTuple):
    """What the exact noise of an estimator needs (static, hashable: a ``jax.jit`` static
    argument).

    ``design(params, θ, data) -> DesignMoments``: the second moments of the selection at θ
    (for a fixed law they do not depend on θ); ``control_variate(params) -> ControlVariate |
    None``: the c_i of the residuals r_i = ∇f_i(θ) − ∇c_i; ``passes_per_point``: data passes
    that ``design`` costs at each θ (0 for a fixed law).
    """

    potential: Potential
    design: Callable[[Any, jax.Array, ModelData], DesignMoments]
    control_variate: Callable[[Any], ControlVariate | None]
    passes_per_point: float = 0.0


class GradientEstimator(NamedTuple):
    """An estimate of ∇f(θ) as a pure function and its arrays.

    ``estimate(params, key, θ, data) -> (g, n)``: the estimate and the number of data used.
    ``params``: the arrays it reads (design, control variate). ``name``: the configuration.
    ``subsample_size``: the largest n it uses. ``data_passes``: full data passes spent building
    it. ``info``: read-only facts about the configuration (weights, strata, V0, ...).
    ``moments``: what its exact noise needs (:class:`EstimatorMoments`), or None if unknown.

    A stateful estimator (None for a stateless one) also gives
    ``init_state(params, data) -> (state, passes)``: the state of a new chain and the data
    passes it costs; ``update(params, state, key, θ, data) -> (g, n, state, passes)``: the
    estimate at θ from ``state``, the data used, the next state and the full data passes spent
    beyond the n data; ``state_axes``: the vmap axes of the state over vectorized chains (a
    pytree prefix of it: 0 for per-chain leaves, None for leaves common to all chains, such as
    a refresh clock, so that a vectorized step branches on them instead of evaluating both
    branches). ``estimate`` is then the estimate from the initial state, which it leaves as is.

    Parameters
    ----------
    estimate
        ``estimate(params, key, θ, data) -> (g, n)``.
    params
        The arrays ``estimate`` reads.
    name
        The configuration's name.
    subsample_size
        The largest n used.
    num_data
        N.
    data_passes
        Full data passes spent building it.
    info
        Facts about the configuration.
    moments
        What its exact noise needs, or None.
    init_state, update, state_axes
        A stateful estimator's functions and the vmap axes of its state (above).

    References
    ----------
    Putcha, Nemeth and Fearnhead (2023), Eq. 3 and 5 (the estimators this record holds).
    """

    estimate: Callable[[Any, jax.Array, jax.Array, ModelData], tuple[jax.Array, jax.Array]]
    params: Any
    name: str
    subsample_size: int
    num_data: int
    data_passes: float = 0.0
    info: dict | None = None
    moments: EstimatorMoments | None = None
    init_state: Callable[[Any, ModelData], tuple[Any, jax.Array]] | None = None
    update: Callable[..., tuple[jax.Array, jax.Array, Any, jax.Array]] | None = None
    state_axes: Any = 0

    def __call__(self, key: jax.Array, theta: jax.Array, data: ModelData):
        """``estimate`` with the estimator's own params."""
        return self.estimate(self.params, key, theta, data)


def weighted_gradient(
    potential: Potential,
    theta: jax.Array,
    idx: jax.Array,
    weights: jax.Array,
    data: ModelData,
    cv: ControlVariate | None = None,
) -> jax.Array:
    """g(θ) = ∇f0(θ) + Σ_i ∇c_i + Σ_j w_j [∇f_{i_j}(θ) − ∇c_{i_j}] (module docstring)."""
    weights = weights.astype(theta.dtype)

    def weighted(t):
        f0, fi = potential.terms(t, idx, data)
        return f0 + jnp.dot(weights, fi)

    g = jax.grad(weighted)(theta)
    if cv is None:
        return g
    if cv.datum_grads is not None:
        batch_at_centre = weights @ cv.datum_grads[idx]
    else:
        batch_at_centre = jax.grad(
            lambda t: jnp.dot(weights, potential.data_terms(t, idx, data))
        )(cv.centre)
    return g + cv.sum_grads - batch_at_centre


@lru_cache(maxsize=256)
def _design_estimate(potential: Potential, draw: Callable, size: int) -> Callable:
    def estimate(params, key, theta, data):
        design_params, cv = params
        idx, w = draw(design_params, key)
        return weighted_gradient(potential, theta, idx, w, data, cv), jnp.asarray(size)

    return estimate


def pair_control_variate(params) -> ControlVariate | None:
    """The control variate of ``params = (design or law params, cv)``."""
    return params[1]


@lru_cache(maxsize=256)
def _fixed_design_moments(moments: Callable) -> Callable:
    def design(params, theta, data):
        return moments(params[0])

    return design


def make_estimator(
    potential: Potential,
    design: SamplingDesign,
    cv: ControlVariate | None = None,
    *,
    name: str = "",
    data_passes: float = 0.0,
    info: dict | None = None,
) -> GradientEstimator:
    """Bind a potential, a selection law and a control variate into an estimator.

    Parameters
    ----------
    potential
        The model's potential.
    design
        The selection law (:class:`~numpyro_subsample.estimators.selection.SamplingDesign`).
    cv
        The control variate, or None for the plain weighted sum.
    name
        The configuration's name.
    data_passes
        Passes spent building it.
    info
        Facts about the configuration.

    Returns
    -------
    GradientEstimator
        g(θ) = ∇f0(θ) + Σ_i ∇c_i + Σ_j w_j [∇f_{i_j}(θ) − ∇c_{i_j}].

    References
    ----------
    Putcha, Nemeth and Fearnhead (2023), Eq. 5, 8, 12; Baker, Fearnhead, Fox and Nemeth
    (2019), Eq. 4.
    """
    return GradientEstimator(
        estimate=_design_estimate(potential, design.draw, design.size),
        params=(design.params, cv),
        name=name,
        subsample_size=design.size,
        num_data=design.num_data,
        data_passes=float(data_passes),
        info=info,
        moments=None if design.moments is None else EstimatorMoments(
            potential=potential, design=_fixed_design_moments(design.moments),
            control_variate=pair_control_variate,
        ),
    )


def control_variate_from_proxy(proxy) -> ControlVariate:
    """The Taylor control variate at a proxy's centre."""
    return ControlVariate(centre=proxy.centre, sum_grads=proxy.sum_grads,
                          datum_grads=proxy.datum_grads)
