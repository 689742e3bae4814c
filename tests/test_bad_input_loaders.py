"""Malformed data files: every loader names the file and the line (or the array and row, or the
label classes seen) and drops or recodes nothing silently."""

from __future__ import annotations

import bz2
import gzip
import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numpyro_subsample import datasets as D
from numpyro_subsample.datasets import loaders

CASP_HEADER = "RMSD,F1,F2,F3"
CASP_ROWS = ["1.5,2,3,4", "2.5,3,4,5.5", "0.5,1,7,2", "3,2,1,0", "4,5,6,7"]


def assert_names(err: pytest.ExceptionInfo, path, line: int | None = None, *more: str) -> str:
    """The message names the file, the line (exactly: 'line 1' must not match 'line 12') and
    each string of ``more``."""
    msg = str(err.value)
    assert path.name in msg, msg
    if line is not None:
        assert re.search(rf"\bline {line}\b", msg), msg
    for text in more:
        assert text in msg, msg
    return msg


def casp_file(tmp_path, rows, name="CASP.csv", header=CASP_HEADER):
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


# -- delimited text (CSV, whitespace) -------------------------------------------------------------
def test_csv_valid_file_reads_every_row(tmp_path):
    ds = D.load_casp(casp_file(tmp_path, CASP_ROWS), test_fraction=None, intercept=False)
    assert ds.X_train.shape == (5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        D.load_casp(casp_file(tmp_path, CASP_ROWS), test_fraction=None)


def test_csv_row_with_too_few_fields(tmp_path):
    path = casp_file(tmp_path, CASP_ROWS[:2] + ["1,2,3"] + CASP_ROWS[2:])
    with pytest.raises(ValueError) as err:
        D.load_casp(path)
    assert_names(err, path, 4, "3 fields seen, 4 expected")


def test_csv_row_with_too_many_fields(tmp_path):
    path = casp_file(tmp_path, CASP_ROWS + ["1,2,3,4,5"])
    with pytest.raises(ValueError) as err:
        D.load_casp(path)
    assert_names(err, path, 7, "5 fields seen, 4 expected")


def test_csv_non_numeric_field(tmp_path):
    path = casp_file(tmp_path, CASP_ROWS[:1] + ["1,2,abc,4"] + CASP_ROWS[1:])
    with pytest.raises(ValueError) as err:
        D.load_casp(path)
    assert_names(err, path, 3, "column 3", "'F2'", "'abc'")


@pytest.mark.parametrize("value", ["", "nan", "inf", "-Infinity"])
def test_csv_missing_or_nonfinite_value(tmp_path, value):
    path = casp_file(tmp_path, CASP_ROWS[:3] + [f"1,2,3,{value}"] + CASP_ROWS[3:])
    with pytest.raises(ValueError) as err:
        D.load_casp(path)
    assert_names(err, path, 5, "column 4", "'F3'", "non-finite", "on_nonfinite='drop'")


def test_csv_drop_nonfinite_rows_warns_with_count(tmp_path):
    path = casp_file(tmp_path, CASP_ROWS[:2] + ["1,nan,3,4", "1,2,,4"] + CASP_ROWS[2:])
    with pytest.warns(loaders.DroppedRowsWarning) as record:
        ds = D.load_casp(path, test_fraction=None, on_nonfinite="drop")
    assert len(record) == 1
    msg = str(record[0].message)
    assert path.name in msg and "dropped 2 of 7 rows" in msg and "lines 4, 5" in msg
    assert ds.X_train.shape[0] == 5 and np.all(np.isfinite(ds.X_train))


def test_csv_on_nonfinite_must_be_raise_or_drop(tmp_path):
    with pytest.raises(ValueError, match="on_nonfinite must be one of 'raise', 'drop'"):
        D.load_casp(casp_file(tmp_path, CASP_ROWS), on_nonfinite="ignore")


def test_csv_line_numbers_count_blank_lines_and_crlf(tmp_path):
    path = tmp_path / "CASP.csv"
    path.write_bytes(("\r\n".join([CASP_HEADER, "", CASP_ROWS[0], "", "", "1,2,x,4"]) + "\r\n")
                     .encode())
    with pytest.raises(ValueError) as err:
        D.load_casp(path)
    assert_names(err, path, 6, "'x'")


def test_csv_unclosed_quote_reported_at_its_line(tmp_path):
    path = casp_file(tmp_path, CASP_ROWS[:1] + ['"1,2,3,4'] + CASP_ROWS[1:])
    with pytest.raises(ValueError) as err:
        D.load_casp(path)
    assert_names(err, path, 3)


def test_csv_header_only(tmp_path):
    path = casp_file(tmp_path, [])
    with pytest.raises(ValueError) as err:
        D.load_casp(path)
    assert_names(err, path, None, "no data rows")


def test_csv_not_utf8(tmp_path):
    path = tmp_path / "CASP.csv"
    path.write_bytes(("\n".join([CASP_HEADER, *CASP_ROWS[:3]]) + "\n").encode()
                     + b"1,2,\xff,4\n")
    with pytest.raises(ValueError) as err:
        D.load_casp(path)
    assert_names(err, path, 5, "UTF-8")


def test_csv_compressed_reads_as_plain(tmp_path):
    plain = casp_file(tmp_path, CASP_ROWS)
    packed = tmp_path / "CASP.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a = D.load_casp(plain, test_fraction=None)
    b = D.load_dataset(str(packed), test_fraction=None)  # .csv seen through .gz
    np.testing.assert_array_equal(a.X_train, b.X_train)


def _big_csv_bytes() -> bytes:
    rng = np.random.default_rng(0)
    rows = [",".join(f"{v:.6f}" for v in r) for r in rng.normal(size=(3000, 4))]
    return ("\n".join([CASP_HEADER, *rows]) + "\n").encode()


def _damage(data: bytes, how: str) -> bytes:
    if how == "truncated":
        return data[: len(data) // 2]
    mid = len(data) // 2
    return data[:mid] + bytes(b ^ 0x5A for b in data[mid: mid + 64]) + data[mid + 64:]


@pytest.mark.parametrize("suffix", [".gz", ".bz2"])
@pytest.mark.parametrize("how", ["truncated", "corrupt"])
def test_csv_damaged_compressed_stream(tmp_path, suffix, how):
    compress = gzip.compress if suffix == ".gz" else bz2.compress
    path = tmp_path / f"CASP.csv{suffix}"
    path.write_bytes(_damage(compress(_big_csv_bytes()), how))
    with pytest.raises(ValueError) as err:
        D.load_casp(path)
    assert_names(err, path, None, "truncated or corrupt")
    assert err.value.__cause__ is not None  # the decoder's error, chained


def test_skin_row_with_wrong_field_count(tmp_path):
    path = tmp_path / "Skin_NonSkin.txt"
    path.write_text("74\t85\t123\t1\n73 84 122 2\n72\t83 121\n")
    with pytest.raises(ValueError) as err:
        D.load_skin(path)
    assert_names(err, path, 3, "3 fields seen, 4 expected")


def test_skin_non_numeric_field_with_header(tmp_path):
    path = tmp_path / "skin.csv"
    path.write_text("B,G,R,label\n74,85,123,1\n73,8?4,122,2\n")
    with pytest.raises(ValueError) as err:
        D.load_dataset(str(path))
    assert_names(err, path, 3, "column 2", "'G'", "'8?4'")


def _skin_rows(labels):
    rng = np.random.default_rng(1)
    return "".join(f"{a} {b} {c} {lab}\n" for (a, b, c), lab in
                   zip(rng.integers(0, 256, size=(len(labels), 3)), labels, strict=True))


def test_skin_labels_other_than_1_2_raise_listing_classes(tmp_path):
    path = tmp_path / "Skin_NonSkin.txt"
    path.write_text(_skin_rows([1, 2, 3, 1, 2, 3, 1, 2]))
    with pytest.raises(ValueError) as err:
        D.load_skin(path)
    assert_names(err, path, None, "[3.0]", "[1.0, 2.0, 3.0] (3 classes)", "label_map=")
    ds = D.load_skin(path, positive_class=3, test_fraction=None)
    assert ds.y_train.sum() == 2
    ds = D.load_skin(path, label_map={1: 1, 2: 0, 3: 0}, test_fraction=None)
    assert ds.y_train.sum() == 3


def test_skin_label_1_is_skin(tmp_path):
    path = tmp_path / "Skin_NonSkin.txt"
    path.write_text(_skin_rows([1, 2, 2, 2, 1, 2, 2, 2]))
    ds = D.load_skin(path, test_fraction=None)
    assert ds.y_train.tolist() == [1, 0, 0, 0, 1, 0, 0, 0]


# -- LIBSVM -------------------------------------------------------------------------------------
LIBSVM_ROWS = ["+1 1:0.5 3:1", "-1 2:1 4:-2", "-1 1:1", "+1 5:0.25"]


def libsvm_file(tmp_path, rows, name="toy.svm"):
    path = tmp_path / name
    path.write_text("\n".join(rows) + "\n")
    return path


def test_libsvm_valid_file_round_trips(tmp_path):
    ds = D.load_libsvm(libsvm_file(tmp_path, LIBSVM_ROWS), intercept=False)
    expected = np.zeros((4, 5), np.float32)
    expected[0, [0, 2]] = [0.5, 1]
    expected[1, [1, 3]] = [1, -2]
    expected[2, 0] = 1
    expected[3, 4] = 0.25
    np.testing.assert_array_equal(ds.X_train, expected)
    assert ds.y_train.tolist() == [1, 0, 0, 1]  # -1/+1 -> 0/1, documented
    assert ds.info["label_map"] == {-1.0: 0.0, 1.0: 1.0}


@pytest.mark.parametrize(
    "bad, words",
    [
        ("+1 1:0.5 3", "is not 'index:value'"),
        ("+1 a:0.5", "is not an integer"),
        ("+1 1.5:0.5", "is not an integer"),
        ("+1 2:abc", "is not a number"),
        ("+1 2:1:3", "is not a number"),
        ("+1 0:1 2:1", "is not positive"),
        ("+1 -2:1", "is not positive"),
        ("+1 3:1 2:1", "does not increase"),
        ("+1 2:1 2:1", "does not increase"),
        ("abc 1:1", "the label 'abc' is not a number"),
        ("1,2 1:1", "is not a number"),
        ("nan 1:1", "is not finite"),
        ("inf 1:1", "is not finite"),
        ("+1 2:nan", "not finite"),
        ("+1 2:-inf", "not finite"),
        ("+1 2:1e39", "not finite in float32"),
        ("+1 9:1", "exceeds n_features=5"),
        ("+1 qid:x 1:1", "qid"),
        ("+1 1:1 qid:3", "is not an integer"),
    ],
)
def test_libsvm_malformed_line(tmp_path, bad, words):
    path = libsvm_file(tmp_path, LIBSVM_ROWS[:2] + [bad] + LIBSVM_ROWS[2:])
    with pytest.raises(ValueError) as err:
        D.load_libsvm(path, n_features=5)
    assert_names(err, path, 3, "LIBSVM", words)


def test_libsvm_line_numbers_count_comments_and_blank_lines(tmp_path):
    path = libsvm_file(tmp_path, ["# header comment", LIBSVM_ROWS[0], "", "-1 1:1 # fine",
                                  "   ", "-1 4:1 3:1"])
    with pytest.raises(ValueError) as err:
        D.load_libsvm(path)
    assert_names(err, path, 6, "does not increase")


def test_libsvm_qid_is_ignored(tmp_path):
    a = D.load_libsvm(libsvm_file(tmp_path, LIBSVM_ROWS), intercept=False)
    rows = [r.replace(" ", " qid:7 ", 1) for r in LIBSVM_ROWS]
    b = D.load_libsvm(libsvm_file(tmp_path, rows, "q.svm"), intercept=False)
    np.testing.assert_array_equal(a.X_train, b.X_train)


def test_libsvm_empty_file(tmp_path):
    path = libsvm_file(tmp_path, ["# nothing here"])
    with pytest.raises(ValueError) as err:
        D.load_libsvm(path)
    assert_names(err, path, None, "no data lines")


def test_libsvm_test_file_index_beyond_training_features(tmp_path):
    train = libsvm_file(tmp_path, LIBSVM_ROWS, "toy.tr")
    test = libsvm_file(tmp_path, ["+1 1:1", "-1 6:1"], "toy.t")
    with pytest.raises(ValueError) as err:
        D.load_libsvm(train, test_path=test)
    assert_names(err, test, 2, "exceeds n_features=5")
    # a test file using fewer columns is padded to the training file's
    ok = libsvm_file(tmp_path, ["+1 1:1", "-1 2:1"], "toy2.t")
    ds = D.load_libsvm(train, test_path=ok)
    assert ds.X_test.shape == (2, 6)


@pytest.mark.parametrize("suffix", [".gz", ".bz2"])
@pytest.mark.parametrize("how", ["truncated", "corrupt"])
def test_libsvm_damaged_compressed_stream(tmp_path, suffix, how):
    rng = np.random.default_rng(2)
    lines = [f"{2 * (i % 2) - 1} " + " ".join(f"{j}:{rng.normal():.5f}" for j in range(1, 9))
             for i in range(3000)]
    compress = gzip.compress if suffix == ".gz" else bz2.compress
    path = tmp_path / f"toy.svm{suffix}"
    path.write_bytes(_damage(compress(("\n".join(lines) + "\n").encode()), how))
    with pytest.raises(ValueError) as err:
        D.load_libsvm(path)
    assert_names(err, path, None, "truncated or corrupt")
    assert err.value.__cause__ is not None


def test_libsvm_more_than_two_classes_raise_listing_them(tmp_path):
    path = libsvm_file(tmp_path, ["1 1:1", "2 2:1", "3 1:1", "2 3:1"])
    with pytest.raises(ValueError) as err:
        D.load_libsvm(path)
    assert_names(err, path, None, "[1.0, 2.0, 3.0] (3 classes)", "label_map=", "positive_class=")
    ds = D.load_libsvm(path, positive_class=2, intercept=False)
    assert ds.y_train.tolist() == [0, 1, 0, 1]
    ds = D.load_libsvm(path, label_map={1: 0, 2: 1, 3: 1}, intercept=False)
    assert ds.y_train.tolist() == [0, 1, 1, 1]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"positive_class": 7}, "positive_class=7 is not among the classes seen"),
        ({"label_map": {1: 0, 2: 1}}, "classes [3.0] (1 class) are not in label_map"),
        ({"label_map": {1: 0, 2: 1, 3: 2}}, "must map classes to 0 or 1"),
        ({"label_map": {1: 0, 2: 1, 3: 1}, "positive_class": 2}, "not both"),
    ],
)
def test_libsvm_bad_label_mapping(tmp_path, kwargs, words):
    path = libsvm_file(tmp_path, ["1 1:1", "2 2:1", "3 1:1"])
    with pytest.raises(ValueError) as err:
        D.load_libsvm(path, **kwargs)
    assert_names(err, path, None, words)


