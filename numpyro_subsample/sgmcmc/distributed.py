"""Distributed SGLD over data shards on JAX devices (paper 004, Ahn, Shahbaba & Welling 2014).

The per-datum arguments of the model (every array argument whose leading dimension is the
plate size N) are split into S contiguous shards of sizes N_s, padded to a common length and
placed one shard per device of a one-axis :class:`jax.sharding.Mesh` with
:class:`jax.sharding.NamedSharding`; they never move again. The chains (``num_chains = k·S``)
are spread k per device. Inside one :func:`jax.shard_map`, each device runs a trajectory of τ_s
SGLD steps on its own shard for the chains it holds, using the shard-local estimator of
Prop. 1.1, Eq. (1), written as a full-data gradient estimate,

    g_s(θ) = ∇f0(θ) + Σ_i ∇c_i + (1/q_s) (N_s/n) Σ_{j∈S_s} [∇f_{i_j}(θ) − ∇c_{i_j}]

(N ḡ_d of Eq. 1 plus the prior and control-variate terms), then hands its chains to the next
device with :func:`jax.lax.ppermute` (a ring rotation: only chain states travel).

One ``sample`` call of NumPyro's ``MCMC`` is one *cycle*: S trajectories, after which every
chain has visited every shard once and is back on its home device (so chain c stays chain c
in the collected draws). The recorded draw is the position at the end of the cycle, i.e. the
draws are the SGLD chain thinned by the cycle length Σ_s τ_s.

Schedules (the scheduler is the ring, which chooses each worker once per cycle):

- fixed trajectory length τ (Cor. 1.2): τ_s = τ; the ring visits shards uniformly, so the
  realised frequencies, and hence the weights of Eq. 1, are q_s = 1/S (valid for unequal N_s);
- adaptive lengths (Cor. 1.3): τ_s = round(τ̄ S q_s) ≥ 1 for frequencies q_s (default
  N_s/N, user-settable, e.g. small for a slow worker); the estimator uses the realised
  frequencies τ_s / Σ_t τ_t, so rounding never biases it. Devices with short trajectories wait
  at the ``ppermute``, as a fast worker would.

Estimators per shard: ``"uniform"`` (Eq. 1 as printed) and ``"cv"`` (control variates at the
proxy centre θ̂; the per-datum ∇f_i(θ̂) and their per-shard sums are computed on the device
holding the shard, and the estimator adds their total, one d-vector, so the shard choice only
scales the small residuals).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from numpyro.util import is_prng_key

from numpyro_subsample.core.datapass import map_data
from numpyro_subsample.estimators.base import ControlVariate, GradientEstimator, make_estimator
from numpyro_subsample.sgmcmc.kernel import SGLD, Preprocessed, SGMCMCState
from numpyro_subsample.core.potential import Potential, build_potential, check_data_finite
from numpyro_subsample.proxies.laplace import Proxy, fit_laplace
from numpyro_subsample.estimators.selection import SamplingDesign, uniform_design
from numpyro_subsample.sgmcmc.stepsize import sgld_step_size

__all__ = ["ShardLayout", "shard_layout", "shard_design", "DistributedSGLD"]

DISTRIBUTED_ESTIMATORS = ("uniform", "cv")


class ShardLayout(NamedTuple):
    """Sizes N_s, row offsets, realised frequencies q_s and trajectory lengths τ_s per shard."""

    sizes: np.ndarray
    offsets: np.ndarray
    frequencies: np.ndarray
    trajectory_lengths: np.ndarray

    @property
    def num_shards(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def max_size(self) -> int:
        return int(self.sizes.max())

    @property
    def cycle_length(self) -> int:
        """SGLD steps per chain in one cycle (one MCMC draw): Σ_s τ_s."""
        return int(self.trajectory_lengths.sum())


def shard_layout(
    num_data: int,
    num_shards: int,
    *,
    shard_sizes: Sequence[int] | None = None,
    shard_frequencies: Sequence[float] | None = None,
    trajectory_length: int = 1,
    adaptive: bool = True,
) -> ShardLayout:
    """Shard sizes, frequencies and trajectory lengths (Prop. 1.1, Cor. 1.2, Cor. 1.3).

    ``adaptive=False``: τ_s = ``trajectory_length`` for all s and q_s = 1/S (what a ring
    scheduler with equal trajectories realises). ``adaptive=True``: τ_s = max(1, round(τ̄ S q_s))
    with τ̄ = ``trajectory_length`` and q_s = ``shard_frequencies`` (default N_s/N); the
    returned frequencies are the realised ones, τ_s / Σ_t τ_t.
    """
    S = int(num_shards)
    if S < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}.")
    if shard_sizes is None:
        sizes = np.array([len(a) for a in np.array_split(np.arange(num_data), S)])
    else:
        sizes = np.asarray(shard_sizes, dtype=np.int64)
        if sizes.shape != (S,) or sizes.sum() != num_data or (sizes <= 0).any():
            raise ValueError(
                f"shard_sizes must be {S} positive integers summing to N={num_data}, got "
                f"{list(np.asarray(shard_sizes))}."
            )
    if int(trajectory_length) != trajectory_length or trajectory_length < 1:
        raise ValueError(f"trajectory_length must be an integer >= 1, got {trajectory_length}.")
    if shard_frequencies is None:
        q = sizes / sizes.sum() if adaptive else np.full(S, 1.0 / S)
    else:
        q = np.asarray(shard_frequencies, dtype=np.float64)
        if q.shape != (S,) or not np.all(q > 0) or not np.isclose(q.sum(), 1.0):
            raise ValueError(
                f"shard_frequencies must be {S} positive numbers summing to 1, got "
                f"{list(np.asarray(shard_frequencies))}."
            )
        if not adaptive and not np.allclose(q, 1.0 / S):
            raise ValueError(
                "Non-uniform shard_frequencies need adaptive trajectory lengths: with equal "
                "trajectories every device serves the same number of chains per round, so the "
                "realised frequencies are 1/S. Pass adaptive_trajectory=True (Cor. 1.3, "
                "τ_s = τ̄ S q_s)."
            )
    if adaptive:
        taus = np.maximum(1, np.rint(trajectory_length * S * q)).astype(np.int64)
        q = taus / taus.sum()
    else:
        taus = np.full(S, int(trajectory_length), np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return ShardLayout(sizes, offsets, q, taus)


def _shard_draws(layout: ShardLayout, n: int, replace: bool, dtype) -> list[Callable]:
    """Per shard s: ``draw(key) -> (local idx, weights (N_s/n)/q_s)`` (Eq. 1 weights)."""
    draws = []
    for N_s, q_s in zip(layout.sizes, layout.frequencies, strict=True):
        base = uniform_design(int(N_s), n, replace, dtype).draw

        def draw(key, base=base, inv_q=float(1.0 / q_s)):
            idx, w = base(key)
            return idx, w * inv_q

        draws.append(draw)
    return draws


def shard_design(layout: ShardLayout, n: int, replace: bool = True, dtype=None) -> SamplingDesign:
    """The two-stage law of Prop. 1.1 on global plate indices: shard s ~ q, then n uniform
    indices within shard s, weights (N_s/n)/q_s, so E[Σ_j w_j h_{i_j}] = Σ_i h_i (Eq. 2-9).

    A single-device reference of what :class:`DistributedSGLD` computes shard-locally.
    """
    dtype = dtype or jnp.result_type(float)
    draws = _shard_draws(layout, n, replace, dtype)
    log_q = jnp.log(jnp.asarray(layout.frequencies, dtype))
    offsets = jnp.asarray(layout.offsets, jnp.int32)

    def draw(key):
        k_s, k_i = jax.random.split(key)
        s = jax.random.categorical(k_s, log_q)
        idx, w = jax.lax.switch(s, draws, k_i)
        return idx + offsets[s], w

    return SamplingDesign(draw, n, int(layout.sizes.sum()))


class _ShardModel:
    """The user's model, reading its per-datum arguments from the shard being processed.

    The core's :class:`~numpyro_subsample.potential.Potential` closes over fixed model
    arguments; to evaluate it on each device's own shard inside ``shard_map`` without copying
    its code, the potential is built from this wrapper and the device-local arrays are swapped
    in (``using``) while the per-device program is traced.
    """

    def __init__(self, model: Callable, leaves: list, treedef, positions: list[int], local: list):
        self.model, self.leaves, self.treedef, self.positions = model, leaves, treedef, positions
        self.current = local

    @contextlib.contextmanager
    def using(self, local: list):
        old, self.current = self.current, local
        try:
            yield
        finally:
            self.current = old

    def __call__(self, *args, **kwargs):
        leaves = list(self.leaves)
        for pos, arr in zip(self.positions, self.current, strict=True):
            leaves[pos] = arr
        a, k = jax.tree.unflatten(self.treedef, leaves)
        return self.model(*a, **k)


class DistributedSetup(NamedTuple):
    """What :class:`DistributedSGLD` places on the devices."""

    mesh: Mesh
    axis: str
    layout: ShardLayout
    data: tuple  # per-datum arrays, (S, max N_s, ...), sharded over the mesh axis
    data_names: tuple[str, ...]
    datum_grads: jax.Array | None  # ∇f_i(θ̂) per shard, (S, max N_s, d), sharded
    shard_sum_grads: jax.Array | None  # Σ_{i∈s} ∇f_i(θ̂), (S, d)
    shard_model: _ShardModel
    shard_potential: Potential
    noise_within: float
    noise_between: float


def _split_data(model_args, model_kwargs, num_data, layout, sharding):
    named = jax.tree_util.tree_flatten_with_path((tuple(model_args), dict(model_kwargs)))[0]
    leaves, treedef = jax.tree.flatten((tuple(model_args), dict(model_kwargs)))
    positions, names, sharded, local0 = [], [], [], []
    for pos, (path, leaf) in enumerate(named):
        if not hasattr(leaf, "shape") or len(leaf.shape) == 0 or leaf.shape[0] != num_data:
            continue
        host = np.asarray(leaf)
        # Pad each shard to the longest with copies of its first row (never drawn: indices
        # are drawn below N_s), so the per-device buffers have one shape.
        blocks = []
        for off, size in zip(layout.offsets, layout.sizes, strict=True):
            block = host[off : off + size]
            pad = layout.max_size - size
            if pad:
                block = np.concatenate([block, np.repeat(block[:1], pad, 0)], 0)
            blocks.append(block)
        stacked = np.stack(blocks)
        positions.append(pos)
        names.append(jax.tree_util.keystr(path))
        sharded.append(jax.device_put(stacked, sharding))
        local0.append(jnp.asarray(stacked[0]))
    if not positions:
        raise ValueError(
            f"No model argument has leading dimension N={num_data}: DistributedSGLD shards the "
            "arrays indexed by the subsample plate, so pass the data as model arguments."
        )
    return leaves, treedef, positions, tuple(names), tuple(sharded), local0


class DistributedSGLD(SGLD):
    """SGLD with the data sharded over JAX devices and chains travelling between them.

    Paper 004: shard-local estimator Eq. (1), trajectory sampling Cor. 1.2 (fixed τ) and
    Cor. 1.3 (adaptive τ_s = τ̄ S q_s). Run it with ``num_chains`` a multiple of the number of
    shards S and ``chain_method="vectorized"``::

        kernel = DistributedSGLD(model, num_shards=4, trajectory_length=10)
        mcmc = MCMC(kernel, num_warmup=100, num_samples=1000, num_chains=4,
                    chain_method="vectorized")
        mcmc.run(key, X, y)

    Each MCMC draw is one cycle of Σ_s τ_s SGLD steps (every chain visits every shard once).

    :param num_shards: S; default: all devices of ``mesh`` or ``jax.devices()``.
    :param mesh: a one-axis :class:`jax.sharding.Mesh` (its axis name is used); default
        ``Mesh(jax.devices()[:S], ("shards",))``.
    :param shard_sizes: N_s, contiguous blocks of the data in order (default: as equal as
        possible). Shuffle ordered data before splitting.
    :param shard_frequencies: q_s (default N_s/N with adaptive trajectories, 1/S with fixed).
    :param trajectory_length: τ (fixed) or τ̄ (adaptive).
    :param adaptive_trajectory: τ_s = round(τ̄ S q_s) (Cor. 1.3, default) or τ_s = τ (Cor. 1.2).
    :param estimator: ``"uniform"`` or ``"cv"`` (default), applied within each shard.
    Other arguments as :class:`~numpyro_subsample.kernel.SGMCMCKernel`. With ``step_size=None``
    the step follows the measured noise v_within + τ̄·v_between (module ``stepsize`` rule):
    the shard part of the noise persists over a trajectory.
    """

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
        if estimator not in DISTRIBUTED_ESTIMATORS:
            raise ValueError(
                f"DistributedSGLD supports estimator in {DISTRIBUTED_ESTIMATORS}, got "
                f"{estimator!r}."
            )
        if kwargs.get("zv_stream"):
            raise ValueError("zv_stream=True is not supported by DistributedSGLD.")
        if kwargs.get("store_datum_grads") is not None:
            raise ValueError(
                "DistributedSGLD keeps ∇f_i(θ̂) on the device of each shard; do not pass "
                "store_datum_grads."
            )
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
        self._setup: DistributedSetup | None = None

    # -- preprocessing ---------------------------------------------------------------------
    @property
    def setup(self) -> DistributedSetup:
        if self._setup is None:
            raise RuntimeError("Run MCMC (or call kernel.preprocess) first.")
        return self._setup

    @property
    def layout(self) -> ShardLayout:
        return self.setup.layout

    def preprocess(
        self, model_args: tuple, model_kwargs: dict | None = None, *, traced: bool = False
    ) -> Preprocessed:
        """Potential and proxy as in the core kernel, then the shards, their control-variate
        tables, the distributed estimator and its measured noise → step size (cached)."""
        from numpyro_subsample.sgmcmc.kernel import _same_args

        model_kwargs = dict(model_kwargs or {})
        if self._pre is not None and _same_args(self._pre_args, (model_args, model_kwargs)):
            return self._pre
        t0 = time.perf_counter()
        k_model, k_proxy = jax.random.split(jax.random.PRNGKey(self.seed))
        pot = build_potential(self._model, model_args, model_kwargs, k_model)
        N, n, d = pot.num_data, pot.plate.subsample_size, pot.dim
        check_data_finite(model_args, model_kwargs, N)
        proxy = self._proxy_spec
        if isinstance(proxy, Proxy):
            if proxy.centre.shape != (d,):
                raise ValueError(
                    f"The given proxy has dimension {proxy.centre.shape}, the model {d}."
                )
        elif self._needs_proxy():
            # The global fit reads every datum (Adam epochs + Newton passes); the N×d table of
            # ∇f_i(θ̂) is not kept: each shard computes its own rows on its device below.
            proxy = fit_laplace(
                pot, k_proxy, chunk_size=self.chunk_size, store_datum_grads=False,
                progress=self.progress_bar, **self.proxy_kwargs,
            )
        else:
            proxy = None
        if self.preconditioning:
            centre, tril = proxy.centre, proxy.scale_tril
        else:
            centre = proxy.centre if proxy is not None else pot.init_theta
            tril = jnp.eye(d, dtype=centre.dtype)
        layout = shard_layout(
            N, self.num_shards, shard_sizes=self.shard_sizes,
            shard_frequencies=self.shard_frequencies,
            trajectory_length=self.trajectory_length, adaptive=self.adaptive_trajectory,
        )
        if not self.replace and layout.sizes.min() < n:
            raise ValueError(
                f"The smallest shard has {layout.sizes.min()} data, fewer than the subsample "
                f"size n={n} drawn without replacement; use larger shard_sizes or replace=True."
            )
        axis = self.mesh.axis_names[0]
        leaves, treedef, positions, names, data, local0 = _split_data(
            model_args, model_kwargs, N, layout, NamedSharding(self.mesh, P(axis))
        )
        shard_model = _ShardModel(self._model, leaves, treedef, positions, local0)
        try:
            shard_pot = build_potential(shard_model, (), {}, k_model)
        except ValueError as err:
            raise ValueError(
                f"The model could not be evaluated on one shard (padded to "
                f"{layout.max_size} rows): {err} The plate size must follow the data "
                "arguments (or stay N), and subsample_size must be below the shard sizes."
            ) from err
        setup = DistributedSetup(
            self.mesh, axis, layout, data, names, None, None, shard_model, shard_pot, 0.0, 0.0
        )
        passes = proxy.num_data_passes if proxy is not None else 0.0
        if self.estimator_name == "cv":
            tables = self._shard_datum_grads(setup, proxy.centre)
            setup = setup._replace(datum_grads=tables, shard_sum_grads=jnp.sum(tables, axis=1))
            passes += 1.0
        pre = Preprocessed(pot, proxy, None, 0.0, 0.0, centre, tril, 0.0, passes)
        v_w, v_b = self._measure_noise(pre, setup)
        tau_bar = float(np.sum(layout.frequencies * layout.trajectory_lengths))
        noise = v_w + tau_bar * v_b
        if self._step_size is not None:
            step_size = float(self._step_size)
        elif self.preconditioning:
            step_size = sgld_step_size(noise, self.max_variance_inflation)
        else:
            raise ValueError(
                "step_size=None needs preconditioning=True (the default rule works in "
                "whitened coordinates); pass a step_size."
            )
        self._setup = setup._replace(noise_within=v_w, noise_between=v_b)
        pre = pre._replace(
            estimator=self._random_shard_estimator(pre, self._setup), noise=noise,
            step_size=step_size, seconds=time.perf_counter() - t0,
        )
        self._pre, self._pre_args = pre, (model_args, model_kwargs)
        self._sample_fn = None
        return pre

    def _smap(self, fn, in_specs, out_specs):
        return jax.shard_map(
            fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )

    def _shard_datum_grads(self, setup: DistributedSetup, centre: jax.Array) -> jax.Array:
        """∇f_i(θ̂) for the rows of each shard, computed on the shard's device (one pass)."""
        axis, pot, sizes = setup.axis, setup.shard_potential, jnp.asarray(setup.layout.sizes)
        M = setup.layout.max_size

        def body(data):
            with setup.shard_model.using([x[0] for x in data]):

                def one(i):
                    return jax.grad(lambda t: pot.data_terms(t, i[None])[0])(centre)

                g = map_data(jax.vmap(one), M, self.chunk_size)
            valid = jnp.arange(M) < sizes[jax.lax.axis_index(axis)]
            return jnp.where(valid[:, None], g, 0.0)[None]

        spec = P(axis)
        return jax.jit(self._smap(body, ((spec,) * len(setup.data),), spec))(setup.data)

    def _local_estimator(self, pre: Preprocessed, setup: DistributedSetup, shard, grads):
        """The estimator of Eq. (1) on the shard ``shard`` (traced device index)."""
        draws = _shard_draws(setup.layout, pre.potential.plate.subsample_size, self.replace,
                             pre.centre.dtype)
        design = SamplingDesign(
            lambda key: jax.lax.switch(shard, draws, key),
            pre.potential.plate.subsample_size, pre.potential.num_data,
        )
        cv = None
        if self.estimator_name == "cv":
            total = jnp.sum(setup.shard_sum_grads, axis=0)
            cv = ControlVariate(pre.proxy.centre, total, grads)
        return make_estimator(setup.shard_potential, design, cv)

    def shard_estimates(self, keys: jax.Array, theta: jax.Array) -> jax.Array:
        """g_s(θ) (Eq. 1, full-gradient scale, estimates ∇f) for each shard s and each key:
        shape (S, len(keys), d), each shard's rows computed on its own device."""
        pre, setup = self.preprocessed, self.setup
        return self._shard_estimates_fn(pre, setup)(keys, theta)

    def _shard_estimates_fn(self, pre, setup):
        axis = setup.axis
        cv = setup.datum_grads is not None

        def body(keys, theta, data, grads):
            s = jax.lax.axis_index(axis)
            with setup.shard_model.using([x[0] for x in data]):
                est = self._local_estimator(pre, setup, s, grads[0] if cv else None)
                k_s = jax.vmap(lambda k: jax.random.fold_in(k, s))(keys)
                g = jax.vmap(lambda k: est.estimate(k, theta)[0])(k_s)
            return g[None]

        spec = P(axis)
        grads_spec = spec if cv else P()
        fn = self._smap(body, (P(), P(), (spec,) * len(setup.data), grads_spec), spec)
        grads = setup.datum_grads if cv else jnp.zeros(())
        return lambda keys, theta: fn(keys, theta, setup.data, grads)

    def _random_shard_estimator(self, pre, setup) -> GradientEstimator:
        """Shard s ~ q, then the shard's minibatch (Prop. 1.1): unbiased for ∇f."""
        all_shards = self._shard_estimates_fn(pre, setup)
        log_q = jnp.log(jnp.asarray(setup.layout.frequencies, pre.centre.dtype))
        n = pre.potential.plate.subsample_size

        @jax.jit  # compiled once, also when the core vmaps it over chains in `init`
        def estimate(key, theta):
            k_s, k_g = jax.random.split(key)
            s = jax.random.categorical(k_s, log_q)
            return all_shards(k_g[None], theta)[s, 0], jnp.asarray(n)

        design = shard_design(setup.layout, n, self.replace, pre.centre.dtype)
        cv = None
        if setup.shard_sum_grads is not None:
            cv = ControlVariate(pre.proxy.centre, jnp.sum(setup.shard_sum_grads, 0), None)
        return GradientEstimator(estimate, design, cv)

    def _measure_noise(self, pre, setup, num_points: int = 8, num_draws: int = 16):
        """Largest eigenvalues of the within-shard noise covariance E_s[Cov(Lᵀg_s)] and of the
        between-shard covariance of the shard means, in whitened coordinates, at points drawn
        from N(θ̂, 1.5² Σ̂) (as :func:`~numpyro_subsample.stepsize.measure_whitened_noise`)."""
        fn = self._shard_estimates_fn(pre, setup)
        d = pre.centre.shape[0]
        q = jnp.asarray(setup.layout.frequencies, pre.centre.dtype)
        key = jax.random.PRNGKey(self.seed + 1)
        k_pts, k_draws = jax.random.split(key)
        ws = 1.5 * jax.random.normal(k_pts, (num_points, d), pre.centre.dtype)

        @jax.jit
        def at(w, key):
            theta = pre.centre + pre.scale_tril @ w
            g = fn(jax.random.split(key, num_draws), theta) @ pre.scale_tril  # (S, K, d)
            m = g.mean(1)
            r = g - m[:, None]
            within = jnp.einsum("s,ski,skj->ij", q, r, r) / (num_draws - 1)
            dm = m - q @ m
            between = jnp.einsum("s,si,sj->ij", q, dm, dm)
            return within, between

        within, between = 0.0, 0.0
        for w, k in zip(ws, jax.random.split(k_draws, num_points), strict=True):
            a, b = at(w, k)
            within = within + np.asarray(a, np.float64)  # a host sync per point: also keeps
            between = between + np.asarray(b, np.float64)  # one program in flight at a time
        top = lambda c: float(np.linalg.eigvalsh(0.5 * (c + c.T) / num_points).max())  # noqa: E731
        return top(within), top(between)

    # -- sampling ------------------------------------------------------------------------------
    def _build_cycle(self, pre: Preprocessed) -> Callable[[SGMCMCState], SGMCMCState]:
        """One MCMC draw: S trajectories with a ``ppermute`` ring rotation after each."""
        setup = self.setup
        axis, S = setup.axis, setup.layout.num_shards
        taus = jnp.asarray(setup.layout.trajectory_lengths, jnp.int32)
        ring = [(i, (i + 1) % S) for i in range(S)]
        cv = setup.datum_grads is not None

        def body(states, data, grads):
            s = jax.lax.axis_index(axis)
            with setup.shard_model.using([x[0] for x in data]):
                est = self._local_estimator(pre, setup, s, grads[0] if cv else None)
                # The core's step, with the shard's estimator: its gradient for the next step
                # is carried with the chain, so the first step on a new shard uses the last
                # gradient of the previous one; each shard's gradients are still used τ_s
                # times per cycle, which is what Prop. 1.1 needs.
                # Threefry: Philox (the core's default step RNG) cannot be lowered inside
                # shard_map with jax 0.10.2 (see kernel._split_step_key).
                step = jax.vmap(self._build_step(pre._replace(estimator=est), "threefry2x32"))

                def trajectory(_, st):
                    st = jax.lax.fori_loop(0, taus[s], lambda _, x: step(x), st)
                    return jax.tree.map(lambda a: jax.lax.ppermute(a, axis, ring), st)

                return jax.lax.fori_loop(0, S, trajectory, states)

        spec = P(axis)
        fn = self._smap(body, (spec, (spec,) * len(setup.data), spec if cv else P()), spec)
        grads = setup.datum_grads if cv else jnp.zeros(())
        return lambda state: fn(state, setup.data, grads)

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
        state = super().init(rng_key, num_warmup, init_params, model_args, model_kwargs)
        cycle = self._build_cycle(self.preprocessed)
        if single:
            expand = lambda st: jax.tree.map(lambda a: a[None], st)  # noqa: E731
            self._sample_fn = lambda st: jax.tree.map(lambda a: a[0], cycle(expand(st)))
        else:
            state = jax.device_put(state, NamedSharding(self.mesh, P(self.setup.axis)))
            self._sample_fn = cycle
        return state

    def get_diagnostics_str(self, state: SGMCMCState) -> str:
        return (
            f"step size {self.step_size:.2e}, {self.num_shards} shards, "
            f"{self.layout.cycle_length} steps/draw"
        )

    # -- accounting ----------------------------------------------------------------------------
    def communication_bytes(self, state: SGMCMCState) -> dict[str, int]:
        """Bytes that move per trajectory (every chain state, once) versus bytes that stay.

        ``per_trajectory``: the chain states handed over by ``ppermute`` after one trajectory
        (all chains); ``per_draw``: S times that; ``data_resident``: the sharded data and
        control-variate tables, which never move (padding excluded).
        """
        setup = self.setup
        moved = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
        rows = int(setup.layout.sizes.sum())
        stay = sum(x.nbytes // (x.shape[0] * x.shape[1]) * rows for x in setup.data)
        if setup.datum_grads is not None:
            g = setup.datum_grads
            stay += g.nbytes // (g.shape[0] * g.shape[1]) * rows
        return {
            "per_trajectory": int(moved),
            "per_draw": int(moved) * setup.layout.num_shards,
            "data_resident": int(stay),
        }
