"""The data split and the per-method worker of ``bench_paper002.py`` (its docstring describes
the experiment): ``run_worker`` runs one method on one training size in a fresh process."""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ref_models  # noqa: E402

if TYPE_CHECKING:
    from numpyro_subsample import SGLD, Proxy

DATASET = "covtype_subset20k"
SG_METHODS = {"sgld": "uniform", "sgld-cv": "cv", "sgld-saga": "saga", "sgld-svrg": "svrg"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- data -------------------------------------------------------------------------------------
def fit_standardiser(X: np.ndarray) -> dict:
    """The parameters of ``_ref_models.standardise`` on the rows ``X``: kept columns, centre,
    scale."""
    X = np.asarray(X, np.float64)
    sd = X.std(0)
    keep = sd > 0
    Xk = X[:, keep]
    binary = np.array([np.unique(Xk[:, j]).size == 2 for j in range(Xk.shape[1])], bool)
    return {"keep": keep, "mean": Xk.mean(0), "scale": np.where(binary, np.ptp(Xk, 0), sd[keep])}


def apply_standardiser(params: dict, X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, np.float64)[:, params["keep"]]
    return ((X - params["mean"]) / params["scale"]).astype(np.float32)


def load_split(data_dir: str | None, test_frac: float, seed: int) -> dict:
    """Permuted rows of covtype_subset20k: test set and training pool, standardised on the
    pool (the transform of ``_ref_models.standardise``, checked against it)."""
    path = Path(data_dir or _ref_models.DATA_DIR) / DATASET / f"{DATASET}.npz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; pass --data-dir (the folder holding "
                                f"{DATASET}/{DATASET}.npz).")
    with np.load(path) as z:
        X, y = np.asarray(z["X"]), np.asarray(z["y"], np.float32)
    perm = np.random.default_rng(seed).permutation(X.shape[0])
    num_test = int(round(test_frac * X.shape[0]))
    test, pool = perm[:num_test], perm[num_test:]
    params = fit_standardiser(X[pool])
    Z_pool = apply_standardiser(params, X[pool])
    np.testing.assert_allclose(Z_pool, _ref_models.standardise(X[pool])[0], rtol=1e-5, atol=1e-5)
    return {"Z_pool": Z_pool, "y_pool": y[pool], "Z_test": apply_standardiser(params, X[test]),
            "y_test": y[test], "source": str(path), "rows": int(X.shape[0]),
            "dropped_columns": int((~params["keep"]).sum())}


def train_size(pool_rows: int, frac: float) -> int:
    return int(round(frac * pool_rows))


# -- one method (run by bench_paper002.py in a fresh process) --------------------------------------
def start_proxy(args: tuple, kwargs: dict, seed: int) -> Proxy:
    """A ``Proxy`` at the prior median θ0 (the model's initial point) with identity covariance
    and Σ_i ∇f_i(θ0) (one data pass): SAGA's table and SVRG's anchor then start at θ0, where
    the chain starts, as in Dubey et al. (2016), instead of at the Laplace mode."""
    import jax

    from numpyro_subsample import ModelData, Proxy, build_potential

    # not public: one full-data pass for value, gradient and Hessian
    from numpyro_subsample.core.datapass import value_grad_hessian

    data = ModelData.from_args(args, kwargs)
    pot = build_potential(_ref_models.logistic_model, data, jax.random.PRNGKey(seed))
    theta0 = pot.init_theta
    full = value_grad_hessian(pot, theta0, data, hessian=False)[1]
    sum_grads = full - jax.grad(lambda t: pot.prior(t, data))(theta0)
    eye = jax.numpy.eye(theta0.shape[0], dtype=theta0.dtype)
    return Proxy(theta0, eye, eye, None, sum_grads, 1.0, 0.0, "start", {})


