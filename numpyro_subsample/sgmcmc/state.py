"""The records of the stochastic-gradient kernels' functional core: the chain's state
(:class:`SGMCMCState`), the arrays of the preprocessing it carries (:class:`SamplerParams`),
the preprocessing itself (:class:`Preprocessed`, :class:`Whitening`) and the static
configuration of the compiled step (:class:`SGMCMCConfig`); the programs are in
:mod:`numpyro_subsample.sgmcmc.chain`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from numpyro_subsample.core.potential import Potential
from numpyro_subsample.estimators.base import GradientEstimator
from numpyro_subsample.estimators.zv import ZVPairedStats, ZVStats
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.structured import StructuredProxy
from numpyro_subsample.proxies.whitening import Scale
from numpyro_subsample.sgmcmc.adaptation import ScaleAdaptation
from numpyro_subsample.sgmcmc.dynamics import Dynamics

__all__ = ["Preprocessed", "SamplerParams", "SGMCMCConfig", "SGMCMCState", "Whitening"]


class SamplerParams(NamedTuple):
    """The arrays of the preprocessing that the step reads: the whitening θ = θ̂ + L w
    (``scale_tril``: a :data:`~numpyro_subsample.proxies.whitening.Scale`, dense triangular or
    structured), the step size h, the estimator's arrays and, for a noise-corrected dynamic,
    the matrix S of the injected noise S ξ
    (:func:`~numpyro_subsample.sgmcmc.dynamics.injected_noise_scale`) and the steps of the
    dynamics per draw k (an int32 scalar; None: one,
    :func:`~numpyro_subsample.sgmcmc.stepsize.steps_per_draw`)."""

    centre: jax.Array
    scale_tril: Scale
    step_size: jax.Array
    estimator: Any
    init_tril: Scale  # square root of the proxy covariance, for initial draws
    data_passes: jax.Array  # data passes spent on the preprocessing
    noise_scale: jax.Array | None = None
    steps_per_draw: jax.Array | None = None


class SGMCMCState(NamedTuple):
    """State of a stochastic-gradient chain.

    ``z``: unconstrained latent values (dict); ``w``: whitened position (θ = θ̂ + L w);
    ``grad``: the estimate of ∇ log π(θ) at ``z`` (unconstrained, flat), used by the next step
    (zeros in the initial state, ``i`` = 0, whose step evaluates it without moving);
    ``subsample_size``: data used for ``grad``; ``diverging``: the chain has failed: a
    proposed step was non-finite or farther than
    :data:`~numpyro_subsample.sgmcmc.chain.MAX_PROXY_SD` proxy sds from the centre; the
    chain then stops at its last valid state and every later draw is marked;
    ``fail_step``, ``fail_coord``: the iteration of the failure and the flat unconstrained
    coordinate that failed (−1 while the chain is healthy); ``data_passes``: cumulative data
    evaluations / N, including preprocessing; ``params``: the preprocessing's arrays (shared
    by vectorized chains);
    ``zv_stats``: streamed zero-variance statistics (``zv=ZVOptions()``; paired ones with
    the linearised covariates);
    ``est_state``: the estimator's own state (None for a stateless estimator; SAGA's table,
    SVRG's anchor: :mod:`numpyro_subsample.estimators.variance_reduced`), updated by every
    gradient estimate of the steps, also after a failure (the chain is frozen then and its
    state no longer used); ``adapt``: the diagonal preconditioner adapted during warm-up
    (:class:`~numpyro_subsample.sgmcmc.adaptation.ScaleAdaptation`, with
    ``AdaptationOptions(preconditioner=True)``): the dynamics then move u = w / ``adapt.scale``, and
    ``momentum`` is in u's units.

    Parameters
    ----------
    i
        Iteration counter.
    z
        Unconstrained latent values (dict site → array).
    w
        Whitened position, θ = θ̂ + L w.
    momentum
        Momentum of SGHMC and SGNHT (zeros for SGLD).
    thermostat
        SGNHT's thermostat ξ.
    grad
        Estimate of ∇log π at ``z`` (flat, unconstrained), used by the next step.
    subsample_size
        Data used for ``grad``.
    diverging
        True once the chain has failed.
    fail_step, fail_coord
        Iteration and flat coordinate of the failure (−1 while healthy).
    data_passes
        Cumulative data evaluations / N, preprocessing included.
    rng_key
        The chain's random key.
    params
        The preprocessing's arrays, shared by vectorized chains.
    zv_stats
        Streamed zero-variance statistics, or None.
    est_state
        The estimator's state (SAGA's table, SVRG's anchor), or None.
    adapt
        The adapted diagonal preconditioner, or None.

    References
    ----------
    Welling and Teh (2011); Chen, Fox and Guestrin (2014); Ding et al. (2014) (the dynamics
    whose state this is).
    """

    i: jax.Array
    z: dict
    w: jax.Array
    momentum: jax.Array
    thermostat: jax.Array
    grad: jax.Array
    subsample_size: jax.Array
    diverging: jax.Array
    fail_step: jax.Array
    fail_coord: jax.Array
    data_passes: jax.Array
    rng_key: jax.Array
    params: SamplerParams
    zv_stats: ZVStats | ZVPairedStats | None = None
    est_state: Any = None
    adapt: ScaleAdaptation | None = None


class Preprocessed(NamedTuple):
    """Everything computed once per data set before sampling.

    Parameters
    ----------
    potential
        The model's :class:`~numpyro_subsample.core.potential.Potential`.
    proxy
        The fitted proxy N(θ̂, Σ̂), or None without one.
    estimator
        The configured :class:`~numpyro_subsample.estimators.base.GradientEstimator`.
    step_size
        The time step h.
    noise
        Largest eigenvalue v of the whitened gradient-noise covariance.
    centre
        θ̂, the centre of the whitening.
    scale_tril
        L (Σ̂ = L Lᵀ), dense or structured.
    seconds, data_passes
        Cost of the preprocessing.
    params
        The arrays the compiled step reads.
    noise_cov
        The measured whitened noise covariance V, or None.
    noise_draws
        Number of proxy draws the noise was averaged over.
    noise_errors
        Standard errors of the noise eigenvalues, or None.
    noise_corrected
        Whether the injected noise is N(0, 2h I − h²V).
    step_bias
        The default probe of the step's bias
        (:class:`~numpyro_subsample.sgmcmc.step_bias.BiasProbe`), or None where it did not run.
    step_bias_skipped
        Why the step's bias was not probed ("" where it was).
    noise_free_step
        The step-size rule's h without gradient noise (at the same curvature), or NaN where
        the kernel did not choose the step from the rule; a chosen step well below it is
        limited by the subsample's gradient noise.
    cost
        ``data_passes`` by stage, as ``(stage, passes)`` pairs in the order spent (the proxy
        fit, the pilot chains, the curvature, the control variates, the noise measurement, a
        proxy measured and not kept, the bias probe, other forms of the model preprocessed to
        choose this one).

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Sect. 3 (the centring value); Ahn, Korattikara and
    Welling (2012) (the noise correction).
    """

    potential: Potential
    proxy: Proxy | StructuredProxy | None
    estimator: GradientEstimator
    step_size: float
    noise: float
    centre: jax.Array
    scale_tril: Scale
    seconds: float
    data_passes: float
    params: SamplerParams
    noise_cov: Any = None  # the estimator's whitened noise covariance (NumPy), if measured
    noise_draws: int = 0  # proxy draws that noise (and noise_cov) average
    noise_errors: Any = None  # standard errors of its eigenvalues (NumPy, ascending order)
    noise_corrected: bool = False  # the dynamics inject N(0, 2ch I − h²V)
    step_bias: Any = None  # sgmcmc.step_bias.BiasProbe of the step, if it ran
    step_bias_skipped: str = ""  # why it did not run
    noise_free_step: float = float("nan")  # the rule's h at zero noise
    cost: tuple[tuple[str, float], ...] = ()  # data passes by stage


class Whitening(NamedTuple):
    """The proxy and the whitening θ = θ̂ + L w (``init_tril``: the proxy's square root, for
    initial draws; both :data:`~numpyro_subsample.proxies.whitening.Scale`, of one kind);
    ``data_passes`` spent on the proxy."""

    proxy: Proxy | StructuredProxy | None
    centre: jax.Array
    scale_tril: Scale
    init_tril: Scale
    data_passes: float


class SGMCMCConfig(NamedTuple):
    """Static configuration of the compiled step (hashable; equal configs share code)."""

    potential: Potential
    estimate: Callable
    dynamics: Dynamics
    rng_impl: str
    init_strategy: str  # "proxy", "centre"
    precondition_draw: bool  # w is whitened by the proxy (True) or raw θ − θ̂ (False)
    zv_degree: int  # 0: no ZV streaming
    zv_fn: Callable | None
    num_warmup: int  # with zv_degree or adapt_window, else 0
    # a stateful estimator's init_state and update (GradientEstimator), or None
    init_state: Callable | None = None
    update: Callable | None = None
    adapt_window: int = 0  # > 0: the diagonal preconditioner adapts (sgmcmc.adaptation)
    zv_linearised: bool = False  # degree-1 ZV with one linearised covariate per function
