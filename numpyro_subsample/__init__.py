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
