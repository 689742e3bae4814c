"""The option records of the SG kernels, the keywords of the previous release they replace,
and the kernels' capabilities as class attributes."""

from __future__ import annotations

import re
import warnings

import jax
import numpy as np
import pytest
from models import linreg_data, linreg_model, logistic_data, logistic_model

from numpyro_subsample import (
    MCMC,
    SGHMC,
    SGLD,
    SGRLD,
    AdaptationOptions,
    DistributedSGLD,
    EnergyConservingHMC,
    HMCOptions,
    LikelihoodOptions,
    LocalConfig,
    NoiseOptions,
    PreferentialOptions,
    StepSchedule,
    StrataOptions,
    ZVOptions,
)
from numpyro_subsample.sgmcmc.options import LEGACY_KEYWORDS


@pytest.fixture(scope="module")
def data():
    return linreg_data(N=500, d=3, seed=1)


_OLD_AND_NEW = [
    ({"zv_stream": True, "zv_degree": 2}, {"zv": ZVOptions(degree=2)}, "zv=ZVOptions(degree=2)"),
    ({"zv_stream": True, "zv_covariates": "gradient"},
     {"zv": ZVOptions(covariates="gradient")}, "zv=ZVOptions(covariates='gradient')"),
    ({"adapt_proxy": False}, {"adaptation": AdaptationOptions(proxy=False)},
     "adaptation=AdaptationOptions(proxy=False)"),
    ({"adapt_preconditioner": True, "adapt_proxy": None},
     {"adaptation": AdaptationOptions(preconditioner=True)},
     "adaptation=AdaptationOptions(preconditioner=True, proxy=None)"),
    ({"noise_correction": False, "max_variance_inflation": 0.1},
     {"noise": NoiseOptions(correction=False, max_variance_inflation=0.1)},
     "noise=NoiseOptions(correction=False, max_variance_inflation=0.1)"),
    ({"local_steps": 3}, {"local": LocalConfig(steps=3)}, "local=LocalConfig(steps=3)"),
]


@pytest.mark.parametrize("old, new, spelling", _OLD_AND_NEW,
                         ids=[",".join(o) for o, _, _ in _OLD_AND_NEW])
def test_old_keywords_warn_and_mean_the_record(old, new, spelling):
    with pytest.warns(DeprecationWarning, match=re.escape(f"deprecated; pass {spelling}.")) as seen:
        k_old = SGHMC(linreg_model, **old)
    assert seen[0].filename == __file__  # the warning points at the caller
    k_new = SGHMC(linreg_model, **new)
    for attr in ("zv_stream", "zv_degree", "zv_covariates", "zv_fn", "adapt_preconditioner",
                 "adapt_proxy", "max_variance_inflation", "noise_correction", "local",
                 "adaptation", "noise", "zv"):
        assert getattr(k_old, attr) == getattr(k_new, attr), attr


def test_every_old_keyword_has_a_record_field():
    records = {"zv": ZVOptions(), "adaptation": AdaptationOptions(), "noise": NoiseOptions(),
               "local": LocalConfig(), "schedule": StepSchedule(), "strata": StrataOptions()}
    for old, (name, field) in LEGACY_KEYWORDS.items():
        assert field == "" or hasattr(records[name], field), old


