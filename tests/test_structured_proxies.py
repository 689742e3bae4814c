"""Matrix-free proxies: the covariance operator, streamed curvature, Lanczos, fit_structured.

Every check compares with a dense reference (numpy in float64, value_grad_hessian, eigh) or a
closed form. Tolerances: float32 sums over N ≤ 2000 data in chunks round at about
eps·sqrt(N) ≈ 1e-5 relative, so 1e-4 is used for quantities computed two ways from the same
data; looser bounds are justified where they appear.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from models import NOISE_SD, PRIOR_SD, linreg_data, linreg_model, logistic_data, logistic_model

from numpyro_subsample.core.datapass import datum_values_and_grads, value_grad_hessian
from numpyro_subsample.core.potential import ModelData, build_potential
from numpyro_subsample.proxies import structured
from numpyro_subsample.proxies.base import ProxyFitWarning
from numpyro_subsample.proxies.checks import MAX_DECREMENT
from numpyro_subsample.proxies.covariance import (
    cov_matvec,
    diag_cov,
    logdet,
    precision_matvec,
    scale_matvec,
    scale_rmatvec,
    scale_solve,
    structured_covariance,
    to_dense,
)
from numpyro_subsample.proxies.curvature import (
    CurvatureOperator,
    fisher_diagonal,
    fisher_vector_product,
    hessian_diagonal,
    hessian_vector_product,
    hutchinson_diagonal,
)
from numpyro_subsample.proxies.lanczos import lanczos_eigh
from numpyro_subsample.proxies.laplace import fit_laplace
from numpyro_subsample.proxies.lowrank import select_ritz_pairs
from numpyro_subsample.proxies.structured import fit_structured

CHUNK = 256  # several chunks, the last one padded


def dense_matvec(A, v):
    """A hashable matvec for lanczos_eigh: the operand is the dense matrix."""
    return A @ v


@pytest.fixture(scope="module")
def logit():
    """Logistic regression, d = 6, N = 1000, correlated features on different scales (the
    Jacobi-scaled Hessian has eigenvalues ≈ 2.1, 1.6, 1.0, 1.0, 0.2, 0.1)."""
    X, y = logistic_data(N=1000, d=6, seed=1)
    mix = np.eye(6, dtype=np.float32)
    mix[1, 2], mix[2, 2] = 1.0, 0.5  # column 2 = x1 + x2/2
    mix[3, 4], mix[4, 4], mix[1, 4] = 0.8, 0.6, 0.3
    X = (X @ jnp.asarray(mix)) * jnp.asarray([1.0, 2.0, 1.5, 1.0, 0.7, 0.4], jnp.float32)
    data = ModelData.from_args((X, y), {"subsample_size": 50})
    pot = build_potential(logistic_model, data, jax.random.PRNGKey(0))
    theta = jnp.asarray([0.3, -0.2, 0.5, 0.1, -0.4, 0.2], jnp.float32)
    _, _, H = value_grad_hessian(pot, theta, data, CHUNK)
    return pot, data, theta, np.asarray(H, np.float64)


@pytest.fixture(scope="module")
def linreg():
    X, y = linreg_data(N=2000, d=5, seed=2)
    data = ModelData.from_args((X, y), {"subsample_size": 100})
    pot = build_potential(linreg_model, data, jax.random.PRNGKey(0))
    Xn = np.asarray(X, np.float64)
    prec = Xn.T @ Xn / NOISE_SD**2 + np.eye(5) / PRIOR_SD**2
    return pot, data, prec


# --- (c) the covariance operator -------------------------------------------------------------


def _random_operator(d, k, seed=0):
    rng = np.random.default_rng(seed)
    D = rng.uniform(0.5, 3.0, size=d)
    U = np.linalg.qr(rng.normal(size=(d, k)))[0] if k else np.zeros((d, 0))
    s = np.array([4.0, -0.3, 1.5, 0.2][:k])  # a negative coef, P still positive definite
    P = np.diag(D) + (U * s) @ U.T
    op = structured_covariance(
        jnp.asarray(D, jnp.float32), jnp.asarray(U, jnp.float32), jnp.asarray(s, jnp.float32)
    )
    return op, P


@pytest.mark.parametrize("k", [0, 3])
def test_operator_matches_dense(k):
    d = 7
    op, P = _random_operator(d, k)
    cov = np.linalg.inv(P)
    eye = np.eye(d, dtype=np.float32)
    L = np.asarray(jax.vmap(lambda e: scale_matvec(op, e), out_axes=1)(eye), np.float64)
    x = np.random.default_rng(1).normal(size=(3, d)).astype(np.float32)  # batched (..., d)
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(to_dense(op)), cov, **tol)
    np.testing.assert_allclose(L @ L.T, cov, **tol)
    np.testing.assert_allclose(np.asarray(scale_matvec(op, x)), x @ L.T, **tol)
    np.testing.assert_allclose(np.asarray(scale_rmatvec(op, x)), x @ L, **tol)
    np.testing.assert_allclose(np.asarray(scale_solve(op, x @ L.T)), x, **tol)
    np.testing.assert_allclose(np.asarray(cov_matvec(op, x)), x @ cov, **tol)
    np.testing.assert_allclose(np.asarray(precision_matvec(op, x)), x @ P, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(float(logdet(op)), -np.linalg.slogdet(P)[1], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(diag_cov(op)), np.diag(cov), **tol)
    # the operator is a pytree: the functions compile with it as an argument
    np.testing.assert_allclose(np.asarray(jax.jit(scale_matvec)(op, x[0])), L @ x[0], **tol)


def test_operator_rejects_bad_arguments():
    U = np.linalg.qr(np.random.default_rng(0).normal(size=(4, 2)))[0]
    with pytest.raises(ValueError, match="diag"):
        structured_covariance(jnp.asarray([1.0, -1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="basis"):
        structured_covariance(jnp.ones(4), 2 * U, jnp.ones(2))
    with pytest.raises(ValueError, match="basis"):
        structured_covariance(jnp.ones(4), U[:3], jnp.ones(2))
    with pytest.raises(ValueError, match="coef"):
        structured_covariance(jnp.ones(4), U, jnp.ones(3))
    with pytest.raises(ValueError, match="coef"):
        structured_covariance(jnp.ones(4), U, jnp.asarray([1.0, -2.0]))  # P indefinite


# --- (a) curvature streamed over the data ----------------------------------------------------


def test_exact_hessian_diagonal_and_products(logit):
    pot, data, theta, H = logit
    hd = np.asarray(hessian_diagonal(pot, theta, data, CHUNK, block_size=4))  # 2 blocks, padded
    np.testing.assert_allclose(hd, np.diag(H), rtol=1e-4)
    v = jax.random.normal(jax.random.PRNGKey(3), (6,))
    hv = np.asarray(hessian_vector_product(pot, theta, v, data, CHUNK))
    np.testing.assert_allclose(hv, H @ np.asarray(v), rtol=1e-4, atol=1e-4 * np.abs(H).max())


def test_fisher_diagonal_and_product_match_brute_force(logit):
    pot, data, theta, _ = logit
    _, G = datum_values_and_grads(pot, theta, data, CHUNK)
    G = np.asarray(G, np.float64)
    fd, sg = fisher_diagonal(pot, theta, data, CHUNK)
    np.testing.assert_allclose(np.asarray(fd), np.sum(G**2, 0), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(sg), np.sum(G, 0), rtol=1e-4, atol=1e-3)
    v = np.random.default_rng(0).normal(size=6).astype(np.float32)
    fv = np.asarray(fisher_vector_product(pot, theta, jnp.asarray(v), data, CHUNK))
    ref = G.T @ (G @ v)
    np.testing.assert_allclose(fv, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_hutchinson_diagonal_is_within_its_standard_error(logit):
    """Bekas et al. (2007): entry i has variance Σ_{j≠i} H_ij² / M; allow 5 standard errors."""
    pot, data, theta, H = logit
    M = 256
    est = np.asarray(hutchinson_diagonal(pot, theta, data, jax.random.PRNGKey(4), M, CHUNK))
    se = np.sqrt((np.sum(H**2, 1) - np.diag(H) ** 2) / M)
    z = (est - np.diag(H)) / se
    assert np.all(np.abs(z) < 5), z
    assert not np.allclose(est, np.diag(H), rtol=1e-4)  # an estimate, not the exact diagonal


# --- (b) Lanczos -----------------------------------------------------------------------------


def _assert_eigenpairs(result, A, k, rtol):
    vals, vecs = np.linalg.eigh(A)
    vals, vecs = vals[::-1][:k], vecs[:, ::-1][:, :k]
    np.testing.assert_allclose(np.asarray(result.eigenvalues), vals, rtol=rtol)
    cos = np.abs(np.sum(np.asarray(result.eigenvectors, np.float64) * vecs, 0))
    np.testing.assert_allclose(cos, 1.0, atol=1e-3)


def test_lanczos_on_the_scaled_hessian_of_a_potential(logit):
    """Top-2 of σHσ (σ = diag(H)^{-1/2}) from Hessian-vector products, k + p = 5 < d = 6."""
    pot, data, theta, H = logit
    sigma = 1 / np.sqrt(np.diag(H))
    res = lanczos_eigh(
        CurvatureOperator(potential=pot, curvature="hessian", chunk_size=CHUNK),
        (theta, data, jnp.asarray(sigma, jnp.float32)), jax.random.PRNGKey(0), 6, 2, 5,
    )
    _assert_eigenpairs(res, sigma[:, None] * H * sigma[None, :], 2, rtol=1e-3)


def test_lanczos_against_eigh_on_dense_matrices():
    rng = np.random.default_rng(0)
    d = 80
    Q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    lam = np.concatenate([[100.0, 60.0, 40.0, 25.0, 15.0], rng.uniform(0, 5, size=d - 5)])
    A = (Q * lam) @ Q.T
    res = lanczos_eigh(dense_matvec, jnp.asarray(A, jnp.float32), jax.random.PRNGKey(0), d, 5, 30)
    _assert_eigenpairs(res, A, 5, rtol=1e-3)
    V = np.asarray(res.eigenvectors, np.float64)
    np.testing.assert_allclose(V.T @ V, np.eye(5), atol=1e-4)
    # breakdown: a Krylov space of dimension 3 (I + rank 2); the restart keeps the basis
    # orthonormal and the Ritz values exact
    U = np.linalg.qr(rng.normal(size=(d, 2)))[0]
    B = np.eye(d) + (U * [5.0, 3.0]) @ U.T
    res = lanczos_eigh(dense_matvec, jnp.asarray(B, jnp.float32), jax.random.PRNGKey(1), d, 3, 8)
    np.testing.assert_allclose(np.asarray(res.eigenvalues), [6.0, 4.0, 1.0], rtol=1e-5)
    np.testing.assert_allclose(np.abs(np.asarray(res.eigenvectors)[:, :2].T @ U), np.eye(2),
                               atol=1e-4)
    assert np.all(np.isfinite(np.asarray(res.ritz_values)))
    with pytest.raises(ValueError, match="k must be"):
        lanczos_eigh(dense_matvec, jnp.eye(3), jax.random.PRNGKey(0), 3, 4)


def test_lanczos_returns_every_ritz_pair_with_its_residual():
    """All m Ritz pairs: orthonormal, residuals β_m|s_mj| equal to ‖Av − μv‖ (float32: 1e-4
    of ‖A‖), every Ritz value within its residual of an eigenvalue (a unit vector's residual
    bounds its Rayleigh quotient's distance to the spectrum), and the outliers at both ends
    converged (m = 30 ≫ the few steps they need)."""
    rng = np.random.default_rng(2)
    d = 60
    Q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    lam = np.concatenate([[6.0, 4.0, 0.2, 0.05], rng.uniform(0.8, 1.2, size=d - 4)])
    A = (Q * lam) @ Q.T
    res = lanczos_eigh(dense_matvec, jnp.asarray(A, jnp.float32), jax.random.PRNGKey(0), d, 2, 30)
    vals = np.asarray(res.ritz_values, np.float64)
    V = np.asarray(res.ritz_vectors, np.float64)
    r = np.asarray(res.ritz_residuals, np.float64)
    assert V.shape == (d, 30) and np.all(np.diff(vals) <= 0)
    np.testing.assert_allclose(V.T @ V, np.eye(30), atol=1e-4)
    np.testing.assert_allclose(r, np.linalg.norm(A @ V - V * vals, axis=0), atol=1e-4 * 6)
    eig = np.linalg.eigvalsh(A)
    assert np.all(np.min(np.abs(vals[:, None] - eig[None, :]), 1) <= r + 1e-5 * 6)
    np.testing.assert_allclose(vals[[0, 1, -2, -1]], [6.0, 4.0, 0.2, 0.05], rtol=1e-4)
    assert np.all(r[[0, 1, -2, -1]] <= 1e-3 * np.array([6.0, 4.0, 0.2, 0.05]))
    np.testing.assert_allclose(np.asarray(res.eigenvalues), vals[:2])  # the top k, as before


def test_select_ritz_pairs_ends_convergence_and_complements():
    """Hand-made spectra with known optimal choices."""
    vals = np.array([3.0, 1.1, 1.0, 0.9, 0.05])  # d = 10: five more eigenvalues, sum 5
    res = np.zeros(5)
    sel = select_ritz_pairs(vals, res, trace=vals.sum() + 5.0, dim=10, rank=2)
    # {3, 0.05}: c = 8/8 = 1, F = log 0.15; {3, 1.1}: c = 6.05/8, F = 8 log c + log 3.3 > 0
    assert list(sel.kept) == [0, 4] and (sel.top, sel.bottom) == (1, 1)
    np.testing.assert_allclose(sel.complement, 1.0)
    # the bottom pair not converged: it is never kept, the next split wins
    res_b = np.array([0, 0, 0, 0, 0.01])  # 0.01 > ritz_tol · 0.05 = 0.005
    sel = select_ritz_pairs(vals, res_b, trace=vals.sum() + 5.0, dim=10, rank=2)
    assert 4 not in sel.kept and not sel.converged[4] and sel.kept.size == 2
    # only one converged pair: rank 1
    res_1 = np.r_[0.0, np.ones(4)]
    assert list(select_ritz_pairs(vals, res_1, vals.sum() + 5, 10, 2).kept) == [0]
    # "next": c is the largest discarded Ritz value; keeping 3 and 0.05 leaves κ = 1.1/0.9
    sel = select_ritz_pairs(vals, res, vals.sum() + 5.0, 10, 2, complement="next")
    assert list(sel.kept) == [0, 4] and sel.complement == 1.1


# --- (d) the fit -----------------------------------------------------------------------------


def test_fit_finds_the_laplace_mode_and_exact_curvature(logit):
    """Centre within 0.01 Laplace sds of fit_laplace's (both stop ≲ 1e-3 sds from the mode);
    diagonal proxy: P = diag ∇²f(θ̂); low-rank: P = ∇²f on the kept scaled eigenvectors,
    tr(δ⁻¹P) = tr(δ⁻¹∇²f) and c the mean of the discarded eigenvalues (trace rule)."""
    pot, data, _, _ = logit
    lap = fit_laplace(pot, data, jax.random.PRNGKey(1), chunk_size=CHUNK, store_datum_grads=False,
                      check_chain=False)
    sd = np.sqrt(np.diag(np.asarray(lap.cov, np.float64)))
    diag = fit_structured(pot, data, jax.random.PRNGKey(2), chunk_size=CHUNK,
                          store_datum_grads=True)
    assert diag.info["converged"] and diag.info["newton_decrement"] < 0.01
    centre = np.asarray(diag.centre, np.float64)
    assert np.all(np.abs(centre - np.asarray(lap.centre)) / sd < 0.01)
    _, _, H = value_grad_hessian(pot, diag.centre, data, CHUNK)
    H = np.asarray(H, np.float64)
    np.testing.assert_allclose(np.asarray(diag.cov_op.diag), np.diag(H), rtol=1e-4)
    assert diag.cov_op.basis.shape == (6, 0) and diag.info["num_clipped"] == 0
    assert diag.datum_grads.shape == (1000, 6)
    np.testing.assert_allclose(np.asarray(diag.sum_grads), np.asarray(diag.datum_grads).sum(0),
                               atol=1e-4)  # ≈ 0 at the mode: absolute, float32 sums

    low = fit_structured(pot, data, jax.random.PRNGKey(2), structure="low-rank", rank=2,
                         chunk_size=CHUNK, num_epochs=0)
    assert np.all(np.abs(np.asarray(low.centre) - np.asarray(lap.centre)) / sd < 0.01)
    _, g, H = value_grad_hessian(pot, low.centre, data, CHUNK)
    H = np.asarray(H, np.float64)
    # Σ_i ∇f_i(θ̂) without a datum pass: ∇f(θ̂) − ∇f0(θ̂), here ∇f0 = θ̂/PRIOR_SD²
    np.testing.assert_allclose(np.asarray(low.sum_grads),
                               np.asarray(g) - np.asarray(low.centre) / PRIOR_SD**2, atol=1e-3)
    delta = np.diag(H)
    P = np.linalg.inv(np.asarray(to_dense(low.cov_op), np.float64))
    mu, V = np.linalg.eigh(H / np.sqrt(np.outer(delta, delta)))  # ascending
    info = low.info
    # m = min(2k + 10, d) = d: every Ritz pair is exact; the spectrum ≈ (0.1, 0.2, 1, 1, 1.6,
    # 2.1) makes the two smallest the KL choice (F = 4 log 1.43 + log 0.02 < the other splits)
    assert (info["rank"], info["kept_top"], info["kept_bottom"]) == (2, 0, 2)
    assert info["lanczos_iterations"] == 6 and info["passes"]["lanczos"] == 6.0
    kept = np.r_[np.arange(6 - info["kept_top"], 6), np.arange(info["kept_bottom"])]
    np.testing.assert_allclose(np.sort(info["ritz_values"][:2]), np.sort(mu[kept]), rtol=1e-3)
    U = V[:, kept] / np.sqrt(delta)[:, None]
    np.testing.assert_allclose(P @ U, H @ U, rtol=1e-3, atol=1e-3 * np.abs(H @ U).max())
    np.testing.assert_allclose(np.trace(P / delta[:, None]), 6.0, rtol=1e-3)
    np.testing.assert_allclose(info["complement_curvature"], np.delete(mu, kept).mean(),
                               rtol=1e-3)
    assert np.max(info["ritz_values"][2:]) == info["ritz_values"][2]  # largest discarded


@pytest.mark.parametrize("complement", ["trace", "next"])
def test_rank_d_minus_one_is_exact_on_a_gaussian_model(linreg, complement):
    """Linear-Gaussian model: the posterior is N(θ̂, H⁻¹) and k = d − 1 makes P = H."""
    pot, data, prec = linreg
    sp = fit_structured(pot, data, jax.random.PRNGKey(1), structure="low-rank", rank=4,
                        complement=complement, num_epochs=0, chunk_size=512)
    cov = np.linalg.inv(prec)
    np.testing.assert_allclose(np.asarray(to_dense(sp.cov_op)), cov, rtol=1e-4,
                               atol=1e-4 * np.abs(cov).max())
    eye = np.eye(5, dtype=np.float32)
    L = np.asarray(jax.vmap(lambda e: scale_matvec(sp.cov_op, e), out_axes=1)(eye), np.float64)
    np.testing.assert_allclose(L.T @ prec @ L, np.eye(5), atol=1e-4)  # whitened curvature I
    exact_mean = cov @ (np.asarray(data.arrays[0], np.float64).T
                        @ np.asarray(data.arrays[1], np.float64)) / NOISE_SD**2
    assert np.all(np.abs(np.asarray(sp.centre) - exact_mean) / np.sqrt(np.diag(cov)) < 0.01)


def test_optimiser_stopped_early_is_polished_to_the_mode(linreg):
    """L-BFGS stopped at its start (max_iterations=0, no Adam: θ at the prior median, far from
    the mode): with the exact Σ̂ of k = d − 1 on a Gaussian model one step θ − Σ̂∇f(θ) is the
    Newton step and lands on the mode, so the fit does not warn; with polishing disabled
    (``MAX_POLISH = 0``) the same fit warns that the mode was not reached."""
    pot, data, prec = linreg
    cov = np.linalg.inv(prec)
    exact_mean = cov @ (np.asarray(data.arrays[0], np.float64).T
                        @ np.asarray(data.arrays[1], np.float64)) / NOISE_SD**2
    kw = dict(structure="low-rank", rank=4, num_epochs=0, max_iterations=0, chunk_size=512)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProxyFitWarning)
        sp = fit_structured(pot, data, jax.random.PRNGKey(1), **kw)
    assert 1 <= sp.info["passes"]["polish"] <= structured.MAX_POLISH
    assert sp.info["newton_decrement"] <= MAX_DECREMENT / 2
    assert np.all(np.abs(np.asarray(sp.centre) - exact_mean) / np.sqrt(np.diag(cov)) < 0.01)
    g0 = np.asarray(jax.grad(lambda t: pot.prior(t, data))(sp.centre), np.float64)
    full = np.asarray(value_grad_hessian(pot, sp.centre, data, 512, False)[1], np.float64)
    np.testing.assert_allclose(np.asarray(sp.sum_grads), full - g0, rtol=1e-3,
                               atol=1e-3 * np.abs(full).max())  # Σ∇f_i at the new centre
    original = structured.MAX_POLISH
    structured.MAX_POLISH = 0
    try:
        with pytest.warns(ProxyFitWarning, match="did not reach the mode"):
            fit_structured(pot, data, jax.random.PRNGKey(1), **kw)
    finally:
        structured.MAX_POLISH = original


def test_fisher_curvature_approximates_the_hessian_on_a_gaussian_model(linreg):
    """At the mode of a well-specified model E[Σ r_i² x_i x_iᵀ] = Σ x_i x_iᵀ; with N = 2000
    the diagonal fluctuates by ≈ sqrt(2·3/N) ≈ 5.5%: allow 20%."""
    pot, data, prec = linreg
    sp = fit_structured(pot, data, jax.random.PRNGKey(1), curvature="fisher", num_epochs=0,
                        chunk_size=512)
    ratio = np.asarray(sp.cov_op.diag) / np.diag(prec)
    assert np.all(np.abs(ratio - 1) < 0.2), ratio
    assert sp.info["diagonal"] == "fisher" and sp.info["passes"]["diagonal"] == 1.0


# --- the low-rank choice on a linear mixed model: both ends of the spectrum ----------------

J_GROUPS, TAU, SIGMA, BETA_SD = 30, 0.5, 1.0, 2.0


def lmm_model(X, g, y=None, subsample_size=100):
    """y_i = x_iᵀβ + u_{g_i} + ε_i, u_j ~ N(0, τ²), ε_i ~ N(0, σ²), β ~ N(0, s² I); τ, σ known."""
    beta = numpyro.sample("beta", dist.Normal(0, BETA_SD).expand([X.shape[1]]).to_event(1))
    u = numpyro.sample("u", dist.Normal(0, TAU).expand([J_GROUPS]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta + u[g[idx]], SIGMA), obs=y[idx])


@pytest.fixture(scope="module")
def lmm():
    """N = 600 rows in J = 30 groups, a fixed intercept and a slope: d = 32, θ = (β, u). The
    posterior is N(m, H⁻¹), H = AᵀA/σ² + diag(s⁻², τ⁻²), A = [X, Z] (Z the group indicators,
    float64 here). Z has orthogonal columns, so C̃ = δ^{-1/2}Hδ^{-1/2} is I plus the couplings
    of the p = 2 fixed effects: at most 2p = 4 eigenvalues ≠ 1, here ≈ 0.09 (the intercept
    against the mean random intercept), 0.80, 1.20 and 1.91."""
    rng = np.random.default_rng(0)
    N = 600
    X = np.column_stack([np.ones(N), rng.normal(size=N)])
    g = rng.integers(0, J_GROUPS, size=N)
    y = X @ [1.0, -0.5] + TAU * rng.normal(size=J_GROUPS)[g] + SIGMA * rng.normal(size=N)
    data = ModelData.from_args(
        (jnp.asarray(X, jnp.float32), jnp.asarray(g), jnp.asarray(y, jnp.float32)),
        {"subsample_size": 50},
    )
    pot = build_potential(lmm_model, data, jax.random.PRNGKey(0))
    A = np.column_stack([X, np.eye(J_GROUPS)[g]])
    H = A.T @ A / SIGMA**2 + np.diag(np.r_[np.full(2, BETA_SD**-2), np.full(J_GROUPS, TAU**-2)])
    _, _, H32 = value_grad_hessian(pot, pot.init_theta, data, CHUNK)  # the flat order (β, u)
    np.testing.assert_allclose(np.asarray(H32, np.float64), H, rtol=1e-5, atol=1e-4)
    delta = np.diag(H)
    mu, V = np.linalg.eigh(H / np.sqrt(np.outer(delta, delta)))  # ascending
    return pot, data, H, mu, V


def _lmm_fit(lmm, k, **kwargs):
    pot, data = lmm[:2]
    return fit_structured(pot, data, jax.random.PRNGKey(3), structure="low-rank", rank=k,
                          num_epochs=0, chunk_size=CHUNK, **kwargs)


def _proxy_cov(H, mu, V, kept):
    """Σ̂ of the low-rank rule with the exact eigenpairs ``kept`` and c the mean of the rest."""
    c = np.delete(mu, kept).mean()
    Pt = c * np.eye(mu.size) + (V[:, kept] * (mu[kept] - c)) @ V[:, kept].T
    s = np.sqrt(np.diag(H))
    return np.linalg.inv(s[:, None] * Pt * s[None, :])


@pytest.mark.parametrize("k, tol", [(4, 1e-3), (2, 0.03)])
def test_low_rank_recovers_every_marginal_sd_of_a_mixed_model(lmm, k, tol):
    """k = 2p = 4 keeps the four eigenvalues ≠ 1 and the proxy is exact: every posterior sd
    within 1e-3 (float32 sums and Lanczos). k = 2 keeps 0.09 and 1.91, the split (i largest,
    k − i smallest) of least KL(N(θ̂, P⁻¹) ‖ N(θ̂, H⁻¹)), recomputed densely here; c ≈ 1
    replaces 0.80 and 1.20, which moves the sds of this design by up to 2.0% (the rule with
    exact eigenpairs, which the fit matches to 1e-3): 3%. The former choice, the top k pairs
    with the same c, leaves the intercept's sd at 0.36 of the truth (exact pairs)."""
    H, mu, V = lmm[2:]
    d = mu.size
    sd = np.sqrt(np.diag(np.linalg.inv(H)))
    sp = _lmm_fit(lmm, k)
    got = np.sqrt(np.asarray(diag_cov(sp.cov_op), np.float64))
    assert np.max(np.abs(got / sd - 1)) < tol, np.max(np.abs(got / sd - 1))
    assert sp.info["rank"] == k and sp.info["kept_top"] == k // 2

    splits = [np.r_[np.arange(d - i, d), np.arange(k - i)] for i in range(k + 1)]

    def kl(kept):
        M = H @ _proxy_cov(H, mu, V, kept)
        return 0.5 * (np.trace(M) - d - np.linalg.slogdet(M)[1])

    kls = [kl(kept) for kept in splits]
    assert sp.info["kept_top"] == int(np.argmin(kls)), kls
    ideal = np.sqrt(np.diag(_proxy_cov(H, mu, V, splits[sp.info["kept_top"]])))
    np.testing.assert_allclose(got, ideal, rtol=1e-3)
    top_k = np.sqrt(np.diag(_proxy_cov(H, mu, V, np.arange(d - k, d))))
    assert top_k[0] / sd[0] < 0.4


def test_kept_ritz_pairs_are_the_eigenpairs_at_both_ends(lmm):
    """k = 4: the kept Ritz pairs are eigh's two largest and two smallest pairs of the dense
    C̃ (values to 1e-4 relative, float32; vectors up to sign, |cos| to 1e-4), the discarded
    eigenvalues are all 1, so c = 1, and the whitened curvature LᵀHL is I."""
    H, mu, V = lmm[2:]
    d = mu.size
    sp = _lmm_fit(lmm, 4)
    info = sp.info
    assert (info["kept_top"], info["kept_bottom"]) == (2, 2)
    ends = [d - 1, d - 2, 1, 0]  # kept first, largest first
    np.testing.assert_allclose(info["ritz_values"][:4], mu[ends], rtol=1e-4)
    assert np.all(info["ritz_converged"][:4])
    W = np.asarray(sp.cov_op.white_basis, np.float64)  # the kept Ritz vectors
    np.testing.assert_allclose(np.abs(np.sum(W * V[:, ends], 0)), 1.0, atol=1e-4)
    np.testing.assert_allclose(info["complement_curvature"], 1.0, rtol=1e-4)
    eye = np.eye(d, dtype=np.float32)
    L = np.asarray(jax.vmap(lambda e: scale_matvec(sp.cov_op, e), out_axes=1)(eye), np.float64)
    np.testing.assert_allclose(L.T @ H @ L, np.eye(d), atol=1e-3)


def test_next_complement_bounds_the_whitened_curvature(lmm):
    """complement="next", k = 2: c is the largest discarded eigenvalue (1.20), so LᵀHL ≤ I,
    and the kept pairs 1.91 and 0.09 leave the smallest condition number, 1.20/0.80 (the
    other splits leave 1.20/0.09 or 1.91/1)."""
    H, mu, V = lmm[2:]
    d = mu.size
    sp = _lmm_fit(lmm, 2, complement="next")
    info = sp.info
    assert (info["kept_top"], info["kept_bottom"]) == (1, 1)
    np.testing.assert_allclose(info["complement_curvature"], mu[-2], rtol=1e-4)
    eye = np.eye(d, dtype=np.float32)
    L = np.asarray(jax.vmap(lambda e: scale_matvec(sp.cov_op, e), out_axes=1)(eye), np.float64)
    w = np.linalg.eigvalsh(L.T @ H @ L)
    np.testing.assert_allclose([w[0], w[-1]], [mu[1] / mu[-2], 1.0], rtol=1e-3)


# --- (e) a non-convex posterior: a small Bayesian neural network -----------------------------


def bnn_model(X, y=None, subsample_size=50, hidden=10):
    """One hidden tanh layer, Normal(0, 1) priors: d = 2·10 + 10 + 10 + 1 = 41."""
    w1 = numpyro.sample("w1", dist.Normal(0, 1).expand([X.shape[1], hidden]).to_event(2))
    b1 = numpyro.sample("b1", dist.Normal(0, 1).expand([hidden]).to_event(1))
    w2 = numpyro.sample("w2", dist.Normal(0, 1).expand([hidden]).to_event(1))
    b2 = numpyro.sample("b2", dist.Normal(0, 1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        h = jnp.tanh(X[idx] @ w1 + b1)
        numpyro.sample("y", dist.Normal(h @ w2 + b2, 0.1), obs=y[idx])


@pytest.fixture(scope="module")
def bnn():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2)).astype(np.float32)
    y = (np.sin(2 * X[:, 0]) + 0.5 * X[:, 0] * X[:, 1] + 0.1 * rng.normal(size=300))
    data = ModelData.from_args((jnp.asarray(X), jnp.asarray(y, jnp.float32)),
                               {"subsample_size": 50})
    return build_potential(bnn_model, data, jax.random.PRNGKey(0)), data


def _assert_positive_curvature(sp):
    op = sp.cov_op
    assert np.all(np.asarray(op.diag) > 0) and np.all(1 + np.asarray(op.white_eig) > 0)
    assert np.all(np.asarray(diag_cov(op)) > 0) and np.isfinite(float(logdet(op)))


def test_bnn_fit_runs_and_keeps_curvature_positive(bnn):
    pot, data = bnn
    assert pot.dim == 41
    init = 0.5 * jax.random.normal(jax.random.PRNGKey(7), (pot.dim,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProxyFitWarning)  # may stop short of the mode
        sp = fit_structured(pot, data, jax.random.PRNGKey(1), structure="low-rank", rank=8,
                            init_theta=init, num_epochs=0, max_iterations=40, chunk_size=300)
    assert np.all(np.isfinite(np.asarray(sp.centre)))
    assert sp.info["potential"] < float(value_grad_hessian(pot, init, data, 300, False)[0])
    assert set(sp.info["clipped"]) == {"diagonal", "eigenvalues", "complement"}
    assert sp.info["num_clipped"] == sum(sp.info["clipped"].values())
    _assert_positive_curvature(sp)


def test_bnn_at_a_saddle_clips_negative_curvature(bnn):
    """At θ = 0 (the prior median) the network is at a saddle: the Hessian is indefinite, the
    scaled spectrum's discarded mean is negative; the floors keep P positive definite."""
    pot, data = bnn
    _, _, H = value_grad_hessian(pot, pot.init_theta, data, 300)
    assert np.linalg.eigvalsh(np.asarray(H, np.float64))[0] < 0
    with pytest.warns(ProxyFitWarning, match="did not reach the mode"):
        sp = fit_structured(pot, data, jax.random.PRNGKey(1), structure="low-rank", rank=8,
                            num_epochs=0, max_iterations=0, chunk_size=300)
    info = sp.info
    assert info["num_clipped"] >= 1 and info["clipped"]["complement"] == 1
    assert info["complement_curvature"] < 0 and not info["converged"]
    _assert_positive_curvature(sp)
    # the clipped complement sits at the floor: c·δ is the smallest diagonal scale
    floor = info["eigenvalue_floor"]
    assert floor >= info["curvature_floor"]
    assert np.all(np.asarray(sp.cov_op.white_eig) >= -1e-5)  # μ_j/c − 1 with c at the floor


# --- (f) bad arguments -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"structure": "dense"}, "structure"),
        ({"structure": "low-rank", "rank": 0}, "rank"),
        ({"structure": "low-rank", "rank": 6}, "rank"),
        ({"structure": "low-rank", "rank": 2.5}, "rank"),
        ({"curvature": "gauss-newton"}, "Gauss-Newton"),
        ({"curvature": "exact"}, "curvature"),
        ({"diagonal": "random"}, "diagonal"),
        ({"structure": "low-rank", "rank": 2, "complement": "max"}, "complement"),
        ({"structure": "low-rank", "rank": 2, "oversample": -1}, "oversample"),
        ({"structure": "low-rank", "rank": 2, "ritz_tol": 0.0}, "ritz_tol"),
        ({"num_probes": 0}, "num_probes"),
        ({"max_iterations": -1}, "max_iterations"),
        ({"gtol": 0.0}, "gtol"),
        ({"curvature_floor": 1.0}, "curvature_floor"),
        ({"learning_rate": -0.1}, "learning_rate"),
        ({"num_epochs": -1.0}, "num_epochs"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"block_size": 0}, "block_size"),
        ({"init_theta": jnp.zeros(5)}, "init_theta"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(logit, kwargs, name):
    pot, data, _, _ = logit
    with pytest.raises(ValueError, match=name):
        fit_structured(pot, data, jax.random.PRNGKey(0), **kwargs)
