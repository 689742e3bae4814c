"""Loaders for the original files of the papers' data sets (no network access anywhere).

- UCI CASP (``CASP.csv``, header ``RMSD,F1..F9``): :func:`load_casp`;
- LIBSVM text files (``covtype.binary``/``covtype.libsvm.binary[.scale]``, ``a9a`` + ``a9a.t``,
  ``ijcnn1`` (``.tr``/``.t``), ``w8a`` + ``w8a.t``; ``.bz2``/``.gz`` also work): :func:`load_libsvm`
  (parsed by :func:`sklearn.datasets.load_svmlight_file`);
- UCI Skin Segmentation (``Skin_NonSkin.txt``): :func:`load_skin`;
- ``.npz`` archives with ``X``, ``y`` or ``X_train``, ``y_train``, ``X_test``, ``y_test``:
  :func:`load_npz`;
- a data set by name from a data folder, or any file by path: :func:`load_dataset`.

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

An intercept column of ones is prepended by default. Labels of binary tasks are 0/1 floats
(−1/+1 and 1/2 are mapped, the larger label to 1).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from numpyro_subsample.datasets.generators import Dataset, build_dataset

__all__ = ["load_casp", "load_libsvm", "load_skin", "load_npz", "load_dataset", "DATASET_NAMES"]


def _check_file(path: str | os.PathLike) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"Data file {str(path)!r} does not exist or is not a file.")
    if not os.access(path, os.R_OK):
        raise PermissionError(f"Data file {str(path)!r} is not readable.")
    return path



def _is_binary_task(y: np.ndarray) -> bool:
    return np.unique(y).size <= 2



def load_casp(
    path: str | os.PathLike,
    *,
    test_fraction: float | None = 0.25,
    seed: int = 0,
    intercept: bool = True,
) -> Dataset:
    """UCI CASP from ``CASP.csv``: drop rows with missing values, ``StandardScaler`` on all ten
    columns including RMSD (Putcha et al.'s ``casp.py``); y = scaled RMSD, X = scaled F1..F9."""
    from sklearn.preprocessing import StandardScaler

    path = _check_file(path)
    with open(path, encoding="utf-8-sig") as fh:
        header = fh.readline().strip().split(",")
    if not header or header[0].strip().upper() != "RMSD":
        raise ValueError(
            f"{str(path)!r} is not the UCI CASP CSV: expected the header 'RMSD,F1,...,F9', got "
            f"{','.join(header)[:60]!r}."
        )
    data = np.genfromtxt(path, delimiter=",", skip_header=1, dtype=np.float64)
    data = data[np.all(np.isfinite(data), axis=1)]
    data = StandardScaler().fit_transform(data)
    y, X = data[:, 0], data[:, 1:]
    return build_dataset(
        "casp", "linear", X, y, None, None, intercept, test_fraction, seed, False,
        {"path": str(path), "standardisation": "StandardScaler on all columns incl. RMSD"},
    )


_LIBSVM_FEATURES = {"covtype": 54, "a9a": 123, "ijcnn1": 22, "w8a": 300}


def _guess_libsvm_name(path: Path) -> str | None:
    base = path.name.lower()
    for name in _LIBSVM_FEATURES:
        if base.startswith(name):
            return name
    return None


def load_libsvm(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    test_path: str | os.PathLike | None = None,
    n_features: int | None = None,
    test_fraction: float | None = None,
    seed: int = 0,
    intercept: bool = True,
) -> Dataset:
    """A binary LIBSVM data set (covtype.binary, a9a, ijcnn1, w8a, ...), densified to float32.

    ``name`` (guessed from the file name) selects the paper's preprocessing: for ``covtype``,
    labels 1/2 → 0/1, ``RobustScaler`` on the 10 numeric columns and a stratified split with
    ``test_fraction`` (default 0.25) as in Putcha et al.'s ``covtype.py``; the other data sets are
    used as LIBSVM scales them. With ``test_path`` (e.g. ``a9a.t``) that file is the test set.
    """
    from sklearn.datasets import load_svmlight_file

    path = _check_file(path)
    name = name or _guess_libsvm_name(path) or path.stem
    n_features = n_features or _LIBSVM_FEATURES.get(name)

    def read(p):
        try:
            Xs, ys = load_svmlight_file(str(p), n_features=n_features, dtype=np.float32)
        except ValueError as err:
            raise ValueError(f"{str(p)!r} is not a readable LIBSVM file: {err}") from err
        return Xs.toarray(), ys

    X, y = read(path)
    X_test = y_test = None
    if test_path is not None:
        X_test, y_test = read(_check_file(test_path))
        if X_test.shape[1] != X.shape[1]:
            raise ValueError(
                f"Train file has {X.shape[1]} features, test file {X_test.shape[1]}; pass "
                "n_features."
            )
    labels = np.unique(y if y_test is None else np.concatenate([y, y_test]))
    if labels.size != 2:
        raise ValueError(f"{str(path)!r}: expected a binary data set, found labels {labels[:5]}.")
    y = (y == labels.max()).astype(np.float32)
    if y_test is not None:
        y_test = (y_test == labels.max()).astype(np.float32)
    info: dict[str, Any] = {"path": str(path), "labels": labels.tolist()}
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
    return build_dataset(name, "logistic", X, y, X_test, y_test, intercept, test_fraction, seed,
                         stratify, info)


def load_skin(
    path: str | os.PathLike,
    *,
    test_fraction: float | None = 0.25,
    seed: int = 0,
    intercept: bool = True,
) -> Dataset:
    """UCI Skin Segmentation (``Skin_NonSkin.txt``: B G R label, label 1 = skin → y = 1).

    Whitespace- or comma-separated, with or without a header. ``StandardScaler`` on B, G, R.
    """
    from sklearn.preprocessing import StandardScaler

    path = _check_file(path)
    with open(path) as fh:
        first = fh.readline()
    delim = "," if "," in first else None
    skip = 0 if first.replace(",", " ").split()[0].replace(".", "").isdigit() else 1
    data = np.loadtxt(path, delimiter=delim, skiprows=skip)
    if data.ndim != 2 or data.shape[1] != 4:
        raise ValueError(f"{str(path)!r}: expected 4 columns (B, G, R, label), got {data.shape}.")
    X = StandardScaler().fit_transform(data[:, :3])
    y = (data[:, 3] == 1).astype(np.float32)
    return build_dataset(
        "skin", "logistic", X, y, None, None, intercept, test_fraction, seed, True,
        {"path": str(path), "standardisation": "StandardScaler on B, G, R"},
    )


def load_npz(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    task: str | None = None,
    standardise: str = "auto",
    test_fraction: float | None = 0.25,
    seed: int = 0,
    intercept: bool = True,
) -> Dataset:
    """An ``.npz`` archive with ``X``, ``y`` (split with ``test_fraction``, ``seed``) or with
    ``X_train``, ``y_train``, ``X_test``, ``y_test``.

    ``task``: ``"logistic"`` or ``"linear"``; by default logistic when y takes two values.
    ``standardise``: ``"auto"`` (StandardScaler on non-binary feature columns, and on y for a
    regression; fitted on the training rows), ``"covtype"`` (RobustScaler on the first 10
    columns, as :func:`load_libsvm` does for covtype) or ``"none"``.
    """
    path = _check_file(path)
    if standardise not in ("auto", "covtype", "none"):
        raise ValueError(
            f"standardise must be 'auto', 'covtype' or 'none', got {standardise!r}."
        )
    try:
        with np.load(path) as z:
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except (OSError, ValueError) as err:
        raise ValueError(f"{str(path)!r} is not a readable .npz archive: {err}") from err
    if "X_train" in arrays and "y_train" in arrays:
        X, y = arrays["X_train"], arrays["y_train"]
        X_test, y_test = arrays.get("X_test"), arrays.get("y_test")
    elif "X" in arrays and "y" in arrays:
        X, y = arrays.get("X_float64", arrays["X"]), arrays.get("y_float64", arrays["y"])
        X_test = y_test = None
    else:
        raise ValueError(
            f"{str(path)!r} holds arrays {sorted(arrays)}; expected 'X' and 'y', or 'X_train', "
            "'y_train' (and optionally 'X_test', 'y_test')."
        )
    X = np.asarray(X, np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"{str(path)!r}: X must be (N, p) and y (N,), got {X.shape}, {y.shape}.")
    task = task or ("logistic" if _is_binary_task(y) else "linear")
    if task not in ("logistic", "linear"):
        raise ValueError(f"task must be 'logistic' or 'linear', got {task!r}.")
    if task == "logistic":
        labels = np.unique(y if y_test is None else np.concatenate([y, y_test]))
        y = (y == labels.max()).astype(np.float32)
        if y_test is not None:
            y_test = (y_test == labels.max()).astype(np.float32)
    info: dict[str, Any] = {"path": str(path), "standardisation": "none"}
    if standardise == "covtype":
        from sklearn.preprocessing import RobustScaler

        scaler = RobustScaler().fit(X[:, :10])
        X = X.copy()
        X[:, :10] = scaler.transform(X[:, :10])
        if X_test is not None:
            X_test = np.asarray(X_test, np.float64).copy()
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
                X_test = np.asarray(X_test, np.float64).copy()
                X_test[:, cols] = (X_test[:, cols] - mu) / sd
        info["standardisation"] = f"StandardScaler on {cols.size} non-binary columns"
        if task == "linear":
            ym, ys = float(np.mean(y)), float(np.std(y)) or 1.0
            y = (y - ym) / ys
            if y_test is not None:
                y_test = (y_test - ym) / ys
            info["standardisation"] += " and on y"
    return build_dataset(name or path.stem, task, X, y, X_test, y_test, intercept,
                         test_fraction if X_test is None else None, seed, task == "logistic", info)


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
    otherwise LIBSVM). ``data_dir`` defaults to ``$NUMPYRO_SUBSAMPLE_DATA`` or ``./data``.
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
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return load_npz(path, seed=seed, **kwargs)
    if suffix == ".csv":
        if "skin" in path.name.lower():
            return load_skin(path, seed=seed, **kwargs)
        return load_casp(path, seed=seed, **kwargs)
    if "skin" in path.name.lower():
        return load_skin(path, seed=seed, **kwargs)
    return load_libsvm(path, seed=seed, **kwargs)
