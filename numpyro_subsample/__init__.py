"""numpyro_subsample: stochastic-gradient MCMC for large-data NumPyro models."""

from . import datasets
from .diagnostics import ksd, mcmc_ksd, pseudo_variance
from .distributed import DistributedSGLD, ShardLayout, shard_design, shard_layout
from .ecs import ECSState, EnergyConservingHMC
from .estimators import ControlVariate, GradientEstimator, configure_estimator, make_estimator
from .io import full_log_likelihood, full_observed_data, to_arviz
from .kernel import SGHMC, SGLD, SGNHT, Preprocessed, SGMCMCKernel, SGMCMCState
from .potential import DataPlate, Potential, build_potential
from .preferential import configure_preferential
from .proxy import Proxy, fit_laplace, proxy_from_moments
from .selection import SamplingDesign, sample_without_replacement, uniform_design
from .stratified import Strata, strata_of
from .variational import fit_variational
from .zv import ZVResult, zv_fit, zv_mean, zv_summary

__all__ = [
    "DistributedSGLD",
    "ShardLayout",
    "shard_layout",
    "shard_design",
    "datasets",
    "zv_mean",
    "zv_fit",
    "zv_summary",
    "ZVResult",
    "SGLD",
    "SGHMC",
    "SGNHT",
    "Strata",
    "strata_of",
    "SGMCMCKernel",
    "SGMCMCState",
    "Preprocessed",
    "to_arviz",
    "full_observed_data",
    "full_log_likelihood",
    "Potential",
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
    "configure_preferential",
    "pseudo_variance",
    "ksd",
    "mcmc_ksd",
    "EnergyConservingHMC",
    "ECSState",
    "fit_variational",
]
__version__ = "0.1.0"
