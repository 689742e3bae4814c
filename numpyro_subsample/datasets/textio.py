"""Streamed reading and row-by-row validation of the loaders' text files.

Compressed files (``.gz``, ``.bz2``, ``.xz``) are read as a stream; a truncated or corrupt
stream raises a :class:`ValueError` saying so, chained to the decoder's error. Delimited text
is parsed into a float64 table whose malformed rows raise a :class:`ValueError` naming the file
and the (1-based) line (rules in :mod:`~numpyro_subsample.datasets.loaders`).
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import gzip
import lzma
import math
import warnings
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

__all__ = ["DroppedRowsWarning"]


class DroppedRowsWarning(UserWarning):
    """Rows with missing or non-finite values were dropped (``on_nonfinite="drop"``)."""


_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
# what a decompressor (or the disk) raises on a truncated or corrupt stream
_STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)
_NONFINITE_CHOICES = ("raise", "drop")


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
