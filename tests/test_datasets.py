"""Dataset loaders on the real files of ../shared/data, and the synthetic generators."""

from __future__ import annotations

import bz2
import json
from pathlib import Path

import numpy as np
import pytest

from numpyro_subsample import datasets as D

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(
    not DATA.is_dir(), reason=f"shared data folder {DATA} is absent (real-data loader tests)"
)


def meta(name):
    with open(DATA / name / "meta.json") as fh:
        return json.load(fh)


@needs_data
def test_casp_csv_matches_meta_and_npz():
    m = meta("casp")
    ds = D.load_casp(DATA / "casp" / "CASP.csv", test_fraction=None)
    assert ds.task == "linear"
    assert ds.X_train.shape == (m["rows"], m["features"] + 1)  # + intercept
    assert np.all(ds.X_train[:, 0] == 1)
    # StandardScaler on every column incl. RMSD (Putcha et al.'s casp.py)
    np.testing.assert_allclose(ds.X_train[:, 1:].mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(ds.X_train[:, 1:].std(0), 1, atol=1e-4)
    np.testing.assert_allclose(ds.y_train.mean(), 0, atol=1e-4)
    # the same numbers as the npz copy of the raw data, standardised the same way
    with np.load(DATA / "casp" / "casp.npz") as z:
        X, y = z["X_float64"], z["y_float64"]
    np.testing.assert_allclose(ds.y_train, (y - y.mean()) / y.std(), atol=1e-4)
    np.testing.assert_allclose(ds.X_train[:, 1:], (X - X.mean(0)) / X.std(0), atol=1e-3)
    via_npz = D.load_dataset(str(DATA / "casp" / "casp.npz"), test_fraction=None)
    np.testing.assert_allclose(via_npz.X_train, ds.X_train, atol=1e-3)


@needs_data
def test_casp_split_is_seeded():
    a = D.load_casp(DATA / "casp" / "CASP.csv", seed=1)
    b = D.load_casp(DATA / "casp" / "CASP.csv", seed=1)
    c = D.load_casp(DATA / "casp" / "CASP.csv", seed=2)
    n = meta("casp")["rows"]
    assert a.X_train.shape[0] + a.X_test.shape[0] == n
    assert a.X_test.shape[0] == pytest.approx(0.25 * n, abs=1)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.y_test, c.y_test)


@needs_data
def test_a9a_libsvm_text_matches_meta_and_npz():
    m = meta("a9a")
    ds = D.load_libsvm(DATA / "a9a" / "a9a", test_path=DATA / "a9a" / "a9a.t")
    assert ds.name == "a9a" and ds.task == "logistic"
    assert ds.X_train.shape == (m["rows"]["train"], m["features"] + 1)
    assert ds.X_test.shape == (m["rows"]["test"], m["features"] + 1)
    assert int(ds.y_train.sum()) == m["class_counts"]["train_pos"]
    assert int(ds.y_test.sum()) == m["class_counts"]["test_pos"]
    with np.load(DATA / "a9a" / "a9a.npz") as z:
        np.testing.assert_array_equal(ds.X_train[:, 1:], z["X_train"])
        np.testing.assert_array_equal(ds.y_test, z["y_test"])


@needs_data
def test_libsvm_compressed_and_covtype_rules(tmp_path):
    # a bz2 copy of a small LIBSVM file with covtype's 1/2 labels: covtype preprocessing
    with np.load(DATA / "covtype_subset20k" / "covtype_subset20k.npz") as z:
        X, lab = z["X"][:400], z["label_orig"][:400]
    lines = [
        f"{int(lab[i])} " + " ".join(f"{j + 1}:{X[i, j]:.6g}" for j in np.flatnonzero(X[i]))
        for i in range(X.shape[0])
    ]
    path = tmp_path / "covtype.libsvm.binary.scale.bz2"
    path.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    ds = D.load_libsvm(path, seed=3)
    assert ds.name == "covtype"
    assert ds.X_train.shape[1] == 55 and ds.X_train.shape[0] + ds.X_test.shape[0] == 400
    assert ds.X_test.shape[0] == 100  # stratified 75/25 split of Putcha et al.'s covtype.py
    y_all = np.concatenate([ds.y_train, ds.y_test])
    assert y_all.sum() == np.sum(lab == 2)  # label 2 -> 1
    # RobustScaler on the 10 numeric columns: median 0 over all rows
    Xall = np.concatenate([ds.X_train, ds.X_test])[:, 1:11]
    np.testing.assert_allclose(np.median(Xall, 0), 0, atol=1e-5)
    # one-hot columns untouched
    assert set(np.unique(np.concatenate([ds.X_train, ds.X_test])[:, 11:])) <= {0.0, 1.0}