def test_libsvm_single_class_outside_0_1_raises(tmp_path):
    path = libsvm_file(tmp_path, ["-1 1:1", "-1 2:1"])
    with pytest.raises(ValueError) as err:
        D.load_libsvm(path)
    assert_names(err, path, None, "[-1.0] (1 class)")


# -- npz ------------------------------------------------------------------------------------------
def npz_file(tmp_path, name="data.npz", compressed=False, **arrays):
    path = tmp_path / name
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path


def _xy(n=200, classes=2, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3)), rng.integers(0, classes, n).astype(float)


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("how", ["truncated", "corrupt"])
def test_npz_damaged_archive(tmp_path, compressed, how):
    X, y = _xy(2000)
    path = npz_file(tmp_path, compressed=compressed, X=X, y=y)
    path.write_bytes(_damage(path.read_bytes(), how))
    with pytest.raises(ValueError) as err:
        D.load_npz(path)
    assert_names(err, path, None, "truncated or corrupt")
    assert err.value.__cause__ is not None


def test_npz_that_is_a_single_npy_array(tmp_path):
    path = tmp_path / "array.npz"
    with open(path, "wb") as fh:
        np.save(fh, np.zeros((3, 2)))
    with pytest.raises(ValueError) as err:
        D.load_npz(path)
    assert_names(err, path, None, "single array")


