"""numpyro_subsample: stochastic-gradient MCMC for large-data NumPyro models."""

from .estimators import ControlVariate, GradientEstimator, configure_estimator, make_estimator
from .io import full_log_likelihood, full_observed_data, to_arviz
from .kernel import SGLD, Preprocessed, SGMCMCKernel, SGMCMCState
from .potential import DataPlate, Potential, build_potential
from .proxy import Proxy, fit_laplace, proxy_from_moments
from .selection import SamplingDesign, sample_without_replacement, uniform_design

__all__ = [
    "SGLD",
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
]
__version__ = "0.1.0"
