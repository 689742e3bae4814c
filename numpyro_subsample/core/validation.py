"""The declaration of one option (:class:`Option`) and the validation of values against it.

:func:`check_values` raises :class:`OptionTypeError` (a ``TypeError``, and a ``ValueError``)
for a value of the wrong type and ``ValueError`` for a value out of range, not among the
choices, or an unknown option name; :func:`requirement` words what an option accepts. The
declarations of the package's options are in :mod:`numpyro_subsample.core.options`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Option", "OptionTypeError", "check_values", "requirement"]


class OptionTypeError(TypeError, ValueError):
    """An argument of the wrong type. Also a ``ValueError``, so that code catching invalid
    arguments as ``ValueError`` sees every bad option."""


@dataclass(frozen=True)
class Option:
    """The declaration of one option.

    Parameters
    ----------
    kind
        ``"int"``, ``"real"`` (finite), ``"bool"``, ``"str"``, ``"array"`` (array-like, at
        least one dimension), ``"ints"`` / ``"reals"`` (a sequence of such numbers, each in the
        range), ``"callable"``, ``"mapping"``; or a tuple of these (any of them).
    meaning
        What the option is, for the message.
    low, high, open_low, open_high
        The range of a number (``None``: unbounded); open or closed ends.
    choices
        The accepted values (strings, or numbers for ``"int"``); for a numeric or array kind,
        strings accepted besides the numbers or arrays.
    none
        ``None`` is accepted (the default).
    remedy
        What to pass instead (the message ends with it).
    must
        Replaces the generated description of the accepted values.
    """

    kind: str | tuple[str, ...]
    meaning: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple = ()
    none: bool = False
    remedy: str = ""
    must: str = ""

    @property
    def kinds(self) -> tuple[str, ...]:
        return (self.kind,) if isinstance(self.kind, str) else tuple(self.kind)


# -- type tests ----------------------------------------------------------------------------------
def _is_bool(v: Any) -> bool:
    return isinstance(v, (bool, np.bool_))


def _is_scalar_array(v: Any, kinds: tuple) -> bool:
    """A 0-d NumPy/JAX array whose dtype is a subtype of one of ``kinds``."""
    shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
    return shape == () and dtype is not None and any(np.issubdtype(dtype, k) for k in kinds)


def _is_int(v: Any) -> bool:
    if _is_bool(v):
        return False
    return isinstance(v, (numbers.Integral, np.integer)) or _is_scalar_array(v, (np.integer,))


def _is_real(v: Any) -> bool:
    if _is_bool(v):
        return False
    if isinstance(v, (numbers.Real, np.integer, np.floating)):
        return True
    return _is_scalar_array(v, (np.floating, np.integer))


def _is_array(v: Any) -> bool:
    if isinstance(v, (str, bytes, Mapping)) or v is None:
        return False
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return len(v.shape) >= 1
    if isinstance(v, (list, tuple)):
        try:
            return np.asarray(v).ndim >= 1
        except (ValueError, TypeError):
            return False
    return False


def _is_seq(v: Any, item: Callable[[Any], bool]) -> bool:
    if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__iter__"):
        return False
    if hasattr(v, "shape") and len(v.shape) != 1:
        return False
    return all(item(x) for x in v)


_TYPES: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "real": _is_real,
    "bool": _is_bool,
    "str": lambda v: isinstance(v, str),
    "array": _is_array,
    "ints": lambda v: _is_seq(v, _is_int),
    "reals": lambda v: _is_seq(v, _is_real),
    "callable": callable,
    "mapping": lambda v: isinstance(v, Mapping),
}


# -- descriptions ----------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _numbers_text(opt: Option, noun: str, single: bool) -> str:
    """"a positive integer", "an integer ≥ 2", "in (0, 1]", "positive numbers" (plural)."""
    lo, hi = opt.low, opt.high
    article = ("an " if noun[0] in "aeiou" else "a ") if single else ""
    nouns = noun if single else noun + "s"
    if lo is None and hi is None:
        return article + nouns
    if hi is None and lo == 0:
        adj = "positive" if opt.open_low else "non-negative"
        return ("a " if single else "") + f"{adj} {nouns}"
    if hi is None and lo == 1 and noun == "integer":
        return ("a " if single else "") + f"positive {nouns}"
    if hi is None:
        return f"{article}{nouns} {'>' if opt.open_low else '≥'} {_fmt(lo)}"
    if lo is None:
        return f"{article}{nouns} {'<' if opt.open_high else '≤'} {_fmt(hi)}"
    interval = (f"{'(' if opt.open_low else '['}{_fmt(lo)}, "
                f"{_fmt(hi)}{')' if opt.open_high else ']'}")
    if single and noun == "number":
        return f"in {interval}"
    return f"{article}{nouns} in {interval}"


_KIND_TEXT = {"array": "an array", "callable": "a callable", "mapping": "a dict",
              "str": "a string"}


def requirement(opt: Option) -> str:
    """What ``opt`` accepts, in words ("a positive integer", "in (0, 1]", "'a', 'b' or None")."""
    if opt.must:
        return opt.must
    strings = [repr(c) for c in opt.choices if isinstance(c, str)]
    numbers_ = [repr(c) for c in opt.choices if not isinstance(c, str)]
    parts = []
    for kind in opt.kinds:
        if kind == "int":
            parts += numbers_ or [_numbers_text(opt, "integer", True)]
        elif kind == "real":
            parts.append(_numbers_text(opt, "number", True))
        elif kind in ("ints", "reals"):
            noun = "integer" if kind == "ints" else "number"
            parts.append("a sequence of " + _numbers_text(opt, noun, False))
        elif kind == "bool":
            parts += ["True", "False"]
        elif not (kind == "str" and strings):
            parts.append(_KIND_TEXT[kind])
    parts += strings
    if len(parts) > 2 and len(parts) == len(strings):
        return "one of " + ", ".join(parts) + (" or None" if opt.none else "")
    parts += ["None"] if opt.none else []
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


# -- checking --------------------------------------------------------------------------------------
def _in_range(opt: Option, x: float) -> bool:
    if not math.isfinite(x):
        return False
    if opt.low is not None and (x < opt.low or (opt.open_low and x == opt.low)):
        return False
    if opt.high is not None and (x > opt.high or (opt.open_high and x == opt.high)):
        return False
    return True


def _problem(opt: Option, value: Any) -> type[Exception] | None:
    """None if ``value`` is acceptable, else the exception class to raise."""
    if value is None:
        return None if opt.none else OptionTypeError
    if isinstance(value, str):
        strings = tuple(c for c in opt.choices if isinstance(c, str))
        if value in strings:
            return None
        if strings or "str" in opt.kinds:
            return ValueError
        return OptionTypeError
    matched = [k for k in opt.kinds if k != "str" and _TYPES[k](value)]
    if not matched:
        return OptionTypeError
    for kind in matched:
        if kind == "int":
            ints = tuple(c for c in opt.choices if not isinstance(c, str))
            if (value in ints) if ints else _in_range(opt, float(value)):
                return None
        elif kind == "real":
            if _in_range(opt, float(value)):
                return None
        elif kind in ("ints", "reals"):
            if all(_in_range(opt, float(x)) for x in value):
                return None
        else:
            return None
    return ValueError


def check_values(who: str, spec: Mapping[str, Option], values: Mapping[str, Any]) -> None:
    """Validate ``values`` against the options ``spec``; messages start with ``who``.

    Raises
    ------
    OptionTypeError
        A value of the wrong type (a ``TypeError`` and a ``ValueError``).
    ValueError
        A value out of range or not among the choices, or an unknown option name.
    """
    unknown = sorted(set(values) - set(spec))
    if unknown:
        raise ValueError(
            f"{who}: unknown option(s) {unknown}; valid options: {sorted(spec)}."
        )
    for name, value in values.items():
        opt = spec[name]
        exc = _problem(opt, value)
        if exc is None:
            continue
        seen = repr(value) if exc is ValueError else f"{value!r} (type {type(value).__name__})"
        remedy = opt.remedy or f"Pass {requirement(opt)}."
        raise exc(
            f"{who}: {name} must be {requirement(opt)}, got {seen}. ({name}: {opt.meaning}.) "
            f"{remedy}"
        )
