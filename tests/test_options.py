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
