"""The Bayesian neural network of ``bench_highdim.py``: data, model, MAP, BlackJAX SGHMC,
the full-data NUTS reference, the experiment and the prior scan (description there).
"""

from __future__ import annotations

import time

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from _highdim_lmm import _brief, log, run_sg, run_structured_proxy
from numpyro.infer import MCMC, NUTS

from numpyro_subsample import SGHMC, AdaptationOptions

HIDDEN = 50


def digits_data(seed: int) -> dict:
    """Binary digits (≥ 5), standardised by the training statistics, 60/15/25 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, t = load_digits(return_X_y=True)
    y = (t >= 5).astype(np.float64)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=seed, stratify=t)
    Xtr, Xva, ytr, yva = train_test_split(Xtr, ytr, test_size=0.2, random_state=seed)
    mu, s = Xtr.mean(0), Xtr.std(0)
    s = np.where(s > 0, s, 1.0)
    return {k: v for k, v in (("Xtr", (Xtr - mu) / s), ("ytr", ytr), ("Xva", (Xva - mu) / s),
                              ("yva", yva), ("Xte", (Xte - mu) / s), ("yte", yte))}


#: Prior sd of the weights: ``scale`` None gives N(0, 1) on every weight ("unit"); a number c
#: gives N(0, c²/fan-in) on the weight matrices (c/√64, c/√50) and N(0, 1) on the biases;
#: c = 1 ("fan-in") keeps the prior's pre-activations O(1) instead of saturating the tanh
#: units (set by ``--bnn-prior``).
BNN_PRIOR: dict = {"scale": None}


def prior_sd(name: str, shape: tuple) -> float:
    """The prior sd of the weight ``name`` of shape ``shape`` under :data:`BNN_PRIOR`."""
    c = BNN_PRIOR["scale"]
    if c is None or name in ("b1", "b2"):
        return 1.0
    return c * float(shape[0]) ** -0.5


def _prior_name(c) -> str:
    return "unit" if c is None else "fan-in" if c == 1 else f"{c:g}/√fan-in"


def bnn_model(X, y=None, subsample_size: int = 100) -> None:
    """One hidden layer of tanh units, Gaussian priors (:data:`BNN_PRIOR`), Bernoulli-logit
    output."""
    D = X.shape[1]
    W1 = numpyro.sample("W1", dist.Normal(0.0, prior_sd("W1", (D, HIDDEN)))
                        .expand([D, HIDDEN]).to_event(2))
    b1 = numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([HIDDEN]).to_event(1))
    W2 = numpyro.sample("W2", dist.Normal(0.0, prior_sd("W2", (HIDDEN,)))
                        .expand([HIDDEN]).to_event(1))
    b2 = numpyro.sample("b2", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        logits = jnp.tanh(X[idx] @ W1 + b1) @ W2 + b2
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=None if y is None else y[idx])


def _logits(params: dict, X):
    return jnp.tanh(X @ params["W1"] + params["b1"]) @ params["W2"] + params["b2"]


@jax.jit
def predictive_probs(draws: dict, X):
    """Posterior predictive probabilities (averaged over the leading axis of ``draws``)."""
    return jnp.mean(jax.nn.sigmoid(jax.vmap(_logits, (0, None))(draws, X)), 0)


@jax.jit
def predictive(draws: dict, X, y) -> tuple:
    """Accuracy and mean log-likelihood of the posterior predictive (probabilities averaged
    over the draws, the leading axis of ``draws``)."""
    p = jnp.clip(predictive_probs(draws, X), 1e-7, 1 - 1e-7)
    return jnp.mean((p > 0.5) == (y > 0.5)), jnp.mean(y * jnp.log(p) + (1 - y) * jnp.log1p(-p))


def _log_prior(params: dict):
    return sum(jnp.sum(dist.Normal(0.0, prior_sd(k, v.shape)).log_prob(v))
               for k, v in params.items())


def _log_lik(params: dict, x, y):
    return dist.Bernoulli(logits=_logits(params, x)).log_prob(y)


def init_params(key, D: int, dtype) -> dict:
    k1, k2 = jax.random.split(key)
    return {"W1": 0.1 * jax.random.normal(k1, (D, HIDDEN), dtype),
            "b1": jnp.zeros(HIDDEN, dtype),
            "W2": 0.1 * jax.random.normal(k2, (HIDDEN,), dtype), "b2": jnp.zeros((), dtype)}


def _thin(draws: dict, keep: int) -> dict:
    """Pool chains and keep ``keep`` evenly spaced draws."""
    pooled = {k: v.reshape(-1, *v.shape[2:]) for k, v in draws.items()}
    S = next(iter(pooled.values())).shape[0]
    idx = np.linspace(0, S - 1, min(keep, S)).astype(int)
    return {k: jnp.asarray(v[idx]) for k, v in pooled.items()}


def _score(row: dict, draws: dict, dd: dict, split: str = "te", ref=None) -> None:
    """Accuracy and log-likelihood of the posterior predictive on a split; with ``ref`` (the
    NUTS reference's test probabilities) also the mean |p̄ − p̄_NUTS| over the test points."""
    acc, ll = predictive(draws, dd["X" + split], dd["y" + split])
    row["test_acc" if split == "te" else "val_acc"] = float(acc)
    row["test_ll" if split == "te" else "val_ll"] = float(ll)
    if ref is not None and split == "te":
        row["dp_nuts"] = float(jnp.mean(jnp.abs(predictive_probs(draws, dd["Xte"]) - ref)))


@jax.jit
def draw_loglik(draws: dict, X, y):
    """Mean log-likelihood of (X, y) under each draw, for draws of shape (C, S, ...)."""
    return jax.vmap(jax.vmap(lambda d: jnp.mean(_log_lik(d, X, y))))(draws)


def nuts_reference(dd: dict, maps: list[dict], warmup: int, samples: int, depth: int,
                   seed: int) -> tuple[dict, dict]:
    """Full-data NumPyro NUTS on ``bnn_model``, chain c started at ``maps[c]`` (distinct MAPs:
    a short warm-up suffices, and R-hat is meaningful). Returns the row (test metrics,
    divergences, leapfrog steps, ESS and R-hat of the per-draw test log-likelihood: the weights
    themselves are not identified) and the draws."""
    X, y = dd["Xtr"], dd["ytr"]
    chains = len(maps)
    init = jax.tree.map(lambda *v: jnp.stack(v), *maps)
    t0 = time.perf_counter()
    mcmc = MCMC(NUTS(bnn_model, max_tree_depth=depth), num_warmup=warmup, num_samples=samples,
                num_chains=chains, chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed + 1), X, y, subsample_size=X.shape[0], init_params=init,
             extra_fields=("diverging", "num_steps"))
    draws = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    wall = time.perf_counter() - t0
    ef = {k: np.asarray(v) for k, v in mcmc.get_extra_fields(group_by_chain=True).items()}
    lls = np.asarray(draw_loglik(draws, dd["Xte"], dd["yte"]))
    ds = az.convert_to_dataset({"ll": lls})
    row = {"method": f"NUTS, full data ({chains} × ({warmup} + {samples}), depth {depth}, "
                     "from MAPs; reference)", "wall_s": wall,
           "steps_per_s": chains * (warmup + samples) / wall,
           "data_passes": float(ef["num_steps"].sum()),
           "divergences": int(ef["diverging"].sum()),
           "mean_leapfrog_steps": float(ef["num_steps"].mean()),
           "ess_draw_ll": float(az.ess(ds)["ll"]), "rhat_draw_ll": float(az.rhat(ds)["ll"]),
           "draw_ll_mean": float(lls.mean())}
    return row, (None if "error" in row else draws)


