"""``numpyro-subsample compare`` under faults: an unusable ``--out``, Ctrl-C and ``--resume``,
corrupt or stale cache entries."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from numpyro_subsample.cli import main
from numpyro_subsample.compare import CacheWarning
from numpyro_subsample.compare.store import CorruptCacheError, load_arrays, save_arrays

TINY = ["--quick", "--num-data", "1000", "--subsample-size", "20", "--num-samples", "300",
        "--nuts-samples", "100", "--reference-samples", "100", "--no-ksd", "--no-progress",
        "--jobs", "1"]
METHODS = ["--methods", "laplace-proxy,sgld-cv,sgld-uniform"]


def _rows(out: Path) -> dict:
    with open(out / "compare.json") as fh:
        return {r["name"]: r for r in json.load(fh)["rows"]}


def _stamp(path: Path) -> tuple[int, bytes]:
    return path.stat().st_mtime_ns, path.read_bytes()


# -- --out is checked before any work -----------------------------------------------------------
def test_out_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["compare", *TINY, "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and "not a folder" in err


def test_out_that_cannot_be_created(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    bad = f / "sub" / "out"  # under a file
    t0 = time.perf_counter()
    assert main(["compare", *TINY, "--out", str(bad)]) == 2
    assert time.perf_counter() - t0 < 5  # refused before the problem or any run
    err = capsys.readouterr().err
    assert str(bad) in err and "not a writable folder" in err


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="needs POSIX permissions and a non-root user")
def test_out_read_only(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert main(["compare", *TINY, "--out", str(ro)]) == 2
    finally:
        ro.chmod(0o700)
    assert str(ro) in capsys.readouterr().err


# -- checked cache files ------------------------------------------------------------------------
def test_checked_arrays_detect_truncation_and_flipped_bytes(tmp_path):
    path = tmp_path / "a.npz"
    digest = save_arrays(path, {"x": np.arange(1000.0), "n": 3})
    z = load_arrays(path, digest)
    np.testing.assert_array_equal(z["x"], np.arange(1000.0))
    raw = path.read_bytes()
    i = raw.index(np.arange(1000.0)[500:501].tobytes())  # a byte of the data, not the header
    path.write_bytes(raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:])
    with pytest.raises(CorruptCacheError, match="CRC|checksum"):  # the zip's CRC sees it first
        load_arrays(path)
    altered = np.arange(1000.0)
    altered[500] += 1.0
    np.savez(path, x=altered, n=3, _sha256=digest)  # a valid archive, other data, old checksum
    with pytest.raises(CorruptCacheError, match="checksum mismatch"):
        load_arrays(path)
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CorruptCacheError, match="unreadable"):
        load_arrays(path)
    path.write_bytes(raw)
    with pytest.raises(CorruptCacheError, match="checksum"):
        load_arrays(path, "0" * 64)  # another expected checksum


def test_run_store_roundtrip_stale_and_tampered(tmp_path):
    from numpyro_subsample.compare import Method, RunOutput, RunStore

    store = RunStore(tmp_path / "runs", {"fingerprint": "abc", "sg_samples": 5})
    m = Method("sgld-cv", "sg", options={"estimator": "cv"})
    out = RunOutput({"beta": np.arange(10.0).reshape(5, 2)}, np.arange(1.0, 6.0),
                    np.linspace(0.1, 0.5, 5), 0.4, 0.1, 2.0, 7, "note",
                    (("UserWarning", "careful", 2),), {"max_rhat": float("nan"), "messages": []})
    jpath = store.save(m, out)
    got, why = store.load(m, RunOutput)
    np.testing.assert_array_equal(got.samples["beta"], out.samples["beta"])
    assert got.warnings == out.warnings and got.iterations == 7 and got.note == "note"
    assert got.checks == {"max_rhat": None, "messages": []} and why.startswith("saved")
    # another method specification or other settings: another key, the file is stale
    other = Method("sgld-cv", "sg", options={"estimator": "uniform"})
    assert store.load(other, RunOutput)[0] is None
    assert "stale" in store.load(other, RunOutput)[1]
    assert RunStore(store.folder, {"fingerprint": "abd", "sg_samples": 5}).load(
        m, RunOutput)[0] is None
    # an edited record fails its own checksum: warned, not used
    record = json.loads(jpath.read_text())
    record["output"]["sampling_s"] = 0.001
    jpath.write_text(json.dumps(record))
    with pytest.warns(CacheWarning, match=re.escape(str(jpath))):
        assert store.load(m, RunOutput) == (None, "corrupt")


# -- Ctrl-C, --resume, corrupt entries ----------------------------------------------------------
@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run in a subprocess, sent SIGINT once the first method's result file appears."""
    root = tmp_path_factory.mktemp("faults")
    out, cache = root / "out", root / "ref"
    # no persistent compilation cache: a SIGINT during JAX's (unlocked, non-atomic) write of
    # an entry would leave a truncated file that crashes the next process reading it
    argv = ["compare", *TINY, *METHODS, "--out", str(out), "--cache-dir", str(cache),
            "--no-compile-cache"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # Python's Ctrl-C handler in the child, as under a shell: a pytest-xdist worker ignores
    # SIGINT, an ignored signal stays ignored across exec, and Python then installs no handler
    start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
             " sys.argv[0] = 'numpyro-subsample';"
             " runpy.run_module('numpyro_subsample.cli', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", start, *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = out / "runs" / "laplace-proxy.json"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return {"argv": argv, "out": out, "cache": cache, "code": proc.returncode,
            "stdout": stdout, "stderr": stderr}


def test_sigint_keeps_finished_runs_and_says_how_to_resume(interrupted):
    r = interrupted
    assert r["code"] == 130, r["stderr"][-2000:]
    runs = r["out"] / "runs"
    assert (runs / "laplace-proxy.json").is_file() and (runs / "laplace-proxy.npz").is_file()
    assert not (runs / "sgld-uniform.json").exists()  # interrupted before the last method
    assert not list(runs.glob(".*tmp*"))  # no half-written files left behind
    assert "kept the finished runs (laplace-proxy" in r["stderr"]
    assert re.search(r"resume with: numpyro-subsample compare .*--resume", r["stderr"])
    assert not (r["out"] / "compare.csv").exists()


def test_resume_skips_saved_runs_and_finishes(interrupted, capsys):
    r = interrupted
    saved = r["out"] / "runs" / "laplace-proxy.json"
    before = _stamp(saved), _stamp(saved.with_suffix(".npz"))
    assert main([*r["argv"], "--resume"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"resume: laplace-proxy: result found in .*laplace-proxy\.json.*skipped",
                     err)
    assert "done: sgld-uniform" in err and "done: laplace-proxy" not in err
    assert (_stamp(saved), _stamp(saved.with_suffix(".npz"))) == before  # not recomputed
    rows = _rows(r["out"])
    assert set(rows) == {"nuts", "laplace-proxy", "sgld-cv", "sgld-uniform"}
    assert all(row["status"] == "ok" for row in rows.values())
    assert "resumed" in rows["laplace-proxy"]["note"]
    with open(r["out"] / "compare.json") as fh:
        meta = json.load(fh)["meta"]
    assert meta["runs"]["resumed"] == ["laplace-proxy"] + (
        ["sgld-cv"] if "resume: sgld-cv" in err else [])


def test_corrupt_saved_run_is_recomputed_with_warning(interrupted, capsys):
    r = interrupted
    npz = r["out"] / "runs" / "sgld-uniform.npz"
    if not npz.exists():
        pytest.skip("needs the resumed run of the previous test")
    raw = bytearray(npz.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 8] = bytes(b ^ 0xFF for b in raw[mid:mid + 8])  # flip bytes
    npz.write_bytes(bytes(raw))
    record = r["out"] / "runs" / "sgld-cv.json"
    record.write_text(record.read_text()[:40])  # truncated JSON record
    with pytest.warns(CacheWarning) as caught:
        assert main([*r["argv"], "--resume"]) == 0
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert any(str(npz) in m and "recomputing" in m for m in messages)
    assert any(str(record) in m and "recomputing" in m for m in messages)
    err = capsys.readouterr().err
    assert "done: sgld-uniform" in err and "done: sgld-cv" in err
    assert "resume: laplace-proxy" in err  # the intact run is still reused
    load_arrays(npz)  # rewritten, valid
    assert all(row["status"] == "ok" for row in _rows(r["out"]).values())


def test_stale_saved_run_is_ignored(interrupted, tmp_path, capsys):
    r = interrupted
    argv = [a if a != "300" else "200" for a in r["argv"]]  # other --num-samples: other key
    argv = [*argv[: argv.index("--methods")], "--methods", "laplace-proxy",
            *argv[argv.index("--methods") + 2:]]
    assert main([*argv, "--resume"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"resume: laplace-proxy: .*laplace-proxy\.json is stale", err)
    assert "done: laplace-proxy" in err
    assert _rows(r["out"])["laplace-proxy"]["iterations"] == 200


def test_corrupt_reference_cache_is_recomputed_with_warning(interrupted, capsys):
    r = interrupted
    files = list(Path(r["cache"]).glob("*.npz"))
    assert len(files) == 1  # the reference finished before the interrupt and was cached
    ref = files[0]
    ref.write_bytes(ref.read_bytes()[:200])  # truncated
    argv = [*r["argv"][: r["argv"].index("--methods")], "--methods", "laplace-proxy",
            *r["argv"][r["argv"].index("--methods") + 2:]]
    with pytest.warns(CacheWarning, match=re.escape(str(ref))):
        assert main([*argv, "--resume"]) == 0
    load_arrays(ref)  # recomputed and rewritten
    with open(r["out"] / "compare.json") as fh:
        assert json.load(fh)["meta"]["reference"]["cached"] is False
    capsys.readouterr()


def test_a_swallowed_ctrl_c_still_stops_at_the_next_check():
    """A KeyboardInterrupt lost on its way (JAX's garbage-collection callback prints it as
    "Exception ignored" and drops it) is remembered by the latch compare installs."""
    from numpyro_subsample.compare.runners import InterruptLatch

    latch = InterruptLatch()
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a shell
    with latch.installed():
        latch.check()  # nothing yet
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)  # the handler runs here
        except KeyboardInterrupt:
            pass  # swallowed, as inside a finaliser
        with pytest.raises(KeyboardInterrupt):
            latch.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGINT, before)