def test_npz_nonfinite_value_names_array_row_and_column(tmp_path):
    X, y = _xy()
    X[17, 2] = np.inf
    path = npz_file(tmp_path, X=X, y=y)
    with pytest.raises(ValueError) as err:
        D.load_npz(path)
    assert_names(err, path, None, "'X'", "row 17, column 2")
    X[17, 2] = 0.0
    y[5] = np.nan
    path = npz_file(tmp_path, X=X, y=y)
    with pytest.raises(ValueError) as err:
        D.load_npz(path)
    assert_names(err, path, None, "'y'", "row 5")


def test_npz_non_numeric_features(tmp_path):
    X, y = _xy()
    path = npz_file(tmp_path, X=X.astype(str), y=y)
    with pytest.raises(ValueError) as err:
        D.load_npz(path)
    assert_names(err, path, None, "'X'", "expected numbers")


def test_npz_multiclass_logistic_needs_a_mapping(tmp_path):
    X, y = _xy(classes=4)
    path = npz_file(tmp_path, X=X, y=y)
    assert D.load_npz(path).task == "linear"  # four values, no task: a regression, as before
    with pytest.raises(ValueError) as err:
        D.load_npz(path, task="logistic")
    assert_names(err, path, None, "[0.0, 1.0, 2.0, 3.0] (4 classes)", "label_map=")
    ds = D.load_npz(path, positive_class=3.0, test_fraction=None)
    assert ds.task == "logistic" and ds.y_train.sum() == np.sum(y == 3)
    with pytest.raises(ValueError, match="need task='logistic'"):
        D.load_npz(path, task="linear", positive_class=3.0)


