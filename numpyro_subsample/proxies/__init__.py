"""Proxies of the posterior: a centre θ̂ and a covariance Σ̂ in unconstrained space.

:mod:`~numpyro_subsample.proxies.base` (the :class:`Proxy` record),
:mod:`~numpyro_subsample.proxies.laplace` (mode and inverse Hessian; a proxy from given
moments) and :mod:`~numpyro_subsample.proxies.variational` (an autoguide fitted by SVI).
"""

from numpyro_subsample.proxies.base import Proxy
from numpyro_subsample.proxies.laplace import fit_laplace, proxy_from_moments
from numpyro_subsample.proxies.variational import default_guide, fit_variational, guide_moments

__all__ = [
    "Proxy",
    "fit_laplace",
    "proxy_from_moments",
    "fit_variational",
    "default_guide",
    "guide_moments",
]
