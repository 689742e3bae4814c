"""The ``numpyro-subsample compare`` command on a tiny problem, and its error handling."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numpyro_subsample.cli import main
from numpyro_subsample.compare import available_methods, setup_compile_cache

TINY = ["--quick", "--num-data", "2000", "--subsample-size", "50", "--num-samples", "1000",
        "--nuts-samples", "200", "--no-progress"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    cache = tmp_path_factory.mktemp("cache")
    argv = ["compare", *TINY, "--methods", "sgld-cv,sgld-uniform", "--out", str(out),
            "--cache-dir", str(cache)]
    code = main(argv)
    return code, out, cache


def test_compare_writes_table_csv_json_png(run, capsys):
    code, out, _ = run
    assert code == 0
    with open(out / "compare.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["method"] for r in rows] == ["nuts (reference)", "sgld-cv", "sgld-uniform"]
    with open(out / "compare.json") as fh:
        data = json.load(fh)
    assert data["meta"]["num_data"] == 2000 and data["meta"]["dim"] == 21
    assert data["meta"]["subsample_size"] == 50
    by = {r["method"]: r for r in data["rows"]}
    ref, cv = by["nuts (reference)"], by["sgld-cv"]
    assert ref["mean_err"] == 0.0 and ref["sd_log_ratio"] == 0.0
    assert cv["status"] == "ok"
    # accuracy and costs are real numbers, not placeholders
    assert 0 < cv["mean_err"] < 1.0 and cv["sd_log_ratio"] < 0.7
    assert cv["data_passes"] > 1000 * 50 / 2000  # sampling passes + preprocessing
    assert cv["iterations"] == 1300 and cv["it_per_s"] > 0 and cv["ess_per_s"] > 0
    assert cv["compile_s"] >= 0 and cv["preprocessing_s"] > 0
    assert cv["ksd"] is not None and cv["ksd"] > 0
    # one plotted curve per non-reference method, increasing in passes
    assert set(data["curves"]) == {"sgld-cv", "sgld-uniform"}
    passes = data["curves"]["sgld-cv"]["passes"]
    assert passes == sorted(passes) and len(passes) >= 5
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # one Laplace proxy for both kernels; each is charged its seconds and data passes
    shared = data["meta"]["shared_proxy"]
    assert shared is not None and shared["data_passes"] >= 2
    for r in (cv, by["sgld-uniform"]):
        assert r["preprocessing_s"] >= shared["seconds"]
        assert r["data_passes"] >= shared["data_passes"] + 1300 * 50 / 2000 - 1e-6
    assert data["meta"]["fast_compile"] is True  # --quick compiles without XLA optimisations
    assert data["meta"]["jobs"] == 2  # --quick: the NUTS reference ran in a worker process


def test_reference_is_cached(run, tmp_path, capsys):
    _, _, cache = run
    assert len(list(Path(cache).glob("*.npz"))) == 1
    code = main(["compare", *TINY, "--methods", "nuts", "--out", str(tmp_path),
                 "--cache-dir", str(cache), "--no-ksd"])
    assert code == 0
    with open(tmp_path / "compare.json") as fh:
        data = json.load(fh)
    assert data["meta"]["reference"]["cached"] is True
    printed = capsys.readouterr().out
    assert "nuts (reference)" in printed and "KSD disabled" in printed


def test_compile_cache_setup(tmp_path, monkeypatch):
    import jax

    assert setup_compile_cache(str(tmp_path), enabled=False) is None  # opt-out: nothing set
    before = jax.config.jax_compilation_cache_dir
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    min_size = jax.config.jax_persistent_cache_min_entry_size_bytes
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert setup_compile_cache(str(tmp_path / "jc")) == str(tmp_path / "jc")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jc")
        # an existing setting is left alone
        assert setup_compile_cache(str(tmp_path / "other")) == str(tmp_path / "jc")
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", min_size)


def test_registry_lists_core_methods():
    found = available_methods()
    assert {"nuts", "hmcecs", "sgld-uniform", "sgld-cv"} <= set(found)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["compare", "--methods", "nope"], "Unknown or unavailable method"),
        (["compare", "--dataset", "/nonexistent/file.npz"], "neither a known name"),
        (["compare", "--num-samples", "-3"], "positive integer"),
        (["compare", "--subsample-size", "5000", "--num-data", "1000"], "--subsample-size"),
        (["frobnicate"], "invalid choice"),
        ([], "usage"),
    ],
)
def test_bad_options_exit_nonzero_with_message(argv, message, capsys, tmp_path):
    code = main(argv + ["--out", str(tmp_path)] if argv and argv[0] == "compare" else argv)
    assert code != 0
    assert message in capsys.readouterr().err


def test_unreadable_data_file(tmp_path, capsys):
    junk = tmp_path / "junk.svm"
    junk.write_text("this is not a LIBSVM file\n")
    code = main(["compare", "--dataset", str(junk), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert "error" in err and "LIBSVM" in err
    assert not (tmp_path / "o" / "compare.csv").exists()


def test_console_script_help():
    script = Path(sys.executable).parent / "numpyro-subsample"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "numpyro_subsample.cli"]
    res = subprocess.run(cmd + ["compare", "--help"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert res.returncode == 0
    assert "--dataset" in res.stdout and "--quick" in res.stdout
    # the persistent compilation cache is on by default, with a documented opt-out
    text = " ".join(res.stdout.split())
    assert "--no-compile-cache" in text and "cache is on by default" in text
