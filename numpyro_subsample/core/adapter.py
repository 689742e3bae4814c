"""The NumPyro ``MCMCKernel`` adapter shared by the package's kernels.

A kernel is a functional core (a pure ``step(state, data)`` and a pure per-chain init, both
compiled once per static configuration) wrapped by this thin class, in the manner of
``numpyro.infer.hmc`` (``hmc()`` returning init/sample functions, wrapped by ``HMC``):

- the data arrive in ``init``/``sample`` as the model's ``(args, kwargs)`` and become a
  :class:`~numpyro_subsample.core.potential.ModelData` argument of every compiled program;
  the package's ``MCMC`` passes them to its compiled loop as arguments; inside NumPyro's
  loop, whose default ``jit_model_args=False`` closes over the arguments, ``sample`` and
  ``postprocess_fn`` read them from references made on first need (:class:`DataRefs`,
  a copy of the data), which JAX passes to the loop as arguments, never as constants;
- the :class:`~numpyro_subsample.core.potential.Potential` is built once per data *signature*
  (static arguments, shapes, dtypes), so compiled programs are reused for new data of the same
  shapes;
- the preprocessing (proxy fit, estimator, step size) is cached per data *value*: a continued
  run, a second ``MCMC`` object or new arrays holding equal values refit nothing;
- the preprocessing's arrays travel in the chain state, so NumPyro's compiled loop is the
  same program for new data of the same shapes (its persistent compilation cache serves it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from functools import lru_cache, partial
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from numpyro_subsample.core.data import device_array
from numpyro_subsample.core.potential import ModelData, Potential, build_potential

__all__ = ["DataRefs", "SubsampleKernel", "check_init_sites", "concrete_under_pmap", "constrained",
           "default_progress", "preprocess_keys"]


def check_init_sites(init_params: dict, potential: Potential) -> None:
    """Refuse ``init_params`` whose sites are not the sampled model's latent sites: the
    chains' programs flatten them in the order of their names, so another site's values would
    land silently."""
    given, expected = set(init_params), set(potential.latent_sites)
    if given == expected:
        return
    hint = " Pass one unconstrained value per latent site."
    if any(name.endswith("_partially_centred") for name in expected - given):
        hint = (" A group effect a that the kernel samples reparameterised (the SG kernels' "
                "partial centring, AdaptationOptions(centring=None), the default) is sampled "
                "as a_partially_centred: pass that site's values, or "
                "AdaptationOptions(centring=False) to sample the model as written.")
    raise ValueError(f"init_params has the sites {sorted(given)}, but the sampled model's "
                     f"latent sites are {sorted(expected)}.{hint}")


def preprocess_keys(seed: int) -> tuple[jax.Array, ...]:
    """Four raw uint32[2] keys from the kernel's ``seed`` (model trace, proxy, estimator,
    noise), made by NumPy's ``SeedSequence`` (a split by JAX would compile a program)."""
    bits = np.random.SeedSequence(int(seed) % 2**32).generate_state(8, np.uint32)
    return tuple(device_array(k) for k in bits.reshape(4, 2))


def concrete_under_pmap(rng_key: Any) -> contextlib.AbstractContextManager:
    """``jax.ensure_compile_time_eval()`` if ``rng_key`` is traced (``init`` under ``pmap``,
    where the data checks and the preprocessing must stay concrete), else no context: outside
    a trace it would run every constant op of the model's build eagerly, one XLA compilation
    per primitive."""
    if isinstance(rng_key, jax.core.Tracer):
        return jax.ensure_compile_time_eval()
    return contextlib.nullcontext()


@lru_cache(maxsize=64)
def _jitted_init(init_one: Callable, batched: bool, out_axes: Any = 0,
                 num_draws: int = 0) -> Callable:
    """The compiled per-chain init (vmapped over keys, init params and the ``num_draws``
    per-chain host draws for vectorized chains, with the state's shared fields unbatched), one
    object per init function so that reruns reuse the compiled program."""
    if not batched:
        return jax.jit(init_one)
    in_axes = (0, 0, None, None) + (0,) * num_draws
    return jax.jit(jax.vmap(init_one, in_axes=in_axes, out_axes=out_axes))


