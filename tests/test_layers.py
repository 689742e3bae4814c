"""The import-layer contract of pyproject.toml ([tool.importlinter]): subpackages import
downwards only, sgmcmc and ecs are independent, and the package has no import cycle between
layers. Runs import-linter's own checker, so a cycle or an upward import fails the suite;
and ruff's, so a lint error does too."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_layers_contract_is_kept():
    exe = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable),
                                                      "lint-imports")
    if not os.path.exists(exe):
        pytest.fail("import-linter is not installed: pip install -e '.[dev]'")
    out = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken" in out.stdout, out.stdout[-2000:]


def test_ruff_is_clean():
    """``ruff check`` (pyproject.toml's rules) passes on the package, tests and benchmarks."""
    exe = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    if not os.path.exists(exe):
        pytest.fail("ruff is not installed: pip install -e '.[dev]'")
    out = subprocess.run([exe, "check", "--no-cache", "numpyro_subsample", "tests", "benchmarks"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
