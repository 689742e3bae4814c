"""Data shards on JAX devices: the sharded programs of
:class:`~numpyro_subsample.sgmcmc.distributed.DistributedSGLD` (Ahn, Shahbaba and Welling 2014);
the layout and the selection law are :mod:`numpyro_subsample.sgmcmc.shard_selection`.

The arrays of the model's data with N rows (``Potential.data_leaves``) are cut into S
contiguous blocks of N_s rows, padded to a common length M and placed one per device of a
one-axis mesh. Every program here is a module-level function of static configuration
(:class:`_Shards`: the potential, the shard-local estimate, the mesh, the sizes) and of arrays
(the state's ``params``), run with :func:`jax.shard_map`: each device evaluates the ordinary
potential on its own rows.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from numpyro.primitives import Messenger

from numpyro_subsample.core.datapass import map_data
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.base import ControlVariate
from numpyro_subsample.sgmcmc.chain import SamplerParams, SGMCMCState
from numpyro_subsample.sgmcmc.shard_selection import ShardLayout, shard_design, shard_layout

__all__ = ["ShardLayout", "shard_layout", "shard_design", "ShardParams"]


# -- the shard-local potential ------------------------------------------------------------------
class _full_plate_scale(Messenger):
    """Scale the sites of plate ``name`` as for a plate of ``size`` (= N) elements.

    On a shard the model sees M rows: a plate sized by its data (``plate(name, len(X))``)
    scales its sites by M/m instead of N/m. This handler restores N/m, so that
    ``Potential.terms(θ, idx, shard_data)`` returns the f_i of the shard's rows ``idx``.
    """

    def __init__(self, fn=None, name: str = "", size: int = 1):
        self.name, self.size, self.local_size = name, size, size
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] == self.name:
            self.local_size = msg["args"][0]
        elif msg["type"] == "sample":
            frame = next((f for f in msg["cond_indep_stack"] if f.name == self.name), None)
            if frame is not None:
                scale = 1.0 if msg["scale"] is None else msg["scale"]
                if self.local_size != frame.size:  # what the plate applied
                    scale = scale * frame.size / self.local_size
                msg["scale"] = scale * self.size / frame.size


class ShardParams(NamedTuple):
    """The arrays of the distributed estimator (the ``estimator`` slot of ``SamplerParams``).

    ``data``: the model's data with the arrays at ``Potential.data_leaves`` as (S, M, ...)
    blocks sharded over the mesh (others replicated); ``weights``: (N_s/n)/q_s; ``cv``: the
    control variate with Σ_i ∇f_i(θ̂) and the sharded (S, M, d) table of ∇f_i(θ̂), or None.
    """

    data: ModelData
    weights: jax.Array
    trajectory_lengths: jax.Array
    cv: ControlVariate | None


class _Shards(NamedTuple):
    """Static configuration of the sharded programs (hashable)."""

    potential: Potential
    estimate: Callable  # the shard-local estimate(((s, weights), cv), key, θ, data)
    mesh: Mesh
    sizes: tuple[int, ...]
    chunk_size: int


_STATE_AXES = SGMCMCState(**dict.fromkeys(SGMCMCState._fields, 0))._replace(params=None)


def _axis(cfg: _Shards) -> str:
    return cfg.mesh.axis_names[0]


def _data_specs(data: ModelData, leaves: tuple[int, ...], axis: str) -> ModelData:
    specs = tuple(P(axis) if i in leaves else P() for i in range(len(data.arrays)))
    return ModelData.tree_unflatten(data.static, specs)


def _param_specs(cfg: _Shards, params: SamplerParams) -> SamplerParams:
    axis, sp = _axis(cfg), params.estimator
    cv = None if sp.cv is None else ControlVariate(centre=P(), sum_grads=P(), datum_grads=P(axis))
    data = _data_specs(sp.data, cfg.potential.data_leaves, axis)
    shard = ShardParams(data=data, weights=P(), trajectory_lengths=P(), cv=cv)
    return SamplerParams(centre=P(), scale_tril=P(), step_size=P(), estimator=shard,
                         init_tril=P(), data_passes=P())


def _chain_specs(cfg: _Shards) -> SGMCMCState:
    return SGMCMCState(**dict.fromkeys(SGMCMCState._fields, P(_axis(cfg))))._replace(params=None)


def _local_data(cfg: _Shards, data: ModelData) -> ModelData:
    leaves = cfg.potential.data_leaves
    arrays = tuple(a[0] if i in leaves else a for i, a in enumerate(data.arrays))
    return ModelData.tree_unflatten(data.static, arrays)


def _shard_view(cfg: _Shards, params: SamplerParams):
    """Inside ``shard_map``: the device's shard index s, its ``SamplerParams`` (estimator
    params of the shard-local estimate) and its data rows."""
    s = jax.lax.axis_index(_axis(cfg))
    sp = params.estimator
    cv = None if sp.cv is None else sp.cv._replace(datum_grads=sp.cv.datum_grads[0])
    return s, params._replace(estimator=((s, sp.weights), cv)), _local_data(cfg, sp.data)


def _on_shards(cfg: _Shards, body: Callable, in_specs, out_specs) -> Callable:
    pot = cfg.potential

    def scaled(*args):
        with _full_plate_scale(name=pot.plate.name, size=pot.num_data):
            return body(*args)

    return jax.shard_map(
        scaled, mesh=cfg.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
    )


@partial(jax.jit, static_argnames=("cfg",))
def _datum_grad_tables(cfg: _Shards, centre: jax.Array, data: ModelData) -> jax.Array:
    """∇f_i(θ̂) of each shard's rows, computed on its device (one pass): (S, M, d)."""
    pot, M, axis = cfg.potential, max(cfg.sizes), _axis(cfg)

    def body(centre, data):
        local = _local_data(cfg, data)

        def one(i):
            return jax.grad(lambda t: pot.data_terms(t, i[None], local)[0])(centre)

        g = map_data(jax.vmap(one), M, cfg.chunk_size)
        valid = jnp.arange(M) < jnp.asarray(cfg.sizes)[jax.lax.axis_index(axis)]
        return jnp.where(valid[:, None], g, 0.0)[None]

    specs = (P(), _data_specs(data, pot.data_leaves, axis))
    return _on_shards(cfg, body, specs, P(axis))(centre, data)


