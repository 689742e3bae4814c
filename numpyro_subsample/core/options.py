"""Every user option of the package's kernels and estimators, declared in one place.

:data:`OPTIONS` maps an owner (a kernel class, ``"estimator='<name>'"`` for the options of a
named estimator configuration, ``"adaptive=True"`` for the adaptive subsample size) to its
options, each an :class:`Option`: accepted type, range or choices, meaning and remedy.
:func:`check_options` validates values against it before any expensive work and raises

- :class:`OptionTypeError` (a ``TypeError``, and a ``ValueError``) for a value of the wrong
  type,
- ``ValueError`` for a value out of range, not among the choices, or an unknown option name
  (listing the valid ones),

with a message naming the owner, the option, the value seen, what the option means and what
to pass instead. Checks that need the data (N, the subsample size) are made where the data are
known, before the proxy fit.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from numpyro_subsample.core.validation import Option, OptionTypeError, check_values, requirement

__all__ = ["OPTIONS", "Option", "OptionTypeError", "check_options", "did_you_mean",
           "keyword_params", "requirement", "suggest_keywords", "user_stacklevel",
           "warn_deprecated"]


def did_you_mean(unknown: Sequence[str], candidates: Sequence[str]) -> str:
    """"'x': did you mean y?" for each unknown name with close matches (difflib) among
    ``candidates``, or ""."""
    hints = []
    for u in unknown:
        close = difflib.get_close_matches(u, list(dict.fromkeys(candidates)), n=2, cutoff=0.7)
        if close:
            hints.append(f"{u!r}: did you mean {' or '.join(close)}?")
    return " ".join(hints)


def suggest_keywords(init: Callable | None = None, *, deprecated: Sequence[str] = ()
                     ) -> Callable:
    """Decorate a kernel's ``__init__`` whose signature is closed: an unknown keyword raises a
    ``TypeError`` naming the class, the close matches and the valid keywords, where Python
    would say only "unexpected keyword argument". The keywords ``deprecated`` (of an earlier
    release, which ``__init__`` takes in its ``**kwargs``) are let through."""
    if init is None:
        return functools.partial(suggest_keywords, deprecated=deprecated)
    params = inspect.signature(init).parameters
    valid = [k for k, p in params.items() if k not in ("self", "model")
             and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]

    @functools.wraps(init)
    def checked(self, *args: Any, **kwargs: Any) -> None:
        unknown = [k for k in kwargs if k not in params and k not in deprecated]
        if unknown:
            guess = did_you_mean(unknown, valid)
            raise TypeError(
                f"{type(self).__name__} got unknown keyword argument(s) {unknown}"
                + (f": {guess}" if guess else ".") + f" Valid: {', '.join(valid)}."
            )
        init(self, *args, **kwargs)

    return checked


def keyword_params(cls: type, base: type) -> tuple[str, ...]:
    """The keyword arguments of the ``__init__`` of ``cls`` and of its bases up to ``base``
    (``cls.__mro__`` order, each once; ``self`` and ``model`` left out): the valid keywords a
    misspelt option is matched against."""
    names: list[str] = []
    for c in cls.__mro__[:cls.__mro__.index(base) + 1]:
        init = c.__dict__.get("__init__")
        if init is not None:
            names += [p.name for p in inspect.signature(init).parameters.values()
                      if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                      and p.name not in ("self", "model")]
    return tuple(dict.fromkeys(names))


def user_stacklevel() -> int:
    """The stack level, for ``warnings.warn`` called by its caller, of the first frame outside
    this package: the user's call of a kernel, whichever subclasses it passed through."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(root):
        frame, level = frame.f_back, level + 1
    return level


def warn_deprecated(label: str, given: Sequence[str], new: str) -> None:
    """A ``DeprecationWarning`` at the user's call: the keywords ``given`` of ``label`` are
    replaced by ``new`` (the spelling to pass)."""
    many = len(given) > 1
    warnings.warn(
        f"{label}: the keyword{'s' if many else ''} {', '.join(given)} "
        f"{'are' if many else 'is'} deprecated; pass {new}.",
        DeprecationWarning, stacklevel=user_stacklevel(),
    )


