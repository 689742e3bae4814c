"""One step of each dynamic against a hand computation (step-size convention h everywhere)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_subsample.sgmcmc.dynamics import sghmc_dynamics, sgld_dynamics, sgnht_dynamics

D = 5


@pytest.fixture
def setup():
    k = jax.random.split(jax.random.PRNGKey(3), 4)
    w = jax.random.normal(k[0], (D,))
    p = jax.random.normal(k[1], (D,))
    g = jax.random.normal(k[2], (D,))
    # the Gaussian noise the diffusions draw from the step key (BlackJAX's generator)
    xi = jax.random.normal(k[3], (D,))
    return k[3], np.asarray(w), np.asarray(p), np.asarray(g), np.asarray(xi)


def _noise_of(key):
    """The standard normal vector BlackJAX's diffusions draw from ``key`` for a (D,) array:
    recovered from a zero-drift Langevin step, so the test depends only on the update formula."""
    h = 0.5
    out = sgld_dynamics().step(key, jnp.zeros(D), jnp.zeros(0), jnp.zeros(()), jnp.zeros(D), h)[0]
    return np.asarray(out) / np.sqrt(2 * h)


def test_sgld_step_is_w_plus_h_grad_plus_sqrt_2h_noise(setup):
    key, w, _, g, _ = setup
    h = 0.01
    noise = _noise_of(key)
    new, mom, xi = sgld_dynamics().step(key, w, jnp.zeros(0), jnp.zeros(()), g, h)
    np.testing.assert_allclose(new, w + h * g + np.sqrt(2 * h) * noise, rtol=1e-5, atol=1e-6)
    assert mom.shape == (0,)


def test_sgld_noise_is_standard_normal():
    keys = jax.random.split(jax.random.PRNGKey(0), 4000)
    draws = np.stack([_noise_of(k) for k in keys[:400]])
    assert abs(draws.mean()) < 0.1 and abs(draws.std() - 1) < 0.1


def test_sghmc_momentum_first_then_position(setup):
    """p' = (1 − αh)p + h g + sqrt(2αh) ξ;  w' = w + h p' (symplectic Euler)."""
    key, w, p, g, _ = setup
    h, alpha = 0.1, 0.7
    noise = _noise_of(key)
    new_w, new_p, _ = sghmc_dynamics(alpha).step(key, w, p, jnp.zeros(()), g, h)
    p_hand = (1 - alpha * h) * p + h * g + np.sqrt(2 * alpha * h) * noise
    np.testing.assert_allclose(new_p, p_hand, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_w, w + h * p_hand, rtol=1e-5, atol=1e-6)


def test_sgnht_thermostat_update(setup):
    """p' = (1 − ξh)p + h g + sqrt(2Ah) ξ_noise;  ξ' = ξ + h(|p'|²/d − 1);  w' = w + h p'."""
    key, w, p, g, _ = setup
    h, A, thermo = 0.05, 0.5, 0.9
    noise = _noise_of(key)
    new_w, new_p, new_xi = sgnht_dynamics(A).step(key, w, p, jnp.asarray(thermo), g, h)
    p_hand = (1 - thermo * h) * p + h * g + np.sqrt(2 * A * h) * noise
    np.testing.assert_allclose(new_p, p_hand, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_w, w + h * p_hand, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_xi, thermo + h * (np.sum(p_hand**2) / D - 1), rtol=1e-5)


def test_init_momentum():
    draw = jax.random.normal(jax.random.PRNGKey(0), (D,))
    w = jnp.zeros(D)
    assert sgld_dynamics().init_momentum(draw, w)[0].shape == (0,)
    p, xi = sghmc_dynamics(1.0).init_momentum(draw, w)
    np.testing.assert_array_equal(p, draw)  # the stationary law N(0, I) of the momentum
    assert float(xi) == 0.0
    p, xi = sgnht_dynamics(0.5).init_momentum(draw, w)
    np.testing.assert_array_equal(p, draw)
    assert float(xi) == 0.5


def test_constructors_are_cached_and_validated():
    assert sgld_dynamics() is sgld_dynamics()
    assert sghmc_dynamics(1.0) is sghmc_dynamics(1.0)
    with pytest.raises(ValueError, match="friction"):
        sghmc_dynamics(0.0)
