"""The ``numpyro-subsample compare`` command on a tiny problem, and its error handling."""

from __future__ import annotations

import contextlib
import csv
import inspect
import io
import json
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from numpyro_subsample import compare
from numpyro_subsample.cli import main
from numpyro_subsample.compare import available_methods, setup_compile_cache
from numpyro_subsample.compare.checks import DrawsRun, check_code, record_warnings, run_checks
from numpyro_subsample.datasets.generators import make_rare_features
from numpyro_subsample.proxies.chain_check import CHAIN_PASSES

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

TINY = ["--quick", "--num-data", "2000", "--subsample-size", "50", "--num-samples", "1000",
        "--nuts-samples", "200", "--reference-samples", "400", "--no-progress"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    cache = tmp_path_factory.mktemp("cache")
    argv = ["compare", *TINY, "--methods", "sgld-cv,sgld-uniform,laplace-proxy,variational-proxy",
            "--out", str(out), "--cache-dir", str(cache), "--device", "cpu"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out, cache, err.getvalue()


def test_compare_writes_table_csv_json_png(run, capsys):
    code, out, _, stderr = run
    assert code == 0
    # it says what it is doing: the reference, then each method as it starts and ends
    assert "reference: NUTS on the full data, 200 + 400 steps" in stderr
    assert "[1/4] sgld-cv: 300 + 1000 steps" in stderr and "done: sgld-cv in" in stderr
    with open(out / "compare.csv") as fh:
        rows = list(csv.DictReader(fh))
    laplace, variational = "Laplace proxy (no MCMC)", "variational proxy (no MCMC)"
    assert [r["method"] for r in rows] == ["nuts (reference)", "sgld-cv", "sgld-uniform",
                                           laplace, variational]
    for col in ("min_ess", "ess_per_s", "warnings", "checks", "flags", "ksd_draws"):
        assert col in rows[0]
    with open(out / "compare.json") as fh:
        data = json.load(fh)
    assert data["meta"]["num_data"] == 2000 and data["meta"]["dim"] == 21
    assert data["meta"]["subsample_size"] == 50
    # the default problem: rare binary features (disjoint rows) and high-leverage rows
    assert data["meta"]["dataset"] == "rare_features_logistic_N2000_d21"
    assert len(data["meta"]["problem_info"]["minority_counts"]) == 3
    by = {r["method"]: r for r in data["rows"]}
    ref, cv = by["nuts (reference)"], by["sgld-cv"]
    assert ref["mean_err"] == 0.0 and ref["sd_log_ratio"] == 0.0
    assert cv["status"] == "ok" and cv["name"] == "sgld-cv"
    # accuracy and costs are real numbers, not placeholders
    assert 0 < cv["mean_err"] < 10 and 0 < cv["sd_log_ratio"] < 10
    assert cv["data_passes"] > 1000 * 50 / 2000  # sampling passes + preprocessing
    assert cv["iterations"] == 1300 and cv["it_per_s"] > 0
    assert cv["compile_s"] >= 0 and cv["preprocessing_s"] > 0
    assert cv["ksd"] is not None and cv["ksd"] > 0
    # the KSD of every row on the same number of thinned draws; the reference's is the floor
    ksd = data["meta"]["ksd"]
    assert ksd["draws"] == 150 and {r["ksd_draws"] for r in data["rows"]} == {150}
    assert ksd["floor"] == ref["ksd"] > 0
    # ESS/s: the smallest bulk ESS over the wall time, compilation included
    for r in (cv, ref, by[laplace]):
        wall = r["preprocessing_s"] + r["sampling_s"] + r["compile_s"]
        assert r["min_ess"] > 0
        assert r["ess_per_s"] == pytest.approx(r["min_ess"] / wall, rel=1e-6)
    # run checks and warnings: counts in the table, full text in the JSON
    for r in data["rows"]:
        assert r["warnings"] == len(r["warning_messages"])
        assert r["checks"] in ("ok", "ESS", "div", "ESS,div", "fail")
        assert set(r["check_details"]) >= {"min_ess_bulk", "divergences", "num_draws",
                                           "messages"}
    assert ref["check_details"]["num_draws"] == 400 and cv["check_details"]["num_draws"] == 1000
    # the proxies: as many independent draws as the SG chains, charged their fit
    shared = data["meta"]["shared_proxy"]
    lap, vi = by[laplace], by[variational]
    for r in (lap, vi):
        assert r["status"] == "ok" and r["iterations"] == 1000
        assert r["check_details"]["num_draws"] == 1000 and r["check_details"]["divergences"] == 0
        assert r["min_ess"] > 500  # independent draws
    # the Laplace row: the kernels' shared fit and the chain check a fit on its own runs
    assert lap["data_passes"] == pytest.approx(shared["data_passes"] + CHAIN_PASSES)
    assert lap["preprocessing_s"] > shared["seconds"]
    assert lap["compile_s"] >= shared["compile_s"]
    assert vi["data_passes"] > 1 and vi["preprocessing_s"] > 0
    # the Laplace approximation is off on this problem (a skewed coefficient posterior)
    assert lap["mean_err"] > 0.2
    # one "flags" column: failed run checks, errors far from the reference, warnings
    far = data["meta"]["far_sd"]
    assert far >= 0.25 and far >= data["meta"]["reference"]["mc_error"]["mean_err"]
    for r in data["rows"]:
        flags = r["flags"].split(", ") if r["flags"] else []
        assert ("mean" in r["flags"]) == (r["mean_err"] > far), r
        assert ("sd x" in r["flags"]) == (r["sd_log_ratio"] > far), r
        assert set(c for c in r["checks"].split(",") if c not in ("ok", "n/a")) <= set(flags)
        assert {w["category"] for w in r["warning_messages"]} <= set(flags)
    assert "mean" in lap["flags"]  # the proxy alone is judged like every other row
    printed = compare.format_summary({"rows": data["rows"], "meta": data["meta"], "paths": {}})
    assert printed.splitlines()[0].split()[-1] == "flags" and "device: cpu" in printed
    assert "floor" in printed and "Monte Carlo error" in printed
    # it says what it is doing: the reference, each method as it starts and ends
    assert data["meta"]["device"].startswith("cpu")
    # one plotted curve per non-reference method, increasing in passes
    assert set(data["curves"]) == {"sgld-cv", "sgld-uniform", laplace, variational}
    passes = data["curves"]["sgld-cv"]["passes"]
    assert passes == sorted(passes) and len(passes) >= 5
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # one Laplace proxy for both kernels; each is charged its seconds and data passes
    shared = data["meta"]["shared_proxy"]
    assert shared is not None and shared["data_passes"] >= 2
    for r in (cv, by["sgld-uniform"]):
        assert r["preprocessing_s"] >= shared["seconds"]
        assert r["compile_s"] >= shared["compile_s"]
        assert r["data_passes"] >= shared["data_passes"] + 1300 * 50 / 2000 - 1e-6
    # each run is saved in <out>/runs as soon as it finishes
    runs = sorted(p.name for p in (out / "runs").glob("*.json"))
    assert runs == ["laplace-proxy.json", "sgld-cv.json", "sgld-uniform.json",
                    "variational-proxy.json"]
    assert data["meta"]["fast_compile"] is True  # --quick compiles without XLA optimisations
    assert data["meta"]["jobs"] == 2  # --quick: the NUTS reference ran in a worker process


def test_reference_is_cached(run, tmp_path, capsys):
    _, _, cache, _ = run
    assert len(list(Path(cache).glob("*.npz"))) == 1
    code = main(["compare", *TINY, "--methods", "nuts", "--out", str(tmp_path),
                 "--cache-dir", str(cache), "--no-ksd"])
    assert code == 0
    with open(tmp_path / "compare.json") as fh:
        data = json.load(fh)
    assert data["meta"]["reference"]["cached"] is True
    printed = capsys.readouterr().out
    assert "nuts (reference)" in printed and "KSD disabled" in printed


def test_compare_runs_the_energy_conserving_kernel(run, tmp_path):
    """The runner asks the SG kernels for the per-draw data_passes and the energy-conserving
    HMC for its leapfrog steps, from which its data passes follow: a row, not a failure."""
    _, _, cache, _ = run
    code = main(["compare", *TINY, "--methods", "energyconservinghmc", "--out", str(tmp_path),
                 "--cache-dir", str(cache), "--no-ksd"])
    assert code == 0
    with open(tmp_path / "compare.json") as fh:
        data = json.load(fh)
    rows = {r["method"]: r for r in data["rows"]}
    ecs = rows["energyconservinghmc"]
    assert ecs["status"] == "ok", ecs
    # its data passes, from its leapfrog steps: preprocessing + ≥ 2 n/N per iteration
    assert ecs["data_passes"] > 400 * 2 * 50 / 2000 and "approximate" in ecs["note"]
    passes = data["curves"]["energyconservinghmc"]["passes"]
    assert passes == sorted(passes) and all(p is not None for p in passes)


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
    assert {"nuts", "hmcecs", "sgld-uniform", "sgld-cv", "laplace-proxy",
            "variational-proxy"} <= set(found)
    assert found["laplace-proxy"].title == "Laplace proxy (no MCMC)"
    quick = [m.name for m in compare.select_methods(found, "default", quick=True)]
    assert "laplace-proxy" in quick and "variational-proxy" in quick


def test_rare_features_generator():
    a, b = make_rare_features(5000), make_rare_features(5000)
    np.testing.assert_array_equal(a.X_train, b.X_train)  # seeded, deterministic
    X, info = a.X_train, a.info
    assert X.shape == (5000, 21) and np.all(X[:, 0] == 1)
    binary = X[:, -3:]
    assert set(np.unique(binary)) == {0.0, 1.0}
    np.testing.assert_array_equal(binary.sum(0), [50, 100, 250])  # 1 %, 2 %, 5 % of rows
    assert binary.sum(1).max() == 1  # disjoint rows
    # nearly separating: few rows with the feature carry the minority label
    for j, (label, count) in enumerate(zip(info["minority_labels"], info["minority_counts"],
                                           strict=True)):
        rows = binary[:, j] == 1
        assert np.sum(a.y_train[rows] == label) == count <= 10
    norms = np.linalg.norm(X[:, 1:-3], axis=1)
    assert np.sum(norms > 5 * np.median(norms)) == info["num_leverage"] == 10
    with pytest.raises(ValueError, match="minority_counts"):
        make_rare_features(1000, minority_counts=(1.0,))


@pytest.mark.parametrize("name", ["covtype_subset20k", "a9a", "ijcnn1", "w8a"])
def test_real_datasets_accepted(name):
    compare.check_dataset(name)  # a known name
    if not DATA.is_dir():
        pytest.skip(f"shared data folder {DATA} is absent")
    p = compare.make_problem(name, data_dir=str(DATA), num_data=500)
    assert p.task == "logistic" and p.num_data == 500 and np.all(np.asarray(p.X)[:, 0] == 1)
    if name == "covtype_subset20k":
        assert p.name == "covtype_subset20k" and p.dim == 55


def test_run_checks_adapter_with_stub(monkeypatch):
    """The comparison calls ``post.checks.check_run(mcmc, warn=False)`` and keeps its fields;
    without the module the checks are ``None`` (``n/a``)."""
    from numpyro_subsample.compare import checks as C

    calls = []

    def fake_check_run(mcmc, *, min_ess_per_chain=100.0, max_rhat=1.01, warn=True):
        calls.append((mcmc, warn))
        draws = mcmc.get_samples(group_by_chain=True)["beta"]
        div = int(np.sum(mcmc.get_extra_fields()["diverging"]))
        rc = namedtuple("RunCheck", C.CHECK_FIELDS)
        return rc(12.0, 15.0, float("nan"), ("beta[0]",), div, draws.shape[0] * draws.shape[1],
                  ("min ESS 12 (bulk) < 100",))

    monkeypatch.setattr(C, "_check_run_fn", lambda: fake_check_run)
    run = DrawsRun({"beta": np.zeros((40, 2))}, np.arange(40) == 3)
    got = run_checks(run)
    assert calls == [(run, False)]
    assert got["divergences"] == 1 and got["num_draws"] == 40 and got["worst_sites"] == ["beta[0]"]
    assert check_code(got) == "ESS,div"
    monkeypatch.setattr(C, "_check_run_fn", lambda: None)
    assert run_checks(run) is None and check_code(None) == "n/a"

    def broken(mcmc, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(C, "_check_run_fn", lambda: broken)
    assert check_code(run_checks(run)) == "error"


def test_record_warnings_unique_with_counts():
    import warnings

    with record_warnings() as caught:
        for _ in range(3):
            warnings.warn("step too small at beta\nsecond line", UserWarning, stacklevel=1)
        warnings.warn("other", DeprecationWarning, stacklevel=1)
    assert caught == [("UserWarning", "step too small at beta\nsecond line", 3),
                      ("DeprecationWarning", "other", 1)]
    rows = [{"method": "m", "warning_messages": [
        {"category": c, "message": msg, "count": k} for c, msg, k in caught]}]
    lines = compare.report.warning_lines(rows)
    assert lines == ["  m: UserWarning: step too small at beta (x3)",
                     "  m: DeprecationWarning: other"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["compare", "--methods", "nope"], "Unknown or unavailable method"),
        (["compare", "--dataset", "/nonexistent/file.npz"], "neither a known name"),
        (["compare", "--num-samples", "-3"], "positive integer"),
        (["compare", "--subsample-size", "5000", "--num-data", "1000"], "--subsample-size"),
        (["compare", "--device", "nosuchplatform"], "--device 'nosuchplatform'"),
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


def test_row_flags():
    from numpyro_subsample.compare.checks import row_flags

    ok = row_flags(checks="ok", warning_messages=[], mean_err=0.1, sd_log_ratio=0.1)
    assert ok == ""
    got = row_flags(checks="ESS,div", mean_err=1.83, sd_log_ratio=0.4,
                    warning_messages=[{"category": "ProxyFitWarning", "message": "m",
                                       "count": 2}])
    assert got == "ESS, div, mean 1.83 sd, sd x1.49, ProxyFitWarning"
    assert row_flags(checks="n/a", warning_messages=[], mean_err=0.3, sd_log_ratio=None,
                     far=0.5) == ""
    assert row_flags(checks="n/a", warning_messages=[], mean_err=None, sd_log_ratio=None,
                     status="failed") == "FAILED"


def test_reference_mc_error_shrinks_with_ess():
    rng = np.random.default_rng(0)
    short, long = (compare.reference_mc_error(rng.standard_normal((s, 21)))
                   for s in (400, 10_000))
    assert short[0] > long[0] > 0 and short[1] > long[1] > 0
    # 10^4 independent draws resolve the worst of 21 mean errors to about 0.03 sd
    assert 0.02 < long[0] < 0.05


def test_plot_reads_at_a_glance(tmp_path):
    """Colour-blind-safe colours by dynamic, line styles by estimator; every method drawn
    where it has the figure and named where it has not."""
    from numpyro_subsample.compare import report

    okabe_ito = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7"}
    names = [m.name for m in available_methods().values() if m.kind != "nuts"]
    styles = {n: report.method_style(n) for n in names}
    assert {c for c, _, _ in styles.values()} <= okabe_ito
    for a in names:  # no two methods look the same
        for b in names:
            assert a == b or styles[a] != styles[b], (a, b)
    assert styles["sgld-cv"][0] == styles["sgld-uniform"][0] != styles["sghmc-cv"][0]
    assert styles["sgld-cv"][1] == styles["sghmc-cv"][1] != styles["sgld-uniform"][1]
    pts = [20, 100, 1000]
    curves = {
        "sgld-cv": {"name": "sgld-cv", "passes": [3, 10, 40], "wall_s": [9, 10, 12],
                    "mean_err": [1.0, 0.3, 0.1], "sd_log_ratio": [0.5, 0.2, 0.1], "draws": pts},
        "energyconservinghmc": {"name": "energyconservinghmc", "passes": [None] * 3,
                                "wall_s": [20, 21, 22], "mean_err": [0.5, 0.2, 0.08],
                                "sd_log_ratio": [0.3, 0.1, 0.05], "draws": pts},
    }
    meta = {"dataset": "toy", "num_data": 1000, "dim": 3, "subsample_size": 10, "far_sd": 0.25,
            "device": "cpu", "reference": {"draws": 10_000, "mc_error": {
                "mean_err": 0.03, "sd_log_ratio": 0.02}, "cost": {"passes": 900, "wall_s": 30}}}
    path = tmp_path / "p.png"
    import matplotlib.pyplot as plt

    saved = {}
    orig = plt.Figure.savefig

    def keep(fig, *a, **k):
        saved["fig"] = fig
        return orig(fig, *a, **k)

    plt.Figure.savefig = keep
    try:
        report.plot_curves(path, curves, meta)
    finally:
        plt.Figure.savefig = orig
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = saved["fig"]
    axes = fig.axes
    legend = fig.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert {"sgld-cv", "energyconservinghmc"} <= set(labels)
    assert any("Monte Carlo error" in t for t in labels)
    # the legend sits right of every panel, outside the data
    fig.canvas.draw()
    right = max(ax.get_window_extent().x1 for ax in axes)
    assert legend.get_window_extent().x0 >= right
    # passes panels: ECS is named as missing; seconds panels include compilation and draw it
    texts = [t.get_text() for t in axes[0].texts]
    assert any("energyconservinghmc" in t for t in texts)
    assert "compilation included" in axes[1].get_xlabel()
    # short tick labels that do not run into each other
    assert [report._tick(v) for v in (0.05, 2, 1000, 1e4, 2e4)] == [
        "0.05", "2", "1,000", "$10^{4}$", "$2\\cdot10^{4}$"]
    assert {ln.get_label() for ln in axes[1].lines} >= {"sgld-cv", "energyconservinghmc"}


def test_engine_phases_are_short_named_functions():
    """The engine lives in compare.engine (phases 3-4 in compare.evaluation), each function
    under 60 lines."""
    from numpyro_subsample.compare import engine, evaluation

    assert compare.run_compare is engine.run_compare
    for mod in (engine, evaluation):
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if fn.__module__ == mod.__name__:
                assert len(inspect.getsource(fn).splitlines()) < 60, name
    init = Path(compare.__file__).read_text()
    assert "def " not in init  # re-exports only


def test_use_device():
    from numpyro_subsample.compare import use_device

    with use_device("cpu") as dev:
        assert dev.startswith("cpu")
    with pytest.raises(ValueError, match="--device 'tpu9'.*platforms present"):
        with use_device("tpu9"):
            pass
