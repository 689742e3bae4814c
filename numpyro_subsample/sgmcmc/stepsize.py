"""The default step size: from the measured gradient noise, not a constant.

For a Gaussian target with curvature μ (in whitened coordinates μ = 1) and gradient noise of
variance v, the Euler-Maruyama Langevin step x' = x − hμx − h·noise + sqrt(2h)ξ is an AR(1)
process with stationary variance (2 + h v) / (μ (2 − h μ)): the exact 1/μ inflated by the
factor (2 + h v)/(2 − h μ). Asking that factor to be at most 1 + δ gives

    h = 2δ / (v + μ (1 + δ))      (the package's step_size; ε = 2h in Putcha et al. 2023).

v is the largest eigenvalue of the estimator's noise covariance in whitened coordinates,
measured at points drawn from the proxy (so heavy-tailed per-datum gradients, which make v
large, automatically shrink the step).

With the noise-corrected dynamics (:func:`~numpyro_subsample.sgmcmc.dynamics.corrected_dynamics`,
the default of the kernels) the injected noise is reduced by the estimator's own, so v leaves
the inflation factor: h = 2δ/(μ(1 + δ)) for SGLD, and likewise v = 0 in the SGHMC and SGNHT
rules. The correction needs 2ch ≥ h²v (c the diffusion coefficient); the rules cap h at c/v,
so that at least half of the injected variance stays Gaussian in every direction (the
gradient noise is not Gaussian: rare heavy rows make it skewed). The kernels further cap h
where the measured V is uncertain
(:func:`~numpyro_subsample.sgmcmc.noise_refine.correction_step_cap`).

With a structured proxy (:mod:`numpyro_subsample.proxies.structured`) the kernels use the
uncorrected rules (the correction needs the d × d matrix V) with μ the largest whitened
curvature the proxy reports (:func:`~numpyro_subsample.sgmcmc.preprocess.whitened_curvature`:
for a low-rank fit its first discarded Ritz value over its complement curvature, at least 1),
so that the stiffest direction, not a unit one, meets the bound.

Steps per draw. A draw of overdamped Langevin dynamics at step h decorrelates a whitened
coordinate of curvature λ in about 1/(hλ) steps: the integrated autocorrelation time of its
mean is (2 − hλ)/(hλ) (the AR(1) above), about 20 draws at the unit-curvature step
h_1 = 2δ/(1 + δ) (δ = 0.05). Where the curvature's spread μ, the bias probe or the noise
bound takes h below h_1, each draw mixes h/h_1 as far. The kernels then move k = round(h_1/h)
steps per draw (:func:`steps_per_draw`, at most :data:`MAX_STEPS_PER_DRAW`), so that a
draw of a default run mixes about as far as one of SGLD at h_1 (SGHMC and SGNHT, whose
autocorrelation time in time units, 2α/λ, is at most SGLD's 2/λ for α ≤ 1, take k > 1 only
where noise or curvature hold their steps below h_1, far under their rules' 0.2-0.39): the
stationary distribution is unchanged (k steps of the same chain per recorded draw, as NUTS
takes several leapfrog steps per draw), the run costs k times the gradient estimates. Where
h_1/h exceeds twice the cap the steps would not make the run mix, and k = 1 (the run check
then says so).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MAX_STEPS_PER_DRAW", "sgld_step_size", "sghmc_step_size", "sgnht_step_size",
           "steps_per_draw"]

#: The most steps of the dynamics per draw that :func:`steps_per_draw` asks for.
MAX_STEPS_PER_DRAW = 8


def _checked_inflation(max_variance_inflation: float) -> float:
    """δ of the step-size rules, validated."""
    delta = float(max_variance_inflation)
    if not delta > 0:
        raise ValueError(f"max_variance_inflation must be > 0, got {max_variance_inflation}.")
    return delta


def _cap(noise: float, diffusion: float) -> float:
    """The largest h of a noise-corrected dynamic: h ≤ c/v (module docstring)."""
    v = max(float(noise), 0.0)
    return float("inf") if v == 0 else float(diffusion) / v


def sgld_step_size(
    noise: float,
    max_variance_inflation: float = 0.05,
    curvature: float = 1.0,
    corrected: bool = False,
) -> float:
    """h = 2δ / (v + μ(1 + δ)) (module docstring); δ = ``max_variance_inflation``.

    ``corrected``: for the noise-corrected dynamic, h = min(2δ/(μ(1 + δ)), 1/v).
    """
    delta = _checked_inflation(max_variance_inflation)
    if corrected:
        return min(2 * delta / (curvature * (1 + delta)), _cap(noise, 1.0))
    return 2 * delta / (max(noise, 0.0) + curvature * (1 + delta))


def _sghmc_inflation(h: float, v: float, alpha: float, mu: float) -> float:
    return (1 + h * v / (2 * alpha)) * (4 - 2 * alpha * h) / (4 - 2 * alpha * h - h * h * mu)


def _friction_rule(rule: Callable[[float, float, float, float], float]) -> Callable[..., float]:
    """The public rule of a dynamic with a friction (SGHMC, SGNHT) from ``rule(v, α, δ, μ)``:
    it validates δ (``max_variance_inflation``) and α (``friction``), and for the
    noise-corrected dynamic (``corrected``) applies ``rule`` with v = 0, capped at α/v."""

    def step_size(
        noise: float,
        friction: float = 1.0,
        max_variance_inflation: float = 0.05,
        curvature: float = 1.0,
        corrected: bool = False,
    ) -> float:
        delta = _checked_inflation(max_variance_inflation)
        if not friction > 0:
            raise ValueError(f"friction must be > 0, got {friction}.")
        alpha, mu = float(friction), float(curvature)
        if corrected:
            return min(rule(0.0, alpha, delta, mu), _cap(noise, friction))
        return rule(max(float(noise), 0.0), alpha, delta, mu)

    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(step_size, attr, getattr(rule, attr))
    return step_size


@_friction_rule
def sghmc_step_size(v: float, alpha: float, delta: float, mu: float) -> float:
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

    ``corrected``: for the noise-corrected dynamic, the root with v = 0, capped at α/v.
    """
    lo, hi = 0.0, (-alpha + (alpha * alpha + 4 * mu) ** 0.5) / mu
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if _sghmc_inflation(mid, v, alpha, mu) <= 1 + delta:
            lo = mid
        else:
            hi = mid
    return lo


