"""Compute (or load) the NUTS references of the hierarchical suite (``_hier_models.suite``):
full-data NumPyro NUTS, 1000 + 10,000 draws, cached by ``_refs.get_reference``.

    python benchmarks/hier_refs.py [names ...]
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _refs  # noqa: E402
from _hier_models import suite  # noqa: E402

SETTINGS = _refs.RefSettings(num_warmup=1000, num_samples=10_000, target_accept_prob=0.9)


def reference(problem, compute: bool = True, settings: _refs.RefSettings = SETTINGS):
    if problem.reference_settings:
        settings = dataclasses.replace(settings, **problem.reference_settings)
    args = tuple(jnp.asarray(a) for a in problem.args)
    n = int(problem.args[0].shape[0])
    model, name = problem.model, problem.name
    if problem.reference_model is not None:  # the same posterior, written for NUTS
        model, name = problem.reference_model, f"{problem.name}-noncentred"
    return _refs.get_reference("hier_suite", name, model, args,
                               {**problem.kwargs, "subsample_size": n}, settings,
                               compute=compute, extra_meta={"data_info": problem.info})


if __name__ == "__main__":
    problems = suite()
    for name in sys.argv[1:] or list(problems):
        ref = reference(problems[name])
        print(name, ref.meta["wall_s"], ref.meta["min_ess"], ref.meta["divergences"])