def check_options(owner: str, /, *, label: str | None = None, **values: Any) -> None:
    """Validate ``values`` against the options of ``owner`` in :data:`OPTIONS`; messages start
    with ``label`` (default ``owner``), e.g. the user's class name.

    Raises
    ------
    OptionTypeError, ValueError
        As :func:`~numpyro_subsample.core.validation.check_values`: a value of the wrong type,
        out of range or not among the choices, or an unknown option name.
    """
    check_values(label or owner, OPTIONS[owner], values)


# -- the declarations ------------------------------------------------------------------------------
def _positive_int(meaning: str, remedy: str = "", none: bool = False, low: int = 1) -> Option:
    return Option("int", meaning, low=low, none=none, remedy=remedy)


def _flag(meaning: str) -> Option:
    return Option("bool", meaning, remedy="Pass True or False.")


_CHUNK = _positive_int("the number of data per vmapped evaluation in full-data passes",
                       "Pass e.g. chunk_size=2048 (the default).")
_SEED = Option("int", "the seed of the preprocessing (proxy fit, estimator, noise measurement)",
               remedy="Pass an integer, e.g. seed=0.")
_PROGRESS = Option("bool", "whether the preprocessing shows progress bars", none=True,
                   remedy="Pass True, False or None (follow the package's MCMC; else on, "
                   "except under CI).")
_PROXY = Option("str", "the posterior proxy N(θ̂, Σ̂)", choices=("laplace", "variational"),
                must="'laplace', 'variational' or a Proxy",
                remedy="Pass proxy='laplace' (the default), 'variational' or a fitted Proxy.")
_SG_PROXY = Option(
    "str", "the posterior proxy N(θ̂, Σ̂); 'laplace' is dense up to MAX_DENSE_DIM = 2000 "
    "parameters (numpyro_subsample.sgmcmc.kernel) and the structured 'low-rank' above; "
    "'diagonal' and 'low-rank' (rank in proxy_kwargs={'rank': k}, default 20) form no d × d "
    "array", choices=("laplace", "variational", "diagonal", "low-rank"),
    must="'laplace', 'variational', 'diagonal', 'low-rank', a Proxy or a StructuredProxy",
    remedy="Pass proxy='laplace' (the default), 'variational', 'diagonal', 'low-rank' or a "
    "fitted Proxy / StructuredProxy.")
_PROXY_KWARGS = Option("mapping", "the keyword arguments of the proxy fit", none=True,
                       remedy="Pass a dict such as {'num_steps': 500}, or None.")

_SGMCMC: dict[str, Option] = {
    "step_size": Option(
        "real", "the time step h of the diffusion in whitened coordinates (None: chosen from "
        "the measured gradient noise)", low=0, open_low=True, none=True,
        must="a positive number",
        remedy="Pass a positive number, or None for the default rule."),
    "proxy": _SG_PROXY,
    "preconditioning": _flag("whether the chain moves in coordinates whitened by the proxy"),
    "replace": _flag("whether subsample indices are drawn with replacement"),
    "proxy_kwargs": _PROXY_KWARGS,
    "chunk_size": _CHUNK,
    "bias_probe": _flag("whether the step's bias is probed by coupled runs at h and h/2 "
                         "after the step is chosen"),
    "steps_per_draw": _positive_int(
        "the steps of the dynamics per recorded draw (None: chosen by the kernel)",
        "Pass a positive integer, or None (SGLD: more than one where its own step is below "
        "its unit-curvature step).", none=True),
    "store_datum_grads": _flag("whether the N×d table of ∇f_i(θ̂) is kept"),
    "init_strategy": Option("str", "where each chain starts", choices=("proxy", "centre"),
                            remedy="Pass 'proxy' (a draw from N(θ̂, Σ̂), the default) or "
                            "'centre' (θ̂)."),
    "seed": _SEED,
    "progress_bar": _PROGRESS,
}