def test_npz_labels_0_1_with_one_class_kept(tmp_path):
    X, _ = _xy()
    path = npz_file(tmp_path, X=X, y=np.zeros(len(X)))
    ds = D.load_npz(path, test_fraction=None, task="logistic")
    assert np.all(ds.y_train == 0)  # not turned into ones (the old "== max" rule did)


def test_npz_test_arrays_checked(tmp_path):
    X, y = _xy()
    path = npz_file(tmp_path, X_train=X, y_train=y, X_test=X[:10])
    with pytest.raises(ValueError) as err:
        D.load_npz(path)
    assert_names(err, path, None, "'X_test' and 'y_test' must be given together")
    path = npz_file(tmp_path, X_train=X, y_train=y, X_test=X[:10, :2], y_test=y[:10])
    with pytest.raises(ValueError) as err:
        D.load_npz(path)
    assert_names(err, path, None, "X_test must be (M, 3)")


# -- properties ------------------------------------------------------------------------------------
PROPERTY = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
finite = st.floats(allow_nan=False, allow_infinity=False, width=32)


@st.composite
def tables(draw):
    rows = draw(st.integers(1, 12))
    cols = draw(st.integers(2, 5))
    data = draw(st.lists(st.lists(finite, min_size=cols, max_size=cols), min_size=rows,
                         max_size=rows))
    blank = draw(st.lists(st.booleans(), min_size=rows, max_size=rows))  # blank line before?
    return np.asarray(data, np.float64), blank


