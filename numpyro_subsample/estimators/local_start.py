"""The start and the control variate of a model with local latent sites, made once per data
set (:mod:`~numpyro_subsample.estimators.local` for the estimator itself).

- :func:`local_pilot`: a stochastic-approximation search of the marginal posterior mode with
  the Fisher-identity gradient, the chains' start;
- :func:`local_control_variate`: the table of ḡ_i(θ̂) = E[∇_θ f_i(θ̂, z_i) | x_i, θ̂] of the
  control-variate estimator (Baker et al. 2019, Eq. 4, with the marginal gradient of a datum
  replaced by its Fisher-identity expectation);
- :func:`local_estimator_choice`: the default estimator (control variates unless the N × d
  table is too large).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.estimators.base import GradientEstimator
from numpyro_subsample.estimators.local import LocalConfig, LocalState, update_rows

__all__ = [
    "CV_SWEEPS",
    "WARM_SWEEPS",
    "MAX_LOCAL_CV_NUMBERS",
    "MIN_PILOT_STEPS",
    "PILOT_VISITS",
    "local_control_variate",
    "local_estimator_choice",
    "local_pilot",
    "local_warm_start",
    "pilot_steps",
]

#: Visits per datum (N/n steps each) of the pilot of :func:`local_pilot`, and its fewest steps.
PILOT_VISITS, MIN_PILOT_STEPS = 10, 500

#: Above this many numbers N · d the default estimator of a model with local sites is
#: ``"uniform"``, below it ``"cv"``, whose table of ḡ_i(θ̂) holds N · d numbers.
MAX_LOCAL_CV_NUMBERS = 2**24


def local_estimator_choice(potential: Potential) -> str:
    """The default estimator of a model with local sites: ``"cv"`` while its N × d table
    stays below :data:`MAX_LOCAL_CV_NUMBERS` numbers, else ``"uniform"``."""
    return "cv" if potential.num_data * potential.dim <= MAX_LOCAL_CV_NUMBERS else "uniform"


def pilot_steps(num_data: int, subsample_size: int) -> int:
    """The steps of :func:`local_pilot`: ``PILOT_VISITS`` visits per datum, at least
    ``MIN_PILOT_STEPS``."""
    return max(MIN_PILOT_STEPS, -(-PILOT_VISITS * int(num_data) // int(subsample_size)))


def local_pilot(estimator: GradientEstimator, theta0: jax.Array, rng_key: jax.Array,
                data: ModelData, num_steps: int, learning_rate: float = 0.1,
                state: LocalState | None = None) -> tuple[jax.Array, LocalState, jax.Array]:
    """A start for the chains of a model with local sites: stochastic-approximation search
    of the marginal posterior mode (Robbins and Monro 1951; the gradient of
    :func:`local_estimator`, its local sites drawn by their inner update, is the Fisher
    identity's, unbiased for the marginal gradient once they follow their conditionals),
    ``num_steps`` Adam steps (Kingma and Ba 2015) with a cosine-decayed rate from
    ``learning_rate``, returned as the mean of the last quarter of the iterates
    (Polyak-Ruppert averaging), with the local sites' last state and the mean of ĝ² over
    that quarter (per coordinate: the curvature plus the estimator's noise there). Paper
    002 (Baker et al. 2019, Sect. 3) starts SGLD from a stochastic optimisation likewise. Costs
    ``num_steps`` · n / N data passes; one compiled scan. ``state``: the local sites' start
    (:func:`local_warm_start`), else their prior means."""
    opt = optax.adam(optax.cosine_decay_schedule(learning_rate, int(num_steps), alpha=0.01))
    tail = max(1, int(num_steps) // 4)

    @jax.jit
    def run(params, theta, key, data, start):
        state = estimator.init_state(params, data)[0] if start is None else start

        def body(carry, k):
            t, s, st = carry
            g, _, st, _ = estimator.update(params, st, k, t, data)
            upd, s = opt.update(g, s, t)
            return (optax.apply_updates(t, upd), s, st), (t, g * g)

        keys = jax.random.split(key, int(num_steps))
        (_, _, state), (path, sq) = jax.lax.scan(body, (theta, opt.init(theta), state), keys)
        return jnp.mean(path[-tail:], axis=0), state, jnp.mean(sq[-tail:], axis=0)

    return run(estimator.params, theta0, rng_key, data, state)


#: Inner updates of every datum's local sites at θ̂ for :func:`local_control_variate`: the
#: first half is discarded, the gradients of the second half averaged.
CV_SWEEPS = 20

#: Inner updates of every datum's local sites at the pilot's start
#: (:func:`local_warm_start`).
WARM_SWEEPS = 10


def local_control_variate(potential: Potential, cfg: LocalConfig, theta_hat: jax.Array,
                          state: LocalState, rng_key: jax.Array, data: ModelData,
                          chunk_size: int, sweeps: int = CV_SWEEPS
                          ) -> tuple[tuple[jax.Array, jax.Array], LocalState]:
    """((table (N, d), total (d,)), the local sites' last state) of
    ḡ_i(θ̂) = E[∇_θ f_i(θ̂, z_i) | x_i, θ̂]: ``sweeps`` inner
    updates of every datum's local sites at θ̂ from ``state`` (the pilot's), the per-datum
    gradients averaged over the second half. ``sweeps`` data passes of the inner update and
    of per-datum gradients; memory N × d (the table) and chunk × d."""
    table, state = _sweeps(potential, cfg, theta_hat, state, rng_key, data, chunk_size,
                           sweeps, gradients=True)
    return (table, jnp.sum(table, axis=0)), state


def local_warm_start(potential: Potential, cfg: LocalConfig, theta: jax.Array,
                     state: LocalState, rng_key: jax.Array, data: ModelData,
                     chunk_size: int, sweeps: int = WARM_SWEEPS) -> LocalState:
    """The local sites' state after ``sweeps`` inner updates of every datum at θ (the
    pilot's start) from ``state``, so that the Fisher-identity gradient of the pilot's first
    steps sees draws of the conditionals, not the sites' prior means: a scale s of local
    effects e_i ~ N(0, s) whose e_i all start at 0 sees ∂/∂log s = Σ (e_i²/s² − 1) = −N, and
    a pilot that moves s faster than the rows' rare inner updates follow collapses to s → 0
    (a Poisson regression with an observation-level effect: s 0.01 against 0.39). ``sweeps``
    data passes of the inner update."""
    _, state = _sweeps(potential, cfg, theta, state, rng_key, data, chunk_size, sweeps,
                       gradients=False)
    return state


def _sweeps(potential: Potential, cfg: LocalConfig, theta: jax.Array, state: LocalState,
            rng_key: jax.Array, data: ModelData, chunk_size: int, sweeps: int,
            gradients: bool) -> tuple[jax.Array | None, LocalState]:
    """``sweeps`` inner updates of every datum's local sites at θ, chunk by chunk, with (if
    ``gradients``) the (N, d) table of per-datum gradients averaged over the second half."""
    N = potential.num_data
    chunk, num_chunks = min(int(chunk_size), N), -(-N // min(int(chunk_size), N))
    keep = max(1, int(sweeps) // 2)

    @jax.jit
    def run(theta, state, key, data):
        def values():
            return potential.constrain(potential.unravel(theta), data)

        def one_chunk(carry, c):
            table, state = carry
            idx = c * chunk + jax.lax.iota(jnp.int32, chunk)
            mask = idx < N
            idx = jnp.where(mask, idx, 0)

            def log_density(rows):
                return -potential.terms(theta, idx, data, rows)[1]

            def sweep(carry, ik):
                state, acc = carry
                i, k = ik
                rows, state = update_rows(cfg, potential.local, k, state, idx, log_density,
                                          values, data)
                if gradients:
                    grads = jax.jacrev(lambda t: potential.terms(t, idx, data, rows)[1])(theta)
                    acc = acc + jnp.where(i >= int(sweeps) - keep, grads, 0.0)
                return (state, acc), None

            keys = jax.random.split(jax.random.fold_in(key, c), int(sweeps))
            zero = jnp.zeros((chunk, theta.shape[0]) if gradients else (), theta.dtype)
            (state, acc), _ = jax.lax.scan(sweep, (state, zero),
                                           (jnp.arange(int(sweeps)), keys))
            if gradients:
                rows = acc / keep
                table = table.at[idx].set(jnp.where(mask[:, None], rows, table[idx]))
            return (table, state), None

        table = jnp.zeros((N, theta.shape[0]) if gradients else (), theta.dtype)
        (table, state), _ = jax.lax.scan(one_chunk, (table, state),
                                         jnp.arange(num_chunks, dtype=jnp.int32))
        return table, state

    table, state = run(theta, state, rng_key, data)
    return (table if gradients else None), state