_ZV: dict[str, Option] = {
    "degree": Option("int", "the polynomial degree of the zero-variance control variates",
                     choices=(1, 2), remedy="Pass degree=1 or 2."),
    "covariates": Option(
        "str", "the degree-1 zero-variance covariates", choices=("auto", "gradient", "linearised"),
        remedy="Pass 'auto' (the gradient's d coordinates up to MAX_ZV_COVARIATES = 2000 "
        "parameters, else one linearised covariate per function), 'gradient' or 'linearised'."),
    "fn": Option("callable", "the function of the constrained sample whose mean the "
                 "zero-variance statistics estimate", none=True,
                 remedy="Pass a function of the sample dict, or None (every coordinate and "
                 "its square)."),
}

_ADAPTATION: dict[str, Option] = {
    "preconditioner": Option(
        "bool", "whether a diagonal scale of the coordinates is adapted during warm-up",
        none=True, remedy="Pass True, False or None (on with a structured proxy)."),
    "proxy": Option(
        "bool", "whether pilot chains re-estimate the proxy's centre and covariance in "
        "windows before sampling", none=True,
        remedy="Pass True, False or None (on for a dense proxy the kernel fits)."),
    "centring": Option(
        "bool", "whether centred Gaussian group effects are sampled partially centred",
        none=True, remedy="Pass True, False or None (on where the proxy is adapted and the "
        "model has such sites)."),
}

_NOISE: dict[str, Option] = {
    "correction": Option(
        "bool", "whether the injected noise is reduced by the estimator's own", none=True,
        remedy="Pass True, False or None (on, except for estimator='saga' and 'svrg' and with "
        "a structured proxy)."),
    "max_variance_inflation": Option(
        "real", "δ, the tolerated relative inflation of the posterior variance by the default "
        "step size", low=0, high=1, open_low=True,
        remedy="Pass e.g. 0.05 (the default)."),
}

_LOCAL: dict[str, Option] = {
    "update": Option("callable", "the conditional update of the local latent sites of a "
                     "subsample", none=True,
                     remedy="Pass a function (rng_key, rows, values, idx, *model_args, "
                     "**model_kwargs) -> rows, or None (MALA steps)."),
    "steps": _positive_int("the MALA steps per update of the local latent sites",
                           "Pass a positive integer, e.g. steps=5 (the default)."),
    "nodes": _positive_int("the Gauss-Hermite nodes of a scalar local site integrated out",
                           "Pass a positive integer, e.g. nodes=15 (the default), or 0 to draw "
                           "the site by MALA steps.", low=0),
}

_SGHMC: dict[str, Option] = {
    "friction": Option("real", "the friction α of SGHMC, or the diffusion A of SGNHT's "
                       "injected noise (whitened units)", low=0,
                       open_low=True, remedy="Pass a positive number, e.g. friction=1.0."),
}

_ECS: dict[str, Option] = {
    "proxy": replace(_PROXY, choices=("laplace", "variational", "diagonal", "low-rank"),
                     must="'laplace', 'variational', 'diagonal', 'low-rank' or a Proxy",
                     remedy="Pass proxy='laplace' (the default; low-rank above MAX_DENSE_DIM = "
                     "2000 parameters), 'variational', 'diagonal', 'low-rank' or a fitted "
                     "Proxy; the per-datum likelihood approximation is likelihood_proxy=."),
    "likelihood_proxy": Option(
        "str", "the per-datum approximation q_i ≈ ℓ_i of the difference estimator",
        choices=("taylor", "hybrid", "variational"), none=True,
        remedy="Pass 'taylor', 'hybrid', 'variational' or None (the default for the proxy)."),
    "num_blocks": _positive_int("G, the number of blocks of the subsample (one is redrawn per "
                                "iteration; the subsample size must be a multiple of it)",
                                "Pass a positive divisor of the subsample size, e.g. 10."),
    "subsample_size": _positive_int("m, the subsample size of the estimator (None: the "
                                    "model's plate subsample size)",
                                    "Pass an integer between 2 and N, or None.", none=True,
                                    low=2),
    "selection": Option("str", "the selection law of the subsample",
                        choices=("uniform", "preferential"),
                        remedy="Pass 'preferential' (the default) or 'uniform'."),
    "proxy_kwargs": _PROXY_KWARGS,
    "chunk_size": _CHUNK,
    "seed": _SEED,
    "progress_bar": _PROGRESS,
}

