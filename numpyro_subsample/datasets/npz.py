"""``.npz`` archives with ``X``, ``y`` or ``X_train``, ``y_train``, ``X_test``, ``y_test``:
:func:`load_npz` (rules in :mod:`~numpyro_subsample.datasets.loaders`).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from numpyro_subsample.datasets.generators import Dataset, build_dataset
from numpyro_subsample.datasets.textio import _STREAM_ERRORS
from numpyro_subsample.datasets.validation import (
    _binary_labels,
    _check_choice,
    _check_file,
    _checked,
)

__all__ = ["load_npz"]


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    def corrupt(err: BaseException) -> ValueError:
        return ValueError(
            f"{str(path)!r} is truncated or corrupt, or not an .npz archive of numeric arrays "
            f"({type(err).__name__}: {err}); re-create it with numpy.savez(path, X=..., y=...)."
        )

    errors = (*_STREAM_ERRORS, ValueError, zipfile.BadZipFile)
    try:
        archive = np.load(path, allow_pickle=False)
    except errors as err:
        raise corrupt(err) from err
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(
            f"{str(path)!r} holds a single array (.npy format), not an .npz archive; save X and "
            "y with numpy.savez(path, X=..., y=...)."
        )
    with archive:
        try:
            return {k: np.asarray(archive[k]) for k in archive.files}
        except errors as err:
            raise corrupt(err) from err


def _numeric(path: Path, key: str, arr: np.ndarray, ndim: int) -> np.ndarray:
    """``arr`` as float64 after checking its kind, rank and finiteness (naming row, column)."""
    if arr.dtype.kind not in "biuf":
        raise ValueError(
            f"{str(path)!r}: array {key!r} has dtype {arr.dtype}, expected numbers."
        )
    if arr.ndim != ndim:
        raise ValueError(
            f"{str(path)!r}: array {key!r} must have {ndim} dimension(s), got shape {arr.shape}."
        )
    arr = np.asarray(arr, np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        at = np.unravel_index(int(np.argmax(bad)), arr.shape)
        where = f"row {at[0]}" + (f", column {at[1]}" if ndim == 2 else "")
        raise ValueError(
            f"{str(path)!r}: array {key!r} has a non-finite value ({arr[at]}) at {where} "
            "(0-based); remove or impute it before saving."
        )
    return arr


def _npz_arrays(path: Path, arrays: dict) -> tuple:
    """``(keys, X, y, X_test, y_test)`` of an archive's arrays (``X_float64`` and
    ``y_float64`` preferred to ``X`` and ``y``; no test set: None), X and X_test checked numeric
    and finite, the shapes checked; y and y_test as stored."""
    if "X_train" in arrays and "y_train" in arrays:
        keys = ("X_train", "y_train", "X_test", "y_test")
    elif "X" in arrays and "y" in arrays:
        keys = ("X_float64" if "X_float64" in arrays else "X",
                "y_float64" if "y_float64" in arrays else "y", None, None)
    else:
        raise ValueError(
            f"{str(path)!r} holds arrays {sorted(arrays)}; expected 'X' and 'y', or 'X_train', "
            "'y_train' (and optionally 'X_test', 'y_test')."
        )
    if (keys[2] in arrays) != (keys[3] in arrays):
        raise ValueError(f"{str(path)!r}: 'X_test' and 'y_test' must be given together.")
    X = _numeric(path, keys[0], arrays[keys[0]], 2)
    y = arrays[keys[1]]
    X_test = _numeric(path, "X_test", arrays["X_test"], 2) if keys[2] in arrays else None
    y_test = arrays.get("y_test") if keys[3] in arrays else None
    if y.shape != (X.shape[0],):
        raise ValueError(f"{str(path)!r}: X must be (N, p) and y (N,), got {X.shape}, {y.shape}.")
    if X_test is not None and (X_test.shape[1] != X.shape[1] or
                               y_test.shape != (X_test.shape[0],)):
        raise ValueError(
            f"{str(path)!r}: X_test must be (M, {X.shape[1]}) and y_test (M,), got "
            f"{X_test.shape}, {y_test.shape}."
        )
    return keys, X, y, X_test, y_test


def load_npz(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    task: str | None = None,
    standardise: str = "auto",
    test_fraction: float | None = 0.25,
    seed: int = 0,
    intercept: bool = True,
    label_map: Mapping[Any, int] | None = None,
    positive_class: Any = None,
) -> Dataset:
    """An ``.npz`` archive with ``X``, ``y`` (split with ``test_fraction``, ``seed``) or with
    ``X_train``, ``y_train``, ``X_test``, ``y_test``.

    Parameters
    ----------
    path : str or os.PathLike
        The archive.
    name : str, optional
        Data set name; the file's stem by default.
    task : {"logistic", "linear"}, optional
        By default logistic when ``y`` takes at most two values or a label mapping is given.
    standardise : {"auto", "covtype", "none"}
        ``"auto"``: StandardScaler on non-binary feature columns, and on y for a regression
        (fitted on the training rows); ``"covtype"``: RobustScaler on the first 10 columns, as
        :func:`load_libsvm` does for covtype.
    test_fraction, seed : float or None, int
        Random split when the archive has no test set.
    intercept : bool
        Prepend a column of ones.
    label_map, positive_class : mapping or label, optional
        Explicit binarisation for a logistic task (as in :func:`load_libsvm`); without them
        more than two classes raise.

    Raises
    ------
    ValueError
        On a truncated or corrupt archive, missing or ill-shaped arrays, non-numeric or
        non-finite values (naming the array, row and column), or labels that are not binary.
    """
    path = _check_file(path)
    _check_choice("standardise", standardise, ("auto", "covtype", "none"))
    if task is not None:
        _check_choice("task", task, ("logistic", "linear"))
    keys, X, y, X_test, y_test = _npz_arrays(path, _read_npz(path))
    explicit = label_map is not None or positive_class is not None
    if task is None:
        task = "logistic" if explicit or np.unique(y).size <= 2 else "linear"
    if task == "linear" or y.dtype.kind in "biuf":
        y = _numeric(path, keys[1], y, 1)
        y_test = None if y_test is None else _numeric(path, "y_test", y_test, 1)
    if task == "linear" and explicit:
        raise ValueError(f"{str(path)!r}: label_map/positive_class need task='logistic'.")
    info: dict[str, Any] = {"path": str(path), "standardisation": "none"}
    if task == "logistic":
        (y, y_test), labels = _binary_labels(
            repr(str(path)), [y, y_test], label_map, positive_class
        )
        info.update(labels)
    if standardise == "covtype":
        from sklearn.preprocessing import RobustScaler

        scaler = RobustScaler().fit(X[:, :10])
        X = X.copy()
        X[:, :10] = scaler.transform(X[:, :10])
        if X_test is not None:
            X_test = X_test.copy()
            X_test[:, :10] = scaler.transform(X_test[:, :10])
        info["standardisation"] = "RobustScaler on the 10 numeric columns"
    elif standardise == "auto":
        binary = np.all((X == 0) | (X == 1), axis=0)
        cols = np.flatnonzero(~binary)
        if cols.size:
            mu, sd = X[:, cols].mean(0), X[:, cols].std(0)
            sd = np.where(sd > 0, sd, 1.0)
            X = X.copy()
            X[:, cols] = (X[:, cols] - mu) / sd
            if X_test is not None:
                X_test = X_test.copy()
                X_test[:, cols] = (X_test[:, cols] - mu) / sd
        info["standardisation"] = f"StandardScaler on {cols.size} non-binary columns"
        if task == "linear":
            ym, ys = float(np.mean(y)), float(np.std(y)) or 1.0
            y = (y - ym) / ys
            if y_test is not None:
                y_test = (y_test - ym) / ys
            info["standardisation"] += " and on y"
    return _checked(path, build_dataset(
        name or path.stem, task, X, y, X_test, y_test, intercept,
        test_fraction if X_test is None else None, seed, task == "logistic", info,
    ))
