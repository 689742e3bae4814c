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
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import gzip
import itertools
import lzma
import math
import os
import warnings
import zipfile
import zlib
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from numpyro_subsample.datasets.generators import Dataset, build_dataset

__all__ = [
    "load_casp",
    "load_libsvm",
    "load_skin",
    "load_npz",
    "load_dataset",
    "DATASET_NAMES",
    "DroppedRowsWarning",
]


class DroppedRowsWarning(UserWarning):
    """Rows with missing or non-finite values were dropped (``on_nonfinite="drop"``)."""


_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
# what a decompressor (or the disk) raises on a truncated or corrupt stream
_STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)
_NONFINITE_CHOICES = ("raise", "drop")


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


def _corrupt(path: Path, after_line: int, err: BaseException) -> ValueError:
    suffix = path.suffix.lower()
    kind = f"{suffix[1:]} stream" if suffix in _OPENERS else "file"
    where = f"after line {after_line}" if after_line else "before its first line"
    return ValueError(
        f"{str(path)!r} is truncated or corrupt: the {kind} cannot be read {where} "
        f"({type(err).__name__}: {err}). Re-download or re-create the file."
    )


def _check_stream(path: Path) -> None:
    """For a compressed file, raise the "truncated or corrupt" error if the stream does not
    decode to its end (garbage decoded before a checksum fails would else be blamed on a row)."""
    opener = _OPENERS.get(path.suffix.lower())
    if opener is None:
        return
    lines = 0
    try:
        with opener(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                lines += chunk.count(b"\n")
    except _STREAM_ERRORS as err:
        raise _corrupt(path, lines, err) from err


@contextlib.contextmanager
def _blame_stream(path: Path) -> Iterator[None]:
    """A ValueError raised while reading ``path`` becomes the "truncated or corrupt" error when
    the file's compressed stream is damaged."""
    try:
        yield
    except ValueError:
        _check_stream(path)
        raise


def _raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, bytes) of each line, streamed; decompressed by the suffix."""
    line_no = 0
    opener = _OPENERS.get(path.suffix.lower(), open)
    with opener(path, "rb") as fh:
        try:
            for line_no, line in enumerate(fh, 1):
                yield line_no, line
        except _STREAM_ERRORS as err:
            raise _corrupt(path, line_no, err) from err


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 file (a leading BOM is removed)."""
    for line_no, raw in _raw_lines(path):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{str(path)!r}, line {line_no}: not UTF-8 text ({err}); save the file as UTF-8."
            ) from err
        yield line_no, (text.removeprefix("\ufeff") if line_no == 1 else text)


def _records(path: Path, delimiter: str | None) -> Iterator[tuple[int, list[str]]]:
    """(line number where the record starts, fields) of each non-blank record: comma-separated
    (``csv`` quoting rules) for ``delimiter=","``, whitespace-separated for ``None``."""
    if delimiter is None:
        for line_no, text in _lines(path):
            fields = text.split()
            if fields:
                yield line_no, fields
        return
    reader = csv.reader((text for _, text in _lines(path)), delimiter=delimiter)
    previous = 0
    try:
        for fields in reader:
            if len(fields) > 1 or (fields and fields[0].strip()):
                yield previous + 1, fields
            previous = reader.line_num
    except csv.Error as err:
        raise ValueError(
            f"{str(path)!r}, line {reader.line_num}: malformed CSV ({err})."
        ) from err


def _parse_row(path: Path, line_no: int, fields: list[str], names: Sequence[str]) -> list[float]:
    """The slow path of :func:`_parse_table` for a row with a field ``float`` refuses: an empty
    field is missing (NaN, checked with the non-finite values), anything else raises."""
    row = []
    for j, field in enumerate(fields):
        text = field.strip()
        if not text:
            row.append(math.nan)
            continue
        try:
            row.append(float(text))
        except ValueError as err:
            raise ValueError(
                f"{str(path)!r}, line {line_no}, column {j + 1} ({names[j]!r}): {field!r} is "
                "not a number; fix or remove the row."
            ) from err
    return row


def _parse_table(
    path: Path,
    records: Iterable[tuple[int, list[str]]],
    names: Sequence[str],
    on_nonfinite: str,
) -> np.ndarray:
    """The (rows, len(names)) float64 table of ``records``, one pass, validated row by row."""
    width = len(names)
    values = array("d")
    line_of = array("q")
    for line_no, fields in records:
        if len(fields) != width:
            raise ValueError(
                f"{str(path)!r}, line {line_no}: {len(fields)} fields seen, {width} expected "
                f"({', '.join(names)}); fix or remove the row."
            )
        try:
            row = [float(f) for f in fields]
        except ValueError:
            row = _parse_row(path, line_no, fields, names)
        values.fromlist(row)
        line_of.append(line_no)
    if not line_of:
        raise ValueError(f"{str(path)!r} has no data rows.")
    data = np.frombuffer(values, np.float64).reshape(-1, width)
    lines = np.frombuffer(line_of, np.int64)
    bad = ~np.isfinite(data)
    bad_rows = bad.any(axis=1)
    if not bad_rows.any():
        return data
    if on_nonfinite == "raise":
        r = int(np.argmax(bad_rows))
        c = int(np.argmax(bad[r]))
        raise ValueError(
            f"{str(path)!r}, line {lines[r]}, column {c + 1} ({names[c]!r}): missing or "
            f"non-finite value (read as {data[r, c]}); fill or remove it, or pass "
            "on_nonfinite='drop' to drop such rows with a warning."
        )
    dropped = lines[bad_rows]
    shown = ", ".join(map(str, dropped[:10])) + (", ..." if dropped.size > 10 else "")
    warnings.warn(
        DroppedRowsWarning(
            f"{str(path)!r}: dropped {dropped.size} of {lines.size} rows with missing or "
            f"non-finite values (lines {shown}); pass on_nonfinite='raise' to stop at the first."
        ),
        stacklevel=3,
    )
    if dropped.size == lines.size:
        raise ValueError(f"{str(path)!r}: every row has a missing or non-finite value.")
    return data[~bad_rows]


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
    arrays = _read_npz(path)
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
