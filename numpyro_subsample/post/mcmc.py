"""``numpyro.infer.MCMC`` that checks its draws after every run."""

from __future__ import annotations

from typing import Any

from numpyro.infer import MCMC as NumPyroMCMC

from numpyro_subsample.post.checks import RunCheck, check_run

__all__ = ["MCMC"]


class MCMC(NumPyroMCMC):
    """NumPyro's ``MCMC`` (same arguments) that runs :func:`check_run` after ``run``.

    NumPyro's ``MCMC.run`` gives its kernel no hook after the last draw, so the checks live
    here: after each ``run`` the bulk/tail ESS, split R-hat (two or more chains), stopped
    chains and, with ``check_bias=True``, the step-halving check are computed and a single
    :class:`~numpyro_subsample.post.checks.RunDiagnosticsWarning` names the worst sites when a
    check fails. The figures are in :attr:`run_check` (and, through
    :func:`~numpyro_subsample.post.arviz.to_arviz`, in the ArviZ ``sample_stats`` attributes).

    Parameters
    ----------
    check
        Run the checks after ``run`` (default True).
    check_bias
        Also rerun at half the step size (doubles the cost; stochastic-gradient kernels only).
    min_ess, max_rhat
        Thresholds of :func:`~numpyro_subsample.post.checks.check_run`.
    *args, **kwargs
        As ``numpyro.infer.MCMC``.
    """

    def __init__(
        self,
        sampler: Any,
        *args: Any,
        check: bool = True,
        check_bias: bool = False,
        min_ess: float = 100.0,
        max_rhat: float = 1.01,
        **kwargs: Any,
    ) -> None:
        super().__init__(sampler, *args, **kwargs)
        self.check, self.check_bias = bool(check), bool(check_bias)
        self.min_ess, self.max_rhat = float(min_ess), float(max_rhat)
        self.run_check: RunCheck | None = None

    def warmup(self, rng_key, *args, extra_fields=(), collect_warmup=False, init_params=None,
               **kwargs) -> None:
        """NumPyro's ``MCMC.warmup``, without the checks: warm-up draws are not meant to be
        stationary (the next ``run`` checks its draws)."""
        check, self.check = self.check, False
        try:
            super().warmup(rng_key, *args, extra_fields=extra_fields,
                           collect_warmup=collect_warmup, init_params=init_params, **kwargs)
        finally:
            self.check = check

    def run(self, rng_key, *args, extra_fields=(), init_params=None, **kwargs) -> None:
        super().run(rng_key, *args, extra_fields=extra_fields, init_params=init_params,
                    **kwargs)
        self.run_check = None
        if self.check:
            self.run_check = check_run(
                self, min_ess=self.min_ess, max_rhat=self.max_rhat,
                check_bias=self.check_bias, stacklevel=3,
            )
