"""The default bias probe (``numpyro_subsample.sgmcmc.step_bias``): its cost and what it finds.

    python benchmarks/bench_bias_probe.py cost     # default runs with and without the probe
    python benchmarks/bench_bias_probe.py --quick  # cost, linear regression and SGLD only
    python benchmarks/bench_bias_probe.py hier [--ref-dir DIR] [KERNEL:step_size=H ...]
    python benchmarks/bench_bias_probe.py stateful [LABEL]  # SAGA, SVRG, local sites, SGRLD
    python benchmarks/bench_bias_probe.py model NAME KERNEL 0|1  # one bench_models run
    python benchmarks/bench_bias_probe.py short 0|1  # one chain of 1000 + 1000 SGLD steps

``cost``: each row is a fresh process (compilation included) running ``KERNEL(model)`` at
default arguments under NumPyro's ``MCMC``, 4 vectorized chains × (1000 + 10,000) steps, with
``bias_probe=False`` and with the probe; wall and CPU seconds, and the probe's own seconds and
gradient estimates. ``hier``: the centred hierarchical normal model of ``_hier_models.py`` at
the given steps (default: the kernels' own, and too large ones), errors against its cached
full-data NUTS reference (``hier_refs.py``), and what the probe estimated. ``stateful``: the
probes that carry a state per chain or run after the run, at the default step and at larger
ones, on models with an exact posterior: SAGA and SVRG on ``tests/models.py``'s linear
regression (N = 2000, d = 3, n = 100), SGLD with a per-row random effect drawn by MALA
(``LocalConfig(nodes=0)``; N = 1000, n = 500) and SGRLD on Dirichlet-categorical data (8
categories, N = 2·10^4, n = 500); 4 vectorized chains × (1000 + 8000) steps under the
package's ``MCMC``; the worst mean error and the range of the drawn sd / exact sd, and the
probe's worst estimate, cost and warning. ``model``: one default run of a ``bench_models.py``
problem (``_unseen_models.py``) with ``bias_probe`` off (0) or on (1), to time as a whole
process (e.g. with ``farm-bench --vs``). ``short``: likewise a short run of NumPyro's defaults,
one chain of 1000 + 1000 steps of ``SGLD(model)`` on the linear regression (N = 10^4, d = 4).
"""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))


def _one_cost(model_name: str, kernel: str, probe: bool) -> None:
    import jax
    from models import linreg_data, linreg_model, logistic_data, logistic_model
    from numpyro.infer import MCMC

    import numpyro_subsample as ns

    model, args = ((linreg_model, linreg_data(N=10_000, d=4)) if model_name == "linreg"
                   else (logistic_model, logistic_data(N=5000, d=4)))
    w0, c0 = time.perf_counter(), time.process_time()
    k = getattr(ns, kernel)(model, progress_bar=False, bias_probe=probe)
    mcmc = MCMC(k, num_warmup=1000, num_samples=10_000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *args)
    jax.block_until_ready(mcmc.get_samples())
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    p = k.preprocessed.step_bias
    extra = ("| – | – | – |" if p is None else
             f"| {p.seconds:.1f} | {p.gradient_evaluations} | {p.kind} {p.bias:+.3f} ± "
             f"{p.bias_se:.3f}{' FLAGGED' if p.flagged else ''} |")
    print(f"| {model_name} | {kernel} | {'on' if probe else 'off'} | {k.step_size:.3g} | "
          f"{wall:.1f} | {cpu:.1f} {extra}", flush=True)


