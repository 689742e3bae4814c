"""numpyro_subsample: stochastic-gradient and energy-conserving subsampling MCMC for NumPyro."""

from numpyro_subsample import datasets
from numpyro_subsample.core.data import ModelData
from numpyro_subsample.core.potential import DataPlate, Potential, build_potential
from numpyro_subsample.core.quadrature import QuadratureWarning
from numpyro_subsample.ecs.kernel import ECSState, EnergyConservingHMC
from numpyro_subsample.ecs.options import HMCOptions, LikelihoodOptions, PreferentialOptions
from numpyro_subsample.estimators.base import ControlVariate, GradientEstimator, make_estimator
from numpyro_subsample.estimators.local import LocalConfig
from numpyro_subsample.estimators.registry import ESTIMATORS, configure_estimator
from numpyro_subsample.estimators.selection import (
    SamplingDesign,
    sample_without_replacement,
    uniform_design,
)
from numpyro_subsample.estimators.stratified import Strata, strata_of
from numpyro_subsample.post.arviz import full_log_likelihood, full_observed_data, to_arviz
from numpyro_subsample.post.checks import (
    BiasCheck,
    RunCheck,
    RunDiagnosticsWarning,
    check_run,
    step_halving_check,
)
from numpyro_subsample.post.diagnostics import ksd, mcmc_ksd, pseudo_variance
from numpyro_subsample.post.mcmc import MCMC
from numpyro_subsample.post.predictive import predictive
from numpyro_subsample.post.zv import ZVResult, zv_fit, zv_mean, zv_summary
from numpyro_subsample.proxies.base import Proxy, ProxyFitWarning
from numpyro_subsample.proxies.covariance import StructuredCovariance
from numpyro_subsample.proxies.laplace import fit_laplace, proxy_from_moments
from numpyro_subsample.proxies.structured import StructuredProxy, fit_structured
from numpyro_subsample.proxies.variational import fit_variational
from numpyro_subsample.sgmcmc.centring import (
    PartialCentring,
    centring_weights,
    partially_centred,
)
from numpyro_subsample.sgmcmc.distributed import (
    DistributedSGLD,
    ShardLayout,
    shard_design,
    shard_layout,
)
from numpyro_subsample.sgmcmc.kernel import (
    SGHMC,
    SGLD,
    SGNHT,
    Preprocessed,
    SGMCMCKernel,
    SGMCMCState,
)
from numpyro_subsample.sgmcmc.options import (
    AdaptationOptions,
    NoiseOptions,
    StepSchedule,
    StrataOptions,
    ZVOptions,
)
from numpyro_subsample.sgmcmc.sgrld import SGRLD
from numpyro_subsample.sgmcmc.step_bias import BiasProbe, StepBiasWarning

__all__ = [
    # kernels
    "SGLD",
    "SGHMC",
    "SGNHT",
    "SGRLD",
    "SGMCMCKernel",
    "AdaptationOptions",
    "NoiseOptions",
    "StepSchedule",
    "StrataOptions",
    "ZVOptions",
    "LocalConfig",
    "QuadratureWarning",
    "SGMCMCState",
    "Preprocessed",
    "BiasProbe",
    "StepBiasWarning",
    "DistributedSGLD",
    "ShardLayout",
    "shard_layout",
    "centring_weights",
    "partially_centred",
    "PartialCentring",
    "shard_design",
    "EnergyConservingHMC",
    "HMCOptions",
    "LikelihoodOptions",
    "PreferentialOptions",
    "ECSState",
    # model and data
    "ModelData",
    "Potential",
    "DataPlate",
    "build_potential",
    # proxies
    "Proxy",
    "ProxyFitWarning",
    "fit_laplace",
    "fit_variational",
    "proxy_from_moments",
    "fit_structured",
    "StructuredProxy",
    "StructuredCovariance",
    # estimators
    "ESTIMATORS",
    "configure_estimator",
    "GradientEstimator",
    "ControlVariate",
    "make_estimator",
    "SamplingDesign",
    "uniform_design",
    "sample_without_replacement",
    "Strata",
    "strata_of",
    # output and diagnostics
    "to_arviz",
    "MCMC",
    "check_run",
    "step_halving_check",
    "RunCheck",
    "BiasCheck",
    "RunDiagnosticsWarning",
    "full_observed_data",
    "full_log_likelihood",
    "predictive",
    "zv_mean",
    "zv_fit",
    "zv_summary",
    "ZVResult",
    "pseudo_variance",
    "ksd",
    "mcmc_ksd",
    # data sets
    "datasets",
]
__version__ = "0.2.0"
