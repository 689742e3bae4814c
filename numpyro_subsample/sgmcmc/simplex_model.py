"""The model side of SGRLD: checks that a model's latent sites are global Dirichlet sites,
their concentrations α and the values of a draw, the totals of the step rule, and the
validation of SGRLD's numeric options."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions import Dirichlet, ExpandedDistribution, Independent

from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.plates import (
    check_plate_sizes,
    first_indices,
    in_plate,
    set_plate_indices,
)
from numpyro_subsample.core.potential import Potential

__all__ = [
    "check_positive",
    "check_simplex_model",
    "dirichlet_base",
    "draw_values",
    "reference_totals",
    "site_values",
]

_ALTERNATIVES = (
    "SGRLD samples global Dirichlet sites only; for other continuous sites use SGLD, SGHMC or "
    "SGNHT (which also take Dirichlet sites, through NumPyro's stick-breaking transform) or "
    "EnergyConservingHMC."
)


def reference_totals(alpha: dict) -> dict:
    """S_r of the step rule for every simplex row r of every site (broadcast along the row):
    Σα_r − 1 when Σα_r ≥ 2 (1/(Σα_r − 1) = E[1/S] under S ~ Gamma(Σα_r, 1), the law the total
    S = Σθ relaxes to), else that law's 10 % quantile."""
    from scipy.stats import gamma

    out = {}
    for k, a in alpha.items():
        tot = np.sum(np.asarray(a, np.float64), -1, keepdims=True)
        ref = np.where(tot >= 2.0, tot - 1.0, gamma.ppf(0.1, np.minimum(tot, 2.0)))
        out[k] = np.broadcast_to(ref, np.shape(a))
    return out


def dirichlet_base(fn: Any) -> Dirichlet | None:
    """The Dirichlet under ``expand``/``to_event`` wrappers (plates expand), or None."""
    while isinstance(fn, (ExpandedDistribution, Independent)):
        fn = fn.base_dist
    return fn if type(fn) is Dirichlet else None


def _distribution_name(fn: Any) -> str:
    while isinstance(fn, (ExpandedDistribution, Independent)):
        fn = fn.base_dist
    return type(fn).__name__


def check_simplex_model(model: Callable, data: ModelData) -> None:
    """Raise ``ValueError`` naming the site unless every latent site is a Dirichlet outside
    the subsample plate and every observed site lies inside it (abstract trace: no compile)."""
    holder: dict = {}

    def run(data):
        args, kwargs = data.args_kwargs()
        with check_plate_sizes(), first_indices():
            holder["tr"] = handlers.trace(
                handlers.seed(model, jnp.zeros(2, jnp.uint32))
            ).get_trace(*args, **kwargs)
        return jnp.zeros(())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jax.eval_shape(run, data)
    tr = holder["tr"]
    subsampled = {name for name, s in tr.items() if s["type"] == "plate"
                  and s["args"][1] is not None and s["args"][0] > s["args"][1]}
    for name, site in tr.items():
        if site["type"] != "sample":
            continue
        inside = [f.name for f in site["cond_indep_stack"] if f.name in subsampled]
        if site["is_observed"]:
            if subsampled and not inside:
                raise ValueError(
                    f"Observed site '{name}' lies outside the subsample plate; SGRLD takes the "
                    "likelihood from the sites inside the plate only. Move it into the plate."
                )
            continue
        if inside and site["infer"].get("enumerate") == "parallel":
            continue  # a discrete per-datum site, summed out of each datum's likelihood
        if inside and not site["fn"].support.is_discrete:
            continue  # a local site, drawn for each subsample (estimators.local)
        if dirichlet_base(site["fn"]) is None:
            raise ValueError(
                f"Latent site '{name}' has distribution {_distribution_name(site['fn'])}. "
                + _ALTERNATIVES
            )
        if inside:
            raise ValueError(
                f"Dirichlet site '{name}' lies inside the subsample plate '{inside[0]}'; SGRLD "
                "samples global Dirichlet sites (outside the plate) only."
            )


@partial(jax.jit, static_argnums=0)
def site_values(potential: Potential, pi: dict, data: ModelData) -> tuple[dict, dict]:
    """(α of every Dirichlet site broadcast to its shape, the draw's values: π and the
    deterministic sites outside the plate) for simplex values ``pi``."""
    args, kwargs = data.args_kwargs()
    fn = set_plate_indices(potential.model, name=potential.plate.name, indices=jnp.arange(1))
    fn = handlers.substitute(handlers.seed(fn, jnp.zeros(2, jnp.uint32)), data=pi)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = handlers.trace(fn).get_trace(*args, **kwargs)
    alpha = {name: jnp.broadcast_to(dirichlet_base(tr[name]["fn"]).concentration,
                                    jnp.shape(tr[name]["value"]))
             for name in potential.latent_sites}
    values = {name: s["value"] for name, s in tr.items()
              if name in potential.latent_sites
              or (s["type"] == "deterministic" and not in_plate(s, potential.plate.name))}
    return alpha, values


@partial(jax.jit, static_argnums=0)
def draw_values(potential: Potential, pi: dict, data: ModelData) -> dict:
    """The values of a draw: the simplex values ``pi`` and the deterministic sites outside
    the plate."""
    return site_values(potential, pi, data)[1]


def check_positive(name: str, value: Any, *, none: bool = False, zero: bool = False) -> None:
    """Raise ``ValueError`` naming SGRLD's option ``name`` unless ``value`` is a positive
    (``zero``: non-negative) finite number (``none``: or None)."""
    if value is None and none:
        return
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not np.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ValueError(f"SGRLD: {name} must be a {'non-negative' if zero else 'positive'} "
                         f"number{' or None' if none else ''}, got {value!r}.")
