"""The default bias probe (``numpyro_subsample.sgmcmc.step_bias``): its cost and what it finds.

    python benchmarks/bench_bias_probe.py cost     # default runs with and without the probe
    python benchmarks/bench_bias_probe.py --quick  # cost, linear regression and SGLD only
    python benchmarks/bench_bias_probe.py hier [--ref-dir DIR] [KERNEL:step_size=H ...]

``cost``: each row is a fresh process (compilation included) running ``KERNEL(model)`` at
default arguments under NumPyro's ``MCMC``, 4 vectorized chains × (1000 + 10,000) steps, with
``bias_probe=False`` and with the probe; wall and CPU seconds, and the probe's own seconds and
gradient estimates. ``hier``: the centred hierarchical normal model of ``_hier_models.py`` at
the given steps (default: the kernels' own, and too large ones), errors against its cached
full-data NUTS reference (``hier_refs.py``), and what the probe estimated.
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
    else:
        raise SystemExit(__doc__)
