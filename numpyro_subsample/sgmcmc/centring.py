"""Partial centring of a hierarchical model's loc-scale sites, from the kernel's adapted proxy.

A group effect a_j ~ N(m, s²) can be sampled centred (a_j itself) or non-centred
(ã_j = (a_j − m)/s). Neither suits groups of very unequal sizes: a group with much data pins a_j
(centred is better), a group with little data leaves a_j at its prior (non-centred is better).
Partial centring (Papaspiliopoulos, Roberts and Sköld 2007; Gorinova, Moore and Hoffman 2020,
Sect. 3, which NumPyro's :class:`~numpyro.infer.reparam.LocScaleReparam` implements) samples

    ã_j = (a_j − c_j m) / s^(1 − c_j),    0 ≤ c_j ≤ 1,

and for a Gaussian likelihood the posterior of ã_j is closest to independent of (m, s) at

    c_j = 1 − Var(a_j | y, m, s) / s²

(Papaspiliopoulos et al. 2007, Sect. 3: c_j = n_j s²/σ² / (1 + n_j s²/σ²) for a normal
likelihood with n_j rows of noise σ). :func:`centring_weights` estimates it with the kernel's
adapted proxy of the centred model (:mod:`~numpyro_subsample.sgmcmc.warmup`): Var(a_j) from its
covariance and s² averaged over its draws; :func:`partially_centred` returns the model
reparameterised with these weights, whose draws hold the model's own sites (a_j as a
deterministic site) beside the new ``<site>_decentered``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.reparam import LocScaleReparam
from numpyro.infer.util import constrain_fn

from numpyro_subsample.core.adapter import preprocess_keys
from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.potential import Potential, build_potential

__all__ = ["centred_potential", "centring_weights", "partially_centred", "weights_from"]

#: Sites whose weights are all at least this are left centred (reparameterising them would
#: change nothing measurable).
CENTRED_ENOUGH = 0.99


def _base_normal(fn) -> dist.Normal | None:
    """The Normal under a site's expand / to_event wrappers, or None."""
    while isinstance(fn, (dist.ExpandedDistribution, dist.Independent)):
        fn = fn.base_dist
    return fn if type(fn) is dist.Normal else None


def _site_scales(model: Callable, potential, plate_name: str) -> Callable:
    """``scales(theta, args, kwargs)``: each latent Normal site's scale (broadcast to the
    site's shape) at the flat unconstrained ``theta``, for the sites outside the subsample plate
    ``plate_name``."""
    seeded = numpyro.handlers.seed(model, rng_seed=0)

    def scales(theta, args, kwargs):
        latent = constrain_fn(seeded, args, kwargs, potential.unravel(theta))
        with numpyro.handlers.block():
            tr = numpyro.handlers.trace(numpyro.handlers.substitute(seeded, data=latent)
                                        ).get_trace(*args, **kwargs)
        out = {}
        for name, site in tr.items():
            if site["type"] != "sample" or site["is_observed"] or name not in latent:
                continue
            if any(f.name == plate_name for f in site["cond_indep_stack"]):
                continue
            normal = _base_normal(site["fn"])
            if normal is not None:
                out[name] = jnp.broadcast_to(normal.scale, jnp.shape(site["value"]))
        return out

    return scales


def weights_from(proxy, potential, data: ModelData, *, num_draws: int = 64,
                 seed: int = 0) -> dict[str, np.ndarray]:
    """:func:`centring_weights` from a dense Gaussian ``proxy`` of ``potential`` (the model
    as written) on ``data``."""
    model_args, model_kwargs = data.args_kwargs()
    model_kwargs = dict(model_kwargs)
    dtype = potential.init_theta.dtype
    centre = np.asarray(proxy.centre, np.float64)
    cov = np.asarray(proxy.cov, np.float64)
    index = potential.unravel(jnp.arange(centre.shape[0]).astype(dtype))
    z = np.random.default_rng(seed).normal(size=(num_draws, centre.shape[0]))
    draws = centre + z @ np.linalg.cholesky(0.5 * (cov + cov.T)).T
    scales = _site_scales(potential.model, potential, potential.plate.name)
    # two draws traced eagerly find the sites whose scale is latent (most models have none,
    # and then nothing is compiled)
    first = [scales(jnp.asarray(t, dtype), model_args, model_kwargs) for t in draws[:2]]
    if not any(not np.allclose(first[0][k], first[1][k]) for k in first[0]):
        return {}
    # the data enter the program as an argument (ModelData: arrays as leaves, the rest static)
    sums = jax.device_get(jax.jit(jax.vmap(
        lambda theta, d: scales(theta, *d.args_kwargs()), in_axes=(0, None)))(
        jnp.asarray(draws, dtype), data))
    weights = {}
    for name, site_scales in sums.items():
        site_scales = np.asarray(site_scales, np.float64)
        if np.allclose(site_scales, site_scales[0]):  # a fixed scale: centring changes nothing
            continue
        idx = np.asarray(index[name]).astype(int)
        c = np.clip(1.0 - np.diag(cov)[idx] / np.mean(site_scales ** 2, axis=0), 0.0, 1.0)
        if np.any(c < CENTRED_ENOUGH):
            weights[name] = c
    return weights