def map_adam(dd: dict, f, steps: int, lr: float, seed: int) -> tuple[dict, dict]:
    """MAP by Optax Adam on the full-batch log posterior."""
    X, y = dd["Xtr"], dd["ytr"]
    t0 = time.perf_counter()
    params = init_params(jax.random.PRNGKey(seed), X.shape[1], f)
    opt = optax.adam(lr)

    @jax.jit
    def fit(params, X, y):
        def loss(p):
            return -(_log_prior(p) + jnp.sum(_log_lik(p, X, y)))

        def body(carry, _):
            p, s = carry
            val, gr = jax.value_and_grad(loss)(p)
            upd, s = opt.update(gr, s, p)
            return (optax.apply_updates(p, upd), s), val

        (p, _), vals = jax.lax.scan(body, (params, opt.init(params)), None, steps)
        return p, vals[-1]

    params, last = fit(params, X, y)
    jax.block_until_ready(params)
    wall = time.perf_counter() - t0
    row = {"method": f"MAP (Optax Adam, full batch, {steps} steps, lr {lr})", "wall_s": wall,
           "steps_per_s": steps / wall, "data_passes": float(steps), "final_loss": float(last)}
    _score(row, jax.tree.map(lambda v: v[None], params), dd)
    return row, params


def blackjax_sghmc(dd: dict, f, step_size: float, num_iter: int, batch: int, chains: int,
                   seed: int, num_integration_steps: int) -> tuple[dict, dict]:
    """BlackJAX SGHMC (``blackjax.sghmc`` with ``sgmcmc.gradients.grad_estimator``), constant
    step, minibatches drawn with replacement, ``chains`` chains (vmapped), from the same random
    start as the MAP. Keeps the second half of the iterations."""
    import blackjax

    X, y = dd["Xtr"], dd["ytr"]
    N = X.shape[0]
    grad_est = blackjax.sgmcmc.gradients.grad_estimator(
        _log_prior, lambda p, xy: _log_lik(p, xy[0], xy[1]), N)
    sghmc = blackjax.sghmc(grad_est, num_integration_steps=num_integration_steps)
    t0 = time.perf_counter()

    @jax.jit
    def run(key, X, y, h):
        def one_chain(k):
            k0, ks = jax.random.split(k)
            pos = init_params(jax.random.PRNGKey(seed), X.shape[1], f)

            def body(pos, k):
                kb, kstep = jax.random.split(k)
                idx = jax.random.randint(kb, (batch,), 0, N)
                pos = sghmc.step(kstep, pos, (X[idx], y[idx]), h)
                return pos, pos

            _, trace = jax.lax.scan(body, pos, jax.random.split(ks, num_iter))
            return jax.tree.map(lambda v: v[num_iter // 2:], trace)

        return jax.vmap(one_chain)(jax.random.split(key, chains))

    draws = run(jax.random.PRNGKey(seed + 7), X, y, jnp.asarray(step_size, f))
    jax.block_until_ready(draws)
    wall = time.perf_counter() - t0
    row = {"method": f"BlackJAX SGHMC (h = {step_size:g})", "step_size": step_size,
           "wall_s": wall, "steps_per_s": chains * num_iter / wall,
           "data_passes": float(num_iter * num_integration_steps * batch / N),
           "num_integration_steps": num_integration_steps}
    return row, {k: np.asarray(v) for k, v in draws.items()}


def experiment_bnn(a) -> dict:
    dd = digits_data(a.seed)
    f = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    dd = {k: jnp.asarray(v, f) for k, v in dd.items()}
    N, D = dd["Xtr"].shape
    dim = D * HIDDEN + 2 * HIDDEN + 1
    log(f"[bnn] digits: N_train={N}, val={len(dd['yva'])}, test={len(dd['yte'])}, d={dim}")
    n = a.bnn_batch
    warm, samp = (1000, 4000) if a.quick else (2000, 20_000)
    thin = max(samp // 500, 1)
    map_row, map_params = map_adam(dd, f, 3000, 1e-2, a.seed)
    rows, ref = [map_row], None
    if a.bnn_nuts_draws:  # chain c from the MAP of seed + c (chain 0: the MAP row's)
        maps = [map_params] + [map_adam(dd, f, 3000, 1e-2, a.seed + c)[1]
                               for c in range(1, a.chains)]
        row, draws = nuts_reference(dd, maps, a.bnn_nuts_draws // 2, a.bnn_nuts_draws, 10,
                                    a.seed)
        thinned = _thin(draws, 500)
        ref = predictive_probs(thinned, dd["Xte"])
        _score(row, thinned, dd, ref=ref)
        log(f"    {_brief(row)}")
        rows.insert(0, row)
        _score(map_row, jax.tree.map(lambda v: v[None], map_params), dd, ref=ref)
    log(f"    {_brief(map_row)}")
    theta0 = 0.1 * jax.random.normal(jax.random.PRNGKey(a.seed), (dim,), f)
    pk = {"rank": a.rank, "curvature": "fisher", "init_theta": theta0}
    args, kwargs = (dd["Xtr"], dd["ytr"]), {"subsample_size": n}
    low_rank = {"proxy": "low-rank", "proxy_kwargs": pk}
    variants = (  # (name, options): defaults unless named
        ("SGHMC-uniform, low-rank", {"estimator": "uniform", **low_rank}),
        ("SGHMC-stratified, low-rank", {"estimator": "stratified", **low_rank}),
        ("SGHMC-uniform, low-rank, init at θ̂",
         {"estimator": "uniform", "init_strategy": "centre", **low_rank}),
        ("SGHMC-uniform, no proxy (preconditioning=False)",
         {"estimator": "uniform", "preconditioning": False}),
        ("SGHMC-uniform, low-rank, adapt_preconditioner=False",
         {"estimator": "uniform",
          "adaptation": AdaptationOptions(preconditioner=False), **low_rank}),
    )
    for name, opts in variants:
        log(f"[bnn] {name}: {a.chains} chains x ({warm} + {samp})")
        row, draws = run_sg(name, SGHMC, {"model": bnn_model, **opts},
                            args, kwargs, warmup=warm, samples=samp, chains=a.chains,
                            thinning=thin, seed=a.seed)
        if draws is not None:
            _score(row, _thin(draws, 500), dd, ref=ref)
        log(f"    {_brief(row)}")
        rows.append(row)
    # the proxy alone (no MCMC), fitted with the SGHMC rows' settings
    row, draws = run_structured_proxy("low-rank proxy alone (θ̂ + Lξ, no MCMC)", bnn_model,
                                      args, kwargs, dict(pk, structure="low-rank"), 500, a.seed)
    if draws is not None:
        _score(row, _thin(draws, 500), dd, ref=ref)
    log(f"    {_brief(row)}")
    rows.append(row)
    # BlackJAX: the same number of minibatch gradients per chain as the package's SGHMC
    L = 10
    num_iter = (warm + samp) // L
    tried = []
    for h in a.bjx_steps:
        row, draws = blackjax_sghmc(dd, f, h, num_iter, n, a.chains, a.seed, L)
        thinned = _thin(draws, 500)
        _score(row, thinned, dd, "va")
        _score(row, thinned, dd, ref=ref)
        log(f"    {_brief(row)} val_ll={row['val_ll']:.3f}")
        tried.append(row)
    ok = [r for r in tried if np.isfinite(r["val_ll"])]
    best = max(ok, key=lambda r: r["val_ll"]) if ok else tried[0]
    best = dict(best, chosen_from=[r["step_size"] for r in tried],
                how="largest validation log-likelihood")
    rows.append(best)
    return {"N_train": N, "N_val": int(len(dd["yva"])), "N_test": int(len(dd["yte"])),
            "d": dim, "hidden": HIDDEN,
            "prior": _prior_name(BNN_PRIOR["scale"]), "subsample_size": n, "chains": a.chains,
            "num_warmup": warm, "num_samples": samp, "thinning": thin, "rank": a.rank,
            "blackjax_iterations": num_iter, "blackjax_integration_steps": L,
            "blackjax_tried": tried, "rows": rows}


# -- report ---------------------------------------------------------------------------------------
def _warn(row: dict) -> str:
    if row.get("error"):
        return f"**failed**: {row['error']}"[:200]
    # every warning's class, then the start of each message
    ws = [w.replace("|", "/") for w in row.get("warnings", [])]
    return "; ".join(w[:90] + "…" if len(w) > 90 else w for w in ws) or "none"


def _prior_text(bn: dict) -> str:
    prior = bn.get("prior", "unit")
    if prior == "unit":
        return "N(0, 1) priors"
    sd = "1" if prior == "fan-in" else prior.split("/")[0] + "²"
    return f"N(0, {sd}/fan-in) priors on the weight matrices, N(0, 1) on the biases"


def prior_scan(a) -> dict:
    """MAP (two Adam seeds) and full-data NUTS for each prior scale of ``--bnn-prior-scan``:
    validation and test accuracy and log-likelihood, to see which prior validation picks and
    whether the exact posterior predictive beats the MAP under it."""
    dd = {k: jnp.asarray(v, jnp.float32) for k, v in digits_data(a.seed).items()}
    rows = []
    for c in a.bnn_prior_scan:
        BNN_PRIOR["scale"] = c
        maps = []
        for seed in (a.seed, a.seed + 1):
            row, params = map_adam(dd, jnp.float32, 3000, 0.01, seed)
            _score(row, jax.tree.map(lambda v: v[None], params), dd, "va")
            rows.append({"scale": c, **row})
            maps.append(params)
        row, draws = nuts_reference(dd, maps, a.bnn_nuts_draws // 2, a.bnn_nuts_draws, 10,
                                    a.seed)
        pooled = _thin(draws, 2 * a.bnn_nuts_draws)
        _score(row, pooled, dd)
        _score(row, pooled, dd, "va")
        rows.append({"scale": c, **row})
        log(f"[prior {c:g}/√fan-in] MAP test ll {rows[-3]['test_ll']:.4f}, "
            f"NUTS {row['test_ll']:.4f}")
    BNN_PRIOR["scale"] = None
    return {"rows": rows}
