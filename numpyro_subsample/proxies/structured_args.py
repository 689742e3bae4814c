"""The checked arguments of :func:`~numpyro_subsample.proxies.structured.fit_structured`:
each bad one raises a ``ValueError`` naming it, before any data pass."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import chunk_count
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.proxies.curvature import CURVATURES
from numpyro_subsample.proxies.lowrank import COMPLEMENTS

__all__ = ["DIAGONALS", "STRUCTURES", "StructuredArguments", "checked_arguments"]

STRUCTURES = ("diagonal", "low-rank")
DIAGONALS = ("exact", "hutchinson")


def _int_arg(name: str, value, low: int, high: int | None = None, what: str = "") -> int:
    ok = not isinstance(value, bool) and isinstance(value, (int, np.integer))
    if not ok or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"≥ {low}"
        raise ValueError(f"{name} must be an integer {bound}{what}, got {value!r}.")
    return int(value)


def _choice(name: str, value, options: tuple[str, ...], extra: str = "") -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}.{extra}")
    return value


def _positive(name: str, value, upper: float | None = None) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = float("nan")
    if not (x > 0 and math.isfinite(x)) or (upper is not None and not x < upper):
        bound = f" and < {upper}" if upper is not None else ""
        raise ValueError(f"{name} must be a finite number > 0{bound}, got {value!r}.")
    return x


class StructuredArguments(NamedTuple):
    """The checked arguments of :func:`fit_structured` (``rank`` 0 for "diagonal";
    ``init_theta`` the start, in the potential's dtype)."""

    structure: str
    rank: int
    curvature: str
    diagonal: str
    complement: str
    oversample: int
    ritz_tol: float
    num_probes: int
    block_size: int
    max_iterations: int
    memory_size: int
    chunk_size: int
    curvature_floor: float
    gtol: float
    learning_rate: float
    num_epochs: float
    init_theta: jax.Array


def checked_arguments(potential: Potential, *, structure, rank, curvature, diagonal,
                       num_probes, complement, oversample, ritz_tol, curvature_floor,
                       init_theta, num_epochs, learning_rate, max_iterations, gtol,
                       memory_size, chunk_size, block_size) -> StructuredArguments:
    """The arguments of :func:`fit_structured`, checked in turn: a ``ValueError`` names the
    first bad one."""
    d = potential.dim
    structure = _choice("structure", structure, STRUCTURES)
    gn_note = (
        " The generalised Gauss-Newton matrix needs the model's outputs and the likelihood's "
        "curvature in them, which a potential does not expose; use 'fisher' (positive "
        "semi-definite) or 'hessian'." if curvature == "gauss-newton" else ""
    )
    curvature = _choice("curvature", curvature, CURVATURES, gn_note)
    diagonal = _choice("diagonal", diagonal, DIAGONALS)
    complement = _choice("complement", complement, COMPLEMENTS)
    k = 0
    if structure == "low-rank":
        if d < 2:
            raise ValueError(f"structure='low-rank' needs d ≥ 2 parameters; this model has {d}.")
        k = _int_arg("rank", rank, 1, d - 1, f" (the model has d={d} parameters)")
        oversample = _int_arg("oversample", oversample, 0)
        ritz_tol = _positive("ritz_tol", ritz_tol)
    num_probes = _int_arg("num_probes", num_probes, 1)
    block_size = _int_arg("block_size", block_size, 1)
    max_iterations = _int_arg("max_iterations", max_iterations, 0)
    memory_size = _int_arg("memory_size", memory_size, 1)
    chunk_count(potential.num_data, chunk_size)
    floor = _positive("curvature_floor", curvature_floor, 1.0)
    gtol = _positive("gtol", gtol)
    learning_rate = _positive("learning_rate", learning_rate)
    num_epochs = float(num_epochs)
    if not (num_epochs >= 0 and math.isfinite(num_epochs)):
        raise ValueError(f"num_epochs must be a finite number ≥ 0, got {num_epochs!r}.")
    theta = potential.init_theta if init_theta is None else jnp.asarray(init_theta)
    if theta.shape != (d,):
        raise ValueError(f"init_theta must have shape ({d},), got {tuple(theta.shape)}.")
    return StructuredArguments(
        structure=structure, rank=k, curvature=curvature, diagonal=diagonal,
        complement=complement, oversample=oversample, ritz_tol=ritz_tol,
        num_probes=num_probes, block_size=block_size, max_iterations=max_iterations,
        memory_size=memory_size, chunk_size=int(chunk_size), curvature_floor=floor,
        gtol=gtol, learning_rate=learning_rate, num_epochs=num_epochs,
        init_theta=theta.astype(potential.init_theta.dtype),
    )
