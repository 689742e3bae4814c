"""Variance-reduced estimators whose control variate moves with the chain: SAGA and SVRG.

Dubey, Reddi, Póczos, Smola and Xing (2016) replace the fixed centre θ̂ of SGLD-CV (Baker,
Fearnhead, Fox and Nemeth 2019, Sect. 3.1, Eq. 4) by past states of the chain; Baker et al.
(2019, end of Sect. 3.1) compare the two. With f = −log posterior, a uniform subsample S of n
indices and weights N/n (with or without replacement,
:func:`~numpyro_subsample.estimators.selection.uniform_design`):

- SAGA-LD keeps a table α (N, d) of the last gradient seen for every datum and its sum,

      g(θ) = ∇f0(θ) + Σ_i α_i + (N/n) Σ_{j∈S} [∇f_{i_j}(θ) − α_{i_j}],   then α_{i_j} ← ∇f_{i_j}(θ);

- SVRG-LD keeps an anchor θ̃ and the full sum Σ_i ∇f_i(θ̃),

      g(θ) = ∇f0(θ) + Σ_i ∇f_i(θ̃) + (N/n) Σ_{j∈S} [∇f_{i_j}(θ) − ∇f_{i_j}(θ̃)],

  and sets θ̃ to the current θ every m steps, with one full (chunked) data pass.

Both are unbiased for ∇f(θ) given their state, and both start at the proxy centre: α_i =
∇f_i(θ̂) (the proxy's table, or one data pass when it keeps none) and θ̃ = θ̂, so they start as
SGLD-CV. Their state is per chain: vectorized chains each own a SAGA table, C·N·d numbers
(refused above :data:`SAGA_MAX_TABLE_BYTES`; with ``store_datum_grads=True`` the proxy's table
is kept besides, (C + 1)·N·d), or an SVRG anchor, O(d). SVRG's refresh clock is common to all
chains (``state_axes``), so a vectorized step runs the data pass only on refresh steps.

Drawn with replacement, an index may occur several times in S: the estimate counts every
occurrence (that is what makes it unbiased), while the table is written, and its running sum
changed, once per distinct index (all occurrences carry the same ∇f_i(θ)), so that the stored
sum stays the sum of the table.

Cost per step: SAGA n per-datum gradients at θ (no data pass beyond the subsample); SVRG n
gradients at θ and n at θ̃, plus one data pass every m steps (m = ⌈N/n⌉ by default, one epoch:
twice SGLD-CV's data passes).

Noise: the step-size rule reads the noise of SGLD-CV at θ̂ (same design, control variate at
the proxy centre; :mod:`numpyro_subsample.estimators.noise`). It is the noise of both at their
start, and approximates it while the table or the anchor stays about as close to the chain as
θ̂ is (SVRG's anchor is a recent state, so typically closer). Their noise changes with the
state, so the kernels' noise correction, which assumes a fixed covariance, is off for them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, map_data, scan_chunks
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.base import (
    ControlVariate,
    GradientEstimator,
    control_variate_from_proxy,
    make_estimator,
    weighted_gradient,
)
from numpyro_subsample.estimators.selection import first_occurrences, uniform_design

__all__ = [
    "SAGA_MAX_TABLE_BYTES",
    "SAGAState",
    "SVRGState",
    "build_saga",
    "build_svrg",
    "check_saga_memory",
]

#: The largest SAGA gradient table a kernel allocates, in bytes: N·d·itemsize per chain, times
#: the chains of one ``init`` call (1 GiB).
SAGA_MAX_TABLE_BYTES = 2**30


class SAGAState(NamedTuple):
    """SAGA's per-chain state: the table α (N, d) and its sum Σ_i α_i (d,)."""

    table: jax.Array
    total: jax.Array


class SVRGState(NamedTuple):
    """SVRG's state: the anchor θ̃ (d,), Σ_i ∇f_i(θ̃) (d,) (per chain) and ``age``, the
    updates since the last refresh (int32, common to all chains)."""

    anchor: jax.Array
    anchor_sum: jax.Array
    age: jax.Array


