"""The functional core of SGRLD on the probability simplex (Patterson and Teh 2013).

Expanded-mean parameterisation (Patterson and Teh 2013, Sect. 3-4): every Dirichlet(α) site
π (the last axis is the simplex; any batch axes in front) is carried as unnormalised weights
θ_k > 0, θ_k ~ Gamma(α_k, 1) independently, π = θ / Σ_k θ_k. With the metric
G(θ)⁻¹ = diag(θ) the Langevin step with mirroring at 0 is

    θ_k ← | θ_k + (ε/2) (α_k − θ_k + θ_k ĝ_k) + sqrt(ε θ_k) ξ_k |,    ξ_k ~ N(0, 1),

where ĝ_k estimates ∂ log p(x | π) / ∂θ_k from a subsample. The likelihood's gradient G is
taken by autodiff with respect to the constrained π; the chain rule through π = θ / Σθ gives

    θ_k ∂L/∂θ_k = π_k (G_k − Σ_j π_j G_j),

which for multinomial counts is Patterson and Teh's n_k − π_k n_·. The subsample enters through a
:class:`~numpyro_subsample.estimators.selection.SamplingDesign` (uniform weights N/n, Welling
and Teh 2011; stratified weights n_j/b_j, Fu and Zhang 2023, Eq. 10): the estimate is
Σ_j w_j ∇ℓ_{i_j}, unbiased for the full-data sum. Everything is elementwise: no d × d array.

The step size follows Patterson and Teh's schedule ε_t = a (1 + t/b)^(−c); c = 0 gives a
constant step.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.datapass import DEFAULT_CHUNK, map_data, scan_chunks
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.core.rng import raw_key, split_step_key
from numpyro_subsample.estimators.local import (
    LocalConfig,
    LocalState,
    init_local_state,
    update_rows,
)
from numpyro_subsample.estimators.selection import DesignMoments

__all__ = [
    "SGRLDParams",
    "SGRLDState",
    "SGRLDConfig",
    "step_size_at",
    "to_simplex",
    "likelihood_grad",
    "expanded_mean_grad",
    "mirrored_langevin",
    "mirrored_langevin_noise",
    "estimated_drift",
    "datum_drifts",
    "DriftMoments",
    "drift_noise",
    "em_point",
    "flatten_sites",
    "relaxation_rates",
    "unflatten_sites",
    "sgrld_programs",
]


class SGRLDParams(NamedTuple):
    """The preprocessing's arrays read by the step: the Dirichlet concentrations α of every
    site (broadcast to its shape), the design's arrays, the schedule (a, b, c) of
    ε_t = a (1 + t/b)^(−c), and the data passes spent on the preprocessing."""

    alpha: dict
    design: Any
    schedule: jax.Array
    data_passes: jax.Array


class SGRLDState(NamedTuple):
    """State of an SGRLD chain.

    ``pi``: the simplex values of every Dirichlet site (the draws); ``theta``: the
    expanded-mean weights θ > 0, π = θ / Σθ; ``step_size``: the ε of the step that produced
    this state; ``mirrored``: the coordinates reflected at 0 by that step; ``diverging``: that
    step gave a non-finite θ and was rejected (the chain stays where it was);
    ``subsample_size``: data per gradient estimate; ``data_passes``: cumulative data
    evaluations / N, preprocessing included; ``params``: the preprocessing's arrays (shared by
    vectorized chains); ``local``: the warm starts of the local latent sites
    (:class:`~numpyro_subsample.estimators.local.LocalState`), None without them.
    """

    i: jax.Array
    pi: dict
    theta: dict
    step_size: jax.Array
    mirrored: jax.Array
    diverging: jax.Array
    subsample_size: jax.Array
    data_passes: jax.Array
    rng_key: jax.Array
    params: SGRLDParams
    local: LocalState | None = None


def step_size_at(schedule: jax.Array, t: jax.Array) -> jax.Array:
    """ε_t = a (1 + t/b)^(−c) for ``schedule = (a, b, c)`` (Patterson and Teh 2013)."""
    a, b, c = schedule[0], schedule[1], schedule[2]
    return a * (1.0 + t.astype(schedule.dtype) / b) ** (-c)


def to_simplex(theta: dict) -> dict:
    """π = θ / Σθ along the last axis of every site."""
    return {k: v / jnp.sum(v, axis=-1, keepdims=True) for k, v in theta.items()}


def likelihood_grad(
    potential: Potential, pi: dict, idx: jax.Array, weights: jax.Array, data: ModelData
) -> dict:
    """G = ∇_π Σ_j w_j log p(x_{i_j} | π), summed over the observed sites of the plate, with
    respect to the constrained simplex values ``pi`` (a dict of every latent site)."""
    dtype = jax.tree.leaves(pi)[0].dtype

    def total(p):
        ll = potential.log_likelihood_at(p, idx, data)
        return sum(jnp.dot(weights.astype(dtype), v.astype(dtype)) for v in ll.values())

    return jax.grad(total)(pi)


def expanded_mean_grad(pi: dict, grad_pi: dict) -> dict:
    """θ ⊙ ∂L/∂θ = π ⊙ (G − ⟨π, G⟩) along the last axis (chain rule through π = θ / Σθ)."""
    return {
        k: p * (grad_pi[k] - jnp.sum(p * grad_pi[k], axis=-1, keepdims=True))
        for k, p in pi.items()
    }


def mirrored_langevin(
    key: jax.Array, theta: dict, alpha: dict, lik_drift: dict, eps: jax.Array
) -> tuple[dict, jax.Array]:
    """One step θ ← |θ + (ε/2)(α − θ + θ ĝ) + sqrt(εθ) ξ| (Patterson and Teh 2013, Sect. 4).

    ``lik_drift`` is θ ⊙ ĝ. Returns the new θ (floored at the dtype's smallest normal number,
    so that π stays defined after an underflow) and the number of coordinates mirrored.
    """
    names = sorted(theta)
    keys = jax.random.split(key, len(names))
    xi = {name: jax.random.normal(k, theta[name].shape, theta[name].dtype)
          for k, name in zip(keys, names, strict=True)}
    return mirrored_langevin_noise(xi, theta, alpha, lik_drift, eps)


def mirrored_langevin_noise(
    xi: dict, theta: dict, alpha: dict, lik_drift: dict, eps: jax.Array
) -> tuple[dict, jax.Array]:
    """:func:`mirrored_langevin` with the standard normal draws ``xi`` (a dict as ``theta``)
    given: the step of coupled chains that share their draws."""
    out, mirrored = {}, jnp.zeros((), jnp.int32)
    for name in sorted(theta):
        t = theta[name]
        prop = (t + 0.5 * eps * (alpha[name] - t + lik_drift[name])
                + jnp.sqrt(eps * t) * xi[name])
        mirrored = mirrored + jnp.sum(prop < 0).astype(jnp.int32)
        out[name] = jnp.maximum(jnp.abs(prop), jnp.finfo(t.dtype).tiny)
    return out, mirrored


def _datum_terms(potential: Potential, pi: dict, data: ModelData) -> Callable:
    """``one(i) -> h_i``: datum i's θ ⊙ ∇_θ log p(x_i | π), flattened over the sites in
    sorted order."""
    dtype = jax.tree.leaves(pi)[0].dtype

    def one(i):
        g = likelihood_grad(potential, pi, i[None], jnp.ones((1,), dtype), data)
        h = expanded_mean_grad(pi, g)
        return jnp.concatenate([h[k].reshape(-1) for k in sorted(h)])

    return one


@partial(jax.jit, static_argnums=(0, 3))
def datum_drifts(potential: Potential, pi: dict, data: ModelData,
                 chunk_size: int = DEFAULT_CHUNK) -> jax.Array:
    """Per-datum h_i = θ ⊙ ∇_θ log p(x_i | π) at ``pi``, flattened over the sites in sorted
    order: (N, d), one data pass (the default features of the stratified estimator)."""
    one = _datum_terms(potential, pi, data)
    return map_data(jax.vmap(one), potential.num_data, chunk_size)


class DriftMoments(NamedTuple):
    """Full-data moments of the per-datum drifts h_i = θ ⊙ ∇_θ log p(x_i | π) at a point,
    flattened over the sites in sorted order: ``total`` Σ_i h_i, ``fisher`` Σ_i h_i² (the
    diagonal of the empirical Fisher information in the metric diag(θ), times θ), and
    ``noise`` diag Cov[Σ_j w_j h_{i_j}] under a design's second moments."""

    total: jax.Array
    fisher: jax.Array
    noise: jax.Array


