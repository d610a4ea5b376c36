"""Reference answer to exercise ch07 (a fresh page-locked copy of a batch). Checkers refuse it imported."""

from __future__ import annotations

import numpy as np


def pin_copy(batch: np.ndarray, lock_pages) -> np.ndarray:
    out = np.empty_like(batch)
    with lock_pages(out):
        np.copyto(out, batch)
    return out
