"""Every estimator configuration by name: ``{name: builder}``.

A builder has the signature ``builder(potential, data, proxy, *, subsample_size, replace,
rng_key, chunk_size, **options) -> GradientEstimator``, its options as keyword-only arguments
with defaults; a builder may be a :func:`functools.partial`, whose bound keywords fix the
configuration and are not options. :func:`configure_estimator` looks the name up, checks the
options against the builder's signature (before any data pass), and with ``adaptive=True``
wraps a ``"cv"`` or ``"cv-preferential"`` estimator in the adaptive subsample size
(:mod:`numpyro_subsample.estimators.adaptive`).

``"saga"`` and ``"svrg"`` (Dubey et al. 2016, :mod:`numpyro_subsample.estimators.variance_reduced`)
carry a per-chain state (:data:`STATEFUL`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK
from numpyro_subsample.core.options import OPTIONS, check_options, did_you_mean
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.adaptive import (
    ADAPTIVE_NAMES,
    AdaptiveOptions,
    adaptive_options,
    adaptive_size,
)
from numpyro_subsample.estimators.base import (
    GradientEstimator,
    control_variate_from_proxy,
    make_estimator,
)
from numpyro_subsample.estimators.preferential import build_cv_preferential, build_preferential
from numpyro_subsample.estimators.selection import uniform_design
from numpyro_subsample.estimators.stratified import build_cv_stratified, build_stratified
from numpyro_subsample.estimators.variance_reduced import build_saga, build_svrg, check_saga_memory

__all__ = [
    "ESTIMATORS",
    "NEEDS_PROXY",
    "STATEFUL",
    "check_estimator_request",
    "configure_estimator",
    "estimator_options",
    "register_estimator",
]

_COMMON = ("subsample_size", "replace", "rng_key", "chunk_size")


def _build_uniform(potential, data, proxy, *, subsample_size, replace=True, rng_key=None,
                   chunk_size=DEFAULT_CHUNK):
    """Welling and Teh (2011): uniform subsample, weights N/n, no control variate."""
    design = uniform_design(potential.num_data, subsample_size, replace, potential.init_theta.dtype)
    return make_estimator(potential, design, name="uniform")


def _build_cv(potential, data, proxy, *, subsample_size, replace=True, rng_key=None,
              chunk_size=DEFAULT_CHUNK):
    """SGLD-CV (Baker et al. 2019, Eq. 4): uniform subsample, Taylor control variate at θ̂."""
    if proxy is None:
        raise ValueError(
            "estimator='cv' needs a proxy (its centre θ̂ and ∇f_i(θ̂)); pass proxy='laplace' "
            "or a Proxy."
        )
    design = uniform_design(potential.num_data, subsample_size, replace, potential.init_theta.dtype)
    return make_estimator(potential, design, control_variate_from_proxy(proxy), name="cv")


ESTIMATORS: dict[str, Callable[..., GradientEstimator]] = {
    "uniform": _build_uniform,
    "cv": _build_cv,
    "preferential": partial(build_preferential, control_variate=False),
    "cv-preferential": build_cv_preferential,
    "stratified": partial(build_stratified, control_variate=False),
    "cv-stratified": build_cv_stratified,
    "saga": build_saga,
    "svrg": build_svrg,
}
#: names whose builder reads the proxy by default (centre, covariance or ∇f_i(θ̂)); a kernel
#: fits one for them even without preconditioning. Builders check their own needs.
NEEDS_PROXY: set[str] = {"cv", "preferential", "cv-preferential", "stratified", "cv-stratified",
                         "saga", "svrg"}
#: names whose estimator carries a per-chain state (``GradientEstimator.update``): its noise
#: changes with the state, so the kernels' noise correction (a fixed covariance) is off for them.
STATEFUL: set[str] = {"saga", "svrg"}


def register_estimator(name: str, builder: Callable[..., GradientEstimator], *,
                       needs_proxy: bool) -> None:
    """Add a named configuration (a builder with the signature of the module docstring)."""
    ESTIMATORS[name] = builder
    if needs_proxy:
        NEEDS_PROXY.add(name)
    else:
        NEEDS_PROXY.discard(name)


def estimator_options(name: str) -> tuple[str, ...] | None:
    """The options of a named configuration (its builder's keyword-only arguments beyond the
    common ones and those bound by a :func:`functools.partial`), or None if the builder takes
    arbitrary ``**options``."""
    builder = ESTIMATORS[name]
    params = inspect.signature(builder).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    fixed = set(_COMMON) | set(builder.keywords if isinstance(builder, partial) else ())
    return tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in fixed)


def _typecheck(owner: str, values: dict) -> None:
    """Types and ranges of the options declared for ``owner`` (:mod:`numpyro_subsample.core.
    options`); options of a user-registered builder are not declared and pass as given."""
    spec = OPTIONS.get(owner, {})
    declared = {k: v for k, v in values.items() if k in spec}
    if declared:
        check_options(owner, **declared)


def _check_options(name: str, options: dict, adaptive: bool,
                   kernel: tuple[str, Sequence[str]] | None = None) -> dict:
    """Split ``options`` into the builder's and the adaptive wrapper's; raise on unknown ones
    (listing the valid ones, with the close matches among them and the keyword arguments of
    ``kernel``, a ``(class name, parameter names)`` pair, first) and on values of the wrong
    type or out of range."""
    valid = estimator_options(name)
    if valid is None:
        return dict(options)
    extra = AdaptiveOptions._fields if adaptive else ()
    unknown = sorted(set(options) - set(valid) - set(extra))
    if unknown:
        hint = "" if adaptive or name not in ADAPTIVE_NAMES else (
            "; with adaptive=True also " + ", ".join(AdaptiveOptions._fields))
        label, params = kernel if kernel is not None else ("", ())
        guess = did_you_mean(unknown, [*params, *valid, *extra, *AdaptiveOptions._fields,
                                        "subsample_size", "adaptive"])
        owner = f"{label} (estimator {name!r})" if label else f"estimator {name!r}"
        kernel_args = f"{label}'s keyword arguments: {', '.join(params)}; " if label else ""
        raise ValueError(
            f"Unknown option(s) {unknown} for {owner}" + (f": {guess}" if guess else ".")
            + f" Valid: {kernel_args}options of estimator {name!r}: "
            f"{list(valid) + list(extra) or 'none'}{hint}."
        )
    builder_opts = {k: v for k, v in options.items() if k in valid}
    _typecheck(f"estimator={name!r}", builder_opts)
    _typecheck("adaptive=True", {k: v for k, v in options.items() if k not in valid})
    return builder_opts


def check_estimator_request(
    name: str, options: dict, *, replace: bool = True, potential: Potential | None = None,
    num_chains: int = 1, kernel: tuple[str, Sequence[str]] | None = None,
) -> None:
    """Cheap checks of a named configuration and its options, before any data pass.

    ``options`` are those a kernel passes to :func:`configure_estimator` (the builder's,
    ``subsample_size``, ``adaptive`` and the adaptive options). Without ``potential``: names,
    types and ranges, and the combinations that need no data; with it, also the checks that
    need N and the subsample size n (``num_strata`` ≤ n, arrays of N rows, ``n_max`` ≤ N, the
    memory of ``num_chains`` SAGA tables), so that a kernel reports them before fitting its
    proxy. ``kernel``: the calling kernel's class name and keyword arguments, offered as close
    matches of a misspelt option (``stepsize`` → ``step_size``).
    """
    if name not in ESTIMATORS:
        raise ValueError(f"Unknown estimator {name!r}; choose one of {sorted(ESTIMATORS)}.")
    top = {k: options[k] for k in ("subsample_size", "adaptive") if k in options}
    check_options("configure_estimator", **top)
    adaptive = bool(top.get("adaptive", False))
    if adaptive and name not in ADAPTIVE_NAMES:
        raise ValueError(
            "adaptive=True needs a control variate (Putcha et al. 2023, Eq. 18-19); "
            f"estimator={name!r} has none. Use estimator='cv' or 'cv-preferential'."
        )
    rest = {k: v for k, v in options.items() if k not in top}
    builder_opts = _check_options(name, rest, adaptive, kernel)
    if name in ("preferential", "cv-preferential") and not replace:
        raise ValueError(
            f"estimator={name!r} draws the subsample with replacement (Putcha et al. 2023, "
            "Sect. 3); got replace=False. Pass replace=True."
        )
    if potential is None:
        return
    N = potential.num_data
    n = top.get("subsample_size") or potential.plate.subsample_size
    if n > N:
        raise ValueError(
            f"subsample_size={n} exceeds the size N={N} of plate '{potential.plate.name}'; "
            f"pass an integer between 1 and {N}."
        )
    if name == "saga":
        check_saga_memory(N, potential.dim, potential.init_theta.dtype, num_chains)
    if adaptive:
        adaptive_options(name, potential, n, builder_opts,
                         **{k: v for k, v in rest.items() if k not in builder_opts})
    if name in ("stratified", "cv-stratified"):
        k = builder_opts.get("num_strata", 10)
        if k > n:
            raise ValueError(
                f"estimator={name!r}: num_strata={k} exceeds the subsample size n={n}: each "
                "stratum needs at least one draw per step. Lower num_strata or raise the "
                f"subsample_size of plate '{potential.plate.name}'."
            )
        features = builder_opts.get("features")
        if features is not None and np.shape(features)[0] != N:
            raise ValueError(
                f"estimator={name!r}: features must have shape (N, p) with N={N} (the size of "
                f"plate '{potential.plate.name}'), got {np.shape(features)}."
            )
    weights = builder_opts.get("weights")
    if weights is not None and not isinstance(weights, str) and np.shape(weights) != (N,):
        raise ValueError(
            f"estimator={name!r}: weights must be 'approx', 'exact' or an array of length "
            f"N={N} (the size of plate '{potential.plate.name}'); got shape "
            f"{np.shape(weights)}."
        )


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
    adaptive: bool = False,
    **options: Any,
) -> GradientEstimator:
    """Build the named estimator configuration on ``data``.

    Parameters
    ----------
    name
        A key of :data:`ESTIMATORS`.
    subsample_size
        n (default: the plate's ``subsample_size``; with ``adaptive=True``, n_max).
    adaptive
        Choose n per step (Putcha et al. 2023, Algorithm 2); ``"cv"`` and
        ``"cv-preferential"`` only. Its options
        (:class:`~numpyro_subsample.estimators.adaptive.AdaptiveOptions`) go in ``options``.
    **options
        The builder's options (see the module of each estimator); unknown names raise
        ``ValueError`` listing the valid ones.
    potential, data
        The model's potential and data.
    proxy
        The proxy whose centre the control variates use (None for ``"uniform"``).
    replace
        Draw with replacement (default) or without.
    rng_key
        Key of the preprocessing draws (k-means, probes).
    chunk_size
        Data per vmapped evaluation in full-data passes.

    Returns
    -------
    GradientEstimator
        The configured estimator.

    References
    ----------
    Welling and Teh (2011); Baker, Fearnhead, Fox and Nemeth (2019), Eq. 4; Putcha, Nemeth and
    Fearnhead (2023), Eq. 8, 12, Algorithm 2; Fu and Zhang (2023), Eq. 10; Dubey et al. (2016).
    """
    if name not in ESTIMATORS:
        raise ValueError(f"Unknown estimator {name!r}; choose one of {sorted(ESTIMATORS)}.")
    builder_opts = _check_options(name, options, bool(adaptive))
    n = int(subsample_size or potential.plate.subsample_size)
    ada = None
    if adaptive:
        rest = {k: v for k, v in options.items() if k not in builder_opts}
        ada = adaptive_options(name, potential, n, builder_opts, **rest)
        n = ada.n_max
    key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    est = ESTIMATORS[name](potential, data, proxy, subsample_size=n, replace=replace,
                           rng_key=key, chunk_size=chunk_size, **builder_opts)
    if ada is None:
        return est
    return adaptive_size(est, potential, data, proxy, ada, replace=replace, rng_key=key,
                         chunk_size=chunk_size)
