"""Memory-mapped data: used in place, or refused early with what to do."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from models import logistic_data, logistic_model

from numpyro_subsample import SGLD


def test_memory_mapped_data_are_used_in_place_or_refused(tmp_path):
    """A float32 .npy file loaded with mmap_mode='r' reaches the preprocessing without a copy
    (JAX on the CPU aliases the mapping); one that would be copied whole raises, naming the
    file and what to do."""
    X, y = (np.asarray(a) for a in logistic_data(N=20_000, d=5))
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    Xm = np.load(tmp_path / "X.npy", mmap_mode="r")
    ym = np.load(tmp_path / "y.npy", mmap_mode="r")
    kernel = SGLD(logistic_model, progress_bar=False)
    kernel.preprocess((Xm, ym))
    if jax.default_backend() == "cpu":
        assert kernel.preprocessed_data.arrays[0].unsafe_buffer_pointer() == Xm.ctypes.data
    np.save(tmp_path / "X64.npy", X.astype(np.float64))
    with pytest.raises(ValueError, match=r"X64.npy.*copied whole into memory.*float32"):
        kernel.preprocess((np.load(tmp_path / "X64.npy", mmap_mode="r"), ym))
    with pytest.raises(ValueError, match="C-contiguous"):
        kernel.preprocess((Xm[:, 1:], ym))
