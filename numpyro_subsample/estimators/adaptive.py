"""Adaptive subsample size: ASGLD-CV and ASGLD-CV-PS (paper 000, Sect. 3.3, Algorithm 2).

Under Lipschitz gradients (Assumption 1, ||∇f_i(θ) − ∇f_i(θ')|| ≤ L_i ||θ − θ'||) the
pseudo-variance of the control-variate estimator (Eq. 12; Eq. 5 is p_i = 1/N) is bounded by

    V(g̃) ≤ (1/n) ||θ − θ̂||² Σ_i L_i² / p_i                                   (Eq. 18)

so keeping it below a threshold V0 needs n > ||θ − θ̂||² Σ_i L_i²/p_i / V0 (Eq. 19). At each
step the estimator picks the smallest such n_t, clipped to [n_min, n_max].

Compute really shrinks with n_t: the estimator is compiled for a few *bucketed* sizes (powers
of two from n_min, plus n_max) and ``lax.switch`` runs only the smallest bucket ≥ n_t, so a
step evaluates (about) n_t data terms. The bucket size is what is evaluated, and is what the
estimator reports as ``n_used`` (the kernel's ``subsample_size`` field and data passes). Under
``vmap`` (``chain_method="vectorized"``) ``lax.switch`` with a batched index becomes a select
that runs every bucket: use ``"sequential"`` or ``"parallel"`` chains to get the saving.

Lipschitz constants (:func:`lipschitz_constants`): a user array; or the closed forms of
Appendix C when the plate's observed site is a GLM in θ (checked by tracing the model):
Gaussian linear L_i = ||x_i||²/σ_i², Bernoulli-logit L_i = ||x_i||²/4, Poisson (log link) on the
ball ||θ − θ̂|| ≤ R: L_i = exp(x_iᵀθ̂ + R||x_i||) ||x_i||², where x_i = ∂η_i/∂θ is the gradient of
the linear predictor. Otherwise an *estimate*: the largest spectral norm of ∇²f_i(θ) over θ̂ and
a few draws from N(θ̂, (1.5)² Σ̂) — not a guaranteed bound.

V0: a user value; ``"pilot"`` (default), the recipe of Sect. 5.3.3 automated — a short pilot run
of the fixed-n (n_max) chain, r² = the 95th percentile of ||θ − θ̂||² along it, and
V0 = r² Σ_i L_i²/p_i / n_max (the bound Eq. 18 at that distance) — or ``"proxy"``: the same
with r² from draws of the Laplace proxy N(θ̂, Σ̂) (no data cost).
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, map_data
from numpyro_subsample.sgmcmc.dynamics import sgld_dynamics
from numpyro_subsample.estimators.base import GradientEstimator, control_variate_from_proxy, make_estimator
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.estimators.preferential import (
    PreferentialEstimator,
    alias_design,
    build_alias_table,
    preferential_probabilities,
)
from numpyro_subsample.estimators.selection import uniform_design
from numpyro_subsample.sgmcmc.stepsize import measure_whitened_noise, sgld_step_size

__all__ = [
    "lipschitz_constants",
    "bucket_sizes",
    "adaptive_estimator",
    "pilot_v0",
    "configure_adaptive",
]


# -- Lipschitz constants ------------------------------------------------------------------------
def _unwrap(fn):
    while isinstance(fn, (dist.Independent, dist.ExpandedDistribution)):
        fn = fn.base_dist
    return fn


def _observed_plate_site(potential: Potential, theta, idx):
    """The single observed site of the plate, traced through ``potential.terms`` (the handlers
    inside it do not stop messages, so an outer ``trace`` sees the model's sites)."""
    with handlers.trace() as tr:
        potential.terms(theta, idx)
    sites = [
        s for s in tr.values()
        if s["type"] == "sample" and s["is_observed"]
        and any(f.name == potential.plate.name for f in s.get("cond_indep_stack", []))
    ]
    return sites[0] if len(sites) == 1 else None


def _glm_family(potential: Potential, theta) -> str | None:
    """The GLM family of the plate's observed site, read from an abstract trace (no compute)."""
    m = 2
    found: dict = {}

    def probe(t):
        site = _observed_plate_site(potential, t, jnp.arange(m))
        found["site"] = None if site is None else (_unwrap(site["fn"]), site.get("scale"))
        return jnp.zeros(())

    jax.eval_shape(probe, theta)
    if found["site"] is None:
        return None
    fn, scale = found["site"]
    # the subsample plate itself scales its sites by N/m; any other scale is a user's
    if scale is not None and not np.allclose(np.asarray(scale), potential.num_data / m):
        return None
    if isinstance(fn, dist.Normal):
        return "gaussian"
    if isinstance(fn, dist.BernoulliLogits):
        return "bernoulli-logit"
    if isinstance(fn, dist.Poisson) and not isinstance(fn, dist.ZeroInflatedPoisson):
        return "poisson"
    return None


def _glm_pieces(potential: Potential, family: str):
    """(η(θ, idx) (m, k), 1/σ² (m, k) or None): linear predictor and Gaussian precision."""
    dim = potential.plate.dim

    def per_datum(a, value, m):
        a = jnp.broadcast_to(a, jnp.shape(value))
        a = jnp.moveaxis(a, a.ndim + dim, 0)
        return a.reshape((m, -1))

    def pieces(theta, idx):
        m = idx.shape[0]
        site = _observed_plate_site(potential, theta, idx)
        fn = _unwrap(site["fn"])
        value = site["value"]
        if family == "gaussian":
            return per_datum(fn.loc, value, m), per_datum(fn.scale, value, m) ** -2
        if family == "bernoulli-logit":
            return per_datum(fn.logits, value, m), None
        return per_datum(jnp.log(fn.rate), value, m), None

    return pieces


def _glm_lipschitz(potential, proxy, family, radius, chunk_size):
    pieces = _glm_pieces(potential, family)
    centre = proxy.centre
    d = centre.shape[0]

    def eta(t, i):
        return pieces(t, i[None])[0][0]

    def prec(t, i):
        return pieces(t, i[None])[1][0]

    # linearity of η (and constancy of σ) in θ, checked on the first chunk at two points
    probe = jnp.arange(min(64, potential.num_data))
    shift = proxy.scale_tril @ jnp.linspace(-1.0, 1.0, d).astype(centre.dtype)

    @jax.jit
    def check():
        jac = jax.vmap(lambda i, t: jax.jacrev(eta)(t, i), in_axes=(0, None))
        dprec = (jax.vmap(lambda i: jax.jacrev(prec)(centre, i))(probe)
                 if family == "gaussian" else jnp.zeros(()))
        return jac(probe, centre), jac(probe, centre + shift), dprec

    j0, j1, dprec = check()
    if not np.allclose(np.asarray(j0), np.asarray(j1), rtol=1e-4, atol=1e-6):
        return None
    if not np.allclose(np.asarray(dprec), 0.0):
        return None

    def chunk(idx):
        x = jax.vmap(lambda i: jax.jacrev(eta)(centre, i))(idx)  # (c, k, d)
        sq = jnp.sum(x**2, -1)  # (c, k)
        if family == "gaussian":
            return jnp.sum(sq * jax.vmap(lambda i: prec(centre, i))(idx), -1)
        if family == "bernoulli-logit":
            return 0.25 * jnp.sum(sq, -1)
        e = jax.vmap(lambda i: eta(centre, i))(idx)
        return jnp.sum(jnp.exp(e + radius * jnp.sqrt(sq)) * sq, -1)

    return np.asarray(jax.jit(lambda: map_data(chunk, potential.num_data, chunk_size))(),
                      np.float64)


def _autodiff_lipschitz(potential, proxy, num_points, spread, chunk_size, seed=0):
    d = proxy.centre.shape[0]
    ws = spread * jax.random.normal(jax.random.PRNGKey(seed), (num_points, d), proxy.centre.dtype)
    thetas = jnp.concatenate([proxy.centre[None], proxy.centre + ws @ proxy.scale_tril.T])
    chunk = max(1, min(int(chunk_size), (2**22) // max(1, d * d * thetas.shape[0])))

    def one(i):
        def at(t):
            h = jax.hessian(lambda s: potential.data_terms(s, i[None])[0])(t)
            return jnp.max(jnp.abs(jnp.linalg.eigvalsh(0.5 * (h + h.T))))

        return jnp.max(jax.vmap(at)(thetas))

    return np.asarray(jax.jit(lambda: map_data(jax.vmap(one), potential.num_data, chunk))(),
                      np.float64)


def lipschitz_constants(
    potential: Potential,
    proxy,
    *,
    method: str = "auto",
    radius: float | None = None,
    num_points: int = 8,
    spread: float = 1.5,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[np.ndarray, str]:
    """Per-datum Lipschitz constants L_i of ∇f_i (Assumption 1) and how they were obtained.

    ``method="auto"``: closed forms of Appendix C for a Gaussian-linear (fixed σ), Bernoulli-
    logit or Poisson (log-link) likelihood linear in θ; otherwise the autodiff estimate.
    ``"autodiff"``: max_θ ||∇²f_i(θ)||₂ over θ̂ and ``num_points`` draws from
    N(θ̂, spread² Σ̂) — an estimate, not a bound. ``radius`` (Poisson): R of the ball around θ̂
    on which the bound holds; default 5 sqrt(λ_max(Σ̂)).
    """
    if method not in ("auto", "autodiff"):
        raise ValueError(f"lipschitz must be 'auto', 'autodiff' or an array, got {method!r}.")
    if method == "auto":
        family = _glm_family(potential, proxy.centre)
        if family is not None:
            if radius is None:
                radius = 5.0 * float(np.sqrt(np.linalg.eigvalsh(np.asarray(proxy.cov)).max()))
            L = _glm_lipschitz(potential, proxy, family, float(radius), chunk_size)
            if L is not None:
                return L, f"closed-form:{family}"
    return _autodiff_lipschitz(potential, proxy, num_points, spread, chunk_size), \
        "autodiff-estimate"


# -- buckets and the estimator ------------------------------------------------------------------
def bucket_sizes(n_min: int, n_max: int) -> tuple[int, ...]:
    """Powers of two in [n_min, n_max), then n_max: the compiled subsample sizes."""
    sizes, b = [], 1
    while b < n_min:
        b *= 2
    sizes = [n_min] if n_min < b else []
    while b < n_max:
        sizes.append(b)
        b *= 2
    sizes.append(n_max)
    return tuple(sorted(set(sizes)))


def adaptive_estimator(
    potential: Potential,
    proxy,
    *,
    v0: float,
    sum_l2_over_p: float,
    sizes: tuple[int, ...],
    designs: list,
) -> GradientEstimator:
    """Algorithm 2: n_t = the smallest bucket ≥ ||θ − θ̂||² S / V0 (Eq. 19), S = Σ L_i²/p_i;
    one ``lax.switch`` branch per bucket, each evaluating only its own size."""
    cv = control_variate_from_proxy(proxy)
    branches = [make_estimator(potential, des, cv).estimate for des in designs]
    sizes_arr = jnp.asarray(sizes, jnp.int32)
    centre = proxy.centre
    scale = float(sum_l2_over_p) / float(v0)

    def required(theta):
        return jnp.sum((theta - centre) ** 2) * scale

    def estimate(key, theta):
        need = required(theta)
        k = jnp.clip(jnp.sum(sizes_arr.astype(need.dtype) < need), 0, len(sizes) - 1)
        g = jax.lax.switch(k, [lambda kk, t, b=b: b(kk, t)[0] for b in branches], key, theta)
        return g, sizes_arr[k]

    return GradientEstimator(estimate, designs[-1], cv)


def pilot_v0(
    fixed_estimator: GradientEstimator,
    proxy,
    sum_l2_over_p: float,
    n_fixed: int,
    rng_key: jax.Array,
    *,
    num_chains: int = 4,
    num_steps: int = 200,
    quantile: float = 0.95,
    max_variance_inflation: float = 0.05,
) -> tuple[float, dict]:
    """V0 by the recipe of paper 000 Sect. 5.3.3, automated.

    Runs ``num_chains`` short SGLD chains (started at proxy draws, whitened coordinates, step
    from the measured noise as the kernel does) with the fixed-n estimator, takes the
    ``quantile`` of ||θ − θ̂||² over the chains' draws and returns the bound Eq. 18 there:
    V0 = r² S / n_fixed. Costs num_chains · num_steps · n_fixed / N data passes.
    """
    centre, tril = proxy.centre, proxy.scale_tril
    d = centre.shape[0]
    k_noise, k_init, k_run = jax.random.split(rng_key, 3)
    noise, _ = measure_whitened_noise(fixed_estimator, centre, tril, k_noise)
    eps = sgld_step_size(noise, max_variance_inflation)
    dyn = sgld_dynamics()

    def chain(w0, key):
        def step(carry, k):
            w, grad = carry
            k_dyn, k_est = jax.random.split(k)
            w, _, _ = dyn.step(k_dyn, w, jnp.zeros((0,)), jnp.zeros(()), tril.T @ grad, eps)
            theta = centre + tril @ w
            g, _ = fixed_estimator.estimate(k_est, theta)
            return (w, -g), jnp.sum((theta - centre) ** 2)

        k0, ks = jax.random.split(key)
        g0, _ = fixed_estimator.estimate(k0, centre + tril @ w0)
        return jax.lax.scan(step, (w0, -g0), jax.random.split(ks, num_steps))[1]

    w0 = jax.random.normal(k_init, (num_chains, d), centre.dtype)
    dist2 = jax.jit(jax.vmap(chain))(w0, jax.random.split(k_run, num_chains))
    dist2 = np.asarray(dist2, np.float64)
    if not np.all(np.isfinite(dist2)):
        raise ValueError("The V0 pilot chain diverged; pass v0=<number> or v0='proxy'.")
    r2 = float(np.quantile(dist2, quantile))
    v0 = r2 * sum_l2_over_p / n_fixed
    passes = num_chains * (num_steps + 1) * n_fixed / fixed_estimator.design.num_data
    return v0, {"pilot_step_size": eps, "pilot_r2": r2, "pilot_data_passes": passes}


def configure_adaptive(
    name: str,
    potential: Potential,
    proxy,
    n: int,
    replace: bool = True,
    *,
    v0: float | str = "pilot",
    lipschitz: Any = "auto",
    lipschitz_radius: float | None = None,
    n_min: int | None = None,
    n_max: int | None = None,
    weights: Any = "approx",
    uniform_mix: float | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    pilot_chains: int = 4,
    pilot_steps: int = 200,
    pilot_quantile: float = 0.95,
    max_variance_inflation: float = 0.05,
    seed: int = 0,
    adaptive: bool = True,
) -> GradientEstimator:
    """ASGLD-CV (``name="cv"``) or ASGLD-CV-PS (``"cv-preferential"``), paper 000 Algorithm 2.

    :param v0: the pseudo-variance threshold V0 > 0, ``"pilot"`` (default) or ``"proxy"``
        (module docstring).
    :param lipschitz: array of N constants L_i, ``"auto"`` (closed forms of Appendix C when the
        likelihood is a recognised GLM, else the autodiff estimate) or ``"autodiff"``.
    :param n_min: smallest subsample size (default max(1, n_max // 64)).
    :param n_max: largest subsample size (default the plate's ``subsample_size``).
    :param weights, uniform_mix: selection law of ``"cv-preferential"``
        (:func:`~numpyro_subsample.preferential.configure_preferential`).
    :param pilot_chains, pilot_steps, pilot_quantile: the V0 pilot run.
    :param max_variance_inflation: δ of the pilot chain's step size (as the kernel's default).
    """
    t0 = time.perf_counter()
    if name not in ("cv", "cv-preferential"):
        raise ValueError(
            f"adaptive=True needs a control variate (paper 000 Eq. 18-19); estimator={name!r} "
            "has none. Use estimator='cv' or 'cv-preferential'."
        )
    if proxy is None:
        raise ValueError("adaptive=True needs a proxy (its centre θ̂ and ∇f_i(θ̂)).")
    N = potential.num_data
    dtype = potential.init_theta.dtype
    n_max = int(n_max or n)
    if not 1 <= n_max <= N:
        raise ValueError(f"n_max must be in [1, N={N}], got {n_max}.")
    n_min = int(n_min or max(1, n_max // 64))
    if not 1 <= n_min <= n_max:
        raise ValueError(f"n_min must be in [1, n_max={n_max}], got {n_min}.")
    info: dict = {"data_passes": 0.0}
    if name == "cv-preferential":
        if not replace:
            raise ValueError(
                "estimator='cv-preferential' draws with replacement; pass replace=True."
            )
        p, pinfo = preferential_probabilities(
            name, potential, proxy, weights=weights, uniform_mix=uniform_mix,
            chunk_size=chunk_size,
        )
        info.update(pinfo)
        table = build_alias_table(p)
        probs = np.asarray(table.probs, np.float64)
        info["probs"] = table.probs

        def design(b):
            return alias_design(table, b, dtype)
    else:
        if not (isinstance(weights, str) and weights == "approx") or uniform_mix is not None:
            raise ValueError("weights/uniform_mix apply to estimator='cv-preferential' only.")
        probs = np.full(N, 1.0 / N)
        info["probs"] = None

        def design(b):
            return uniform_design(N, b, replace, dtype)

    if isinstance(lipschitz, str):
        L, kind = lipschitz_constants(
            potential, proxy, method=lipschitz, radius=lipschitz_radius, chunk_size=chunk_size
        )
        info["data_passes"] += 1.0 if kind.startswith("closed") else 9.0  # θ̂ + 8 points
    else:
        L = np.asarray(lipschitz, np.float64)
        if L.shape != (N,) or not np.all(np.isfinite(L)) or np.any(L < 0):
            raise ValueError(
                f"lipschitz must be 'auto', 'autodiff' or N={N} finite non-negative constants; "
                f"got shape {L.shape}."
            )
        kind = "user"
    S = float(np.sum(L**2 / probs))
    if not (np.isfinite(S) and S > 0):
        raise ValueError("Σ L_i²/p_i is zero or not finite; check the Lipschitz constants.")

    sizes = bucket_sizes(n_min, n_max)
    designs = [design(b) for b in sizes]
    if isinstance(v0, str):
        if v0 == "pilot":
            fixed = make_estimator(potential, designs[-1], control_variate_from_proxy(proxy))
            v0_value, pinfo = pilot_v0(
                fixed, proxy, S, n_max, jax.random.PRNGKey(seed), num_chains=pilot_chains,
                num_steps=pilot_steps, quantile=pilot_quantile,
                max_variance_inflation=max_variance_inflation,
            )
            info.update(pinfo)
            info["data_passes"] += pinfo["pilot_data_passes"]
        elif v0 == "proxy":
            d = proxy.centre.shape[0]
            w = jax.random.normal(jax.random.PRNGKey(seed), (4096, d), proxy.centre.dtype)
            r2 = float(np.quantile(np.sum(np.asarray(w @ proxy.scale_tril.T) ** 2, -1),
                                   pilot_quantile))
            v0_value = r2 * S / n_max
            info["proxy_r2"] = r2
        else:
            raise ValueError(f"v0 must be a positive number, 'pilot' or 'proxy'; got {v0!r}.")
    else:
        v0_value = float(v0)
        if not (math.isfinite(v0_value) and v0_value > 0):
            raise ValueError(f"v0 must be a positive number, got {v0}.")
    est = adaptive_estimator(
        potential, proxy, v0=v0_value, sum_l2_over_p=S, sizes=sizes, designs=designs
    )
    info.update({
        "adaptive": True, "v0": v0_value, "sum_l2_over_p": S, "lipschitz": kind,
        "lipschitz_constants": L, "bucket_sizes": sizes, "n_min": n_min, "n_max": n_max,
        "seconds": time.perf_counter() - t0,
    })
    out = PreferentialEstimator(*est)
    out.info = info
    return out
