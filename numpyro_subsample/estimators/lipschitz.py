"""Per-datum Lipschitz constants L_i of ∇f_i (Putcha, Nemeth and Fearnhead 2023, Assumption 1),
for the adaptive subsample size (:mod:`numpyro_subsample.estimators.adaptive`).

Closed forms of Appendix C when the plate's observed site is a GLM in θ (checked by tracing the
model): Gaussian linear L_i = ||x_i||²/σ_i², Bernoulli-logit L_i = ||x_i||²/4, Poisson (log
link) on the ball ||θ − θ̂|| ≤ R: L_i = exp(x_iᵀθ̂ + R||x_i||) ||x_i||², where x_i = ∂η_i/∂θ is
the gradient of the linear predictor. Otherwise an *estimate*: the largest spectral norm of
∇²f_i(θ) over θ̂ and a few draws from N(θ̂, (1.5)² Σ̂), not a guaranteed bound.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, map_data
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.proxies.whitening import (
    cov_norm_bound,
    is_structured,
    proxy_scale,
    whiten_matvec,
)

__all__ = ["lipschitz_constants", "glm_family"]


def _unwrap(fn):
    while isinstance(fn, (dist.Independent, dist.ExpandedDistribution)):
        fn = fn.base_dist
    return fn


def _observed_plate_site(potential: Potential, theta, idx, data: ModelData):
    """The single observed site of the plate, traced through ``potential.terms`` (its handlers
    do not stop messages, so an outer ``trace`` sees the model's sites). None when the model
    has enumerated sites (its likelihood is then a mixture, not a GLM)."""
    if potential.enumerated_sites:
        return None
    with handlers.trace() as tr:
        potential.terms(theta, idx, data)
    sites = [
        s for s in tr.values()
        if s["type"] == "sample" and s["is_observed"]
        and any(f.name == potential.plate.name for f in s.get("cond_indep_stack", []))
    ]
    return sites[0] if len(sites) == 1 else None


def glm_family(potential: Potential, theta: jax.Array, data: ModelData) -> str | None:
    """The GLM family of the plate's observed site, read from an abstract trace (no compute):
    ``"gaussian"``, ``"bernoulli-logit"``, ``"poisson"`` or None."""
    m = 2
    found: dict = {}

    def probe(t, data):
        site = _observed_plate_site(potential, t, jnp.arange(m), data)
        found["site"] = None if site is None else (_unwrap(site["fn"]), site.get("scale"))
        return jnp.zeros(())

    jax.eval_shape(probe, theta, data)
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


def _glm_pieces(potential: Potential, family: str, theta, idx, data):
    """(η(θ, idx) (m, k), 1/σ² (m, k) or None): linear predictor and Gaussian precision."""
    dim = potential.plate.dim
    m = idx.shape[0]
    site = _observed_plate_site(potential, theta, idx, data)
    fn, value = _unwrap(site["fn"]), site["value"]

    def per_datum(a):
        a = jnp.broadcast_to(a, jnp.shape(value))
        return jnp.moveaxis(a, a.ndim + dim, 0).reshape((m, -1))

    if family == "gaussian":
        return per_datum(fn.loc), per_datum(fn.scale) ** -2
    if family == "bernoulli-logit":
        return per_datum(fn.logits), None
    return per_datum(jnp.log(fn.rate)), None


def _eta(potential, family, t, i, data):
    return _glm_pieces(potential, family, t, i[None], data)[0][0]


def _prec(potential, family, t, i, data):
    return _glm_pieces(potential, family, t, i[None], data)[1][0]


@partial(jax.jit, static_argnames=("potential", "family", "num_probe"))
def _glm_jacobians(potential, family, centre, shift, data, num_probe):
    """Jacobians of η at θ̂ and θ̂ + shift, and of 1/σ² at θ̂, on the first data."""
    probe = jnp.arange(num_probe)
    eta = partial(_eta, potential, family)
    jac = jax.vmap(lambda i, t: jax.jacrev(eta)(t, i, data), in_axes=(0, None))
    if family == "gaussian":
        prec = partial(_prec, potential, family)
        dprec = jax.vmap(lambda i: jax.jacrev(prec)(centre, i, data))(probe)
    else:
        dprec = jnp.zeros(())
    return jac(probe, centre), jac(probe, centre + shift), dprec


@partial(jax.jit, static_argnames=("potential", "family", "chunk_size"))
def _glm_constants(potential, family, centre, radius, data, chunk_size):
    eta = partial(_eta, potential, family)

    def chunk(idx):
        x = jax.vmap(lambda i: jax.jacrev(eta)(centre, i, data))(idx)  # (c, k, d)
        sq = jnp.sum(x**2, -1)  # (c, k)
        if family == "gaussian":
            prec = jax.vmap(lambda i: _prec(potential, family, centre, i, data))(idx)
            return jnp.sum(sq * prec, -1)
        if family == "bernoulli-logit":
            return 0.25 * jnp.sum(sq, -1)
        e = jax.vmap(lambda i: eta(centre, i, data))(idx)
        return jnp.sum(jnp.exp(e + radius * jnp.sqrt(sq)) * sq, -1)

    return map_data(chunk, potential.num_data, chunk_size)


def _glm_lipschitz(potential, data, proxy, family, radius, chunk_size) -> np.ndarray | None:
    centre = proxy.centre
    d = centre.shape[0]
    # linearity of η (and constancy of σ) in θ, checked on the first data at two points
    shift = whiten_matvec(proxy_scale(proxy), jnp.linspace(-1.0, 1.0, d).astype(centre.dtype))
    j0, j1, dprec = _glm_jacobians(
        potential, family, centre, shift, data, min(64, potential.num_data)
    )
    if not np.allclose(np.asarray(j0), np.asarray(j1), rtol=1e-4, atol=1e-6):
        return None
    if not np.allclose(np.asarray(dprec), 0.0):
        return None
    out = _glm_constants(potential, family, centre, jnp.asarray(radius, centre.dtype), data,
                         int(chunk_size))
    return np.asarray(out, np.float64)


@partial(jax.jit, static_argnames=("potential", "chunk_size"))
def _hessian_norm_max(potential, thetas, data, chunk_size):
    def one(i):
        def at(t):
            h = jax.hessian(lambda s: potential.data_terms(s, i[None], data)[0])(t)
            return jnp.max(jnp.abs(jnp.linalg.eigvalsh(0.5 * (h + h.T))))

        return jnp.max(jax.vmap(at)(thetas))

    return map_data(jax.vmap(one), potential.num_data, chunk_size)


def lipschitz_constants(
    potential: Potential,
    data: ModelData,
    proxy,
    *,
    method: str = "auto",
    radius: float | None = None,
    num_points: int = 8,
    spread: float = 1.5,
    chunk_size: int = DEFAULT_CHUNK,
    seed: int = 0,
) -> tuple[np.ndarray, str]:
    """Per-datum Lipschitz constants L_i of ∇f_i and how they were obtained.

    ``method="auto"``: the closed forms of Appendix C for a Gaussian-linear (fixed σ),
    Bernoulli-logit or Poisson (log-link) likelihood linear in θ (one data pass); otherwise
    the autodiff estimate. ``"autodiff"``: max_θ ||∇²f_i(θ)||₂ over θ̂ and ``num_points``
    draws from N(θ̂, spread² Σ̂) (``seed``), an estimate, not a bound. ``radius`` (Poisson): R
    of the ball around θ̂ on which the bound holds; default 5 sqrt(λ_max(Σ̂)) (with a
    structured proxy, an upper bound of λ_max(Σ̂),
    :func:`~numpyro_subsample.proxies.whitening.cov_norm_bound`). The autodiff estimate forms
    per-datum d × d Hessians and is refused with a structured proxy (``ValueError``).
    """
    if method not in ("auto", "autodiff"):
        raise ValueError(f"lipschitz must be 'auto', 'autodiff' or an array, got {method!r}.")
    if method == "auto":
        family = glm_family(potential, proxy.centre, data)
        if family is not None:
            if radius is None and is_structured(proxy):
                radius = 5.0 * float(np.sqrt(cov_norm_bound(proxy.cov_op)))
            elif radius is None:
                radius = 5.0 * float(np.sqrt(np.linalg.eigvalsh(np.asarray(proxy.cov)).max()))
            L = _glm_lipschitz(potential, data, proxy, family, float(radius), chunk_size)
            if L is not None:
                return L, f"closed-form:{family}"
    if is_structured(proxy):
        raise ValueError(
            "The Lipschitz constants of this model need the autodiff estimate (per-datum d × d "
            f"Hessians; lipschitz={method!r}), which is not supported with a structured proxy "
            "yet; pass lipschitz=<N constants> or a dense proxy (proxy='laplace' below "
            "MAX_DENSE_DIM)."
        )
    centre = proxy.centre
    d = centre.shape[0]
    ws = spread * jax.random.normal(jax.random.PRNGKey(seed), (num_points, d), centre.dtype)
    thetas = jnp.concatenate([centre[None], centre + whiten_matvec(proxy.scale_tril, ws)])
    chunk = max(1, min(int(chunk_size), (2**22) // max(1, d * d * thetas.shape[0])))
    L = _hessian_norm_max(potential, thetas, data, chunk)
    return np.asarray(L, np.float64), "autodiff-estimate"
