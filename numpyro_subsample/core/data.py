"""The model's data as a pytree: arrays traced, everything else static.

Every compiled program of the package takes the data as an argument (never a captured
constant), so its size does not grow with N and it is reused for new data of the same shapes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

__all__ = ["ModelData", "check_data_finite", "check_mapped", "device_array", "indexed_axes",
           "trace_seed"]


def device_array(x: Any, dtype: Any = None) -> jax.Array:
    """``x``, a host value (NumPy array or scalar), as a JAX array on the default device, by a
    transfer: outside a trace ``jnp.asarray`` of a NumPy value runs an eager ``stage``
    program, compiled once per shape and dtype."""
    return jax.device_put(np.asarray(x, dtype))


def check_mapped(x: Any) -> None:
    """Raise if ``x`` is a memory-mapped array (``np.load(path, mmap_mode="r")``) that JAX
    on the CPU would copy into memory instead of using the mapped file in place: it does so
    only for a C-contiguous, 64-byte aligned array of its own dtype (float32 unless
    ``jax_enable_x64``), which a float32 ``.npy`` file loaded whole always is."""
    if not isinstance(x, np.memmap) or jax.default_backend() != "cpu":
        return
    want = jax.dtypes.canonicalize_dtype(x.dtype)
    if want != x.dtype or not x.flags.c_contiguous or x.ctypes.data % 64:
        why = (f"its dtype {x.dtype} is not JAX's {want}" if want != x.dtype
               else "it is not a C-contiguous, 64-byte aligned array (a slice of the file?)")
        raise ValueError(
            f"The memory-mapped array of {x.filename} (shape {x.shape}) would be copied whole "
            f"into memory: {why}. Save the data as a {want} .npy file (e.g. written in chunks "
            f"into np.lib.format.open_memmap(path, 'w+', np.{want}, shape)) and pass "
            "np.load(path, mmap_mode='r'), or pass np.asarray(...) to copy it on purpose."
        )


def trace_seed() -> jax.Array:
    """``PRNGKey(0)``'s data, for ``handlers.seed`` where a model is traced for its structure or
    log density (its sample sites are substituted, so the key draws nothing that matters)."""
    return device_array(np.zeros(2, np.uint32))


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and not isinstance(x, np.generic)


def _same_array(a: Any, b: Any, block_bytes: int = 1 << 24) -> bool:
    """Whether two arrays of one shape and dtype hold equal values: the same object or the
    same buffer (two JAX arrays over one NumPy or memory-mapped array), else compared on the
    host (no compiled program per shape) in blocks of rows, so that the comparison's
    temporary is ``block_bytes``, not the data's size."""
    if a is b:
        return True
    with contextlib.suppress(Exception):  # NumPy, or several devices: compare values
        if a.unsafe_buffer_pointer() == b.unsafe_buffer_pointer():
            return True
    x, y = np.asarray(a), np.asarray(b)
    if x.ndim == 0 or x.shape[0] == 0:
        return bool(np.array_equal(x, y))
    rows = max(1, block_bytes // max(1, x[:1].nbytes))
    return all(np.array_equal(x[s:s + rows], y[s:s + rows]) for s in range(0, len(x), rows))


@jax.tree_util.register_pytree_node_class
class ModelData:
    """The model's ``(args, kwargs)`` as a pytree whose leaves are its arrays only.

    Array leaves (JAX or NumPy) are the children, so ``jax.jit`` traces them; every other
    leaf (Python numbers, strings, ``None``, callables) is static and lives in the structure,
    so a jitted function of ``ModelData`` is recompiled only when those change. NumPy arrays
    are converted to JAX arrays once, here.

    Parameters
    ----------
    arrays
        The array leaves of ``(args, kwargs)``.
    static
        The tree structure with every non-array leaf. Build with ``ModelData.from_args``.

    References
    ----------
    Putcha, Nemeth and Fearnhead (2023), Eq. 1 (the data x_i of the per-datum terms f_i).
    """

    __slots__ = ("arrays", "static")

    def __init__(self, arrays: tuple, static: tuple):
        self.arrays = tuple(arrays)
        self.static = static  # (treedef, positions of arrays, non-array leaves)

    @classmethod
    def from_args(cls, model_args: tuple = (), model_kwargs: dict | None = None) -> ModelData:
        leaves, treedef = jax.tree.flatten(
            (tuple(model_args), dict(model_kwargs or {})), is_leaf=lambda x: x is None
        )
        pos = tuple(i for i, x in enumerate(leaves) if _is_array(x))
        for i in pos:
            check_mapped(leaves[i])
        arrays = tuple(device_array(leaves[i]) if isinstance(leaves[i], np.ndarray)
                       else jnp.asarray(leaves[i]) for i in pos)
        others = tuple(x for i, x in enumerate(leaves) if i not in set(pos))
        return cls(arrays, (treedef, pos, others))

    def args_kwargs(self) -> tuple[tuple, dict]:
        treedef, pos, others = self.static
        leaves, it_a, it_o = [], iter(self.arrays), iter(others)
        posset = set(pos)
        for i in range(len(pos) + len(others)):
            leaves.append(next(it_a) if i in posset else next(it_o))
        args, kwargs = jax.tree.unflatten(treedef, leaves)
        return args, kwargs

    def names(self) -> tuple[str, ...]:
        """Readable names of the array leaves (``model_args[0]``, ``model_kwargs['y']``)."""
        args, kwargs = self.args_kwargs()
        out = []
        for prefix, tree in (("model_args", args), ("model_kwargs", kwargs)):
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
                if _is_array(leaf) or isinstance(leaf, jax.core.Tracer):
                    out.append(prefix + jax.tree_util.keystr(path))
        return tuple(out)

    def signature(self) -> tuple:
        """Hashable: static part, shapes and dtypes (equal signatures share compiled code)."""
        treedef, pos, others = self.static
        try:
            hash(others)
            stat = others
        except TypeError:
            stat = tuple(id(o) for o in others)
        return (treedef, pos, stat, tuple((a.shape, str(a.dtype)) for a in self.arrays))

    def same_values(self, other: ModelData | None) -> bool:
        """True if ``other`` holds the same static part and equal arrays (by identity or value)."""
        if other is None or self.signature() != other.signature():
            return False
        return all(_same_array(a, b) for a, b in zip(self.arrays, other.arrays, strict=True))

    def tree_flatten(self):
        return self.arrays, self.static

    @classmethod
    def tree_unflatten(cls, static, arrays):
        obj = object.__new__(cls)
        obj.arrays, obj.static = tuple(arrays), static
        return obj

    def __repr__(self) -> str:
        pairs = zip(self.names(), self.arrays, strict=True)
        return f"ModelData({', '.join(f'{n}: {a.shape}' for n, a in pairs)})"


# -- which arrays the plate's indices select rows of ---------------------------------------------
#: call primitives whose inner jaxpr takes the call's operands one to one
_CALLS = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
          "remat", "checkpoint"}
