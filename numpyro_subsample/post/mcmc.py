"""``numpyro.infer.MCMC`` that checks its draws after every run."""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from itertools import product
from operator import attrgetter
from typing import Any

import arviz as az
import jax
import numpy as np
from numpyro.diagnostics import summary
from numpyro.infer import MCMC as NumPyroMCMC
from numpyro.infer.mcmc import _collect_and_postprocess, _get_progbar_desc_str
from numpyro.util import is_prng_key

from numpyro_subsample.core.adapter import run_progress
from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.post.checks import RunCheck, check_run
from numpyro_subsample.post.loop import LoopPrograms, collect, device_args

__all__ = ["MCMC", "summary_with_mcse"]


def summary_with_mcse(samples: dict, prob: float = 0.9) -> dict[str, OrderedDict]:
    """``numpyro.diagnostics.summary`` of draws (chains, draws, ...) per site, with the Monte
    Carlo standard error of each mean (ArviZ ``mcse``, Vehtari et al. 2021) after ``std``."""
    table = summary(samples, prob, group_by_chain=True)
    for name, stats in table.items():
        x = np.asarray(jax.device_get(samples[name]), np.float64)
        mcse = np.asarray(az.mcse(az.convert_to_dataset({"x": x}), method="mean")["x"].values)
        items = list(stats.items())
        items.insert(2, ("mcse_mean", mcse.reshape(np.shape(stats["mean"]))))
        table[name] = OrderedDict(items)
    return table


_MCSE_FORMAT = " {:>9.2g}"  # two significant digits: an MCSE is often below 0.01


def _print_table(table: dict[str, OrderedDict]) -> None:
    """The rows of :func:`summary_with_mcse`, in the layout of NumPyro's ``print_summary``."""
    if not table:
        return
    rows = []
    for name, stats in table.items():
        shape = np.shape(stats["mean"])
        for idx in product(*map(range, shape)):
            label = name + ("[{}]".format(",".join(map(str, idx))) if shape else "")
            rows.append((label, [np.asarray(v)[idx] for v in stats.values()]))
    width = max(max(len(r[0]) for r in rows), 10)
    columns = list(next(iter(table.values())).keys())
    print()
    print(" " * width + "".join(f" {c:>9}" for c in columns))
    formats = [_MCSE_FORMAT if c == "mcse_mean" else " {:>9.2f}" for c in columns]
    for label, values in rows:
        print(label.rjust(width) + "".join(f.format(v) for f, v in zip(formats, values,
                                                                       strict=True)))
    print()