@pytest.mark.filterwarnings("ignore:This run may be wrong")  # 30 draws: not mixed
def test_old_keywords_give_the_same_draws(data):
    """The same chains, bit for bit, with the old keywords and with the records (ZV
    statistics included)."""
    X, y = data
    runs = []
    for spelling in ("old", "new"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            if spelling == "old":
                kernel = SGLD(linreg_model, zv_stream=True, zv_degree=2, adapt_proxy=False,
                              noise_correction=False, max_variance_inflation=0.1)
            else:
                kernel = SGLD(linreg_model, zv=ZVOptions(degree=2),
                              adaptation=AdaptationOptions(proxy=False),
                              noise=NoiseOptions(correction=False, max_variance_inflation=0.1))
        mcmc = MCMC(kernel, num_warmup=20, num_samples=30, progress_bar=False)
        mcmc.run(jax.random.PRNGKey(2), X, y, subsample_size=50)
        runs.append((np.asarray(mcmc.get_samples()["beta"]),
                     [np.asarray(v) for v in jax.tree.leaves(mcmc.last_state.zv_stats)]))
    (b_old, zv_old), (b_new, zv_new) = runs
    np.testing.assert_array_equal(b_old, b_new)
    for a, b in zip(zv_old, zv_new, strict=True):
        np.testing.assert_array_equal(a, b)


def test_old_keyword_with_its_record_is_refused():
    with pytest.raises(TypeError, match="pass zv= alone, not with zv_degree"):
        SGLD(linreg_model, zv=ZVOptions(), zv_degree=2)
    with pytest.raises(TypeError, match="pass local= alone"):
        SGRLD(linreg_model, local=LocalConfig(), local_steps=2)


def test_zv_off_with_old_keywords_is_zv_none():
    with pytest.warns(DeprecationWarning, match=r"pass zv=None \(the default\)"):
        kernel = SGLD(linreg_model, zv_degree=2)
    assert kernel.zv is None and kernel.zv_stream is False


def test_sgrld_old_local_keywords_warn():
    with pytest.warns(DeprecationWarning, match=r"pass local=LocalConfig\(steps=2\)"):
        kernel = SGRLD(linreg_model, local_steps=2)
    assert kernel.local == LocalConfig(steps=2)


def test_capabilities_are_class_attributes():
    for cls in (SGLD, SGHMC):
        assert cls.supports_local and cls.supports_structured and cls.supports_adaptation
        assert cls.supports_proxy_adaptation
    assert not (DistributedSGLD.supports_local or DistributedSGLD.supports_structured
                or DistributedSGLD.supports_adaptation
                or DistributedSGLD.supports_proxy_adaptation)
    assert SGRLD.supports_local and not EnergyConservingHMC.supports_local


def test_ecs_old_keywords_warn_and_give_the_same_draws():
    X, y = logistic_data(N=500, d=3, seed=2)
    runs = []
    for spelling in ("old", "new"):
        if spelling == "old":
            with pytest.warns(DeprecationWarning, match=re.escape(
                    "pass hmc=HMCOptions(algo='HMC', num_steps=5).")):
                kernel = EnergyConservingHMC(logistic_model, num_blocks=5, algo="HMC",
                                             num_steps=5, uniform_mix=0.1, taylor_order=1)
        else:
            kernel = EnergyConservingHMC(logistic_model, num_blocks=5,
                                         hmc=HMCOptions(algo="HMC", num_steps=5),
                                         preferential=PreferentialOptions(uniform_mix=0.1),
                                         likelihood=LikelihoodOptions(taylor_order=1))
        mcmc = MCMC(kernel, num_warmup=5, num_samples=10, progress_bar=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=50)
        runs.append((kernel.hmc_options, np.asarray(mcmc.get_samples()["beta"])))
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    with pytest.raises(TypeError, match="pass hmc= alone"):
        EnergyConservingHMC(logistic_model, hmc=HMCOptions(), algo="HMC")


def _update(rng_key, rows, values, idx, *args, **kwargs):
    return rows


_FEATURES = np.ones((10, 1))
_SG_OLD = {"zv_stream": True, "zv_degree": 2, "zv_covariates": "gradient", "zv_fn": _update,
           "adapt_preconditioner": True, "adapt_proxy": False, "noise_correction": False,
           "max_variance_inflation": 0.1, "local_update": _update, "local_steps": 3}
_SGRLD_OLD = {"max_variance_inflation": 0.1, "decay_offset": 500.0, "decay_power": 0.6,
              "num_strata": 4, "features": _FEATURES, "kmeans_iters": 3, "strata_seed": 2,
              "local_update": _update, "local_steps": 3}
_ECS_OLD = {"algo": "HMC", "step_size": 0.1, "adapt_step_size": False,
            "adapt_mass_matrix": False, "dense_mass": True, "target_accept_prob": 0.9,
            "max_tree_depth": 8, "trajectory_length": 1.0, "num_steps": 5, "taylor_order": 1,
            "hybrid_order": 2, "num_mc_draws": 10, "uniform_mix": 0.1, "num_selection_draws": 10}
_SGRLD_ATTRS = {"strata": "strata_options"}
_EVERY_OLD = ([(SGLD, k, v) for k, v in _SG_OLD.items()]
              + [(SGRLD, k, v) for k, v in _SGRLD_OLD.items()]
              + [(EnergyConservingHMC, k, v) for k, v in _ECS_OLD.items()])


@pytest.mark.parametrize("cls, old, value", _EVERY_OLD,
                         ids=[f"{c.__name__}-{k}" for c, k, _ in _EVERY_OLD])
def test_every_old_keyword_alone_warns_and_sets_its_record_field(cls, old, value):
    """Each keyword of the previous release still builds the kernel, with a DeprecationWarning
    naming the record that replaces it, and lands in that record's field."""
    from numpyro_subsample.ecs.options import LEGACY_ECS_KEYWORDS

    if cls is EnergyConservingHMC:
        record, _, field = LEGACY_ECS_KEYWORDS[old]
    else:
        record, field = LEGACY_KEYWORDS[old]
    kwargs = {old: value}
    if record == "zv" and old != "zv_stream":
        kwargs["zv_stream"] = True  # without it the old keywords meant zv=None
    with pytest.warns(DeprecationWarning, match=rf"deprecated; pass {record}="):
        kernel = cls(linreg_model, **kwargs)
    if cls is SGRLD and record == "noise":  # SGRLD keeps only this field of NoiseOptions
        assert kernel.max_variance_inflation == value
        return
    got = getattr(kernel, _SGRLD_ATTRS.get(record, record) if cls is SGRLD else record)
    assert got is not None
    if field:
        assert getattr(got, field) is value or getattr(got, field) == value, (old, got)
