"""Stochastic-gradient MCMC kernels for NumPyro: SGLD, SGHMC, SGNHT.

The functional core (:mod:`numpyro_subsample.sgmcmc.chain`: pure per-chain init and
``step(state, data)`` over :class:`SGMCMCState`) wrapped by the thin adapter of
:mod:`numpyro_subsample.core.adapter` in :class:`SGMCMCKernel`
(:mod:`numpyro_subsample.sgmcmc.base`), which runs the preprocessing (proxy, estimator,
measured noise); the classes here choose the dynamics and the step-size rule.

High-dimensional models: with a structured proxy (``proxy="diagonal"`` or ``"low-rank"``,
:func:`~numpyro_subsample.proxies.structured.fit_structured`, chosen by default above
:data:`MAX_DENSE_DIM` parameters) the whitening, the noise measurement and the sampling step
form no d × d array: every product with L is O(d·k) and the noise's largest eigenvalue comes
from Lanczos (:mod:`numpyro_subsample.estimators.noise`). The noise-corrected dynamics need
the d × d noise covariance, so they are off there and the uncorrected step-size rules apply.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from numpyro_subsample.core.options import check_options
from numpyro_subsample.sgmcmc.base import SGMCMCKernel
from numpyro_subsample.sgmcmc.chain import Preprocessed, SamplerParams, SGMCMCState
from numpyro_subsample.sgmcmc.dynamics import (
    Dynamics,
    corrected_dynamics,
    sghmc_dynamics,
    sgnht_dynamics,
)
from numpyro_subsample.sgmcmc.noise_refine import MAX_NOISE_EXTENSIONS
from numpyro_subsample.sgmcmc.preprocess import DEFAULT_RANK, MAX_DENSE_DIM, MAX_ZV_DEGREE2_DIM
from numpyro_subsample.sgmcmc.stepsize import sghmc_step_size, sgnht_step_size

__all__ = [
    "SamplerParams",
    "SGMCMCState",
    "Preprocessed",
    "SGMCMCKernel",
    "SGLD",
    "SGHMC",
    "SGNHT",
    "MAX_NOISE_EXTENSIONS",
    "MAX_DENSE_DIM",
    "DEFAULT_RANK",
    "MAX_ZV_DEGREE2_DIM",
]


class SGLD(SGMCMCKernel):
    """Stochastic gradient Langevin dynamics (Welling and Teh 2011; Putcha et al. 2023, Eq. 4),
    preconditioned by the proxy.

    ``step_size`` is the time step h: w ← w + h ∇log π(w) + sqrt(2h) ξ, so the ε of Putcha et
    al. (Eq. 4) is 2h. Earlier releases took ε here; an explicit ``step_size`` therefore raises
    a ``DeprecationWarning`` for one release (pass ``step_size=ε/2``). See
    :class:`SGMCMCKernel` for the other arguments. Example::

        kernel = SGLD(model, estimator="cv")
        mcmc = MCMC(kernel, num_warmup=1000, num_samples=5000)
        mcmc.run(jax.random.PRNGKey(0), X, y)

    Parameters
    ----------
    model
        A NumPyro model whose likelihood sits in ``numpyro.plate(name, N, subsample_size=n)``.
    **kwargs
        The options of :class:`SGMCMCKernel` (``estimator``, ``step_size``, ``proxy``, ...).

    References
    ----------
    Welling and Teh (2011) (the SGLD update); Putcha, Nemeth and Fearnhead (2023),
    Eq. 3-4 (the estimator and the update with ε = 2h).
    """

    def __init__(self, model: Callable, **kwargs: Any) -> None:
        if kwargs.get("step_size") is not None:
            warnings.warn(
                "SGLD's step_size is now the time step h of w + h∇log π + sqrt(2h)ξ (BlackJAX's "
                "convention, shared with SGHMC and SGNHT); it used to be ε = 2h of Putcha et "
                "al. (2023, Eq. 4). Pass step_size=ε/2 for the old value.",
                DeprecationWarning,
                stacklevel=2,
            )
        super().__init__(model, **kwargs)


class SGHMC(SGMCMCKernel):
    """Stochastic gradient HMC (Chen, Fox and Guestrin 2014) on whitened coordinates, with
    BlackJAX's ``diffusions.sghmc`` (update in :mod:`numpyro_subsample.sgmcmc.dynamics`).

    Parameters
    ----------
    friction
        α of dp = ∇log π dt − αp dt + sqrt(2α) dW in whitened units (default 1.0, see
        :func:`~numpyro_subsample.sgmcmc.stepsize.sghmc_step_size`).
    **kwargs
        As :class:`SGMCMCKernel` (``step_size`` is the time step h); the momentum is the
        state's ``momentum`` field.
    model
        A NumPyro model with a subsample plate, as for :class:`SGLD`.

    References
    ----------
    Chen, Fox and Guestrin (2014) (SGHMC with friction and the noise estimate B̂).
    """

    _default_friction = 1.0
    _dynamics_name = "sghmc"
    _plain_dynamics = staticmethod(sghmc_dynamics)
    _step_rule = staticmethod(sghmc_step_size)

    def __init__(self, model: Callable, *, friction: float | None = None, **kwargs: Any) -> None:
        friction = self._default_friction if friction is None else friction
        check_options("SGHMC", label=type(self).__name__, friction=friction)
        self.friction = float(friction)
        super().__init__(model, **kwargs)

    @property
    def _diffusion(self) -> float:
        return self.friction

    def _dynamics(self, corrected: bool | None = None) -> Dynamics:
        if self._corrected(corrected):
            return corrected_dynamics(self._dynamics_name, self.friction)
        return self._plain_dynamics(self.friction)

    def _default_step_size(self, noise: float, corrected: bool | None = None,
                           curvature: float = 1.0) -> float:
        return self._step_rule(noise, self.friction, self.max_variance_inflation, curvature,
                               corrected=self._corrected(corrected))


class SGNHT(SGHMC):
    """Stochastic gradient Nosé-Hoover thermostat (Ding et al. 2014) on whitened coordinates,
    with BlackJAX's ``diffusions.sgnht``; the thermostat ξ is the state's ``thermostat`` field.

    Parameters
    ----------
    friction
        The diffusion A of the injected noise; ξ starts at A and adapts so that the mean
        kinetic energy per coordinate is 1/2 (default 0.5: the default step is about 2δ/ξ, so
        a smaller A allows a larger step).
    **kwargs
        As :class:`SGMCMCKernel` (``step_size`` is the time step h, default from
        :func:`~numpyro_subsample.sgmcmc.stepsize.sgnht_step_size`).
    model
        A NumPyro model with a subsample plate, as for :class:`SGLD`.

    References
    ----------
    Ding, Fang, Babbush, Chen, Skeel and Neven (2014) (the SGNHT update).
    """

    _default_friction = 0.5
    _dynamics_name = "sgnht"
    _plain_dynamics = staticmethod(sgnht_dynamics)
    _step_rule = staticmethod(sgnht_step_size)
