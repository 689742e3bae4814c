"""The settings and intermediate results of ``numpyro-subsample compare``
(:mod:`~numpyro_subsample.compare.engine`): the options, the checked plan, the runs, the
interruption that keeps them, and the progress lines on stderr."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from numpyro_subsample.compare.problems import Method, Problem
from numpyro_subsample.compare.runners import RunOutput, Settings, SharedProxy
from numpyro_subsample.compare.store import RunStore

__all__ = ["CompareInterrupted", "CompareOptions", "Plan", "Runs", "log"]


@dataclass
class CompareOptions:
    """Settings of :func:`run_compare` (the flags of ``numpyro-subsample compare``).

    ``jobs``: 2 (default) runs the reference and HMCECS in a worker process while this one
    runs the other methods, 1 runs everything here (cleaner timings, longer wall time);
    ``fast_compile``: XLA without most optimisations (default: ``quick``);
    ``compile_cache_dir``: the persistent compilation cache in use (from
    :func:`~numpyro_subsample.compare.timing.setup_compile_cache`), recorded and passed to the
    worker; ``device``: JAX platform to run on (``"cpu"``, ``"gpu"``, ``"tpu"``; default
    JAX's); ``resume``: reuse the runs saved in ``<out>/runs`` for the same problem and
    settings; ``command``: recorded.
    """

    dataset: str = "default"
    data_dir: str | None = None
    methods: str = "default"
    seed: int = 0
    out: str = "outputs"
    num_data: int | None = None
    subsample_size: int | None = None
    num_samples: int | None = None
    nuts_samples: int | None = None
    ref_samples: int | None = None
    ksd: bool = True
    jobs: int | None = None
    cache_dir: str | None = None
    use_cache: bool = True
    compile_cache_dir: str | None = None
    fast_compile: bool | None = None
    device: str | None = None
    quick: bool = False
    progress: bool = False
    resume: bool = False
    command: str = ""


class CompareInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_compare`: ``saved`` names the methods whose runs are kept in
    ``folder`` (``<out>/runs``), for a rerun with ``resume=True``."""

    def __init__(self, saved: list[str], folder: Path):
        super().__init__(f"interrupted; runs kept in {folder}: {', '.join(saved) or 'none'}")
        self.saved, self.folder = list(saved), Path(folder)


@dataclass
class Plan:
    """What :func:`run_compare` will do, checked before anything runs."""

    options: CompareOptions
    problem: Problem
    settings: Settings
    methods: list[Method]
    jobs: int
    fast: bool
    store: RunStore
    out: Path
    device: str

    @property
    def runs(self) -> list[Method]:
        """The methods other than the reference."""
        return [m for m in self.methods if m.kind != "nuts"]


@dataclass
class Runs:
    """What :func:`run_methods` leaves: the reference, each method's output (or the error it
    raised), the shared Laplace proxy, and which runs were cached or resumed."""

    reference: RunOutput
    cached: bool
    outputs: dict = field(default_factory=dict)
    shared: SharedProxy | None = None
    resumed: list = field(default_factory=list)


def log(msg: str) -> None:
    """A progress line on stderr (flushed at once)."""
    print(msg, file=sys.stderr, flush=True)
