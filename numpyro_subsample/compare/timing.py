"""Compilation time and JAX's persistent compilation cache for the comparison.

- :class:`CompileTimer` measures the seconds JAX spends tracing, lowering and compiling inside
  a block, from JAX's own monitoring events, so that sampling times exclude compilation.
- :func:`setup_compile_cache` switches on JAX's persistent compilation cache. NumPyro's
  ``MCMC.run`` traces and compiles its sampling loop again on every call, even for a kernel
  whose own programs are cached; with the persistent cache on, that compilation is a cache
  hit, so a rerun on new data of the same shapes compiles (almost) nothing. The
  ``numpyro-subsample`` command turns the cache on by default (``--no-compile-cache`` opts out).
- :func:`xla_fast_compile` compiles without XLA's expensive optimisations (``--quick``).
- :func:`use_device` runs a block on a JAX platform (``--device``) and names the device.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
from jax import monitoring

__all__ = [
    "CompileTimer",
    "default_cache_root",
    "quiet",
    "setup_compile_cache",
    "use_device",
    "xla_fast_compile",
    "xla_optimized",
]

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


class CompileTimer:
    """Seconds spent tracing and compiling with JAX inside a ``with`` block (``.seconds``), and
    which programs XLA compiled there.

    Listens to JAX's monitoring events (time spans of tracing, lowering to MLIR and XLA
    compilation); nested spans (a function traced inside another) are merged, so nothing is
    counted twice. Subtract ``.seconds`` from a wall time to get the time without compilation.
    ``programs`` lists the programs handed to XLA, ``cache_hits`` how many of those the
    persistent compilation cache served, ``compiled`` the difference, and ``per_program`` the
    traced + lowered + compiled seconds of each program name.

    Examples
    --------
    >>> with CompileTimer() as ct:
    ...     t0 = time.perf_counter()
    ...     mcmc.run(key, X, y)
    ...     sampling_s = time.perf_counter() - t0 - ct.seconds
    """

    def __enter__(self) -> CompileTimer:
        self._spans: list[tuple[float, float]] = []
        self.programs: list[str] = []
        self.per_program: dict[str, float] = {}
        self.cache_hits = 0
        monitoring.register_event_time_span_listener(self._listen)
        monitoring.register_event_listener(self._count)
        return self

    def _listen(self, event: str, start: float, end: float, **kwargs) -> None:
        if event in _COMPILE_EVENTS:
            self._spans.append((start, end))
            # tracing reports ``f``, lowering and compiling ``jit(f)``: one name per program
            name = str(kwargs.get("fun_name", "?")).removeprefix("jit(").removesuffix(")")
            self.per_program[name] = self.per_program.get(name, 0.0) + end - start
            if event == _COMPILE_EVENTS[2]:
                self.programs.append(name)

    def _count(self, event: str, **kwargs) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.cache_hits += 1

    def __exit__(self, *exc) -> None:
        monitoring.unregister_event_time_span_listener(self._listen)
        monitoring.unregister_event_listener(self._count)

    @property
    def compiled(self) -> int:
        """XLA compilations in the block (programs not served by the persistent cache)."""
        return len(self.programs) - self.cache_hits

    @property
    def seconds(self) -> float:
        """Total length of the union of the compilation spans seen so far."""
        total, cur_start, cur_end = 0.0, None, None
        for a, b in sorted(self._spans):
            if cur_end is None or a > cur_end:
                if cur_end is not None:
                    total += cur_end - cur_start
                cur_start, cur_end = a, b
            else:
                cur_end = max(cur_end, b)
        if cur_end is not None:
            total += cur_end - cur_start
        return total


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/numpyro_subsample`` (default ``~/.cache/numpyro_subsample``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "numpyro_subsample"


def setup_compile_cache(cache_dir: str | os.PathLike | None = None, *,
                        enabled: bool = True) -> str | None:
    """Point JAX's persistent compilation cache at ``cache_dir``; return the folder in use.

    Parameters
    ----------
    cache_dir
        Folder of the cache (created if missing); default ``default_cache_root() / "jax"``.
    enabled
        ``False`` configures nothing and returns ``None`` (the command's
        ``--no-compile-cache``).

    Returns
    -------
    str or None
        The cache folder in use. A cache already configured in this process (by a test suite
        or the user's own ``jax.config``) is left alone and returned. ``None`` if disabled or
        the folder cannot be created (a note is printed on stderr).

    Notes
    -----
    Every compiled program is cached (no minimum compile time or size): most of a cold run
    is many compilations of a second or less, and NumPyro's ``MCMC.run`` compiles its loop
    on every call, which the cache turns into a hit.
    """
    if not enabled:
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:
        return str(current)
    path = Path(cache_dir).expanduser() if cache_dir else default_cache_root() / "jax"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"note: no compilation cache ({path}: {err})", file=sys.stderr)
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(path)


@contextlib.contextmanager
def xla_fast_compile(on: bool = True) -> Iterator[None]:
    """Set ``jax_disable_most_optimizations`` inside the block (restored afterwards).

    Compilation is much faster and the compiled code slower: right for short runs whose
    time is mostly compilation, wrong for timing comparisons.
    """
    with _most_optimizations_disabled(lambda before: bool(on) or before):
        yield


@contextlib.contextmanager
def xla_optimized() -> Iterator[None]:
    """Compile with XLA's optimisations inside the block, even within
    :func:`xla_fast_compile` (restored afterwards): for a long loop, such as the NUTS
    reference's, whose run time outweighs its compilation."""
    with _most_optimizations_disabled(lambda before: False):
        yield


@contextlib.contextmanager
def _most_optimizations_disabled(value: Callable[[bool], bool]) -> Iterator[None]:
    """Set ``jax_disable_most_optimizations`` to ``value(its current value)`` inside the
    block, and back afterwards."""
    before = bool(jax.config.read("jax_disable_most_optimizations"))
    jax.config.update("jax_disable_most_optimizations", value(before))
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence Python warnings (NumPyro's and JAX's) inside the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def use_device(platform: str | None = None) -> Iterator[str]:
    """Make the first device of JAX's ``platform`` (``"cpu"``, ``"gpu"``, ``"cuda"``,
    ``"rocm"``, ``"tpu"``) the default inside the block (:func:`jax.default_device`); yield
    its description, e.g. ``"cpu (TFRT_CPU_0, 1 of 1)"``. ``None``: JAX's default device.

    Raises ``ValueError`` naming ``--device`` and the platforms present if there is no such
    platform.
    """
    if platform:
        try:
            devices = jax.devices(platform)
        except RuntimeError as err:
            raise ValueError(
                f"--device {platform!r}: JAX has no such platform here ({_first(err)}); "
                f"pass one of the platforms present: {sorted({d.platform for d in jax.devices()})}"
                " (a GPU needs jax installed with its CUDA or ROCm plugin)."
            ) from None
    else:
        devices = jax.devices()
    dev = devices[0]
    with jax.default_device(dev):
        yield f"{dev.platform} ({dev}, 1 of {len(devices)})"


def _first(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__
