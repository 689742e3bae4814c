"""Energy-conserving subsampling HMC (Dang et al. 2019; Rønning and Hamelryck 2021).

- :mod:`~numpyro_subsample.ecs.likelihood_proxies`: proxies q_i of the per-datum
  log-likelihood (Taylor, variational, hybrid) and their preprocessing passes;
- :mod:`~numpyro_subsample.ecs.difference`: the difference estimator l̂, its variance σ̂² and
  the selection law of the subsample (uniform or Hansen-Hurwitz);
- :mod:`~numpyro_subsample.ecs.gibbs`: the block-Gibbs update of the subsample;
- :mod:`~numpyro_subsample.ecs.chain`: the chain state and its pure init and step;
- :mod:`~numpyro_subsample.ecs.kernel`: :class:`~numpyro_subsample.ecs.kernel.EnergyConservingHMC`,
  the NumPyro kernel.
"""
