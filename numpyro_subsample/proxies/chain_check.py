"""The chain check of a Gaussian proxy N(m, LLᵀ): do short exact chains stay where it is?

4 MALA chains on the full-data posterior, in the proxy's whitened coordinates z (θ = m + L z),
start at the proxy's draws and take 200 steps: over the first 100 the step is tuned towards
MALA's optimal acceptance 0.574 (Roberts and Rosenthal 1998) by BlackJAX's dual averaging
(Hoffman and Gelman 2014, Sec. 3.2), and the last 100 are measured. Where the chains' sd along a
coordinate is over twice the proxy's (or under half), or their mean is over 1.5 proxy sds from
its centre, the proxy is far from the posterior: a variational guide collapsed into a funnel's
neck, whose importance weights look fine, or a Laplace fit at the joint mode of a hierarchical
model, far from the posterior's mass. Each step reads the data once for all chains: 202 data
passes in all (the terms at m, the start, the steps). The fits run it by default up to
:data:`MAX_CHAIN_CHECK_ROWS` rows (:func:`runs_chain_check`): beyond, its passes would cost many
times the fit itself.
"""

from __future__ import annotations

from functools import partial

import blackjax
import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, map_data, scan_chunks
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.checks import describe

__all__ = ["chain_moments", "chain_message", "chain_check", "runs_chain_check", "CHAIN_PASSES",
           "MAX_CHAIN_CHECK_ROWS"]

CHAIN_CHAINS = 4  # MALA chains, started at the proxy's draws
CHAIN_STEPS = 200  # their steps: the first half tunes the step, the second is measured
CHAIN_PASSES = CHAIN_STEPS + 2  # data passes: the terms at m, the start, the steps
MALA_ACCEPTANCE = 0.574  # the optimal acceptance of MALA (Roberts and Rosenthal 1998)
MAX_CHAIN_SD_RATIO = 2.0  # chains' sd over the proxy's (or its inverse) above which it is off
MAX_CHAIN_SHIFT = 1.5  # |chains' mean − m| / the proxy's sd above which it is off
#: Rows up to which the fits run the chain check unless told (``check_chain=None``): its
#: :data:`CHAIN_PASSES` full-data passes grow with N, where a Laplace fit costs a few.
MAX_CHAIN_CHECK_ROWS = 200_000

_CAUSES = {
    "guide": ("The Gaussian guide",
              "A guide collapsed into the neck of a funnel (a centred hierarchical scale near 0) "
              "does this, while its importance weights look fine."),
    "Laplace": ("The Laplace proxy",
                "The joint mode of a hierarchical model (its group scale near 0, or the "
                "non-centred effects' mode) far from the posterior's mass does this, or a "
                "posterior far from Gaussian."),
}


