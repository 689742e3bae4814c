"""What each run of the comparison reports besides its draws: the Python warnings it raised
and the run diagnostics of :func:`numpyro_subsample.post.checks.check_run`.

- :func:`record_warnings` records every warning raised in a block (nothing is printed) and
  summarises them as unique ``(category, message, count)`` triples.
- :func:`row_flags` gathers what a reader must know before trusting a row into one string:
  failed run checks, errors far from the reference, and the warnings raised.
- :func:`run_checks` calls ``check_run(mcmc, warn=False)`` and returns its ``RunCheck`` as a
  plain dict (``None`` if this installation has no ``post.checks``). Runs that are not a
  NumPyro ``MCMC`` (the NUTS reference and HMCECS collected in one compiled loop, the proxies'
  independent draws) are wrapped in :class:`DrawsRun`, a single chain with the ``MCMC`` methods
  that ``check_run`` reads.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["CHECK_FIELDS", "FAR_SD", "DrawsRun", "check_code", "record_warnings", "row_flags",
           "run_checks", "shorten"]

#: a row whose worst mean error or |log sd ratio| exceeds this (in posterior sds) is flagged
FAR_SD = 0.25

#: the fields of ``post.checks.RunCheck``
CHECK_FIELDS = ("min_ess_bulk", "min_ess_tail", "max_rhat", "worst_sites", "divergences",
                "num_draws", "messages")


@contextlib.contextmanager
def record_warnings() -> Iterator[list]:
    """Record the warnings raised inside the block instead of printing them.

    Yields a list that is filled on exit with unique ``(category, message, count)`` triples,
    in order of first appearance.
    """
    box: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield box
        finally:
            counts: dict[tuple[str, str], int] = {}
            for w in caught:
                k = (w.category.__name__, str(w.message))
                counts[k] = counts.get(k, 0) + 1
            box.extend((c, m, n) for (c, m), n in counts.items())


def shorten(message: str, width: int = 100) -> str:
    """The first line of ``message``, cut to ``width`` characters."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


class _NoKernel:
    """The ``sampler`` of a :class:`DrawsRun`: no kernel state, no step size."""

    sample_field = "z"


class DrawsRun:
    """One finished chain in the interface of ``numpyro.infer.MCMC`` that run checks read:
    ``get_samples``, ``get_extra_fields`` (``diverging``), ``sampler.sample_field`` and
    ``last_state`` (``None``: every site of ``samples`` is latent, no kernel state).

    ``samples``: ``{site: (S, ...)}`` of latent sites; ``diverging``: ``(S,)`` flags or
    ``None`` (none).
    """

    num_chains = 1
    last_state = None
    sampler = _NoKernel()

    def __init__(self, samples: dict, diverging: np.ndarray | None = None):
        self._samples = {k: np.asarray(v) for k, v in samples.items()}
        S = next(iter(self._samples.values())).shape[0] if self._samples else 0
        self.num_samples = S
        self.num_warmup = 0
        self._diverging = (np.zeros(S, bool) if diverging is None
                           else np.asarray(diverging, bool).reshape(S))

    def get_samples(self, group_by_chain: bool = False) -> dict:
        return {k: v[None] if group_by_chain else v for k, v in self._samples.items()}

    def get_extra_fields(self, group_by_chain: bool = False) -> dict:
        d = self._diverging
        return {"diverging": d[None] if group_by_chain else d}


def _check_run_fn():
    """``numpyro_subsample.post.checks.check_run``, or ``None`` if not installed."""
    try:
        return importlib.import_module("numpyro_subsample.post.checks").check_run
    except (ImportError, AttributeError):
        return None


def _plain(x: Any) -> Any:
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def run_checks(mcmc) -> dict | None:
    """``check_run(mcmc, warn=False)`` as a dict of :data:`CHECK_FIELDS`.

    ``None`` if ``post.checks`` is not available; ``{"error": ...}`` if the check itself
    raised (reported with the run, which is kept).
    """
    check_run = _check_run_fn()
    if check_run is None:
        return None
    try:
        rc = check_run(mcmc, warn=False)
    except Exception as err:  # noqa: BLE001 - a failing diagnostic must not discard the run
        return {"error": f"{type(err).__name__}: {shorten(str(err), 200)}"}
    return {f: _plain(getattr(rc, f)) for f in CHECK_FIELDS}


def check_code(checks: dict | None) -> str:
    """A few letters for the table: ``ok``, or which checks failed (``ESS``, ``Rhat``,
    ``div``; ``fail`` for other messages, ``error``), ``n/a`` without checks.

    Read from the run check's messages, which applied its thresholds (ESS per chain, R-hat at
    the chance level over the coordinates)."""
    if not checks:
        return "n/a"
    if "error" in checks:
        return "error"
    messages = checks.get("messages") or ()
    if not messages:
        return "ok"
    codes = []
    if any(m.startswith("min ESS") for m in messages):
        codes.append("ESS")
    if any("split R-hat" in m for m in messages):
        codes.append("Rhat")
    if checks.get("divergences"):
        codes.append("div")
    return ",".join(codes) or "fail"


def row_flags(*, checks: str, warning_messages: list, mean_err: float | None,
              sd_log_ratio: float | None, far: float = FAR_SD, status: str = "ok") -> str:
    """The table's "flags" of one row, ``""`` if nothing is wrong.

    ``checks``: the :func:`check_code` of its run checks (``ESS``, ``Rhat``, ``div``, ...);
    ``mean <e> sd`` / ``sd x<r>`` when the worst mean error / worst |log sd ratio| against
    the reference exceeds ``far`` (posterior sds; default :data:`FAR_SD`, raised to the
    reference's own Monte Carlo error by the caller); each distinct warning category raised
    (``warning_messages``: ``{"category", "message", "count"}``); ``FAILED`` for a run that
    raised.
    """
    if status != "ok":
        return "FAILED"
    out = [c for c in checks.split(",") if c not in ("", "ok", "n/a")]
    if mean_err is not None and math.isfinite(mean_err) and mean_err > far:
        out.append(f"mean {mean_err:.2f} sd")
    if sd_log_ratio is not None and math.isfinite(sd_log_ratio) and sd_log_ratio > far:
        out.append(f"sd x{math.exp(sd_log_ratio):.2f}")
    for w in warning_messages or []:
        if w["category"] not in out:
            out.append(w["category"])
    return ", ".join(out)
