"""Data and models of the logistic benchmarks (``bench_realdata.py``, ``bench_paper002.py``)
and of the hierarchical reference of ``_refs.py`` (issue 15).

Model of the logistic benchmarks (real data and the synthetic rare-feature set): feature
columns standardised on the training rows (:func:`standardise`: continuous columns z-scored,
binary columns centred on their 0/1 scale, constant columns dropped), then

    α ~ N(0, 2.5²),  β_j ~ N(0, 1),  y_i ~ Bernoulli(logit⁻¹(α + z_iᵀβ)),

the same model for NUTS (``subsample_size = N``) and the subsampling kernels.

Hierarchical model (the ``hier_logistic`` reference of ``_refs.py``), G groups g(i), p
covariates:

    μ ~ N(0, 2.5²),  τ ~ HalfNormal(1),  β ~ N(0, I_p),  a_g ~ N(μ, τ²),
    y_i ~ Bernoulli(logit⁻¹(a_{g(i)} + x_iᵀβ)),

centred, or non-centred with ``numpyro.handlers.reparam(model, config={"a":
LocScaleReparam(0)})`` (same posterior of μ, τ, β, a).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.reparam import LocScaleReparam

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE.parent.parent / "shared" / "data"
INTERCEPT_SD = 2.5
REAL_DATASETS = ("covtype_subset20k", "a9a", "ijcnn1", "w8a")
SYNTHETIC = "synthetic_rare"
ALL_LOGISTIC = (SYNTHETIC, *REAL_DATASETS)
HIER_NAME = "hier_logistic"


# -- data ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogisticData:
    """Standardised features ``Z`` (N, p) float32, 0/1 labels ``y`` (N,), and facts about them."""

    name: str
    Z: np.ndarray
    y: np.ndarray
    info: dict

    @property
    def num_data(self) -> int:
        return int(self.Z.shape[0])

    @property
    def dim(self) -> int:
        """Number of parameters (intercept + coefficients)."""
        return int(self.Z.shape[1]) + 1


def standardise(X: np.ndarray) -> tuple[np.ndarray, dict]:
    """Columns centred; non-binary columns scaled to sd 1, binary (two-valued) columns left on
    their 0/1 scale (Gelman, Jakulin, Pittau and Su 2008); zero-variance columns dropped."""
    X = np.asarray(X, np.float64)
    sd = X.std(0)
    keep = sd > 0
    X = X[:, keep]
    binary = np.array([np.unique(X[:, j]).size == 2 for j in range(X.shape[1])], bool)
    scale = np.where(binary, np.ptp(X, 0), sd[keep])
    Z = (X - X.mean(0)) / scale
    nonzero = (X != np.median(X, 0)).sum(0)
    return Z.astype(np.float32), {
        "dropped_constant_columns": int((~keep).sum()),
        "binary_columns": int(binary.sum()),
        "max_abs_x": float(np.abs(Z).max()),
        "min_rows_off_median_per_column": int(nonzero.min()),
    }


def load_logistic(name: str, data_dir: str | Path | None = None) -> LogisticData:
    """A data set of the logistic benchmark: the training rows of the shared ``.npz``
    (``np.load``) or the synthetic rare-feature set, standardised."""
    if name == SYNTHETIC:
        from numpyro_subsample.datasets import make_rare_features

        ds = make_rare_features(num_data=200_000, num_features=20, seed=0)
        X, y = ds.X_train, ds.y_train
        source = ("numpyro_subsample.datasets.generators.make_rare_features(num_data="
                  "200_000, num_features=20, seed=0), other arguments at their defaults")
    elif name in REAL_DATASETS:
        path = Path(data_dir or DATA_DIR) / name / f"{name}.npz"
        if not path.is_file():
            raise FileNotFoundError(
                f"data set {name!r}: {path} not found; pass --data-dir (the folder holding "
                f"{name}/{name}.npz)."
            )
        with np.load(path) as z:
            xk, yk = ("X_train", "y_train") if "X_train" in z.files else ("X", "y")
            X, y = np.asarray(z[xk]), np.asarray(z[yk], np.float32)
        source = f"{path} ({xk}, {yk})"
    else:
        raise ValueError(
            f"unknown data set {name!r}; choose from {', '.join(ALL_LOGISTIC)}."
        )
    Z, info = standardise(X)
    info.update(source=source, positives=float(y.mean()), raw_columns=int(X.shape[1]))
    return LogisticData(name, Z, y, info)


def logistic_model(Z, y=None, subsample_size: int = 1000) -> None:
    """α ~ N(0, 2.5²), β ~ N(0, I), y_i ~ Bernoulli(logit⁻¹(α + z_iᵀβ)); standardised Z."""
    alpha = numpyro.sample("alpha", dist.Normal(0.0, INTERCEPT_SD))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([Z.shape[1]]).to_event(1))
    with numpyro.plate("data", Z.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=alpha + Z[idx] @ beta),
                       obs=None if y is None else y[idx])


# -- hierarchical -------------------------------------------------------------------------------
@dataclass(frozen=True)
class HierData:
    """Covariates ``X`` (N, p), group index ``g`` (N,) int32, labels ``y`` and the truth."""

    X: np.ndarray
    g: np.ndarray
    y: np.ndarray
    num_groups: int
    info: dict

    @property
    def num_data(self) -> int:
        return int(self.X.shape[0])


def make_hierarchical(num_data: int = 20_000, num_groups: int = 100, num_covariates: int = 3,
                      tau: float = 0.7, seed: int = 15) -> HierData:
    """Synthetic grouped logistic data: group sizes from a log-normal spread (a few groups
    of ~10 rows, a few of ~600), a_g ~ N(−0.5, τ²), β ~ N(0, 0.5²), x ~ N(0, I)."""
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, 1.0, size=num_groups)
    sizes = np.maximum(5, np.floor(w / w.sum() * num_data)).astype(int)
    sizes[np.argmax(sizes)] += num_data - sizes.sum()
    g = np.repeat(np.arange(num_groups), sizes).astype(np.int32)
    X = rng.normal(size=(num_data, num_covariates)).astype(np.float32)
    mu, a = -0.5, -0.5 + tau * rng.normal(size=num_groups)
    beta = 0.5 * rng.normal(size=num_covariates)
    p = 1.0 / (1.0 + np.exp(-(a[g] + X @ beta)))
    y = (rng.uniform(size=num_data) < p).astype(np.float32)
    info = {"true_mu": mu, "true_tau": tau, "true_beta": beta.tolist(),
            "group_sizes_min_median_max": [int(sizes.min()), int(np.median(sizes)),
                                           int(sizes.max())],
            "positives": float(y.mean()),
            "source": f"make_hierarchical(num_data={num_data}, num_groups={num_groups}, "
                      f"num_covariates={num_covariates}, tau={tau}, seed={seed})"}
    return HierData(X, g, y, num_groups, info)


def hier_model(X, g, y=None, subsample_size: int = 1000, num_groups: int = 100) -> None:
    """Centred hierarchical logistic regression (module docstring)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, INTERCEPT_SD))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=a[g[idx]] + X[idx] @ beta),
                       obs=None if y is None else y[idx])


#: the non-centred model: the standard NumPyro idiom
hier_model_noncentred = numpyro.handlers.reparam(hier_model, config={"a": LocScaleReparam(0)})
HIER_SITES = ("a", "beta", "mu", "tau")