@needs_data
@pytest.mark.parametrize(
    "name, folder", [("covtype", "covtype_subset20k"), ("ijcnn1", "ijcnn1"), ("w8a", "w8a"),
                     ("skin", "skin"), ("a9a", "a9a"), ("casp", "casp")],
)
def test_named_datasets_shapes_against_meta(name, folder):
    m = meta(folder)
    ds = D.load_dataset(name, DATA, seed=0)
    rows = m["rows"]
    n_total = ds.X_train.shape[0] + (0 if ds.X_test is None else ds.X_test.shape[0])
    if isinstance(rows, dict):
        assert ds.X_train.shape[0] == rows["train"]
        assert ds.X_test.shape[0] == rows["test"]
    else:
        assert n_total == rows
    assert ds.X_train.shape[1] == m["features"] + 1
    assert ds.X_train.dtype == np.float32 and np.all(np.isfinite(ds.X_train))
    if ds.task == "logistic":
        assert set(np.unique(ds.y_train)) == {0.0, 1.0}


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        D.load_casp(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="CASP"):
        D.load_casp(bad)
    junk = tmp_path / "junk.svm"
    junk.write_text("this is not libsvm\n")
    with pytest.raises(ValueError, match="LIBSVM"):
        D.load_libsvm(junk)
    npz = tmp_path / "wrong.npz"
    np.savez(npz, A=np.zeros(3))
    with pytest.raises(ValueError, match="expected 'X' and 'y'"):
        D.load_npz(npz)
    with pytest.raises(FileNotFoundError, match="not found"):
        D.load_dataset("a9a", tmp_path)


def test_bivariate_gaussian_posterior():
    ds = D.make_bivariate_gaussian(1000, seed=0)
    assert ds.X_train.shape == (1000, 2)
    mean, cov = D.bivariate_gaussian_posterior(ds.X_train)
    # the exact posterior is within a few posterior sds of the truth (0, 1)
    z = (mean - np.array([0.0, 1.0])) / np.sqrt(np.diag(cov))
    assert np.all(np.abs(z) < 5)
    assert cov[0, 1] > 0  # Σx has positive correlation → posterior covariance positive
    # against a direct computation from C.1
    prec = np.linalg.inv(D.BVG_PRIOR_COV) + 1000 * np.linalg.inv(D.BVG_SIGMA_X)
    np.testing.assert_allclose(cov, np.linalg.inv(prec))


@pytest.mark.parametrize("imbalanced, frac", [(False, 0.5), (True, 0.95)])
def test_logistic_generators(imbalanced, frac):
    ds = D.make_logistic(2000, imbalanced=imbalanced, seed=1)
    assert ds.X_train.shape == (2000, 5) and ds.X_test.shape == (1000, 5)
    assert abs(ds.y_train.mean() - frac) < 0.04
    again = D.make_logistic(2000, imbalanced=imbalanced, seed=1)
    np.testing.assert_array_equal(ds.X_train, again.X_train)


def test_linear_generator_and_default_problem():
    ds = D.make_linear(5000, 4, seed=2)
    coef = np.linalg.lstsq(ds.X_train, ds.y_train, rcond=None)[0]
    np.testing.assert_allclose(coef, ds.info["true_theta"], atol=0.1)
    p = D.default_problem(3000)
    q = D.default_problem(3000)
    assert p.X_train.shape == (3000, 21) and p.task == "logistic"
    np.testing.assert_array_equal(p.y_train, q.y_train)  # deterministic
    assert 0.3 < p.y_train.mean() < 0.7


def test_public_names_are_re_exported():
    from numpyro_subsample.datasets import generators, loaders

    for name in D.__all__:
        assert hasattr(D, name), name
    assert D.load_dataset is loaders.load_dataset and D.make_logistic is generators.make_logistic
    assert D.default_problem(200).model is D.logistic_regression_model
