"""The coupled Richardson-Romberg pairs of :mod:`~numpyro_subsample.sgmcmc.step_bias`: their
compiled loop, their starts and the batch-means estimates read from them.

Pairs of chains at time steps h and h/2 with synchronously coupled Brownian increments (Durmus,
Şimşekli, Moulines, Badeau and Richard 2016, Sect. 3): the chain at h takes the standard
normal draw (ξ_{2k−1} + ξ_{2k})/√2 where the chain at h/2 takes ξ_{2k−1} and ξ_{2k}, and the
first of the two subsamples of the chain at h/2.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy.linalg import solve_triangular

from numpyro_subsample.core.compiling import fast_compile_jit
from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.proxies.whitening import Scale, whiten_matvec, whiten_rmatvec
from numpyro_subsample.sgmcmc.chain import MAX_PROXY_SD
from numpyro_subsample.sgmcmc.dynamics import Dynamics

__all__ = ["BATCHES", "BURN_IN_BATCHES", "batch_estimates", "run_pairs", "start_positions"]

#: Batches per pair for the batch-means standard errors; the first ``BURN_IN_BATCHES`` are left
#: out (the coupled difference starts at 0 and grows to its stationary value).
BATCHES = 40
BURN_IN_BATCHES = 8


def _probe_program(estimate, dynamics: Dynamics, num_batches: int, batch_len, est_params,
                   centre, tril: Scale, sd, h, scale_h, scale_half, start_w, start_xi, key,
                   data: ModelData, precond):
    """The coupled pairs' ``num_batches × batch_len`` steps; returns per batch and pair the
    means of m(Z), m(Z)², m(Z) − m(Y), m(Z)² − m(Y)² (m = (θ − θ̂)/sd; Z at h/2, Y at h) and
    whether the chains at h and at h/2 stayed finite and within ``MAX_PROXY_SD`` proxy sds.

    Pair p moves u with w = s_p ⊙ u, θ = θ̂ + L w, s_p = ``precond[p]`` (the diagonal
    preconditioner of :mod:`~numpyro_subsample.sgmcmc.adaptation`, ones without it), as the
    sampling chain does (:func:`~numpyro_subsample.sgmcmc.chain.chain_programs`).

    One loop over half-steps, so that the estimator is traced once. Pair p's half-step j has
    parity r = (j + p) mod 2 (half of the pairs out of phase with the other half): at r = 0
    the gradient is evaluated at Z and at Y with one subsample key, at r = 1 at Z only with a
    second key; Z moves by h/2 with the pair's draw ξ_r at every half-step, Y by h at r = 1
    with the gradient of r = 0 and (ξ_0 + ξ_1)/√2. Each half-step thus evaluates P Z's and P/2
    Y's: 3P/2 gradient estimates, 3 per pair and step as the unrolled scheme."""
    pairs = start_w.shape[0]
    half = pairs // 2
    phase = jnp.arange(pairs) % 2
    order = jnp.argsort(phase, stable=True)  # pairs of phase 0 first, then phase 1
    mom, therm = jax.vmap(dynamics.init_momentum)(start_xi, start_w)
    vstep = jax.vmap(dynamics.step_noise, in_axes=(0, 0, 0, 0, 0, None, None))

    def grad_at(u, k, s):
        g, _ = estimate(est_params, k, centre + whiten_matvec(tril, s * u), data)
        return s * whiten_rmatvec(tril, -g)

    vgrad = jax.vmap(grad_at)
    vscaled = jax.vmap(lambda u, s: whiten_matvec(tril, s * u) / sd)

    def where(c, new, old):
        return jax.tree.map(lambda a, b: jnp.where(c.reshape((-1,) + (1,) * (a.ndim - 1)), a, b),
                            new, old)

    def healthy(u):  # as the sampling chain's test (sgmcmc.chain.MAX_PROXY_SD), on w = s ⊙ u
        w = precond * u
        return jnp.all(jnp.isfinite(w) & (jnp.abs(w) < MAX_PROXY_SD))

    def half_step(j, carry):
        y, z, g_saved, xi_saved, acc, ok = carry
        r = (j - phase) % 2
        active = j >= phase  # pairs of phase 1 start one half-step later
        k_noise, k_est = jax.random.split(jax.random.fold_in(key, j))
        xi = jax.random.normal(k_noise, start_w.shape, start_w.dtype)
        keys = jax.random.split(k_est, pairs)
        # pair p's subsample key at its r = 0 half-step serves both its Y and its Z
        ys = jax.lax.dynamic_slice_in_dim(order, (j % 2) * half, half)  # pairs with r = 0
        g = vgrad(jnp.concatenate([y[0][ys], z[0]]), jnp.concatenate([keys[ys], keys]),
                  jnp.concatenate([precond[ys], precond]))
        g_saved = g_saved.at[ys].set(g[:half])
        xi_saved = jnp.where(((r == 0) & active)[:, None], xi, xi_saved)
        z = where(active, vstep(xi, *z, g[half:], 0.5 * h, scale_half), z)
        moved = vstep((xi_saved + xi) / jnp.sqrt(2.0), *y, g_saved, h, scale_h)
        done = (r == 1) & active  # Y and Z at the same time point
        y = where(done, moved, y)
        my, mz = vscaled(y[0], precond), vscaled(z[0], precond)
        out = jnp.stack([mz, mz * mz, mz - my, mz * mz - my * my], axis=1)  # (pairs, 4, d)
        batch = jnp.clip((j - phase) // (2 * batch_len), 0, num_batches - 1)
        acc = acc.at[jnp.arange(pairs), batch].add(
            jnp.where(done[:, None, None], out, 0.0) / batch_len)
        ok = ok & jnp.stack([healthy(y[0]), healthy(z[0])])
        return y, z, g_saved, xi_saved, acc, ok

    start = (start_w, mom, therm)
    acc = jnp.zeros((pairs, num_batches, 4, start_w.shape[1]), start_w.dtype)
    carry = (start, start, jnp.zeros_like(start_w), jnp.zeros_like(start_w), acc,
             jnp.ones((2,), bool))
    carry = jax.lax.fori_loop(0, 2 * num_batches * batch_len + 1, half_step, carry)
    return carry[4], carry[5]  # (pairs, batches, 4, d); chains at h, h/2 stayed healthy


_probe_compiled = fast_compile_jit(_probe_program, static_argnums=(0, 1, 2))


def _stateful_probe_program(update, state_axes, dynamics: Dynamics, num_batches: int,
                            batch_len, est_params, centre, tril: Scale, sd, h, scale_h,
                            scale_half, start_w, start_xi, key, data: ModelData, precond,
                            states):
    """The coupled pairs of :func:`_probe_program` with a stateful estimator
    (``update(params, state, key, θ, data) -> (g, n, state, passes)`` of
    :class:`~numpyro_subsample.estimators.base.GradientEstimator`, its state vectorized over
    chains with ``state_axes``): ``states`` = (state of the chains at h, state of those at
    h/2), the pairs on the leading axis of their per-chain leaves. All pairs move in phase, one
    step at h per iteration: the chains at h/2 update their state at each of their two
    half-steps, the chains at h at their one step, with the key (subsample, and the local
    sites' draws) of the first half-step, so that every state is written in place and none is
    copied or masked per step (a state may be a table of N rows), and a state common to the
    chains (SVRG's refresh clock) is common to the chains at h and, apart, to those at h/2,
    each clock counting its chains' steps as the run's does. 3 gradient estimates per pair
    and step, as the stateless program; also returns the full data passes the updates spent
    beyond them (SVRG's refreshes)."""
    pairs, d = start_w.shape
    mom, therm = jax.vmap(dynamics.init_momentum)(start_xi, start_w)
    vstep = jax.vmap(dynamics.step_noise, in_axes=(0, 0, 0, 0, 0, None, None))

    def grad_at(u, k, s, state):
        g, _, state, passes = update(est_params, state, k,
                                     centre + whiten_matvec(tril, s * u), data)
        return s * whiten_rmatvec(tril, -g), state, passes

    vgrad = jax.vmap(grad_at, in_axes=(0, 0, 0, state_axes), out_axes=(0, state_axes, 0))
    vscaled = jax.vmap(lambda u, s: whiten_matvec(tril, s * u) / sd)

    def healthy(u):
        w = precond * u
        return jnp.all(jnp.isfinite(w) & (jnp.abs(w) < MAX_PROXY_SD))

    def half(r, carry):  # the chain at h/2 moves by h/2 with the r-th draw and key
        z, z_state, extra, xis, keys = carry
        g, z_state, passes = vgrad(z[0], keys[r], precond, z_state)
        z = vstep(xis[r], *z, g, 0.5 * h, scale_half)
        return z, z_state, extra + jnp.sum(passes), xis, keys

    def step(k, carry):
        y, z, y_state, z_state, acc, ok, extra = carry
        k_noise, k_est = jax.random.split(jax.random.fold_in(key, k))
        xis = jax.random.normal(k_noise, (2,) + start_w.shape, start_w.dtype)
        keys = jax.vmap(lambda kk: jax.random.split(kk, pairs))(jax.random.split(k_est))
        g_y, y_state, passes = vgrad(y[0], keys[0], precond, y_state)
        z, z_state, extra, _, _ = jax.lax.fori_loop(
            0, 2, half, (z, z_state, extra + jnp.sum(passes), xis, keys))
        y = vstep((xis[0] + xis[1]) / jnp.sqrt(2.0), *y, g_y, h, scale_h)
        my, mz = vscaled(y[0], precond), vscaled(z[0], precond)
        out = jnp.stack([mz, mz * mz, mz - my, mz * mz - my * my], axis=1)  # (pairs, 4, d)
        acc = acc.at[:, k // batch_len].add(out / batch_len)
        ok = ok & jnp.stack([healthy(y[0]), healthy(z[0])])
        return y, z, y_state, z_state, acc, ok, extra

    start = (start_w, mom, therm)
    acc = jnp.zeros((pairs, num_batches, 4, d), start_w.dtype)
    carry = (start, start, states[0], states[1], acc, jnp.ones((2,), bool),
             jnp.zeros((), start_w.dtype))
    carry = jax.lax.fori_loop(0, num_batches * batch_len, step, carry)
    return carry[4], carry[5], carry[6]


_stateful_probe_compiled = fast_compile_jit(_stateful_probe_program,
                                             static_argnums=(0, 1, 2, 3))


def start_positions(proxy: Any, centre: np.ndarray, tril: np.ndarray, pairs: int,
                    rng: np.random.Generator, shift: int = 0) -> np.ndarray:
    """Whitened start positions (pairs, d): ``pairs`` of the pilot's last draws
    (``proxy.info["draws"]``, spread evenly, moved ``shift`` draws on for a further round)
    where there are enough, else standard normal draws (proxy draws)."""
    draws = (getattr(proxy, "info", None) or {}).get("draws") if proxy is not None else None
    if draws is not None and np.shape(draws)[0] >= pairs:
        theta = np.asarray(draws, np.float64)
        idx = np.linspace(0, theta.shape[0] - 1, pairs).astype(int) + int(shift)
        pick = theta[idx % theta.shape[0]]
        return solve_triangular(tril, (pick - centre).T, lower=True).T
    return rng.standard_normal((pairs, centre.shape[0]))


def batch_estimates(sums: np.ndarray) -> tuple[np.ndarray, ...]:
    """Bias estimates, their standard errors and effective sample sizes from the batch means
    ``sums`` (pairs, batches, 4, d), the burn-in batches left out.

    The standard error of each function's mean over the batch means is its sd over
    sqrt(ESS), the ESS of the pairs' series of batch means (NumPyro's estimator, the pairs as
    chains): a series that drifts or mixes slowly over the probe gets a small ESS and a large
    standard error, rather than the batch means' naive one."""
    from numpyro.diagnostics import effective_sample_size

    s = np.asarray(sums, np.float64)[:, BURN_IN_BATCHES:]  # (P, B, 4, d)
    mz, mz2, d1, d2 = (s[:, :, i] for i in range(4))  # (P, B, d) each
    mean_z = mz.mean((0, 1))
    var_z = np.maximum(mz2.mean((0, 1)) - mean_z**2, 1e-12)
    mean_y = (mz - d1).mean((0, 1))  # the chain at h
    dvar = d2 - (mean_z + mean_y) * d1  # var_{h/2} − var_h, linearised per batch mean

    def mean_se_ess(x):
        ess = np.asarray(effective_sample_size(x), np.float64)
        ess = np.clip(np.nan_to_num(ess, nan=1.0), 1.0, x.shape[0] * x.shape[1])
        return x.mean((0, 1)), x.reshape(-1, x.shape[-1]).std(0, ddof=1) / np.sqrt(ess), ess

    m1, se1, ess1 = mean_se_ess(d1)
    m2, se2, ess2 = mean_se_ess(dvar)
    sd_z = np.sqrt(var_z)
    return (-2.0 * m1 / sd_z, 2.0 * se1 / sd_z, -m2 / var_z, se2 / var_z,
            np.minimum(ess1, ess2))


def run_pairs(estimate: Any, dynamics: Dynamics, batch_len: int, estimator_params: Any,
              centre: jax.Array, scale_tril: Scale, sd: np.ndarray, h: float,
              scales: tuple[Any, Any], start: tuple[np.ndarray, np.ndarray], key: jax.Array,
              data: ModelData, precond: np.ndarray | None = None,
              update: Any = None, state: Any = None, state_axes: Any = 0,
              ) -> tuple[np.ndarray, np.ndarray, float]:
    """The pairs' ``BATCHES × batch_len`` steps from the whitened ``start`` (positions u,
    momentum draws) with the injected-noise ``scales`` at h and h/2 (None: the dynamics'
    own) and per pair the diagonal preconditioner ``precond`` (pairs, d) (None: ones), in
    the whitening ``scale_tril`` (dense or structured): (batch means (pairs, batches, 4, d),
    whether the chains at h and at h/2 stayed finite and within ``MAX_PROXY_SD`` proxy sds,
    the full data passes spent beyond the gradient estimates). With a stateful estimator's
    ``update`` (then ``estimate`` is not used), ``state`` is its state per pair (pairs on the
    leading axis of the leaves ``state_axes`` maps to 0), with which both chains of a pair
    start (:func:`_stateful_probe_program`). The program is compiled with the options of
    :func:`~numpyro_subsample.core.compiling.fast_compile_jit`."""
    dtype = centre.dtype
    if precond is None:
        precond = np.ones(np.shape(start[0]))
    args = (BATCHES, device_array(batch_len, np.int32), estimator_params, centre, scale_tril,
            device_array(sd, dtype), device_array(h, dtype), scales[0], scales[1],
            device_array(start[0], dtype), device_array(start[1], dtype), key, data,
            device_array(precond, dtype))
    if update is None:
        sums, ok = _probe_compiled(estimate, dynamics, *args)
        return np.asarray(sums), np.asarray(ok), 0.0
    sums, ok, extra = _stateful_probe_compiled(update, state_axes, dynamics, *args,
                                               (state, state))
    return np.asarray(sums), np.asarray(ok), float(extra)
