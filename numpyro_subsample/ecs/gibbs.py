"""Block-Gibbs update of the subsample u between HMC steps (correlated pseudo-marginal: Tran et
al. 2016; Dang et al. 2019; as ``numpyro.infer.HMCECS``).

u is split into G = ``num_blocks`` blocks of m/G indices; one block, chosen uniformly, is
redrawn from the selection law (an independence proposal from the prior of u) and accepted with
probability min(1, exp(l̂' − σ̂'²/2 − l̂ + σ̂²/2)) at the current θ, i.e. exp(U − U') with U the
HMC potential energy. Larger G: more correlated l̂ and higher acceptance, slower mixing of u.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.ecs.difference import (
    SelectionLaw,
    SubsampleTerms,
    draw_indices,
    subsample_terms,
)
from numpyro_subsample.ecs.likelihood_proxies import LikelihoodProxy, LikelihoodSpec

__all__ = ["propose_block", "block_gibbs_update"]


def propose_block(
    potential: Potential,
    spec: LikelihoodSpec,
    num_blocks: int,
    lp: LikelihoodProxy,
    sel: SelectionLaw,
    key: jax.Array,
    idx: jax.Array,
    terms: SubsampleTerms,
    data: ModelData,
) -> tuple[jax.Array, SubsampleTerms]:
    """u with one block redrawn from the selection law, and the proxy terms of the new u."""
    size = idx.shape[0] // num_blocks
    k_block, k_idx = jax.random.split(key)
    start = jax.random.randint(k_block, (), 0, num_blocks) * size
    new = draw_indices(sel, k_idx, size, potential.num_data)
    new_terms = subsample_terms(potential, spec, lp, sel, new, data)

    def put(x, nx):
        return jax.lax.dynamic_update_slice_in_dim(x, nx, start, 0)

    return put(idx, new), jax.tree.map(put, terms, new_terms)


def block_gibbs_update(
    energy: Callable[[jax.Array, SubsampleTerms], Callable[[jax.Array], jax.Array]],
    key: jax.Array,
    hmc_state,
    idx: jax.Array,
    terms: SubsampleTerms,
    new_idx: jax.Array,
    new_terms: SubsampleTerms,
):
    """Accept or reject the proposed subsample at the HMC state's position.

    ``energy(idx, terms)`` is the HMC potential U(w) for that subsample. Returns the HMC state
    (with its potential energy and gradient for the kept subsample), u, its terms and the
    acceptance probability.
    """
    pe_new, grad_new = jax.value_and_grad(energy(new_idx, new_terms))(hmc_state.z)
    log_ratio = hmc_state.potential_energy - pe_new
    prob = jnp.where(jnp.isfinite(log_ratio), jnp.exp(jnp.minimum(log_ratio, 0.0)), 0.0)
    accept = jax.random.bernoulli(key, prob)
    sel = lambda new, old: jnp.where(accept, new, old)  # noqa: E731
    hmc_state = hmc_state._replace(
        potential_energy=sel(pe_new, hmc_state.potential_energy),
        z_grad=sel(grad_new, hmc_state.z_grad),
    )
    return hmc_state, sel(new_idx, idx), jax.tree.map(sel, new_terms, terms), prob
