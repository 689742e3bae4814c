"""NumPyro's sampling loop (``numpyro.util.fori_collect``) with the data as an argument.

NumPyro's ``MCMC`` runs its kernel in a compiled loop whose only inputs are the chain state
and the collection; the model arguments reach the kernel either closed over
(``jit_model_args=False``: a compiled program would hold them as constants, which the
package's kernels avoid with :class:`~numpyro_subsample.core.adapter.DataRefs`, a second copy
of the data) or in the loop's carried value (``jit_model_args=True``: the loop returns them,
and XLA copies a program's input that is also one of its outputs, so the data are copied by
every call: once per run without a progress bar, once per step with one). Here the data are
an argument of the loop's programs and never an output: no constant, no reference, no copy,
and a memory-mapped array (``np.load(path, mmap_mode="r")``) is read in place.

The loop is NumPyro's (same body, same collection, same thinning and progress bar), so the
draws are those NumPyro's loop gives for the same key, up to rounding: its programs are
compiled with :data:`~numpyro_subsample.core.compiling.FAST_COMPILE_OPTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from jax import lax
from numpyro.util import cond, identity

from numpyro_subsample.core.compiling import fast_compile_jit
from numpyro_subsample.core.data import check_mapped, device_array
from numpyro_subsample.core.potential import ModelData

__all__ = ["LoopPrograms", "collect", "device_args"]


def device_args(tree: Any) -> Any:
    """``tree`` with its NumPy arrays as JAX arrays, once (on the CPU a C-contiguous, 64-byte
    aligned array of JAX's dtype, such as a float32 ``.npy`` file loaded with
    ``mmap_mode="r"``, is used in place; a memory-mapped array JAX would copy raises
    ``ValueError`` saying what to do)."""
    def convert(x: Any) -> Any:
        if isinstance(x, np.ndarray) and not isinstance(x, np.generic):
            check_mapped(x)
            return device_array(x)
        return x
    return jax.tree.map(convert, tree, is_leaf=lambda x: x is None)


class LoopPrograms:
    """The compiled step and loop of one ``(sample_fn, transform)`` pair (NumPyro's
    ``_body_fn`` and ``_fori_collect_loop``), with the data a trailing argument.

    ``sample_fn`` and ``transform`` are those of NumPyro's ``jit_model_args=True`` path:
    ``sample_fn((state, args, kwargs)) -> (state, args, kwargs)`` and
    ``transform((state, args, kwargs)) -> collected values``.
    """

    def __init__(self, sample_fn: Callable, transform: Callable) -> None:
        self.sample_fn, self.transform = sample_fn, transform

        def start(init_state, data: ModelData, size: int):
            """The empty collection (NumPyro's, computed from the transformed initial state
            in a program of the data: eagerly, a vmapped ``postprocess_fn`` would read them
            in a trace and make the kernel's references)."""
            args, kwargs = data.args_kwargs()

            def zeros_like_stack(x):
                nx = jnp.asarray(x)
                return jnp.zeros((size, *nx.shape), dtype=nx.dtype) * nx[None, ...]

            return jax.tree.map(zeros_like_stack, transform((init_state, args, kwargs)))

        self.start = fast_compile_jit(start, static_argnums=2)

        def body(i, val, collection, start_idx, thinning, data: ModelData):
            args, kwargs = data.args_kwargs()
            val = sample_fn((val, args, kwargs))[0]
            idx = (i - start_idx) // thinning

            def update_fn(collect_array, new_val):
                return cond(idx >= 0, collect_array, lambda x: x.at[idx].set(new_val),
                            collect_array, identity)

            collection = jax.tree.map(update_fn, collection, transform((val, args, kwargs)))
            return val, collection, start_idx, thinning

        self.body = fast_compile_jit(body, donate_argnums=2)

        def loop(upper, val, collection, start_idx, thinning, data: ModelData):
            return lax.fori_loop(0, upper, lambda i, vals: body(i, *vals, data),
                                 (val, collection, start_idx, thinning))

        self.loop = fast_compile_jit(loop, static_argnums=0, donate_argnums=2)


def collect(programs: LoopPrograms, lower: int, upper: int, init_state: Any, data: ModelData,
            *, progbar: bool, progress_rate: int | None, thinning: int,
            collection_size: int | None, progbar_desc: Callable[[int], str],
            diagnostics_fn: Callable[[Any], str] | None) -> tuple[Any, Any]:
    """``numpyro.util.fori_collect(..., return_last_val=True)`` for one chain (or vectorized
    chains): the collected values and the last state."""
    assert lower <= upper and thinning >= 1
    collection_size = ((upper - lower) // thinning if collection_size is None
                       else collection_size)
    assert collection_size >= (upper - lower) // thinning
    start_idx = lower + (upper - lower) % thinning
    if progress_rate is None:
        progress_rate = int(upper / 20) if upper > 20 else 1
    collection = programs.start(init_state, data, collection_size)
    if not progbar:
        last, collection, _, _ = programs.loop(upper, init_state, collection, start_idx,
                                               thinning, data)
        return collection, last
    vals = (init_state, collection, jnp.asarray(start_idx), jnp.asarray(thinning))
    if upper == 0:  # NumPyro's special case: compile the step only
        val, collection, start, thin = vals
        _, collection, _, _ = programs.body(-1, val, collection, start, thin, data)
        vals = (val, collection, start, thin)
    else:
        with tqdm.trange(upper, miniters=progress_rate) as t:
            for i in t:
                vals = programs.body(i, *vals, data)
                t.set_description(progbar_desc(i), refresh=False)
                if diagnostics_fn:
                    t.set_postfix_str(diagnostics_fn(vals[0]), refresh=False)
    last, collection, _, _ = vals
    return collection, last
