"""HMC with energy-conserving subsampling (Dang et al. 2019) with Taylor or variational proxies.

Notation of paper 003 ("Perturbed method"): ℓ_i(θ) = log p(x_i | θ) = −f_i(θ), a proxy
q_i(θ) ≈ ℓ_i(θ), a subsample u = (u_1, …, u_m) drawn uniformly with replacement, and

    l̂(θ; u) = Σ_i q_i(θ) + (N/m) Σ_j d_{u_j}(θ),   d_i = ℓ_i − q_i          (difference estimator)
    σ̂²(θ; u) = (N²/m) s²_u(d)                                             (its variance)

with s²_u the sample variance (ddof = 1) of d over the subsample. HMC (NumPyro's own ``hmc``
with NUTS or static HMC, step size and mass matrix adapted during warm-up) targets
π(θ) exp(l̂ − σ̂²/2) for fixed u (the bias correction of Eq. 1, Ceperley-Dewing / Quiroz et al.);
u is updated between HMC steps by a block-Gibbs Metropolis step (correlated pseudo-marginal,
Tran et al.): one of ``num_blocks`` blocks of u is redrawn and accepted with probability
min(1, exp(l̂' − σ̂'²/2 − l̂ + σ̂²/2)), exactly as in ``numpyro.infer.HMCECS``.

Every proxy here has the form  q_i(θ) = a_i + b_iᵀΔ + ½ ΔᵀC_iΔ (+ a shared term, see below),
Δ = θ − θ_ref, with sums A = Σa_i (a constant, dropped from the energy), B = Σb_i, C = ΣC_i:

- ``"taylor"`` (Dang et al.; paper 003 "Perturbed method"): θ_ref = posterior mode θ̂ (Laplace
  proxy), a_i = ℓ_i(θ̂), b_i = ∇ℓ_i(θ̂) and, for ``taylor_order=2``, C_i = ∇²ℓ_i(θ̂). The
  per-datum terms are computed only for the indices in u (at each block update) — no N·d or
  N·d² tables; B and C come from one chunked data pass.
- ``"variational"`` (paper 003 Eq. 2-4): q_i(θ) = e_i + G(θ)/N with e_i = E_q[ℓ_i(φ)] and the
  *global* ELBO terms G(θ) = E_q[log π(φ)] − E_q[log q(φ)] + log q(θ) − log π(θ).
  Derivation of the sharing: Eq. 2 + Eq. 3 give log p(x | θ) ≈ ELBO + log q(θ) − log π(θ)
  = Σ_i e_i + G(θ); the only split that makes Σ_i q_i equal this total while giving every
  datum the same θ-dependence is G/N per datum (Eq. 4 as printed would count G N times).
  Then d_i = ℓ_i − e_i − G/N, and in l̂ the G of Σ_i q_i cancels exactly against the
  (N/m)·m·G/N of the subsample, and a constant shift leaves s²_u(d) unchanged:

      l̂(θ; u) = Σ_i e_i + (N/m) Σ_j [ℓ_{u_j}(θ) − e_{u_j}],  σ̂² = (N²/m) s²_u(ℓ − e).

  So the variational proxy acts as the θ-free control variate e_i, whatever q is; this is the
  "fails to incorporate the state of the Markov chain" of paper 003, and σ̂² grows like
  N·d/m (d_i varies with θ at first order). The code uses this cancelled form (G only enters
  :meth:`EnergyConservingHMC.proxy_total`, a diagnostic). e_i is precomputed once by Monte
  Carlo over S draws of the fitted guide (moment-matched antithetic normal draws for Gaussian
  guides), chunked over data and draws: memory O(N + chunk·S).
- ``"hybrid"``, ``hybrid_order=1``: q_i(θ) = e_i + ḡ_iᵀ(θ − μ), ḡ_i = E_q[∇ℓ_i(φ)] — the
  variational expectation plus a first-order correction at the current state: the first-order
  Taylor expansion, at the guide mean μ, of the q-smoothed likelihood ℓ̄_i(μ') =
  E_{N(μ',Σ)}[ℓ_i] (Bonnet's theorem: ∇_μ ℓ̄_i = E_q[∇ℓ_i]). An (N, d) table (memory O(N·d)).
- ``"hybrid"``, ``hybrid_order=2`` (default): the L²(q)-orthogonal projection of ℓ_i onto
  quadratics. In whitened coordinates z (θ = μ + L z, z ~ N(0, I) under a Gaussian guide) the
  Hermite expansion truncated at degree 2 is
      q_i(z) = E[ℓ_i] + E[∇ℓ_i]ᵀz + ½ zᵀE[∇²ℓ_i]z − ½ tr E[∇²ℓ_i],
  (Stein's lemma: the Hermite coefficients of degree k are E_q[∇^kℓ_i]); it minimises
  E_q[(ℓ_i − q_i)²] over all quadratics, Taylor-2 at the mode included, so when q is close to
  the posterior it gives the smallest E_π[d_i²] and hence (about) the smallest σ̂² at posterior
  draws. The −½ tr term matters: without it, the "smoothed" expansion E[ℓ_i] + … carries the
  datum-dependent offset ½ tr(Σ∇²ℓ_i) into d_i. E[∇²ℓ_i] = E[∇ℓ_i zᵀ] (Stein again) needs only
  gradients; all three moments use S moment-matched antithetic draws z_s shared by all data and
  are computed on the fly for the indices of u (memory O(S·d) per datum, no tables; cost
  S gradients per new datum), the sums from S full-data gradient passes with the same draws.

Selection (``selection=``): ``"uniform"`` (with replacement, as in the paper), or
``"preferential"`` — Hansen-Hurwitz: u_j i.i.d. with P(u_j = i) = p_i, p_i ∝ (1 − λ) s_i / Σs +
λ/N with s_i = rms of d_i(θ_s) over ``num_selection_draws`` proxy draws (λ = ``uniform_mix``,
0.05, so every p_i > 0), drawn in O(1) by a Walker alias table. With y_j = d_{u_j}/p_{u_j}:
l̂ = Σ_i q_i + (1/m)Σ_j y_j, Var_u[l̂] = (1/m)(Σ_i d_i²/p_i − (Σ_i d_i)²), estimated without bias
by σ̂² = s²_u(y)/m; the bias correction of Eq. 1 is exp(−σ̂²/2) with this σ̂². The block-Gibbs
step proposes new blocks from the same law p (independence proposal from the prior of u), so its
acceptance ratio keeps the form exp(l̂' − σ̂'²/2 − l̂ + σ̂²/2).

The chain runs in coordinates whitened by the proxy (θ = θ_ref + L w), so NUTS starts with a
sensible metric; the mass matrix is still adapted in warm-up.

Extra fields per draw: ``sigma2`` (σ̂² at the draw), ``index_accept_prob``,
``accept_prob`` (HMC), ``num_steps``, ``diverging``, ``loglik_estimate`` (l̂ − A).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer.hmc import hmc

from numpyro_subsample.core.datapass import DEFAULT_CHUNK, chunk_indices, map_data, value_grad_hessian
from numpyro_subsample.sgmcmc.kernel import PreprocessedKernel, _default_progress, _same_args
from numpyro_subsample.core.potential import Potential, _set_plate_indices, build_potential, check_data_finite
from numpyro_subsample.estimators.preferential import AliasTable, alias_draw, build_alias_table, mix_with_uniform
from numpyro_subsample.proxies.laplace import Proxy, fit_laplace

__all__ = ["EnergyConservingHMC", "ECSState", "ECSPreprocessed", "variational_expectations"]

PROXIES = ("taylor", "variational", "hybrid")
SELECTIONS = ("uniform", "preferential")


class ECSState(NamedTuple):
    """State of :class:`EnergyConservingHMC`.

    ``z``: unconstrained latent values (dict); ``hmc_state``: NumPyro's ``HMCState`` on the
    whitened position w; ``idx``: the subsample u (m,); ``aux``: the proxy's per-datum terms
    for u (``a`` (m,), ``b`` (m, d) or (m, 0), ``c`` (m, d, d) or (m, 0, 0), in whitened
    coordinates, and ``r`` (m,) = 1/(N p_i), 1 for uniform selection); ``sigma2``: σ̂² at
    the current draw; ``index_accept_prob``; ``accept_prob``, ``num_steps``, ``diverging``: of
    the HMC step; ``loglik_estimate``: l̂ without the constant Σa_i.
    """

    i: jax.Array
    z: dict
    hmc_state: Any
    idx: jax.Array
    aux: tuple
    sigma2: jax.Array
    loglik_estimate: jax.Array
    index_accept_prob: jax.Array
    accept_prob: jax.Array
    num_steps: jax.Array
    diverging: jax.Array
    rng_key: jax.Array


class ECSPreprocessed(NamedTuple):
    """Everything computed once: potential, proxy, reference point, whitening, sums, tables."""

    potential: Potential
    proxy: Proxy
    kind: str
    ref: jax.Array  # θ_ref (d,)
    tril: jax.Array  # L (d, d)
    sum_b: jax.Array  # Lᵀ B (d,)
    sum_c: jax.Array  # Lᵀ C L (d, d) or (0, 0)
    datum_aux: Callable[[jax.Array], tuple]  # idx (k,) -> (a, b, c, r) whitened, for new blocks
    subsample_size: int
    seconds: float
    data_passes: float
    info: dict
    table: AliasTable | None = None  # preferential selection law (None: uniform)


def _moment_matched_normal(key: jax.Array, S: int, d: int) -> jax.Array:
    """S antithetic standard-normal draws (S even) with sample mean 0 and covariance I exactly.

    With common draws for all data, the Monte Carlo error of e_i = E_q[ℓ_i] then has no
    first- or second-order term in φ − μ (odd moments vanish by symmetry, the second moments
    are exact), which matters because that error enters σ̂² multiplied by N²/m.
    """
    half = jax.random.normal(key, (S // 2, d))
    cov = half.T @ half / (S // 2)
    chol = jnp.linalg.cholesky(cov + 1e-9 * jnp.eye(d))
    half = jax.scipy.linalg.solve_triangular(chol, half.T, lower=True).T
    return jnp.concatenate([half, -half], 0)


def variational_expectations(
    potential: Potential,
    draws: jax.Array,
    *,
    grads: bool = False,
    chunk_size: int = DEFAULT_CHUNK,
    draw_chunk: int = 16,
) -> tuple[jax.Array, jax.Array | None]:
    """e_i = mean_s ℓ_i(φ_s) (N,) and, if ``grads``, ḡ_i = mean_s ∇ℓ_i(φ_s) (N, d).

    Chunked over data (``chunk_size``) and over draws (``draw_chunk``): memory
    O(N + chunk_size·draw_chunk) (plus the (N, d) output for ``grads``).
    """
    S, d = draws.shape
    pad = (-S) % draw_chunk
    w = jnp.concatenate([jnp.ones(S), jnp.zeros(pad)]) / S
    phis = jnp.concatenate([draws, jnp.broadcast_to(draws[:1], (pad, d))], 0)
    phis = phis.reshape(-1, draw_chunk, d)
    w = w.reshape(-1, draw_chunk).astype(draws.dtype)
    idx_chunks, _ = chunk_indices(potential.num_data, chunk_size)

    def loglik(t, idx):
        return -potential.data_terms(t, idx)

    def on_chunk(idx):
        def over_draws(acc, xs):
            ph, ww = xs
            if grads:
                vals = jax.vmap(lambda t: loglik(t, idx))(ph)  # (D, c)
                g = jax.vmap(
                    lambda t: jax.vmap(jax.grad(lambda tt, i: loglik(tt, i[None])[0]),
                                       in_axes=(None, 0))(t, idx)
                )(ph)  # (D, c, d)
                return (acc[0] + ww @ vals, acc[1] + jnp.einsum("s,scd->cd", ww, g)), None
            vals = jax.vmap(lambda t: loglik(t, idx))(ph)
            return (acc[0] + ww @ vals, acc[1]), None

        init = (jnp.zeros(idx.shape, draws.dtype),
                jnp.zeros((idx.shape[0], d if grads else 0), draws.dtype))
        return jax.lax.scan(over_draws, init, (phis, w))[0]

    e, g = jax.lax.map(on_chunk, idx_chunks)
    N = potential.num_data
    e = e.reshape(-1)[:N]
    g = g.reshape(-1, g.shape[-1])[:N] if grads else None
    return e, g


class EnergyConservingHMC(PreprocessedKernel):
    """HMC/NUTS with energy-conserving subsampling and a Taylor, variational or hybrid proxy.

    :param model: a NumPyro model with its likelihood in ``numpyro.plate(name, N,
        subsample_size=m)``; m is the subsample size of the estimator.
    :param proxy: ``"taylor"`` (at the Laplace mode, Dang et al.), ``"variational"``
        (paper 003 Eq. 2-4), ``"hybrid"`` (variational expectation + first-order correction),
        see the module docstring.
    :param taylor_order: 1 or 2 (default) for ``proxy="taylor"``.
    :param num_blocks: G, number of blocks of u; one block is redrawn per iteration (default
        10; m must be a multiple of G). Larger G: more correlated l̂ and higher index
        acceptance, slower mixing of u.
    :param subsample_size: m, overriding the model's plate subsample size.
    :param algo: ``"NUTS"`` (default) or ``"HMC"``.
    :param num_mc_draws: S, guide draws for E_q[ℓ_i] (and E_q[∇ℓ_i]); default 64.
    :param hybrid_order: 1 or 2 (default, the L²(q) quadratic projection) for ``"hybrid"``.
    :param selection: ``"preferential"`` (default: Hansen-Hurwitz, p_i ∝ the proxy error's
        scale, mixed with ``uniform_mix`` of the uniform law, estimated from
        ``num_selection_draws`` proxy draws; it gave the lower σ̂² in every measurement) or
        ``"uniform"`` (the paper's estimator, no extra preprocessing pass).
    :param proxy_kwargs: options of :func:`~numpyro_subsample.proxy.fit_laplace` (Taylor) or
        :func:`~numpyro_subsample.variational.fit_variational` (variational, hybrid; e.g.
        ``guide=``, ``guide_params=``).
    :param step_size, adapt_step_size, adapt_mass_matrix, dense_mass, target_accept_prob,
        max_tree_depth, trajectory_length, num_steps: NumPyro's HMC/NUTS options.

    Example::

        kernel = EnergyConservingHMC(model, proxy="taylor", num_blocks=10)
        mcmc = MCMC(kernel, num_warmup=500, num_samples=1000)
        mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("sigma2", "index_accept_prob"))
    """

    sample_field = "z"

    def __init__(
        self,
        model: Callable,
        *,
        proxy: str = "taylor",
        taylor_order: int = 2,
        num_blocks: int = 10,
        subsample_size: int | None = None,
        algo: str = "NUTS",
        step_size: float = 1.0,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool = True,
        dense_mass: bool = False,
        target_accept_prob: float = 0.8,
        max_tree_depth: int = 10,
        trajectory_length: float | None = None,
        num_steps: int | None = None,
        num_mc_draws: int = 64,
        hybrid_order: int = 2,
        selection: str = "preferential",
        uniform_mix: float = 0.05,
        num_selection_draws: int = 16,
        proxy_kwargs: dict | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        seed: int = 0,
        progress_bar: bool | None = None,
    ) -> None:
        if isinstance(proxy, Proxy) or proxy not in PROXIES:
            raise ValueError(f"proxy must be one of {PROXIES}, got {proxy!r}.")
        if taylor_order not in (1, 2):
            raise ValueError(f"taylor_order must be 1 or 2, got {taylor_order}.")
        if int(num_blocks) < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks}.")
        if algo not in ("NUTS", "HMC"):
            raise ValueError(f"algo must be 'NUTS' or 'HMC', got {algo!r}.")
        if algo == "HMC" and trajectory_length is None and num_steps is None:
            trajectory_length = 2 * np.pi
        if int(num_mc_draws) < 2:
            raise ValueError(f"num_mc_draws must be at least 2, got {num_mc_draws}.")
        if hybrid_order not in (1, 2):
            raise ValueError(f"hybrid_order must be 1 or 2, got {hybrid_order}.")
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}.")
        if not 0.0 < float(uniform_mix) <= 1.0:
            raise ValueError(
                f"uniform_mix must be in (0, 1] so that every p_i > 0, got {uniform_mix}."
            )
        self._model = model
        self.proxy_kind = proxy
        self.taylor_order = int(taylor_order)
        self.num_blocks = int(num_blocks)
        self._subsample_size = subsample_size
        self.algo = algo
        self.hmc_options = dict(
            step_size=step_size, adapt_step_size=adapt_step_size,
            adapt_mass_matrix=adapt_mass_matrix, dense_mass=dense_mass,
            target_accept_prob=target_accept_prob, max_tree_depth=max_tree_depth,
            trajectory_length=trajectory_length, num_steps=num_steps,
        )
        self.num_mc_draws = int(num_mc_draws) + int(num_mc_draws) % 2
        self.hybrid_order = int(hybrid_order)
        self.selection = selection
        self.uniform_mix = float(uniform_mix)
        self.num_selection_draws = int(num_selection_draws)
        self.proxy_kwargs = dict(proxy_kwargs or {})
        self.chunk_size = chunk_size
        self.seed = seed
        self.progress_bar = _default_progress() if progress_bar is None else progress_bar
        self._pre: ECSPreprocessed | None = None
        self._pre_args = None
        self._sample_fn = None
        self._hmc_sample = None

    # -- properties ---------------------------------------------------------------------------
    @property
    def model(self) -> Callable:
        """The model with its subsample plate set to all N indices (after ``init``)."""
        if self._pre is None:
            return self._model
        plate = self._pre.potential.plate
        return _set_plate_indices(self._model, name=plate.name, indices=jnp.arange(plate.size))

    @property
    def default_fields(self) -> tuple[str, ...]:
        return ("z", "diverging")

    @property
    def preprocessed(self) -> ECSPreprocessed:
        if self._pre is None:
            raise RuntimeError("Run MCMC (or call kernel.preprocess) first.")
        return self._pre

    @property
    def proxy(self) -> Proxy:
        return self.preprocessed.proxy

    def get_diagnostics_str(self, state: ECSState) -> str:
        hs = state.hmc_state
        return (
            f"{hs.num_steps} steps of size {hs.adapt_state.step_size:.2e}. "
            f"acc. prob={hs.mean_accept_prob:.2f} "
            f"sigma2={float(np.asarray(state.sigma2).mean()):.2f}"
        )

    # -- preprocessing -------------------------------------------------------------------------
    def preprocess(
        self, model_args: tuple, model_kwargs: dict | None = None, *, traced: bool = False
    ) -> ECSPreprocessed:
        """Potential, proxy, sums and per-datum proxy terms (cached per data set)."""
        model_kwargs = dict(model_kwargs or {})
        if self._pre is not None and _same_args(self._pre_args, (model_args, model_kwargs)):
            return self._pre
        t0 = time.perf_counter()
        with jax.ensure_compile_time_eval() if traced else contextlib.nullcontext():
            k_model, k_proxy, k_mc = jax.random.split(jax.random.PRNGKey(self.seed), 3)
            potential = build_potential(self._model, model_args, model_kwargs, k_model)
            check_data_finite(model_args, model_kwargs, potential.num_data)
            m = int(self._subsample_size or potential.plate.subsample_size)
            if m % self.num_blocks:
                raise ValueError(
                    f"The subsample size m={m} is not a multiple of num_blocks="
                    f"{self.num_blocks}; pass num_blocks dividing m (e.g. "
                    f"{max(g for g in range(1, min(m, 100) + 1) if m % g == 0)}) or change "
                    "subsample_size."
                )
            if self.proxy_kind == "taylor":
                pre = self._preprocess_taylor(potential, k_proxy, m)
            else:
                pre = self._preprocess_variational(potential, k_proxy, k_mc, m, model_args,
                                                   model_kwargs)
            pre = self._with_selection(pre, jax.random.fold_in(k_mc, 1))
        pre = pre._replace(seconds=time.perf_counter() - t0)
        self._pre, self._pre_args = pre, (model_args, model_kwargs)
        self._sample_fn = None
        return pre

    def _preprocess_taylor(self, potential: Potential, key, m: int) -> ECSPreprocessed:
        opts = dict(self.proxy_kwargs)
        proxy = fit_laplace(
            potential, key, chunk_size=self.chunk_size, store_datum_grads=False,
            progress=self.progress_bar, **opts,
        )
        ref, tril = proxy.centre, proxy.scale_tril
        second = self.taylor_order == 2
        # likelihood-only sums at θ̂: full sums minus the prior's (one data pass)
        _, g_all, h_all = jax.jit(
            lambda t: value_grad_hessian(potential, t, self.chunk_size, hessian=second)
        )(ref)
        g0 = jax.jit(jax.grad(potential.prior))(ref)  # jitted: eager ops compile one by one
        sum_b = tril.T @ (-(g_all - g0))
        if second:
            h0 = jax.jit(jax.hessian(potential.prior))(ref)
            sum_c = tril.T @ (-(h_all - h0)) @ tril
        else:
            sum_c = jnp.zeros((0, 0), ref.dtype)
        d = ref.shape[0]

        def datum(i):
            f = lambda t: -potential.data_terms(t, i[None])[0]  # noqa: E731
            a, b = jax.value_and_grad(f)(ref)
            c = tril.T @ jax.hessian(f)(ref) @ tril if second else jnp.zeros((0, 0), ref.dtype)
            return a, tril.T @ b, c

        datum_aux = jax.vmap(datum)
        return ECSPreprocessed(
            potential, proxy, "taylor", ref, tril, sum_b, sum_c, datum_aux, m, 0.0,
            proxy.num_data_passes + 1.0, {"taylor_order": self.taylor_order, "dim": d},
        )

    def _preprocess_variational(self, potential, key, k_mc, m, model_args, model_kwargs):
        from numpyro_subsample.proxies.variational import fit_variational

        opts = dict(self.proxy_kwargs)
        proxy = fit_variational(
            potential, key, model=self._model, model_args=model_args,
            model_kwargs=model_kwargs, chunk_size=self.chunk_size, store_datum_grads=False,
            progress=self.progress_bar, **opts,
        )
        ref, tril = proxy.centre, proxy.scale_tril
        S, d = self.num_mc_draws, ref.shape[0]
        if proxy.info.get("gaussian", False):
            draws = ref + _moment_matched_normal(k_mc, S, d).astype(ref.dtype) @ tril.T
        else:
            draws = proxy.info["sample"](k_mc, S)
        hybrid = self.proxy_kind == "hybrid"
        if hybrid and self.hybrid_order == 2:
            return self._preprocess_smoothed(potential, proxy, k_mc, m)
        t0 = time.perf_counter()
        e, gbar = jax.jit(
            lambda ph: variational_expectations(potential, ph, grads=hybrid,
                                                chunk_size=self.chunk_size)
        )(draws)
        mc_seconds = time.perf_counter() - t0
        if hybrid:
            table_b = gbar @ tril  # whitened: Lᵀ ḡ_i for every datum
            sum_b = jnp.sum(table_b, axis=0)
        else:
            table_b = None
            sum_b = jnp.zeros((0,), ref.dtype)
        bad = ~np.asarray(jnp.isfinite(e))
        if bad.any():
            raise ValueError(
                f"E_q[log p(x_i | φ)] is not finite for datum {int(np.flatnonzero(bad)[0])} "
                f"of plate '{potential.plate.name}'; check the data and the fitted guide."
            )

        def datum_aux(i):
            b = table_b[i] if hybrid else jnp.zeros((i.shape[0], 0), ref.dtype)
            return e[i], b, jnp.zeros((i.shape[0], 0, 0), ref.dtype)

        info = {
            "num_mc_draws": S, "mc_seconds": mc_seconds, "sum_e": float(jnp.sum(e)),
            "draws": draws, "dim": d,
        }
        passes = proxy.num_data_passes + S * (2.0 if hybrid else 1.0)
        return ECSPreprocessed(
            potential, proxy, self.proxy_kind, ref, tril, sum_b,
            jnp.zeros((0, 0), ref.dtype), datum_aux, m, 0.0, passes, info,
        )

    def _preprocess_smoothed(self, potential, proxy, k_mc, m) -> ECSPreprocessed:
        """Second-order hybrid: the L²(q) projection of ℓ_i onto quadratics (module docstring).

        In whitened coordinates z ~ N(0, I) (θ = μ + L z) with S moment-matched antithetic
        draws z_s shared by all data: a_i = mean_s ℓ_i − ½ tr C_i, b_i = mean_s ∇_z ℓ_i,
        C_i = sym(mean_s ∇_z ℓ_i z_sᵀ) (Stein: E[∇²f] = E[∇f zᵀ]). Per-datum terms are
        computed on the fly for the indices of u (no tables, memory O(S·d) per datum); the sums
        B, C come from S full-data gradient passes with the same draws, so Σ_i q_i is exactly
        consistent with the per-datum q_i and l̂ stays unbiased whatever the Monte Carlo error.
        """
        ref, tril = proxy.centre, proxy.scale_tril
        S, d = self.num_mc_draws, ref.shape[0]
        if S // 2 < d:
            raise ValueError(
                f"hybrid_order=2 needs num_mc_draws >= 2·dim = {2 * d} (moment-matched draws), "
                f"got {S}; raise num_mc_draws."
            )
        if not proxy.info.get("gaussian", False):
            raise ValueError(
                "hybrid_order=2 needs a Gaussian guide (e.g. AutoMultivariateNormal); "
                "use hybrid_order=1 for other guides."
            )
        zs = _moment_matched_normal(k_mc, S, d).astype(ref.dtype)
        prior = potential.prior
        t0 = time.perf_counter()

        def lik_grad(z):  # ∇_z Σ_i ℓ_i(μ + L z), one chunked data pass
            th = ref + tril @ z
            _, g, _ = value_grad_hessian(potential, th, self.chunk_size, hessian=False)
            return -(tril.T @ (g - jax.grad(prior)(th)))

        grads = jax.jit(lambda zz: jax.lax.map(lik_grad, zz))(zs)  # (S, d)
        sum_b = grads.mean(0)
        sum_c = grads.T @ zs / S
        sum_c = 0.5 * (sum_c + sum_c.T)
        mc_seconds = time.perf_counter() - t0

        def datum(i):
            f = lambda z: -potential.data_terms(ref + tril @ z, i[None])[0]  # noqa: E731
            vals, g = jax.vmap(jax.value_and_grad(f))(zs)
            c = g.T @ zs / S
            c = 0.5 * (c + c.T)
            return jnp.mean(vals) - 0.5 * jnp.trace(c), jnp.mean(g, 0), c

        datum_aux = jax.vmap(datum)
        info = {"num_mc_draws": S, "mc_seconds": mc_seconds, "draws": ref + zs @ tril.T,
                "dim": d, "hybrid_order": 2}
        return ECSPreprocessed(
            potential, proxy, "hybrid", ref, tril, sum_b, sum_c, datum_aux, m, 0.0,
            proxy.num_data_passes + float(S), info,
        )

    def _with_selection(self, pre: ECSPreprocessed, key) -> ECSPreprocessed:
        """Append r_i = 1/(N p_i) to the per-datum terms; build p for ``"preferential"``.

        Hansen-Hurwitz (preferential) selection: u_j i.i.d. with P(u_j = i) = p_i,
        p_i ∝ (1 − λ)·rms_s d_i(θ_s) + λ/N over proxy draws θ_s (Walker alias table, O(1) per
        draw); see :meth:`_estimate_fn` for the estimator and its variance.
        """
        base = pre.datum_aux
        N = pre.potential.num_data
        if self.selection == "uniform":
            def datum_aux(i):
                return (*base(i), jnp.ones(i.shape, pre.ref.dtype))

            return pre._replace(datum_aux=datum_aux)
        t0 = time.perf_counter()
        S, d = self.num_selection_draws, pre.ref.shape[0]
        zs = jax.random.normal(key, (S, d), pre.ref.dtype)
        potential, ref, tril = pre.potential, pre.ref, pre.tril

        def chunk(idx):
            a, b, c = base(idx)
            vals = jax.vmap(lambda z: -potential.data_terms(ref + tril @ z, idx))(zs)  # (S, k)
            q = a[None] + zs @ b.T if b.shape[-1] else jnp.broadcast_to(a, vals.shape)
            if c.shape[-1]:
                q = q + 0.5 * jnp.einsum("sk,jkl,sl->sj", zs, c, zs)
            return jnp.sqrt(jnp.mean((vals - q) ** 2, 0))

        scale = np.asarray(jax.jit(lambda: map_data(chunk, N, self.chunk_size))(), np.float64)
        if not np.all(np.isfinite(scale)):
            raise ValueError(
                "selection='preferential': the proxy error is not finite at some proxy draws; "
                "use selection='uniform'."
            )
        table = build_alias_table(mix_with_uniform(scale, self.uniform_mix))
        r = jnp.asarray(1.0 / (N * np.asarray(table.probs, np.float64)), pre.ref.dtype)

        def datum_aux(i):
            return (*base(i), r[i])

        info = dict(pre.info, selection_seconds=time.perf_counter() - t0,
                    selection_probs=table.probs)
        return pre._replace(datum_aux=datum_aux, table=table, info=info,
                            data_passes=pre.data_passes + S)

    def _draw_indices(self, pre: ECSPreprocessed, key, n: int) -> jax.Array:
        if pre.table is None:
            return jax.random.randint(key, (n,), 0, pre.potential.num_data)
        return alias_draw(pre.table, key, n)

    # -- the estimator -------------------------------------------------------------------------
    def _estimate_fn(self, pre: ECSPreprocessed):
        """(w, idx, aux) -> (f0(θ), l̂(θ) − A, σ̂²(θ)), paper 003 'Perturbed method'.

        With y_j = d_{u_j} / p_{u_j} = N r_{u_j} d_{u_j} (Hansen-Hurwitz; uniform: p = 1/N):
        l̂ = Σ_i q_i + (1/m) Σ_j y_j (unbiased: E[y_j] = Σ_i d_i), and since the y_j are
        i.i.d., Var_u[l̂] = (1/m)(Σ_i d_i²/p_i − (Σ_i d_i)²), estimated without bias by
        σ̂² = s²_u(y)/m (ddof = 1) — the (N²/m) s²_u(d) of the paper for uniform p.
        """
        potential, ref, tril = pre.potential, pre.ref, pre.tril
        N, m = potential.num_data, pre.subsample_size
        has_b = pre.sum_b.shape[0] > 0
        has_c = pre.sum_c.shape[0] > 0

        def estimate(w, idx, aux):
            a, b, c, r = aux
            theta = ref + tril @ w
            f0, fi = potential.terms(theta, idx)
            q_sub = a
            total = jnp.zeros((), theta.dtype)
            if has_b:
                q_sub = q_sub + b @ w
                total = total + pre.sum_b @ w
            if has_c:
                q_sub = q_sub + 0.5 * jnp.einsum("jkl,k,l->j", c, w, w)
                total = total + 0.5 * w @ pre.sum_c @ w
            y = N * r * (-fi - q_sub)
            loglik = total + jnp.mean(y)
            sigma2 = jnp.var(y, ddof=1) / m
            return f0, loglik, sigma2

        return estimate

    def loglik_estimates(
        self, theta: jax.Array, rng_key: jax.Array, num_subsamples: int = 100
    ) -> tuple[jax.Array, jax.Array]:
        """l̂(θ; u) − Σa_i and σ̂²(θ; u) for ``num_subsamples`` fresh subsamples u (jittable).

        For measuring the estimator at given states (e.g. posterior draws): the mean of σ̂²
        estimates Var_u[l̂(θ)], which the pseudo-marginal step needs to be about 1 or less.
        """
        pre = self.preprocessed
        estimate = self._estimate_fn(pre)
        w = jax.scipy.linalg.solve_triangular(pre.tril, theta - pre.ref, lower=True)

        def one(key):
            idx = self._draw_indices(pre, key, pre.subsample_size)
            _, loglik, sigma2 = estimate(w, idx, pre.datum_aux(idx))
            return loglik, sigma2

        return jax.lax.map(one, jax.random.split(rng_key, num_subsamples), batch_size=16)

    def proxy_total(self, theta: jax.Array) -> jax.Array:
        """Σ_i q_i(θ) of the proxy, including the constant and (variational) G(θ).

        For ``"variational"`` (Gaussian guides) this is ELBO + log q(θ) − log π(θ), the
        right-hand side of paper 003 Eq. 2 with Eq. 3 (module docstring); for ``"taylor"`` and
        ``"hybrid"`` it is A + BᵀΔ (+ ½ΔᵀCΔ).
        """
        pre = self.preprocessed
        w = jax.scipy.linalg.solve_triangular(pre.tril, theta - pre.ref, lower=True)
        if pre.kind == "taylor":
            a_sum = -jax.jit(lambda t: value_grad_hessian(
                pre.potential, t, self.chunk_size, hessian=False)[0])(pre.ref)
            a_sum = a_sum + pre.potential.prior(pre.ref)
            out = a_sum + pre.sum_b @ w
            if pre.sum_c.shape[0]:
                out = out + 0.5 * w @ pre.sum_c @ w
            return out
        if pre.kind == "hybrid":
            if "sum_e" in pre.info:
                return pre.info["sum_e"] + pre.sum_b @ w
            a_sum = jnp.sum(map_data(lambda i: pre.datum_aux(i)[0], pre.potential.num_data,
                                     self.chunk_size))
            return a_sum + pre.sum_b @ w + 0.5 * w @ pre.sum_c @ w
        sum_e = pre.info["sum_e"]
        if not pre.proxy.info.get("gaussian", False):
            raise ValueError("proxy_total for proxy='variational' needs a Gaussian guide.")
        draws = pre.info["draws"]
        d = theta.shape[0]
        # log q for N(μ, LLᵀ): −½|w|² − log|L| − (d/2) log 2π; E_q[log q] = −½ d − log|L| − ...
        logdet = jnp.sum(jnp.log(jnp.diag(pre.tril)))
        log_q = -0.5 * w @ w - logdet - 0.5 * d * jnp.log(2 * jnp.pi)
        e_log_q = -0.5 * d - logdet - 0.5 * d * jnp.log(2 * jnp.pi)
        e_log_prior = -jnp.mean(jax.vmap(pre.potential.prior)(draws))
        return sum_e + e_log_prior - e_log_q + log_q + pre.potential.prior(theta)

    # -- MCMCKernel interface ------------------------------------------------------------------
    def _build(self, pre: ECSPreprocessed):
        estimate = self._estimate_fn(pre)

        def potential_fn_gen(idx, aux):
            def pe(w):
                f0, loglik, sigma2 = estimate(w, idx, aux)
                return f0 - loglik + 0.5 * sigma2

            return pe

        init_kernel, sample_kernel = hmc(potential_fn_gen=potential_fn_gen, algo=self.algo)
        return estimate, potential_fn_gen, init_kernel, sample_kernel

    def _draw_block(self, pre: ECSPreprocessed, key, idx, aux):
        G, m = self.num_blocks, pre.subsample_size
        bs = m // G
        k_block, k_idx = jax.random.split(key)
        start = jax.random.randint(k_block, (), 0, G) * bs
        new = self._draw_indices(pre, k_idx, bs)
        new_aux = pre.datum_aux(new)
        idx = jax.lax.dynamic_update_slice_in_dim(idx, new, start, 0)
        aux = tuple(
            jax.lax.dynamic_update_slice_in_dim(x, nx, start, 0)
            for x, nx in zip(aux, new_aux, strict=True)
        )
        return idx, aux

    def _init_one(self, pre, init_kernel, estimate, num_warmup, rng_key, init_params):
        k_idx, k_w, k_hmc, key = jax.random.split(rng_key, 4)
        d = pre.ref.shape[0]
        idx = self._draw_indices(pre, k_idx, pre.subsample_size)
        aux = pre.datum_aux(idx)
        if init_params is not None:
            theta = ravel_pytree(init_params)[0].astype(pre.ref.dtype)
            w = jax.scipy.linalg.solve_triangular(pre.tril, theta - pre.ref, lower=True)
        else:
            w = 0.5 * jax.random.normal(k_w, (d,), pre.ref.dtype)
        hmc_state = init_kernel(
            w, num_warmup, model_args=(idx, aux), rng_key=k_hmc, **self._init_options()
        )
        _, loglik, sigma2 = estimate(w, idx, aux)
        zero = jnp.zeros((), pre.ref.dtype)
        return ECSState(
            jnp.zeros((), jnp.int32), pre.potential.unravel(pre.ref + pre.tril @ w), hmc_state,
            idx, aux, sigma2, loglik, zero + 1.0, zero, jnp.zeros((), jnp.int32),
            jnp.zeros((), bool), key,
        )

    def _init_options(self) -> dict:
        o = dict(self.hmc_options)
        if self.algo == "NUTS":
            o.pop("trajectory_length")
            o.pop("num_steps")
        return o

    def _step_fn(self, pre, estimate, pe_gen, sample_kernel):
        def step(state: ECSState) -> ECSState:
            key, k_block, k_acc = jax.random.split(state.rng_key, 3)
            hs = state.hmc_state
            idx_new, aux_new = self._draw_block(pre, k_block, state.idx, state.aux)
            pe_new, grad_new = jax.value_and_grad(pe_gen(idx_new, aux_new))(hs.z)
            log_ratio = hs.potential_energy - pe_new
            accept_prob = jnp.where(jnp.isfinite(log_ratio), jnp.minimum(1.0, jnp.exp(
                jnp.minimum(log_ratio, 0.0))), 0.0)
            accept = jax.random.bernoulli(k_acc, accept_prob)
            sel = lambda new, old: jnp.where(accept, new, old)  # noqa: E731
            idx = sel(idx_new, state.idx)
            aux = jax.tree.map(sel, aux_new, state.aux)
            hs = hs._replace(
                potential_energy=sel(pe_new, hs.potential_energy), z_grad=sel(grad_new, hs.z_grad)
            )
            hs = sample_kernel(hs, model_args=(idx, aux))
            _, loglik, sigma2 = estimate(hs.z, idx, aux)
            theta = pre.ref + pre.tril @ hs.z
            return ECSState(
                state.i + 1, pre.potential.unravel(theta), hs, idx, aux, sigma2, loglik,
                accept_prob, hs.accept_prob, hs.num_steps, hs.diverging, key,
            )

        return step

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        pre = self.preprocess(model_args, model_kwargs, traced=isinstance(rng_key, jax.core.Tracer))
        estimate, pe_gen, init_kernel, sample_kernel = self._build(pre)
        one = lambda k, p: self._init_one(  # noqa: E731
            pre, init_kernel, estimate, num_warmup, k, p
        )
        step = self._step_fn(pre, estimate, pe_gen, sample_kernel)
        return self._start_chains(one, step, rng_key, init_params)
