"""Diagnostics: KSD (Putcha, Nemeth and Fearnhead 2023, Eq. 20-21) and the kernel-level
pseudo-variance (Eq. 6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import linreg_data, linreg_exact, linreg_model
from numpyro.infer import MCMC

from numpyro_subsample import SGLD
from numpyro_subsample.core.datapass import datum_values_and_grads
from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.estimators.preferential import analytic_pseudo_variance
from numpyro_subsample.post.diagnostics import full_data_scores, ksd, mcmc_ksd, pseudo_variance


def naive_ksd(x, s, c=1.0, beta=-0.5):
    """O(K² d) NumPy reference of Eq. 20-21 with the IMQ kernel."""
    x = np.asarray(x, np.float64)
    s = np.asarray(s, np.float64)
    K, d = x.shape
    total = 0.0
    for j in range(d):
        acc = 0.0
        for a in range(K):
            r = x[a] - x  # (K, d)
            u = c**2 + np.sum(r**2, 1)
            k = u**beta
            dkx = 2 * beta * u ** (beta - 1) * r[:, j]  # ∂K/∂x_j
            dky = -dkx
            dkxy = (-2 * beta * u ** (beta - 1)
                    - 4 * beta * (beta - 1) * u ** (beta - 2) * r[:, j] ** 2)
            acc += np.sum(s[a, j] * s[:, j] * k + s[a, j] * dky + s[:, j] * dkx + dkxy)
        total += np.sqrt(acc / K**2)
    return total


def test_ksd_matches_naive():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)) * [1.0, 2.0, 0.5]
    s = -x / np.array([1.0, 4.0, 0.25]) + 0.3 * rng.normal(size=x.shape)
    ref = naive_ksd(x, s)
    assert ksd(x, s) == pytest.approx(ref, rel=1e-4)
    assert ksd(x, s, block=7) == pytest.approx(ref, rel=1e-4)  # padded row blocks
    assert ksd(x, s, c=2.0, beta=-0.3) == pytest.approx(naive_ksd(x, s, 2.0, -0.3), rel=1e-4)
    with pytest.raises(ValueError, match="shape"):
        ksd(x, s[:, :2])


def test_ksd_exact_vs_shifted():
    """Exact N(0, I) draws: KSD shrinks like K^-1/2; a shifted set has a clearly larger KSD."""
    rng = np.random.default_rng(1)
    d = 3

    def score(x):
        return -x

    small = rng.normal(size=(200, d))
    big = rng.normal(size=(4000, d))  # chunked into row blocks
    k_small, k_big = ksd(small, score(small)), ksd(big, score(big))
    assert k_big < 0.5 * k_small
    shifted = big + 0.5
    assert ksd(shifted, score(shifted)) > 5 * k_big
    wide = 1.5 * big
    assert ksd(wide, score(wide)) > 5 * k_big


@pytest.fixture(scope="module")
def run():
    X, y = linreg_data(N=3000, d=3, seed=5)
    kernel = SGLD(linreg_model, estimator="cv")
    mcmc = MCMC(kernel, num_warmup=0, num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=30)
    return X, y, kernel, mcmc


def test_full_data_scores_and_mcmc_ksd(run):
    X, y, kernel, mcmc = run
    Xn, yn = np.asarray(X, np.float64), np.asarray(y, np.float64)
    thetas = np.asarray(mcmc.get_samples()["beta"][:5], np.float64)
    exact = (yn - thetas @ Xn.T) @ Xn - thetas / 100.0  # ∇log π, σ = 1, prior sd 10
    data = ModelData.from_args(mcmc._args, mcmc._kwargs)
    got = np.asarray(full_data_scores(kernel.potential, jnp.asarray(thetas, jnp.float32), data))
    np.testing.assert_allclose(got, exact, rtol=2e-3, atol=2e-3 * np.abs(exact).max())
    k_run = mcmc_ksd(mcmc, max_draws=500)
    k_stoch = mcmc_ksd(mcmc, max_draws=500, stochastic=True)
    assert np.isfinite(k_run) and np.isfinite(k_stoch)
    # the run's KSD is far below that of the same draws shifted by 1 posterior sd
    mean, sd = linreg_exact(X, y)
    draws = np.asarray(mcmc.get_samples()["beta"], np.float64)[::2]
    shifted = draws + sd
    s_shift = (yn - shifted @ Xn.T) @ Xn - shifted / 100.0
    assert k_run < 0.5 * ksd(shifted, s_shift)


def test_pseudo_variance_of_kernel(run):
    _, _, kernel, mcmc = run
    params = {k: v[-1] for k, v in mcmc.get_samples().items()}
    pv = pseudo_variance(kernel, params, num_draws=4000, rng_key=jax.random.PRNGKey(3))
    pot, proxy = kernel.potential, kernel.proxy
    theta = jnp.asarray(params["beta"])
    data = ModelData.from_args(mcmc._args, mcmc._kwargs)
    h = np.asarray(datum_values_and_grads(pot, theta, data)[1], np.float64) - np.asarray(
        datum_values_and_grads(pot, proxy.centre, data)[1], np.float64)
    exact = analytic_pseudo_variance(h, None, 30)
    assert pv == pytest.approx(exact, rel=0.1)
    with pytest.raises(ValueError, match="latent"):
        pseudo_variance(kernel, {"alpha": 1.0}, num_draws=10)