@partial(jax.jit, static_argnames=("potential", "num_chains", "num_steps", "chunk_size"))
def chain_moments(
    potential: Potential,
    centre: jax.Array,
    scale_tril: jax.Array,
    key: jax.Array,
    data: ModelData,
    num_chains: int = CHAIN_CHAINS,
    num_steps: int = CHAIN_STEPS,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Mean of θ − m and sd of θ over the second half of ``num_chains`` MALA chains on the
    full-data posterior, and their mean acceptance there.

    The chains move z, θ = m + L z (q = N(m, LLᵀ)), start at z ~ N(0, I) and take
    ``num_steps`` steps of BlackJAX's MALA; over the first half the step is tuned towards an
    acceptance of :data:`MALA_ACCEPTANCE` by BlackJAX's dual averaging (Hoffman and Gelman
    2014, Sec. 3.2), from 1.65² d^(−1/3) / 2 (Roberts and Rosenthal 1998), and the second
    half runs at its average. Each step reads the data once for all chains; the log density
    is summed as differences from the terms at m per datum (they keep their precision when f
    is a large sum; the N terms at m are computed once)."""
    dtype = centre.dtype
    d = centre.shape[0]

    base = map_data(lambda idx: potential.data_terms(centre, idx, data), potential.num_data,
                    chunk_size)

    def log_density(z):
        theta = centre + scale_tril @ z

        def chunk(idx, mask):
            terms = potential.data_terms(theta, idx, data) - base[idx]
            return jnp.sum(jnp.where(mask, terms, 0.0))

        lik = scan_chunks(chunk, potential.num_data, chunk_size, jnp.zeros((), dtype))
        return -(lik + potential.prior(theta, data))

    kernel = blackjax.mala.build_kernel()
    da_init, da_update, da_final = blackjax.adaptation.step_size.dual_averaging_adaptation(
        MALA_ACCEPTANCE)
    k_init, k_run = jax.random.split(key)
    z0 = jax.random.normal(k_init, (num_chains, d), dtype)
    states = jax.vmap(lambda z: blackjax.mala.init(z, log_density))(z0)
    half = num_steps // 2

    def step(carry, inp):
        states, da, sums = carry
        k, t = inp
        size = jnp.where(t < half, jnp.exp(da.log_step_size), da_final(da)).astype(dtype)
        keys = jax.random.split(k, num_chains)
        states, info = jax.vmap(lambda kk, s: kernel(kk, s, log_density, size))(keys, states)
        accept = jnp.mean(jnp.where(jnp.isfinite(info.acceptance_rate),
                                    info.acceptance_rate, 0.0))
        da = jax.tree.map(lambda new, old: jnp.where(t < half, new, old),
                          da_update(da, accept), da)
        offset = states.position @ scale_tril.T  # θ − m
        keep = (t >= half).astype(dtype)
        sums = jax.tree.map(lambda acc, x: acc + keep * x, sums,
                            (jnp.sum(offset, 0), jnp.sum(offset**2, 0), accept))
        return (states, da, sums), None

    size0 = jnp.asarray(0.5 * 1.65**2 * d ** (-1.0 / 3.0), dtype)
    zeros = (jnp.zeros((d,), dtype), jnp.zeros((d,), dtype), jnp.zeros((), dtype))
    steps = (jax.random.split(k_run, num_steps), jnp.arange(num_steps))
    (_, _, (s1, s2, acc)), _ = jax.lax.scan(step, (states, da_init(size0), zeros), steps)
    count = (num_steps - half) * num_chains
    mean = s1 / count
    sd = jnp.sqrt(jnp.maximum(s2 / count - mean**2, 0.0))
    return mean, sd, acc / (num_steps - half)


def chain_message(labels, ratio, shift, acceptance, kind: str = "guide") -> str | None:
    """Message for a proxy (``kind``: ``"guide"`` or ``"Laplace"``) whose chains
    (:func:`chain_moments`) have an sd beyond :data:`MAX_CHAIN_SD_RATIO` times its own (or below
    its inverse), or a mean over :data:`MAX_CHAIN_SHIFT` of its sds from its centre; or None."""
    ratio = np.asarray(ratio, np.float64)
    shift = np.asarray(shift, np.float64)
    wide = ~(ratio <= MAX_CHAIN_SD_RATIO)
    narrow = ratio < 1.0 / MAX_CHAIN_SD_RATIO
    moved = ~(np.abs(shift) <= MAX_CHAIN_SHIFT)
    found = []
    if wide.any():
        found.append(f"their sd is q's times {describe(labels, np.where(wide, ratio, 0.0))}")
    if narrow.any():
        found.append("their sd is q's over "
                     f"{describe(labels, np.where(narrow, 1.0 / ratio, 0.0))}")
    if moved.any():
        found.append("their mean is off q's by "
                     f"{describe(labels, np.where(moved, shift, 0.0))} q sds")
    if not found:
        return None
    name, cause = _CAUSES[kind]
    return (
        f"{name} is far from the posterior: {CHAIN_CHAINS} short MALA chains on the full "
        f"data, started at its draws ({CHAIN_STEPS} steps in its whitened coordinates, "
        f"acceptance {float(acceptance):.2f}), moved away from it: {'; '.join(found)} "
        f"(limits {MAX_CHAIN_SD_RATIO:g}× and {MAX_CHAIN_SHIFT:g} sd). {cause} Do not read the "
        "posterior off it: sample it (SGLD(model) or SGHMC(model), whose warm-up moves the "
        "proxy to where its chains are), and check the chain against a long full-data NUTS "
        "run."
    )


def runs_chain_check(check_chain: bool | None, num_data: int) -> bool:
    """Whether a fit runs the chain check: ``check_chain`` where given, else (None) where the
    data have at most :data:`MAX_CHAIN_CHECK_ROWS` rows."""
    if check_chain is None:
        return int(num_data) <= MAX_CHAIN_CHECK_ROWS
    return bool(check_chain)


def chain_check(potential: Potential, data: ModelData, centre: jax.Array,
                scale_tril: jax.Array, cov: np.ndarray, labels, chunk_size: int,
                kind: str) -> tuple[str | None, dict]:
    """Run :func:`chain_moments` on N(``centre``, ``cov`` = LLᵀ) and return
    :func:`chain_message`'s message (or None) and the figures ``chain_sd_ratio``,
    ``chain_shift`` (per coordinate, in the proxy's sds) and ``chain_acceptance``."""
    offset, sd, acceptance = chain_moments(potential, centre, scale_tril,
                                           jax.random.PRNGKey(2), data,
                                           chunk_size=int(chunk_size))
    proxy_sd = np.sqrt(np.diag(np.asarray(cov, np.float64)))
    ratio = np.asarray(sd, np.float64) / proxy_sd
    shift = np.asarray(offset, np.float64) / proxy_sd
    figures = {"chain_sd_ratio": ratio, "chain_shift": shift,
               "chain_acceptance": float(acceptance)}
    return chain_message(labels, ratio, shift, acceptance, kind), figures


