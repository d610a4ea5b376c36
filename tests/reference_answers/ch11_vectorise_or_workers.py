"""Reference answer to exercise ch11 (a vectorised batch transform). Checkers refuse it imported."""

from __future__ import annotations

import numpy as np

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1)


def transform_batch(images: np.ndarray) -> np.ndarray:
    x = images.transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255)
    return (x - MEAN) / STD
