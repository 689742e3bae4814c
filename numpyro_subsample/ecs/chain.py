"""The functional core of energy-conserving subsampling HMC: a pure per-chain init and a pure
``step(state, data)`` per static configuration.

HMC (NumPyro's own ``hmc``: NUTS or static HMC, step size and mass matrix adapted in warm-up)
targets π(θ) exp(l̂(θ; u) − σ̂²(θ; u)/2) for fixed u (the bias correction of Rønning and
Hamelryck 2021, Eq. 1), in coordinates whitened by the proxy (θ = θ_ref + L w); between HMC
steps u is updated by the block-Gibbs step of :mod:`~numpyro_subsample.ecs.gibbs`. The
preprocessing's arrays (:class:`ECSParams`) and the data are arguments of the HMC potential
(through ``hmc``'s ``potential_fn_gen``), so the compiled programs are reused for new data of
the same shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from numpyro.infer.hmc import hmc

from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.core.rng import raw_key, split_step_key
from numpyro_subsample.ecs.difference import (
    SelectionLaw,
    SubsampleTerms,
    difference_estimate,
    draw_indices,
    subsample_terms,
)
from numpyro_subsample.ecs.gibbs import block_gibbs_update, propose_block
from numpyro_subsample.ecs.likelihood_proxies import LikelihoodProxy, LikelihoodSpec
from numpyro_subsample.proxies.whitening import whiten_matvec, whiten_solve

__all__ = ["ECSParams", "ECSState", "ECSConfig", "chain_programs"]


class ECSParams(NamedTuple):
    """The preprocessing's arrays that the chain reads (shared by vectorized chains)."""

    likelihood: LikelihoodProxy
    selection: SelectionLaw


class ECSState(NamedTuple):
    """State of an energy-conserving subsampling HMC chain.

    ``z``: unconstrained latent values (dict); ``hmc_state``: NumPyro's ``HMCState`` on the
    whitened position w; ``idx``: the subsample u (m,); ``aux``: the proxy's terms for u
    (:class:`~numpyro_subsample.ecs.difference.SubsampleTerms`, whitened); ``sigma2``: σ̂² at
    the current draw; ``loglik_estimate``: l̂ − Σ_i a_i; ``index_accept_prob``: of the last
    block-Gibbs step; ``accept_prob``, ``num_steps``, ``diverging``: of the last HMC step;
    ``params``: the preprocessing's arrays.

    Parameters
    ----------
    i
        Iteration counter.
    z
        Unconstrained latent values (dict).
    hmc_state
        NumPyro's ``HMCState`` on the whitened position.
    idx
        The subsample u, shape (m,).
    aux
        The proxy's terms for u.
    sigma2
        σ̂² at the current draw.
    loglik_estimate
        The estimate l̂ minus the proxy's sum.
    index_accept_prob
        Acceptance probability of the last block-Gibbs step of u.
    accept_prob, num_steps, diverging
        Of the last HMC step.
    rng_key
        The chain's random key.
    params
        The preprocessing's arrays.

    References
    ----------
    Rønning and Hamelryck (2021), Eq. 1; Dang et al. (2019) (the block-Gibbs update of u).
    """

    i: jax.Array
    z: dict
    hmc_state: Any
    idx: jax.Array
    aux: SubsampleTerms
    sigma2: jax.Array
    loglik_estimate: jax.Array
    index_accept_prob: jax.Array
    accept_prob: jax.Array
    num_steps: jax.Array
    diverging: jax.Array
    rng_key: jax.Array
    params: ECSParams


class ECSConfig(NamedTuple):
    """Static configuration of the compiled programs (hashable; equal configs share code).

    ``hmc_options``: sorted ``(name, value)`` pairs of NumPyro's ``init_kernel`` options.
    """

    potential: Potential
    spec: LikelihoodSpec
    subsample_size: int
    num_blocks: int
    algo: str
    hmc_options: tuple
    num_warmup: int
    rng_impl: str


@lru_cache(maxsize=64)
def chain_programs(cfg: ECSConfig) -> tuple[Callable, Callable]:
    """Pure ``init_one(key, init_params, data, params)`` and ``step(state, data)``."""
    pot, spec, m = cfg.potential, cfg.spec, cfg.subsample_size

    def energy_gen(idx, terms, data: ModelData, params: ECSParams):
        """U(w) = f0(θ) − l̂(θ; u) + σ̂²(θ; u)/2 for the subsample u = idx."""

        def energy(w):
            f0, loglik, sigma2 = difference_estimate(pot, params.likelihood, w, idx, terms, data)
            return f0 - loglik + 0.5 * sigma2

        return energy

    init_kernel, sample_kernel = hmc(potential_fn_gen=energy_gen, algo=cfg.algo)

    def init_one(rng_key, init_params, data: ModelData, params: ECSParams) -> ECSState:
        k_idx, k_w, k_hmc, key = jax.random.split(rng_key, 4)
        lp, sel = params
        idx = draw_indices(sel, k_idx, m, pot.num_data)
        terms = subsample_terms(pot, spec, lp, sel, idx, data)
        if init_params is not None:
            theta = ravel_pytree(init_params)[0].astype(lp.ref.dtype)
            w = whiten_solve(lp.tril, theta - lp.ref)
        else:
            w = 0.5 * jax.random.normal(k_w, lp.ref.shape, lp.ref.dtype)
        hs = init_kernel(
            w, cfg.num_warmup, model_args=(idx, terms, data, params), rng_key=k_hmc,
            **dict(cfg.hmc_options),
        )
        _, loglik, sigma2 = difference_estimate(pot, lp, w, idx, terms, data)
        return ECSState(
            i=jnp.zeros((), jnp.int32), z=pot.unravel(lp.ref + whiten_matvec(lp.tril, w)),
            hmc_state=hs, idx=idx, aux=terms, sigma2=sigma2, loglik_estimate=loglik,
            index_accept_prob=jnp.ones_like(hs.potential_energy), accept_prob=hs.accept_prob,
            num_steps=hs.num_steps, diverging=hs.diverging, rng_key=raw_key(key), params=params,
        )

    def step(state: ECSState, data: ModelData) -> ECSState:
        params = state.params
        lp, sel = params
        key, k_block, k_acc = split_step_key(state.rng_key, cfg.rng_impl)
        new_idx, new_terms = propose_block(
            pot, spec, cfg.num_blocks, lp, sel, k_block, state.idx, state.aux, data
        )
        hs, idx, terms, index_prob = block_gibbs_update(
            lambda i, t: energy_gen(i, t, data, params), k_acc, state.hmc_state,
            state.idx, state.aux, new_idx, new_terms,
        )
        hs = sample_kernel(hs, model_args=(idx, terms, data, params))
        _, loglik, sigma2 = difference_estimate(pot, lp, hs.z, idx, terms, data)
        like = lambda x, old: jnp.asarray(x, old.dtype)  # noqa: E731  (carry keeps its dtypes)
        return ECSState(
            i=state.i + 1, z=pot.unravel(lp.ref + whiten_matvec(lp.tril, hs.z)), hmc_state=hs,
            idx=idx, aux=terms, sigma2=like(sigma2, state.sigma2),
            loglik_estimate=like(loglik, state.loglik_estimate),
            index_accept_prob=like(index_prob, state.index_accept_prob),
            accept_prob=like(hs.accept_prob, state.accept_prob),
            num_steps=like(hs.num_steps, state.num_steps), diverging=hs.diverging, rng_key=key,
            params=params,
        )

    return init_one, step
