"""The option records of :class:`~numpyro_subsample.ecs.kernel.EnergyConservingHMC`, and the
keywords they replace.

:class:`HMCOptions` holds NumPyro's HMC/NUTS options, :class:`LikelihoodOptions` the orders and
draws of the likelihood proxy, :class:`PreferentialOptions` the weights of the preferential
selection; each validates its fields when built. :func:`legacy_ecs_records` turns the keywords
of the previous release (``algo=``, ``taylor_order=``, ``uniform_mix=``, ...) into these
records, with a ``DeprecationWarning`` naming the new spelling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from numpyro_subsample.core.options import OptionTypeError, check_options, warn_deprecated

__all__ = ["HMCOptions", "LikelihoodOptions", "PreferentialOptions", "legacy_ecs_records",
           "numpyro_hmc_options"]


@dataclass(frozen=True, kw_only=True)
class HMCOptions:
    """NumPyro's HMC/NUTS options of the energy-conserving kernel's global moves.

    Parameters
    ----------
    algo
        ``"NUTS"`` (default) or ``"HMC"``.
    step_size
        The initial step size (default 1.0).
    adapt_step_size, adapt_mass_matrix, dense_mass
        Step-size and mass-matrix adaptation during warm-up (default on, on, diagonal).
    target_accept_prob
        Target acceptance probability of the step-size adaptation (default 0.8).
    max_tree_depth
        Maximum depth of the NUTS tree (default 10).
    trajectory_length, num_steps
        The HMC trajectory (``algo="HMC"``; default: length 2π).

    References
    ----------
    Hoffman and Gelman (2014) (NUTS, dual averaging); Neal (2011) (HMC).
    """

    algo: str = "NUTS"
    step_size: float = 1.0
    adapt_step_size: bool = True
    adapt_mass_matrix: bool = True
    dense_mass: bool = False
    target_accept_prob: float = 0.8
    max_tree_depth: int = 10
    trajectory_length: float | None = None
    num_steps: int | None = None

    def __post_init__(self) -> None:
        check_options("HMCOptions", **_fields(self))


@dataclass(frozen=True, kw_only=True)
class LikelihoodOptions:
    """The orders and Monte Carlo draws of the likelihood proxy q_i ≈ ℓ_i.

    Parameters
    ----------
    taylor_order
        1 or 2 for the Taylor proxy; None (default) is 2 with a dense posterior proxy and 1
        with a structured one.
    hybrid_order
        1 or 2 (default) for the hybrid proxy.
    num_mc_draws
        S, draws of q for the variational and hybrid proxies (default 64; at least 2·dim for
        ``hybrid_order=2``).

    References
    ----------
    Dang, Quiroz, Kohn, Tran and Villani (2019) (Taylor proxies); Rønning and Hamelryck
    (2021), Eq. 2-4 (variational and hybrid proxies).
    """

    taylor_order: int | None = None
    hybrid_order: int = 2
    num_mc_draws: int | None = None

    def __post_init__(self) -> None:
        check_options("LikelihoodOptions", **_fields(self))


@dataclass(frozen=True, kw_only=True)
class PreferentialOptions:
    """The weights of the preferential (Hansen-Hurwitz) selection of the subsample.

    Parameters
    ----------
    uniform_mix
        The share of the uniform law mixed into p_i (default 0.05; every p_i > 0).
    num_draws
        Proxy draws that the scale of the proxy error is averaged over (default 16).

    References
    ----------
    Hansen and Hurwitz (1943) (sampling with unequal probabilities); Putcha, Nemeth and
    Fearnhead (2023) (preferential subsampling).
    """

    uniform_mix: float = 0.05
    num_draws: int = 16

    def __post_init__(self) -> None:
        check_options("PreferentialOptions", **_fields(self))


def numpyro_hmc_options(hmc: HMCOptions) -> dict:
    """The keyword arguments of NumPyro's HMC ``init_kernel`` (the trajectory for
    ``algo="HMC"`` only, of length 2π unless given)."""
    options = dict(
        step_size=float(hmc.step_size), adapt_step_size=bool(hmc.adapt_step_size),
        adapt_mass_matrix=bool(hmc.adapt_mass_matrix), dense_mass=bool(hmc.dense_mass),
        target_accept_prob=float(hmc.target_accept_prob), max_tree_depth=hmc.max_tree_depth,
    )
    if hmc.algo == "HMC":
        length = hmc.trajectory_length
        if length is None and hmc.num_steps is None:
            length = 2 * np.pi
        options.update(trajectory_length=length, num_steps=hmc.num_steps)
    return options


def _fields(record: Any) -> dict[str, Any]:
    return dict(vars(record))


#: old keyword → (record keyword, record class, field)
LEGACY_ECS_KEYWORDS: dict[str, tuple[str, type, str]] = {
    **{k: ("hmc", HMCOptions, k) for k in (
        "algo", "step_size", "adapt_step_size", "adapt_mass_matrix", "dense_mass",
        "target_accept_prob", "max_tree_depth", "trajectory_length", "num_steps")},
    **{k: ("likelihood", LikelihoodOptions, k) for k in (
        "taylor_order", "hybrid_order", "num_mc_draws")},
    "uniform_mix": ("preferential", PreferentialOptions, "uniform_mix"),
    "num_selection_draws": ("preferential", PreferentialOptions, "num_draws"),
}


def legacy_ecs_records(label: str, kwargs: dict[str, Any], **records: Any) -> dict[str, Any]:
    """The records ``records`` (keyword → record or None), with the old keywords ``kwargs``
    folded in, each group with one ``DeprecationWarning`` naming the new spelling; each
    record checked to be of its class.

    Raises
    ------
    TypeError
        An old keyword given together with its record, or an unknown keyword.
    OptionTypeError
        A record of the wrong class.
    """
    unknown = sorted(set(kwargs) - set(LEGACY_ECS_KEYWORDS))
    if unknown:
        raise TypeError(f"{label} got unknown keyword argument(s) {unknown}.")
    out = dict(records)
    classes = {name: cls for name, cls, _ in LEGACY_ECS_KEYWORDS.values()}
    for name, value in records.items():
        given = {k: v for k, v in kwargs.items() if LEGACY_ECS_KEYWORDS[k][0] == name}
        cls = classes[name]
        if given:
            if value is not None:
                raise TypeError(
                    f"{label}: pass {name}= alone, not with {', '.join(given)} (its fields)."
                )
            fields = {LEGACY_ECS_KEYWORDS[k][2]: v for k, v in given.items()}
            args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
            warn_deprecated(label, list(given), f"{name}={cls.__name__}({args})")
            value = cls(**fields)
        if value is not None and not isinstance(value, cls):
            raise OptionTypeError(
                f"{label}: {name} must be {cls.__name__}(...) or None, got {value!r} (type "
                f"{type(value).__name__}). Pass e.g. {name}={cls.__name__}(...)."
            )
        out[name] = value if value is not None else cls()
    return out
