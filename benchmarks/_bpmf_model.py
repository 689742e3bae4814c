"""The Bayesian PMF problem of ``bench_bpmf.py``: synthetic ratings, the NumPyro model, the
predictions and their RMSE, the local ZV regression, and the references (MAP by alternating
least squares, exact blocked Gibbs). Description in ``bench_bpmf.py``.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

SIGMA = 0.5


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- data and model -------------------------------------------------------------------------------
def make_data(L: int, M: int, D: int, density: float, test_frac: float, seed: int) -> dict:
    """Synthetic ratings (module docstring): train/test (user, item, rating) and the truth."""
    rng = np.random.default_rng(seed)
    s = D**-0.25
    U, V = s * rng.normal(size=(L, D)), s * rng.normal(size=(M, D))
    num = int(round(density * L * M))
    flat = rng.choice(L * M, num, replace=False)
    users, items = flat // M, flat % M
    r = np.sum(U[users] * V[items], 1) + SIGMA * rng.normal(size=num)
    perm = rng.permutation(num)
    te, tr = perm[: int(round(test_frac * num))], perm[int(round(test_frac * num)):]
    return {"L": L, "M": M, "D": D, "s": s, "U": U, "V": V,
            "u_tr": users[tr].astype(np.int32), "v_tr": items[tr].astype(np.int32),
            "r_tr": r[tr], "u_te": users[te].astype(np.int32),
            "v_te": items[te].astype(np.int32), "r_te": r[te]}


def bpmf_model(users, items, ratings=None, num_users: int = 100, num_items: int = 100,
               rank: int = 10, subsample_size: int = 1000) -> None:
    """U, V with N(0, s²) priors, s = rank^{-1/4}; ratings N(U_lᵀV_m, σ²) in the data plate."""
    s = rank**-0.25
    U = numpyro.sample("U", dist.Normal(0.0, s).expand([num_users, rank]).to_event(2))
    V = numpyro.sample("V", dist.Normal(0.0, s).expand([num_items, rank]).to_event(2))
    with numpyro.plate("data", users.shape[0], subsample_size=subsample_size) as idx:
        mean = jnp.sum(U[users[idx]] * V[items[idx]], -1)
        numpyro.sample("r", dist.Normal(mean, SIGMA),
                       obs=None if ratings is None else ratings[idx])


def model_inputs(dd: dict, n: int) -> tuple[tuple, dict]:
    f = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    args = (jnp.asarray(dd["u_tr"]), jnp.asarray(dd["v_tr"]), jnp.asarray(dd["r_tr"], f))
    return args, {"num_users": dd["L"], "num_items": dd["M"], "rank": dd["D"],
                  "subsample_size": n}


@jax.jit
def predict(U, V, users, items):
    """U_lᵀV_m for the pairs, for draws with leading axes: U (..., L, D) -> (..., T)."""
    return jnp.sum(U[..., users, :] * V[..., items, :], -1)


def rmse(pred: np.ndarray, r: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(pred, np.float64) - r) ** 2)))


def window_rmse(pred: np.ndarray, r: np.ndarray) -> np.ndarray:
    """RMSE after each draw j of the mean over draws ⌊j/2⌋..j; ``pred`` (C, S, T)."""
    C, S, _ = pred.shape
    cs = np.concatenate([np.zeros((1,) + pred.shape[2:]),
                         np.cumsum(np.asarray(pred, np.float64).sum(0), 0)])
    j = np.arange(S)
    lo = j // 2
    out = np.empty(S)
    for k in range(S):
        out[k] = rmse((cs[k + 1] - cs[lo[k]]) / (C * (k + 1 - lo[k])), r)
    return out


# -- ZV on the test predictions -------------------------------------------------------------------
@jax.jit
def _zv_pairs(P, GU, GV, users, items):
    """Per test pair t: ZV mean of g = P[:, t] with covariates (∇_{U_l} log π, ∇_{V_m} log π)
    over the M pooled draws (β = Var(u)⁻¹Cov(u, g), standardised least squares with a 1e-8
    ridge), Var g and Var(g − uᵀβ)."""
    X = jnp.concatenate([GU[:, users, :], GV[:, items, :]], -1)  # (M, T, 2D)
    Xc = X - X.mean(0)
    gc = P - P.mean(0)
    sd = jnp.sqrt(jnp.mean(Xc**2, 0)) + 1e-30
    Z = Xc / sd
    A = jnp.einsum("mtk,mtl->tkl", Z, Z) / Z.shape[0]
    b = jnp.einsum("mtk,mt->tk", Z, gc) / Z.shape[0]
    A = A + 1e-8 * jnp.eye(A.shape[-1])
    beta = jnp.linalg.solve(A, b[..., None])[..., 0] / sd
    res = gc - jnp.einsum("mtk,tk->mt", Xc, beta)
    zv = P.mean(0) - jnp.einsum("tk,tk->t", X.mean(0), beta)
    return zv, jnp.var(P, 0), jnp.var(res, 0)


def zv_local(P: np.ndarray, grad_U: np.ndarray, grad_V: np.ndarray, users, items,
             chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """ZV-corrected predictions (T,) and variance reductions Var g / Var g̃ (T,), chunked
    over the test pairs; inputs pooled over chains: P (M, T), grad_U (M, L, D)."""
    T = P.shape[1]
    zv, vr = np.empty(T), np.empty(T)
    GU, GV = jnp.asarray(grad_U), jnp.asarray(grad_V)
    for a in range(0, T, chunk):
        b = min(a + chunk, T)
        pad = chunk - (b - a)
        idx = np.concatenate([np.arange(a, b), np.full(pad, b - 1)])
        m, vg, vres = _zv_pairs(jnp.asarray(P[:, idx]), GU, GV, jnp.asarray(users[idx]),
                                jnp.asarray(items[idx]))
        zv[a:b] = np.asarray(m)[: b - a]
        vr[a:b] = (np.asarray(vg) / np.maximum(np.asarray(vres), 1e-30))[: b - a]
    return zv, vr


# -- ALS MAP and the Gibbs reference --------------------------------------------------------------
def _ridge_side(rows, cols, r, other, nrows: int, s: float):
    """Per row: precision Λ = Σ other_c other_cᵀ/σ² + I/s² and b = Σ r other_c/σ²."""
    o = other[cols]
    A = jax.ops.segment_sum(o[:, :, None] * o[:, None, :], rows, nrows) / SIGMA**2
    b = jax.ops.segment_sum(o * r[:, None], rows, nrows) / SIGMA**2
    return A + jnp.eye(other.shape[1]) / s**2, b


def _log_post(U, V, u, v, r, s):
    res = r - jnp.sum(U[u] * V[v], -1)
    return -0.5 * jnp.sum(res**2) / SIGMA**2 - 0.5 * (jnp.sum(U**2) + jnp.sum(V**2)) / s**2


def als_map(dd: dict, seed: int, max_sweeps: int = 200, tol: float = 1e-7) -> dict:
    """MAP by alternating exact ridge solves (module docstring), wall time incl. compile."""
    L, M, D, s = dd["L"], dd["M"], dd["D"], dd["s"]
    u, v, r = jnp.asarray(dd["u_tr"]), jnp.asarray(dd["v_tr"]), jnp.asarray(dd["r_tr"])

    @jax.jit
    def sweep(U, V, u, v, r):
        A, b = _ridge_side(u, v, r, V, L, s)
        U = jnp.linalg.solve(A, b[..., None])[..., 0]
        A, b = _ridge_side(v, u, r, U, M, s)
        V = jnp.linalg.solve(A, b[..., None])[..., 0]
        return U, V, _log_post(U, V, u, v, r, s)

    t0 = time.perf_counter()
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed + 1))
    U, V = 0.1 * jax.random.normal(k1, (L, D)), 0.1 * jax.random.normal(k2, (M, D))
    last, sweeps = -np.inf, 0
    while sweeps < max_sweeps:
        U, V, lp = sweep(U, V, u, v, r)
        sweeps, lp = sweeps + 1, float(lp)
        if abs(lp - last) <= tol * abs(lp):
            break
        last = lp
    wall = time.perf_counter() - t0
    pred = predict(U, V, jnp.asarray(dd["u_te"]), jnp.asarray(dd["v_te"]))
    return {"method": f"MAP by ALS ({sweeps} sweeps)", "wall_s": wall,
            "data_passes": 2.0 * sweeps, "rmse_final": rmse(pred, dd["r_te"]),
            "log_post": lp, "warnings": []}


def gibbs(dd: dict, seed: int, sweeps: int) -> dict:
    """Blocked Gibbs for the fixed-precision BPMF: U_l | V and V_m | U exact Gaussians."""
    from numpyro_subsample.compare import CompileTimer

    L, M, D, s = dd["L"], dd["M"], dd["D"], dd["s"]
    u, v, r = jnp.asarray(dd["u_tr"]), jnp.asarray(dd["v_tr"]), jnp.asarray(dd["r_tr"])
    u_te, v_te = jnp.asarray(dd["u_te"]), jnp.asarray(dd["v_te"])

    def draw(key, A, b):
        C = jnp.linalg.cholesky(A)
        mean = jax.scipy.linalg.cho_solve((C, True), b[..., None])[..., 0]
        z = jax.random.normal(key, b.shape, b.dtype)
        return mean + jax.scipy.linalg.solve_triangular(
            jnp.swapaxes(C, -1, -2), z[..., None], lower=False)[..., 0]

    @jax.jit
    def chain(key, U, V, u, v, r, u_te, v_te):
        def body(carry, k):
            U, V = carry
            ku, kv = jax.random.split(k)
            U = draw(ku, *_ridge_side(u, v, r, V, L, s))
            V = draw(kv, *_ridge_side(v, u, r, U, M, s))
            return (U, V), predict(U, V, u_te, v_te)

        return jax.lax.scan(body, (U, V), jax.random.split(key, sweeps))[1]

    k0, k1, k2 = jax.random.split(jax.random.PRNGKey(seed + 3), 3)
    with CompileTimer() as ct:
        t0 = time.perf_counter()
        U, V = 0.1 * jax.random.normal(k1, (L, D)), 0.1 * jax.random.normal(k2, (M, D))
        P = np.asarray(chain(k0, U, V, u, v, r, u_te, v_te))
        wall = time.perf_counter() - t0
    times = ct.seconds + (wall - ct.seconds) * np.arange(1, sweeps + 1) / sweeps
    curve = window_rmse(P[None], dd["r_te"])
    return {"method": f"exact blocked Gibbs, {sweeps} sweeps (reference)", "wall_s": wall,
            "compile_s": ct.seconds, "data_passes": 2.0 * sweeps, "rmse_final": curve[-1],
            "times": times, "rmse": curve, "passes": 2.0 * np.arange(1, sweeps + 1),
            "warnings": []}
