"""Reference answers to exercise ch12 (pitfalls to debug). Checkers refuse it imported."""

from __future__ import annotations

import numpy as np

from minidl.dataset import Dataset


class ArrayDataset(Dataset):
    """ListDataset's items, ``i * 0.5``, held in one float64 NumPy array: reading it writes nothing."""

    def __init__(self, n: int) -> None:
        self.items = np.arange(n, dtype=np.float64) * 0.5

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> float:
        return float(self.items[index])


LOADER_KWARGS = {"multiprocessing_context": "spawn"}
