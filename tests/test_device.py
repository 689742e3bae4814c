"""``--device``: the benchmarks and ``compare`` run on a named JAX platform and report it."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import jax
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def runs_module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _runs

    return _runs


def test_benchmark_device_option(runs_module, capsys):
    before = jax.config.jax_default_device
    try:
        p = argparse.ArgumentParser()
        runs_module.add_device_option(p)
        args = p.parse_args(["--device", "cpu"])
        assert args.device.startswith("cpu (") and jax.config.jax_default_device.platform == "cpu"
        assert capsys.readouterr().out.startswith("device: cpu")
        assert p.parse_args([]).device.startswith(jax.devices()[0].platform)  # JAX's default
        with pytest.raises(SystemExit):
            p.parse_args(["--device", "nosuchplatform"])
        err = capsys.readouterr().err
        assert "--device" in err and "'nosuchplatform'" in err and "platforms present" in err
    finally:
        jax.config.update("jax_default_device", before)


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")
                                           if "parse_args(" in p.read_text()))
def test_every_benchmark_accepts_device(script):
    """Every benchmark with a command line adds the shared ``--device`` option (run_all.py
    passes it on to each script)."""
    text = (BENCH / script).read_text()
    if script == "run_all.py":
        assert '"--device", args.device' in text
    else:
        assert re.search(r"add_device_option\(\w+\)\n\s+\w+ = \w+\.parse_args\(", text), script


def test_compare_device_flag(tmp_path, capsys):
    from numpyro_subsample.cli import main

    assert main(["compare", "--device", "nosuchplatform", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--device 'nosuchplatform'" in err and "platforms present" in err
    assert not (tmp_path / "compare.csv").exists()
    assert sys.modules["numpyro_subsample.compare"].use_device  # public helper