def cost(quick: bool = False) -> None:
    print("| model | kernel | probe | h | wall s | CPU s | probe s | probe estimates | "
          "probe's worst estimate |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in ("linreg",) if quick else ("linreg", "logistic"):
        for kernel in ("SGLD",) if quick else ("SGLD", "SGHMC", "SGNHT"):
            for probe in ("0", "1"):
                subprocess.run([sys.executable, __file__, "_cost", model, kernel, probe],
                               check=True)


def hier(specs: list[str], ref_dir: str | None) -> None:
    import jax
    import numpy as np
    from _hier_models import suite
    from hier_refs import reference

    import numpyro_subsample as ns

    prob = suite()["normal-centred"]
    ref = reference(prob, compute=ref_dir is None) if ref_dir is None else None
    if ref_dir is not None:
        import _refs
        from hier_refs import SETTINGS
        args = tuple(jax.numpy.asarray(a) for a in prob.args)
        ref = _refs.get_reference("hier_suite", prob.name, prob.model, args,
                                  {**prob.kwargs, "subsample_size": int(args[0].shape[0])},
                                  SETTINGS, compute=False, cache_dir=Path(ref_dir))
    samples_ref = ref.samples
    print("| kernel | h | max mean err (sd) | at | probe: worst estimate | warned |")
    print("|---|---|---|---|---|---|")
    for spec in specs or ["SGLD", "SGHMC", "SGLD:step_size=0.2", "SGLD:step_size=0.35",
                          "SGHMC:step_size=0.6", "SGHMC:step_size=1.0"]:
        name, *kv = spec.split(":")
        kw = {a: float(b) for a, b in (x.split("=") for x in kv)}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            k = getattr(ns, name)(prob.model, progress_bar=False, **kw)
            mcmc = ns.MCMC(k, num_warmup=1000, num_samples=10_000, num_chains=4,
                           chain_method="vectorized", progress_bar=False)
            mcmc.run(jax.random.PRNGKey(0), *prob.args, **prob.kwargs)
        s = mcmc.get_samples()
        worst, where = 0.0, ""
        for site in prob.sites:
            r = np.asarray(samples_ref[site]).reshape(len(samples_ref[site]), -1)
            x = np.asarray(s[site]).reshape(len(s[site]), -1)
            e = np.abs(x.mean(0) - r.mean(0)) / r.std(0)
            if e.max() > worst:
                worst, where = float(e.max()), f"{site}[{int(e.argmax())}]"
        p = k.preprocessed.step_bias
        warned = any(issubclass(w.category, ns.StepBiasWarning) for w in caught)
        print(f"| {name} | {k.step_size:.3g} | {worst:.2f} | {where} | {p.kind}[{p.worst}] "
              f"{p.bias:+.2f} ± {p.bias_se:.2f} | {'yes' if warned else 'no'} |", flush=True)


def _stateful_cases():
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    import numpyro.distributions as dist
    from models import linreg_data, linreg_exact, linreg_model

    import numpyro_subsample as ns

    X, y = linreg_data(N=2000, d=3)
    mean, sd = linreg_exact(X, y)
    linreg = ((X, y), {}, "beta", np.asarray(mean), np.asarray(sd))

    def effect_model(y, n=500):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
            z = numpyro.sample("z", dist.Normal(0.0, 0.5))
            numpyro.sample("y", dist.Normal(mu + z, 1.0), obs=y[idx])

    rng = np.random.default_rng(11)
    ye = (1.3 + 0.5 * rng.normal(size=1000) + rng.normal(size=1000)).astype(np.float32)
    prec = 1.0 / 100.0 + ye.size / 1.25
    effect = ((ye,), {}, "mu", np.array([ye.sum() / 1.25 / prec]), np.array([prec**-0.5]))

    def categorical(yc, n=500):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(8)))
        with numpyro.plate("data", yc.shape[0], subsample_size=n) as idx:
            numpyro.sample("y", dist.Categorical(probs=pi), obs=yc[idx])

    rng = np.random.default_rng(8)
    yc = rng.choice(8, size=20000, p=rng.dirichlet(np.ones(8))).astype(np.int32)
    a = 1.0 + np.bincount(yc, minlength=8)
    m = a / a.sum()
    cat = ((yc,), {}, "pi", m, np.sqrt(m * (1 - m) / (a.sum() + 1)))
    local = ns.LocalConfig(nodes=0)
    return [
        ("linreg SAGA", lambda **kw: ns.SGLD(linreg_model, estimator="saga", **kw), linreg,
         [None, 0.3, 0.6]),
        ("linreg SVRG", lambda **kw: ns.SGLD(linreg_model, estimator="svrg", **kw), linreg,
         [None, 0.3, 0.6]),
        ("random effect, z drawn (SGLD)",
         lambda **kw: ns.SGLD(effect_model, local=local, **kw), effect,
         [None, 0.0004, 0.0007, 0.001]),
        ("Dir-cat K=8 (SGRLD)",
         lambda progress_bar, **kw: ns.SGRLD(categorical, **kw), cat,
         [None, 0.0003, 0.0005, 0.0006, 0.0008]),
    ]


