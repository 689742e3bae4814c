"""The default step size: from the measured gradient noise, not a constant.

For a Gaussian target with curvature μ (in whitened coordinates μ = 1) and gradient noise of
variance v, the Euler-Maruyama Langevin step x' = x − hμx − h·noise + sqrt(2h)ξ is an AR(1)
process with stationary variance (2 + h v) / (μ (2 − h μ)): the exact 1/μ inflated by the
factor (2 + h v)/(2 − h μ). Asking that factor to be at most 1 + δ gives

    h = 2δ / (v + μ (1 + δ))      (the package's step_size; ε = 2h in Putcha et al. 2023).

v is the largest eigenvalue of the estimator's noise covariance in whitened coordinates,
measured at points drawn from the proxy (so heavy-tailed per-datum gradients, which make v
large, automatically shrink the step).
"""

from __future__ import annotations

__all__ = ["sgld_step_size", "sghmc_step_size", "sgnht_step_size"]


def _checked_inflation(max_variance_inflation: float) -> float:
    """δ of the step-size rules, validated."""
    delta = float(max_variance_inflation)
    if not delta > 0:
        raise ValueError(f"max_variance_inflation must be > 0, got {max_variance_inflation}.")
    return delta


def sgld_step_size(
    noise: float, max_variance_inflation: float = 0.05, curvature: float = 1.0
) -> float:
    """h = 2δ / (v + μ(1 + δ)) (module docstring); δ = ``max_variance_inflation``."""
    delta = _checked_inflation(max_variance_inflation)
    return 2 * delta / (max(noise, 0.0) + curvature * (1 + delta))


def _sghmc_inflation(h: float, v: float, alpha: float, mu: float) -> float:
    return (1 + h * v / (2 * alpha)) * (4 - 2 * alpha * h) / (4 - 2 * alpha * h - h * h * mu)


def sghmc_step_size(
    noise: float,
    friction: float = 1.0,
    max_variance_inflation: float = 0.05,
    curvature: float = 1.0,
) -> float:
    """Time step h of SGHMC (convention of :mod:`numpyro_subsample.sgmcmc.dynamics`) from the noise.

    Derivation, as for SGLD: for a Gaussian target of curvature μ, friction α and gradient
    noise of variance v, the symplectic-Euler step p' = (1 − αh)p − hμx + h·noise +
    sqrt(2αh)ξ, x' = x + hp' is a linear AR(1) process on (x, p); its stationary covariance
    (discrete Lyapunov equation, solved symbolically) has

        Var x = (1/μ) · (1 + h v / (2α)) · (4 − 2αh) / (4 − 2αh − h²μ),

    (gradient-noise factor × discretisation factor; Var p = 2(2α + hv)/(α(4 − 2αh − h²μ))).
    The factor increases with h on the stable range h < (−α + sqrt(α² + 4μ))/μ, so h is the
    root of factor = 1 + δ, found by bisection. With v ≈ 0, α = 1, δ = 0.05: h ≈ 0.39, an
    integrated autocorrelation time of about 2α/h ≈ 5 steps for the mean of a whitened
    coordinate (SGLD's default: ≈ 20). In the noise-dominated regime h ≈ 2αδ/v and SGHMC
    costs as many steps as SGLD, as is known.

    ``friction`` α = 1 (in whitened units, where μ ≈ 1) is the default: the integrated
    autocorrelation time of x is 2α/μ (time units) while that of x² grows like 1/α, and
    α ≈ 1 balances the two near critical damping (α = 2).
    """
    delta = _checked_inflation(max_variance_inflation)
    if not friction > 0:
        raise ValueError(f"friction must be > 0, got {friction}.")
    v, a, mu = max(float(noise), 0.0), float(friction), float(curvature)
    lo, hi = 0.0, (-a + (a * a + 4 * mu) ** 0.5) / mu
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if _sghmc_inflation(mid, v, a, mu) <= 1 + delta:
            lo = mid
        else:
            hi = mid
    return lo


def sgnht_step_size(
    noise: float,
    friction: float = 1.0,
    max_variance_inflation: float = 0.05,
    curvature: float = 1.0,
) -> float:
    """Time step h of SGNHT (convention of :mod:`numpyro_subsample.sgmcmc.dynamics`).

    The thermostat drives the kinetic temperature |p'|²/d to 1; with friction ξ the Lyapunov
    solution above gives Var x = Var p · (1 − ξh/2)/μ, a deflation by ξh/2, where in
    equilibrium ξ ≈ A + hv/2 (A = ``friction``, the injected noise: the thermostat adds the
    friction that absorbs the extra noise h²v). Asking ξh/2 ≤ δ gives
    h = 4δ / (A + sqrt(A² + 4δv)). The thermostat is one scalar, so with an anisotropic noise
    covariance it balances only the average temperature; the direction of largest noise is
    then hotter by up to h·v/(2A), so h is also capped by the SGHMC rule (same δ).
    """
    delta = _checked_inflation(max_variance_inflation)
    v, a = max(float(noise), 0.0), float(friction)
    h_thermo = 4 * delta / (a + (a * a + 4 * delta * v) ** 0.5)
    return min(h_thermo, sghmc_step_size(noise, friction, delta, curvature))