@partial(jax.jit, static_argnums=0)
def constrained(potential: Potential, z: dict, data: ModelData) -> dict:
    """Constrained latent values and deterministic sites of unconstrained ``z`` (compiled once
    per potential; evaluated eagerly, the model would validate its distributions' arguments
    at concrete values, where float32 rounding can fail NumPyro's simplex checks).

    Deterministic sites inside the data plate are evaluated on the plate's first n rows
    (indices 0..n−1, n the model's ``subsample_size``), the same rows for every draw: O(n) per
    draw, never O(N). :func:`numpyro_subsample.post.predictive.predictive` gives all N rows.
    With local latent sites they are not recorded (they depend on the local values, which are
    drawn or integrated per subsample and not kept; e.g. the ``y`` that ``obs_mask`` makes of
    ``y_observed`` and ``y_unobserved``).
    """
    if not potential.plate_deterministic_sites or potential.plate_latent_sites:
        return potential.constrain(z, data)
    idx = jnp.arange(potential.plate.subsample_size)
    return potential.constrain_at(z, idx, data)


def _traced(tree: Any) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


class DataRefs:
    """The run's concrete data, and JAX mutable references (``jax.new_ref``) over them made
    on first need.

    NumPyro's ``MCMC(jit_model_args=False)`` (its default) calls ``sample`` and
    ``postprocess_fn`` inside its compiled loop with the model arguments closed over: read
    there, the arrays would be compiled in as constants. A reference closed over by a
    compiled program is passed to it as an argument instead, and is not one of its outputs
    (a carried array would be copied by every call of NumPyro's per-step program).
    ``jax.new_ref`` copies its initial value into a buffer the reference owns, which each
    call aliases in place (a reference over the caller's own buffer would be copied by every
    call where that buffer cannot be donated, as a NumPy or memory-mapped array's cannot):
    the references hold a second copy of the data. They are therefore made only when a
    program being traced reads concrete data (:meth:`read`), i.e. on that NumPyro path; the
    package's ``MCMC`` passes the data to its loop as arguments
    (:class:`~numpyro_subsample.post.mcmc.MCMC`), and so does NumPyro's with
    ``jit_model_args=True``: no reference, no copy.
    """

    __slots__ = ("data", "refs")

    def __init__(self, data: ModelData) -> None:
        self.data = data  # the concrete arrays, for calls outside a trace
        self.refs: tuple | None = None  # made by the first traced read

    def make(self) -> None:
        """Make the references now (a copy of the data)."""
        if self.refs is None:
            self.refs = tuple(jax.new_ref(a) for a in self.data.arrays)

    def matches(self, model_args: tuple, model_kwargs: dict | None) -> bool:
        """Whether concrete ``(model_args, model_kwargs)`` have this data's structure, static
        values and array shapes (checked without moving arrays to the device)."""
        leaves, treedef = jax.tree.flatten((tuple(model_args), dict(model_kwargs or {})),
                                           is_leaf=lambda x: x is None)
        if _traced(leaves):
            return False
        tdef, pos, others = self.data.static
        arrays = [leaves[i] for i in pos] if len(leaves) == len(pos) + len(others) else []
        rest = [x for i, x in enumerate(leaves) if i not in set(pos)]
        return (treedef == tdef and len(arrays) == len(self.data.arrays)
                and all(np.shape(a) == b.shape for a, b in zip(arrays, self.data.arrays,
                                                               strict=True))
                and len(rest) == len(others) and all(a is b or a == b for a, b in
                                                     zip(rest, others, strict=True)))

    def read(self, inside: Any) -> ModelData:
        """The data for a program being traced (``inside`` holds its tracers: read from the
        references, made now if need be, outside the trace), else the concrete arrays."""
        if not _traced(inside):
            return self.data
        if self.refs is None:
            with jax.core.eval_context():  # concrete references, outside every trace
                self.make()
        return ModelData(tuple(r[...] for r in self.refs), self.data.static)


def _draw_values(fn: Callable, potential: Potential, refs: DataRefs, z: dict) -> dict:
    return fn(potential, z, refs.read(z))


def default_progress() -> bool:
    """Progress bars by default, except under CI or pytest-xdist."""
    return not ("CI" in os.environ or "PYTEST_XDIST_WORKER" in os.environ)