_HMC: dict[str, Option] = {
    "algo": Option("str", "the HMC algorithm", choices=("NUTS", "HMC"),
                   remedy="Pass 'NUTS' (the default) or 'HMC'."),
    "step_size": Option("real", "NumPyro's initial HMC step size", low=0, open_low=True,
                        remedy="Pass a positive number, e.g. 1.0 (the default)."),
    "adapt_step_size": _flag("whether NumPyro adapts the step size during warmup"),
    "adapt_mass_matrix": _flag("whether NumPyro adapts the mass matrix during warmup"),
    "dense_mass": _flag("whether the mass matrix is dense"),
    "target_accept_prob": Option("real", "the target acceptance probability of the step-size "
                                 "adaptation", low=0, high=1, open_low=True, open_high=True,
                                 remedy="Pass e.g. 0.8 (the default)."),
    "max_tree_depth": Option(("int", "ints"), "the maximum depth of the NUTS tree", low=1,
                             must="a positive integer or a pair of them",
                             remedy="Pass a positive integer, e.g. 10 (the default)."),
    "trajectory_length": Option("real", "the HMC trajectory length (algo='HMC')", low=0,
                                open_low=True, none=True,
                                remedy="Pass a positive number, or None."),
    "num_steps": _positive_int("the number of leapfrog steps per HMC iteration (algo='HMC')",
                               "Pass a positive integer, or None.", none=True),
}

_LIKELIHOOD: dict[str, Option] = {
    "taylor_order": Option("int", "the order of the Taylor likelihood proxy", choices=(1, 2),
                           none=True, remedy="Pass 1, 2 or None (2 with a dense proxy, 1 with "
                           "a structured one)."),
    "hybrid_order": Option("int", "the order of the hybrid likelihood proxy", choices=(1, 2),
                           remedy="Pass 1 or 2."),
    "num_mc_draws": _positive_int("S, the draws of q for the variational and hybrid proxies",
                                  "Pass an integer ≥ 2, or None (the default).", none=True,
                                  low=2),
}

_PREFERENTIAL_SELECTION: dict[str, Option] = {
    "uniform_mix": Option("real", "the weight of the uniform law in the preferential "
                          "selection (every p_i > 0)", low=0, high=1, open_low=True,
                          remedy="Pass e.g. 0.05 (the default)."),
    "num_draws": _positive_int("the number of proxy draws of the preferential selection",
                               "Pass e.g. 16 (the default)."),
}

_DISTRIBUTED: dict[str, Option] = {
    "num_shards": _positive_int("S, the number of data shards (one per device)",
                                "Pass a positive integer no larger than the number of "
                                "devices, or None (all devices).", none=True),
    "shard_sizes": Option("ints", "N_s, the sizes of the contiguous data shards", low=1,
                          none=True, remedy="Pass S positive integers summing to N, or None."),
    "shard_frequencies": Option("reals", "q_s, the probabilities of the shards", low=0,
                                open_low=True, none=True,
                                remedy="Pass S positive numbers summing to 1, or None."),
    "trajectory_length": _positive_int("τ, the SGLD steps per shard visit (or their mean τ̄ "
                                       "with adaptive trajectories)",
                                       "Pass a positive integer, e.g. 1 (the default)."),
    "adaptive_trajectory": _flag("whether trajectory lengths follow τ_s = τ̄ S q_s"),
    "estimator": Option("str", "the estimator within each shard", choices=("uniform", "cv"),
                        remedy="Pass 'cv' (the default) or 'uniform'."),
}

_CONFIGURE: dict[str, Option] = {
    "subsample_size": _positive_int("n, overriding the model's plate subsample size (n_max "
                                    "with adaptive=True)", "Pass an integer between 1 and N, "
                                    "or None.", none=True),
    "adaptive": _flag("whether the subsample size is chosen per step (Putcha et al. 2023, "
                      "Algorithm 2)"),
}

_PREFERENTIAL: dict[str, Option] = {
    "weights": Option("array", "the unnormalised selection weights", choices=("approx", "exact"),
                      remedy="Pass 'approx' (the default), 'exact' or an array of N positive "
                      "weights."),
    "uniform_mix": Option("real", "λ in p = (1 − λ) p_w + λ/N", low=0, high=1, none=True,
                          remedy="Pass a number in [0, 1], or None (0.05 for computed weights, "
                          "0 for an array)."),
}