@partial(jax.jit, static_argnums=(0, 4, 5))
def drift_noise(potential: Potential, pi: dict, data: ModelData, moments: DesignMoments,
                chunk_size: int = DEFAULT_CHUNK, noise: bool = True) -> DriftMoments:
    """The :class:`DriftMoments` at ``pi``, the covariance from the design's second
    ``moments`` (no N × d array): Σ_g [Σ_{i∈g} a_i (h_i − m_g)² − w_g (S_g − n_g m_g)²], equal
    to Σ_i a_i h_i² − Σ_g w_g S_g² for designs whose datum weight a is constant within a
    group g of n_g data with w_g = a/n_g (uniform and stratified), but without its
    cancellation in float32 when the data of a group have (nearly) equal h_i: the shift m_g
    is the group mean from a first pass. Two data passes; ``noise=False``: one, and
    ``noise`` is zeros."""
    one = _datum_terms(potential, pi, data)
    N, d = potential.num_data, sum(int(np.prod(v.shape)) for v in pi.values())
    dtype = jax.tree.leaves(pi)[0].dtype
    groups = 1 if moments.labels is None else int(moments.group_weight.shape[0])
    a = jnp.broadcast_to(jnp.asarray(moments.datum_weight, dtype), (N,))

    def labels(idx):
        return jnp.zeros(idx.shape, jnp.int32) if moments.labels is None else moments.labels[idx]

    def first(idx, mask):
        m = mask.astype(dtype)
        h = jax.vmap(one)(idx) * m[:, None]
        return (jnp.sum(h, 0), jnp.sum(h * h, 0), jax.ops.segment_sum(h, labels(idx), groups),
                jax.ops.segment_sum(m, labels(idx), groups))

    zero = (jnp.zeros((d,), dtype), jnp.zeros((d,), dtype), jnp.zeros((groups, d), dtype),
            jnp.zeros((groups,), dtype))
    total, fisher, sums, counts = scan_chunks(first, N, chunk_size, zero)
    if not noise:
        return DriftMoments(total=total, fisher=fisher, noise=jnp.zeros_like(total))
    shift = sums / jnp.maximum(counts, 1.0)[:, None]

    def second(idx, mask):
        lab = labels(idx)
        r = (jax.vmap(one)(idx) - shift[lab]) * mask.astype(dtype)[:, None]
        return jnp.sum(a[idx][:, None] * r * r, 0)

    s1 = scan_chunks(second, N, chunk_size, jnp.zeros((d,), dtype))
    weight = jnp.broadcast_to(jnp.asarray(moments.group_weight, dtype), (groups,))
    rest = sums - counts[:, None] * shift
    return DriftMoments(total=total, fisher=fisher, noise=s1 - weight @ (rest * rest))