def stateful(only: str = "") -> None:
    import jax
    import numpy as np

    import numpyro_subsample as ns

    print("| model (kernel) | step | max mean err (sd) | drawn sd / exact | probe: worst estimate "
          "(resolution) | probe estimates / run's | probe s / run s | warned |")
    print("|---|---|---|---|---|---|---|---|")
    for label, make, (args, kwargs, site, mean, sd), steps in _stateful_cases():
        if only not in label:
            continue
        for step in steps:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                k = make(progress_bar=False, **({} if step is None else {"step_size": step}))
                mcmc = ns.MCMC(k, num_warmup=1000, num_samples=8000, num_chains=4,
                               chain_method="vectorized", progress_bar=False)
                t0 = time.perf_counter()
                mcmc.run(jax.random.PRNGKey(1), *args, **kwargs)
                wall = time.perf_counter() - t0
            x = np.asarray(mcmc.get_samples()[site]).reshape(8000 * 4, -1)
            err = float(np.max(np.abs(x.mean(0) - mean.ravel()) / sd.ravel()))
            ratio = x.std(0) / sd.ravel()
            p = mcmc.run_check.step_bias or getattr(k.preprocessed, "step_bias", None)
            warned = any(issubclass(w.category, ns.StepBiasWarning) for w in caught)
            if p is None:
                found = "not probed: " + mcmc.run_check.step_bias_skipped
                share = seconds = "–"
            else:
                found = (f"{p.kind} {p.bias:+.2f} ± {p.bias_se:.2f} ({p.resolution:.2f})"
                         if not p.kind.startswith("diverged") else p.kind)
                share = f"{p.gradient_evaluations} / {4 * 9000}"
                seconds = f"{p.seconds:.1f} / {wall:.1f}"
            h = k.step_size
            print(f"| {label} | {h:.3g}{'' if step is not None else ' (default)'} | {err:.2f} | "
                  f"{ratio.min():.2f}-{ratio.max():.2f} | {found} | {share} | {seconds} | "
                  f"{'yes' if warned else 'no'} |", flush=True)


def model_run(name: str, kernel: str, probe: bool) -> None:
    import _unseen_models
    import jax

    import numpyro_subsample as ns

    prob = _unseen_models.suite([name])[name]
    k = getattr(ns, kernel)(prob.model, progress_bar=False, bias_probe=probe)
    mcmc = ns.MCMC(k, num_warmup=1000, num_samples=10_000, num_chains=4,
                   chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(jax.random.PRNGKey(0), *prob.args, **prob.kwargs)
    jax.block_until_ready(mcmc.get_samples())


def short_run(probe: bool) -> None:
    import jax
    from models import linreg_data, linreg_model
    from numpyro.infer import MCMC

    import numpyro_subsample as ns

    X, y = linreg_data(N=10_000, d=4)
    k = ns.SGLD(linreg_model, progress_bar=False, bias_probe=probe)
    mcmc = MCMC(k, num_warmup=1000, num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    jax.block_until_ready(mcmc.get_samples())


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "cost"
    if command == "_cost":
        _one_cost(sys.argv[2], sys.argv[3], sys.argv[4] == "1")
    elif command in ("cost", "--quick"):
        cost(quick="--quick" in sys.argv)
    elif command == "hier":
        rest = sys.argv[2:]
        ref_dir = None
        if "--ref-dir" in rest:
            i = rest.index("--ref-dir")
            ref_dir = rest[i + 1]
            del rest[i:i + 2]
        hier(rest, ref_dir)
    elif command == "short":
        short_run(sys.argv[2] == "1")
    elif command == "model":
        model_run(sys.argv[2], sys.argv[3], sys.argv[4] == "1")
    elif command == "stateful":
        stateful(sys.argv[2] if len(sys.argv) > 2 else "")
    else:
        raise SystemExit(__doc__)
