"""The option records of the stochastic-gradient kernels, and the keywords they replace.

:class:`ZVOptions`, :class:`AdaptationOptions` and :class:`NoiseOptions` group options that
act together (with :class:`~numpyro_subsample.estimators.local.LocalConfig` for local latent
sites); each validates its fields when built. :func:`legacy_records` turns the keywords of the
previous release (``zv_stream=``, ``adapt_proxy=``, ``local_steps=``, ...) into these records,
with a ``DeprecationWarning`` naming the new spelling.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from numpyro_subsample.core.options import OptionTypeError, check_options, warn_deprecated
from numpyro_subsample.estimators.local import DEFAULT_LOCAL_STEPS, LocalConfig

__all__ = ["AdaptationOptions", "NoiseOptions", "StepSchedule", "StrataOptions", "ZVOptions",
           "check_record", "legacy_records"]


@dataclass(frozen=True, kw_only=True)
class ZVOptions:
    """Accumulate the zero-variance statistics of the post-warmup draws in the sampling loop;
    read them with :func:`~numpyro_subsample.post.zv.zv_mean`.

    Parameters
    ----------
    degree
        Polynomial degree of the control variates, 1 (default) or 2 (refused above
        :data:`~numpyro_subsample.sgmcmc.preprocess.MAX_ZV_DEGREE2_DIM` parameters).
    covariates
        The degree-1 covariates: ``"auto"`` (default), ``"gradient"`` or ``"linearised"``
        (:mod:`numpyro_subsample.estimators.zv`).
    fn
        The functions of the constrained sample whose means are estimated (default: each
        coordinate and its square).

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Sect. 4 (zero-variance control variates for
    SG-MCMC); Mira, Solgi and Imparato (2013).
    """

    degree: int = 1
    covariates: str = "auto"
    fn: Callable | None = None

    def __post_init__(self) -> None:
        check_options("ZVOptions", degree=self.degree, covariates=self.covariates, fn=self.fn)


@dataclass(frozen=True, kw_only=True)
class AdaptationOptions:
    """What warm-up adapts before sampling. None (the default of each) lets the kernel
    decide, as described per field.

    Parameters
    ----------
    preconditioner
        Adapt a diagonal scale of the (whitened) coordinates during warm-up, then freeze it
        (:mod:`~numpyro_subsample.sgmcmc.adaptation`; ``num_warmup`` ≥ ``MIN_ADAPT_WARMUP``):
        for posteriors that no Gaussian proxy whitens. The default ``step_size`` is then
        :func:`~numpyro_subsample.sgmcmc.adaptation.adaptive_step_size`, no noise is measured
        and the noise correction is off. None: on with a structured proxy, with
        ``preconditioning=False`` and no ``step_size`` (with ``estimator="uniform"`` no
        proxy), and with local latent sites and no ``step_size``.
    proxy
        Re-estimate the proxy's centre and covariance from pilot chains in windows of growing
        length before sampling (:mod:`~numpyro_subsample.sgmcmc.warmup`,
        ``docs/adapted_proxy.md``), starting from the variational fit where the Laplace
        Hessian is not positive definite, and measure the step rule's curvature over the
        pilot's draws. None: on for a dense proxy that the kernel fits.
    centring
        Sample the model's centred Gaussian group effects (latent Normal sites outside the
        subsample plate whose scale is another latent site) partially centred per group,
        with weights from the adapted proxy (:mod:`~numpyro_subsample.sgmcmc.centring`): one
        more preprocessing, on the reparameterised model. A model written
        ``reparam(model, {site: LocScaleReparam(c)})`` is preprocessed in its centred form
        first. The draws hold the model's sites and each such site's
        ``<site>_partially_centred``. None: on where the proxy is adapted and such a site has
        weights below 0.99, or the user reparameterised it.

    References
    ----------
    Stan Development Team, Stan Reference Manual, "HMC algorithm parameters" (windowed
    adaptation); Andrieu and Thoms (2008) (adaptive MCMC); Papaspiliopoulos, Roberts and
    Sköld (2007) and Gorinova, Moore and Hoffman (2020, Sect. 3) (partial centring).
    """

    preconditioner: bool | None = None
    proxy: bool | None = None
    centring: bool | None = None

    def __post_init__(self) -> None:
        check_options("AdaptationOptions", preconditioner=self.preconditioner, proxy=self.proxy,
                      centring=self.centring)


@dataclass(frozen=True, kw_only=True)
class NoiseOptions:
    """How the measured gradient noise sets the dynamics.

    Parameters
    ----------
    correction
        Inject N(0, 2ch I − h²V) instead of N(0, 2ch I), V the estimator's whitened noise
        covariance measured at proxy draws, c the diffusion coefficient: a larger default
        step for the same variance inflation. None (default): on where V is a fixed d × d
        matrix (not for ``"saga"``, ``"svrg"``, a structured proxy or the adapted
        preconditioner, where True raises); needs preconditioning.
    max_variance_inflation
        δ of the default step-size rule: the stationary variance of a Gaussian target is
        inflated by at most δ (default 0.05; :mod:`~numpyro_subsample.sgmcmc.stepsize`).

    References
    ----------
    Ahn, Korattikara and Welling (2012); Chen, Fox and Guestrin (2014), Eq. 9 (the
    correction).
    """

    correction: bool | None = None
    max_variance_inflation: float = 0.05

    def __post_init__(self) -> None:
        check_options("NoiseOptions", correction=self.correction,
                      max_variance_inflation=self.max_variance_inflation)


@dataclass(frozen=True, kw_only=True)
class StepSchedule:
    """SGRLD's step schedule ε_t = a (1 + t/b)^(−c), t the iteration (warm-up included).

    Parameters
    ----------
    kind
        ``"constant"`` (default; ε_t = a) or ``"polynomial"`` (Patterson and Teh's decaying
        ε_t, which lowers the step's bias and slows the mixing by the same factor).
    decay_offset
        b of the polynomial schedule (default 1000).
    decay_power
        c of the polynomial schedule (default 0.55; in (0.5, 1] as Σε_t = ∞, Σε_t² < ∞ ask).

    References
    ----------
    Patterson and Teh (2013), Sect. 4; Welling and Teh (2011), Eq. 2 (the conditions on ε_t).
    """

    kind: str = "constant"
    decay_offset: float = 1000.0
    decay_power: float = 0.55

    def __post_init__(self) -> None:
        if self.kind not in ("polynomial", "constant"):
            raise ValueError(f"StepSchedule: kind must be 'polynomial' or 'constant', got "
                             f"{self.kind!r}.")
        for name in ("decay_offset", "decay_power"):
            v = getattr(self, name)
            ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and v == v
            if not ok or v < 0 or (v == 0 and name == "decay_offset") or v == float("inf"):
                raise ValueError(f"StepSchedule: {name} must be a positive number, got {v!r}.")


@dataclass(frozen=True, kw_only=True)
class StrataOptions:
    """The strata of SGRLD's ``estimator="stratified"`` (and of ``"auto"``'s stratified
    candidate): k-means clusters of per-datum features (Fu and Zhang 2023, Sect. 3).

    Parameters
    ----------
    num_strata
        k (default 10).
    features
        An (N, p) array to cluster; default: the per-datum θ ⊙ ∇_θ log p(x_i | π̄) at the
        prior mean π̄ (one data pass, N × d numbers; pass smaller features, e.g. per-document
        word frequencies, when d is large). Needed with local latent sites.
    kmeans_iters
        Lloyd iterations (default 5).
    seed
        Seed of the k-means (default 0).

    References
    ----------
    Fu and Zhang (2023), Sect. 3-4 (CPSG-MCMC), Eq. 10 and 14.
    """

    num_strata: int = 10
    features: Any = None
    kmeans_iters: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_strata", "kmeans_iters"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
                raise ValueError(f"StrataOptions: {name} must be a positive integer, got "
                                 f"{v!r}.")
        if not isinstance(self.seed, numbers.Integral) or isinstance(self.seed, bool):
            raise ValueError(f"StrataOptions: seed must be an integer, got {self.seed!r}.")


#: old keyword → (its record keyword, the record's field); ``zv_stream`` switches ZV on.
LEGACY_KEYWORDS: dict[str, tuple[str, str]] = {
    "zv_stream": ("zv", ""),
    "zv_degree": ("zv", "degree"),
    "zv_covariates": ("zv", "covariates"),
    "zv_fn": ("zv", "fn"),
    "adapt_preconditioner": ("adaptation", "preconditioner"),
    "adapt_proxy": ("adaptation", "proxy"),
    "noise_correction": ("noise", "correction"),
    "max_variance_inflation": ("noise", "max_variance_inflation"),
    "local_update": ("local", "update"),
    "local_steps": ("local", "steps"),
    "decay_offset": ("schedule", "decay_offset"),
    "decay_power": ("schedule", "decay_power"),
    "num_strata": ("strata", "num_strata"),
    "features": ("strata", "features"),
    "kmeans_iters": ("strata", "kmeans_iters"),
    "strata_seed": ("strata", "seed"),
}

_RECORDS: dict[str, type] = {"zv": ZVOptions, "adaptation": AdaptationOptions,
                             "noise": NoiseOptions, "local": LocalConfig,
                             "schedule": StepSchedule, "strata": StrataOptions}


def check_record(label: str, name: str, value: Any) -> None:
    """Raise :class:`~numpyro_subsample.core.options.OptionTypeError` unless ``value`` is
    None or the record class of the kernel keyword ``name``."""
    cls = _RECORDS[name]
    if value is not None and not isinstance(value, cls):
        raise OptionTypeError(
            f"{label}: {name} must be {cls.__name__}(...) or None, got {value!r} (type "
            f"{type(value).__name__}). Pass e.g. {name}={cls.__name__}(...)."
        )
    if cls is LocalConfig and value is not None:
        check_options("LocalConfig", label=f"{label}: LocalConfig", steps=value.steps,
                      update=value.update, nodes=value.nodes)


def _new_spelling(name: str, given: dict[str, Any]) -> str:
    """``zv=ZVOptions(degree=2)`` for the old keywords ``given`` of record keyword ``name``."""
    cls = _RECORDS[name]
    args = ", ".join(f"{LEGACY_KEYWORDS[k][1]}={v!r}" for k, v in given.items()
                     if LEGACY_KEYWORDS[k][1])
    if name == "zv" and not given.get("zv_stream", False):
        return "zv=None (the default)"
    return f"{name}={cls.__name__}({args})"


def legacy_records(label: str, kwargs: dict[str, Any], **records: Any) -> dict[str, Any]:
    """The records ``records`` (keyword → record or None), with the old keywords found in
    ``kwargs`` (removed from it) folded in, each group with one ``DeprecationWarning`` naming
    the new spelling.

    Raises
    ------
    TypeError
        An old keyword given together with its record.
    """
    out = dict(records)
    for name in records:
        given = {k: kwargs.pop(k) for k in list(kwargs)
                 if k in LEGACY_KEYWORDS and LEGACY_KEYWORDS[k][0] == name}
        if not given:
            continue
        if records[name] is not None:
            raise TypeError(
                f"{label}: pass {name}= alone, not with {', '.join(given)} (its fields)."
            )
        warn_deprecated(label, list(given), _new_spelling(name, given))
        values = {LEGACY_KEYWORDS[k][1]: v for k, v in given.items() if LEGACY_KEYWORDS[k][1]}
        if name == "zv":
            out[name] = ZVOptions(**values) if given.get("zv_stream", False) else None
            if out[name] is None:  # still validated, as before
                ZVOptions(**values)
        elif name == "local":
            out[name] = LocalConfig(steps=values.get("steps", DEFAULT_LOCAL_STEPS),
                                    update=values.get("update"))
        else:
            out[name] = _RECORDS[name](**values)
    return out

