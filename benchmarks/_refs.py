"""Cached full-data NUTS references of ``bench_realdata.py``, ``bench_paper002.py`` and
``hier_refs.py`` (issue 15); their data and models are in ``_ref_models.py``.

References: NumPyro NUTS on the full data (1 chain), cached in
``benchmarks/results/reference_cache/`` under a key made of the data fingerprint, the model
name and the NUTS settings; a JSON sidecar holds the SHA-256 of the ``.npz`` and the run's
timings, and a file whose checksum does not match is recomputed. Compute them (slow; run with
``nice -n 19``)::

    python benchmarks/_refs.py --plan                  # cost per draw of a short run on each
    python benchmarks/_refs.py --compute all           # the references, in the issue's order
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC, NUTS

from numpyro_subsample.compare import CompileTimer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ref_models import (  # noqa: E402
    HIER_NAME,
    INTERCEPT_SD,
    SYNTHETIC,
    HierData,
    LogisticData,
    hier_model,
    load_logistic,
    logistic_model,
    make_hierarchical,
)

HERE = Path(__file__).resolve().parent
CACHE_DIR = HERE / "results" / "reference_cache"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- NUTS references ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RefSettings:
    """NUTS settings of a reference (part of its cache key)."""

    num_warmup: int = 1000
    num_samples: int = 10_000
    dense_mass: bool = False
    target_accept_prob: float = 0.8
    max_tree_depth: int = 10
    seed: int = 0
    #: fixed dense mass matrix = the Laplace covariance (``fit_laplace``), start at its mode,
    #: only the step size adapted (NumPyro's windowed dense adaptation in d = 300 spends
    #: hours of warm-up on rank-deficient early estimates)
    laplace_mass: bool = False

    def tag(self) -> str:
        mass = "laplace" if self.laplace_mass else "dense" if self.dense_mass else "diag"
        return (f"w{self.num_warmup}_s{self.num_samples}_{mass}"
                f"_a{self.target_accept_prob}_t{self.max_tree_depth}_seed{self.seed}")

    def mass(self) -> str:
        if self.laplace_mass:
            return "fixed dense mass = Laplace covariance, start at the Laplace mode"
        return "dense mass (adapted)" if self.dense_mass else "diagonal mass (adapted)"


@dataclass
class Reference:
    """Draws (site → (S, ...)) and the cost of the NUTS run that made them."""

    samples: dict
    meta: dict
    cached: bool = False

    def per_draw_s(self) -> float:
        return self.meta["sampling_s"] / self.meta["settings"]["num_samples"]

    def nuts_wall_s(self, num_draws: int) -> float:
        """Wall time of this NUTS for ``num_draws`` draws after its warm-up, compilation
        included, from this run's measured setup (Laplace fit of ``laplace_mass``), compile,
        warm-up and per-draw seconds."""
        m = self.meta
        return (m.get("setup_s", 0.0) + m["compile_s"] + m["warmup_s"]
                + num_draws * self.per_draw_s())

    def resolvable_sd(self) -> tuple[float, float]:
        """Monte Carlo sd of the reference's own mean (in sd units) and log-sd, at its
        smallest ESS: 1/sqrt(ESS) and about 1/sqrt(2 ESS)."""
        ess = max(float(self.meta.get("min_ess", np.nan)), 1.0)
        return 1.0 / np.sqrt(ess), 1.0 / np.sqrt(2.0 * ess)


def fingerprint(*arrays) -> str:
    """SHA-1 of the arrays' shapes, dtypes and bytes (first 12 hex digits)."""
    h = hashlib.sha1()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:12]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_paths(name: str, model_name: str, fp: str, settings: RefSettings,
                cache_dir: Path | None = None) -> tuple[Path, Path]:
    folder = Path(cache_dir or CACHE_DIR)
    stem = f"{name}_{model_name}_{fp}_{settings.tag()}"
    return folder / f"{stem}.npz", folder / f"{stem}.json"


def load_reference(name: str, model_name: str, fp: str, settings: RefSettings,
                   cache_dir: Path | None = None) -> Reference | None:
    """The cached reference, or ``None`` if absent or its checksum does not match."""
    npz, meta_path = cache_paths(name, model_name, fp, settings, cache_dir)
    if not (npz.is_file() and meta_path.is_file()):
        return None
    meta = json.loads(meta_path.read_text())
    if meta.get("sha256") != _sha256(npz):
        log(f"note: reference {npz.name}: checksum mismatch, recomputing")
        return None
    with np.load(npz, allow_pickle=False) as z:
        samples = {k: z[k] for k in z.files}
    return Reference(samples, meta, cached=True)


