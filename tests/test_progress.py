"""The preprocessing's progress bars follow the package MCMC's progress_bar, and a proxy fit
that stops early closes its bar at 100 % saying why."""

from __future__ import annotations

import jax
import pytest
from models import linreg_data, linreg_model

from numpyro_subsample import MCMC, SGLD, EnergyConservingHMC, ModelData, build_potential
from numpyro_subsample.proxies.laplace import fit_laplace

pytestmark = pytest.mark.fast_compile


@pytest.fixture(scope="module")
def data():
    return linreg_data(N=2000, d=3)


@pytest.mark.parametrize("cls", [SGLD, EnergyConservingHMC])
@pytest.mark.parametrize("mcmc_bar", [False, True])
def test_proxy_bars_follow_the_mcmc(data, cls, mcmc_bar, capsys, monkeypatch):
    monkeypatch.delenv("CI", raising=False)  # a user's terminal: bars on by default
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    X, y = data
    mcmc = MCMC(cls(linreg_model), num_warmup=20, num_samples=20, progress_bar=mcmc_bar,
                check=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    err = capsys.readouterr().err
    assert ("proxy: Newton" in err) == mcmc_bar, err[-500:]


def test_kernel_option_overrides_the_mcmc(data, capsys, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    X, y = data
    MCMC(SGLD(linreg_model, progress_bar=True), num_warmup=20, num_samples=20,
         progress_bar=False, check=False).run(jax.random.PRNGKey(0), X, y)
    assert "proxy: Newton" in capsys.readouterr().err
    MCMC(SGLD(linreg_model, progress_bar=False), num_warmup=20, num_samples=20,
         progress_bar=True, check=False).run(jax.random.PRNGKey(0), X, y)
    assert "proxy:" not in capsys.readouterr().err


def test_newton_bar_ends_at_100_percent_when_newton_converges_early(data, capsys, monkeypatch):
    # a line wide enough for the note: off a terminal, tqdm < 4.68 sizes the bar by $COLUMNS
    # (80 in an xdist worker) and trims the line, note included
    monkeypatch.setenv("COLUMNS", "200")
    X, y = data
    md = ModelData.from_args((X, y), {})
    pot = build_potential(linreg_model, md, jax.random.PRNGKey(0))
    proxy = fit_laplace(pot, md, jax.random.PRNGKey(1), max_newton_steps=25, progress=True,
                        check_chain=False)
    steps = proxy.info["newton_steps"]
    assert proxy.info["converged"] and steps < 25  # a Gaussian target: Newton stops early
    final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    newton = [line for line in final if "Newton" in line][-1]
    assert "100%" in newton and f"{steps}/{steps}" in newton, newton
    assert f"converged at step {steps}" in newton, newton