def write_table(path, data, blank, cells=None):
    header = ["RMSD"] + [f"F{j}" for j in range(1, data.shape[1])]
    lines, line_of = [",".join(header)], []
    for i, row in enumerate(data):
        if blank[i]:
            lines.append("")
        line_of.append(len(lines) + 1)
        lines.append(",".join(repr(float(v)) for v in row) if cells is None else cells[i])
    path.write_text("\n".join(lines) + "\n")
    return header, line_of


@PROPERTY
@given(table=tables())
def test_property_csv_round_trips_exactly(tmp_path, table):
    data, blank = table
    path = tmp_path / "t.csv"
    header, _ = write_table(path, data, blank)
    records = loaders._records(path, ",")
    next(records)
    np.testing.assert_array_equal(loaders._parse_table(path, records, header, "raise"), data)


BAD_CELLS = ["abc", "1.2.3", "", "nan", "inf", "-inf", "1e", "0x1p3", "--1", "1,5"]


@PROPERTY
@given(table=tables(), where=st.tuples(st.integers(0, 11), st.integers(0, 4)),
       bad=st.sampled_from(BAD_CELLS + ["<drop field>", "<extra field>"]))
def test_property_csv_single_corruption_reported_at_its_line(tmp_path, table, where, bad):
    data, blank = table
    r, c = where[0] % data.shape[0], where[1] % data.shape[1]
    cells = [[repr(float(v)) for v in row] for row in data]
    if bad == "<drop field>":
        del cells[r][c]
    elif bad == "<extra field>":
        cells[r].insert(c, "1.0")
    else:
        cells[r][c] = bad
    path = tmp_path / "t.csv"
    _, line_of = write_table(path, data, blank, [",".join(row) for row in cells])
    with pytest.raises(ValueError) as err:
        D.load_casp(path, test_fraction=None)
    msg = assert_names(err, path, line_of[r])
    if bad not in ("<drop field>", "<extra field>", "1,5"):
        assert f"column {c + 1}" in msg


