"""Distributed SGLD over data shards on JAX devices (Ahn, Shahbaba and Welling 2014).

The arrays of the model's data with N rows are split into S contiguous shards of sizes N_s and
placed one shard per device of a one-axis :class:`jax.sharding.Mesh`; they never move again
(:mod:`numpyro_subsample.sgmcmc.shards`). The chains (``num_chains = k·S``) are spread k per
device. Inside one :func:`jax.shard_map`, each device runs a trajectory of τ_s steps of the
SGLD step of :mod:`numpyro_subsample.sgmcmc.kernel` for the chains it holds, with the ordinary
potential evaluated on its own rows and the shard-local estimator of Ahn et al. (2014,
supplement Prop. 1.1, Eq. 1), written as a full-data gradient estimate,

    g_s(θ) = ∇f0(θ) + Σ_i ∇c_i + (1/q_s)(N_s/n) Σ_{j∈S_s} [∇f_{i_j}(θ) − ∇c_{i_j}]

(N ḡ_d of Eq. 1 plus the prior and control-variate terms), then hands its chains to the next
device with :func:`jax.lax.ppermute` (a ring rotation: only chain states travel).

One ``sample`` call of NumPyro's ``MCMC`` is one *cycle*: S trajectories, after which every
chain has visited every shard once and is back on its home device (chain c stays chain c).
The draws are the SGLD chain thinned by the cycle length Σ_s τ_s.

Schedules (the scheduler is the ring, which chooses each worker once per cycle):

- fixed trajectory length τ (Cor. 1.2): τ_s = τ; the realised frequencies, hence the weights
  of Eq. 1, are q_s = 1/S (valid for unequal N_s);
- adaptive lengths (Cor. 1.3): τ_s = round(τ̄ S q_s) ≥ 1 for frequencies q_s (default N_s/N,
  user-settable, e.g. small for a slow worker); the estimator uses the realised frequencies
  τ_s / Σ_t τ_t, so rounding never biases it. Devices with short trajectories wait at the
  ``ppermute``, as a fast worker would.

Estimators per shard: ``"uniform"`` (Eq. 1 as printed) and ``"cv"`` (control variates at the
proxy centre θ̂; the ∇f_i(θ̂) of a shard are computed and kept on its device, and the
estimator adds their total, one d-vector, so the shard choice only scales the residuals).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from numpyro.util import is_prng_key

from numpyro_subsample.core.adapter import preprocess_keys
from numpyro_subsample.core.options import check_options
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.base import ControlVariate, make_estimator
from numpyro_subsample.estimators.selection import SamplingDesign
from numpyro_subsample.sgmcmc import step_bias
from numpyro_subsample.sgmcmc.chain import Preprocessed, SamplerParams, SGMCMCState
from numpyro_subsample.sgmcmc.kernel import SGLD
from numpyro_subsample.sgmcmc.options import NoiseOptions, check_record, legacy_records
from numpyro_subsample.sgmcmc.preprocess import check_given_start
from numpyro_subsample.sgmcmc.shard_selection import local_draw, shard_weights
from numpyro_subsample.sgmcmc.shards import (
    ShardLayout,
    ShardParams,
    _cycle,
    _datum_grad_tables,
    _init_chains,
    _place,
    _shard_estimates,
    _shard_noise,
    _Shards,
    shard_design,
    shard_layout,
)

__all__ = [
    "DISTRIBUTED_ESTIMATORS",
    "DistributedPreprocessed",
    "DistributedSetup",
    "DistributedSGLD",
    "ShardFacts",
    "ShardLayout",
    "ShardParams",
    "shard_design",
    "shard_layout",
]

DISTRIBUTED_ESTIMATORS = ("uniform", "cv")


class ShardFacts(NamedTuple):
    """The shard layout and the measured noise within and between shards (the v_within and
    v_between of the default step size, :class:`DistributedSGLD`)."""

    layout: ShardLayout
    noise_within: float
    noise_between: float


class DistributedPreprocessed(NamedTuple):
    """The core's :class:`~numpyro_subsample.sgmcmc.kernel.Preprocessed` (``estimator``: the
    single-device reference of the distributed estimator, :func:`shard_design` on the full
    data; ``params.estimator``: the :class:`ShardParams` on the devices) and the
    :class:`ShardFacts`. The fields of both read as attributes (``pre.params``,
    ``pre.layout``)."""

    core: Preprocessed
    shards: ShardFacts

    def __getattr__(self, name: str) -> Any:
        if name in Preprocessed._fields:
            return getattr(self.core, name)
        if name in ShardFacts._fields:
            return getattr(self.shards, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class DistributedSetup(NamedTuple):
    """What :class:`DistributedSGLD` placed on the devices (a view of its preprocessing)."""

    mesh: Mesh
    axis: str
    layout: ShardLayout
    data: tuple  # the arrays with N rows, as (S, M, ...) blocks sharded over the mesh axis
    data_names: tuple[str, ...]
    datum_grads: jax.Array | None  # ∇f_i(θ̂) per shard, (S, M, d), sharded
    noise_within: float
    noise_between: float


class DistributedSGLD(SGLD):
    """SGLD with the data sharded over JAX devices and chains travelling between them.

    Ahn, Shahbaba and Welling (2014): shard-local estimator (supplement Eq. 1), trajectory
    sampling with fixed τ (Cor. 1.2) or adaptive τ_s = τ̄ S q_s (Cor. 1.3). Run it with
    ``num_chains`` a multiple of the number of shards S and ``chain_method="vectorized"``::

        kernel = DistributedSGLD(model, num_shards=4, trajectory_length=10)
        mcmc = MCMC(kernel, num_warmup=100, num_samples=1000, num_chains=4,
                    chain_method="vectorized")
        mcmc.run(key, X, y)

    Each MCMC draw is one cycle of Σ_s τ_s SGLD steps (every chain visits every shard once).

    Parameters
    ----------
    num_shards
        S; default: all devices of ``mesh`` or ``jax.devices()``.
    mesh
        A one-axis :class:`jax.sharding.Mesh` (its axis name is used); default
        ``Mesh(jax.devices()[:S], ("shards",))``.
    shard_sizes
        N_s, contiguous blocks of the data in order (default: as equal as possible). Shuffle
        ordered data before splitting.
    shard_frequencies
        q_s (default N_s/N with adaptive trajectories, 1/S with fixed ones).
    trajectory_length
        τ (fixed) or τ̄ (adaptive).
    adaptive_trajectory
        τ_s = round(τ̄ S q_s) (Cor. 1.3, default) or τ_s = τ (Cor. 1.2).
    estimator
        ``"uniform"`` or ``"cv"`` (default), applied within each shard.
    **kwargs
        As :class:`~numpyro_subsample.sgmcmc.kernel.SGMCMCKernel` (``step_size`` is the time
        step h; no noise correction, no ``zv``). With ``step_size=None`` the SGLD rule is applied to
        the measured noise v_within + τ̄·v_between: the shard part of the noise persists over a
        trajectory. With one step per shard (every τ_s = 1, the default) the step's bias is
        probed (``bias_probe``) by coupled pairs at h and h/2 with the single-device reference
        of the shard estimator, which warn and leave the step as it is.
    model
        A NumPyro model with a subsample plate; its arrays with N rows are sharded.

    References
    ----------
    Ahn, Shahbaba and Welling (2014), supplement Prop. 1.1 (Eq. 1), Cor. 1.2 and 1.3.
    """

    supports_local = False
    supports_structured = False
    supports_adaptation = False
    supports_proxy_adaptation = False

    def __init__(
        self,
        model: Callable,
        *,
        num_shards: int | None = None,
        mesh: Mesh | None = None,
        shard_sizes: Sequence[int] | None = None,
        shard_frequencies: Sequence[float] | None = None,
        trajectory_length: int = 1,
        adaptive_trajectory: bool = True,
        estimator: str = "cv",
        **kwargs: Any,
    ) -> None:
        check_options(
            "DistributedSGLD", num_shards=num_shards, shard_sizes=shard_sizes,
            shard_frequencies=shard_frequencies, trajectory_length=trajectory_length,
            adaptive_trajectory=adaptive_trajectory, estimator=estimator,
        )
        records = legacy_records(type(self).__name__, kwargs, zv=kwargs.pop("zv", None),
                                 noise=kwargs.pop("noise", None))
        check_record(type(self).__name__, "noise", records["noise"])
        if records["zv"] is not None:
            raise ValueError("zv=ZVOptions(...) is not supported by DistributedSGLD.")
        if kwargs.get("steps_per_draw") not in (None, 1):
            raise ValueError(
                f"DistributedSGLD takes one step per draw (got steps_per_draw="
                f"{kwargs['steps_per_draw']!r}); a shard's trajectory_length sets its steps per "
                "visit, and MCMC(thinning=k) keeps every k-th draw.")
        if kwargs.get("store_datum_grads") is not None:
            raise ValueError(
                "DistributedSGLD keeps ∇f_i(θ̂) on the device of each shard; do not pass "
                "store_datum_grads."
            )
        noise = records["noise"] or NoiseOptions()
        if noise.correction:
            raise ValueError(
                "NoiseOptions(correction=True) is not supported by DistributedSGLD (its shard "
                "noise is measured by Monte Carlo, not as a covariance); leave it out."
            )
        kwargs["noise"] = dataclasses.replace(noise, correction=False)
        super().__init__(model, estimator=estimator, **kwargs)
        if mesh is not None:
            if len(mesh.axis_names) != 1:
                raise ValueError(f"mesh must have one axis, got axes {mesh.axis_names}.")
            if num_shards is not None and num_shards != mesh.devices.size:
                raise ValueError(
                    f"num_shards={num_shards} does not match the mesh's {mesh.devices.size} "
                    "devices; pass one of them."
                )
        else:
            devices = jax.devices()
            S = len(devices) if num_shards is None else int(num_shards)
            if not 1 <= S <= len(devices):
                raise ValueError(
                    f"num_shards={num_shards} needs that many devices; {len(devices)} are "
                    "available. On CPU, simulate more with XLA_FLAGS="
                    "--xla_force_host_platform_device_count=S set before importing jax."
                )
            mesh = Mesh(np.array(devices[:S]), ("shards",))
        self.mesh = mesh
        self.num_shards = int(mesh.devices.size)
        self.shard_sizes = shard_sizes
        self.shard_frequencies = shard_frequencies
        self.trajectory_length = int(trajectory_length)
        self.adaptive_trajectory = bool(adaptive_trajectory)

    # -- what users read -----------------------------------------------------------------------
    @property
    def layout(self) -> ShardLayout:
        return self.preprocessed.layout

    @property
    def setup(self) -> DistributedSetup:
        """The sharded data and control-variate tables on the devices."""
        pre = self.preprocessed
        sp, leaves = pre.params.estimator, pre.potential.data_leaves
        names = sp.data.names()
        return DistributedSetup(
            mesh=self.mesh, axis=self.mesh.axis_names[0], layout=pre.layout,
            data=tuple(sp.data.arrays[i] for i in leaves),
            data_names=tuple(names[i] for i in leaves),
            datum_grads=None if sp.cv is None else sp.cv.datum_grads, noise_within=pre.noise_within,
            noise_between=pre.noise_between,
        )

    def get_diagnostics_str(self, state: SGMCMCState) -> str:
        return (
            f"step size {self.step_size:.2e}, {self.num_shards} shards, "
            f"{self.layout.cycle_length} steps/draw"
        )

    # -- preprocessing ---------------------------------------------------------------------
    def _shards(self, potential: Potential, layout: ShardLayout) -> _Shards:
        """The static configuration of the sharded programs."""
        n, sizes = potential.plate.subsample_size, tuple(int(x) for x in layout.sizes)
        design = SamplingDesign(draw=local_draw(sizes, n, self.replace), size=n,
                                num_data=potential.num_data)
        estimate = make_estimator(potential, design).estimate
        return _Shards(potential=potential, estimate=estimate, mesh=self.mesh, sizes=sizes,
                       chunk_size=self.chunk_size)

    def _preprocess(self, potential: Potential, data: ModelData) -> DistributedPreprocessed:
        """The core's preprocessing (proxy, whitening, an explicit step size), then the
        shards, their ∇f_i(θ̂) tables on their devices, the measured noise and step size."""
        t0 = time.perf_counter()
        N, n = potential.num_data, potential.plate.subsample_size
        layout = shard_layout(
            N, self.num_shards, shard_sizes=self.shard_sizes,
            shard_frequencies=self.shard_frequencies,
            trajectory_length=self.trajectory_length, adaptive=self.adaptive_trajectory,
        )
        if layout.sizes.min() < n:
            raise ValueError(
                f"The smallest shard has {layout.sizes.min()} data, fewer than the subsample "
                f"size n={n}; pass larger shard_sizes, fewer shards or a smaller subsample_size."
            )
        if not potential.data_leaves:
            raise ValueError(
                f"No array of the data has leading dimension N={N}: DistributedSGLD shards the "
                "arrays indexed by the subsample plate, so pass the data as model arguments."
            )
        base = self._whitening(potential, data, preprocess_keys(self.seed)[1])
        cfg = self._shards(potential, layout)
        dtype, proxy = base.centre.dtype, base.proxy
        rep = NamedSharding(self.mesh, P())
        sharded = _place(data, potential.data_leaves, layout, self.mesh)
        passes, cv, cv_ref = base.data_passes, None, None
        if self.estimator_name == "cv":
            centre = jax.device_put(proxy.centre, rep)
            tables = _datum_grad_tables(cfg, centre, sharded)
            total = jax.device_put(jnp.sum(tables, axis=(0, 1)), rep)
            cv, cv_ref = ControlVariate(
                centre=centre, sum_grads=total, datum_grads=tables,
            ), ControlVariate(centre=centre, sum_grads=total)
            passes += 1.0
        taus = jnp.asarray(layout.trajectory_lengths, jnp.int32)
        weights = jax.device_put(shard_weights(layout, n, dtype), rep)
        shard_params = ShardParams(data=sharded, weights=weights,
                                   trajectory_lengths=jax.device_put(taus, rep), cv=cv)
        centre, tril, h = jax.device_put((base.centre, base.scale_tril, jnp.zeros((), dtype)), rep)
        init_tril, passes0 = jax.device_put((base.init_tril, jnp.zeros((), dtype)), rep)
        params = SamplerParams(centre=centre, scale_tril=tril, step_size=h, estimator=shard_params,
                               init_tril=init_tril, data_passes=passes0)
        q = jnp.asarray(layout.frequencies, dtype)
        within, between = _shard_noise(cfg, params, q, preprocess_keys(self.seed)[3], 1.5, 8, 16)
        top = lambda c: float(np.linalg.eigvalsh(np.asarray(c, np.float64)).max())  # noqa: E731
        v_w, v_b = top(within), top(between)
        noise = v_w + float(np.sum(layout.frequencies * layout.trajectory_lengths)) * v_b
        step_size = self._step_size or self._default_step_size(noise)
        params = params._replace(
            step_size=jax.device_put(jnp.asarray(step_size, dtype), rep),
            data_passes=jax.device_put(jnp.asarray(passes, dtype), rep),
        )
        reference = make_estimator(
            potential, shard_design(layout, n, self.replace, dtype), cv_ref,
            name=f"shard-{self.estimator_name}", data_passes=passes - base.data_passes,
        )
        core = Preprocessed(
            potential=potential, proxy=proxy, estimator=reference, step_size=float(step_size),
            noise=noise, centre=base.centre, scale_tril=base.scale_tril,
            seconds=time.perf_counter() - t0, data_passes=passes, params=params,
        )
        core = self._probed(core, data, layout, rep)
        return DistributedPreprocessed(
            core=core, shards=ShardFacts(layout=layout, noise_within=v_w, noise_between=v_b),
        )

    def _probed(self, core: Preprocessed, data: ModelData, layout: ShardLayout,
                rep: NamedSharding) -> Preprocessed:
        """``core`` with the probe of its step's bias
        (:func:`~numpyro_subsample.sgmcmc.step_bias.probed`: coupled pairs at h and h/2 on
        one device, with the single-device reference of the shard estimator, a shard drawn
        with its frequency q_s at every step), which warns and does not change the step.
        With trajectories of more than one step per shard the run's shard noise persists
        over a trajectory, which the reference's fresh draw every step does not reproduce: not
        probed then (the reason is recorded)."""
        if not self.bias_probe:
            return step_bias.not_probed(core, "bias_probe=False")
        if int(np.max(layout.trajectory_lengths)) > 1:
            return step_bias.not_probed(
                core, "trajectories of more than one step per shard, whose shard noise "
                "persists over a trajectory (the probe's reference estimator draws a shard at "
                "every step)")
        probed = step_bias.probed(core, data, dynamics=self._dynamics(False),
                                  diffusion=self._diffusion, seed=self.seed,
                                  kernel=type(self).__name__, reduce_step=False, stacklevel=6,
                                  rng_impl="threefry2x32")  # Philox: the shard draw won't lower
        passes = jax.device_put(probed.params.data_passes, rep)
        return probed._replace(params=probed.params._replace(data_passes=passes))

    def shard_estimates(self, keys: jax.Array, theta: jax.Array) -> jax.Array:
        """g_s(θ) (Eq. 1, full-gradient scale, estimates ∇f) for each shard s and each key:
        shape (S, len(keys), d), each shard's rows computed on its own device."""
        pre = self.preprocessed
        cfg = self._shards(pre.potential, pre.layout)
        return _shard_estimates(cfg, pre.params, keys[None], jnp.asarray(theta)[None])[:, 0]

    # -- sampling ------------------------------------------------------------------------------
    def _config(self, pre, num_warmup: int, traced: bool):
        # The core's step with the shard-local estimate; Threefry: JAX cannot lower the core's
        # Philox step keys inside shard_map.
        cfg = super()._config(pre, num_warmup, traced)
        estimate = self._shards(pre.potential, pre.layout).estimate
        return cfg._replace(estimate=estimate, rng_impl="threefry2x32")

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        if isinstance(rng_key, jax.core.Tracer):
            raise ValueError(
                "DistributedSGLD places chains on the devices itself: use "
                "chain_method='vectorized' (not 'parallel')."
            )
        single = is_prng_key(rng_key)
        chains = 1 if single else rng_key.shape[0]
        if chains % self.num_shards:
            raise ValueError(
                f"DistributedSGLD needs num_chains to be a multiple of the number of shards "
                f"S={self.num_shards} with chain_method='vectorized' (got {chains} chain(s) per "
                "init call); each device holds num_chains/S chains."
            )
        data = ModelData.from_args(model_args, model_kwargs)
        pre = self._preprocess_data(data)
        init_one, step, params = self._programs(pre, num_warmup=num_warmup, traced=False)
        cfg = self._shards(pre.potential, pre.layout)
        if single:
            rng_key = rng_key[None]
            init_params = jax.tree.map(lambda a: jnp.asarray(a)[None], init_params)
        state = _init_chains(cfg, init_one, rng_key, init_params, params)
        if init_params is not None:
            check_given_start(pre, params, state.w, data)
        if single:
            state = jax.tree.map(lambda a: a[0], state)
        self._step, self._batched = _cycle(cfg, step, single), False
        return state._replace(params=params)

    # -- accounting ----------------------------------------------------------------------------
    def communication_bytes(self, state: SGMCMCState) -> dict[str, int]:
        """Bytes that move per trajectory (every chain state, once) versus bytes that stay.

        ``per_trajectory``: the chain states handed over by ``ppermute`` after one trajectory
        (all chains); ``per_draw``: S times that; ``data_resident``: the sharded data and
        control-variate tables, which never move (padding excluded).
        """
        setup = self.setup
        moved = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state._replace(params=None)))
        rows = int(setup.layout.sizes.sum())
        resident = setup.data + (() if setup.datum_grads is None else (setup.datum_grads,))
        stay = sum(x.nbytes // (x.shape[0] * x.shape[1]) * rows for x in resident)
        return {
            "per_trajectory": int(moved),
            "per_draw": int(moved) * setup.layout.num_shards,
            "data_resident": int(stay),
        }
