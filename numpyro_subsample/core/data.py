"""The model's data as a pytree: arrays traced, everything else static.

Every compiled program of the package takes the data as an argument (never a captured
constant), so its size does not grow with N and it is reused for new data of the same shapes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ModelData"]


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and not isinstance(x, np.generic)


@jax.tree_util.register_pytree_node_class
class ModelData:
    """The model's ``(args, kwargs)`` as a pytree whose leaves are its arrays only.

    Array leaves (JAX or NumPy) are the children, so ``jax.jit`` traces them; every other
    leaf (Python numbers, strings, ``None``, callables) is static and lives in the structure,
    so a jitted function of ``ModelData`` is recompiled only when those change. NumPy arrays
    are converted to JAX arrays once, here.
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
        arrays = tuple(jnp.asarray(leaves[i]) for i in pos)
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
        # compared on the host: no compiled program per shape, and free on CPU
        return all(
            a is b or np.array_equal(np.asarray(a), np.asarray(b))
            for a, b in zip(self.arrays, other.arrays, strict=True)
        )

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
