"""SGRLD's step bias, probed after the run: coupled Richardson-Romberg pairs of its mirrored
Langevin chains at ε and ε/2.

The probe of :mod:`~numpyro_subsample.sgmcmc.step_bias` for the simplex dynamics of
:mod:`~numpyro_subsample.sgmcmc.simplex` (Patterson and Teh 2013): each pair runs the step
θ ← |θ + (ε/2)(α − θ + θ ĝ) + sqrt(εθ) ξ| at ε (chain Y) and at ε/2 (chain Z) with
synchronously coupled increments (Durmus, Şimşekli, Moulines, Badeau and Richard 2016,
Sect. 3): Y takes (ξ₁ + ξ₂)/√2 where Z takes ξ₁ and ξ₂, and Y's subsample (with its local
latent sites' inner update) is drawn with the key of Z's first half-step. The pairs start
from the run's last draws π (and the local sites' tables), further rounds from earlier draws
of the same chains, at θ = S_r π with the total S_r of the step rule
(:func:`~numpyro_subsample.sgmcmc.simplex_model.reference_totals`, E[1/S] = 1/S_r under the
total's Gamma(Σα, 1) law). The total S = Σθ sets the clock of π's diffusion (its effective
step is ε/S) and relaxes only over some 2/ε steps, far more than the probe's: pairs started at
the chains' own totals would each measure the bias at their chain's S, and their spread would
swamp the estimate; started at S_r they measure the bias at the rule's clock, which to first
order (the bias is linear in ε/S) is the run's averaged over its S. The figures are the
simplex values π, in units of the run's posterior sds, read as
:func:`~numpyro_subsample.sgmcmc.coupled_pairs.batch_estimates` reads the other kernels'.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.compiling import fast_compile_jit
from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.rng import STEP_RNG
from numpyro_subsample.sgmcmc.coupled_pairs import BATCHES
from numpyro_subsample.sgmcmc.simplex import (
    SGRLDConfig,
    SGRLDParams,
    estimated_drift,
    mirrored_langevin_noise,
    to_simplex,
)
from numpyro_subsample.sgmcmc.simplex_model import reference_totals
from numpyro_subsample.sgmcmc.step_bias import (
    MAX_STEPS,
    MIN_STEPS,
    PROBE_PAIRS,
    BiasProbe,
    probe_rounds,
    probe_steps,
)

__all__ = ["SIMPLEX_PAIRS", "probe_simplex", "simplex_labels"]

#: Coupled pairs per round; their steps are capped so that a round makes as many gradient
#: estimates as a round of the other kernels' probe at its longest.
SIMPLEX_PAIRS = 16


def _flat_pi(theta: dict, names: tuple[str, ...]) -> jax.Array:
    """π of every site, flattened in sorted site order: (pairs, D)."""
    pi = to_simplex(theta)
    return jnp.concatenate([pi[k].reshape(pi[k].shape[0], -1) for k in names], axis=1)


@partial(fast_compile_jit, static_argnums=(0, 1, 2))
def _simplex_pairs(cfg: SGRLDConfig, names: tuple[str, ...], num_batches: int, batch_len,
                   params: SGRLDParams, eps, centre, sd, theta0, local0, key, data: ModelData):
    """The pairs' ``num_batches × batch_len`` steps at ε from θ (pairs leading) and the local
    sites' states ``local0`` (pairs leading, or None): per batch and pair the means of m(Z),
    m(Z)², m(Z) − m(Y), m(Z)² − m(Y)² (m = (π − centre)/sd; Z at ε/2, Y at ε) and whether Y
    and Z stayed finite."""
    pairs = theta0[names[0]].shape[0]

    def drift_at(theta, k, local):
        return estimated_drift(cfg, params, to_simplex(theta), k, local, data)

    vdrift = jax.vmap(drift_at)
    vmove = jax.vmap(
        lambda xi, theta, drift, e: mirrored_langevin_noise(xi, theta, params.alpha, drift, e)[0],
        in_axes=(0, 0, 0, None))

    def read(theta):
        return (_flat_pi(theta, names) - centre) / sd

    def finite(theta):
        return jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in theta.values()]))

    def step(k, carry):
        y, z, ly, lz, acc, ok = carry
        k_noise, k_est = jax.random.split(jax.random.fold_in(key, k))
        xis = {n: jax.random.normal(kn, (2,) + y[n].shape, y[n].dtype)
               for kn, n in zip(jax.random.split(k_noise, len(names)), names, strict=True)}
        keys = jax.vmap(lambda kk: jax.random.split(kk, pairs))(jax.random.split(k_est))
        dy, ly = vdrift(y, keys[0], ly)

        def half(r, c):  # Z moves by ε/2 with the r-th draw and key
            z, lz = c
            dz, lz = vdrift(z, keys[r], lz)
            return vmove({n: xis[n][r] for n in names}, z, dz, 0.5 * eps), lz

        z, lz = jax.lax.fori_loop(0, 2, half, (z, lz))
        y = vmove({n: (xis[n][0] + xis[n][1]) / jnp.sqrt(2.0) for n in names}, y, dy, eps)
        my, mz = read(y), read(z)
        out = jnp.stack([mz, mz * mz, mz - my, mz * mz - my * my], axis=1)  # (pairs, 4, D)
        acc = acc.at[:, k // batch_len].add(out / batch_len)
        return y, z, ly, lz, acc, ok & jnp.stack([finite(y), finite(z)])

    acc = jnp.zeros((pairs, num_batches, 4, centre.shape[0]), centre.dtype)
    carry = (theta0, theta0, local0, local0, acc, jnp.ones((2,), bool))
    carry = jax.lax.fori_loop(0, num_batches * batch_len, step, carry)
    return carry[4], carry[5]


def simplex_labels(pi: dict) -> list[str]:
    """Labels of the flattened simplex coordinates (sorted sites, row-major), e.g.
    ``"pi[1, 3]"``; ``pi``: one draw's values (no chains axis)."""
    labels = []
    for name in sorted(pi):
        shape = np.shape(pi[name])
        for idx in np.ndindex(*shape):
            labels.append(f"{name}[{', '.join(map(str, idx))}]" if idx else name)
    return labels


