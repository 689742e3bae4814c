"""HMC with energy-conserving subsampling (Dang et al. 2019; Rønning and Hamelryck 2021) for
NumPyro models: the thin adapter over the functional core of :mod:`~numpyro_subsample.ecs.chain`.

Preprocessing, once per data set: a posterior proxy N(θ̂, Σ̂) (``proxy=``, as for every kernel
of the package), a proxy of the per-datum log-likelihood around it (``likelihood_proxy=``,
:mod:`~numpyro_subsample.ecs.likelihood_proxies`) and the selection law of the subsample
(:mod:`~numpyro_subsample.ecs.difference`). Their arrays travel in the chain state's ``params``.

Extra fields per draw: ``sigma2`` (σ̂² at the draw), ``index_accept_prob``, ``accept_prob``
(HMC), ``num_steps``, ``diverging``, ``loglik_estimate`` (l̂ − Σ_i a_i).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_subsample.core.adapter import SubsampleKernel, preprocess_keys, resolve_progress
from numpyro_subsample.core.datapass import DEFAULT_CHUNK
from numpyro_subsample.core.options import check_options, suggest_keywords
from numpyro_subsample.core.potential import ModelData, Potential
from numpyro_subsample.core.rng import STEP_RNG
from numpyro_subsample.ecs import likelihood_proxies as lik
from numpyro_subsample.ecs.chain import ECSConfig, ECSParams, ECSState, chain_programs
from numpyro_subsample.ecs.difference import (
    MAX_SIGMA2,
    SIGMA2_DRAWS,
    loglik_estimates,
    preferential_selection,
    uniform_selection,
    variance_at_proxy_draws,
)
from numpyro_subsample.ecs.options import (
    LEGACY_ECS_KEYWORDS,
    HMCOptions,
    LikelihoodOptions,
    PreferentialOptions,
    legacy_ecs_records,
    numpyro_hmc_options,
)
from numpyro_subsample.proxies.base import Proxy, ProxyFitWarning
from numpyro_subsample.proxies.choice import fit_kernel_structured, structured_choice
from numpyro_subsample.proxies.laplace import LaplaceFitError, fit_laplace
from numpyro_subsample.proxies.structured import StructuredProxy
from numpyro_subsample.proxies.whitening import Scale, is_structured

__all__ = ["EnergyConservingHMC", "ECSState", "ECSParams", "ECSPreprocessed"]

_OLD_PROXIES = {"taylor": ("laplace", "taylor"), "hybrid": ("variational", "hybrid")}


def _divisor(m: int) -> int:
    """The largest divisor of m up to 100 (a suggestion for num_blocks)."""
    return max(g for g in range(1, min(m, 100) + 1) if m % g == 0)


def _check_variance(s2: np.ndarray, m: int, num_data: int, spec) -> None:
    """Warn when the median σ̂² at proxy draws exceeds :data:`MAX_SIGMA2` (or is not finite)."""
    med = float(np.median(s2))
    if med <= MAX_SIGMA2:
        return
    need = m * med if np.isfinite(med) else np.inf
    better = (f" (σ̂² ∝ 1/m: m ≈ {int(np.ceil(need))} gives σ̂² ≈ 1)" if need < num_data
              else f" (σ̂² ∝ 1/m: no m below N = {num_data} gets σ̂² near 1)")
    order2 = ("" if spec == ("taylor", 2) else
              "; likelihood_proxy='taylor' with taylor_order=2 (a dense proxy)")
    warnings.warn(
        f"EnergyConservingHMC: the difference estimator's variance σ̂² at {s2.size} proxy draws has "
        f"median {med:.3g} (range {np.min(s2):.3g}-{np.max(s2):.3g}) with m = {m} and the "
        f"{spec.kind} likelihood proxy of order {spec.order}, above MAX_SIGMA2 = {MAX_SIGMA2}: "
        "the subsample updates will rarely be accepted and the ½σ̂² correction is inexact, so "
        f"the draws may be biased. Raise subsample_size{better}{order2}; or use an SG kernel.",
        ProxyFitWarning, stacklevel=4,
    )


#: The remedy of a refused Laplace fit for this kernel: its target is perturbed by the proxy's
#: error (the difference estimator's variance grows with it), so the SG kernels' remedies (a
#: variational start adapted on pilot chains) do not carry over.
LAPLACE_REMEDY = (
    "This kernel needs a proxy close to the posterior everywhere the chain goes (the subsample "
    "estimator's perturbation of its target grows with the proxy's error): a variational proxy "
    "of a model whose joint mode degenerates has been measured 1.9 posterior sd off "
    "(benchmarks/RESULTS.md, bench_models.py). Sample such a model with SGHMC(model) or "
    "SGLD(model), whose default adapts its proxy on pilot chains, or give these sites stronger "
    "priors."
)


class ECSPreprocessed(NamedTuple):
    """Everything computed once per data set before sampling."""

    potential: Potential
    proxy: Proxy | StructuredProxy
    spec: lik.LikelihoodSpec
    subsample_size: int
    seconds: float
    data_passes: float
    info: dict
    params: ECSParams

    @property
    def centre(self) -> jax.Array:
        """θ_ref, the centre of the whitening θ = θ_ref + L w."""
        return self.params.likelihood.ref

    @property
    def scale_tril(self) -> Scale:
        """L (dense triangular, or the structured operator of a structured proxy)."""
        return self.params.likelihood.tril


class EnergyConservingHMC(SubsampleKernel):
    """HMC/NUTS with energy-conserving subsampling and a difference estimator of the
    log-likelihood (Rønning and Hamelryck 2021).

    Parameters
    ----------
    model
        A NumPyro model with its likelihood in ``numpyro.plate(name, N, subsample_size=m)``;
        m is the subsample size of the estimator.
    proxy
        The posterior proxy N(θ̂, Σ̂): ``"laplace"`` (mode and inverse Hessian; above
        :data:`~numpyro_subsample.proxies.choice.MAX_DENSE_DIM` parameters the structured
        ``"low-rank"`` one), ``"diagonal"`` or ``"low-rank"`` (matrix-free,
        :func:`~numpyro_subsample.proxies.structured.fit_structured`; only the first-order
        Taylor likelihood proxy then, no d × d array), ``"variational"`` (an autoguide fitted
        by SVI; ``guide=``, ``guide_params=`` in ``proxy_kwargs``) or a
        :class:`~numpyro_subsample.proxies.base.Proxy` /
        :class:`~numpyro_subsample.proxies.structured.StructuredProxy`. The spellings
        ``"taylor"`` and ``"hybrid"`` of earlier releases are deprecated (they mean
        ``proxy="laplace"`` and ``proxy="variational"`` with that ``likelihood_proxy``).
    likelihood_proxy
        q_i ≈ ℓ_i: ``"taylor"`` (at θ̂; Dang et al. 2019), ``"hybrid"`` (the L²(q) projection,
        q = the proxy) or ``"variational"`` (E_q[ℓ_i]; Rønning and Hamelryck 2021, Eq. 2-4).
        Default: ``"taylor"`` for a Laplace proxy, ``"hybrid"`` for a variational one.
    likelihood
        A :class:`~numpyro_subsample.ecs.options.LikelihoodOptions`: the orders of the Taylor
        and hybrid likelihood proxies and the draws of q (default ``LikelihoodOptions()``).
    num_blocks
        G, blocks of u; one block is redrawn per iteration (default 10; m must be a multiple).
    subsample_size
        m, overriding the model's plate subsample size.
    selection
        ``"preferential"`` (default; Hansen-Hurwitz, p_i ∝ the scale of the proxy error,
        mixed with the uniform law as ``preferential`` says) or ``"uniform"`` (the paper's
        estimator, no extra preprocessing pass).
    preferential
        A :class:`~numpyro_subsample.ecs.options.PreferentialOptions`: the uniform share and
        the proxy draws of the preferential weights (default ``PreferentialOptions()``).
    hmc
        A :class:`~numpyro_subsample.ecs.options.HMCOptions`: NumPyro's HMC/NUTS options
        (default ``HMCOptions()``, NUTS).
    proxy_kwargs
        Options of :func:`~numpyro_subsample.proxies.laplace.fit_laplace` or
        :func:`~numpyro_subsample.proxies.variational.fit_variational`.
    chunk_size
        Data per vmapped evaluation in full-data passes.
    seed
        Seed of the preprocessing, done once per data set.
    progress_bar
        Progress bars of the preprocessing (proxy fit). Default None: those of the
        package's ``MCMC`` running the kernel follow its ``progress_bar``; otherwise on, off
        under CI.
    **deprecated
        The keywords of the previous release that these records replace (``algo``,
        ``step_size``, ``adapt_step_size``, ``adapt_mass_matrix``, ``dense_mass``,
        ``target_accept_prob``, ``max_tree_depth``, ``trajectory_length``, ``num_steps``,
        ``taylor_order``, ``hybrid_order``, ``num_mc_draws``, ``uniform_mix``,
        ``num_selection_draws``), accepted with a ``DeprecationWarning`` naming the record.

    Examples
    --------
    ::

        kernel = EnergyConservingHMC(model, proxy="laplace", num_blocks=10)
        mcmc = MCMC(kernel, num_warmup=500, num_samples=1000)
        mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("sigma2", "index_accept_prob"))

    References
    ----------
    Rønning and Hamelryck (2021), Eq. 1-4; Dang et al. (2019).
    """

    sample_field = "z"

    @suggest_keywords(deprecated=tuple(LEGACY_ECS_KEYWORDS))
    def __init__(
        self,
        model: Callable,
        *,
        proxy: str | Proxy | StructuredProxy = "laplace",
        likelihood_proxy: str | None = None,
        likelihood: LikelihoodOptions | None = None,
        num_blocks: int = 10,
        subsample_size: int | None = None,
        selection: str = "preferential",
        preferential: PreferentialOptions | None = None,
        hmc: HMCOptions | None = None,
        proxy_kwargs: dict | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        seed: int = 0,
        progress_bar: bool | None = None,
        **deprecated: Any,
    ) -> None:
        if isinstance(proxy, str) and proxy in _OLD_PROXIES:
            new, kind = _OLD_PROXIES[proxy]
            warnings.warn(
                f"EnergyConservingHMC(proxy={proxy!r}) is deprecated: proxy= now names the "
                f"posterior proxy, as for every kernel; pass proxy={new!r}, "
                f"likelihood_proxy={kind!r}.", DeprecationWarning, stacklevel=2,
            )
            if likelihood_proxy is None:
                likelihood_proxy = kind
            proxy = new
        records = legacy_ecs_records("EnergyConservingHMC", deprecated, hmc=hmc,
                                     likelihood=likelihood, preferential=preferential)
        check_options(
            "EnergyConservingHMC", likelihood_proxy=likelihood_proxy, num_blocks=num_blocks,
            subsample_size=subsample_size, selection=selection, proxy_kwargs=proxy_kwargs,
            chunk_size=chunk_size, seed=seed, progress_bar=progress_bar,
            **({} if isinstance(proxy, (Proxy, StructuredProxy)) else {"proxy": proxy}),
        )
        if subsample_size is not None and subsample_size % num_blocks:
            raise ValueError(
                f"EnergyConservingHMC: subsample_size={subsample_size} is not a multiple of "
                f"num_blocks={num_blocks}; pass num_blocks dividing it (e.g. "
                f"{_divisor(subsample_size)}) or change subsample_size."
            )
        super().__init__(model, seed=seed)
        self._proxy_spec = proxy
        self.likelihood_proxy = likelihood_proxy
        self.num_blocks = int(num_blocks)
        self._subsample_size = subsample_size
        self.selection = selection
        self.hmc, self.likelihood = records["hmc"], records["likelihood"]
        self.preferential = records["preferential"]
        self.hmc_options = numpyro_hmc_options(self.hmc)
        self.proxy_kwargs = dict(proxy_kwargs or {})
        self.chunk_size = int(chunk_size)
        self.progress_bar = progress_bar

    @property
    def algo(self) -> str:
        """``"NUTS"`` or ``"HMC"`` (:class:`~numpyro_subsample.ecs.options.HMCOptions`)."""
        return self.hmc.algo

    # -- properties users read ----------------------------------------------------------------
    @property
    def default_fields(self) -> tuple[str, ...]:
        return ("z", "diverging")

    @property
    def proxy(self) -> Proxy | StructuredProxy:
        """The posterior proxy: ``proxy.centre`` (θ̂, flat unconstrained), ``proxy.cov`` (or
        ``proxy.cov_op`` of a structured proxy)."""
        return self.preprocessed.proxy

    def get_diagnostics_str(self, state: ECSState) -> str:
        hs = state.hmc_state
        return (
            f"{hs.num_steps} steps of size {hs.adapt_state.step_size:.2e}. "
            f"acc. prob={hs.mean_accept_prob:.2f} "
            f"sigma2={float(np.asarray(state.sigma2).mean()):.2f}"
        )

    # -- preprocessing --------------------------------------------------------------------------
    def _likelihood_spec(self, proxy: Proxy | StructuredProxy) -> lik.LikelihoodSpec:
        kind = self.likelihood_proxy
        if kind is None:
            kind = "hybrid" if proxy.kind == "variational" else "taylor"
        taylor = self.likelihood.taylor_order
        if taylor is None:
            taylor = 1 if is_structured(proxy) else 2
        order = {"taylor": taylor, "hybrid": self.likelihood.hybrid_order}.get(kind, 0)
        return lik.LikelihoodSpec(kind=kind, order=order)

    def _fit_proxy(self, potential: Potential, data: ModelData, key,
                   ) -> Proxy | StructuredProxy:
        proxy = self._proxy_spec
        structure = structured_choice(proxy, potential.dim)
        if structure is not None:
            return fit_kernel_structured(
                potential, data, key, structure, self.proxy_kwargs,
                laplace_requested=proxy == "laplace", chunk_size=self.chunk_size,
                store_datum_grads=False, progress=resolve_progress(self.progress_bar),
                label="EnergyConservingHMC",
            )
        opts = dict(chunk_size=self.chunk_size, store_datum_grads=False,
                    progress=resolve_progress(self.progress_bar), **self.proxy_kwargs)
        opts.setdefault("check_chain", False)  # the run's own checks judge the chain
        if isinstance(proxy, (Proxy, StructuredProxy)):
            if proxy.centre.shape != (potential.dim,):
                raise ValueError(
                    f"The given proxy has centre shape {tuple(proxy.centre.shape)}; the model "
                    f"has {potential.dim} unconstrained dimensions. Pass a proxy fitted to "
                    "this model."
                )
            return proxy
        if proxy == "variational":
            from numpyro_subsample.proxies.variational import fit_variational

            return fit_variational(potential, data, key, **opts)
        try:
            return fit_laplace(potential, data, key, **opts)
        except LaplaceFitError as err:
            raise err.with_remedy(
                LAPLACE_REMEDY, prefix="EnergyConservingHMC could not fit its Laplace proxy. "
            ) from err

    def _preprocess(self, potential: Potential, data: ModelData) -> ECSPreprocessed:
        t0 = time.perf_counter()
        _, k_proxy, k_mc, k_sel = preprocess_keys(self.seed)
        m = int(self._subsample_size or potential.plate.subsample_size)
        if not 2 <= m <= potential.num_data:
            raise ValueError(
                f"subsample_size must be between 2 and N={potential.num_data}, got m={m}."
            )
        if m % self.num_blocks:
            raise ValueError(
                f"The subsample size m={m} is not a multiple of num_blocks={self.num_blocks}; "
                f"pass num_blocks dividing m (e.g. {_divisor(m)}) or change subsample_size."
            )
        proxy = self._fit_proxy(potential, data, k_proxy)
        spec = self._likelihood_spec(proxy)
        S = self.likelihood.num_mc_draws
        if S is None:
            S = max(64, 2 * potential.dim) if spec == ("hybrid", 2) else 64
        lp, passes, info = lik.fit_likelihood_proxy(
            potential, data, proxy, spec, k_mc, num_mc_draws=S + S % 2,
            chunk_size=self.chunk_size,
        )
        if self.selection == "uniform":
            sel, sel_passes, sel_info = uniform_selection(), 0.0, {}
        else:
            sel, sel_passes, sel_info = preferential_selection(
                potential, spec, lp, data, k_sel,
                num_draws=self.preferential.num_draws,
                uniform_mix=self.preferential.uniform_mix,
                chunk_size=self.chunk_size,
            )
        info.update(sel_info)
        s2 = np.asarray(variance_at_proxy_draws(potential, spec, m, SIGMA2_DRAWS, lp, sel, k_sel,
                                                data),
                        np.float64)
        info["sigma2_at_proxy_draws"] = s2
        _check_variance(s2, m, potential.num_data, spec)
        return ECSPreprocessed(
            potential=potential, proxy=proxy, spec=spec, subsample_size=m,
            seconds=time.perf_counter() - t0,
            data_passes=float(proxy.num_data_passes + passes + sel_passes), info=info,
            params=ECSParams(likelihood=lp, selection=sel),
        )

    # -- the functional core --------------------------------------------------------------------
    def _programs(self, pre: ECSPreprocessed, *, num_warmup: int, traced: bool):
        cfg = ECSConfig(
            potential=pre.potential, spec=pre.spec, subsample_size=pre.subsample_size,
            num_blocks=self.num_blocks, algo=self.algo,
            hmc_options=tuple(sorted(self.hmc_options.items())), num_warmup=int(num_warmup),
            rng_impl="threefry2x32" if traced else STEP_RNG,
        )
        init_one, step = chain_programs(cfg)
        return init_one, step, pre.params

    def _state_axes(self) -> ECSState:
        return ECSState(**dict.fromkeys(ECSState._fields, 0))._replace(params=None)

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        state = super().init(rng_key, num_warmup, init_params, model_args, model_kwargs)
        pe = state.hmc_state.potential_energy
        if not isinstance(pe, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(pe))):
            raise ValueError(
                "The potential energy of the subsampled target is not finite at the initial "
                "position; check the model, the data and init_params."
            )
        return state

    # -- the estimator at given states ----------------------------------------------------------
    def _data(self, data: ModelData | None) -> ModelData:
        return self.preprocessed_data if data is None else data

    def loglik_estimates(
        self, theta: jax.Array, rng_key: jax.Array, num_subsamples: int = 100,
        data: ModelData | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """l̂(θ; u) − Σ_i a_i and σ̂²(θ; u) for ``num_subsamples`` fresh subsamples (jittable).

        The mean of σ̂² estimates Var_u[l̂(θ)], which the pseudo-marginal step needs to be
        about 1 or less. ``data``: the preprocessed data by default.
        """
        pre = self.preprocessed
        lp, sel = pre.params
        return loglik_estimates(pre.potential, pre.spec, pre.subsample_size,
                                int(num_subsamples), lp, sel, theta, rng_key, self._data(data))

    def proxy_constant(self, data: ModelData | None = None) -> jax.Array:
        """A = Σ_i a_i, the constant left out of ``loglik_estimate`` (one data pass)."""
        pre = self.preprocessed
        return lik.proxy_constant(pre.potential, pre.spec, pre.params.likelihood,
                                  self._data(data), self.chunk_size)

    def proxy_total(self, theta: jax.Array, data: ModelData | None = None) -> jax.Array:
        """Σ_i q_i(θ) of the likelihood proxy, constant and (variational) G(θ) included
        (:func:`~numpyro_subsample.ecs.likelihood_proxies.proxy_total`)."""
        pre = self.preprocessed
        if pre.spec.kind == "variational" and not pre.proxy.info.get("gaussian", True):
            raise ValueError(
                "proxy_total for likelihood_proxy='variational' needs a Gaussian proxy."
            )
        return lik.proxy_total(pre.potential, pre.spec, pre.params.likelihood, theta,
                               self._data(data), pre.info.get("draws"), self.chunk_size)