def flatten_sites(tree: dict) -> np.ndarray:
    """The values of ``tree`` flattened over the sites in sorted order (float64)."""
    return np.concatenate([np.ravel(np.asarray(tree[k], np.float64)) for k in sorted(tree)])


def unflatten_sites(flat: np.ndarray, like: dict) -> dict:
    """Inverse of :func:`flatten_sites` for the shapes of ``like``."""
    out, start = {}, 0
    for k in sorted(like):
        size = int(np.prod(np.shape(like[k])))
        out[k] = flat[start:start + size].reshape(np.shape(like[k]))
        start += size
    return out


def relaxation_rates(fisher: np.ndarray, theta: np.ndarray, like: dict) -> np.ndarray:
    """λ_r = 1 + max_k F_k / θ_k over each simplex row r, broadcast along it: the largest
    relaxation rate of the linearised drift (time units ε/2) in row r, from the diagonal
    F of the empirical Fisher information (:class:`DriftMoments`; 1 from the Gamma prior).
    For categorical counts F_k / θ_k = N (1 − π_k) / S at the posterior mean."""
    ratio = unflatten_sites(fisher / np.maximum(theta, 1e-300), like)
    return 1.0 + flatten_sites({k: np.broadcast_to(np.max(v, -1, keepdims=True), v.shape)
                                for k, v in ratio.items()})


