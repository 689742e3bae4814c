"""Synthetic data sets and the models of the papers, and the :class:`Dataset` record.

The generators reproduce the set-ups of Putcha, Nemeth and Fearnhead (2023, Appendix C):
bivariate Gaussian (C.1), balanced and imbalanced logistic regression (C.2), linear regression
(C.3); :func:`make_quasi_separated` is a logistic regression with a poor Laplace
approximation; :func:`make_rare_features` (rare binary features, high-leverage rows) is the
built-in problem of the ``numpyro-subsample`` command, :func:`default_problem` its former
Gaussian-like one. An intercept column of ones is prepended by default (x_i = (1, x_i1, ..., x_ip),
Putcha et al. 2023, Sect. 5). Labels of binary tasks are 0/1 floats.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpyro
import numpyro.distributions as dist

__all__ = [
    "Dataset",
    "build_dataset",
    "split_train_test",
    "logistic_regression_model",
    "linear_regression_model",
    "bivariate_gaussian_model",
    "bivariate_gaussian_posterior",
    "make_bivariate_gaussian",
    "make_logistic",
    "make_quasi_separated",
    "make_rare_features",
    "make_linear",
    "default_problem",
    "PAPER_PRIOR_VARIANCE",
    "DEFAULT_PRIOR_SCALE",
    "BVG_SIGMA_X",
    "BVG_PRIOR_COV",
]

# Putcha et al. (2023, Appendix C.2/C.3): prior N(0, Λ0) with Λ0 = diag(10, d) (R's
# notation for 10·I_d).
PAPER_PRIOR_VARIANCE = 10.0
# The package's benchmark model: prior N(0, 10²).
DEFAULT_PRIOR_SCALE = 10.0


# -- models ---------------------------------------------------------------------------------------
def logistic_regression_model(
    X, y=None, subsample_size: int = 1000, prior_scale: float = DEFAULT_PRIOR_SCALE
) -> None:
    """Bayesian logistic regression (Putcha et al. 2023, Sect. 5.1.2); β ~ N(0, prior_scale²·I)."""
    beta = numpyro.sample("beta", dist.Normal(0.0, prior_scale).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=None if y is None else y[idx])


def linear_regression_model(
    X,
    y=None,
    subsample_size: int = 1000,
    prior_scale: float = float(np.sqrt(PAPER_PRIOR_VARIANCE)),
    noise_sd: float = 1.0,
) -> None:
    """Bayesian linear regression with known noise (Putcha et al. 2023, Appendix C.3)."""
    beta = numpyro.sample("beta", dist.Normal(0.0, prior_scale).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample(
            "y", dist.Normal(X[idx] @ beta, noise_sd), obs=None if y is None else y[idx]
        )


BVG_SIGMA_X = np.array([[1e5, 6e4], [6e4, 2e5]])
BVG_PRIOR_COV = np.diag([1e3, 1e3])


def bivariate_gaussian_model(
    X, y=None, subsample_size: int = 100, sigma_x=BVG_SIGMA_X, prior_cov=BVG_PRIOR_COV
) -> None:
    """X_i | θ ~ N₂(θ, Σx), θ ~ N₂(0, Λ0) (Putcha et al. 2023, Appendix C.1; ``y`` ignored)."""
    theta = numpyro.sample(
        "theta", dist.MultivariateNormal(np.zeros(2, np.float32), np.asarray(prior_cov, np.float32))
    )
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample(
            "x", dist.MultivariateNormal(theta, np.asarray(sigma_x, np.float32)), obs=X[idx]
        )


def bivariate_gaussian_posterior(
    X, sigma_x=BVG_SIGMA_X, prior_cov=BVG_PRIOR_COV
) -> tuple[np.ndarray, np.ndarray]:
    """Exact posterior (μ1, Λ1) of the C.1 model: Λ1⁻¹ = Λ0⁻¹ + NΣx⁻¹, μ1 = Λ1 NΣx⁻¹ x̄."""
    X = np.asarray(X, np.float64)
    sx_inv = np.linalg.inv(sigma_x)
    prec = np.linalg.inv(prior_cov) + X.shape[0] * sx_inv
    cov = np.linalg.inv(prec)
    return cov @ (X.shape[0] * sx_inv @ X.mean(0)), cov


_MODELS: dict[str, Callable] = {
    "logistic": logistic_regression_model,
    "linear": linear_regression_model,
    "gaussian": bivariate_gaussian_model,
}


# -- the record and its assembly ------------------------------------------------------------------
class Dataset(NamedTuple):
    """A data set ready for a model: float32 arrays, 0/1 labels for ``task="logistic"``."""

    name: str
    task: str  # "logistic" | "linear" | "gaussian"
    X_train: np.ndarray
    y_train: np.ndarray | None
    X_test: np.ndarray | None
    y_test: np.ndarray | None
    info: dict

    @property
    def model(self) -> Callable:
        """The model of the task (:func:`logistic_regression_model`, ...)."""
        return _MODELS[self.task]

    @property
    def num_data(self) -> int:
        return int(self.X_train.shape[0])

    @property
    def dim(self) -> int:
        return int(self.X_train.shape[1])


def split_train_test(
    X: np.ndarray,
    y: np.ndarray,
    test_fraction: float = 0.25,
    seed: int = 0,
    stratify: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Random train/test split with a seed (scikit-learn's ``train_test_split``)."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}.")
    from sklearn.model_selection import train_test_split

    return tuple(
        train_test_split(
            X, y, test_size=test_fraction, random_state=seed, stratify=y if stratify else None
        )
    )


def _with_intercept(X: np.ndarray, intercept: bool) -> np.ndarray:
    X = np.asarray(X, np.float32)
    if not intercept:
        return X
    return np.concatenate([np.ones((X.shape[0], 1), np.float32), X], axis=1)


def build_dataset(
    name, task, X, y, X_test, y_test, intercept, test_fraction, seed, stratify, info
) -> Dataset:
    """A :class:`Dataset` from arrays: split off ``test_fraction`` if there is no test set,
    prepend the intercept column, convert to float32."""
    if X_test is None and test_fraction:
        X, X_test, y, y_test = split_train_test(X, y, test_fraction, seed, stratify)
    info = dict(info, intercept=intercept, seed=seed, test_fraction=test_fraction)
    return Dataset(
        name=name,
        task=task,
        X_train=_with_intercept(X, intercept),
        y_train=np.asarray(y, np.float32),
        X_test=None if X_test is None else _with_intercept(X_test, intercept),
        y_test=None if y_test is None else np.asarray(y_test, np.float32),
        info=info,
    )


# -- synthetic generators -------------------------------------------------------------------------
def make_bivariate_gaussian(num_data: int = 10_000, seed: int = 105) -> Dataset:
    """Putcha et al. (2023, Appendix C.1.3): X_i ~ N₂((0, 1), Σx), Σx = [[1e5, 6e4], [6e4, 2e5]];
    prior θ ~ N₂(0, 10³·I). The exact posterior is :func:`bivariate_gaussian_posterior`."""
    rng = np.random.default_rng(seed)
    X = rng.multivariate_normal([0.0, 1.0], BVG_SIGMA_X, size=num_data).astype(np.float32)
    mean, cov = bivariate_gaussian_posterior(X)
    return Dataset(name="bivariate_gaussian", task="gaussian", X_train=X, y_train=None, X_test=None,
                   y_test=None, info={"seed": seed, "posterior_mean": mean, "posterior_cov": cov})


def make_logistic(
    num_data: int = 10_000,
    *,
    imbalanced: bool = False,
    positive_fraction: float | None = None,
    num_features: int = 4,
    seed: int = 100,
) -> Dataset:
    """Putcha et al. (2023, Appendix C.2.3): ``sklearn.datasets.make_classification`` with 4
    informative features, one cluster per class, N training and N/2 test points, intercept
    prepended (d = 5). Balanced: 50 % y = 1; imbalanced: 95 % y = 1 (the paper's text; its
    code used 99 %, pass ``positive_fraction=0.99`` for that)."""
    from sklearn.datasets import make_classification

    frac = positive_fraction if positive_fraction is not None else (0.95 if imbalanced else 0.5)
    if not 0 < frac < 1:
        raise ValueError(f"positive_fraction must be in (0, 1), got {frac}.")
    n_test = num_data // 2
    X, y = make_classification(
        n_samples=num_data + n_test, n_features=num_features, n_informative=num_features,
        n_redundant=0, n_repeated=0, n_classes=2, n_clusters_per_class=1,
        weights=[1 - frac, frac], random_state=seed,
    )
    X_tr, X_te, y_tr, y_te = split_train_test(X, y, n_test / (num_data + n_test), seed)
    name = "logistic_imbalanced" if frac != 0.5 else "logistic_balanced"
    return build_dataset(name, "logistic", X_tr, y_tr, X_te, y_te, True, None, seed, False,
                         {"positive_fraction": frac})


def make_quasi_separated(
    num_data: int = 2000, num_features: int = 5, *, num_rare: int = 30, seed: int = 0
) -> Dataset:
    """Logistic regression where the Laplace approximation is poor: x_i = (1, z_i, b_i) with
    z_i ~ N(0, I) and a binary feature b_i present in ``num_rare`` data only, true coefficient
    5 (intercept −1): nearly all of those data have y = 1, so that coefficient's posterior is
    wide and right-skewed (skewness ≈ 0.9-1). Used to compare the proxies of Rønning and
    Hamelryck (2021)."""
    rng = np.random.default_rng(seed)
    N, d = num_data, num_features
    X = np.concatenate([np.ones((N, 1)), rng.normal(size=(N, d - 2)), np.zeros((N, 1))], 1)
    X[rng.choice(N, num_rare, replace=False), -1] = 1.0
    beta = np.concatenate([[-1.0], 0.5 * rng.normal(size=d - 2), [5.0]])
    y = (rng.uniform(size=N) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return Dataset(name="quasi_separated", task="logistic", X_train=X.astype(np.float32), y_train=y,
                   X_test=None, y_test=None,
                   info={"seed": seed, "num_rare": num_rare, "true_beta": beta})


def make_linear(
    num_data: int = 10_000, num_features: int = 9, *, noise_sd: float = 1.0, seed: int = 0
) -> Dataset:
    """Putcha et al. (2023, Appendix C.3): y_i = x_iᵀθ + η_i, η_i ~ N(0, 1), x_i = (1, z_i),
    z_i ~ N(0, I), θ ~ N(0, I) drawn once; N/2 test points."""
    rng = np.random.default_rng(seed)
    n_test = num_data // 2
    Z = rng.normal(size=(num_data + n_test, num_features))
    theta = rng.normal(size=num_features + 1)
    y = theta[0] + Z @ theta[1:] + noise_sd * rng.normal(size=num_data + n_test)
    return build_dataset("linear", "linear", Z[:num_data], y[:num_data], Z[num_data:],
                         y[num_data:], True, None, seed, False,
                         {"true_theta": theta, "noise_sd": noise_sd})


def default_problem(num_data: int = 200_000, num_features: int = 20, seed: int = 0) -> Dataset:
    """The ``numpyro-subsample compare`` default: synthetic Bayesian logistic regression.

    Deterministic for a given (num_data, num_features, seed): features z_i ~ N(0, I_20),
    x_i = (1, z_i) (d = 21), true coefficients β ~ N(0, 0.5²·I) drawn first (logit sd ≈ 2.2),
    y_i ~ Bernoulli(σ(x_iᵀβ)); 10 % extra rows as a test set. Model: prior β ~ N(0, 10²)
    (:func:`logistic_regression_model`).
    """
    rng = np.random.default_rng(seed)
    beta = 0.5 * rng.normal(size=num_features + 1)
    n_test = max(num_data // 10, 1)
    Z = rng.normal(size=(num_data + n_test, num_features)).astype(np.float32)
    logits = beta[0] + Z @ beta[1:]
    y = (rng.uniform(size=logits.shape) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return build_dataset(
        f"synthetic_logistic_N{num_data}_d{num_features + 1}", "logistic",
        Z[:num_data], y[:num_data], Z[num_data:], y[num_data:], True, None, seed, False,
        {"true_beta": beta},
    )


def _calibrate_offset(eta: np.ndarray, minority: float, count: float) -> float:
    """The b with Σ_i σ(∓(η_i + b)) = ``count`` (expected rows with label ``minority``)."""
    sign = 1.0 if minority == 0.0 else -1.0
    lo, hi = -60.0, 60.0
    for _ in range(200):  # bisection: the expected count is monotone in b
        mid = 0.5 * (lo + hi)
        expected = np.sum(1.0 / (1.0 + np.exp(np.clip(sign * (eta + mid), -700, 700))))
        if (expected > count) == (sign > 0):
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def make_rare_features(
    num_data: int = 200_000,
    num_features: int = 20,
    *,
    binary_fractions: tuple[float, ...] = (0.01, 0.02, 0.05),
    minority_counts: tuple[float, ...] = (2.0, 4.0, 8.0),
    num_leverage: int = 10,
    leverage_scale: float = 10.0,
    seed: int = 0,
) -> Dataset:
    """Logistic regression with rare binary features and high-leverage rows, where the
    posterior is skewed and the Laplace approximation is off.

    x_i = (1, z_i, b_i): z_i ~ N(0, I) (``num_features − len(binary_fractions)`` columns,
    coefficients and intercept drawn N(0, 0.5²)); binary column j is 1 in a random
    ``binary_fractions[j]`` of the rows (disjoint sets of rows). Its coefficient (positive,
    negative, positive, ...) is set so that about ``minority_counts[j]`` of the rows having it
    are expected to carry the minority label (0, 1, 0, ...): a nearly separating feature. With
    k such rows the feature's likelihood is that of a log-gamma variable of shape k (a skewed
    posterior, its mean ≈ 0.3 sd from its mode for k = 2), and with none the coefficient is
    bounded by the prior only. ``num_leverage`` rows have their continuous features multiplied
    by ``leverage_scale``. y_i ~ Bernoulli(σ(x_iᵀβ)); no test set. Model:
    :func:`logistic_regression_model` (prior N(0, 10²)). ``info`` holds ``true_beta`` and the
    realised ``minority_counts``.
    """
    fractions = tuple(float(f) for f in binary_fractions)
    counts = tuple(float(c) for c in minority_counts)
    num_binary = len(fractions)
    if len(counts) != num_binary:
        raise ValueError(
            f"minority_counts has {len(counts)} entries and binary_fractions {num_binary}; "
            "pass one minority count per binary feature."
        )
    if not 0 <= num_binary < num_features:
        raise ValueError(
            f"num_features={num_features} must exceed the {num_binary} binary features."
        )
    if not all(0 < f < 1 for f in fractions) or not all(c > 0 for c in counts):
        raise ValueError(
            f"binary_fractions must lie in (0, 1) and minority_counts be positive, got "
            f"{fractions} and {counts}."
        )
    if not 0 <= num_leverage <= num_data:
        raise ValueError(f"num_leverage must be in [0, num_data], got {num_leverage}.")
    rng = np.random.default_rng(seed)
    N, p = int(num_data), num_features - num_binary
    Z = rng.normal(size=(N, p))
    Z[rng.choice(N, num_leverage, replace=False)] *= leverage_scale
    sizes = [max(int(round(f * N)), 1) for f in fractions]
    if sum(sizes) > N:
        raise ValueError(f"binary_fractions {fractions} sum to more than 1.")
    B = np.zeros((N, num_binary))
    order, start = rng.permutation(N), 0
    for j, size in enumerate(sizes):  # disjoint rows: one rare feature per row at most
        B[order[start:start + size], j] = 1.0
        start += size
    X = np.concatenate([np.ones((N, 1)), Z, B], axis=1)
    beta = np.concatenate([0.5 * rng.normal(size=p + 1), np.zeros(num_binary)])
    eta = X @ beta
    minority, realised = [], []
    for j, count in enumerate(counts):
        rows = B[:, j] == 1.0
        label = 0.0 if j % 2 == 0 else 1.0
        beta[p + 1 + j] = _calibrate_offset(eta[rows], label, count)
        minority.append(label)
    logits = X @ beta
    y = (rng.uniform(size=N) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    for j, label in enumerate(minority):
        realised.append(int(np.sum(y[B[:, j] == 1.0] == label)))
    return Dataset(
        name=f"rare_features_logistic_N{N}_d{X.shape[1]}", task="logistic",
        X_train=X.astype(np.float32), y_train=y, X_test=None, y_test=None,
        info={"seed": seed, "true_beta": beta, "binary_fractions": fractions,
         "minority_labels": tuple(minority), "minority_counts": tuple(realised),
         "num_leverage": int(num_leverage), "leverage_scale": float(leverage_scale)},
    )