def check_saga_memory(num_data: int, dim: int, dtype, num_chains: int = 1) -> None:
    """Refuse a SAGA table of ``num_chains`` · N · d numbers above :data:`SAGA_MAX_TABLE_BYTES`
    (``ValueError`` naming the sizes, the bytes, the limit and the alternatives)."""
    itemsize = np.dtype(dtype).itemsize
    nbytes = int(num_chains) * int(num_data) * int(dim) * itemsize
    if nbytes > SAGA_MAX_TABLE_BYTES:
        raise ValueError(
            f"estimator='saga' keeps a table of N×d per-datum gradients per chain: "
            f"{num_chains} chain(s) × N={num_data} × d={dim} × {itemsize} bytes = {nbytes:,} "
            f"bytes ({nbytes / 2**30:.2f} GiB), above the limit SAGA_MAX_TABLE_BYTES = "
            f"{SAGA_MAX_TABLE_BYTES:,} bytes (numpyro_subsample.estimators.variance_reduced). "
            "Use estimator='svrg' (O(d) state per chain, one data pass every update_every "
            "steps) or 'cv', or fewer vectorized chains."
        )


def _datum_grads(potential: Potential, theta: jax.Array, idx: jax.Array, data: ModelData):
    """∇f_i(θ) for i in ``idx``: (len(idx), d), one model evaluation per datum (vmapped)."""
    one = lambda i: jax.grad(lambda t: potential.data_terms(t, i[None], data)[0])(theta)
    return jax.vmap(one)(idx)


def _prior_grad(potential: Potential, theta: jax.Array, data: ModelData) -> jax.Array:
    return jax.grad(lambda t: potential.prior(t, data))(theta)


def _full_data_grad(potential: Potential, theta: jax.Array, data: ModelData, chunk_size: int):
    """Σ_i ∇f_i(θ) in one chunked data pass."""

    def chunk_fn(idx, mask):
        return jax.grad(
            lambda t: jnp.dot(mask.astype(t.dtype), potential.data_terms(t, idx, data))
        )(theta)

    return scan_chunks(chunk_fn, potential.num_data, chunk_size, jnp.zeros_like(theta))


def _cv_estimate(potential: Potential, draw: Callable, size: int) -> Callable:
    """The estimate from the initial state: SGLD-CV with ``params = (design, cv, ...)``."""

    def estimate(params, key, theta, data):
        idx, w = draw(params[0], key)
        return weighted_gradient(potential, theta, idx, w, data, params[1]), jnp.asarray(size)

    return estimate


@lru_cache(maxsize=256)
def _saga_programs(potential: Potential, draw: Callable, size: int, chunk_size: int):
    """``(estimate, init_state, update)`` of SAGA with ``params = (design params, cv)``."""
    N = potential.num_data
    estimate = _cv_estimate(potential, draw, size)

    def init_state(params, data):
        cv = params[1]
        if cv.datum_grads is not None:
            table, passes = cv.datum_grads, 0.0
        else:
            table = map_data(
                lambda idx: _datum_grads(potential, cv.centre, idx, data), N, chunk_size
            )
            passes = 1.0
        return SAGAState(table=table, total=table.sum(0)), jnp.asarray(passes, cv.centre.dtype)

    def update(params, state, key, theta, data):
        idx, w = draw(params[0], key)
        new = _datum_grads(potential, theta, idx, data)
        delta = new - state.table[idx]
        g = _prior_grad(potential, theta, data) + state.total + w.astype(theta.dtype) @ delta
        # With replacement an index may repeat: its rows of `new` are equal (same θ, same
        # datum), and the table and its sum change once per distinct index. The table adds
        # the change: XLA updates it in place, where setting the rows read above copied the
        # N × d table at every step.
        first = first_occurrences(idx)
        change = jnp.where(first[:, None], delta, 0.0)
        total = state.total + change.sum(0)
        table = state.table.at[idx].add(change, mode="promise_in_bounds")
        passes = jnp.zeros((), theta.dtype)
        return g, jnp.asarray(size), SAGAState(table=table, total=total), passes

    return estimate, init_state, update


