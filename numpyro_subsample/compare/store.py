"""What the comparison keeps on disk, checked: each method's run and the NUTS reference.

- :func:`check_out_dir` makes sure ``--out`` is a writable folder before any work.
- :class:`RunStore` writes each method's :class:`~numpyro_subsample.compare.runners.RunOutput`
  as soon as it finishes, to ``<out>/runs/<method>.npz`` (draws, passes, seconds) and
  ``<out>/runs/<method>.json`` (timings, warnings, run checks, the key, the arrays' checksum and
  its own; written last, it marks the run as complete). A run is found again only under the
  same key: a hash of the problem's fingerprint, the chain settings, the seed, the method's
  specification and the package version; a file under another key is stale and ignored.
- :func:`save_arrays` / :func:`load_arrays`: ``.npz`` files that carry the SHA-256 of their
  arrays (names, dtypes, shapes, bytes), written atomically (temporary file + rename). A file
  that cannot be read or whose checksum differs raises :class:`CorruptCacheError`; callers
  warn (:class:`CacheWarning`, naming the path) and recompute.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = [
    "CHECKSUM_KEY",
    "CacheWarning",
    "CorruptCacheError",
    "RunStore",
    "arrays_digest",
    "check_out_dir",
    "load_arrays",
    "save_arrays",
]

CHECKSUM_KEY = "_sha256"
RUN_FORMAT = 1


class CacheWarning(UserWarning):
    """A cache entry was unreadable or failed its checksum and is recomputed."""


class CorruptCacheError(ValueError):
    """A cache file that cannot be read or whose checksum does not match."""


def check_out_dir(out: str | os.PathLike) -> Path:
    """Create ``out`` if needed and check that files can be written there.

    Raises ``ValueError`` naming the path if it exists and is not a folder, cannot be created,
    or refuses a test file.
    """
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {str(path)!r} exists and is not a folder; pass a folder.")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ValueError(
            f"--out {str(path)!r} is not a writable folder ({type(err).__name__}: "
            f"{err.strerror or err}); pass a folder you can write to."
        ) from None
    return path


def arrays_digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 (hex) of the arrays' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        if name == CHECKSUM_KEY:
            continue
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _atomic_write(path: Path, write) -> None:
    """``write(fh)`` into a temporary file next to ``path``, then rename it to ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_arrays(path: str | os.PathLike, arrays: dict[str, Any]) -> str:
    """Write ``arrays`` to the ``.npz`` file ``path`` with their checksum; return it."""
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    digest = arrays_digest(arrays)
    _atomic_write(Path(path), lambda fh: np.savez(fh, **arrays, **{CHECKSUM_KEY: digest}))
    return digest


