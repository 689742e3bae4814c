"""What the comparison runs: the problem (data set and model) and the registry of methods.

Problems come from :mod:`numpyro_subsample.datasets`: the synthetic default
(:func:`~numpyro_subsample.datasets.generators.make_rare_features`, Bayesian logistic
regression with rare binary features and high-leverage rows, d = 21), the former Gaussian-like
synthetic problem (``"synthetic"``, :func:`~numpyro_subsample.datasets.default_problem`), or a
named or file data set (:func:`~numpyro_subsample.datasets.load_dataset`).

Methods are an explicit registry, ``{name: Method}``: NumPyro's NUTS (the reference) and
HMCECS, independent draws from the Laplace and the variational proxy (no MCMC), every
stochastic-gradient kernel (:class:`~numpyro_subsample.sgmcmc.kernel.SGLD`,
``SGHMC``, ``SGNHT``, :class:`~numpyro_subsample.sgmcmc.distributed.DistributedSGLD`) with
every estimator it supports from
:data:`~numpyro_subsample.estimators.registry.ESTIMATORS`, named ``<kernel>-<estimator>``,
and :class:`~numpyro_subsample.ecs.kernel.EnergyConservingHMC`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from numpyro_subsample import datasets
from numpyro_subsample.core.potential import ModelData
from numpyro_subsample.datasets.generators import make_rare_features
from numpyro_subsample.ecs.kernel import EnergyConservingHMC
from numpyro_subsample.estimators.registry import ESTIMATORS, STATEFUL
from numpyro_subsample.sgmcmc.distributed import DISTRIBUTED_ESTIMATORS, DistributedSGLD
from numpyro_subsample.sgmcmc.kernel import SGHMC, SGLD, SGNHT

__all__ = [
    "DEFAULT_DATASET",
    "Method",
    "OTHER_KERNELS",
    "Problem",
    "SG_KERNELS",
    "available_methods",
    "check_dataset",
    "dataset_names",
    "make_problem",
    "select_methods",
]

DEFAULT_DATASET = "default"
_DEFAULT = (None, "", "default")
_SYNTHETIC = ("synthetic",)
#: data set names accepted besides ``datasets.DATASET_NAMES``: ``{alias: (file, loader name)}``
ALIASES = {"covtype_subset20k": ("covtype_subset20k.npz", "covtype")}
QUICK_NUM_DATA = 10_000
DEFAULT_NUM_DATA = 50_000


# -- problems -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """A regression problem: the model, its data ``(X, y)`` and the subsample size n."""

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
        """The model's positional arguments ``(X, y)``."""
        return (self.X, self.y)

    def kwargs(self, full: bool = False) -> dict:
        """The model's keyword arguments: ``subsample_size`` n, or N with ``full=True``."""
        return {"subsample_size": self.num_data if full else self.subsample_size}

    def data(self, full: bool = False) -> ModelData:
        """The model's data as :class:`~numpyro_subsample.core.potential.ModelData`."""
        return ModelData.from_args(self.args(), self.kwargs(full))

    def fingerprint(self) -> str:
        """A short hash of the data's shapes and values (the reference cache key)."""
        h = hashlib.sha1()
        for a in (self.X, self.y):
            arr = np.ascontiguousarray(np.asarray(a))
            h.update(str(arr.shape).encode())
            h.update(arr.tobytes())
        return h.hexdigest()[:12]


def dataset_names() -> tuple[str, ...]:
    """The names ``--dataset`` accepts (besides a file path)."""
    return ("default", "synthetic") + datasets.DATASET_NAMES + tuple(ALIASES)


def check_dataset(dataset: str | None) -> None:
    """Raise ``FileNotFoundError`` unless ``dataset`` is the default, a known name or a file."""
    if dataset in _DEFAULT or dataset in dataset_names():
        return
    if not Path(dataset).exists():
        raise FileNotFoundError(
            f"--dataset {dataset!r} is neither a known name "
            f"({', '.join(dataset_names())}) nor an existing file."
        )


