"""Variational proxy: a Gaussian q fitted by stochastic variational inference on the model.

The fitted q gives a centre (its mean) and a covariance in the flat unconstrained space of
:attr:`Potential.unravel`; :func:`fit_variational` turns them into a
:class:`~numpyro_subsample.proxies.base.Proxy` with
:func:`~numpyro_subsample.proxies.laplace.proxy_from_moments`, so the control variates, the
preconditioning and the preferential weights use it as they use the Laplace proxy. The guide
and its parameters stay in ``proxy.info`` for the variational energy-conserving proxy
(Rønning and Hamelryck 2021, Eq. 2-4; :mod:`numpyro_subsample.ecs.kernel`).

Default family (d ≤ ``max_full_rank_dim``, default 200): full-rank Gaussian
q = N(θ̂ + L0 u, L0 T Tᵀ L0ᵀ), fitted in the potential's space
(:func:`~numpyro_subsample.proxies.svi.fit_gaussian_cv`), returned also as the parameters of
an ``AutoMultivariateNormal`` of the model.

1. Start: the mode θ̂ by Adam on minibatches and damped full-data Newton steps (as the
   Laplace fit), and the whitening L0 = chol((∇²f(θ̂))⁻¹); u, T start at 0, I: q starts at
   the Laplace approximation. Where ∇²f(θ̂) is not positive definite, L0 is diagonal from its
   clipped diagonal.
2. ELBO: with t_i the second-order Taylor expansion of f_i at θ̂, the minibatch estimate of
   E_q[f] is E_q[Σ_i t_i] (exact: a quadratic) + f0 + (N/n) Σ_{i∈S} (f_i − t_i) at guide
   draws, unbiased, its variance that of the remainder only (the control variates of Baker
   et al. 2019, Eq. 5, to second order). Adam in the whitened coordinates (u, log diag T,
   strict lower T).
3. Convergence: blocks of ``block_size`` steps; each block's smoothed ELBO is the mean of its
   per-step estimates, with its standard error se. A block improves if it exceeds the best so
   far by max(``tol``, 2 se) (``tol`` default 0.01·d nats); after ``patience`` blocks without
   improvement the learning rate is divided by 4, and after ``num_decays`` such reductions
   SVI stops (``info["converged"] = True``), or at ``max_steps``. The result is the iterate
   average over the last block; ``info`` holds ``svi_steps``, ``elbo_trace``, ``elbo_se`` and
   ``elbo_trend`` (slope over the last ``patience`` + 1 blocks, nats per 1000 steps).

Beyond ``max_full_rank_dim``, or with the user's ``guide=`` (any NumPyro guide), NumPyro's SVI
fits the guide (``AutoLowRankMultivariateNormal``, rank ≈ √d, by default) on the model's
subsampled ELBO, with the same plateau rule on an ELBO estimated with common random numbers
(:mod:`~numpyro_subsample.proxies.svi`); with fitted ``guide_params=`` SVI is skipped.

Checks (:mod:`~numpyro_subsample.proxies.fit_checks`): a fit that stopped at ``max_steps``,
a Gaussian q whose mean or variances break the Stein identities of the posterior at 32
antithetic guide draws (E_q[∇f] = 0, diag E_q[∇²f] = diag Σ⁻¹), whose importance weights p/q
at 300 draws have a Pareto k̂ above 0.7 (q far from the posterior), from which short
full-data MALA chains move away (the check that sees a guide collapsed into a funnel's neck),
a mean at a support's boundary, or non-finite SVI steps warn by site with a remedy.

Ordering. An ``AutoContinuous`` guide flattens the latent sites in model order, ``Potential``
by name; the guide's moments are permuted by the map read off ``guide._unpack_latent``
(:mod:`~numpyro_subsample.proxies.guides`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.data import device_array
from numpyro_subsample.core.datapass import DEFAULT_CHUNK, value_grad_hessian
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.chain_check import runs_chain_check
from numpyro_subsample.proxies.checks import warn_proxy
from numpyro_subsample.proxies.fit_checks import check_passes, fit_messages
from numpyro_subsample.proxies.guides import (
    MAX_FULL_RANK_DIM,
    _cached_default_guide,
    _cached_mean_field_guide,
    _guide_permutation,
    _setup_guide,
    autoguide_params,
    default_guide,
    gaussian_sampler,
    guide_moments,
    guide_order,
)
from numpyro_subsample.proxies.laplace import proxy_from_moments
from numpyro_subsample.proxies.svi import (
    _fit_svi,
    expansion_start,
    fit_gaussian_cv,
    minibatch_mode,
)

__all__ = ["fit_variational", "default_guide", "guide_moments", "mean_field", "MeanField",
           "MAX_FULL_RANK_DIM"]

#: default rule of the full-rank family (precise ELBO estimates, Adam in whitened coordinates)
FULL_RANK_RULE = {"learning_rate": 0.005, "block_size": 100, "patience": 5, "num_decays": 2}
#: default rule of NumPyro's SVI (raw coordinates, noisier ELBO)
NUMPYRO_RULE = {"learning_rate": 0.02, "block_size": 250, "patience": 2, "num_decays": 3}


class MeanField(NamedTuple):
    """A mean-field Gaussian fit (:func:`mean_field`) in the potential's flat space."""

    mean: np.ndarray
    sd: np.ndarray
    passes: float
    info: dict