def load_arrays(path: str | os.PathLike, expected: str | None = None) -> dict[str, np.ndarray]:
    """The arrays of a :func:`save_arrays` file, checked against their stored checksum (and
    ``expected``, if given); :class:`CorruptCacheError` if unreadable or different."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as err:  # noqa: BLE001 - any read failure of a cache file means corrupt
        raise CorruptCacheError(f"unreadable ({type(err).__name__}: {err})") from None
    stored = arrays.pop(CHECKSUM_KEY, None)
    if stored is None:
        raise CorruptCacheError("no checksum stored")
    actual = arrays_digest(arrays)
    if str(stored) != actual or (expected is not None and expected != actual):
        raise CorruptCacheError(f"checksum mismatch (sha256 {actual[:12]}…, stored "
                                f"{str(stored)[:12]}…)")
    return arrays


def warn_corrupt(path: str | os.PathLike, what: str, err: Exception) -> None:
    """Warn that the cache file ``path`` (``what``) is corrupt and recomputed."""
    warnings.warn(CacheWarning(f"{what} {str(path)!r} is corrupt ({err}); recomputing it."),
                  stacklevel=2)


def _package_version() -> str:
    try:
        return version("numpyro_subsample")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.generic,)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@dataclass
class RunStore:
    """Per-method results in ``folder`` (``<out>/runs``), keyed by problem and settings.

    ``base`` holds the fields shared by every method (problem fingerprint, N, d, n, seed,
    chain settings, compile mode, float width, package version); :meth:`key` adds the
    method's specification. Picklable, so the worker process saves its runs itself.
    """

    folder: Path
    base: dict = field(default_factory=dict)

    @classmethod
    def for_problem(cls, out: str | os.PathLike, problem, settings, *, seed: int,
                    fast_compile: bool) -> RunStore:
        """The store of ``<out>/runs`` for ``problem`` (a compare ``Problem``) and settings."""
        base = {
            "format": RUN_FORMAT, "package": _package_version(), "dataset": problem.name,
            "fingerprint": problem.fingerprint(), "num_data": problem.num_data,
            "dim": problem.dim, "subsample_size": problem.subsample_size, "seed": int(seed),
            "sg_warmup": settings.sg_warmup, "sg_samples": settings.sg_samples,
            "nuts_warmup": settings.nuts_warmup, "nuts_samples": settings.nuts_samples,
            "ref_samples": settings.reference_samples,
            "fast_compile": bool(fast_compile), "x64": bool(jax.config.jax_enable_x64),
        }
        return cls(Path(out) / "runs", base)

    def key_fields(self, method) -> dict:
        """What the key of ``method`` (a compare ``Method``) hashes."""
        spec = {"name": method.name, "kind": method.kind,
                "kernel": getattr(method.kernel, "__qualname__", None),
                "options": {k: repr(v) for k, v in sorted((method.options or {}).items())}}
        return dict(self.base, method=spec)

    def key(self, method) -> str:
        """SHA-256 (hex, 24 characters) of :meth:`key_fields`."""
        text = json.dumps(self.key_fields(method), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def paths(self, name: str) -> tuple[Path, Path]:
        """``(<name>.json, <name>.npz)`` in the folder."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        return self.folder / f"{safe}.json", self.folder / f"{safe}.npz"

    def has(self, method) -> bool:
        """Whether a run record of ``method`` under the current key exists (not verified)."""
        jpath = self.paths(method.name)[0]
        try:
            return json.loads(jpath.read_text()).get("key") == self.key(method)
        except (OSError, ValueError, AttributeError):
            return False

    def save(self, method, out) -> Path:
        """Write ``out`` (a ``RunOutput``) of ``method``: arrays first, then the JSON record."""
        self.folder.mkdir(parents=True, exist_ok=True)
        jpath, npath = self.paths(method.name)
        arrays = {"passes": out.passes, "seconds": out.seconds,
                  **{f"s_{k}": v for k, v in out.samples.items()}}
        digest = save_arrays(npath, arrays)
        output = _jsonable({k: v for k, v in out._asdict().items()
                            if k not in ("samples", "passes", "seconds")})
        record = {
            "method": method.name, "key": self.key(method),
            "key_fields": self.key_fields(method), "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            "arrays": npath.name, "arrays_sha256": digest,
            "output": output, "output_sha256": _json_digest(output),
        }
        text = json.dumps(record, indent=1).encode()
        _atomic_write(jpath, lambda fh: fh.write(text))
        return jpath

    def load(self, method, output_type):
        """``(output, reason)``: the saved run of ``method`` as ``output_type`` (the
        ``RunOutput`` class) and when it was saved, or ``None`` and why not.

        ``None`` if there is no record, or it was made under another key (stale). A corrupt
        record or array file warns (:class:`CacheWarning`, naming the path) and gives ``None``.
        """
        jpath, npath = self.paths(method.name)
        if not jpath.is_file():
            return None, "no saved result"
        try:
            record = json.loads(jpath.read_text())
            if not isinstance(record, dict) or "output" not in record:
                raise CorruptCacheError("not a run record")
            if record.get("output_sha256") != _json_digest(record["output"]):
                raise CorruptCacheError("checksum mismatch of its output record")
        except (ValueError, OSError, UnicodeDecodeError) as err:
            warn_corrupt(jpath, "saved run", err)
            return None, "corrupt"
        if record.get("key") != self.key(method):
            return None, f"stale (saved for other settings, key {record.get('key')})"
        try:
            arrays = load_arrays(npath, record.get("arrays_sha256"))
        except CorruptCacheError as err:
            warn_corrupt(npath, "saved run", err)
            return None, "corrupt"
        try:
            out = _output_from(record["output"], arrays, output_type)
        except (TypeError, KeyError, ValueError, AttributeError) as err:
            warn_corrupt(jpath, "saved run", CorruptCacheError(f"bad record: {err}"))
            return None, "corrupt"
        return out, f"saved {record.get('finished', '?')}"


def _json_digest(x: Any) -> str:
    return hashlib.sha256(json.dumps(x, sort_keys=True).encode()).hexdigest()


def _output_from(o: dict, arrays: dict, output_type):
    """``output_type`` (``RunOutput``) from a run record's ``output`` and its arrays."""
    samples = {k[2:]: v for k, v in arrays.items() if k.startswith("s_")}
    fields = {k: o[k] for k in output_type._fields
              if k in o and k not in ("samples", "passes", "seconds")}
    fields = {k: (math.nan if v is None and k.endswith("_s") else v) for k, v in fields.items()}
    if "warnings" in fields:
        fields["warnings"] = tuple(tuple(w) for w in fields["warnings"])
    return output_type(samples=samples, passes=arrays["passes"], seconds=arrays["seconds"],
                       **fields)
