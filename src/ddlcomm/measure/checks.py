"""Checks: a point's results compared with what they must be, the verdict agreed
over ranks, so a fast wrong answer is never reported."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..comm.agree import agree_all
from ..dtypes import dtype_of


def verdict(comm: Any, ok: bool) -> str:
    """A point's stored check: ``"passed"`` when every rank's result was right."""
    return "passed" if agree_all(comm, ok) else "failed"


def close(result: np.ndarray, expected: np.ndarray) -> bool:
    """``result`` equals ``expected`` (float64) up to a few roundings of its dtype."""
    eps = dtype_of(result).eps
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    return bool(np.allclose(result.astype(np.float64), expected, rtol=8 * eps, atol=8 * eps * scale))