#: the ``progress_bar`` of the ``MCMC`` running now (:func:`run_progress`), if it said
_RUN_PROGRESS: ContextVar[bool | None] = ContextVar("run_progress", default=None)


@contextlib.contextmanager
def run_progress(progress_bar: bool) -> Iterator[None]:
    """Within the block, kernels built with ``progress_bar=None`` show their preprocessing
    bars (proxy fit) if and only if ``progress_bar`` (the running ``MCMC``'s). NumPyro's
    ``MCMC`` does not pass its ``progress_bar`` to the kernel; the package's ``MCMC`` runs
    inside this block."""
    token = _RUN_PROGRESS.set(bool(progress_bar))
    try:
        yield
    finally:
        _RUN_PROGRESS.reset(token)


def resolve_progress(progress_bar: bool | None) -> bool:
    """A kernel's ``progress_bar`` option: as given, else the running ``MCMC``'s
    (:func:`run_progress`), else :func:`default_progress`."""
    if progress_bar is not None:
        return bool(progress_bar)
    run = _RUN_PROGRESS.get()
    return default_progress() if run is None else run


class SubsampleKernel(MCMCKernel):
    """Base class: caches per data signature and value; subclasses provide

    - ``_preprocess(potential, data) -> Preprocessed`` (a NamedTuple with a ``potential``);
    - ``_programs(pre, num_warmup=, traced=) -> (init_one, step, params)``:
      ``init_one(key, init_params, data, params, *draws)`` and ``step(state, data)``, pure
      and jittable, identical objects for equal static configurations (so that compiled code
      is reused), and the preprocessing's arrays ``params`` that ``init_one`` puts in the
      state;
    - optionally ``_init_draws(rng_key, params) -> tuple``: arrays drawn on the host for
      ``init_one`` (one per chain along a leading axis for a batch of keys; default none),
      so that the compiled init holds no random number generator.

    A kernel that draws local latent sites (:mod:`numpyro_subsample.estimators.local`) sets
    the class attribute ``supports_local`` to True.
    """

    supports_local: ClassVar[bool] = False
    _pre = None
    _pre_data: ModelData | None = None
    _step: Callable | None = None
    _batched: bool = False
    _refs: DataRefs | None = None

    def __init__(self, model: Callable, *, seed: int = 0) -> None:
        self._model = model
        self.seed = int(seed)
        self._potentials: dict = {}

    # -- caches -----------------------------------------------------------------------------
    @property
    def user_model(self) -> Callable:
        """The model as given."""
        return self._model

    def potential_for(self, data: ModelData) -> Potential:
        """The potential for data of this signature (built and validated once)."""
        sig = data.signature()
        pot = self._potentials.get(sig)
        if pot is None:
            pot = self._integrated(build_potential(self._model, data,
                                                   preprocess_keys(self.seed)[0]))
            if pot.local and not self.supports_local:
                raise ValueError(
                    f"{type(self).__name__} does not support local latent sites (continuous "
                    f"sites inside the subsample plate: {list(pot.local_sites)}). Use SGLD, "
                    "SGHMC or SGNHT with estimator='uniform', or SGRLD, which draw them for "
                    "each subsample; or marginalise them out of the model."
                )
            self._potentials[sig] = pot
        return pot

    def _integrated(self, potential: Potential) -> Potential:
        """The potential the kernel samples: as built, unless the kernel integrates local
        sites out of it (:mod:`~numpyro_subsample.core.quadrature`)."""
        return potential

    def preprocess(self, model_args: tuple = (), model_kwargs: dict | None = None):
        """Build (or fetch from the cache) everything computed once per data set.

        Call it before ``MCMC.run`` to inspect the proxy or the step size; ``init`` calls it.
        """
        data = ModelData.from_args(model_args, model_kwargs)
        return self._preprocess_data(data)

    def _preprocess_data(self, data: ModelData):
        if self._pre is not None and data.same_values(self._pre_data):
            return self._pre
        potential = self.potential_for(data)
        pre = self._preprocess(potential, data)
        self._pre, self._pre_data = pre, data
        return pre

    def _preprocess(self, potential: Potential, data: ModelData):
        raise NotImplementedError

    def _programs(self, pre, *, num_warmup: int, traced: bool) -> tuple[Callable, Callable, Any]:
        raise NotImplementedError

    @property
    def preprocessed(self):
        if self._pre is None:
            raise RuntimeError(
                "Run MCMC (or call kernel.preprocess(model_args, model_kwargs)) before reading the "
                "preprocessing."
            )
        return self._pre

    @property
    def preprocessed_data(self) -> ModelData:
        """The data the current preprocessing was computed on."""
        self.preprocessed  # noqa: B018  (raises before a run)
        return self._pre_data

    @property
    def potential(self) -> Potential:
        return self.preprocessed.potential

    @property
    def model(self) -> Callable:
        """The model with its subsample plate set to all N indices (after ``init``).

        This is the full-data model that ``arviz.from_numpyro`` and
        ``numpyro.infer.Predictive`` need to see the whole data set; before ``init`` it is the
        user's model.
        """
        if self._pre is None:
            return self._model
        return self._pre.potential.full_data_model()

    # -- MCMCKernel interface -----------------------------------------------------------------
    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        data = ModelData.from_args(model_args, model_kwargs)
        traced = isinstance(rng_key, jax.core.Tracer)  # under pmap (chain_method="parallel")
        with concrete_under_pmap(rng_key):
            pre = self._preprocess_data(data)
        if init_params is not None:
            check_init_sites(init_params, pre.potential)
        init_one, step, params = self._programs(pre, num_warmup=num_warmup, traced=traced)
        self._batched = not is_prng_key(rng_key)
        self._step = step
        axes = self._state_axes() if self._batched else 0
        draws = self._init_draws(rng_key, params)
        init = _jitted_init(init_one, self._batched, axes, len(draws))
        usable = getattr(jax, "new_ref", None) is not None and not _traced(data.arrays)
        self._refs = DataRefs(data) if usable else None
        if traced and self._refs is not None:  # under pmap: made in its trace, as before
            self._refs.make()
        return init(rng_key, init_params, data, params, *draws)

    def run_data(self, state: Any, model_args: tuple, model_kwargs: dict | None) -> ModelData:
        """The data of a compiled step: from the references (:class:`DataRefs`, made on this
        first need) when NumPyro passes the model arguments as closed-over values, else the
        arguments themselves (traced: the package's ``MCMC``, or ``jit_model_args=True``)."""
        refs = self._refs
        if refs is not None and refs.matches(model_args, model_kwargs):
            return refs.read(state)
        return ModelData.from_args(model_args, model_kwargs)

    def draw_fn(self, fn: Callable, model_args: tuple, model_kwargs: dict | None) -> Callable:
        """``z -> fn(potential, z, data)`` for ``postprocess_fn``, the data as in
        :meth:`run_data` (``fn`` is compiled once per potential)."""
        refs = self._refs
        if refs is not None and refs.matches(model_args, model_kwargs):
            return partial(_draw_values, fn, self.potential_for(refs.data), refs)
        data = ModelData.from_args(model_args, model_kwargs)
        return partial(fn, self.potential_for(data), data=data)

    def _init_draws(self, rng_key: Any, params: Any) -> tuple:
        """Host draws passed to ``init_one`` after its four arguments (none here)."""
        return ()

    def _state_axes(self) -> Any:
        """vmap axes of a batched state (0 everywhere; subclasses share unbatched fields)."""
        return 0

    def sample(self, state, model_args, model_kwargs):
        if self._step is None:
            raise RuntimeError(
                "`init` must be called before `sample` (MCMC.run does this; after unpickling "
                "a kernel, run MCMC again)."
            )
        data = self.run_data(state, model_args, model_kwargs)
        if self._batched:
            axes = self._state_axes()
            return jax.vmap(self._step, in_axes=(axes, None), out_axes=axes)(state, data)
        return self._step(state, data)

    def postprocess_fn(self, model_args, model_kwargs) -> Callable[[dict], dict]:
        return self.draw_fn(constrained, model_args, model_kwargs)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_pre", "_pre_data", "_step", "_batched", "_refs"):
            state.pop(key, None)
        state["_potentials"] = {}
        if "_unwrapped" in state:
            state["_unwrapped"], state["_centred_kept"] = {}, set()
        return state