def mean_field(potential: Potential, data: ModelData, rng_key: jax.Array, *,
               init: np.ndarray | None = None, max_steps: int = 5000,
               progress: bool = False) -> MeanField:
    """The mean-field Gaussian q = N(m, diag(s²)) of the posterior, fitted by NumPyro's SVI
    (``AutoDiagonalNormal``) on the model's subsampled ELBO under the plateau rule of
    :data:`NUMPYRO_RULE` (tol 0.01·d nats), from ``init`` (the potential's flat space; default
    its start), in at most ``max_steps`` steps. O(d) memory: no covariance is formed.

    Unlike the joint mode, which a centred hierarchical model's group scale shrinks towards 0
    (Papaspiliopoulos, Roberts and Sköld 2007), the ELBO averages over the group effects, so
    m puts a group scale near its posterior mass (Blei, Kucukelbir and McAuliffe 2017,
    on the mean-field family; its variances are too small where the posterior is
    correlated). ``passes`` counts the SVI steps and the ELBO evaluations of the rule.
    """
    guide = _cached_mean_field_guide(potential)
    k_setup, k_fit = jax.random.split(rng_key)
    _setup_guide(guide, k_setup, data)
    init = np.asarray(potential.init_theta if init is None else init)
    rule = dict(NUMPYRO_RULE, max_steps=int(max_steps), tol=0.01 * potential.dim,
                progress=progress)
    params, info = _fit_svi(potential.model, guide, data, k_fit,
                            init_loc=init[guide_order(potential)], num_eval_particles=32,
                            **rule)
    perm = _guide_permutation(potential, guide)
    mean = np.asarray(params[f"{guide.prefix}_loc"], np.float64)[perm]
    sd = np.asarray(params[f"{guide.prefix}_scale"], np.float64)[perm]
    evaluations = info["svi_steps"] + info["crn_evaluations"]
    passes = evaluations * potential.plate.subsample_size / potential.num_data
    return MeanField(mean=mean, sd=sd, passes=float(passes),
                     info={"svi_steps": info["svi_steps"], "converged": info["converged"]})


class Fitted(NamedTuple):
    """A fitted q: moments in the potential's flat space, the guide, its parameters."""

    mean: jax.Array
    cov: jax.Array
    gaussian: bool
    sample: Callable[[jax.Array, int], jax.Array]
    guide: Callable
    params: dict
    info: dict
    passes: float