def _load_alias(name: str, data_dir: str | None, seed: int) -> datasets.Dataset:
    """A data set of :data:`ALIASES`: its file in ``data_dir`` or ``data_dir/<name>/``."""
    filename, like = ALIASES[name]
    root = Path(data_dir or os.environ.get("NUMPYRO_SUBSAMPLE_DATA", "data")).expanduser()
    for cand in (root / filename, root / name / filename, root / like / filename):
        if cand.is_file():
            ds = datasets.load_dataset(str(cand), seed=seed, standardise=like)
            return ds._replace(name=name)
    raise FileNotFoundError(
        f"Data set {name!r} not found: looked for {filename} in {str(root)!r} and its "
        f"{name}/ subfolder. Pass the data folder (--data-dir) or the file path."
    )


def make_problem(
    dataset: str | None = DEFAULT_DATASET,
    *,
    num_data: int | None = None,
    subsample_size: int | None = None,
    data_dir: str | None = None,
    seed: int = 0,
    quick: bool = False,
) -> Problem:
    """The problem of a comparison.

    Parameters
    ----------
    dataset
        ``"default"`` (logistic regression with rare binary features and high-leverage rows,
        :func:`~numpyro_subsample.datasets.generators.make_rare_features`, N = 5·10^4, or 10^4
        with ``quick``), ``"synthetic"`` (the Gaussian-like
        :func:`~numpyro_subsample.datasets.default_problem`, same sizes), a name of
        :data:`~numpyro_subsample.datasets.DATASET_NAMES` or ``"covtype_subset20k"``, or a file
        path.
    num_data
        N of the synthetic problem, or the size of a random subset of a data set (``quick``
        takes a 10^4-row subset).
    subsample_size
        n, between 1 and N − 1 (default min(1000, max(N/100, 10))).
    data_dir, seed
        Folder of the named data sets; seed of their split and of the subset.
    """
    check_dataset(dataset)
    size = num_data or (QUICK_NUM_DATA if quick else DEFAULT_NUM_DATA)
    if dataset in _DEFAULT:
        ds = make_rare_features(size)
    elif dataset in _SYNTHETIC:
        ds = datasets.default_problem(size)
    else:
        ds = (_load_alias(dataset, data_dir, seed) if dataset in ALIASES
              else datasets.load_dataset(dataset, data_dir, seed=seed))
        cap = num_data or (QUICK_NUM_DATA if quick else None)
        if cap and cap < ds.num_data:
            rng = np.random.default_rng(seed)
            keep = np.sort(rng.choice(ds.num_data, cap, replace=False))
            ds = ds._replace(X_train=ds.X_train[keep], y_train=ds.y_train[keep])
    if ds.task not in ("logistic", "linear"):
        raise ValueError(
            f"Data set {ds.name!r} has task {ds.task!r}; the comparison supports 'logistic' "
            "and 'linear' (pass a classification or regression data set)."
        )
    n = subsample_size or min(1000, max(ds.num_data // 100, 10))
    if not 1 <= n < ds.num_data:
        raise ValueError(
            f"subsample_size (--subsample-size) must be between 1 and N - 1 = "
            f"{ds.num_data - 1}, got {n}; pass a smaller subsample size or more data."
        )
    return Problem(ds.name, ds.model, jnp.asarray(ds.X_train), jnp.asarray(ds.y_train), int(n),
                   ds.task, ds.info)


# -- methods ------------------------------------------------------------------------------------
class Method(NamedTuple):
    """One row of the comparison.

    ``kind``: ``"nuts"`` and ``"hmcecs"`` (NumPyro's own kernels, run by
    :mod:`~numpyro_subsample.compare.runners`), ``"proxy"`` (independent draws from a proxy,
    ``options["proxy"]``, :mod:`~numpyro_subsample.compare.proxy_runs`), ``"sg"`` (a
    stochastic-gradient kernel that takes ``proxy=Proxy``) or ``"kernel"`` (another package
    kernel, built with the model). ``kernel(model, **options, **extra)`` builds the kernel;
    ``default``: in the default set; ``label``: the row's name in the table (default ``name``).
    """

    name: str
    kind: str
    kernel: Callable | None = None
    options: dict | None = None
    default: bool = True
    label: str | None = None

    @property
    def title(self) -> str:
        """The row's name in the table."""
        return self.label or self.name

    @property
    def estimator(self) -> str | None:
        return (self.options or {}).get("estimator")

    def build(self, model: Callable, **extra: Any):
        """The method's ``MCMCKernel`` for ``model`` (``extra``: seed, proxy, progress_bar)."""
        if self.kernel is None:
            raise ValueError(f"Method {self.name!r} is run by NumPyro, not built from a kernel.")
        return self.kernel(model, **(self.options or {}), **extra)


#: stochastic-gradient kernels and the estimators each supports (None: every registered one)
SG_KERNELS: dict[str, tuple[Callable, tuple[str, ...] | None]] = {
    "sgld": (SGLD, None),
    "sghmc": (SGHMC, None),
    "sgnht": (SGNHT, None),
    "distributedsgld": (DistributedSGLD, DISTRIBUTED_ESTIMATORS),
}
#: other package kernels, built with the model, seed and progress_bar
OTHER_KERNELS: dict[str, Callable] = {"energyconservinghmc": EnergyConservingHMC}


def available_methods() -> dict[str, Method]:
    """The registry ``{name: Method}`` of every method of this installation.

    NUTS, HMCECS, both proxies, SGLD with every estimator except the stateful ``"saga"`` and
    ``"svrg"`` (``sgld-saga``, ``sgld-svrg``, ``sghmc-saga``, ... are listed, not run by
    default), the other stochastic-gradient kernels with ``"cv"`` and the other kernels are in
    the default set.
    """
    methods = {
        "nuts": Method(name="nuts", kind="nuts"), "hmcecs": Method(name="hmcecs", kind="hmcecs"),
        "laplace-proxy": Method(name="laplace-proxy", kind="proxy", options={"proxy": "laplace"},
                                label="Laplace proxy (no MCMC)"),
        "variational-proxy": Method(name="variational-proxy", kind="proxy",
                                    options={"proxy": "variational"},
                                    label="variational proxy (no MCMC)"),
    }
    for kname, (cls, supported) in SG_KERNELS.items():
        for est in ESTIMATORS:
            if supported is None or est in supported:
                name = f"{kname}-{est}"
                methods[name] = Method(name=name, kind="sg", kernel=cls, options={"estimator": est},
                                       default=(kname == "sgld" and est not in STATEFUL)
                                       or est == "cv")
    for kname, cls in OTHER_KERNELS.items():
        methods[kname] = Method(name=kname, kind="kernel", kernel=cls)
    return methods


def select_methods(methods: dict[str, Method], spec: str | None = "default",
                   quick: bool = False) -> list[Method]:
    """The methods named by ``spec``.

    ``"default"``: the default set (with ``quick``, of the stochastic-gradient kernels SGLD
    only); ``"all"``: every method; otherwise a comma-separated list of names.
    """
    if spec in (None, "", "default"):
        return [m for m in methods.values()
                if m.default and not (quick and m.kind == "sg" and not m.name.startswith("sgld-"))]
    if spec == "all":
        return list(methods.values())
    names = [s.strip().lower() for s in spec.split(",") if s.strip()]
    unknown = [s for s in names if s not in methods]
    if unknown:
        raise ValueError(
            f"Unknown or unavailable method(s) {unknown} in --methods. Available: "
            f"{', '.join(methods)} (or 'default', 'all')."
        )
    if not names:
        raise ValueError(f"--methods {spec!r} selected nothing; pass method names.")
    return [methods[s] for s in names]
