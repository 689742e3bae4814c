"""A centred hierarchical normal model with thousands of groups: the structured (d > 2000) path.

y_i ~ N(a[g_i] + b x_i, σ), a_j ~ N(μ, τ) written centred, τ ~ HalfNormal(1), σ ~ HalfNormal(2),
J groups of lognormal sizes (1 to 1000 rows), n = 1000. ``SGLD(model)`` and ``SGHMC(model)`` at
default arguments under the package's ``MCMC``, 4 vectorized chains × (1000 + 10,000) steps.

Reference: exact. The group effects are integrated out analytically (each group's rows are
jointly normal given (μ, τ, σ, b)), NUTS samples the four remaining parameters (2 × 10,000
draws, float64), and the group effects' means and sds follow by Rao-Blackwellisation
(a_j | rest is normal). Columns as in ``bench_hierarchical.py``: worst |mean error| and
|log sd ratio| in reference sds, over the globals and over the J group effects.

    python benchmarks/bench_wide_hierarchical.py                  # J = 2500 (d = 2504)
    python benchmarks/bench_wide_hierarchical.py --groups 300     # d = 304: the dense path
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import add_device_option, fmt, run_kernel, warnings_cell  # noqa: E402

import numpyro_subsample as ns  # noqa: E402


def data(num_groups: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(np.exp(rng.normal(2.0, 1.3, num_groups))), 1, 1000).astype(int)
    g = np.repeat(np.arange(num_groups), sizes)
    x = rng.normal(size=g.size).astype(np.float32)
    a = 0.3 + 0.5 * rng.normal(size=num_groups)
    y = (a[g] + 0.7 * x + rng.normal(size=g.size)).astype(np.float32)
    return g.astype(np.int32), x, y


def model(g, x, y, num_groups, subsample_size=1000):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfNormal(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    b = numpyro.sample("b", dist.Normal(0, 2))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", g.shape[0], subsample_size=subsample_size) as i:
        numpyro.sample("y", dist.Normal(a[g[i]] + b * x[i], sigma), obs=y[i])


def reference(g, x, y, num_groups: int, draws: int) -> tuple[dict, float]:
    """Exact posterior moments (module docstring) and the seconds they took."""
    t0 = time.perf_counter()
    nj = np.bincount(g, minlength=num_groups).astype(np.float64)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    s = {k: np.bincount(g, v, num_groups) for k, v in
         {"x": x64, "y": y64, "xx": x64 * x64, "xy": x64 * y64, "yy": y64 * y64}.items()}

    def collapsed():
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        tau = numpyro.sample("tau", dist.HalfNormal(1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2))
        b = numpyro.sample("b", dist.Normal(0, 2))
        sr = s["y"] - b * s["x"] - mu * nj
        srr = (s["yy"] - 2 * b * s["xy"] + b * b * s["xx"] - 2 * mu * (s["y"] - b * s["x"])
               + mu * mu * nj)
        s2, t2 = sigma**2, tau**2
        numpyro.factor("y", jnp.sum(-0.5 * ((srr - t2 * sr**2 / (s2 + nj * t2)) / s2
                                            + (nj - 1) * jnp.log(s2) + jnp.log(s2 + nj * t2)
                                            + nj * jnp.log(2 * jnp.pi))))

    jax.config.update("jax_enable_x64", True)
    try:
        mcmc = numpyro.infer.MCMC(numpyro.infer.NUTS(collapsed), num_warmup=2000,
                                  num_samples=draws, num_chains=2, chain_method="sequential",
                                  progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0))
        d = {k: np.asarray(v, np.float64) for k, v in mcmc.get_samples().items()}
    finally:
        jax.config.update("jax_enable_x64", False)
    v = 1 / (1 / d["tau"][:, None] ** 2 + nj / d["sigma"][:, None] ** 2)
    m = v * (d["mu"][:, None] / d["tau"][:, None] ** 2
             + (s["y"] - d["b"][:, None] * s["x"]) / d["sigma"][:, None] ** 2)
    ref = {k: (d[k].mean(), d[k].std()) for k in d}
    ref["a"] = (m.mean(0), np.sqrt(v.mean(0) + m.var(0)))
    return ref, time.perf_counter() - t0


def errors(samples: dict, ref: dict) -> dict:
    pooled = {k: v.reshape(-1, *v.shape[2:]).astype(np.float64) for k, v in samples.items()}
    out = {}
    for part, sites in (("globals", ("mu", "tau", "sigma", "b")), ("a", ("a",))):
        mean = max(float(np.max(np.abs(pooled[k].mean(0) - ref[k][0]) / ref[k][1])) for k in sites)
        log_sd = max(float(np.max(np.abs(np.log(pooled[k].std(0) / ref[k][1])))) for k in sites)
        out[part] = (mean, log_sd)
    return out


def proxy_rows(g, x, y, num_groups: int, ref: dict, num_draws: int) -> list[str]:
    """The proxies alone, as the kernels fit them on the centred model (no MCMC): the
    structured Laplace fit (low rank 20, Hutchinson diagonal: the kernels' above
    MAX_DENSE_DIM) and the mean-field SVI fit that starts the pilot; ``num_draws``
    independent draws each."""
    from numpyro_subsample.proxies.covariance import scale_matvec
    from numpyro_subsample.proxies.variational import mean_field

    data_ = ns.ModelData.from_args((g, x, y, num_groups))
    pot = ns.build_potential(model, data_, jax.random.PRNGKey(0))
    draw = jax.jit(jax.vmap(lambda t, d: pot.constrain(pot.unravel(t), d), in_axes=(0, None)))
    eps = jax.random.normal(jax.random.PRNGKey(5), (num_draws, pot.dim))
    rows = []
    for name in ("structured Laplace fit", "mean-field fit"):
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if name == "mean-field fit":
                q = mean_field(pot, data_, jax.random.PRNGKey(1))
                thetas, passes = q.mean + q.sd * np.asarray(eps), q.passes
            else:
                fit = ns.fit_structured(pot, data_, jax.random.PRNGKey(1), structure="low-rank",
                                        rank=20, diagonal="hutchinson", store_datum_grads=False)
                thetas = fit.centre + scale_matvec(fit.cov_op, eps)
                passes = fit.num_data_passes
            samples = {k: np.asarray(v)[None] for k, v in
                       draw(jnp.asarray(thetas, jnp.float32), data_).items()}
        wall = time.perf_counter() - t0
        err = errors(samples, ref)
        warned = "; ".join(f"{w.category.__name__}: {str(w.message)[:160]}…" for w in caught
                           if issubclass(w.category, UserWarning)) or "none"
        rows.append(f"| {name} (no MCMC) | {err['globals'][0]:.2f} / {err['globals'][1]:.2f} "
                    f"| {err['a'][0]:.2f} / {err['a'][1]:.2f} | – | {wall:.1f} (–) | {wall:.1f} "
                    f"| {passes:.0f} | – | {warned} |")
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", type=int, default=2500)
    p.add_argument("--methods", default="sgld,sghmc")
    p.add_argument("--num-warmup", type=int, default=1000)
    p.add_argument("--num-samples", type=int, default=10_000)
    p.add_argument("--reference-draws", type=int, default=10_000)
    p.add_argument("--no-proxies", action="store_true",
                   help="leave out the proxies-alone rows")
    add_device_option(p)
    args = p.parse_args(argv)
    g, x, y = data(args.groups)
    print(f"device: {args.device or jax.devices()[0]}; J = {args.groups}, N = {g.size}, "
          f"d = {args.groups + 4}", flush=True)
    ref, ref_s = reference(g, x, y, args.groups, args.reference_draws)
    print(f"reference (collapsed NUTS, 2 × {args.reference_draws} draws): {ref_s:.1f} s",
          flush=True)
    kernels = {"sgld": ns.SGLD, "sghmc": ns.SGHMC, "sgnht": ns.SGNHT}
    print("| method | globals: mean err / log-sd err | group effects: mean err / log-sd err "
          "| min ESS | wall s (compile s) | preprocessing s | data passes | step h | warnings |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in [m for m in args.methods.split(",") if m]:
        run = run_kernel(name, lambda k=kernels[name]: k(model), (g, x, y, args.groups), {},
                         num_warmup=args.num_warmup, num_samples=args.num_samples,
                         num_chains=4, mcmc_class=ns.MCMC)
        if run.error:
            print(f"| {name} | – | – | – | – | – | – | – | {warnings_cell(run)} |")
            continue
        err = errors(run.samples, ref)
        ess = min(float(np.min(effective_sample_size(v))) for v in run.samples.values()
                  if v.ndim >= 2 and np.all(np.isfinite(v)))
        print(f"| {name} | {err['globals'][0]:.2f} / {err['globals'][1]:.2f} "
              f"| {err['a'][0]:.2f} / {err['a'][1]:.2f} | {ess:.0f} | {fmt(run.wall_s, '.1f')} "
              f"({fmt(run.compile_s, '.1f')}) | {fmt(run.prep_s, '.1f')} "
              f"| {fmt(run.data_passes, '.0f')} | {fmt(run.step_size, '.3g')} "
              f"| {warnings_cell(run, 400)} |", flush=True)
    if not args.no_proxies:
        for row in proxy_rows(g, x, y, args.groups, ref, 4 * args.num_samples):
            print(row, flush=True)


if __name__ == "__main__":
    main()