class MCMC(NumPyroMCMC):
    """NumPyro's ``MCMC`` (same arguments) that runs :func:`check_run` after ``run``.

    NumPyro's ``MCMC.run`` gives its kernel no hook after the last draw, and does not tell it
    its ``progress_bar``; this class does both. A package kernel built with
    ``progress_bar=None`` (default) shows its preprocessing bars (proxy fit) if and only if this
    ``MCMC``'s ``progress_bar`` is on. After each ``run`` the bulk/tail ESS, split R-hat (two
    or more chains), stopped chains and, with ``check_bias=True``, the step-halving check are
    computed and a single :class:`~numpyro_subsample.post.checks.RunDiagnosticsWarning` names
    the worst sites when a check fails. :meth:`print_summary` adds the Monte Carlo standard
    error of each mean. The figures are in :attr:`run_check` (and, through
    :func:`~numpyro_subsample.post.arviz.to_arviz`, in the ArviZ ``sample_stats`` attributes).

    Its sampling loop (``numpyro_subsample.post.loop``) is NumPyro's with the model
    arguments an argument of the compiled programs: never compiled in as constants, never
    copied (NumPyro's own loop either closes over them, where the package's kernels read a
    copy held in references, or carries them, where XLA copies them), so the run holds the
    data once and a memory-mapped ``.npy`` file (``np.load(path, mmap_mode="r")``, float32
    unless ``jax_enable_x64``) is read in place. Same draws as NumPyro's loop for the same key.

    Parameters
    ----------
    check
        Run the checks after ``run`` (default True).
    check_bias
        Also rerun at half the step size (doubles the cost; stochastic-gradient kernels only).
    min_ess_per_chain, max_rhat
        Thresholds of :func:`~numpyro_subsample.post.checks.check_run`.
    jit_model_args
        None (default): True, except with several chains and ``chain_method="parallel"`` (or
        a callable), where NumPyro maps its own loop over the chains and NumPyro's default
        False applies. True: the loop above, the model's array arguments traced and its
        other arguments (numbers, strings, ``None``) static, so a rerun on new arrays of the
        same shapes reuses the compiled loop; NumPy arrays become JAX arrays once per ``run``
        (on the CPU without a copy when C-contiguous, 64-byte aligned and of JAX's dtype; a
        memory-mapped array that JAX would copy raises ``ValueError`` naming the file and the
        fix). False: NumPyro's loop, as ``numpyro.infer.MCMC``.
    *args, **kwargs
        As ``numpyro.infer.MCMC``.
    sampler
        The kernel, as for ``numpyro.infer.MCMC``.

    References
    ----------
    Vehtari, Gelman, Simpson, Carpenter and Bürkner (2021) (rank-normalised split R-hat, bulk
    and tail ESS).
    """

    def __init__(
        self,
        sampler: Any,
        *args: Any,
        check: bool = True,
        check_bias: bool = False,
        min_ess_per_chain: float = 100.0,
        max_rhat: float = 1.01,
        jit_model_args: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(sampler, *args, jit_model_args=bool(jit_model_args), **kwargs)
        if jit_model_args is None:  # this class's loop wherever it runs, else NumPyro's default
            self._jit_model_args = not self._pmapped()
        self.check, self.check_bias = bool(check), bool(check_bias)
        self.min_ess_per_chain, self.max_rhat = float(min_ess_per_chain), float(max_rhat)
        self.run_check: RunCheck | None = None
        self._loops: dict = {}  # LoopPrograms per (sample_fn, transform)

    def _data_as_argument(self, rng_key: Any) -> bool:
        """Whether this chain's loop takes the data as an argument (:mod:`.loop`): with
        ``jit_model_args`` (the default here), outside ``pmap`` (``chain_method="parallel"``
        or a callable with several chains, which NumPyro's own loop serves)."""
        if not self._jit_model_args or isinstance(rng_key, jax.core.Tracer):
            return False
        return not self._pmapped()

    def _pmapped(self) -> bool:
        """Whether NumPyro maps its per-chain loop (several chains, ``chain_method``
        ``"parallel"`` or a callable)."""
        return self.num_chains > 1 and (callable(self.chain_method)
                                        or self.chain_method == "parallel")

    def _single_chain_mcmc(self, init, args, kwargs, collect_fields, remove_sites):
        """NumPyro's, with :func:`~numpyro_subsample.post.loop.collect` for its loop: the data
        are an argument of the compiled programs, neither a constant nor carried."""
        rng_key, init_state, init_params = init
        if not self._data_as_argument(rng_key):
            return super()._single_chain_mcmc(init, args, kwargs, collect_fields,
                                              remove_sites)
        if init_state is None or getattr(self.sampler, "_sample_fn", None) is None:
            new_init_state = self.sampler.init(rng_key, self.num_warmup, init_params,
                                               model_args=args, model_kwargs=kwargs)
            init_state = new_init_state if init_state is None else init_state
        sample_fn, postprocess_fn = self._get_cached_fns()
        transform = _collect_and_postprocess(postprocess_fn, collect_fields, remove_sites)
        programs = self._loops.get((sample_fn, transform))
        if programs is None:
            self._loops = {(sample_fn, transform): LoopPrograms(sample_fn, transform)}
            programs = self._loops[(sample_fn, transform)]
        show = is_prng_key(rng_key) or self.sampler.is_ensemble_kernel
        lower, upper = self._collection_params["lower"], self._collection_params["upper"]
        phase = self._collection_params["phase"]
        size = self._collection_params["collection_size"]
        states, last_state = collect(
            programs, lower, upper, init_state, ModelData.from_args(args, kwargs),
            progbar=self.progress_bar, progress_rate=self.progress_rate,
            thinning=self.thinning,
            collection_size=None if size is None else size // self.thinning,
            progbar_desc=partial(_get_progbar_desc_str, lower, phase),
            diagnostics_fn=lambda s: self.sampler.get_diagnostics_str(s) if show else "",
        )
        if len(collect_fields) == 1:
            states = (states,)
        return dict(zip(collect_fields, states, strict=True)), last_state

    def print_summary(self, prob: float = 0.9, exclude_deterministic: bool = True) -> None:
        """NumPyro's summary table with a ``mcse_mean`` column: the Monte Carlo standard error
        of each posterior mean (ArviZ ``mcse``), the error of the mean from the finite number
        of correlated draws. It does not include the bias of a stochastic-gradient step
        (``check_bias=True`` measures that)."""
        assert self._states is not None, "`run` must be called before `print_summary`."
        sites = self._states[self._sample_field]
        latent = attrgetter(self._sample_field)(self._last_state)
        if isinstance(sites, dict) and exclude_deterministic and isinstance(latent, dict):
            sites = {k: v for k, v in sites.items() if k in latent}
        if not isinstance(sites, dict):
            sites = {f"Param:{i}": v for i, v in enumerate(jax.tree.leaves(sites))}
        _print_table(summary_with_mcse(sites, prob))
        extra = self.get_extra_fields()
        if "diverging" in extra:
            print(f"Number of divergences: {int(np.sum(extra['diverging']))}")

    def warmup(self, rng_key, *args, extra_fields=(), collect_warmup=False, init_params=None,
               **kwargs) -> None:
        """NumPyro's ``MCMC.warmup``, without the checks: warm-up draws are not meant to be
        stationary (the next ``run`` checks its draws)."""
        if self._jit_model_args:
            args, kwargs = device_args((args, kwargs))
        check, self.check = self.check, False
        try:
            super().warmup(rng_key, *args, extra_fields=extra_fields,
                           collect_warmup=collect_warmup, init_params=init_params, **kwargs)
        finally:
            self.check = check

    def run(self, rng_key, *args, extra_fields=(), init_params=None, **kwargs) -> None:
        if self._jit_model_args:  # NumPy arrays made JAX arrays once, for init and the loop
            args, kwargs = device_args((args, kwargs))
        with run_progress(self.progress_bar):  # the kernel's proxy bars follow this MCMC's
            super().run(rng_key, *args, extra_fields=extra_fields, init_params=init_params,
                        **kwargs)
        self.run_check = None
        if self.check:
            self.run_check = check_run(
                self, min_ess_per_chain=self.min_ess_per_chain, max_rhat=self.max_rhat,
                check_bias=self.check_bias, stacklevel=3,
            )