def _check_settings(block_size, max_steps, patience, num_decays, num_eval_particles,
                    learning_rate, tol, num_particles):
    for name, value in (("block_size", block_size), ("max_steps", max_steps),
                        ("patience", patience), ("num_eval_particles", num_eval_particles),
                        ("num_particles", num_particles)):
        if not (isinstance(value, (int, np.integer)) and value >= 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if not (isinstance(num_decays, (int, np.integer)) and num_decays >= 0):
        raise ValueError(f"num_decays must be a non-negative integer, got {num_decays!r}.")
    if not (isinstance(learning_rate, (int, float)) and np.isfinite(learning_rate)
            and learning_rate > 0):
        raise ValueError(
            f"learning_rate must be a positive number, got {learning_rate!r}; the defaults are "
            f"{FULL_RANK_RULE['learning_rate']} (full rank) and {NUMPYRO_RULE['learning_rate']} "
            "(NumPyro's SVI)."
        )
    if tol is not None and not (isinstance(tol, (int, float)) and tol >= 0):
        raise ValueError(f"tol must be a non-negative number of nats or None, got {tol!r}.")


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def _mean_hessian(potential: Potential, thetas: jax.Array, data: ModelData, chunk_size: int):
    """The full-data Hessian of f averaged over the rows of ``thetas`` (one pass each)."""
    hess = jax.lax.map(lambda t: value_grad_hessian(potential, t, data, chunk_size)[2], thetas)
    return hess.mean(0)


def _check_request(potential, guide, guide_params, covariance, max_full_rank_dim) -> None:
    if potential.enumerated_sites:
        raise ValueError(
            "The variational proxy does not support sites marked for enumeration "
            f"({', '.join(repr(s) for s in potential.enumerated_sites)}): NumPyro's SVI would "
            "need funsor and TraceEnum_ELBO to sum them out. Use proxy='laplace' (the "
            "default), which fits the potential with those sites summed out."
        )
    if potential.integrated:
        raise ValueError(
            "The variational proxy does not support the local site "
            f"{', '.join(repr(s) for s in potential.integrated_sites)} integrated out of each "
            "datum's term by quadrature: NumPyro's SVI would fit a guide to it as a site. Use "
            "proxy='laplace' (the default), which fits the potential with it integrated out, or "
            "local=LocalConfig(nodes=0) to draw it instead."
        )
    if guide_params is not None and guide is None:
        raise ValueError(
            "guide_params= needs the guide= they were fitted for; pass both (e.g. "
            "proxy.info['guide'] and proxy.info['guide_params'] of a fitted proxy)."
        )
    if covariance not in ("guide", "expected_hessian"):
        raise ValueError(
            f"covariance must be 'guide' or 'expected_hessian', got {covariance!r}."
        )
    if covariance == "expected_hessian" and potential.dim > int(max_full_rank_dim):
        raise ValueError(
            f"covariance='expected_hessian' needs a dense d × d Hessian; d = "
            f"{potential.dim} > max_full_rank_dim = {max_full_rank_dim}: use 'guide'."
        )


def fit_variational(
    potential: Potential,
    data: ModelData,
    rng_key: jax.Array,
    *,
    guide: Callable | None = None,
    guide_params: dict | None = None,
    max_full_rank_dim: int = MAX_FULL_RANK_DIM,
    learning_rate: float | None = None,
    block_size: int | None = None,
    patience: int | None = None,
    num_decays: int | None = None,
    max_steps: int = 20_000,
    tol: float | None = None,
    num_particles: int = 1,
    num_eval_particles: int = 32,
    num_moment_samples: int = 4000,
    covariance: str = "guide",
    num_hessian_draws: int = 8,
    chunk_size: int = DEFAULT_CHUNK,
    store_datum_grads: bool = True,
    check_chain: bool | None = None,
    progress: bool = False,
) -> Proxy:
    """Variational proxy: a Gaussian q fitted by SVI until its ELBO stops rising.

    The model is ``potential.model``, its arguments ``data``. The family, the start, the
    ELBO estimator and the stopping rule are in the module docstring: full rank with
    second-order control variates up to ``max_full_rank_dim``, else NumPyro's SVI of
    ``guide`` (default ``AutoLowRankMultivariateNormal``); with ``guide_params`` (already
    fitted) SVI is skipped. ``learning_rate``: Adam's, in q's whitened coordinates for the
    default family; ``num_particles``: guide draws per step; ``num_eval_particles``: the
    common-random-number ELBO draws of NumPyro's SVI. ``learning_rate``, ``block_size``,
    ``patience`` and ``num_decays`` default to :data:`FULL_RANK_RULE` (0.005, 100, 5, 2) for
    the full-rank family and :data:`NUMPYRO_RULE` (0.02, 250, 2, 3) for NumPyro's SVI.

    ``proxy.info`` holds the guide and its parameters (an ``AutoMultivariateNormal`` of the
    model for the default family), ``losses`` (per-step −ELBO estimates), ``elbo_trace``,
    ``elbo_trend``, ``svi_steps``, ``converged``, ``gaussian`` and ``sample`` (draws
    ``(key, S) -> (S, d)`` from q in the potential's flat space), the checks' figures
    (``stationary_offsets``, ``stein_ratio``, ``pareto_k``, ``mean_decrement``) and
    ``warnings``.
    ``num_data_passes`` counts the start (Adam epochs, Newton passes), the SVI steps (n/N
    each), the per-datum gradients at the centre (one), the Stein checks (one for
    N ≥ 16 896) and the importance weights (100 full-data values).

    ``covariance``: ``"guide"`` (q's own) or ``"expected_hessian"``: (E_q[∇²f])⁻¹, the
    full-data Hessian averaged over the mean and ``num_hessian_draws`` draws (one pass each;
    d ≤ ``max_full_rank_dim``), which does not collapse where a guide's scale has; falls back
    to q's, with a warning, if not positive definite. ``info["guide_cov"]`` keeps q's.

    Warns (:class:`~numpyro_subsample.proxies.base.ProxyFitWarning`, naming the sites, the
    figure and a remedy) if SVI stopped at ``max_steps``, if more than 1% of its steps had a
    non-finite loss, if q's mean or variances break the Stein identities (Newton step
    Σ E_q[∇f] over 1 sd, or a variance ratio beyond a factor 10), if the Pareto k̂ of the
    importance weights p/q exceeds 0.7, if short MALA chains on the full data started at q's
    draws spread over twice q's sd or move 1.5 sds from its mean (``check_chain``), or if its
    mean is at a support's boundary (:mod:`.fit_checks`). ``info`` holds ``pareto_k`` and
    the chains' ``chain_sd_ratio`` and ``chain_shift`` per coordinate.

    Parameters
    ----------
    potential, data
        The model's potential and data.
    rng_key
        Key of SVI and of the moment draws.
    guide, guide_params
        A NumPyro guide (default: the full-rank family, see above) and its fitted parameters
        (skip SVI).
    max_full_rank_dim
        Largest d of the full-rank family.
    learning_rate, block_size, patience, num_decays, max_steps, tol
        Adam's rate and the stopping rule (module docstring).
    num_particles, num_eval_particles
        Guide draws per step, and of the common-random-number ELBO of NumPyro's SVI.
    num_moment_samples
        Draws for the moments of a non-Gaussian guide.
    covariance, num_hessian_draws
        ``"guide"`` or ``"expected_hessian"`` (above), and the draws the latter averages.
    chunk_size
        Data per vmapped evaluation in full-data passes.
    store_datum_grads
        Keep the (N, d) table of ∇f_i at the centre.
    check_chain
        Run the chain check (:mod:`~.chain_check`, 202 full-data passes); None (default): up
        to :data:`~.chain_check.MAX_CHAIN_CHECK_ROWS` rows. The package's kernels turn it
        off: their warm-up is such a chain, and adapts the proxy to it.
    progress
        Show progress bars.

    Returns
    -------
    Proxy
        N(q's mean, Σ̂) with ``info`` as above.

    References
    ----------
    Rønning and Hamelryck (2021), Eq. 2-4 (variational proxies); Baker, Fearnhead, Fox and
    Nemeth (2019), Eq. 4 (the control variates of the ELBO); Yao, Vehtari, Simpson and
    Gelman (2018) (Pareto k̂ of the importance weights); Roberts and Rosenthal (1998) (MALA's
    optimal acceptance, the chain check).
    """
    t0 = time.perf_counter()
    full_rank = guide is None and potential.dim <= int(max_full_rank_dim)
    defaults = FULL_RANK_RULE if full_rank else NUMPYRO_RULE
    learning_rate = defaults["learning_rate"] if learning_rate is None else learning_rate
    block_size = defaults["block_size"] if block_size is None else block_size
    patience = defaults["patience"] if patience is None else patience
    num_decays = defaults["num_decays"] if num_decays is None else num_decays
    _check_settings(block_size, max_steps, patience, num_decays, num_eval_particles,
                    learning_rate, tol, num_particles)
    _check_request(potential, guide, guide_params, covariance, max_full_rank_dim)
    tol = 0.01 * potential.dim if tol is None else float(tol)
    k_fit, k_mom = jax.random.split(rng_key)
    rule = dict(learning_rate=float(learning_rate), block_size=int(block_size),
                patience=int(patience), num_decays=int(num_decays), max_steps=int(max_steps),
                tol=tol, progress=progress)
    if full_rank:
        fit = _fit_full_rank(potential, data, k_fit, rule, int(num_particles), chunk_size)
    else:
        fit = _fit_numpyro_guide(potential, data, k_fit, k_mom, guide, guide_params, rule,
                                 int(num_eval_particles), int(num_moment_samples),
                                 int(max_full_rank_dim), progress)
    cov, passes, cov_info = fit.cov, fit.passes, {}
    if covariance == "expected_hessian":
        cov, more = _expected_hessian_cov(potential, data, fit, jax.random.fold_in(k_mom, 1),
                                          int(num_hessian_draws), chunk_size)
        passes += more
    proxy = proxy_from_moments(
        potential, data, fit.mean, cov, chunk_size=chunk_size,
        store_datum_grads=store_datum_grads, kind="variational", num_data_passes=passes,
    )
    chain = runs_chain_check(check_chain, potential.num_data)
    messages, figures = fit_messages(potential, data, proxy, fit.info, int(patience), tol,
                                     fit.gaussian, chunk_size, chain)
    for message in messages:
        warn_proxy(message)
    info = dict(fit.info, guide=fit.guide, guide_params=fit.params, gaussian=fit.gaussian,
                sample=fit.sample, warnings=messages, guide_cov=fit.cov, covariance=covariance,
                **cov_info, **figures)
    passes = proxy.num_data_passes + (
        check_passes(potential.num_data, chain) if fit.gaussian else 0)
    return proxy._replace(info=info, num_data_passes=passes, seconds=time.perf_counter() - t0)


def _fit_numpyro_guide(potential, data, k_fit, k_mom, guide, guide_params, rule,
                       num_eval_particles, num_moment_samples, max_full_rank_dim,
                       progress) -> Fitted:
    """NumPyro's SVI of ``guide`` (:func:`_fit_guide`); without one, of the default low-rank
    guide whose mean starts at the minibatch mode (its Adam steps counted in the passes)."""
    init_loc, passes = None, 0.0
    if guide is None:  # low rank: its mean starts at the minibatch mode
        guide = _cached_default_guide(potential, max_full_rank_dim)
        theta, steps = minibatch_mode(potential, data, jax.random.fold_in(k_fit, 3), progress)
        init_loc = np.asarray(theta)[guide_order(potential)]
        passes = steps * potential.plate.subsample_size / potential.num_data
    fit = _fit_guide(potential, data, k_fit, k_mom, guide, guide_params, rule,
                     num_eval_particles, num_moment_samples, init_loc)
    return fit._replace(passes=fit.passes + passes)


# -- the default family: full rank, control-variate ELBO ----------------------------------------
def _fit_full_rank(potential, data, key, rule, num_particles, chunk_size) -> Fitted:
    """Start at the Laplace approximation, run :func:`fit_gaussian_cv`, and express q as an
    ``AutoMultivariateNormal`` of the model."""
    k_start, k_svi = jax.random.split(key)
    exp, u0, start = expansion_start(potential, data, k_start, chunk_size=chunk_size,
                                     progress=rule["progress"])
    mean, tril, info = fit_gaussian_cv(potential, data, exp, u0, k_svi,
                                       num_draws=num_particles, **rule)
    dtype = potential.init_theta.dtype
    cov = tril @ tril.T
    guide = _cached_default_guide(potential, potential.dim)
    params = autoguide_params(potential, guide, mean, cov)
    mean, tril = device_array(mean, dtype), device_array(tril, dtype)
    passes = start.pop("num_data_passes") + info.pop("num_data_passes")
    info.update(start)
    return Fitted(mean=mean, cov=device_array(cov, dtype), gaussian=True,
                  sample=gaussian_sampler(mean, tril), guide=guide, params=params, info=info,
                  passes=passes)


# -- a NumPyro guide (low rank beyond max_full_rank_dim, or the user's) -------------------------
def _fit_guide(potential, data, k_fit, k_mom, guide, guide_params, rule, num_eval_particles,
               num_moment_samples, init_loc=None) -> Fitted:
    """NumPyro's SVI of ``guide`` (skipped with ``guide_params``; its loc from ``init_loc``)
    and q's moments."""
    _setup_guide(guide, jax.random.fold_in(k_fit, 7), data)
    if guide_params is None:
        params, info = _fit_svi(potential.model, guide, data, k_fit, init_loc=init_loc,
                                num_eval_particles=num_eval_particles, **rule)
        evaluations = info["svi_steps"] + info["crn_evaluations"]
        passes = evaluations * potential.plate.subsample_size / potential.num_data
    else:
        params, info, passes = guide_params, {"svi_steps": 0, "converged": None}, 0.0
    mean, cov, gaussian, sample = guide_moments(
        potential, data, guide, params, rng_key=k_mom, num_samples=num_moment_samples
    )
    dtype = potential.init_theta.dtype
    mean, cov = jnp.asarray(mean, dtype), jnp.asarray(cov, dtype)
    if not (bool(jnp.all(jnp.isfinite(mean))) and bool(jnp.all(jnp.isfinite(cov)))):
        raise ValueError(
            "The fitted guide has non-finite moments; pass a smaller learning_rate or a guide."
        )
    eig_min = float(np.linalg.eigvalsh(0.5 * (np.asarray(cov) + np.asarray(cov).T)).min())
    if not eig_min > 0:
        raise ValueError(
            f"The guide's covariance is not positive definite (smallest eigenvalue {eig_min:.3g})"
            "; use a full-rank guide or more num_moment_samples."
        )
    return Fitted(mean=mean, cov=cov, gaussian=gaussian, sample=sample, guide=guide, params=params,
                  info=info, passes=passes)


def _expected_hessian_cov(potential, data, fit, key, num_draws, chunk_size):
    """(E_q[∇²f])⁻¹ over q's mean and ``num_draws`` draws, or q's covariance (with a warning)
    if not positive definite; and the data passes used."""
    dtype = potential.init_theta.dtype
    draws = jnp.asarray(fit.sample(key, num_draws), dtype)
    thetas = jnp.concatenate([jnp.asarray(fit.mean, dtype)[None], draws])
    h_mean = np.asarray(_mean_hessian(potential, thetas, data, int(chunk_size)), np.float64)
    h_mean = 0.5 * (h_mean + h_mean.T)
    lam = np.linalg.eigvalsh(h_mean)
    if lam.min() > 0:
        return jnp.asarray(np.linalg.inv(h_mean), dtype), float(thetas.shape[0])
    warn_proxy(
        "covariance='expected_hessian': the full-data Hessian averaged over the guide's "
        f"mean and {num_draws} draws is not positive definite (smallest eigenvalue "
        f"{lam.min():.3g}); the guide's covariance is used instead. Check the fit (more SVI "
        "steps, a smaller learning_rate) or pass covariance='guide'."
    )
    return fit.cov, float(thetas.shape[0])