@partial(jax.jit, static_argnames=("cfg",))
def _shard_estimates(cfg: _Shards, params: SamplerParams, keys: jax.Array, thetas: jax.Array):
    """g_s(θ_p) (Eq. 1, estimates ∇f) for every shard s, point p and key k: (S, P, K, d)."""

    def body(params, keys, thetas):
        s, local, data = _shard_view(cfg, params)

        def at(theta, ks):
            def one(k):
                return cfg.estimate(local.estimator, jax.random.fold_in(k, s), theta, data)[0]

            return jax.vmap(one)(ks)

        return jax.vmap(at)(thetas, keys)[None]

    specs = (_param_specs(cfg, params), P(), P())
    return _on_shards(cfg, body, specs, P(_axis(cfg)))(params, keys, thetas)


@partial(jax.jit, static_argnames=("cfg", "num_points", "num_draws"))
def _shard_noise(cfg, params, q, key, spread, num_points, num_draws):
    """Within-shard noise covariance E_s[Cov(Lᵀg_s)] and between-shard covariance of the
    shard means, in whitened coordinates, averaged over points θ ~ N(θ̂, spread² Σ̂)."""
    centre, tril = params.centre, params.scale_tril
    k_pts, k_draws = jax.random.split(key)
    ws = spread * jax.random.normal(k_pts, (num_points, centre.shape[0]), centre.dtype)
    keys = jax.vmap(lambda k: jax.random.split(k, num_draws))(
        jax.random.split(k_draws, num_points)
    )
    g = _shard_estimates(cfg, params, keys, centre + ws @ tril.T) @ tril  # (S, P, K, d)
    m = g.mean(2)
    r = g - m[:, :, None]
    within = jnp.einsum("s,spki,spkj->ij", q, r, r) / ((num_draws - 1) * num_points)
    dm = m - jnp.einsum("s,spi->pi", q, m)
    between = jnp.einsum("s,spi,spj->ij", q, dm, dm) / num_points
    return within, between