def em_point(potential: Potential, pi: dict, alpha: dict, totals: dict, data: ModelData,
             moments: DesignMoments, iters: int = 10, chunk_size: int = DEFAULT_CHUNK,
             tol: float = 0.02, measure: Callable | None = None
             ) -> tuple[dict, DriftMoments, int]:
    """Scoring steps of the noise-free expanded-mean drift from ``pi`` (one data pass each),
    at most ``iters``, until no π_k changes by more than the fraction ``tol``; the point
    reached, the :class:`DriftMoments` there (under ``moments``, two passes) and the number
    of steps.

    With θ = S π (S = ``totals``, per row) a step is θ ← θ + (α − θ + Σ_i h_i) / λ_r,
    λ_r of :func:`relaxation_rates` at the current point (a Fisher-scoring step in the metric
    diag(θ)), then π = θ / Σθ. Its fixed point is the zero of the noise-free drift (for
    categorical counts the posterior mean (α + n) / (Σα + N), reached in one step when λ_r
    is measured there); a step shrinks the error by about (λ̂ − λ)/λ̂ when the measured λ̂
    overestimates the rate λ. θ is floored at 10⁻³ α. ``measure(pi, final)`` replaces
    :func:`drift_noise` (e.g. with local sites,
    :func:`~numpyro_subsample.sgmcmc.simplex_local.local_drift_moments`)."""
    a, s = flatten_sites(alpha), flatten_sites(totals)
    dtype = jax.tree.leaves(pi)[0].dtype
    done = 0
    while True:
        final = done == int(iters)
        dm = (drift_noise(potential, pi, data, moments, chunk_size, final) if measure is None
              else measure(pi, final))
        if final:
            return pi, dm, done
        old = flatten_sites(pi)
        theta = s * old
        lam = relaxation_rates(np.asarray(dm.fisher, np.float64), theta, pi)
        theta = theta + (a - theta + np.asarray(dm.total, np.float64)) / lam
        theta = np.maximum(theta, 1e-3 * a)
        pi = to_simplex({k: jnp.asarray(v, dtype)
                         for k, v in unflatten_sites(theta, pi).items()})
        done += 1
        if np.max(np.abs(flatten_sites(pi) - old) / np.maximum(old, 1e-30)) < tol:
            iters = done  # converged: the next pass measures the moments


class SGRLDConfig(NamedTuple):
    """Static configuration of the compiled step (hashable; equal configs share code)."""

    potential: Potential
    draw: Callable  # SamplingDesign.draw
    size: int
    rng_impl: str
    local: LocalConfig = LocalConfig()


def estimated_drift(cfg: SGRLDConfig, params: SGRLDParams, pi: dict, key: jax.Array,
                    local: LocalState | None, data: ModelData) -> tuple[dict, LocalState | None]:
    """θ ⊙ ĝ at π from the subsample the design draws with ``key`` (its local latent sites
    first moved given π by their inner update, with the same key; ``local``: their state, None
    without them): the drift of :func:`mirrored_langevin` and the local sites' next state."""
    pot, draw = cfg.potential, cfg.draw
    if pot.local:
        key, k_loc = jax.random.split(key)
        idx, w = draw(params.design, key)
        rows, local = update_rows(
            cfg.local, pot.local, k_loc, local, idx,
            lambda r: pot.local_joint_at(pi, r, idx, data), lambda: pi, data,
        )
        ww = w.astype(params.schedule.dtype)
        grad_pi = jax.grad(lambda q: jnp.dot(ww, pot.local_joint_at(q, rows, idx, data)))(pi)
    else:
        idx, w = draw(params.design, key)
        grad_pi = likelihood_grad(pot, pi, idx, w, data)
    return expanded_mean_grad(pi, grad_pi), local


