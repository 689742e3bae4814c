"""numpyro_subsample: stochastic-gradient and energy-conserving subsampling MCMC for NumPyro."""

from numpyro_subsample.core.potential import DataPlate, ModelData, Potential, build_potential
from numpyro_subsample.estimators.base import ControlVariate, GradientEstimator, make_estimator
from numpyro_subsample.estimators.registry import ESTIMATORS, configure_estimator
from numpyro_subsample.estimators.selection import (
    SamplingDesign,
    sample_without_replacement,
    uniform_design,
)
from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.laplace import fit_laplace, proxy_from_moments
from numpyro_subsample.sgmcmc.kernel import (
    SGHMC,
    SGLD,
    SGNHT,
    Preprocessed,
    SGMCMCKernel,
    SGMCMCState,
)

__all__ = [
    "SGLD",
    "SGHMC",
    "SGNHT",
    "SGMCMCKernel",
    "SGMCMCState",
    "Preprocessed",
    "Potential",
    "ModelData",
    "DataPlate",
    "build_potential",
    "Proxy",
    "fit_laplace",
    "proxy_from_moments",
    "SamplingDesign",
    "uniform_design",
    "sample_without_replacement",
    "ControlVariate",
    "GradientEstimator",
    "make_estimator",
    "configure_estimator",
    "ESTIMATORS",
]
__version__ = "0.2.0"

# Names of modules being ported in this change, resolved on first use (PEP 562).
_LAZY = {
    "to_arviz": "numpyro_subsample.post.arviz",
    "full_observed_data": "numpyro_subsample.post.arviz",
    "full_log_likelihood": "numpyro_subsample.post.arviz",
    "zv_mean": "numpyro_subsample.post.zv",
    "zv_fit": "numpyro_subsample.post.zv",
    "zv_summary": "numpyro_subsample.post.zv",
    "ZVResult": "numpyro_subsample.post.zv",
    "ksd": "numpyro_subsample.post.diagnostics",
    "mcmc_ksd": "numpyro_subsample.post.diagnostics",
    "pseudo_variance": "numpyro_subsample.post.diagnostics",
    "DistributedSGLD": "numpyro_subsample.sgmcmc.distributed",
    "ShardLayout": "numpyro_subsample.sgmcmc.distributed",
    "shard_layout": "numpyro_subsample.sgmcmc.distributed",
    "shard_design": "numpyro_subsample.sgmcmc.distributed",
    "EnergyConservingHMC": "numpyro_subsample.ecs.kernel",
    "ECSState": "numpyro_subsample.ecs.kernel",
    "fit_variational": "numpyro_subsample.proxies.variational",
    "Strata": "numpyro_subsample.estimators.stratified",
    "strata_of": "numpyro_subsample.estimators.stratified",
    "datasets": "numpyro_subsample.datasets",
}


def __getattr__(name):
    import importlib

    if name in _LAZY:
        mod = importlib.import_module(_LAZY[name])
        return mod if name == "datasets" else getattr(mod, name)
    raise AttributeError(name)
