"""Names of the coordinates of the flat unconstrained vector θ (``site[i, j]``)."""

from __future__ import annotations

import jax
import numpy as np

from numpyro_subsample.core.potential import Potential

__all__ = ["coordinate_names", "site_label"]


def site_label(name: str, shape: tuple[int, ...], flat_index: int) -> str:
    """``name`` or ``name[i, j]`` for entry ``flat_index`` of an array of ``shape``."""
    if not shape:
        return name
    idx = np.unravel_index(int(flat_index), shape)
    return f"{name}[{', '.join(str(int(i)) for i in idx)}]"


def coordinate_names(potential: Potential) -> list[str]:
    """The label of each coordinate of θ, in the order of ``potential.unravel``."""
    layout = jax.eval_shape(potential.unravel, potential.init_theta)
    names: list[str] = []
    for name in sorted(layout):  # ravel_pytree flattens a dict in sorted key order
        shape = tuple(layout[name].shape)
        names += [site_label(name, shape, i) for i in range(int(np.prod(shape, dtype=int)))]
    if len(names) != potential.dim:
        raise RuntimeError(f"{len(names)} coordinate names for θ of dimension {potential.dim}.")
    return names
