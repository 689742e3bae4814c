"""Which proxy a kernel fits for ``proxy="laplace"``, ``"diagonal"`` or ``"low-rank"``: the
dense Laplace proxy up to :data:`MAX_DENSE_DIM` parameters, the structured one above, with the
defaults every kernel shares (:func:`fit_kernel_structured`).
"""

from __future__ import annotations

import inspect
from typing import Any

from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.structured import StructuredProxy, fit_structured

__all__ = ["MAX_DENSE_DIM", "DEFAULT_RANK", "STRUCTURED", "FIT_OPTIONS", "structured_choice",
           "fit_kernel_structured"]

#: ``proxy="laplace"`` (every kernel's default) fits the dense Laplace proxy up to this many
#: parameters d, and the structured ``"low-rank"`` proxy above (its d × d Hessian, Cholesky
#: factor and noise covariance would take d² numbers each: 16 MB at d = 2000 in float32).
#: Above it a structured fit uses the Hessian with a Hutchinson estimate of its diagonal (one
#: data pass) unless ``proxy_kwargs`` set ``diagonal``: the exact Hessian diagonal costs d
#: Hessian-vector products per datum. Negative curvature is clipped. The empirical Fisher
#: (``proxy_kwargs={"curvature": "fisher"}``) is second order in the residuals, so it
#: underestimates the curvature of a model that fits its data closely.
MAX_DENSE_DIM = 2000

#: The rank k of ``proxy="low-rank"`` unless ``proxy_kwargs={"rank": k}`` (capped at d − 1).
DEFAULT_RANK = 20

#: The names of the structured proxies.
STRUCTURED = ("diagonal", "low-rank")

#: The options of :func:`~numpyro_subsample.proxies.structured.fit_structured` that
#: ``proxy_kwargs`` may set (the kernel sets the others).
FIT_OPTIONS = frozenset(inspect.signature(fit_structured).parameters) - {
    "potential", "data", "rng_key", "structure", "chunk_size", "store_datum_grads", "progress"}


def structured_choice(spec: Any, dim: int) -> str | None:
    """``"diagonal"`` or ``"low-rank"`` when the proxy ``spec`` of a model of ``dim``
    parameters is fitted structured (``"laplace"`` above :data:`MAX_DENSE_DIM`), else None."""
    if isinstance(spec, str):
        if spec in STRUCTURED:
            return spec
        if spec == "laplace" and dim > MAX_DENSE_DIM:
            return "low-rank"
    return None


def fit_kernel_structured(
    potential: Potential, data: ModelData, key: Any, structure: str, proxy_kwargs: dict, *,
    laplace_requested: bool, chunk_size: int, store_datum_grads: bool, progress: bool,
    label: str,
) -> StructuredProxy:
    """The structured proxy ``structure`` with the kernels' defaults: rank
    :data:`DEFAULT_RANK` (at most d − 1); above :data:`MAX_DENSE_DIM` the Hessian curvature
    with a Hutchinson diagonal unless ``proxy_kwargs`` set ``diagonal``. Unknown
    ``proxy_kwargs`` raise, naming ``label`` (the kernel) and the valid ones."""
    d = potential.dim
    kwargs = dict(proxy_kwargs)
    unknown = sorted(set(kwargs) - FIT_OPTIONS)
    if unknown:
        why = (f"{label}: proxy='laplace' is fitted as proxy='low-rank' for d={d} > "
               f"MAX_DENSE_DIM={MAX_DENSE_DIM} (numpyro_subsample.proxies.choice); "
               if laplace_requested else f"{label}: ")
        raise ValueError(
            f"{why}proxy_kwargs {unknown} are not options of the structured fit "
            f"(fit_structured; the structure is chosen by proxy=); valid: "
            f"{sorted(FIT_OPTIONS)}." + (" Pass a fitted Proxy to keep a dense proxy."
                                          if laplace_requested else "")
        )
    if structure == "low-rank":
        kwargs.setdefault("rank", min(DEFAULT_RANK, d - 1))
    if d > MAX_DENSE_DIM and "diagonal" not in kwargs:
        # the exact Hessian diagonal costs d Hessian-vector products per datum
        kwargs.setdefault("curvature", "hessian")
        if kwargs["curvature"] == "hessian":
            kwargs["diagonal"] = "hutchinson"
    return fit_structured(
        potential, data, key, structure=structure, chunk_size=chunk_size,
        store_datum_grads=store_datum_grads, progress=progress, **kwargs,
    )