#: primitives whose output is the operand's data (same values, maybe another dtype)
_SAME = {"convert_element_type", "copy", "copy_p"}


def _inner(eqn) -> jex.Jaxpr | None:
    if eqn.primitive.name not in _CALLS:
        return None
    for value in eqn.params.values():
        jaxpr = value.jaxpr if isinstance(value, jex.ClosedJaxpr) else value
        if isinstance(jaxpr, jex.Jaxpr) and len(jaxpr.invars) == len(eqn.invars):
            return jaxpr
    return None


def _walk(jaxpr: jex.Jaxpr, derived: set, alias: dict, found: set) -> None:
    """Follow index arithmetic on the plate's indices (``derived``) and views of data arrays
    (``alias``: var -> (array position, original axis of each axis)) through ``jaxpr``; add
    (position, axis) to ``found`` for every gather of one axis of a data array at derived
    indices."""
    for eqn in jaxpr.eqns:
        ins = [v for v in eqn.invars if isinstance(v, jex.Var)]
        name = eqn.primitive.name
        if name == "gather":
            operand, indices = eqn.invars[:2]
            dims = eqn.params["dimension_numbers"].start_index_map
            if operand in alias and indices in derived and len(dims) == 1:
                pos, axes = alias[operand]
                found.add((pos, axes[dims[0]]))
            continue  # gathered values are data, not index arithmetic
        if name in _SAME and ins and ins[0] in alias:
            alias[eqn.outvars[0]] = alias[ins[0]]
        elif name == "transpose" and ins and ins[0] in alias:
            pos, axes = alias[ins[0]]
            alias[eqn.outvars[0]] = (pos, tuple(axes[p] for p in eqn.params["permutation"]))
        inner = _inner(eqn)
        if inner is not None:
            pairs = [(o, i) for o, i in zip(eqn.invars, inner.invars, strict=True)
                     if isinstance(o, jex.Var)]
            sub_derived = {i for o, i in pairs if o in derived}
            sub_alias = {i: alias[o] for o, i in pairs if o in alias}
            _walk(inner, sub_derived, sub_alias, found)
            for o, i in zip(eqn.outvars, inner.outvars, strict=True):
                if isinstance(i, jex.Var) and i in sub_derived:
                    derived.add(o)
            continue
        if any(v in derived for v in ins):
            derived.update(eqn.outvars)