@st.composite
def libsvm_sets(draw):
    rows = draw(st.integers(2, 10))
    p = draw(st.integers(1, 8))
    X = np.zeros((rows, p), np.float32)
    lines = []
    labels = [-1, 1] + draw(st.lists(st.sampled_from([-1, 1]), min_size=rows - 2,
                                     max_size=rows - 2))
    for i in range(rows):
        cols = sorted(draw(st.sets(st.integers(1, p), max_size=p)))
        vals = [draw(finite) for _ in cols]
        X[i, np.asarray(cols, int) - 1] = vals
        prefix = draw(st.sampled_from(["", "# note\n", "\n"]))
        lines.append(prefix + " ".join([f"{labels[i]:+d}"] +
                                       [f"{j}:{float(v)!r}" for j, v in zip(cols, vals,
                                                                            strict=True)]))
    return X, np.asarray(labels), lines


@PROPERTY
@given(case=libsvm_sets())
def test_property_libsvm_round_trips_exactly(tmp_path, case):
    X, labels, lines = case
    path = tmp_path / "toy.svm"
    path.write_text("\n".join(lines) + "\n")
    ds = D.load_libsvm(path, n_features=X.shape[1], intercept=False)
    np.testing.assert_array_equal(ds.X_train, X)
    np.testing.assert_array_equal(ds.y_train, (labels == 1).astype(np.float32))


BAD_TOKENS = ["7", "x:1", "1:y", "0:1", "-3:1", "2:nan", "3:inf", "4:1e40", "1:2:3", ":1", "5:"]


@PROPERTY
@given(case=libsvm_sets(), row=st.integers(0, 9), bad=st.sampled_from(BAD_TOKENS + ["<label>"]))
def test_property_libsvm_single_corruption_reported_at_its_line(tmp_path, case, row, bad):
    _, _, lines = case
    row %= len(lines)
    text = "\n".join(lines[:row])
    first_line = text.count("\n") + 2 if row else 1  # the corrupted entry's first line
    entry = lines[row].split("\n")
    tokens = entry[-1].split()
    if bad == "<label>":
        tokens[0] = "one"
    else:
        tokens.append(bad)  # after the entry's largest index: only the token itself is wrong
    entry[-1] = " ".join(tokens)
    line = first_line + len(entry) - 1
    path = tmp_path / "toy.svm"
    path.write_text("\n".join(lines[:row] + ["\n".join(entry)] + lines[row + 1:]) + "\n")
    with pytest.raises(ValueError) as err:
        D.load_libsvm(path, n_features=9)
    assert_names(err, path, line, "LIBSVM")
