"""A scalar local latent site integrated out of each datum's term by adaptive Gauss-Hermite
quadrature.

For a continuous latent site with one scalar value z_i per datum inside the subsample plate
(an observation-level random effect, a covariate measured with error) the datum's term of the
marginal posterior of the global θ is

    f_i(θ) = −log ∫ p(z_i | θ) p(x_i | z_i, θ) dz_i = −log ∫ exp(ℓ_i(u)) du,

with ℓ_i(u) = log p(T(u) | θ) + log p(x_i | T(u), θ) + log |T'(u)| in the site's
unconstrained coordinate u (z = T(u), NumPyro's ``biject_to`` of its support). Adaptive
Gauss-Hermite quadrature with K nodes t_k and weights w_k (Liu and Pierce 1994; Pinheiro and
Bates 1995, Sect. 3.2; lme4's ``nAGQ``) centres the rule at the mode û_i of ℓ_i and scales it
by σ̂_i = (−ℓ_i''(û_i))^(−1/2):

    ∫ exp(ℓ_i(u)) du ≈ √2 σ̂_i Σ_k w_k exp(t_k²) exp(ℓ_i(û_i + √2 σ̂_i t_k)),

exact for a Gaussian integrand at any K and with error O(derivatives of order 2K) otherwise.
û_i is found by damped Newton steps from the site's starting value, at the current θ; û_i and
σ̂_i are held fixed in derivatives with respect to θ (the rule integrates exactly the same
function for any centre and scale that cover its mass, so its derivative is that of the
integral). Every kernel and estimator then sees an ordinary per-datum term: no inner draws of
z_i, no table of stale values, and the Laplace proxy, control variates and the bias probe
apply as to any model.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp
from numpyro.distributions import biject_to

from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.terms import LocalSite

__all__ = [
    "DEFAULT_NODES",
    "MAX_SHIFT",
    "QuadratureWarning",
    "NEWTON_STEPS",
    "integrable_site",
    "IntegratedTerms",
    "check_quadrature",
    "integrate_local",
    "quadrature_shift",
]

#: Gauss-Hermite nodes per datum (default of ``LocalConfig.nodes``).
DEFAULT_NODES = 15
#: Damped Newton steps to the mode of each datum's integrand.
NEWTON_STEPS = 12
#: The largest shift of the posterior (in sd) between the K- and (2K + 1)-node rules that
#: :func:`check_quadrature` accepts.
MAX_SHIFT = 0.05
_MAX_NEWTON_MOVE = 3.0  # a Newton step moves u by at most this many current scales (or 1)


class QuadratureWarning(UserWarning):
    """A local site integrated out by quadrature may bias the posterior: the rule with 2K + 1
    nodes moves the gradient by more than :data:`MAX_SHIFT` posterior sd; the message names
    the site, the figure and the remedies (:func:`check_quadrature`)."""


def integrable_site(potential: Any) -> LocalSite | None:
    """The potential's one local site if it has one scalar value per datum (and no enumerated
    sites beside it), else None."""
    local = potential.local
    if len(local) != 1 or local[0].row_shape != () or potential.enumerated_dims:
        return None
    return local[0]


def _mode_and_scale(log_integrand: Callable[[jax.Array], jax.Array], u0: jax.Array,
                    steps: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per row, the mode of ``log_integrand`` (m,) -> (m,) (separable across rows) by damped
    Newton steps from ``u0``, the scale (−ℓ'')^(−1/2) there, and whether the row's integrand
    is flat (its site's log density masked out, e.g. the observed rows of ``obs_mask``)."""
    grad = jax.grad(lambda u: jnp.sum(log_integrand(u)))

    def curvature(u):  # the diagonal of a diagonal Hessian: one forward-over-reverse pass
        return jax.jvp(grad, (u,), (jnp.ones_like(u),))

    def body(u, _):
        g, h = curvature(u)
        neg_h = jnp.maximum(-h, 1e-6)
        move = g / neg_h
        cap = jnp.maximum(1.0, _MAX_NEWTON_MOVE / jnp.sqrt(neg_h))
        move = jnp.clip(jnp.where(jnp.isfinite(move), move, 0.0), -cap, cap)
        return u + move, None

    u, _ = jax.lax.scan(body, u0, None, length=steps)
    g, h = curvature(u)
    scale = 1.0 / jnp.sqrt(jnp.maximum(-h, 1e-6))
    return u, scale, (g == 0) & (h == 0)


