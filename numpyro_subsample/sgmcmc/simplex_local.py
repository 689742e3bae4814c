"""The measured gradient noise of SGRLD with local latent sites.

With local sites z_i inside the plate (e.g. LDA's per-document topic proportions) SGRLD's
drift of datum i is h_i(z_i) = θ ⊙ ∇_θ [log p(z_i | π) + log p(x_i | z_i, π)] with z_i drawn
by the kernel's inner update (:class:`~numpyro_subsample.estimators.local.LocalConfig`) given
π. Its mean over z_i | x_i, π is the marginal drift (Fisher's identity), and the estimator's
noise holds both the spread between the data and the spread of h_i over z_i
(Var h = Var_i E[h_i | x_i] + E_i Var(h_i | x_i)): a single draw of every datum's z_i, after
``sweeps`` inner updates from the kernel's warm starts, gives per-datum drifts whose design
variance is the estimator's (the noise V_k of the step rule of
:class:`~numpyro_subsample.sgmcmc.sgrld.SGRLD`) and whose Σ_i h_i² bounds the Fisher
information from above (a smaller, safe step). Two passes over chunks of the data; memory
chunk × d and the local sites' N rows.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.estimators.local import LocalConfig, LocalState, update_rows
from numpyro_subsample.estimators.selection import DesignMoments
from numpyro_subsample.sgmcmc.simplex import DriftMoments, expanded_mean_grad

__all__ = ["LOCAL_SWEEPS", "local_datum_drifts", "local_drift_moments"]

#: Inner updates of every datum's local sites at π before its drift is read.
LOCAL_SWEEPS = 3


def _drifts(potential: Potential, pi: dict, rows: dict, idx: jax.Array,
            data: ModelData) -> jax.Array:
    """(m, d): h_i(z_i) for the rows ``idx`` with local values ``rows``, flattened over the
    sites in sorted order."""

    def one(i, r):
        row = {k: v[None] for k, v in r.items()}
        g = jax.grad(lambda q: potential.local_joint_at(q, row, i[None], data)[0])(pi)
        h = expanded_mean_grad(pi, g)
        return jnp.concatenate([h[k].reshape(-1) for k in sorted(h)])

    return jax.vmap(one)(idx, rows)


@partial(jax.jit, static_argnums=(0, 1, 7, 8))
def local_drift_moments(potential: Potential, cfg: LocalConfig, pi: dict, state: LocalState,
                        key: jax.Array, data: ModelData, moments: DesignMoments,
                        chunk_size: int, sweeps: int = LOCAL_SWEEPS
                        ) -> tuple[DriftMoments, LocalState]:
    """The :class:`~numpyro_subsample.sgmcmc.simplex.DriftMoments` of h_i(z_i) at ``pi``
    (module docstring), z_i after ``sweeps`` inner updates from ``state``, the noise under the
    design's second ``moments`` (shifted by the group means, as
    :func:`~numpyro_subsample.sgmcmc.simplex.drift_noise`); and the local sites' new state.
    ``sweeps`` + 2 passes of the data."""
    N = potential.num_data
    chunk = min(int(chunk_size), N)
    num_chunks = -(-N // chunk)
    d = sum(int(np.prod(v.shape)) for v in pi.values())
    dtype = jax.tree.leaves(pi)[0].dtype
    groups = 1 if moments.labels is None else int(moments.group_weight.shape[0])
    a = jnp.broadcast_to(jnp.asarray(moments.datum_weight, dtype), (N,))

    def labels(idx):
        return jnp.zeros(idx.shape, jnp.int32) if moments.labels is None else moments.labels[idx]

    def rows_of(c):
        idx = c * chunk + jax.lax.iota(jnp.int32, chunk)
        mask = idx < N
        return jnp.where(mask, idx, 0), mask.astype(dtype)

    def first(carry, c):
        (total, fisher, sums, counts), st = carry
        idx, m = rows_of(c)
        for k in jax.random.split(jax.random.fold_in(key, c), int(sweeps)):
            rows, st = update_rows(
                cfg, potential.local, k, st, idx,
                lambda r: potential.local_joint_at(pi, r, idx, data), lambda: pi, data)
        h = _drifts(potential, pi, rows, idx, data) * m[:, None]
        lab = labels(idx)
        return ((total + h.sum(0), fisher + (h * h).sum(0),
                 sums + jax.ops.segment_sum(h, lab, groups),
                 counts + jax.ops.segment_sum(m, lab, groups)), st), None

    zero = (jnp.zeros((d,), dtype), jnp.zeros((d,), dtype), jnp.zeros((groups, d), dtype),
            jnp.zeros((groups,), dtype))
    ((total, fisher, sums, counts), state), _ = jax.lax.scan(
        first, (zero, state), jnp.arange(num_chunks, dtype=jnp.int32))
    shift = sums / jnp.maximum(counts, 1.0)[:, None]

    def second(acc, c):
        idx, m = rows_of(c)
        rows = {k: v[idx] for k, v in state.values.items()}
        r = (_drifts(potential, pi, rows, idx, data) - shift[labels(idx)]) * m[:, None]
        return acc + jnp.sum(a[idx][:, None] * r * r, 0), None

    s1, _ = jax.lax.scan(second, jnp.zeros((d,), dtype), jnp.arange(num_chunks, dtype=jnp.int32))
    weight = jnp.broadcast_to(jnp.asarray(moments.group_weight, dtype), (groups,))
    rest = sums - counts[:, None] * shift
    return DriftMoments(total=total, fisher=fisher, noise=s1 - weight @ (rest * rest)), state


@partial(jax.jit, static_argnums=(0, 1, 6, 7))
def local_datum_drifts(potential: Potential, cfg: LocalConfig, pi: dict, state: LocalState,
                       key: jax.Array, data: ModelData, chunk_size: int,
                       sweeps: int = LOCAL_SWEEPS) -> tuple[jax.Array, LocalState]:
    """The per-datum drifts h_i(z_i) at ``pi`` as an (N, d) table (the default features of the
    stratified design with local sites), z_i after ``sweeps`` inner updates from ``state``;
    and the local sites' new state. ``sweeps`` + 1 passes of the data."""
    N = potential.num_data
    chunk = min(int(chunk_size), N)
    d = sum(int(np.prod(v.shape)) for v in pi.values())
    dtype = jax.tree.leaves(pi)[0].dtype

    def body(carry, c):
        table, st = carry
        idx = c * chunk + jax.lax.iota(jnp.int32, chunk)
        mask = idx < N
        idx = jnp.where(mask, idx, 0)
        for k in jax.random.split(jax.random.fold_in(key, c), int(sweeps)):
            rows, st = update_rows(
                cfg, potential.local, k, st, idx,
                lambda r: potential.local_joint_at(pi, r, idx, data), lambda: pi, data)
        h = _drifts(potential, pi, rows, idx, data)
        table = table.at[idx].set(jnp.where(mask[:, None], h, table[idx]))
        return (table, st), None

    (table, state), _ = jax.lax.scan(body, (jnp.zeros((N, d), dtype), state),
                                     jnp.arange(-(-N // chunk), dtype=jnp.int32))
    return table, state