@lru_cache(maxsize=256)
def _svrg_programs(potential: Potential, draw: Callable, size: int, chunk_size: int):
    """``(estimate, init_state, update)`` of SVRG with ``params = (design params, cv, m)``."""
    estimate = _cv_estimate(potential, draw, size)

    def init_state(params, data):
        cv = params[1]
        state = SVRGState(anchor=cv.centre, anchor_sum=cv.sum_grads, age=jnp.zeros((), jnp.int32))
        return state, jnp.zeros((), cv.centre.dtype)

    def update(params, state, key, theta, data):
        age = state.age + 1
        refresh = age >= params[2]
        anchor, anchor_sum = jax.lax.cond(
            refresh,
            lambda: (theta, _full_data_grad(potential, theta, data, chunk_size)),
            lambda: (state.anchor, state.anchor_sum),
        )
        idx, w = draw(params[0], key)
        g = weighted_gradient(potential, theta, idx, w, data,
                              ControlVariate(centre=anchor, sum_grads=anchor_sum))
        passes = jnp.where(refresh, 1.0, 0.0).astype(theta.dtype)
        new = SVRGState(anchor=anchor, anchor_sum=anchor_sum,
                        age=jnp.where(refresh, 0, age).astype(jnp.int32))
        return g, jnp.asarray(size), new, passes

    return estimate, init_state, update


def _proxy_cv(name: str, proxy) -> ControlVariate:
    if proxy is None:
        raise ValueError(
            f"estimator={name!r} starts its control variate at the proxy centre θ̂ (Σ_i ∇f_i(θ̂)"
            "); pass proxy='laplace' or a Proxy."
        )
    return control_variate_from_proxy(proxy)


def build_saga(potential: Potential, data: ModelData, proxy, *, subsample_size: int,
               replace: bool = True, rng_key: jax.Array | None = None,
               chunk_size: int = DEFAULT_CHUNK) -> GradientEstimator:
    """SAGA-LD (Dubey et al. 2016; module docstring): a per-chain table of the last gradient
    of every datum, initialised at the proxy centre (one data pass per ``init`` call when the
    proxy keeps no ∇f_i(θ̂) table). Memory N·d per chain (:func:`check_saga_memory`)."""
    cv = _proxy_cv("saga", proxy)
    dtype = potential.init_theta.dtype
    check_saga_memory(potential.num_data, potential.dim, dtype)
    design = uniform_design(potential.num_data, subsample_size, replace, dtype)
    base = make_estimator(potential, design, cv, name="saga")
    estimate, init_state, update = _saga_programs(
        potential, design.draw, design.size, int(chunk_size)
    )
    return base._replace(estimate=estimate, init_state=init_state, update=update,
                         info={"table_bytes": potential.num_data * potential.dim
                               * np.dtype(dtype).itemsize})


def build_svrg(potential: Potential, data: ModelData, proxy, *, subsample_size: int,
               replace: bool = True, rng_key: jax.Array | None = None,
               chunk_size: int = DEFAULT_CHUNK, update_every: int | None = None
               ) -> GradientEstimator:
    """SVRG-LD (Dubey et al. 2016; module docstring): anchor θ̃ = θ̂ at the start, set to the
    current θ at every ``update_every``-th step (steps m, 2m, ... of the chain) with one data
    pass.

    Parameters
    ----------
    update_every
        m, the steps between refreshes of the anchor (default ⌈N/n⌉: one data pass per epoch
        of subsamples).
    """
    cv = _proxy_cv("svrg", proxy)
    N, n = potential.num_data, int(subsample_size)
    m = -(-N // n) if update_every is None else int(update_every)
    design = uniform_design(N, n, replace, potential.init_theta.dtype)
    base = make_estimator(potential, design, cv, name="svrg")
    estimate, init_state, update = _svrg_programs(potential, design.draw, design.size,
                                                  int(chunk_size))
    return base._replace(
        estimate=estimate, params=(design.params, cv, jnp.asarray(m, jnp.int32)),
        init_state=init_state, update=update,
        state_axes=SVRGState(anchor=0, anchor_sum=0, age=None), info={"update_every": m},
    )