@_friction_rule
def sgnht_step_size(v: float, alpha: float, delta: float, mu: float) -> float:
    """Time step h of SGNHT (convention of :mod:`numpyro_subsample.sgmcmc.dynamics`).

    The thermostat drives the kinetic temperature |p'|²/d to 1; with friction ξ the Lyapunov
    solution above gives Var x = Var p · (1 − ξh/2)/μ, a deflation by ξh/2, where in
    equilibrium ξ ≈ A + hv/2 (A = ``friction``, the injected noise: the thermostat adds the
    friction that absorbs the extra noise h²v). Asking ξh/2 ≤ δ gives
    h = 4δ / (A + sqrt(A² + 4δv)). The thermostat is one scalar, so with an anisotropic noise
    covariance it balances only the average temperature; the direction of largest noise is
    then hotter by up to h·v/(2A), so h is also capped by the SGHMC rule (same δ).

    ``corrected``: for the noise-corrected dynamic, the rule with v = 0, capped at A/v.
    """
    h_thermo = 4 * delta / (alpha + (alpha * alpha + 4 * delta * v) ** 0.5)
    return min(h_thermo, sghmc_step_size(v, alpha, delta, mu))


def steps_per_draw(step_size: float, unit_step: float,
                   max_steps: int = MAX_STEPS_PER_DRAW) -> int:
    """k = round(h_1 / h) steps of the dynamics per draw, at most ``max_steps``; 1 where
    h_1 / h exceeds 2 · ``max_steps`` (module docstring).

    Parameters
    ----------
    step_size
        The step h the run takes.
    unit_step
        h_1: the rule's step at unit curvature and no gradient noise.
    max_steps
        The cap on k.
    """
    ratio = float(unit_step) / float(step_size)
    if not ratio > 1.0 or ratio > 2 * max_steps:
        return 1
    return int(min(max_steps, max(1, int(ratio + 0.5))))