_STRATIFIED: dict[str, Option] = {
    "num_strata": _positive_int("k, the number of k-means strata (at most the subsample size)",
                                "Pass a positive integer, e.g. 10 (the default)."),
    "features": Option("array", "the (N, p) array clustered into strata", none=True,
                       remedy="Pass an (N, p) array, or None (gradients at the proxy centre)."),
    "kmeans_iters": _positive_int("the number of Lloyd iterations of k-means",
                                  "Pass a positive integer, e.g. 5 (the default)."),
    "num_probes": _positive_int("the number of proxy draws of the 'cv-stratified' features",
                                "Pass a positive integer, e.g. 2 (the default)."),
    "strata_seed": Option("int", "the seed of k-means and of the probes",
                          remedy="Pass an integer, e.g. 0."),
    "draw_method": Option("str", "the within-stratum draw", choices=("auto", "loop", "sort"),
                          remedy="Pass 'auto' (the default), 'loop' or 'sort'."),
}

_ADAPTIVE: dict[str, Option] = {
    "v0": Option("real", "V0, the pseudo-variance threshold of the adaptive subsample size",
                 low=0, open_low=True, choices=("pilot", "proxy"),
                 remedy="Pass a positive number, 'pilot' (the default) or 'proxy'."),
    "lipschitz": Option("array", "the per-datum Lipschitz constants L_i",
                        choices=("auto", "autodiff"),
                        remedy="Pass 'auto' (the default), 'autodiff' or N non-negative "
                        "constants."),
    "lipschitz_radius": Option("real", "R of the Poisson bound of the Lipschitz constants",
                               low=0, open_low=True, none=True,
                               remedy="Pass a positive number, or None."),
    "n_min": _positive_int("the smallest subsample size", "Pass an integer between 1 and "
                           "n_max, or None (n_max // 64).", none=True),
    "n_max": _positive_int("the largest subsample size", "Pass an integer between 1 and N, or "
                           "None (the plate's subsample size).", none=True),
    "pilot_chains": _positive_int("the number of chains of the V0 pilot run",
                                  "Pass a positive integer, e.g. 4 (the default)."),
    "pilot_steps": _positive_int("the number of steps of the V0 pilot run",
                                 "Pass a positive integer, e.g. 200 (the default)."),
    "pilot_quantile": Option("real", "the quantile of the pilot pseudo-variances taken as V0",
                             low=0, high=1, open_low=True,
                             remedy="Pass e.g. 0.95 (the default)."),
    "max_variance_inflation": Option("real", "δ of the pilot run's step size", low=0,
                                     open_low=True, remedy="Pass e.g. 0.05 (the default)."),
}

_SVRG: dict[str, Option] = {
    "update_every": _positive_int("m, the steps between refreshes of the SVRG anchor (one data "
                                  "pass each)", "Pass a positive integer, or None (N/n, one "
                                  "epoch).", none=True),
}

#: ``{owner: {option name: Option}}``: every option the package validates.
OPTIONS: dict[str, dict[str, Option]] = {
    "SGMCMCKernel": _SGMCMC,
    "ZVOptions": _ZV,
    "AdaptationOptions": _ADAPTATION,
    "NoiseOptions": _NOISE,
    "LocalConfig": _LOCAL,
    "SGHMC": _SGHMC,
    "EnergyConservingHMC": _ECS,
    "HMCOptions": _HMC,
    "LikelihoodOptions": _LIKELIHOOD,
    "PreferentialOptions": _PREFERENTIAL_SELECTION,
    "DistributedSGLD": _DISTRIBUTED,
    "configure_estimator": _CONFIGURE,
    "estimator='uniform'": {},
    "estimator='cv'": {},
    "estimator='preferential'": _PREFERENTIAL,
    "estimator='cv-preferential'": _PREFERENTIAL,
    "estimator='stratified'": _STRATIFIED,
    "estimator='cv-stratified'": _STRATIFIED,
    "estimator='saga'": {},
    "estimator='svrg'": _SVRG,
    "adaptive=True": _ADAPTIVE,
}
