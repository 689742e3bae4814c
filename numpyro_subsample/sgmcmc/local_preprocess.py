"""The preprocessing of a stochastic-gradient kernel for a model with local latent sites
(one value per datum inside the subsample plate, :mod:`~numpyro_subsample.estimators.local`):
no proxy, the uniform design, a stochastic-approximation pilot's start and control variates.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp

from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.potential import Potential
from numpyro_subsample.estimators.local import LocalConfig, local_estimator
from numpyro_subsample.estimators.local_start import (
    CV_SWEEPS,
    WARM_SWEEPS,
    local_control_variate,
    local_pilot,
    local_warm_start,
    pilot_steps,
)
from numpyro_subsample.estimators.selection import uniform_design
from numpyro_subsample.sgmcmc.chain import Preprocessed
from numpyro_subsample.sgmcmc.preprocess import unmeasured_preprocessed, whitening

__all__ = ["local_preprocessing"]


def local_preprocessing(label: str, potential: Potential, given: dict, replace: bool,
                        local: LocalConfig, structured: bool,
                        adapted_step: float | None = None, data: ModelData | None = None,
                        rng_key: Any = None, chunk_size: int = 2048) -> Preprocessed:
    """The preprocessing of a model with local latent sites
    (:mod:`~numpyro_subsample.estimators.local`): no proxy, the uniform design, and

    - a start: the end of a stochastic-approximation pilot
      (:func:`~numpyro_subsample.estimators.local_start.local_pilot`), its local sites first
      moved towards their conditionals at its start
      (:func:`~numpyro_subsample.estimators.local_start.local_warm_start`), unless a
      ``step_size`` is given with ``estimator="uniform"``;
    - ``estimator="cv"`` (the default while N · d ≤
      :data:`~numpyro_subsample.estimators.local_start.MAX_LOCAL_CV_NUMBERS`): control
      variates at the pilot's θ̂ with the table of ḡ_i(θ̂)
      (:func:`~numpyro_subsample.estimators.local_start.local_control_variate`), as SGLD-CV's LDA
      experiment (Baker et al. 2019, Sect. 5.3); ``"uniform"``: none;
    - the given step (in the model's unconstrained coordinates), or with the adapted diagonal
      preconditioner, in coordinates scaled by the pilot's root mean ĝ² (so that the
      adaptation starts at the right scale even where the control variate's gradient at θ̂
      is nearly zero)
      (``given["adapt_preconditioner"]``, the default without a step:
      :mod:`~numpyro_subsample.sgmcmc.adaptation`) its step ``adapted_step``. The
      adaptation's running mean of ĝ² holds the curvature and the gradient noise, the local
      sites' conditional draws included (Fisher's identity), so the rule bounds both.

    ``given``: the kernel's ``estimator`` (resolved), ``estimator_options``, ``step_size``,
    ``zv_stream``, ``proxy``, ``proxy_kwargs``, ``noise_correction`` (as passed: None when
    left out) and ``adapt_preconditioner`` (resolved).

    Raises
    ------
    ValueError
        An option that needs the marginal p(x_i | θ), naming it and the value given.
    """
    t0 = time.perf_counter()
    adapted = bool(given.get("adapt_preconditioner"))
    needs = []
    if given["estimator"] not in ("uniform", "cv"):
        needs.append(f"estimator='cv' or 'uniform' (got {given['estimator']!r})")
    if given["estimator_options"]:
        needs.append(f"no estimator options (got {sorted(given['estimator_options'])})")
    if given["step_size"] is None and not adapted:
        needs.append("a step_size or the adapted preconditioner (AdaptationOptions("
                     "preconditioner=None or True); got False)")
    if given["zv_stream"]:
        needs.append("zv=None")
    if not (isinstance(given["proxy"], str) and given["proxy"] == "laplace"):
        needs.append("no proxy (got proxy=" + (repr(given["proxy"]) if isinstance(
            given["proxy"], str) else type(given["proxy"]).__name__) + ")")
    if given["proxy_kwargs"]:
        needs.append(f"no proxy_kwargs (got {sorted(given['proxy_kwargs'])})")
    if given["noise_correction"]:
        needs.append("the noise correction left out (got NoiseOptions(correction=True))")
    if needs:
        raise ValueError(
            f"{label}: the model has local latent sites {list(potential.local_sites)} inside "
            f"the subsample plate '{potential.plate.name}', which needs {'; '.join(needs)}: the "
            "proxy, the other estimators, the measured-noise step rule, the noise correction "
            "and ZV need the marginal p(x_i | θ), an integral over the local sites. Leave "
            "estimator and step_size out (control variates at a pilot's end, step from the "
            "adapted preconditioner), or use SGRLD for Dirichlet globals."
        )
    design = uniform_design(potential.num_data, potential.plate.subsample_size, replace,
                            potential.init_theta.dtype)
    estimator = local_estimator(potential, design, local)
    wh = whitening(None, potential, preconditioning=False, structured=structured)
    cv = given["estimator"] == "cv"
    if data is not None and (adapted or cv):
        steps = pilot_steps(potential.num_data, potential.plate.subsample_size)
        warm = local_warm_start(potential, local, wh.centre, estimator.init_state(
            estimator.params, data)[0], jax.random.fold_in(rng_key, 2), data, chunk_size)
        centre, state, moment = local_pilot(estimator, wh.centre, rng_key, data, steps,
                                            state=warm)
        passes = WARM_SWEEPS + steps * estimator.subsample_size / potential.num_data
        if adapted and given["step_size"] is None and not structured:
            # the adaptation's coordinates: unit mean ĝ² of the plain estimator at θ̂
            tril = jnp.diag(jax.lax.rsqrt(moment + jnp.finfo(moment.dtype).tiny))
            wh = wh._replace(scale_tril=tril)  # init_tril stays I: w is in those units
        if cv:
            table, state = local_control_variate(potential, local, centre, state,
                                                 jax.random.fold_in(rng_key, 1), data,
                                                 chunk_size)
            estimator = local_estimator(potential, design, local, table, start=state)
            passes += 2.0 * CV_SWEEPS
        wh = wh._replace(centre=centre, data_passes=passes)
    step = given["step_size"] if given["step_size"] is not None else adapted_step
    return unmeasured_preprocessed(potential, wh, estimator, float(step), t0)