def run_nuts_reference(model: Callable, args: tuple, kwargs: dict, settings: RefSettings,
                       progress: bool = False) -> Reference:
    """NumPyro NUTS on the full data (``kwargs`` must set ``subsample_size = N``), 1 chain;
    compile, warm-up and sampling seconds measured apart."""
    from numpyro_subsample.compare import min_ess

    options: dict = {}
    t_all, cpu0 = time.perf_counter(), time.process_time()
    if settings.laplace_mass:
        options = _laplace_mass(model, args, kwargs, settings.seed)
    setup_s = time.perf_counter() - t_all
    kernel = NUTS(model, dense_mass=settings.dense_mass or settings.laplace_mass,
                  target_accept_prob=settings.target_accept_prob,
                  max_tree_depth=settings.max_tree_depth, **options)
    mcmc = MCMC(kernel, num_warmup=settings.num_warmup, num_samples=settings.num_samples,
                progress_bar=progress)
    key = jax.random.PRNGKey(settings.seed)
    with CompileTimer() as ct_w:
        t0 = time.perf_counter()
        mcmc.warmup(key, *args, extra_fields=("num_steps",), collect_warmup=True, **kwargs)
        warm_steps = np.asarray(mcmc.get_extra_fields()["num_steps"])
        warmup_s = time.perf_counter() - t0 - ct_w.seconds
    cpu1 = time.process_time()
    with CompileTimer() as ct_s:
        t1 = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key, *args, extra_fields=("num_steps", "diverging"),
                 **kwargs)
        samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
        sampling_s = time.perf_counter() - t1 - ct_s.seconds
    wall, cpu2 = time.perf_counter() - t_all, time.process_time()
    ef = mcmc.get_extra_fields()
    steps = np.asarray(ef["num_steps"])
    flat = np.concatenate([v.reshape(v.shape[0], -1) for _, v in sorted(samples.items())], 1)
    meta = {
        "settings": dataclasses.asdict(settings),
        "mass": settings.mass(),
        "setup_s": setup_s,  # the Laplace fit of ``laplace_mass``, compilation included
        "compile_s": ct_w.seconds + ct_s.seconds,
        "warmup_s": warmup_s,
        "sampling_s": sampling_s,
        "wall_s": wall,
        "cpu_s_warmup_incl_compile": cpu1 - cpu0,
        "cpu_s_sampling_incl_compile": cpu2 - cpu1,
        "warmup_leapfrog_steps": int(warm_steps.sum()),
        "sampling_leapfrog_steps": int(steps.sum()),
        "mean_steps_per_draw": float(steps.mean()),
        "divergences": int(np.asarray(ef["diverging"]).sum()),
        "min_ess": min_ess(flat),
        "dim": int(flat.shape[1]),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return Reference(samples, meta)


def _laplace_mass(model: Callable, args: tuple, kwargs: dict, seed: int) -> dict:
    """NUTS options: start at the Laplace mode, fixed inverse mass matrix = the Laplace
    covariance (flat unconstrained coordinates, sites in sorted order as NumPyro ravels them)."""
    from numpyro.infer import init_to_value

    from numpyro_subsample import ModelData, build_potential, fit_laplace

    n = min(1000, int(kwargs["subsample_size"]) // 10)  # the package needs a subsample
    data = ModelData.from_args(args, {**kwargs, "subsample_size": n})
    k_model, k_fit = jax.random.split(jax.random.PRNGKey(seed))
    potential = build_potential(model, data, k_model)
    proxy = fit_laplace(potential, data, k_fit, store_datum_grads=False, check_chain=False)
    if list(potential.latent_sites) != sorted(potential.latent_sites):
        raise ValueError("laplace_mass: latent sites not in sorted order")
    values = {k: v for k, v in potential.constrain(potential.unravel(proxy.centre),
                                                   data).items()
              if k in potential.latent_sites}
    return {"init_strategy": init_to_value(values=values),
            "inverse_mass_matrix": jnp.asarray(proxy.cov), "adapt_mass_matrix": False}


def model_key(model_name: str, model: Callable) -> str:
    """``model_name`` and a hash of the model's source and prior constants (a changed model
    gets a new cache key)."""
    h = hashlib.sha1((inspect.getsource(model) + repr(INTERCEPT_SD)).encode())
    return f"{model_name}-{h.hexdigest()[:8]}"


def get_reference(name: str, model_name: str, model: Callable, args: tuple, kwargs: dict,
                  settings: RefSettings, *, compute: bool = True, extra_meta: dict | None = None,
                  cache_dir: Path | None = None) -> Reference | None:
    """The cached reference, or (``compute``) a new NUTS run written to the cache."""
    fp = fingerprint(*[a for a in args if hasattr(a, "shape")])
    model_name = model_key(model_name, model)
    ref = load_reference(name, model_name, fp, settings, cache_dir)
    if ref is not None or not compute:
        return ref
    log(f"reference {name}/{model_name}: NUTS {settings.num_warmup}+{settings.num_samples} "
        f"({settings.mass()}) ...")
    ref = run_nuts_reference(model, args, kwargs, settings)
    ref.meta.update(extra_meta or {}, name=name, model=model_name, fingerprint=fp)
    npz, meta_path = cache_paths(name, model_name, fp, settings, cache_dir)
    npz.parent.mkdir(parents=True, exist_ok=True)
    tmp = npz.with_suffix(".tmp.npz")
    np.savez(tmp, **ref.samples)
    tmp.replace(npz)
    ref.meta["sha256"] = _sha256(npz)
    meta_path.write_text(json.dumps(ref.meta, indent=1))
    log(f"reference {name}/{model_name}: {ref.meta['wall_s']:.0f} s wall, "
        f"{ref.meta['mean_steps_per_draw']:.1f} leapfrog steps per draw, min ESS "
        f"{ref.meta['min_ess']:.0f}, {ref.meta['divergences']} divergences -> {npz.name}")
    return ref


# -- which reference each data set uses ---------------------------------------------------------
#: NUTS settings of each reference (chosen with ``--plan``): an adapted dense mass where one-hot
#: columns correlate the coefficients with the intercept; for w8a (d = 301) the fixed Laplace
#: mass, since NumPyro's windowed dense adaptation there needs hours of warm-up
REFERENCE_PLAN: dict[str, RefSettings] = {
    SYNTHETIC: RefSettings(),
    "covtype_subset20k": RefSettings(dense_mass=True),
    HIER_NAME: RefSettings(),
    "ijcnn1": RefSettings(dense_mass=True),
    "a9a": RefSettings(dense_mass=True),
    "w8a": RefSettings(laplace_mass=True),
}


def logistic_reference(data: LogisticData, *, compute: bool = True,
                       settings: RefSettings | None = None) -> Reference | None:
    s = settings or REFERENCE_PLAN[data.name]
    return get_reference(data.name, "logistic_std", logistic_model,
                         (jnp.asarray(data.Z), jnp.asarray(data.y)),
                         {"subsample_size": data.num_data}, s, compute=compute,
                         extra_meta={"data_info": data.info})


def hier_reference(data: HierData, *, compute: bool = True,
                   settings: RefSettings | None = None) -> Reference | None:
    s = settings or REFERENCE_PLAN[HIER_NAME]
    return get_reference(HIER_NAME, "centred", hier_model,
                         (jnp.asarray(data.X), jnp.asarray(data.g), jnp.asarray(data.y)),
                         {"subsample_size": data.num_data, "num_groups": data.num_groups}, s,
                         compute=compute, extra_meta={"data_info": data.info})


ORDER = (SYNTHETIC, "covtype_subset20k", HIER_NAME, "ijcnn1", "a9a", "w8a")


def _plan(names, warmup: int, draws: int, dense: str) -> None:
    """Cost per draw of a short NUTS run on each data set (not cached)."""
    s = RefSettings(num_warmup=warmup, num_samples=draws, dense_mass=dense == "dense",
                    laplace_mass=dense == "laplace")
    for name in names:
        if name == HIER_NAME:
            h = make_hierarchical()
            ref = run_nuts_reference(hier_model, (jnp.asarray(h.X), jnp.asarray(h.g),
                                                  jnp.asarray(h.y)),
                                     {"subsample_size": h.num_data, "num_groups": h.num_groups}, s)
        else:
            d = load_logistic(name)
            ref = run_nuts_reference(logistic_model, (jnp.asarray(d.Z), jnp.asarray(d.y)),
                                     {"subsample_size": d.num_data}, s)
        m = ref.meta
        per = m["sampling_s"] / draws
        est = m["compile_s"] + 1000 * m["warmup_s"] / warmup + 10_000 * per
        print(f"{name}: {s.tag()}: compile "
              f"{m['compile_s']:.1f} s, warm-up {m['warmup_s']:.1f} s, {per * 1e3:.1f} ms/draw "
              f"(CPU {m['cpu_s_sampling_incl_compile'] / draws * 1e3:.1f} ms/draw incl. compile), "
              f"{m['mean_steps_per_draw']:.1f} steps/draw, min ESS {m['min_ess']:.0f}; "
              f"1000+10^4 would take ~{est / 60:.1f} min", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="NUTS references of the issue-15 benchmarks")
    p.add_argument("--plan", action="store_true", help="time a short run on each data set")
    p.add_argument("--compute", default=None, help="comma list of data sets, or 'all'")
    p.add_argument("--names", default=",".join(ORDER), help="data sets of --plan")
    p.add_argument("--plan-warmup", type=int, default=300)
    p.add_argument("--plan-draws", type=int, default=200)
    p.add_argument("--mass", choices=("diag", "dense", "laplace"), default="diag",
                   help="mass matrix of --plan")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import add_device_option

    add_device_option(p)
    args = p.parse_args(argv)
    if args.plan:
        _plan([n.strip() for n in args.names.split(",")], args.plan_warmup, args.plan_draws,
              args.mass)
    if args.compute:
        names = ORDER if args.compute == "all" else [n.strip() for n in args.compute.split(",")]
        for name in names:
            t0 = time.perf_counter()
            if name == HIER_NAME:
                ref = hier_reference(make_hierarchical())
            else:
                ref = logistic_reference(load_logistic(name))
            print(f"{name}: {'cached' if ref.cached else 'computed'} "
                  f"({time.perf_counter() - t0:.0f} s); settings {REFERENCE_PLAN[name].tag()}; "
                  f"min ESS {ref.meta['min_ess']:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
