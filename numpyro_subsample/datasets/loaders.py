"""Loaders for the original files of the papers' data sets (no network access anywhere).

- UCI CASP (``CASP.csv``, header ``RMSD,F1..F9``): :func:`load_casp`;
- LIBSVM text files (``covtype.binary``/``covtype.libsvm.binary[.scale]``, ``a9a`` + ``a9a.t``,
  ``ijcnn1`` (``.tr``/``.t``), ``w8a`` + ``w8a.t``): :func:`load_libsvm` (parsed by
  :func:`sklearn.datasets.load_svmlight_file`, then validated);
- UCI Skin Segmentation (``Skin_NonSkin.txt``): :func:`load_skin`;
- ``.npz`` archives with ``X``, ``y`` or ``X_train``, ``y_train``, ``X_test``, ``y_test``:
  :func:`load_npz`;
- a data set by name from a data folder, or any file by path: :func:`load_dataset`.

Text files may be compressed (``.gz``, ``.bz2``, ``.xz``; read as a stream).

Validation: a malformed file raises a :class:`ValueError` naming the file and the (1-based)
line, or for ``.npz`` the array, row and column; no row is dropped or recoded silently.

- delimited text (CSV, whitespace): a row whose number of fields differs from the header's, a
  field that is not a number, a missing (empty), NaN or infinite value; blank lines are skipped.
  Rows with missing or non-finite values are dropped only with ``on_nonfinite="drop"``, which
  warns (:class:`DroppedRowsWarning`) with their number and lines;
- LIBSVM: a label that is not a finite number, a token that is not ``index:value``, an index
  that is not a positive integer, not strictly increasing or above ``n_features``, a value not
  finite in float32. ``#`` comments and blank lines are skipped; a ``qid:<int>`` second token
  is ignored;
- a truncated or corrupt compressed stream or ``.npz`` archive raises a ValueError saying so,
  chained to the decoder's error.

Labels of binary tasks are 0/1 floats. Without ``label_map``/``positive_class``: labels in
{0, 1} are kept; two other values are mapped in order, the larger to 1 (−1/+1 → 0/1, covtype's
1/2 → 0/1); more than two classes, or one class outside {0, 1}, raise, listing the classes
seen. Skin's labels are 1 (skin) → 1 and 2 (non-skin) → 0.

Standardisation follows the code of Putcha, Nemeth and Fearnhead (2023) (github.com/
srshtiputcha/sgmcmc_preferential_subsampling, ``src/models/*/``), fitted on all rows before
the split as there:

- CASP: ``StandardScaler`` on every column *including the response RMSD* (``casp.py``), so the
  paper's linear model with unit noise sd is sensible;
- covtype: ``RobustScaler`` on the 10 numeric columns, the 44 one-hot columns untouched,
  labels {1, 2} → {0, 1}, stratified 75 % / 25 % train/test split (``covtype.py``);
- a9a, w8a (binary features) and ijcnn1 (already in [-1, 1]): no scaling (not used by the
  paper; LIBSVM's own scaling kept);
- skin (pixel values 0-255, not in the paper): ``StandardScaler`` on the 3 features;
- ``.npz`` of unknown origin (``standardise="auto"``): ``StandardScaler`` on every non-binary
  feature column, and on the response of a regression.

An intercept column of ones is prepended by default.

The LIBSVM and ``.npz`` loaders are in :mod:`~numpyro_subsample.datasets.libsvm` and
:mod:`~numpyro_subsample.datasets.npz` (re-exported here), the streamed text reading in
:mod:`~numpyro_subsample.datasets.textio`, the label coding and checks in
:mod:`~numpyro_subsample.datasets.validation`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from numpyro_subsample.datasets.generators import Dataset, build_dataset
from numpyro_subsample.datasets.libsvm import load_libsvm
from numpyro_subsample.datasets.npz import load_npz
from numpyro_subsample.datasets.textio import (
    _NONFINITE_CHOICES,
    _OPENERS,
    DroppedRowsWarning,
    _blame_stream,
    _lines,
    _parse_table,
    _records,
)
from numpyro_subsample.datasets.validation import (
    _binary_labels,
    _check_choice,
    _check_file,
    _checked,
)

__all__ = [
    "load_casp",
    "load_libsvm",
    "load_skin",
    "load_npz",
    "load_dataset",
    "DATASET_NAMES",
    "DroppedRowsWarning",
]


def load_casp(
    path: str | os.PathLike,
    *,
    test_fraction: float | None = 0.25,
    seed: int = 0,
    intercept: bool = True,
    on_nonfinite: str = "raise",
) -> Dataset:
    """UCI CASP from ``CASP.csv`` (header ``RMSD,F1,...,F9``; ``.gz``/``.bz2``/``.xz`` too).

    ``StandardScaler`` on all ten columns including RMSD (Putcha et al.'s ``casp.py``);
    y = scaled RMSD, X = scaled F1..F9.

    Parameters
    ----------
    path : str or os.PathLike
        The CSV file.
    test_fraction, seed : float or None, int
        Random train/test split (none for ``test_fraction=None``).
    intercept : bool
        Prepend a column of ones.
    on_nonfinite : {"raise", "drop"}
        A row with a missing (empty), NaN or infinite value raises (default), or is dropped
        with a :class:`DroppedRowsWarning` giving their number (``casp.py`` drops them; the UCI
        file has none).

    Raises
    ------
    ValueError
        On a wrong header, a row with the wrong number of fields, a field that is not a number,
        a non-finite value (unless dropped), or a truncated or corrupt file; the message names
        the file and line.
    """
    from sklearn.preprocessing import StandardScaler

    path = _check_file(path)
    _check_choice("on_nonfinite", on_nonfinite, _NONFINITE_CHOICES)
    with _blame_stream(path):
        records = _records(path, ",")
        first = next(records, None)
        header = [] if first is None else [f.strip() for f in first[1]]
        if len(header) < 2 or header[0].upper() != "RMSD":
            raise ValueError(
                f"{str(path)!r} is not the UCI CASP CSV: expected the header 'RMSD,F1,...,F9', "
                f"got {','.join(header)[:60]!r}."
            )
        data = _parse_table(path, records, header, on_nonfinite)
    data = StandardScaler().fit_transform(data)
    y, X = data[:, 0], data[:, 1:]
    return _checked(path, build_dataset(
        "casp", "linear", X, y, None, None, intercept, test_fraction, seed, False,
        {"path": str(path), "standardisation": "StandardScaler on all columns incl. RMSD"},
    ))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_skin(
    path: str | os.PathLike,
    *,
    test_fraction: float | None = 0.25,
    seed: int = 0,
    intercept: bool = True,
    on_nonfinite: str = "raise",
    label_map: Mapping[Any, int] | None = None,
    positive_class: Any = None,
) -> Dataset:
    """UCI Skin Segmentation (``Skin_NonSkin.txt``: B G R label), ``StandardScaler`` on B, G, R.

    Whitespace- or comma-separated (as the first non-blank line), with or without a header.

    Parameters
    ----------
    path : str or os.PathLike
        The text file (``.gz``, ``.bz2``, ``.xz`` read directly).
    test_fraction, seed : float or None, int
        Stratified random train/test split (none for ``test_fraction=None``).
    intercept : bool
        Prepend a column of ones.
    on_nonfinite : {"raise", "drop"}
        As in :func:`load_casp`.
    label_map, positive_class : mapping or label, optional
        Explicit binarisation (as in :func:`load_libsvm`). Without them the labels must be
        1 (skin, y = 1) and 2 (non-skin, y = 0); other classes raise.

    Raises
    ------
    ValueError
        On a malformed row (naming the file and line), a truncated or corrupt file, or other
        labels without an explicit mapping.
    """
    from sklearn.preprocessing import StandardScaler

    path = _check_file(path)
    _check_choice("on_nonfinite", on_nonfinite, _NONFINITE_CHOICES)
    with _blame_stream(path):
        first_line = next((t for _, t in _lines(path) if t.strip()), None)
        if first_line is None:
            raise ValueError(f"{str(path)!r} has no data rows.")
        records = _records(path, "," if "," in first_line else None)
        line_no, first = next(records)
        names: Sequence[str] = ("B", "G", "R", "label")
        if _is_number(first[0]):
            records = itertools.chain([(line_no, first)], records)
        elif len(first) != 4:
            raise ValueError(
                f"{str(path)!r}, line {line_no}: a header of {len(first)} fields, expected 4 "
                "(B, G, R, label)."
            )
        else:
            names = [f.strip() for f in first]
        data = _parse_table(path, records, names, on_nonfinite)
    (y,), labels = _binary_labels(
        repr(str(path)), [data[:, 3]], label_map, positive_class, default_map={1: 1, 2: 0}
    )
    X = StandardScaler().fit_transform(data[:, :3])
    return _checked(path, build_dataset(
        "skin", "logistic", X, y, None, None, intercept, test_fraction, seed, True,
        {"path": str(path), "standardisation": "StandardScaler on B, G, R", **labels},
    ))


# File names looked for, in order, for each named data set under a data folder.
_ORIGINAL_FILES: dict[str, list[tuple[str, str | None]]] = {
    "casp": [("CASP.csv", None), ("casp.csv", None)],
    "covtype": [
        ("covtype.libsvm.binary.scale", None), ("covtype.libsvm.binary.scale.bz2", None),
        ("covtype.libsvm.binary", None), ("covtype.libsvm.binary.bz2", None),
        ("covtype.binary", None), ("covtype.binary.scale", None),
    ],
    "a9a": [("a9a", "a9a.t")],
    "ijcnn1": [("ijcnn1.tr", "ijcnn1.t"), ("ijcnn1", "ijcnn1.t"), ("ijcnn1.bz2", "ijcnn1.t.bz2")],
    "w8a": [("w8a", "w8a.t")],
    "skin": [("Skin_NonSkin.txt", None), ("Skin_NonSkin.csv", None)],
}
_NPZ_FALLBACK = {
    "casp": ["casp.npz"],
    "covtype": ["covtype_subset20k.npz", "covtype.npz"],
    "a9a": ["a9a.npz"],
    "ijcnn1": ["ijcnn1.npz"],
    "w8a": ["w8a.npz"],
    "skin": ["skin.npz"],
}
DATASET_NAMES = tuple(_ORIGINAL_FILES)


def _candidates(data_dir: Path, name: str, filename: str) -> list[Path]:
    folders = [data_dir, data_dir / name] + sorted(data_dir.glob(f"{name}*"))
    return [f / filename for f in folders]


def load_dataset(
    name_or_path: str, data_dir: str | os.PathLike | None = None, *, seed: int = 0, **kwargs
) -> Dataset:
    """Load a named data set (``casp``, ``covtype``, ``a9a``, ``ijcnn1``, ``w8a``, ``skin``) from
    ``data_dir`` (its original files first, then a ``<name>.npz``; folders ``data_dir`` and
    ``data_dir/<name>*`` are searched), or any file by path (``.npz``, ``.csv`` = CASP layout,
    a name containing ``skin`` = Skin layout, otherwise LIBSVM; a ``.gz``/``.bz2``/``.xz``
    suffix is looked through). ``data_dir`` defaults to ``$NUMPYRO_SUBSAMPLE_DATA`` or
    ``./data``. ``kwargs`` go to the loader.
    """
    if name_or_path in _ORIGINAL_FILES:
        name = name_or_path
        root = Path(data_dir or os.environ.get("NUMPYRO_SUBSAMPLE_DATA", "data")).expanduser()
        for train, test in _ORIGINAL_FILES[name]:
            for cand in _candidates(root, name, train):
                if cand.is_file():
                    test_file = cand.parent / test if test else None
                    if name == "casp":
                        return load_casp(cand, seed=seed, **kwargs)
                    if name == "skin":
                        return load_skin(cand, seed=seed, **kwargs)
                    return load_libsvm(
                        cand, name=name, seed=seed,
                        test_path=test_file if test_file is not None and test_file.is_file()
                        else None, **kwargs,
                    )
        for fname in _NPZ_FALLBACK[name]:
            for cand in _candidates(root, name, fname):
                if cand.is_file():
                    rule = {"covtype": "covtype", "casp": "auto", "skin": "auto"}.get(name, "none")
                    kwargs.setdefault("standardise", rule)
                    ds = load_npz(cand, name=name, seed=seed, **kwargs)
                    if name == "covtype" and "subset" in cand.name:
                        ds.info["note"] = "20k-row subset of covtype (the npz fallback)"
                    return ds
        expected = ", ".join(f for f, _ in _ORIGINAL_FILES[name]) + ", " + ", ".join(
            _NPZ_FALLBACK[name]
        )
        raise FileNotFoundError(
            f"Data set {name!r} not found under {str(root)!r} (looked for {expected} there and "
            f"in {name}*/ subfolders). Pass the data folder (--data-dir / data_dir=) or a file "
            "path."
        )
    path = _check_file(name_or_path)
    if path.suffix.lower() == ".npz":
        return load_npz(path, seed=seed, **kwargs)
    if "skin" in path.name.lower():
        return load_skin(path, seed=seed, **kwargs)
    stem = path.with_suffix("") if path.suffix.lower() in _OPENERS else path
    if stem.suffix.lower() == ".csv":
        return load_casp(path, seed=seed, **kwargs)
    return load_libsvm(path, seed=seed, **kwargs)