def indexed_axes(fn: Callable, idx: Any, data: ModelData) -> set[tuple[int, int]]:
    """The axes of ``data``'s arrays whose rows ``fn(idx, data)`` selects by ``idx``.

    Returns ``{(position in data.arrays, axis)}`` for every gather of one axis of a data array
    at indices computed from ``idx`` alone (``X[idx]``, ``jnp.take(X, idx, axis)``,
    ``X.T[:, idx]``), read from the jaxpr of ``fn``; indices that pass through other data (e.g.
    ``a[group[idx]]``) are not followed. Raises what tracing ``fn`` raises.
    """
    closed = jax.make_jaxpr(fn)(idx, data)
    invars = closed.jaxpr.invars
    derived = {invars[0]}
    alias = {v: (i, tuple(range(np.ndim(a))))
             for i, (v, a) in enumerate(zip(invars[1:], data.arrays, strict=True))}
    found: set[tuple[int, int]] = set()
    _walk(closed.jaxpr, derived, alias, found)
    return found


def check_data_finite(data: ModelData, num_data: int | None = None) -> None:
    """Raise if a floating array of the data holds non-finite values.

    With ``num_data`` only arrays whose leading dimension is N (the data the plate indexes)
    are checked; without it, every floating array.
    """
    for name, leaf in zip(data.names(), data.arrays, strict=True):
        if isinstance(leaf, jax.core.Tracer) or leaf.ndim == 0 or leaf.size == 0:
            continue
        if num_data is not None and leaf.shape[0] != num_data:
            continue
        if not jnp.issubdtype(leaf.dtype, jnp.inexact):
            continue
        finite = _host_rows_finite(leaf)
        if finite is None:
            finite = np.asarray(_rows_finite(leaf))
        if not finite.all():
            bad = np.flatnonzero(~finite)
            raise ValueError(
                f"The data argument {name} (shape {tuple(leaf.shape)}) has non-finite values "
                f"in {bad.size} rows, the first at row {int(bad[0])}. Remove or impute those "
                "rows before sampling."
            )


@jax.jit
def _rows_finite(x: jax.Array) -> jax.Array:
    return jnp.isfinite(x).reshape(x.shape[0], -1).all(-1)


_HOST_CHUNK = 1 << 20  # values per NumPy pass of the host check


def _host_rows_finite(leaf: Any) -> np.ndarray | None:
    """Row finiteness of a NumPy array or a JAX array on the CPU, computed by NumPy in chunks
    (no compiled program, whose compilation costs more than the check); None for arrays on
    other devices, which ``_rows_finite`` checks where they are."""
    if isinstance(leaf, jax.Array) and any(dev.platform != "cpu" for dev in leaf.devices()):
        return None
    try:
        rows = np.asarray(leaf).reshape(leaf.shape[0], -1)
        step = max(1, _HOST_CHUNK // max(1, rows.shape[1]))
        return np.concatenate([np.isfinite(rows[s:s + step]).all(1)
                               for s in range(0, rows.shape[0], step)])
    except TypeError:  # a dtype NumPy cannot test
        return None