def probe_simplex(cfg: SGRLDConfig, params: SGRLDParams, data: ModelData, *, state: Any,
                  pi_draws: dict, rate: float, seed: int,
                  pairs: int = SIMPLEX_PAIRS) -> BiasProbe:
    """The probe of SGRLD's constant step ε after a run (module docstring).

    Parameters
    ----------
    cfg, params
        The run's SGRLD configuration and arrays (``params.schedule``'s a is ε).
    data
        The model's data.
    state
        The run's last :class:`~numpyro_subsample.sgmcmc.simplex.SGRLDState` (chains on the
        leading axis, or one chain's).
    pi_draws
        The run's simplex draws after warm-up, {site: (chains, draws, *shape)} (a thinned
        subset will do): their means and sds give the figures' units, their last ones start
        the further rounds.
    rate
        The largest relaxation rate λ of the step rule (time units ε/2), whose whitened step
        ελ/2 sets the probe's length (:func:`~numpyro_subsample.sgmcmc.step_bias.probe_steps`);
        NaN (a given step, not measured): :data:`~numpyro_subsample.sgmcmc.step_bias.MAX_STEPS`.
    seed
        Seed of the pairs' draws.
    pairs
        Coupled pairs per round (:data:`SIMPLEX_PAIRS`).

    Returns
    -------
    BiasProbe
        With ``after_run=True``; its coordinates are the flattened simplex values
        (:func:`simplex_labels`).

    References
    ----------
    Durmus, Şimşekli, Moulines, Badeau and Richard (2016), Sect. 3; Patterson and Teh (2013),
    Sect. 3-4 (the step).
    """
    t0 = time.perf_counter()
    names = tuple(sorted(params.alpha))
    eps = float(params.schedule[0])
    dtype = params.schedule.dtype
    steps = MAX_STEPS if not np.isfinite(rate) else probe_steps(eps * float(rate) / 2.0)
    steps = max(min(steps, PROBE_PAIRS * MAX_STEPS // pairs), MIN_STEPS)
    batch_len = max(steps // BATCHES, 1)
    steps = batch_len * BATCHES
    x = np.concatenate([np.asarray(pi_draws[k], np.float64).reshape(
        np.shape(pi_draws[k])[:2] + (-1,)) for k in names], axis=-1)  # (C, n, D)
    chains, n = x.shape[:2]
    centre = x.reshape(-1, x.shape[-1]).mean(0)
    sd = x.reshape(-1, x.shape[-1]).std(0)
    sd = np.where(np.isfinite(sd) & (sd > 0), sd, 1.0)
    owner = np.arange(pairs) % chains
    batched = np.ndim(state.theta[names[0]]) > np.ndim(params.alpha[names[0]])

    def per_pair(a):
        return (a if batched else a[None])[owner]

    totals = reference_totals(params.alpha)
    pi_last = {k: per_pair(np.asarray(state.pi[k])) for k in names}
    local = None if state.local is None else jax.tree.map(per_pair, state.local)
    per_chain = -(-pairs // chains)
    spacing = max(n // (4 * per_chain), 1)
    rng = np.random.default_rng([int(seed), 0x51A7])

    def starts(r: int) -> dict:  # θ = S_r π: the rule's clock of π's diffusion
        if r == 0:
            return {k: pi_last[k] * totals[k] for k in names}
        back = np.arange(pairs) // chains + (r - 1) * per_chain
        row = np.clip(n - 1 - back * spacing, 0, n - 1)
        return {k: np.asarray(pi_draws[k])[owner, row] * totals[k] for k in names}

    def run_round(r: int):
        bits = rng.integers(0, 2**32, 2, dtype=np.uint32)
        key = jax.random.wrap_key_data(device_array(bits), impl=STEP_RNG)
        theta0 = {k: device_array(v, dtype) for k, v in starts(r).items()}
        sums, ok = _simplex_pairs(cfg, names, BATCHES, device_array(batch_len, np.int32),
                                  params, device_array(eps, dtype), device_array(centre, dtype),
                                  device_array(sd, dtype), theta0, local, key, data)
        return np.asarray(sums), np.asarray(ok), 0.0

    probe = probe_rounds(run_round, step_size=eps, dim=centre.shape[0], pairs=pairs,
                         steps=steps, estimate_passes=cfg.size / cfg.potential.num_data,
                         refine=False, started=t0)
    return probe._replace(after_run=True)
