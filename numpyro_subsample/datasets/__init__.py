"""Data sets of the papers: loaders for the original files, synthetic generators, models.

:mod:`~numpyro_subsample.datasets.loaders` reads the original formats (CSV, LIBSVM, ``.npz``)
from a user's path; :mod:`~numpyro_subsample.datasets.generators` holds the synthetic set-ups
of Putcha, Nemeth and Fearnhead (2023, Appendix C), the models and the :class:`Dataset` record.
This subpackage imports nothing from the rest of ``numpyro_subsample``.
"""

from numpyro_subsample.datasets.generators import (
    BVG_PRIOR_COV,
    BVG_SIGMA_X,
    DEFAULT_PRIOR_SCALE,
    PAPER_PRIOR_VARIANCE,
    Dataset,
    bivariate_gaussian_model,
    bivariate_gaussian_posterior,
    default_problem,
    linear_regression_model,
    logistic_regression_model,
    make_bivariate_gaussian,
    make_linear,
    make_logistic,
    make_quasi_separated,
    make_rare_features,
    split_train_test,
)
from numpyro_subsample.datasets.loaders import (
    DATASET_NAMES,
    DroppedRowsWarning,
    load_casp,
    load_dataset,
    load_libsvm,
    load_npz,
    load_skin,
)

__all__ = [
    "DroppedRowsWarning",
    "make_rare_features",
    "Dataset",
    "logistic_regression_model",
    "linear_regression_model",
    "bivariate_gaussian_model",
    "load_casp",
    "load_libsvm",
    "load_skin",
    "load_npz",
    "load_dataset",
    "split_train_test",
    "make_bivariate_gaussian",
    "make_logistic",
    "make_quasi_separated",
    "make_linear",
    "default_problem",
    "bivariate_gaussian_posterior",
    "DATASET_NAMES",
    "BVG_SIGMA_X",
    "BVG_PRIOR_COV",
    "PAPER_PRIOR_VARIANCE",
    "DEFAULT_PRIOR_SCALE",
]
