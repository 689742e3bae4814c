"""Zero-variance (ZV) post-processing control variates (Baker, Fearnhead, Fox and Nemeth 2019,
Sect. 4, Eq. 13-14, Algorithm 2).

For a function g of the parameters, the ZV estimate of E_π[g] is the average of

    g̃(θ) = g(θ) − βᵀ u(θ, ŝ),        β = Var(u)⁻¹ Cov(u, g),                      (Eq. 14)

where u are zero-mean control variates built from the stochastic gradient ŝ ≈ ∇ log π(θ) that
the sampler computes anyway (Mira et al. 2013; Friel et al. 2016). With a polynomial Q the
Stein identity E_π[ΔQ + ∇Q·∇log π] = 0 gives them (Eq. 13 with ẑ = ŝ/2; the factor 1/2 and
the sign are absorbed in β, so ŝ is used directly):

- degree 1, Q = aᵀθ: u_k = ŝ_k (d variates);
- degree 2, Q = aᵀθ + θᵀBθ (Papamarkou et al. 2014): additionally u_kk = 1 + θ_k ŝ_k and
  u_kl = θ_l ŝ_k + θ_k ŝ_l for k < l (d(d+3)/2 variates in all).

ŝ is unbiased for ∇ log π at θ and its subsample is drawn independently of θ, so E[u] = 0
still holds (Baker et al. 2019, Sect. 4). θ and ŝ are the sampler's *unconstrained* flat
coordinates (``ravel_pytree`` of the latent dict): the identity holds in the coordinates the
gradient is taken in, with the log-Jacobian inside log π. It then holds for **any** function of
θ, including functions of the constrained values x = T(θ): the ZV means of constrained sites
are unbiased, but a polynomial in θ removes less variance from a nonlinear T(θ) (e.g. a scale
τ = exp θ) than from a real-valued site. ``unconstrained=True`` targets θ itself instead.

Above :data:`~numpyro_subsample.estimators.zv.MAX_ZV_COVARIATES` parameters degree 1 uses
the linearised covariates (``covariates="auto"``): one per function, u_i = ∇g_i(θ̄)ᵀ Σ̂ ŝ, with
θ̄ the kernel's centre and Σ̂ = L Lᵀ its whitening (the proxy's covariance; the identity
without preconditioning), both fixed before sampling and shared by the chains (not the
diagonal adapted per chain during warm-up, which would give each chain other covariates
than the pooled β fits); a scalar β_i each (:mod:`numpyro_subsample.estimators.zv`). One
linearisation of g at θ̄ and one application of Σ̂ per draw: O(d·k + m), no p × p matrix.

The optimal coefficients are solved from the covariance of standardised covariates with a
least-squares solver (and optional ridge), per chain or on the pooled chains. The same solver
serves the stored draws and the streaming sufficient statistics (Welford co-moments that an SG
kernel built with ``zv=ZVOptions()`` accumulates in its state, ``state.zv_stats``; covariates
and updates in :mod:`numpyro_subsample.estimators.zv`), so both agree to float tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr

from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.estimators.zv import (
    ZVPairedStats,
    ZVStats,
    check_covariate_name,
    check_covariates,
    check_degree,
    covariate_choice,
    default_g,
    flat_fn,
    num_covariates,
    zv_covariates,
)
from numpyro_subsample.post.protocol import run_data
from numpyro_subsample.post.zv_draws import (
    draws_from_idata,
    draws_from_mcmc,
    unconstrained_draws,
    zv_kernel_of,
)
from numpyro_subsample.post.zv_solver import ZVResult, fit_draws, fit_stats, make_result

__all__ = [
    "ZVStats",
    "ZVResult",
    "zv_covariates",
    "zv_fit",
    "zv_mean",
    "zv_summary",
    "add_zv_groups",
    "unconstrained_draws",
]

ZV_GROUP = "zv_posterior"
_STATS = ("mean", "var", "raw_mean", "raw_var", "mcse_mean", "raw_mcse_mean",
          "variance_reduction")


def zv_fit(
    source: Any,
    fn: Callable[[dict], Any] | None = None,
    degree: int = 1,
    *,
    by_chain: bool = False,
    cross_fit: bool = False,
    ridge: float = 0.0,
    unconstrained: bool = False,
    mode: str = "auto",
    data: ModelData | None = None,
    covariates: str = "auto",
) -> ZVResult:
    """ZV-corrected estimates of E[g] (Baker et al. 2019, Eq. 14, Algorithm 2) with diagnostics.

    Parameters
    ----------
    source
        An ``MCMC`` run of a package kernel (with ``extra_fields=("grad",)``, or an SG kernel
        built with ``zv=ZVOptions()``), or the InferenceData of ``to_arviz``.
    fn
        g as a function of one constrained sample (dict site → value, including deterministic
        sites), returning an array or pytree; jittable. Default: every site's coordinates and
        their squares, ``{"first": x, "second": x²}``.
    degree
        1 (Q linear) or 2 (Q quadratic, needs the unconstrained draws).
    by_chain
        Fit β and estimate per chain (leading chain axis); otherwise pooled.
    cross_fit
        Fit β on one half of each chain's draws and apply it to the other, then average:
        removes the O(1/M) bias of fitting on the same draws (worth it for short runs or many
        covariates, e.g. degree 2 with large d); costs some variance.
    ridge
        Ridge penalty on the standardised covariates (0: plain least squares).
    unconstrained
        g = the flat unconstrained θ and θ² instead of the constrained sites.
    mode
        ``"stored"`` (draws + gradients), ``"stream"`` (the statistics in the run's last
        state, ``zv_stats``) or ``"auto"`` (stored if the gradients were collected).
    data
        The model's data for the unconstrained draws and the streamed g (default: the run's).
    covariates
        Of degree 1: ``"gradient"`` (the d coordinates of ŝ, Eq. 13-14 as written; a dense
        d × d fit, refused above :data:`~numpyro_subsample.estimators.zv.MAX_ZV_COVARIATES`),
        ``"linearised"`` (one covariate per function, module docstring; needs the ``MCMC``
        run, not an InferenceData) or ``"auto"`` (gradient up to that d, else linearised).
        Streamed statistics hold the covariates of the kernel's ``ZVOptions.covariates``.

    Returns
    -------
    ZVResult
        ZV and raw means, their MCSEs, variance reductions and coefficients.

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Eq. 13-14, Algorithm 2; Papamarkou, Mira and
    Girolami (2014) (degree 2); Friel, Mira and Oates (2016).
    """
    check_degree(degree)
    check_covariate_name(covariates)
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}.")
    if mode not in ("auto", "stored", "stream"):
        raise ValueError(f"mode must be 'auto', 'stored' or 'stream', got {mode!r}.")
    if isinstance(source, az.InferenceData):
        if mode == "stream":
            raise ValueError("mode='stream' needs the MCMC object (the run's last state).")
        draws = draws_from_idata(source, fn, degree, unconstrained, covariates)
        check_covariates(draws.U.shape[-1], degree)
        return make_result(fit_draws(draws, by_chain, cross_fit, ridge), draws.unflatten,
                       by_chain, degree)
    _refuse_local(zv_kernel_of(source))
    data = run_data(source) if data is None else data
    draws = None
    if mode in ("auto", "stored"):
        draws = draws_from_mcmc(source, fn, degree, unconstrained, data, covariates)
        if draws is None and mode == "stored":
            raise ValueError("mode='stored' needs MCMC(..).run(..., extra_fields=('grad',)).")
    if draws is not None:
        if not draws.paired:
            check_covariates(draws.U.shape[-1], degree)
        return make_result(fit_draws(draws, by_chain, cross_fit, ridge), draws.unflatten,
                       by_chain, degree)
    if fn is not None or unconstrained:
        raise ValueError(
            "In streaming mode g is fixed when sampling: pass zv=ZVOptions(fn=...) to the "
            "kernel instead of fn (unconstrained=True is not available in streaming mode)."
        )
    if cross_fit:
        raise ValueError("cross_fit needs the stored draws (extra_fields=('grad',)).")
    stats, unflatten = _streamed(source, degree, data, covariates)
    if not isinstance(stats, ZVPairedStats):
        check_covariates(int(np.shape(stats.mean_u)[-1]), degree)
    return make_result(fit_stats(stats, by_chain, ridge), unflatten, by_chain, degree)


def _refuse_local(kernel: Any) -> None:
    """ZV needs ∇log π(θ) of the marginal posterior; with local latent sites the chain's
    gradient is that of the joint at the current local values."""
    try:
        pot = kernel.preprocessed.potential
    except (AttributeError, RuntimeError):  # not a package kernel, or not run yet
        return
    if pot.local:
        raise ValueError(
            f"ZV needs the gradient of the marginal posterior of the global sites; the model's "
            f"local latent sites {list(pot.local_sites)} inside the plate '{pot.plate.name}' "
            "give the chain only the joint's gradient at their current values. Use the plain "
            "means of the draws."
        )


def _streamed(mcmc, degree: int, data: ModelData, covariates: str,
              ) -> tuple[ZVStats | ZVPairedStats, Callable]:
    """The ZV statistics of the run's last state and the unflattener of the kernel's g."""
    kernel = zv_kernel_of(mcmc)
    stats = getattr(mcmc.last_state, "zv_stats", None)
    if stats is None:
        raise ValueError(
            "No gradients for ZV: run MCMC with extra_fields=('grad',), or build the kernel "
            "with zv=ZVOptions() to accumulate the statistics without storing the chain."
        )
    pot = kernel.potential
    if isinstance(stats, ZVPairedStats):
        streamed, kind = 1, "linearised"
    else:
        p = int(np.shape(stats.mean_u)[-1])
        streamed = next((k for k in (1, 2) if num_covariates(pot.dim, k) == p), None)
        kind = "gradient"
    if streamed != degree:
        raise ValueError(
            f"The streaming statistics were accumulated for degree={streamed}; pass "
            f"degree={streamed} or build the kernel with zv=ZVOptions(degree={degree})."
        )
    if covariates not in ("auto", kind):
        raise ValueError(
            f"The streaming statistics hold the {kind} covariates; pass covariates='{kind}' "
            f"(or 'auto'), or build the kernel with zv=ZVOptions(covariates={covariates!r})."
        )
    g = getattr(kernel, "zv_fn", None) or default_g
    _, unflatten = flat_fn(lambda z: g(pot.constrain(z, data)), pot.unravel(pot.init_theta))
    return stats, unflatten


def zv_mean(
    source: Any,
    fn: Callable[[dict], Any] | None = None,
    degree: int = 1,
    **kwargs: Any,
) -> Any:
    """ZV-corrected posterior means (Baker et al. 2019, Eq. 14): dict site → mean by default.

    With ``fn`` the result has fn's output structure. Keyword arguments as :func:`zv_fit`
    (``by_chain``, ``cross_fit``, ``ridge``, ``unconstrained``, ``mode``, ``data``,
    ``covariates``).

    Parameters
    ----------
    source
        A run or InferenceData, as for :func:`zv_fit`.
    fn
        g of a constrained sample (default: every site).
    degree
        1 or 2.
    **kwargs
        As :func:`zv_fit`.

    Returns
    -------
    dict or pytree
        The ZV means.

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Eq. 13-14; Mira, Solgi and Imparato (2013).
    """
    res = zv_fit(source, fn, degree, **kwargs)
    if fn is None:
        return dict(res.mean["first"])
    return res.mean


# --- ArviZ --------------------------------------------------------------------------------------
def _flat_names(name: str, shape: tuple) -> list[str]:
    if not shape:
        return [name]
    return [f"{name}[{', '.join(map(str, ix))}]" for ix in np.ndindex(*shape)]


def _zv_dataset(res: ZVResult) -> xr.Dataset:
    """Per-site statistics (mean, var, ... over the ``zv_stat`` axis) from a default-g result."""
    data = {}
    for k in res.mean["first"]:
        m1, m2 = np.asarray(res.mean["first"][k]), np.asarray(res.mean["second"][k])
        r1, r2 = np.asarray(res.raw_mean["first"][k]), np.asarray(res.raw_mean["second"][k])
        rows = [m1, np.maximum(m2 - m1**2, 0.0), r1, np.maximum(r2 - r1**2, 0.0),
                np.asarray(res.mcse_mean["first"][k]), np.asarray(res.raw_mcse_mean["first"][k]),
                np.asarray(res.variance_reduction["first"][k])]
        arr = np.stack(rows)
        dims = ["zv_stat"] + [f"{k}_dim_{j}" for j in range(arr.ndim - 1)]
        data[k] = (dims, arr)
    ds = xr.Dataset(data, coords={"zv_stat": list(_STATS)})
    ds.attrs["zv_degree"] = int(res.degree)
    return ds


def add_zv_groups(
    idata: az.InferenceData, mcmc, degree: int = 1, data: ModelData | None = None
) -> az.InferenceData:
    """Add ``zv_posterior`` (ZV means/variances) and ``unconstrained_posterior`` to idata.

    ``zv_posterior`` holds, per site, the statistics ``zv_stat`` = mean, var (ZV-corrected, from
    the ZV means of x and x²), raw_mean, raw_var, mcse_mean, raw_mcse_mean and
    variance_reduction (Var g / Var g̃ per draw, for g = x). ``data``: the model's data
    (default: those of the run).
    """
    kernel = zv_kernel_of(mcmc)
    data = run_data(mcmc) if data is None else data
    extra = mcmc.get_extra_fields()
    if "grad" in extra:
        theta = unconstrained_draws(mcmc, data)
        C, D = theta.shape[:2]
        unc = jax.vmap(kernel.potential.unravel)(jnp.asarray(theta.reshape(C * D, -1)))
        ds = xr.Dataset({
            k: (["chain", "draw"] + [f"{k}_unc_dim_{j}" for j in range(v.ndim - 1)],
                np.asarray(v).reshape((C, D) + v.shape[1:]))
            for k, v in unc.items()
        })
        if "unconstrained_posterior" not in idata.groups():
            idata.add_groups(unconstrained_posterior=ds)
        if covariate_choice("auto", degree, kernel.potential.dim) == "linearised":
            res = zv_fit(mcmc, degree=degree, data=data)
        else:
            res = zv_fit(idata, degree=degree)
    else:
        res = zv_fit(mcmc, degree=degree, mode="stream", data=data)
    if ZV_GROUP in idata.groups():
        del idata[ZV_GROUP]
    idata.add_groups({ZV_GROUP: _zv_dataset(res)})
    return idata


def zv_summary(idata: az.InferenceData, degree: int | None = None, **kwargs: Any) -> pd.DataFrame:
    """A table like ``az.summary``: raw and ZV means, their MCSEs, sds, variance reduction.

    Computed from ``sample_stats.grad`` when present (keyword arguments as :func:`zv_fit`)
    and the gradient covariates apply, else read from the ``zv_posterior`` group (streaming
    mode: no MCSEs; the linearised covariates of :func:`to_arviz` ``zv=True`` above
    ``MAX_ZV_COVARIATES`` parameters).

    Parameters
    ----------
    idata
        InferenceData from :func:`to_arviz`.
    degree
        1 or 2 (default: as stored).
    **kwargs
        As :func:`zv_fit`.

    Returns
    -------
    pandas.DataFrame
        One row per coordinate.

    References
    ----------
    Baker, Fearnhead, Fox and Nemeth (2019), Sect. 4.
    """
    has_grad = "sample_stats" in idata.groups() and "grad" in idata.sample_stats
    if degree is None:
        degree = int(idata[ZV_GROUP].attrs.get("zv_degree", 1)) if ZV_GROUP in \
            idata.groups() else 1
    if has_grad and not (ZV_GROUP in idata.groups() and covariate_choice(
            kwargs.get("covariates", "auto"), degree,
            idata.sample_stats["grad"].shape[-1]) == "linearised"):
        ds = _zv_dataset(zv_fit(idata, degree=degree, **kwargs))
    elif ZV_GROUP in idata.groups():
        ds = idata[ZV_GROUP]
    else:
        raise ValueError(
            "No ZV information: collect extra_fields=('grad',) or use to_arviz(mcmc, zv=True)."
        )
    rows, index = [], []
    for k in ds.data_vars:
        arr = np.asarray(ds[k].values)
        shape = arr.shape[1:]
        stat = {s: arr[i].reshape(-1) for i, s in enumerate(ds.zv_stat.values)}
        for j, name in enumerate(_flat_names(k, shape)):
            index.append(name)
            rows.append({
                "mean": stat["raw_mean"][j],
                "zv_mean": stat["mean"][j],
                "mcse_mean": stat["raw_mcse_mean"][j],
                "zv_mcse_mean": stat["mcse_mean"][j],
                "sd": np.sqrt(stat["raw_var"][j]),
                "zv_sd": np.sqrt(stat["var"][j]),
                "variance_reduction": stat["variance_reduction"][j],
            })
    return pd.DataFrame(rows, index=index)