@lru_cache(maxsize=64)
def sgrld_programs(cfg: SGRLDConfig) -> tuple[Callable, Callable]:
    """Pure ``init_one(key, init_params, data, params)`` and ``step(state, data)``.

    ``init_one`` draws π from its Dirichlet(α) prior (or takes ``init_params``, simplex
    values per site) and sets θ = S π with the total S = Σ_k α_k of each simplex row, the mean
    of its Gamma(Σα, 1) law. S is independent of π under the target and only sets the clock
    of π's diffusion (the time change t/S), which the default step rule assumes; a drawn S
    would give chains with S ≪ Σα a larger effective step (:class:`SGRLD`).

    With local latent sites (:mod:`numpyro_subsample.estimators.local`) each step first moves
    the subsample's local values given π and takes G = ∇_π Σ_j w_j [log p(z_j | π) +
    log p(x_j | z_j, π)] with them.
    """
    pot, size = cfg.potential, cfg.size
    inv_n = 1.0 / pot.num_data

    def step(state: SGRLDState, data: ModelData) -> SGRLDState:
        p = state.params
        key, k_dyn, k_est = split_step_key(state.rng_key, cfg.rng_impl)
        eps = step_size_at(p.schedule, state.i)
        drift, local = estimated_drift(cfg, p, state.pi, k_est, state.local, data)
        theta, mirrored = mirrored_langevin(k_dyn, state.theta, p.alpha, drift, eps)
        pi = to_simplex(theta)
        ok = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(v)) for v in jax.tree.leaves(pi)]))
        keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
        return SGRLDState(
            i=state.i + 1, pi=jax.tree.map(keep, pi, state.pi),
            theta=jax.tree.map(keep, theta, state.theta), step_size=eps, mirrored=mirrored,
            diverging=~ok, subsample_size=jnp.asarray(size, jnp.int32),
            data_passes=state.data_passes + size * inv_n, rng_key=key, params=p, local=local,
        )

    def init_one(rng_key, init_params, data, params: SGRLDParams) -> SGRLDState:
        del data
        k_theta, key = jax.random.split(rng_key)
        names = sorted(params.alpha)
        theta = {}
        for k, name in zip(jax.random.split(k_theta, len(names)), names, strict=True):
            a = params.alpha[name]
            total = jnp.sum(a, -1, keepdims=True)
            if init_params is None:
                t = jnp.maximum(jax.random.gamma(k, a, dtype=a.dtype), jnp.finfo(a.dtype).tiny)
                pi0 = t / jnp.sum(t, -1, keepdims=True)
            else:
                pi0 = jnp.asarray(init_params[name], a.dtype)
            theta[name] = jnp.maximum(pi0 * total, jnp.finfo(a.dtype).tiny)
        dtype = params.schedule.dtype
        local = (init_local_state(pot.local, pot.num_data, dtype, cfg.local.init_step)
                 if pot.local else None)
        return SGRLDState(
            i=jnp.zeros((), jnp.int32), pi=to_simplex(theta), theta=theta,
            step_size=step_size_at(params.schedule, jnp.zeros((), jnp.int32)),
            mirrored=jnp.zeros((), jnp.int32), diverging=jnp.zeros((), bool),
            subsample_size=jnp.asarray(size, jnp.int32),
            data_passes=params.data_passes.astype(dtype), rng_key=raw_key(key), params=params,
            local=local,
        )

    return init_one, step
