"""LIBSVM text files (covtype.binary, a9a, ijcnn1, w8a, ...): :func:`load_libsvm`.

Parsed by :func:`sklearn.datasets.load_svmlight_file`; a malformed file is then scanned line by
line to name the first bad line (rules in :mod:`~numpyro_subsample.datasets.loaders`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from numpyro_subsample.datasets.generators import Dataset, build_dataset
from numpyro_subsample.datasets.textio import _OPENERS, _STREAM_ERRORS, _blame_stream, _raw_lines
from numpyro_subsample.datasets.validation import _binary_labels, _check_file, _checked

__all__ = ["load_libsvm"]


_LIBSVM_FEATURES = {"covtype": 54, "a9a": 123, "ijcnn1": 22, "w8a": 300}


def _guess_libsvm_name(path: Path) -> str | None:
    base = path.name.lower()
    for name in _LIBSVM_FEATURES:
        if base.startswith(name):
            return name
    return None


def _scan_libsvm(path: Path, n_features: int | None) -> None:
    """Raise a ValueError naming the line of the first malformed LIBSVM line, if any.

    The slow, line-by-line twin of the fast parser's checks plus :func:`_read_libsvm`'s, run
    only once those found a problem, to locate it.
    """
    site = f"LIBSVM file {str(path)!r}"
    fmt = "a LIBSVM line is 'label index:value index:value ...' with 1-based increasing indices"
    for line_no, raw in _raw_lines(path):
        tokens = raw.split(b"#", 1)[0].split()
        if not tokens:
            continue
        where = f"{site}, line {line_no}"
        try:
            label = float(tokens[0])
        except ValueError:
            raise ValueError(f"{where}: the label {_tok(tokens[0])} is not a number; {fmt}.") \
                from None
        if not math.isfinite(label):
            raise ValueError(f"{where}: the label {_tok(tokens[0])} is not finite.")
        rest = tokens[1:]
        if rest and rest[0].startswith(b"qid:"):
            try:
                int(rest[0][4:])
            except ValueError:
                raise ValueError(f"{where}: {_tok(rest[0])} is not 'qid:<integer>'.") from None
            rest = rest[1:]
        previous = 0
        for tok in rest:
            index, sep, value = tok.partition(b":")
            if not sep:
                raise ValueError(f"{where}: the token {_tok(tok)} is not 'index:value'; {fmt}.")
            try:
                idx = int(index)
            except ValueError:
                raise ValueError(
                    f"{where}: the index of {_tok(tok)} is not an integer; {fmt}."
                ) from None
            try:
                val = float(value)
            except ValueError:
                raise ValueError(f"{where}: the value of {_tok(tok)} is not a number.") from None
            if idx <= 0:
                raise ValueError(f"{where}: the index of {_tok(tok)} is not positive; {fmt}.")
            if idx <= previous:
                raise ValueError(
                    f"{where}: the index of {_tok(tok)} does not increase (previous index "
                    f"{previous}); {fmt}."
                )
            if n_features is not None and idx > n_features:
                raise ValueError(
                    f"{where}: the index of {_tok(tok)} exceeds n_features={n_features}; pass a "
                    "larger n_features (for a test file: the training file's feature count)."
                )
            with np.errstate(over="ignore"):
                if not np.isfinite(np.float32(val)):
                    raise ValueError(f"{where}: the value of {_tok(tok)} is not finite in float32.")
            previous = idx


def _tok(token: bytes) -> str:
    return repr(token.decode("utf-8", "replace"))


def _read_libsvm(path: Path, n_features: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Dense float32 X and float64 labels of a LIBSVM file, validated (see the module doc)."""
    from sklearn.datasets import load_svmlight_file

    opener = _OPENERS.get(path.suffix.lower(), open)
    with _blame_stream(path):
        try:
            with opener(path, "rb") as fh:
                Xs, ys, _ = load_svmlight_file(
                    fh, n_features=n_features, dtype=np.float32, zero_based=False, query_id=True
                )
        except (ValueError, *_STREAM_ERRORS) as err:
            _scan_libsvm(path, n_features)
            raise ValueError(f"{str(path)!r} is not a readable LIBSVM file: {err}") from err
        if Xs.shape[0] == 0:
            raise ValueError(f"LIBSVM file {str(path)!r} has no data lines.")
        if not (np.all(np.isfinite(Xs.data)) and np.all(np.isfinite(ys))):
            _scan_libsvm(path, n_features)
            raise ValueError(f"LIBSVM file {str(path)!r} holds non-finite values.")
    return Xs.toarray(), ys


def load_libsvm(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    test_path: str | os.PathLike | None = None,
    n_features: int | None = None,
    test_fraction: float | None = None,
    seed: int = 0,
    intercept: bool = True,
    label_map: Mapping[Any, int] | None = None,
    positive_class: Any = None,
) -> Dataset:
    """A binary LIBSVM data set (covtype.binary, a9a, ijcnn1, w8a, ...), densified to float32.

    ``name`` (guessed from the file name) selects the paper's preprocessing: for ``covtype``,
    ``RobustScaler`` on the 10 numeric columns and a stratified split with ``test_fraction``
    (default 0.25) as in Putcha et al.'s ``covtype.py``; the other data sets are used as LIBSVM
    scales them.

    Parameters
    ----------
    path : str or os.PathLike
        The training file (``.gz``, ``.bz2``, ``.xz`` read directly).
    name : str, optional
        Data set name; guessed from the file name.
    test_path : str or os.PathLike, optional
        A test file (e.g. ``a9a.t``), read with the training file's feature count.
    n_features : int, optional
        Number of features; by default the data set's, else the largest index in the file.
    test_fraction, seed : float or None, int
        Random split when there is no test file.
    intercept : bool
        Prepend a column of ones.
    label_map, positive_class : mapping or label, optional
        Explicit binarisation: ``{class: 0 or 1}`` for every class, or the class mapped to 1
        (all others to 0). Without them two label values are mapped in order, the larger to 1
        (−1/+1 and covtype's 1/2 → 0/1), and more than two raise.

    Raises
    ------
    ValueError
        On a malformed line (naming the file and line), a truncated or corrupt file, or labels
        that are not binary without an explicit mapping.
    """
    path = _check_file(path)
    name = name or _guess_libsvm_name(path) or path.stem
    n_features = n_features or _LIBSVM_FEATURES.get(name)
    X, y = _read_libsvm(path, n_features)
    X_test = y_test = None
    if test_path is not None:
        X_test, y_test = _read_libsvm(_check_file(test_path), X.shape[1])
    (y, y_test), labels = _binary_labels(
        f"LIBSVM file {str(path)!r}" + (f" (+ {str(test_path)!r})" if test_path else ""),
        [y, y_test], label_map, positive_class,
    )
    info: dict[str, Any] = {"path": str(path), **labels}
    stratify = False
    if name == "covtype":
        from sklearn.preprocessing import RobustScaler

        if X_test is not None:
            scaler = RobustScaler().fit(np.concatenate([X[:, :10], X_test[:, :10]]))
            X_test[:, :10] = scaler.transform(X_test[:, :10])
        else:
            scaler = RobustScaler().fit(X[:, :10])
        X[:, :10] = scaler.transform(X[:, :10])
        info["standardisation"] = "RobustScaler on the 10 numeric columns"
        stratify = True
        if test_fraction is None and X_test is None:
            test_fraction = 0.25
    else:
        info["standardisation"] = "none (LIBSVM scaling)"
    return _checked(path, build_dataset(name, "logistic", X, y, X_test, y_test, intercept,
                                        test_fraction, seed, stratify, info))