def build_kernel(method: str, spec: dict, args: tuple, kwargs: dict) -> SGLD:
    """The kernel of ``method`` in ``spec["setting"]``: ``"default"``, the package's defaults;
    ``"paper"``, no preconditioning and the common constant step ``spec["step_size"]``, SGLD,
    SAGA and SVRG starting at the prior median θ0 (SAGA's table and SVRG's anchor there too)
    and SGLD-CV at the Laplace mode θ̂ (its centring value), as Baker et al. (2019, Sect. 5)."""
    from numpyro_subsample import SGLD  # noqa: F811 - imported here, in the worker only

    est = SG_METHODS[method]
    common = {"estimator": est, "seed": spec["seed"], "progress_bar": False}
    if spec["setting"] == "default":
        return SGLD(_ref_models.logistic_model, **common)
    paper = {**common, "preconditioning": False, "step_size": spec["step_size"],
             "init_strategy": "centre"}
    if est in ("uniform", "cv"):
        return SGLD(_ref_models.logistic_model, **paper)
    return SGLD(_ref_models.logistic_model, proxy=start_proxy(args, kwargs, spec["seed"]), **paper)


def run_worker(spec: dict) -> None:
    """Run one method on one size; write its draws (``.npz``) and facts (``.json``)."""
    import jax
    import jax.numpy as jnp
    from _runs import run_proxy
    from numpyro.infer import MCMC

    from numpyro_subsample.compare import CompileTimer

    split = load_split(spec["data_dir"], spec["test_frac"], spec["seed"])
    N = spec["num_data"]
    args = (jnp.asarray(split["Z_pool"][:N]), jnp.asarray(split["y_pool"][:N]))
    cpu0 = time.process_time()
    kwargs = {"subsample_size": spec["subsample_size"]}
    method, out = spec["method"], Path(spec["out"])
    meta: dict = {"method": method}
    if method == "laplace":
        run = run_proxy("laplace", "laplace", _ref_models.logistic_model, args, kwargs,
                        num_draws=spec["proxy_draws"], seed=spec["seed"])
        if run.error:
            raise RuntimeError(run.error)
        samples = {k: v[0] for k, v in run.samples.items()}
        S = samples["alpha"].shape[0]
        meta.update(setup_s=run.prep_s, wall_s=run.wall_s, compile_s=run.compile_s,
                    warnings=run.warnings)
        times = np.full(S, run.wall_s)
        passes = np.full(S, run.data_passes)
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with CompileTimer() as ct_prep:
                t0 = time.perf_counter()
                kernel = build_kernel(method, spec, args, kwargs)
                kernel.preprocess(args, kwargs)
                prep_s = time.perf_counter() - t0
            mcmc = MCMC(kernel, num_warmup=0, num_samples=spec["steps"],
                        thinning=spec["thin"], progress_bar=False)
            with CompileTimer() as ct_run:
                t1 = time.perf_counter()
                mcmc.run(jax.random.PRNGKey(spec["seed"]), *args, extra_fields=("data_passes",),
                         **kwargs)
                samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
                run_s = time.perf_counter() - t1
        passes = np.asarray(mcmc.get_extra_fields()["data_passes"], np.float64)
        S = passes.shape[0]
        sampling_s = run_s - ct_run.seconds
        setup_s = prep_s + ct_run.seconds
        times = setup_s + sampling_s * np.arange(1, S + 1) / S
        # the explicit step of the paper-like setting raises SGLD's DeprecationWarning about
        # the step-size convention (h, not ε = 2h): not a finding, left out
        texts = sorted({f"{w.category.__name__}: {' '.join(str(w.message).split())}"
                        for w in caught if not issubclass(w.category, DeprecationWarning)})
        meta.update(setup_s=setup_s, prep_s=prep_s, chain_compile_s=ct_run.seconds,
                    compile_s=ct_prep.seconds + ct_run.seconds, sampling_s=sampling_s,
                    wall_s=prep_s + run_s, step_size=float(kernel.step_size),
                    preprocessing_passes=float(kernel.preprocessed.data_passes),
                    warnings=texts, steps=spec["steps"], thin=spec["thin"])
        if SG_METHODS[method] == "svrg":
            meta["update_every"] = int(kernel.preprocessed.estimator.info["update_every"])
    meta.update(setting=spec["setting"], cpu_s=time.process_time() - cpu0)
    np.savez(out.with_suffix(".npz"), times=times, passes=passes, **samples)
    out.with_suffix(".json").write_text(json.dumps(meta, default=float))
