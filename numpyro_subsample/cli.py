"""The ``numpyro-subsample`` command.

``numpyro-subsample compare`` runs every available sampler/estimator of the package on one
problem (default: a deterministic synthetic Bayesian logistic regression, N = 2·10^5, d = 21),
plus NumPyro NUTS on the full data (the reference) and NumPyro HMCECS with ``taylor_proxy``,
and prints one table: method, preprocessing s, sampling s, compile s, data passes,
iterations/s, ESS/s, worst standardised mean error and worst |log sd ratio| versus the
reference, and the kernel Stein discrepancy (paper 000 Eq. 20-21). It saves the table as CSV
and JSON and a plot of error/KSD against data passes and seconds in ``--out``.

Available kernels and estimators are discovered at run time (``numpyro_subsample.__all__`` and
``numpyro_subsample.estimators.ESTIMATORS``); ones whose module is missing are skipped with a
note. See ``docs/cli_benchmarks.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import json
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main", "available_methods", "run_compare"]

QUICK_ENV = "NUMPYRO_SUBSAMPLE_QUICK"


# -- method discovery -----------------------------------------------------------------------------
@dataclass
class Method:
    """One row of the comparison: a package kernel × estimator, or a NumPyro baseline."""

    name: str
    kind: str  # "nuts" | "hmcecs" | "sg" | "kernel"
    kernel_cls: Any = None
    estimator: str | None = None
    default: bool = True


@dataclass
class Discovery:
    methods: dict[str, Method] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


_BUILTIN_ESTIMATORS = ("uniform", "cv")


def _estimator_module(name: str) -> str | None:
    """The module implementing a named estimator (None for the core's own)."""
    if name in _BUILTIN_ESTIMATORS:
        return None
    base = name[3:] if name.startswith("cv-") else name
    return f"numpyro_subsample.{base.replace('-', '_')}"


def available_methods() -> Discovery:
    """Discover kernels (classes in ``numpyro_subsample.__all__``) and estimators now."""
    from numpyro.infer.mcmc import MCMCKernel

    import numpyro_subsample as pkg

    from numpyro_subsample.estimators.base import ESTIMATORS
    from numpyro_subsample.sgmcmc.kernel import SGMCMCKernel

    found = Discovery()
    found.methods["nuts"] = Method("nuts", "nuts")
    found.methods["hmcecs"] = Method("hmcecs", "hmcecs")
    estimators, modules_ok = [], {}
    for est in ESTIMATORS:
        mod = _estimator_module(est)
        if mod is not None and mod not in modules_ok:
            try:
                ok = importlib.util.find_spec(mod) is not None
                if ok:
                    importlib.import_module(mod)
                modules_ok[mod] = "" if ok else "module not present"
            except Exception as err:  # noqa: BLE001 - another engineer's module may be broken
                modules_ok[mod] = f"import failed: {type(err).__name__}: {err}"
        reason = modules_ok.get(mod, "") if mod else ""
        if reason:
            found.skipped.append(f"estimator {est!r}: {mod} {reason}")
        else:
            estimators.append(est)
    for attr in getattr(pkg, "__all__", []):
        obj = getattr(pkg, attr, None)
        if not isinstance(obj, type) or obj is SGMCMCKernel:
            continue
        if issubclass(obj, SGMCMCKernel):
            for est in estimators:
                # every estimator with SGLD; the other kernels with their default ("cv")
                default = attr == "SGLD" or est == "cv"
                name = f"{attr.lower()}-{est}"
                found.methods[name] = Method(name, "sg", obj, est, default)
        elif issubclass(obj, MCMCKernel):
            name = attr.lower()
            found.methods[name] = Method(name, "kernel", obj, None, True)
    return found


# -- problems -------------------------------------------------------------------------------------
@dataclass
class Problem:
    name: str
    model: Callable
    X: Any
    y: Any
    subsample_size: int
    task: str
    info: dict

    @property
    def num_data(self) -> int:
        return int(self.X.shape[0])

    @property
    def dim(self) -> int:
        return int(self.X.shape[1])

    def args(self) -> tuple:
        return (self.X, self.y)

    def kwargs(self, full: bool = False) -> dict:
        return {"subsample_size": self.num_data if full else self.subsample_size}

    def fingerprint(self) -> str:
        h = hashlib.sha1()
        for a in (self.X, self.y):
            arr = np.ascontiguousarray(np.asarray(a))
            h.update(str(arr.shape).encode())
            h.update(arr.tobytes())
        return h.hexdigest()[:12]


def make_problem(args: argparse.Namespace) -> Problem:
    import jax.numpy as jnp

    from numpyro_subsample import datasets

    if args.dataset in (None, "default", "synthetic"):
        n_data = args.num_data or (10_000 if args.quick else 200_000)
        ds = datasets.default_problem(n_data)
    else:
        ds = datasets.load_dataset(args.dataset, args.data_dir, seed=args.seed)
        cap = args.num_data or (10_000 if args.quick else None)  # --quick: a 10^4-row subset
        if cap and cap < ds.num_data:
            rng = np.random.default_rng(args.seed)
            keep = np.sort(rng.choice(ds.num_data, cap, replace=False))
            ds = ds._replace(X_train=ds.X_train[keep], y_train=ds.y_train[keep])
    if ds.task not in ("logistic", "linear"):
        raise ValueError(f"Task {ds.task!r} is not supported by compare.")
    n = args.subsample_size or min(1000, max(ds.num_data // 100, 10))
    if not 1 <= n < ds.num_data:
        raise ValueError(
            f"--subsample-size must be between 1 and N-1 = {ds.num_data - 1}, got {n}."
        )
    return Problem(ds.name, ds.model, jnp.asarray(ds.X_train), jnp.asarray(ds.y_train), n,
                   ds.task, ds.info)


# -- settings -------------------------------------------------------------------------------------
@dataclass
class Settings:
    sg_warmup: int
    sg_samples: int
    nuts_warmup: int
    nuts_samples: int
    ksd_draws: int
    checkpoints: int = 12
    ksd_points: int = 5  # prefixes of the curve with a KSD (each length compiles the KSD once)


def settings_for(args: argparse.Namespace) -> Settings:
    if args.quick:
        s = Settings(300, 3000, 200, 300, 150, ksd_points=3)
    else:
        s = Settings(1000, 20_000, 500, 1000, 500)
    if args.num_samples:
        s.sg_samples = args.num_samples
    if args.nuts_samples:
        s.nuts_samples = args.nuts_samples
    if args.no_ksd:
        s.ksd_draws = 0
    return s


# -- metrics --------------------------------------------------------------------------------------
def _flatten(samples: dict, sites: Sequence[str]) -> np.ndarray:
    parts = []
    for k in sites:
        v = np.asarray(samples[k], np.float64)
        parts.append(v.reshape(v.shape[0], -1))
    return np.concatenate(parts, axis=1)


def _errors(draws: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    sd = ref.std(0)
    mean_err = np.abs(draws.mean(0) - ref.mean(0)) / sd
    sd_err = np.abs(np.log(draws.std(0) / sd))
    return float(mean_err.max()), float(sd_err.max())


def _min_ess(draws: np.ndarray) -> float:
    from numpyro.diagnostics import effective_sample_size

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(np.nanmin(effective_sample_size(draws[None])))


class ScoreFn:
    """∇ log π(θ) over the full data at many θ at once (for the KSD), chunked over data."""

    def __init__(self, problem: Problem, chunk: int = 2048):
        import jax
        import jax.numpy as jnp

        from numpyro_subsample.core.datapass import chunk_indices
        from numpyro_subsample.core.potential import build_potential

        pot = build_potential(problem.model, problem.args(), problem.kwargs(),
                              jax.random.PRNGKey(0))
        self.potential = pot
        idx, mask = chunk_indices(pot.num_data, chunk)

        @jax.jit
        def score(thetas):
            def body(acc, xs):
                i, m = xs
                f = lambda t: jnp.dot(m.astype(t.dtype), pot.data_terms(t, i))
                return acc + jax.vmap(jax.grad(f))(thetas), None

            g = jax.lax.scan(body, jnp.zeros_like(thetas), (idx, mask))[0]
            return -(g + jax.vmap(jax.grad(pot.prior))(thetas))

        self._score = score

    def __call__(self, thetas: np.ndarray) -> np.ndarray:
        import jax.numpy as jnp

        return np.asarray(self._score(jnp.asarray(thetas, self.potential.init_theta.dtype)))


def _ksd_available() -> tuple[Callable | None, str]:
    try:
        from numpyro_subsample.post.diagnostics import ksd
    except Exception as err:  # noqa: BLE001 - the module is written concurrently
        return None, f"numpyro_subsample.diagnostics.ksd not importable ({err}); KSD n/a"
    return ksd, ""


@dataclass
class Result:
    method: str
    status: str = "ok"
    note: str = ""
    preprocessing_s: float = math.nan
    sampling_s: float = math.nan
    compile_s: float = math.nan
    data_passes: float = math.nan
    iterations: int = 0
    it_per_s: float = math.nan
    ess_per_s: float = math.nan
    mean_err: float = math.nan
    sd_log_ratio: float = math.nan
    ksd: float = math.nan
    curve: dict = field(default_factory=dict)

    def row(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "curve"}
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in d.items()}


@dataclass
class Trace:
    """What a run leaves for the metrics: draws, and cost (passes, seconds) along the chain."""

    draws: np.ndarray  # (S, D) flattened, reference site order
    passes: np.ndarray  # (S,) cumulative data passes at each draw (incl. preprocessing, warmup)
    seconds: np.ndarray  # (S,) cumulative seconds (preprocessing + sampling, no compile)


def evaluate(result: Result, trace: Trace, ref: np.ndarray, settings: Settings,
             score: ScoreFn | None, ksd: Callable | None) -> None:
    S = trace.draws.shape[0]
    result.mean_err, result.sd_log_ratio = _errors(trace.draws, ref)
    total = result.preprocessing_s + result.sampling_s
    result.ess_per_s = _min_ess(trace.draws) / total if total > 0 else math.nan
    # Thinned draws for the KSD and the curves.
    K = settings.ksd_draws
    thin_idx = np.unique(np.linspace(0, S - 1, min(max(K, 1), S)).astype(int)) if K else None
    ksd_draws = scores = None
    if K and ksd is not None and score is not None:
        ksd_draws = trace.draws[thin_idx]
        scores = score(ksd_draws)
        result.ksd = float(ksd(ksd_draws, scores))
    lo = max(min(20, S), S // 100)
    points = np.unique(np.geomspace(lo, S, settings.checkpoints).astype(int))
    curve = {"draws": [], "passes": [], "seconds": [], "mean_err": [], "ksd": []}
    # KSD of prefixes at a few of the points only: each prefix length compiles the KSD once
    # (the lengths are the same for every method with the same chain length, so it is shared).
    pick = np.linspace(0, len(points) - 1, settings.ksd_points).astype(int)
    ksd_at = set(points[np.unique(pick)].tolist())
    for k in points:
        curve["draws"].append(int(k))
        curve["passes"].append(float(trace.passes[k - 1]))
        curve["seconds"].append(float(trace.seconds[k - 1]))
        curve["mean_err"].append(_errors(trace.draws[:k], ref)[0])
        if ksd_draws is not None:
            m = int(np.searchsorted(thin_idx, k - 1, side="right"))
            ok = m >= 2 and int(k) in ksd_at
            curve["ksd"].append(float(ksd(ksd_draws[:m], scores[:m])) if ok else None)
    result.curve = curve


# -- runners --------------------------------------------------------------------------------------
def _block(x):
    import jax

    return jax.block_until_ready(x)


def _quiet():
    """Silence NumPyro/JAX warnings during a run."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    return stack


_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


class CompileTimer:
    """Seconds spent tracing and compiling with JAX inside the block (``.seconds``).

    Uses JAX's own monitoring events (time spans of tracing, lowering and XLA compilation);
    nested spans (a jit traced inside another) are merged, so nothing is counted twice.
    NumPyro's ``MCMC.run`` re-traces and re-compiles its loop on every call, so timing a
    second run does not separate compilation; these events do.
    """

    def __enter__(self) -> CompileTimer:
        from jax import monitoring

        self._spans: list[tuple[float, float]] = []

        def listener(event, start, end, **kwargs):
            if event in _COMPILE_EVENTS:
                self._spans.append((start, end))

        self._listener = listener
        monitoring.register_event_time_span_listener(listener)
        return self

    def __exit__(self, *exc) -> None:
        from jax import monitoring

        monitoring.unregister_event_time_span_listener(self._listener)

    @property
    def seconds(self) -> float:
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


def run_nuts(problem: Problem, settings: Settings, seed: int, progress: bool) -> dict:
    """NumPyro NUTS on the full data (warm-up + draws in one compiled loop).

    ``NUTS.init``/``NUTS.sample`` under :func:`numpyro.util.fori_collect` with the warm-up
    collected, which is what ``MCMC.warmup(collect_warmup=True)`` + ``MCMC.run`` do, but
    compiled once instead of twice; the warm-up's leapfrog steps are counted as data passes.
    """
    import jax
    from numpyro.infer import NUTS
    from numpyro.util import fori_collect

    W, S = settings.nuts_warmup, settings.nuts_samples
    kernel = NUTS(problem.model)
    args, kwargs = problem.args(), problem.kwargs(full=True)
    with _quiet(), CompileTimer() as ct:
        t0 = time.perf_counter()
        state = kernel.init(jax.random.PRNGKey(seed), W, None, args, kwargs)
        zs, steps = fori_collect(
            0, W + S, lambda s: kernel.sample(s, args, kwargs), state,
            transform=lambda s: (s.z, s.num_steps), progbar=progress,
        )
        samples = jax.vmap(kernel.postprocess_fn(args, kwargs))(
            jax.tree.map(lambda x: x[W:], zs))
        samples = {k: np.asarray(v) for k, v in samples.items()}
        total = time.perf_counter() - t0 - ct.seconds
    steps = np.asarray(steps, float)
    # one full-data gradient per leapfrog step = one data pass; time spread over the steps
    cum = np.cumsum(steps)
    passes = cum[W:]
    seconds = total * passes / cum[-1]
    return {"samples": samples, "passes": passes, "seconds": seconds,
            "sampling_s": total, "preprocessing_s": 0.0, "compile_s": ct.seconds,
            "iterations": W + S}


@dataclass
class SharedProxy:
    """The Laplace proxy fitted once per problem and passed to every method that uses one.

    Every stochastic-gradient kernel would fit exactly this proxy itself (same seed split, same
    settings as ``SGMCMCKernel.preprocess``); fitting it once removes the repeated fit *and* its
    JAX compilation (Adam loop, Newton passes, per-datum gradients: several seconds per method
    in a cold process). Each method is still charged the fit's seconds and data passes.
    """

    proxy: Any
    potential: Any
    seconds: float  # wall time without compilation
    compile_s: float


def fit_shared_proxy(problem: Problem, seed: int, progress: bool) -> SharedProxy:
    import jax

    from numpyro_subsample.core.potential import build_potential
    from numpyro_subsample.proxies.laplace import fit_laplace

    # the seed split of SGMCMCKernel.preprocess (k_model, k_proxy, k_noise)
    k_model, k_proxy, _ = jax.random.split(jax.random.PRNGKey(seed), 3)
    with _quiet(), CompileTimer() as ct:
        t0 = time.perf_counter()
        pot = build_potential(problem.model, problem.args(), problem.kwargs(), k_model)
        # the kernels' default: no N×d table of ∇f_i(θ̂) (recomputed on each subsample)
        proxy = fit_laplace(pot, k_proxy, store_datum_grads=False, progress=progress)
        _block(proxy.centre)
        seconds = time.perf_counter() - t0 - ct.seconds
    return SharedProxy(proxy, pot, seconds, ct.seconds)


def run_hmcecs(problem: Problem, settings: Settings, seed: int, progress: bool,
               shared: SharedProxy) -> dict:
    """NumPyro HMCECS (NUTS inner kernel) with ``taylor_proxy`` at the posterior mode.

    The mode is the centre of the shared Laplace proxy (Adam on minibatches + full-data Newton,
    the same MAP the package kernels start from); its seconds and data passes are charged here.
    """
    import jax
    from numpyro.infer import HMCECS, MCMC, NUTS

    N, n = problem.num_data, problem.subsample_size
    pot = shared.potential
    z_hat = pot.unravel(shared.proxy.centre)
    ref_params = {k: v for k, v in pot.constrain(z_hat).items() if k in z_hat}
    num_blocks = 100 if n >= 100 else 1
    kernel = HMCECS(NUTS(problem.model), num_blocks=num_blocks,
                    proxy=HMCECS.taylor_proxy(ref_params))
    mcmc = MCMC(kernel, num_warmup=settings.nuts_warmup, num_samples=settings.nuts_samples,
                progress_bar=progress)
    with _quiet(), CompileTimer() as ct_run:
        t1 = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed), *problem.args(), **problem.kwargs(),
                 extra_fields=("hmc_state.num_steps",))
        samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
        sampling_s = time.perf_counter() - t1 - ct_run.seconds
    steps = np.asarray(mcmc.get_extra_fields()["hmc_state.num_steps"], float)
    # proxy: the Laplace fit's passes + one full pass (per-datum values, gradients, Hessians
    # at the mode, inside HMCECS's init); each iteration: one subsample per leapfrog step + the
    # Gibbs proposal.
    pre_passes = shared.proxy.num_data_passes + 1.0
    warm = settings.nuts_warmup * (steps.mean() + 1) * n / N
    passes = pre_passes + warm + np.cumsum(steps + 1) * n / N
    frac = (settings.nuts_warmup + np.arange(1, steps.size + 1)) / (
        settings.nuts_warmup + steps.size)
    pre_s = shared.seconds
    return {"samples": samples, "passes": passes, "seconds": pre_s + sampling_s * frac,
            "sampling_s": sampling_s, "preprocessing_s": pre_s,
            "compile_s": ct_run.seconds, "iterations": settings.nuts_warmup + settings.nuts_samples,
            "note": "warm-up passes estimated from the sampling phase's steps; taylor_proxy at "
                    "the shared Laplace mode"}


def run_package_kernel(method: Method, problem: Problem, settings: Settings, seed: int,
                       progress: bool, shared: SharedProxy | None = None) -> dict:
    """A package kernel under ``numpyro.infer.MCMC``; compile time measured separately.

    Stochastic-gradient kernels get the ``shared`` Laplace proxy (``proxy=Proxy``) and are
    charged its fit time; the proxy's data passes are counted by the kernel itself.
    """
    import jax
    from numpyro.infer import MCMC

    pre_s = pre_compile = 0.0
    if method.kind == "sg":
        opts = {}
        if shared is not None:
            opts["proxy"] = shared.proxy
            pre_s = shared.seconds
        kernel = method.kernel_cls(problem.model, estimator=method.estimator, seed=seed,
                                   progress_bar=progress, **opts)
    else:
        kernel = method.kernel_cls(problem.model)
    if method.kind == "sg":
        W, S = settings.sg_warmup, settings.sg_samples
    else:  # an MH-corrected kernel (e.g. energy-conserving HMC): NUTS-length chains
        W, S = settings.nuts_warmup, settings.nuts_samples
    mcmc = MCMC(kernel, num_warmup=W, num_samples=S, progress_bar=False)
    key = jax.random.PRNGKey(seed)
    with _quiet():
        if hasattr(kernel, "preprocess"):
            with CompileTimer() as ct_pre:
                t0 = time.perf_counter()
                kernel.preprocess(problem.args(), problem.kwargs())
                pre_s += time.perf_counter() - t0 - ct_pre.seconds
            pre_compile = ct_pre.seconds
        with CompileTimer() as ct_run:
            t1 = time.perf_counter()
            mcmc.run(key, *problem.args(), **problem.kwargs())
            samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
            sampling_s = time.perf_counter() - t1 - ct_run.seconds
    extra = mcmc.get_extra_fields()
    note = ""
    if "data_passes" in extra:
        passes = np.asarray(extra["data_passes"], float).reshape(S)
    else:
        passes = np.full(S, math.nan)
        note = "kernel reports no data_passes"
    if "diverging" in extra:
        nd = int(np.sum(np.asarray(extra["diverging"])))
        if nd:
            note = (note + "; " if note else "") + f"{nd} rejected non-finite steps"
    frac = (W + np.arange(1, S + 1)) / (W + S)
    return {"samples": samples, "passes": passes, "seconds": pre_s + sampling_s * frac,
            "sampling_s": sampling_s, "preprocessing_s": pre_s,
            "compile_s": pre_compile + ct_run.seconds, "iterations": W + S, "note": note}


# -- the reference cache --------------------------------------------------------------------------
def _cache_dir(args) -> Path:
    if args.cache_dir:
        return Path(args.cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    return Path(base) / "numpyro_subsample" / "reference"


def reference(problem: Problem, settings: Settings, args, progress: bool) -> tuple[dict, bool]:
    """NUTS reference, cached on disk keyed by data set (name + content hash) and seed."""
    key = (f"v2_{problem.name}_N{problem.num_data}_d{problem.dim}_{problem.fingerprint()}"
           f"_seed{args.seed}_w{settings.nuts_warmup}_s{settings.nuts_samples}")
    path = _cache_dir(args) / f"{key}.npz"
    if path.is_file() and not args.no_cache:
        with np.load(path, allow_pickle=False) as z:
            out = {
                "samples": {k[2:]: z[k] for k in z.files if k.startswith("s_")},
                "passes": z["passes"], "seconds": z["seconds"],
                "sampling_s": float(z["sampling_s"]), "preprocessing_s": 0.0,
                "compile_s": float(z["compile_s"]), "iterations": int(z["iterations"]),
            }
        return out, True
    out = run_nuts(problem, settings, args.seed, progress)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, passes=out["passes"], seconds=out["seconds"],
                 sampling_s=out["sampling_s"], compile_s=out["compile_s"],
                 iterations=out["iterations"],
                 **{f"s_{k}": v for k, v in out["samples"].items()})
    except OSError as err:
        print(f"note: could not write the reference cache {path}: {err}", file=sys.stderr)
    return out, False


# -- output ---------------------------------------------------------------------------------------
COLUMNS = [
    ("method", "method", "{}"),
    ("preprocessing_s", "prep s", "{:.2f}"),
    ("sampling_s", "sampling s", "{:.2f}"),
    ("compile_s", "compile s", "{:.2f}"),
    ("data_passes", "passes", "{:.1f}"),
    ("it_per_s", "it/s", "{:.0f}"),
    ("ess_per_s", "ESS/s", "{:.1f}"),
    ("mean_err", "mean err", "{:.3f}"),
    ("sd_log_ratio", "|log sd|", "{:.3f}"),
    ("ksd", "KSD", "{:.3g}"),
    ("status", "status", "{}"),
]


def format_table(rows: list[dict]) -> str:
    cells = [[h for _, h, _ in COLUMNS]]
    for r in rows:
        line = []
        for key, _, fmt in COLUMNS:
            v = r.get(key)
            line.append("n/a" if v is None else fmt.format(v))
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    out = []
    for j, c in enumerate(cells):
        out.append("  ".join(x.ljust(w) if i == 0 else x.rjust(w)
                             for i, (x, w) in enumerate(zip(c, widths, strict=False))))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_outputs(out: Path, rows: list[dict], curves: dict, meta: dict) -> dict[str, Path]:
    import csv

    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "compare.csv", "json": out / "compare.json", "png": out / "compare.png"}
    keys = [k for k, _, _ in COLUMNS] + ["iterations", "note"]
    with open(paths["csv"], "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})
    with open(paths["json"], "w") as fh:
        json.dump({"meta": meta, "rows": rows, "curves": curves}, fh, indent=1)
    plot(paths["png"], curves, meta)
    return paths


def plot(path: Path, curves: dict, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_ksd = any(any(v is not None for v in c.get("ksd", [])) for c in curves.values())
    metrics = [("mean_err", "worst standardised mean error")]
    if has_ksd:
        metrics.append(("ksd", "KSD"))
    fig, axes = plt.subplots(len(metrics), 2, figsize=(11, 3.8 * len(metrics)), squeeze=False)
    # one colour per method in every panel (the default cycle repeats after 10 lines)
    colours = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(curves)}
    for row, (metric, label) in enumerate(metrics):
        for col, (xkey, xlabel) in enumerate([("passes", "data passes"), ("seconds", "seconds")]):
            ax = axes[row, col]
            for name, c in curves.items():
                pts = [(x, y) for x, y in zip(c[xkey], c.get(metric, []), strict=False) if
                       y is not None and x is not None and np.isfinite(x) and x > 0]
                if pts:
                    xs, ys = zip(*pts, strict=False)
                    ax.plot(xs, ys, marker="o", ms=3, label=name, color=colours[name])
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
    if curves:
        axes[0, 1].legend(fontsize=7)  # the seconds panel has every method
    fig.suptitle(f"{meta['dataset']}: N={meta['num_data']}, d={meta['dim']}, "
                 f"n={meta['subsample_size']} (vs NUTS reference)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _machine() -> dict:
    import jax
    import numpyro

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
        "devices": [str(d) for d in jax.devices()],
    }


# -- the command ----------------------------------------------------------------------------------
def _progress_default() -> bool:
    return sys.stderr.isatty() and "CI" not in os.environ


def select_methods(found: Discovery, spec: str | None, quick: bool = False) -> list[Method]:
    """``default``: NUTS, HMCECS, SGLD with every estimator, other kernels with ``"cv"``
    (with ``quick``: SGLD only); ``all``: every kernel × estimator; or a comma list."""
    if spec in (None, "", "default"):
        return [m for m in found.methods.values()
                if m.default and not (quick and m.kind == "sg" and m.name.split("-")[0] != "sgld")]
    if spec == "all":
        return list(found.methods.values())
    chosen, unknown = [], []
    for name in (s.strip().lower() for s in spec.split(",")):
        if not name:
            continue
        if name in found.methods:
            chosen.append(found.methods[name])
        else:
            unknown.append(name)
    if unknown:
        skipped = "".join(f"\n  skipped: {s}" for s in found.skipped)
        raise ValueError(
            f"Unknown or unavailable method(s) {unknown}. Available: "
            f"{', '.join(found.methods)} (or 'default', 'all').{skipped}"
        )
    if not chosen:
        raise ValueError("--methods selected nothing.")
    return chosen


def _peer_runs(problem: Problem, settings: Settings, args: argparse.Namespace,
               with_hmcecs: bool) -> tuple[tuple[dict, bool], dict | Exception | None]:
    """NUTS reference and NumPyro HMCECS, in a worker process (``--jobs 2``).

    The worker configures JAX as the main process does (fast compile, compilation cache) and
    fits the shared Laplace proxy itself (same seed: the same mode) for HMCECS's Taylor proxy.
    """
    import jax

    if args.fast_compile:
        jax.config.update("jax_disable_most_optimizations", True)
    setup_compile_cache(args)  # args.compile_cache_dir: the folder the main process uses
    ref = reference(problem, settings, args, False)
    hmcecs: dict | Exception | None = None
    if with_hmcecs:
        try:
            shared = fit_shared_proxy(problem, args.seed, False)
            hmcecs = run_hmcecs(problem, settings, args.seed, False, shared)
        except Exception as err:  # noqa: BLE001 - reported as the method's failure
            hmcecs = err
    return ref, hmcecs


def run_compare(args: argparse.Namespace) -> dict:
    """Run the comparison; returns {"rows", "curves", "meta", "paths"}."""
    from tqdm.auto import tqdm

    progress = args.progress
    found = available_methods()
    methods = select_methods(found, args.methods, args.quick)
    for s in found.skipped:
        print(f"note: skipped {s}", file=sys.stderr)
    problem = make_problem(args)
    settings = settings_for(args)
    ksd_fn, ksd_note = _ksd_available()
    if settings.ksd_draws == 0:
        ksd_note = "KSD disabled (--no-ksd)"
    if ksd_note:
        print(f"note: {ksd_note}", file=sys.stderr)
    print(f"problem: {problem.name} ({problem.task}), N={problem.num_data}, d={problem.dim}, "
          f"n={problem.subsample_size}; methods: {', '.join(m.name for m in methods)}",
          file=sys.stderr)
    score = ScoreFn(problem) if ksd_fn is not None and settings.ksd_draws else None

    bar = tqdm(total=sum(m.kind != "nuts" for m in methods) + 1, desc="compare",
               disable=not progress, file=sys.stderr)
    bar.set_postfix_str("reference: NUTS on the full data")
    peer = None
    if args.jobs > 1:
        # NUTS reference + HMCECS in a second process while this one runs the package's kernels
        # (a cold run is mostly single-threaded JAX compilation; timings then share the CPU)
        import concurrent.futures
        import multiprocessing

        pool = concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"))
        peer = pool.submit(_peer_runs, problem, settings, args,
                           any(m.kind == "hmcecs" for m in methods))
        pool.shutdown(wait=False)
        pending = []
        ref = sites = None
    else:
        ref_out, cached = reference(problem, settings, args, progress)
        bar.update(1)
        sites = sorted(ref_out["samples"])
        ref = _flatten(ref_out["samples"], sites)
    rows, curves = [], {}

    def fail(res: Result, err: Exception):
        res.status = "failed"
        res.note = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        rows.append(res.row())
        print(f"note: {res.method} failed: {res.note}", file=sys.stderr)

    def finish(res: Result, out: dict, plot_it: bool = True):
        res.preprocessing_s = out["preprocessing_s"]
        res.sampling_s = out["sampling_s"]
        res.compile_s = out.get("compile_s", math.nan)
        res.iterations = out["iterations"]
        res.it_per_s = out["iterations"] / out["sampling_s"] if out["sampling_s"] > 0 else math.nan
        res.data_passes = float(out["passes"][-1])
        res.note = "; ".join(x for x in (res.note, out.get("note", "")) if x)
        draws = _flatten(out["samples"], sites)
        trace = Trace(draws, np.asarray(out["passes"], float), np.asarray(out["seconds"], float))
        evaluate(res, trace, ref, settings, score, ksd_fn)
        rows.append(res.row())
        if plot_it:
            curves[res.method] = res.curve

    def finish_reference(ref_out, cached):
        ref_res = Result("nuts (reference)", note="cached" if cached else "")
        if cached:
            ref_res.note = "cached reference: timings from the run that made it"
        finish(ref_res, ref_out, plot_it=False)

    if peer is None:
        finish_reference(ref_out, cached)
    shared: SharedProxy | None = None
    for m in methods:
        if m.kind == "nuts":
            continue
        if m.kind == "hmcecs" and peer is not None:
            pending.append((m, None))  # runs in the worker process
            continue
        bar.set_postfix_str(m.name)
        res = Result(m.name)
        try:
            if m.kind in ("hmcecs", "sg") and shared is None:
                bar.set_postfix_str(f"{m.name}: shared Laplace proxy")
                shared = fit_shared_proxy(problem, args.seed, progress)
                print(f"note: Laplace proxy fitted once for all methods using one: "
                      f"{shared.seconds:.2f} s + {shared.compile_s:.2f} s compile, "
                      f"{shared.proxy.num_data_passes:.1f} data passes", file=sys.stderr)
                bar.set_postfix_str(m.name)
            if m.kind == "hmcecs":
                out = run_hmcecs(problem, settings, args.seed, progress, shared)
            else:
                out = run_package_kernel(m, problem, settings, args.seed, progress, shared)
            if peer is not None:
                pending.append((m, out))  # evaluated once the reference is back
            else:
                finish(res, out)
        except Exception as err:  # noqa: BLE001 - one method failing must not stop the others
            fail(res, err)
        bar.update(1)
    if peer is not None:
        bar.set_postfix_str("waiting for the reference / HMCECS process")
        (ref_out, cached), hmcecs_out = peer.result()
        sites = sorted(ref_out["samples"])
        ref = _flatten(ref_out["samples"], sites)
        finish_reference(ref_out, cached)
        for m, out in pending:
            res = Result(m.name)
            out = hmcecs_out if m.kind == "hmcecs" else out
            if isinstance(out, Exception):
                fail(res, out)
            else:
                finish(res, out)
        bar.update(1)
    bar.close()
    meta = {
        "command": "numpyro-subsample " + " ".join(args.argv),
        "dataset": problem.name,
        "task": problem.task,
        "num_data": problem.num_data,
        "dim": problem.dim,
        "subsample_size": problem.subsample_size,
        "seed": args.seed,
        "quick": bool(args.quick),
        "settings": settings.__dict__,
        "reference": {"method": "NUTS, full data, 1 chain", "cached": cached},
        "shared_proxy": None if shared is None else {
            "kind": shared.proxy.kind, "seconds": shared.seconds, "compile_s": shared.compile_s,
            "data_passes": shared.proxy.num_data_passes},
        "compile_cache": args.compile_cache_dir,
        "fast_compile": args.fast_compile,
        "jobs": args.jobs,
        "ksd": ksd_note or "IMQ kernel Stein discrepancy on thinned draws, full-data scores",
        "skipped": found.skipped,
        "machine": _machine(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    paths = write_outputs(Path(args.out), rows, curves, meta)
    return {"rows": rows, "curves": curves, "meta": meta, "paths": paths}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message and exits with 2
        self.print_usage(sys.stderr)
        raise _UsageError(message)


class _UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="numpyro-subsample",
                     description="Stochastic-gradient MCMC for NumPyro models.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    c = sub.add_parser(
        "compare",
        help="compare every available sampler with NUTS and HMCECS on one problem",
        description="Run every available sampler/estimator of the package, NumPyro NUTS on the "
        "full data (the reference) and NumPyro HMCECS on one problem; print a table and save "
        "CSV, JSON and a PNG plot in --out.",
    )
    c.add_argument("--quick", action="store_true",
                   help=f"small run (N=10^4, short chains; under a minute); also ${QUICK_ENV}=1")
    c.add_argument("--dataset", default="default",
                   help="default (synthetic logistic regression, N=2e5, d=21), casp, covtype, "
                   "a9a, ijcnn1, w8a, skin, or a file path (.npz, CASP .csv, LIBSVM)")
    c.add_argument("--data-dir", default=None,
                   help="folder holding the named data sets (default $NUMPYRO_SUBSAMPLE_DATA or "
                   "./data)")
    c.add_argument("--methods", default="default",
                   help="comma-separated method names, 'default' or 'all'; see --list-methods")
    c.add_argument("--list-methods", action="store_true", help="list available methods and exit")
    c.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    c.add_argument("--out", default="outputs", help="output folder (default ./outputs)")
    c.add_argument("--num-data", type=_positive_int, default=None,
                   help="N of the synthetic problem, or a random subset of a data set")
    c.add_argument("--subsample-size", type=_positive_int, default=None,
                   help="subsample size n (default min(1000, N/100))")
    c.add_argument("--num-samples", type=_positive_int, default=None,
                   help="draws per stochastic-gradient chain (default 20000; quick 4000)")
    c.add_argument("--nuts-samples", type=_positive_int, default=None,
                   help="draws of NUTS and HMCECS (default 1000; quick 400)")
    c.add_argument("--no-ksd", action="store_true", help="skip the KSD column (faster)")
    c.add_argument("--jobs", type=_positive_int, default=None,
                   help="processes: 2 runs the NUTS reference and HMCECS in a second process "
                        "while the package's kernels run (default 2 with --quick, else 1: "
                        "concurrent runs share the CPU, so their timings are noisier)")
    c.add_argument("--cache-dir", default=None,
                   help="reference cache folder (default ~/.cache/numpyro_subsample/reference)")
    c.add_argument("--no-cache", action="store_true", help="recompute the NUTS reference")
    c.add_argument("--compile-cache-dir", default=None,
                   help="persistent JAX compilation cache (default "
                   "~/.cache/numpyro_subsample/jax); re-runs skip most compilation")
    c.add_argument("--no-compile-cache", action="store_true",
                   help="do not read or write the persistent JAX compilation cache")
    c.add_argument("--optimized-xla", action="store_true",
                   help="with --quick: compile with XLA's full optimisations (slower to compile, "
                   "faster to run; --quick otherwise compiles fast, unoptimised code)")
    c.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="progress bars (default: on when stderr is a terminal)")
    c.add_argument("--no-progress", dest="progress", action="store_false")
    return parser


def setup_compile_cache(args: argparse.Namespace) -> str | None:
    """Point JAX's persistent compilation cache at a user cache folder (unless opted out).

    A cache already configured in this process (e.g. by a test suite or the user's own
    ``jax.config``) is left alone and reported. Returns the folder in use, or None.
    """
    import jax

    current = jax.config.jax_compilation_cache_dir
    if args.no_compile_cache:
        return None
    if current:
        return str(current)
    if args.compile_cache_dir:
        path = Path(args.compile_cache_dir).expanduser()
    else:
        path = _cache_dir(argparse.Namespace(cache_dir=None)).parent / "jax"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"note: no compilation cache ({path}: {err})", file=sys.stderr)
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    # cache everything: most of a cold run is many compilations of a second or less
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(path)


@contextlib.contextmanager
def _xla_fast_compile(on: bool):
    """``jax_disable_most_optimizations`` for the block (restored afterwards)."""
    import jax

    before = bool(jax.config.read("jax_disable_most_optimizations"))
    jax.config.update("jax_disable_most_optimizations", bool(on) or before)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``numpyro-subsample``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as err:
        print(f"numpyro-subsample: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as err:  # --help
        return int(err.code or 0)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    args.argv = argv
    if os.environ.get(QUICK_ENV, "") not in ("", "0"):
        args.quick = True
    if args.progress is None:
        args.progress = _progress_default()
    if args.list_methods:
        found = available_methods()
        for m in found.methods.values():
            print(f"{m.name}{'' if m.default else '   (not in default)'}")
        for s in found.skipped:
            print(f"skipped: {s}")
        return 0
    args.compile_cache_dir = setup_compile_cache(args)
    # --quick: most of a cold run is XLA compiling ~10 programs that then run for well under a
    # second each, so compile them without XLA's expensive optimisations (the run's timings
    # are then those of unoptimised code; recorded in meta["fast_compile"]).
    args.fast_compile = bool(args.quick and not args.optimized_xla)
    if args.jobs is None:
        args.jobs = 2 if args.quick else 1
    try:
        if args.dataset not in (None, "default", "synthetic"):
            from numpyro_subsample.datasets import DATASET_NAMES

            if args.dataset not in DATASET_NAMES and not Path(args.dataset).exists():
                raise FileNotFoundError(
                    f"--dataset {args.dataset!r} is neither a known name "
                    f"({', '.join(DATASET_NAMES)}) nor an existing file."
                )
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {str(out)!r} exists and is not a folder.")
        with _xla_fast_compile(args.fast_compile):
            result = run_compare(args)
    except (ValueError, FileNotFoundError, PermissionError, IsADirectoryError) as err:
        print(f"numpyro-subsample: error: {err}", file=sys.stderr)
        return 2
    print(format_table(result["rows"]))
    notes = [f"  {r['method']}: {r['note']}" for r in result["rows"] if r.get("note")]
    if notes:
        print("notes:\n" + "\n".join(notes))
    print(f"KSD: {result['meta']['ksd']}")
    if args.fast_compile or args.jobs > 1:
        why = [w for w, on in (("--quick compiles with most XLA optimisations off (fast "
                                "compile, slower steps)", args.fast_compile),
                               ("the NUTS reference and HMCECS ran in a second process at the "
                                "same time", args.jobs > 1)) if on]
        print(f"timings: {'; '.join(why)}; use --optimized-xla --jobs 1 or a full run for "
              "speed comparisons")
    print("saved: " + ", ".join(str(p) for p in result["paths"].values()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
