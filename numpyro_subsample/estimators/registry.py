"""Every estimator configuration by name: ``{name: builder}``.

A builder has the signature ``builder(potential, data, proxy, *, subsample_size, replace,
rng_key, chunk_size, **options) -> GradientEstimator``; :func:`configure_estimator` looks the
name up, checks the options, and wraps the result in the adaptive subsample size on request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from numpyro_subsample.core.datapass import DEFAULT_CHUNK
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.base import (
    GradientEstimator,
    control_variate_from_proxy,
    make_estimator,
)
from numpyro_subsample.estimators.selection import uniform_design

__all__ = ["ESTIMATORS", "NEEDS_PROXY", "configure_estimator", "register_estimator"]


def _build_uniform(potential, data, proxy, *, subsample_size, replace, rng_key, chunk_size):
    """Welling and Teh (2011): uniform subsample, weights N/n, no control variate."""
    design = uniform_design(potential.num_data, subsample_size, replace, potential.init_theta.dtype)
    return make_estimator(potential, design, name="uniform")


def _build_cv(potential, data, proxy, *, subsample_size, replace, rng_key, chunk_size):
    """SGLD-CV (Baker et al. 2019, Eq. 4): uniform subsample, Taylor control variate at θ̂."""
    design = uniform_design(potential.num_data, subsample_size, replace, potential.init_theta.dtype)
    return make_estimator(potential, design, control_variate_from_proxy(proxy), name="cv")


ESTIMATORS: dict[str, Callable[..., GradientEstimator]] = {
    "uniform": _build_uniform,
    "cv": _build_cv,
}
#: names whose builder reads the proxy (centre, covariance or ∇f_i(θ̂))
NEEDS_PROXY: set[str] = {"cv"}


def register_estimator(name: str, builder: Callable[..., GradientEstimator], *,
                       needs_proxy: bool) -> None:
    """Add a named configuration (used by the estimator modules and by users)."""
    ESTIMATORS[name] = builder
    if needs_proxy:
        NEEDS_PROXY.add(name)


def configure_estimator(
    name: str,
    potential: Potential,
    data: ModelData,
    proxy=None,
    *,
    subsample_size: int | None = None,
    replace: bool = True,
    rng_key: jax.Array | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    **options: Any,
) -> GradientEstimator:
    """Build the named estimator configuration on ``data``.

    ``options`` go to the builder (see the module of each estimator); unknown names and
    options raise ``ValueError`` listing the valid ones.
    """
    if name not in ESTIMATORS:
        raise ValueError(f"Unknown estimator {name!r}; choose one of {sorted(ESTIMATORS)}.")
    if name in NEEDS_PROXY and proxy is None:
        raise ValueError(f"estimator={name!r} needs a proxy (its centre θ̂ and ∇f_i(θ̂)).")
    n = int(subsample_size or potential.plate.subsample_size)
    key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    builder = ESTIMATORS[name]
    try:
        return builder(potential, data, proxy, subsample_size=n, replace=replace,
                       rng_key=key, chunk_size=chunk_size, **options)
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):
            raise
        raise ValueError(f"Unknown option(s) {sorted(options)} for estimator {name!r}: {err}") from err