@partial(jax.jit, static_argnames=("cfg", "init_one"))
def _init_chains(cfg: _Shards, init_one: Callable, keys, init_params, params: SamplerParams):
    """The core's per-chain init, on each device for its chains with its shard's estimator."""

    def body(keys, init_params, params):
        _, local, data = _shard_view(cfg, params)
        init = jax.vmap(init_one, in_axes=(0, 0, None, None), out_axes=_STATE_AXES)
        return init(keys, init_params, data, local)._replace(params=None)

    specs = (P(_axis(cfg)), P(_axis(cfg)), _param_specs(cfg, params))
    return _on_shards(cfg, body, specs, _chain_specs(cfg))(keys, init_params, params)


@lru_cache(maxsize=64)
def _cycle(cfg: _Shards, step: Callable, single: bool) -> Callable:
    """One MCMC draw: S trajectories of the core's ``step``, a ``ppermute`` after each."""
    axis, S = _axis(cfg), len(cfg.sizes)
    ring = [(i, (i + 1) % S) for i in range(S)]
    vstep = jax.vmap(step, in_axes=(_STATE_AXES, None), out_axes=_STATE_AXES)

    def body(chains, params):
        s, local, data = _shard_view(cfg, params)
        # The gradient for the next step travels with the chain, so the first step on a new
        # shard uses the last gradient of the previous one; each shard's gradients are still
        # used τ_s times per cycle, which is what Prop. 1.1 needs.
        def trajectory(_, st):
            tau = params.estimator.trajectory_lengths[s]
            st = jax.lax.fori_loop(0, tau, lambda _, x: vstep(x, data), st)
            hop = lambda a: jax.lax.ppermute(a, axis, ring)  # noqa: E731
            return jax.tree.map(hop, st._replace(params=None))._replace(params=local)

        out = jax.lax.fori_loop(0, S, trajectory, chains._replace(params=local))
        return out._replace(params=None)

    @jax.jit
    def cycle(state: SGMCMCState, data: ModelData) -> SGMCMCState:
        del data  # the shards travel in state.params
        params, chains = state.params, state._replace(params=None)
        if single:
            chains = jax.tree.map(lambda a: a[None], chains)
        specs = (_chain_specs(cfg), _param_specs(cfg, params))
        chains = _on_shards(cfg, body, specs, _chain_specs(cfg))(chains, params)
        if single:
            chains = jax.tree.map(lambda a: a[0], chains)
        return chains._replace(params=params)

    return cycle


def _place(data: ModelData, leaves: tuple[int, ...], layout: ShardLayout, mesh: Mesh):
    """The data with the arrays at ``leaves`` cut into (S, M, ...) blocks, one per device, each
    padded with copies of its first row (never drawn); the other arrays replicated."""
    shard, rep = NamedSharding(mesh, P(mesh.axis_names[0])), NamedSharding(mesh, P())
    arrays = []
    for i, a in enumerate(data.arrays):
        if i not in leaves:
            arrays.append(jax.device_put(a, rep))
            continue
        host, blocks = np.asarray(a), []
        for off, size in zip(layout.offsets, layout.sizes, strict=True):
            block = host[off : off + size]
            pad = np.repeat(block[:1], layout.max_size - size, 0)
            blocks.append(np.concatenate([block, pad], 0))
        arrays.append(jax.device_put(np.stack(blocks), shard))
    return ModelData.tree_unflatten(data.static, tuple(arrays))

