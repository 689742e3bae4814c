"""Argument checks of the loaders, the 0/1 coding of binary labels and the float32 check.

Label rules (:func:`_binary_labels`) are those of :mod:`~numpyro_subsample.datasets.loaders`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from numpyro_subsample.datasets.generators import Dataset


def _check_file(path: str | os.PathLike) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"Data file {str(path)!r} does not exist or is not a file.")
    if not os.access(path, os.R_OK):
        raise PermissionError(f"Data file {str(path)!r} is not readable.")
    return path


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}.")


def _show(classes: list) -> str:
    head = ", ".join(map(repr, classes[:10]))
    count = f"{len(classes)} class{'es' if len(classes) != 1 else ''}"
    return f"[{head}{', ...' if len(classes) > 10 else ''}] ({count})"


def _binary_labels(
    site: str,
    parts: Sequence[np.ndarray | None],
    label_map: Mapping[Any, int] | None,
    positive_class: Any,
    default_map: Mapping[Any, int] | None = None,
) -> tuple[list[np.ndarray | None], dict[str, Any]]:
    """0/1 float32 labels of ``parts`` (train, test, ...; ``None`` kept) by the module's rules.

    Returns the mapped parts and ``{"labels": classes seen, "label_map": {class: 0 or 1}}``.
    """
    present = [np.asarray(p) for p in parts if p is not None]
    classes, inverse = np.unique(np.concatenate(present), return_inverse=True)
    seen = classes.tolist()
    remedy = (
        "pass label_map={class: 0 or 1, ...} covering every class, or positive_class=<class> "
        "(that class -> 1, every other -> 0)"
    )
    if label_map is not None and positive_class is not None:
        raise ValueError(f"{site}: pass label_map or positive_class, not both.")
    if positive_class is not None:
        if positive_class not in seen:
            raise ValueError(
                f"{site}: positive_class={positive_class!r} is not among the classes seen "
                f"{_show(seen)}."
            )
        codes = [float(c == positive_class) for c in seen]
    elif label_map is not None or default_map is not None:
        mapping = label_map if label_map is not None else default_map
        wrong = {k: v for k, v in mapping.items() if v not in (0, 1)}
        if wrong:
            raise ValueError(f"{site}: label_map must map classes to 0 or 1, got {wrong}.")
        missing = [c for c in seen if c not in mapping]
        if missing:
            what = "label_map" if label_map is not None else f"the expected labels {dict(mapping)}"
            raise ValueError(
                f"{site}: classes {_show(missing)} are not in {what} (classes seen "
                f"{_show(seen)}); {remedy}."
            )
        codes = [float(mapping[c]) for c in seen]
    elif set(seen) <= {0, 1}:
        codes = [float(c) for c in seen]
    elif len(seen) == 2:
        codes = [0.0, 1.0]
    else:
        raise ValueError(
            f"{site}: a binary task needs two label classes (or labels in {{0, 1}}), the labels "
            f"take {_show(seen)}; {remedy}."
        )
    y = np.asarray(codes, np.float32)[np.ravel(inverse)]
    pieces = iter(np.split(y, np.cumsum([p.shape[0] for p in present])[:-1]))
    out = [None if p is None else next(pieces) for p in parts]
    return out, {"labels": seen, "label_map": dict(zip(seen, codes, strict=True))}


def _checked(path: Path, ds: Dataset) -> Dataset:
    """Refuse values that became infinite in the float32 conversion."""
    for key in ("X_train", "y_train", "X_test", "y_test"):
        arr = getattr(ds, key)
        if arr is not None and not np.all(np.isfinite(arr)):
            raise ValueError(
                f"{str(path)!r}: {key} exceeds the float32 range (|x| > 3.4e38) after "
                f"preprocessing ({ds.info.get('standardisation')}); rescale the data."
            )
    return ds