@dataclasses.dataclass(frozen=True, eq=False)
class IntegratedTerms:
    """``terms(θ, idx, data) -> (f0, f_i)`` with ``site`` integrated out of each f_i by
    adaptive Gauss-Hermite quadrature with ``nodes`` nodes (module docstring), from the local
    potential's ``local_terms(θ, idx, data, local_rows)``."""

    local_terms: Callable
    site: LocalSite
    nodes: int = DEFAULT_NODES
    newton_steps: int = NEWTON_STEPS

    def __post_init__(self):
        if int(self.nodes) < 1:
            raise ValueError(
                f"LocalConfig(nodes={self.nodes}): the number of Gauss-Hermite nodes must be "
                ">= 1 (or 0 in LocalConfig to draw the local site by MALA instead).")

    def __call__(self, theta: jax.Array, idx: jax.Array,
                 data: ModelData) -> tuple[jax.Array, jax.Array]:
        m = int(idx.shape[0])
        dtype = theta.dtype
        site, terms = self.site, self.local_terms
        transform = biject_to(site.support)
        t_np, w_np = np.polynomial.hermite.hermgauss(int(self.nodes))

        def joint(th, u):  # f0(θ) and ℓ_i(u) per row: −f_i(θ, T(u)) + log|T'(u)|
            z = transform(u)
            f0, fi = terms(th, idx, data, {site.name: z})
            return f0, -fi + transform.log_abs_det_jacobian(u, z)

        frozen = jax.lax.stop_gradient(theta)
        u0 = jnp.broadcast_to(transform.inv(jnp.asarray(site.init, dtype)), (m,))
        u_hat, scale, flat = _mode_and_scale(lambda u: joint(frozen, u)[1], u0,
                                             self.newton_steps)
        u_hat, scale = jax.lax.stop_gradient(u_hat), jax.lax.stop_gradient(scale)
        t = jnp.asarray(t_np, dtype)[:, None]
        log_w = (jnp.log(jnp.asarray(w_np, dtype))[:, None] + t**2
                 + jnp.log(jnp.sqrt(jnp.asarray(2.0, dtype)) * scale)[None])
        u_nodes = u_hat[None] + jnp.sqrt(jnp.asarray(2.0, dtype)) * scale[None] * t
        # the mode first: a flat row's term is its integrand anywhere (its site masked out)
        f0, ell = jax.vmap(lambda u: joint(theta, u))(
            jnp.concatenate([u_hat[None], u_nodes]))  # (1 + K,), (1 + K, m)
        ell = jnp.where(jnp.isnan(ell), -jnp.inf, ell)
        return f0[0], jnp.where(flat, -ell[0], -logsumexp(ell[1:] + log_w, axis=0))


def integrate_local(potential: Any, nodes: int = DEFAULT_NODES) -> Any:
    """The potential of ``potential``'s model with its one scalar local site integrated out
    of each f_i (:class:`IntegratedTerms`): no local sites left, the site listed in
    ``integrated``."""
    site = integrable_site(potential)
    if site is None:
        raise ValueError(
            "integrate_local needs a model with one local latent site of one scalar value per "
            f"datum; got the local sites {list(potential.local_sites)}."
        )
    return dataclasses.replace(potential, terms=IntegratedTerms(potential.terms, site, nodes),
                               local=(), integrated=(site,))


def quadrature_shift(potential: Any, theta: jax.Array, data: ModelData,
                     whiten: Callable[[jax.Array], jax.Array], rows: int = 2000) -> float:
    """How far the potential's K-node rule may move the posterior from one with 2K + 1 nodes,
    in posterior sd: ‖Lᵀ Δ‖ with Δ = (N/m) Σ_{i∈S} (∇f_i^(K) − ∇f_i^(2K+1))(θ) over m ≤ ``rows``
    data S spread evenly over the plate, and ``whiten(g) = Lᵀ g`` for the proxy's Σ̂ = L Lᵀ
    (a mean shift Σ̂Δ is at most ‖Lᵀ Δ‖ sd in every coordinate, by Cauchy-Schwarz)."""
    terms = potential.terms
    finer = dataclasses.replace(terms, nodes=2 * int(terms.nodes) + 1)
    n = potential.num_data
    m = min(int(rows), n)
    idx = jnp.asarray((np.arange(m) * n) // m, jnp.int32)
    delta = _gradient_difference(terms, finer, theta, idx, data) * (n / m)
    return float(jnp.linalg.norm(whiten(delta)))


@partial(jax.jit, static_argnums=(0, 1))
def _gradient_difference(terms, finer, theta, idx, data):
    def total(t, th):
        return jnp.sum(t(th, idx, data)[1])

    return jax.grad(partial(total, terms))(theta) - jax.grad(partial(total, finer))(theta)


def check_quadrature(potential: Any, theta: jax.Array, data: ModelData, label: str,
                     whiten: Callable[[jax.Array], jax.Array], stacklevel: int = 2) -> float:
    """Warn (:class:`QuadratureWarning`) where the potential's K-node rule may move the
    posterior by more than :data:`MAX_SHIFT` sd from one with 2K + 1 nodes
    (:func:`quadrature_shift` at ``theta``); returns that bound."""
    shift = quadrature_shift(potential, theta, data, whiten)
    if not shift <= MAX_SHIFT:
        site, k = potential.integrated[0].name, int(potential.terms.nodes)
        warnings.warn(
            f"{label}: the local site '{site}' is integrated out of each datum's term with {k} "
            f"Gauss-Hermite nodes, and {2 * k + 1} nodes move the gradient by up to "
            f"{shift:.3g} posterior sd at the proxy's centre (> {MAX_SHIFT:g}): its "
            "conditional is far from Gaussian in its unconstrained coordinate, and the "
            f"posterior may be off. Pass local=LocalConfig(nodes={2 * k + 1}) (more nodes), or "
            "LocalConfig(nodes=0) to draw the site by MALA steps instead.",
            QuadratureWarning, stacklevel=stacklevel + 1,
        )
    return shift
