"""Local latent variables: per-datum latent sites drawn for the rows of each subsample.

A model with continuous latent sites z_i inside the subsample plate (a document's topic
proportions, a group's random intercept) has per-datum terms f_i(θ, z_i) = −log p(z_i | θ)
− log p(x_i | z_i, θ) (:class:`~numpyro_subsample.core.potential.LocalSite`). By Fisher's
identity the marginal gradient is ∇_θ log p(x_i | θ) = E[∇_θ log p(x_i, z_i | θ) | x_i, θ], so
each step

1. draws the subsample (i_1, w_1), ..., (i_n, w_n) of a design,
2. moves z_{i_j} by a transition that leaves p(z_i | x_i, θ) invariant, given the current θ
   (a user's exact conditional, as the Gibbs step of NumPyro's ``HMCGibbs``, or MALA steps in
   the site's unconstrained space, Roberts and Tweedie 1996),
3. returns g = ∇f0(θ) + Σ_j w_j ∇_θ f_{i_j}(θ, z_{i_j}),

as SGRLD for LDA draws each minibatch document's topic assignments by Gibbs given the topics
before its gradient step (Patterson and Teh 2013, Sect. 4-5), and as SGLD-CV's LDA experiment
(Baker et al. 2019, Sect. 5.3). The gradient is that of the joint of (θ, z_S); it is unbiased
for the marginal gradient when the z_i are draws of their conditionals, which the transition
approaches from its warm start: the table of the last value of every datum's z_i (memory
N × size of one z_i, as one more data column) is the estimator's state. Draws of z are not
returned (only θ is).

MALA uses one step size per datum, adapted towards an acceptance rate of 0.574 by
Robbins-Monro steps whose gain decays as (1 + visits)^(−0.6) (diminishing adaptation, Roberts
and Rosenthal 2007), so that a step adapted where the datum's conditional used to be recovers
when θ has moved.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from numpyro.distributions import biject_to

from numpyro_subsample.core.potential import LocalSite, ModelData, Potential
from numpyro_subsample.core.quadrature import DEFAULT_NODES
from numpyro_subsample.core.rng import raw_key
from numpyro_subsample.estimators.base import GradientEstimator
from numpyro_subsample.estimators.selection import SamplingDesign

__all__ = [
    "DEFAULT_LOCAL_STEPS",
    "LocalCVParams",
    "LocalConfig",
    "LocalState",
    "init_local_state",
    "local_estimator",
    "mala_rows",
    "update_rows",
]

#: MALA steps per subsample update of the local sites (default of ``LocalConfig.steps``).
DEFAULT_LOCAL_STEPS = 5
_TARGET_ACCEPT = 0.574  # Roberts and Rosenthal (1998)


_ADAPT_GAIN = 0.5


class LocalState(NamedTuple):
    """The local sites' warm starts (closed state of one chain).

    ``values``: the last constrained value of every datum's local sites, {site: (N, *row)};
    ``log_step``: the log MALA step of every datum, (N,); ``visits``: the updates of every
    datum so far, (N,); ``accept``: the mean MALA acceptance rate of the last update (1 with a
    user's conditional).
    """

    values: dict
    log_step: jax.Array
    visits: jax.Array
    accept: jax.Array


class LocalConfig(NamedTuple):
    """How the local latent sites of a subsample are drawn before its gradient (the kernels'
    ``local=``; hashable, a static configuration).

    Parameters
    ----------
    steps
        MALA steps per update (default 5), when ``update`` is None.
    update
        A user's exact conditional
        ``update(rng_key, rows, values, idx, *model_args, **model_kwargs) -> rows``
        (``rng_key``: a legacy uint32[2] ``PRNGKey``, which every NumPyro distribution
        samples with; ``rows``: the constrained local values of the subsample,
        ``{site: (m, *row)}``; ``values``: the constrained global sites and deterministic
        sites outside the plate), or None for MALA.
    init_step
        The first MALA step (adapted per datum afterwards).
    nodes
        Gauss-Hermite nodes (default 15) with which SGLD, SGHMC and SGNHT integrate a local
        site of one scalar value per datum (the model's only one) out of each datum's term
        (:mod:`~numpyro_subsample.core.quadrature`), instead of drawing it; 0 draws it as
        other local sites. Not used with ``update``.

    References
    ----------
    Roberts and Tweedie (1996) (MALA); Roberts and Rosenthal (2007) (diminishing
    adaptation of the step); Patterson and Teh (2013), Sect. 4-5 (local variables drawn for
    each minibatch in SG-MCMC); Pinheiro and Bates (1995), Sect. 3.2 (adaptive Gauss-Hermite
    quadrature).
    """

    steps: int = DEFAULT_LOCAL_STEPS
    update: Callable | None = None
    init_step: float = 0.1
    nodes: int = DEFAULT_NODES


def init_local_state(local: tuple[LocalSite, ...], num_data: int, dtype: Any,
                     init_step: float) -> LocalState:
    """Every datum at its site's starting value (:attr:`LocalSite.init`)."""
    values = {s.name: jnp.broadcast_to(jnp.asarray(s.init, dtype), (num_data, *s.row_shape))
              for s in local}
    return LocalState(
        values=values, log_step=jnp.full((num_data,), jnp.log(init_step), dtype),
        visits=jnp.zeros((num_data,), jnp.int32), accept=jnp.ones((), dtype),
    )


def _rows_sum(x: jax.Array, m: int) -> jax.Array:
    return jnp.reshape(x, (m, -1)).sum(-1)


def mala_rows(
    key: jax.Array,
    log_density: Callable[[dict], jax.Array],
    local: tuple[LocalSite, ...],
    rows: dict,
    log_step: jax.Array,
    gain: jax.Array,
    steps: int,
) -> tuple[dict, jax.Array, jax.Array]:
    """MALA on m independent rows in each site's unconstrained space.

    ``log_density(rows) -> (m,)`` is the log density of each row's constrained values (the
    rows are independent given the globals, so one gradient of the sum gives every row's
    gradient and each row has its own accept step). Returns the new rows, the log steps
    (moved towards acceptance 0.574 by ``gain`` (m,) per step) and the mean acceptance rate.
    """
    m = log_step.shape[0]
    transforms = {s.name: biject_to(s.support) for s in local}

    def constrained(u):
        return {k: transforms[k](v) for k, v in u.items()}

    def logp(u):
        z = constrained(u)
        lp = log_density(z)
        for k, t in transforms.items():
            lp = lp + _rows_sum(t.log_abs_det_jacobian(u[k], z[k]), m)
        return lp

    def val_grad(u):
        lp, vjp = jax.vjp(logp, u)
        return lp, vjp(jnp.ones_like(lp))[0]

    def bcast(a, v):
        return jnp.reshape(a, (m,) + (1,) * (v.ndim - 1))

    def log_q(to, frm, g_frm, eps):  # log N(to | frm + eps²/2 g, eps² I) up to a constant
        return sum(
            -_rows_sum((to[k] - frm[k] - 0.5 * bcast(eps**2, frm[k]) * g_frm[k]) ** 2, m)
            / (2 * eps**2)
            for k in frm
        )

    u0 = {k: transforms[k].inv(v) for k, v in rows.items()}
    lp0, g0 = val_grad(u0)

    def body(carry, key):
        u, lp, g, log_eps = carry
        eps = jnp.exp(log_eps)
        k_xi, k_acc = jax.random.split(key)
        ks = jax.random.split(k_xi, len(u))
        prop = {
            name: u[name] + 0.5 * bcast(eps**2, u[name]) * g[name]
            + bcast(eps, u[name]) * jax.random.normal(kk, u[name].shape, u[name].dtype)
            for kk, name in zip(ks, sorted(u), strict=True)
        }
        lp1, g1 = val_grad(prop)
        log_a = lp1 - lp + log_q(u, prop, g1, eps) - log_q(prop, u, g, eps)
        log_a = jnp.where(jnp.isfinite(log_a), log_a, -jnp.inf)
        a = jnp.exp(jnp.minimum(log_a, 0.0))
        take = jax.random.uniform(k_acc, (m,), a.dtype) < a
        sel = lambda new, old: jnp.where(bcast(take, old), new, old)  # noqa: E731
        u = {k: sel(prop[k], u[k]) for k in u}
        g = {k: sel(g1[k], g[k]) for k in g}
        lp = jnp.where(take, lp1, lp)
        log_eps = log_eps + gain * (a - _TARGET_ACCEPT)
        return (u, lp, g, log_eps), jnp.mean(a)

    (u, _, _, log_step), acc = jax.lax.scan(
        body, (u0, lp0, g0, log_step), jax.random.split(key, steps)
    )
    return constrained(u), log_step, jnp.mean(acc)


def update_rows(
    cfg: LocalConfig,
    local: tuple[LocalSite, ...],
    key: jax.Array,
    state: LocalState,
    idx: jax.Array,
    log_density: Callable[[dict], jax.Array],
    values: Callable[[], dict],
    data: ModelData,
) -> tuple[dict, LocalState]:
    """Move the local sites of the rows ``idx`` given the globals; return their new values and
    the state with them written back (``values()`` gives the constrained globals a user's
    conditional receives)."""
    rows = {k: v[idx] for k, v in state.values.items()}
    log_step = state.log_step[idx]
    if cfg.update is None:
        gain = _ADAPT_GAIN / (1.0 + state.visits[idx].astype(log_step.dtype)) ** 0.6
        rows, log_step, acc = mala_rows(key, log_density, local, rows, log_step, gain,
                                        cfg.steps)
    else:
        args, kwargs = data.args_kwargs()
        new = cfg.update(raw_key(key), rows, values(), idx, *args, **kwargs)
        if not isinstance(new, dict) or set(new) != set(rows):
            raise ValueError(
                f"LocalConfig.update must return a dict of the local sites {sorted(rows)} (their "
                f"constrained values for the rows), got {type(new).__name__}"
                f"{'' if not isinstance(new, dict) else ' with keys ' + str(sorted(new))}."
            )
        for k, v in new.items():
            if jnp.shape(v) != rows[k].shape:
                raise ValueError(
                    f"LocalConfig.update returned shape {jnp.shape(v)} for site '{k}'; expected "
                    f"{rows[k].shape} (one value per row of the subsample)."
                )
        rows = {k: jnp.asarray(v, rows[k].dtype) for k, v in new.items()}
        acc = jnp.ones((), state.accept.dtype)
    new_state = LocalState(
        values={k: state.values[k].at[idx].set(rows[k]) for k in rows},
        log_step=state.log_step.at[idx].set(log_step),
        visits=state.visits.at[idx].add(1),
        accept=acc.astype(state.accept.dtype),
    )
    return rows, new_state


class LocalCVParams(NamedTuple):
    """The arrays of the control-variate estimator with local sites: the design's arrays,
    ``table`` (N, d) of ḡ_i(θ̂) = E[∇_θ f_i(θ̂, z_i) | x_i, θ̂], its sum ``total`` (d,), and
    ``start``, the local sites' state every chain starts from (drawn at θ̂, so that the
    residuals are small from the first step)."""

    design: Any
    table: jax.Array
    total: jax.Array
    start: LocalState


@lru_cache(maxsize=64)
def _programs(potential: Potential, draw: Callable, size: int, cfg: LocalConfig,
              cv: bool = False):
    local = potential.local

    def init_state(params, data):
        if cv:
            return params.start, jnp.zeros((), potential.init_theta.dtype)
        state = init_local_state(local, potential.num_data, potential.init_theta.dtype,
                                 cfg.init_step)
        return state, jnp.zeros((), potential.init_theta.dtype)

    def update(params, state, key, theta, data):
        k_idx, k_loc = jax.random.split(key)
        idx, w = draw(params.design if cv else params, k_idx)

        def log_density(rows):
            return -potential.terms(theta, idx, data, rows)[1]

        def values():
            return potential.constrain(potential.unravel(theta), data)

        rows, state = update_rows(cfg, local, k_loc, state, idx, log_density, values, data)
        w = w.astype(theta.dtype)

        def weighted(t):
            f0, fi = potential.terms(t, idx, data, rows)
            return f0 + jnp.dot(w, fi)

        g = jax.grad(weighted)(theta)
        if cv:
            g = g - w @ params.table[idx] + params.total
        return g, jnp.asarray(size), state, jnp.zeros((), theta.dtype)

    def estimate(params, key, theta, data):
        state, _ = init_state(params, data)
        g, n, _, _ = update(params, state, key, theta, data)
        return g, n

    return estimate, init_state, update


def local_estimator(potential: Potential, design: SamplingDesign, cfg: LocalConfig,
                    control_variate: tuple[jax.Array, jax.Array] | None = None,
                    start: LocalState | None = None) -> GradientEstimator:
    """The gradient estimator of a model with local sites over ``design`` (module docstring):
    a stateful :class:`~numpyro_subsample.estimators.base.GradientEstimator` whose state is
    the :class:`LocalState` of each chain. With ``control_variate`` = (table, total) of
    :func:`~numpyro_subsample.estimators.local_start.local_control_variate`, the estimate
    is Σ_i ḡ_i(θ̂) + Σ_j w_j [∇_θ f_{i_j}(θ, z_{i_j}) − ḡ_{i_j}(θ̂)] (Baker et al. 2019,
    Eq. 4, with the marginal ∇f_i(θ̂) replaced by its Fisher-identity expectation ḡ_i(θ̂)):
    unbiased, and its noise is the local draws'
    own plus the residuals' (small near θ̂), not the spread of ḡ_i over the data. Its
    chains' local sites start from ``start`` (default: every datum at its starting value)."""
    if not potential.local:
        raise ValueError("local_estimator needs a model with local latent sites.")
    cv = control_variate is not None
    estimate, init_state, update = _programs(potential, design.draw, design.size, cfg, cv)
    if cv and start is None:
        start = init_local_state(potential.local, potential.num_data,
                                 potential.init_theta.dtype, cfg.init_step)
    params = design.params
    if cv:
        table, total = control_variate
        params = LocalCVParams(design=design.params, table=table, total=total, start=start)
    return GradientEstimator(
        estimate=estimate, params=params, name="local-cv" if cv else "local",
        subsample_size=design.size, num_data=design.num_data,
        info={"local_sites": potential.local_sites, "local_steps": cfg.steps,
              "local_update": "mala" if cfg.update is None else "user"},
        init_state=init_state, update=update, state_axes=0,
    )