def centring_weights(kernel, model_args: tuple = (), model_kwargs: dict | None = None, *,
                     num_draws: int = 64, seed: int = 0) -> dict[str, np.ndarray]:
    """The partial-centring weights c of the model's centred Gaussian group effects.

    The SG kernels use them by default (``AdaptationOptions(centring=None)``); this function
    gives them for inspection or for another sampler.

    Parameters
    ----------
    kernel
        An SG kernel of the package (e.g. ``SGLD(model)``) with its default adapted proxy;
        the model as written is preprocessed on the data (a copy of the kernel, with partial
        centring off).
    model_args, model_kwargs
        The model's data, as given to ``MCMC.run``.
    num_draws
        Draws of the proxy at which each site's scale s is evaluated (E s² over them).
    seed
        Seed of those draws.

    Returns
    -------
    dict
        ``{site: c}`` with ``c`` of the site's shape in [0, 1], for each latent Normal site
        outside the subsample plate whose scale depends on other latent sites and whose
        weights are not all above ``CENTRED_ENOUGH``; empty where there is none.

    References
    ----------
    Papaspiliopoulos, O., Roberts, G. O. and Sköld, M. (2007). A general framework for the
    parametrization of hierarchical models. Statistical Science 22(1), Sect. 3.
    Gorinova, M., Moore, D. and Hoffman, M. (2020). Automatic reparameterisation of
    probabilistic programs. ICML, Sect. 3.
    """
    data = ModelData.from_args(model_args, model_kwargs)
    kernel = kernel.without_centring()
    pre = kernel._preprocess_data(data)
    proxy = pre.proxy
    if proxy is None or getattr(proxy, "cov", None) is None:
        raise ValueError(
            f"centring_weights needs a kernel with a dense Gaussian proxy; "
            f"{type(kernel).__name__}'s proxy is {getattr(proxy, 'kind', None)!r}. Use SGLD, "
            "SGHMC or SGNHT with the default proxy.")
    potential = kernel.potential_for(data)
    if potential.local:
        raise ValueError("centring_weights does not apply to models with local latent sites "
                         f"({list(potential.local_sites)}).")
    return weights_from(proxy, potential, data, num_draws=num_draws, seed=seed)


def partially_centred(model: Callable, weights: dict[str, np.ndarray]) -> Callable:
    """``model`` with each site of ``weights`` reparameterised by
    ``LocScaleReparam(centered=c)`` (:func:`centring_weights`); the model itself where
    ``weights`` is empty.

    Parameters
    ----------
    model
        The NumPyro model, with its group effects written centred.
    weights
        ``{site: c}``, c in [0, 1] of the site's shape.

    Returns
    -------
    callable
        The reparameterised model: the same posterior, each site ``a`` sampled as
        ``a_decentered`` and returned as a deterministic site ``a``.

    References
    ----------
    Gorinova, M., Moore, D. and Hoffman, M. (2020). Automatic reparameterisation of
    probabilistic programs. ICML, Sect. 3.
    """
    if not weights:
        return model
    config = {name: LocScaleReparam(centered=jnp.asarray(c)) for name, c in weights.items()}
    return numpyro.handlers.reparam(model, config=config)


def _reparameterised(model) -> bool:
    """Whether ``model`` is wrapped by a reparam handler with a loc-scale reparameterisation
    (non-centred or partially centred by the user, or by :func:`partially_centred`)."""
    while model is not None:
        if isinstance(model, numpyro.handlers.reparam):
            config = model.config
            if callable(config) or any(isinstance(r, LocScaleReparam)
                                       for r in (config or {}).values()):
                return True  # a callable config may reparameterise any site
        model = getattr(model, "fn", None)
    return False


def centred_potential(kernel, pre, data: ModelData) -> Potential | None:
    """The potential of the model partially centred with the weights of ``pre``'s proxy
    (:func:`weights_from`), for a kernel whose ``AdaptationOptions.centring`` allows it: None
    where it is off, where the potential is already a centred one, where the model already
    has a loc-scale reparameterisation (the user's choice), where the model has local
    latent sites or no dense proxy (None: no proxy adapted on pilot chains), or where no
    site has weights below ``CENTRED_ENOUGH``."""
    potential, proxy = pre.potential, pre.proxy
    mode = getattr(kernel, "centring", False)
    if mode is False or not getattr(kernel, "supports_proxy_adaptation", False):
        return None
    if potential.model is not kernel.user_model or potential.local:
        return None
    if _reparameterised(kernel.user_model):  # the user chose the parameterisation
        return None
    if proxy is None or getattr(proxy, "cov", None) is None:
        return None
    if mode is None and proxy.kind != "adapted":
        return None
    weights = weights_from(proxy, potential, data)
    if not weights:
        return None
    return build_potential(partially_centred(kernel.user_model, weights), data,
                           preprocess_keys(kernel.seed)[0])
