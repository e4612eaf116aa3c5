"""Made-up inputs for a model's declared dtypes (``gpumnn run`` without --input, benchmarks)."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def random_input(dtype: np.dtype, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Random data of ``dtype``: standard normal floats, small non-negative integers (valid as
    indices into any axis of length 10 or more) and random bools."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, 10, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)
