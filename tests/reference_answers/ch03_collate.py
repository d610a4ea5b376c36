"""Reference answer to ch03_collate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def pad_mask_collate(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Token samples to ``{"tokens": (B, L) int64 padded with 0, "mask": (B, L) bool, "label": (B,) int64}``.

    >>> import numpy as np
    >>> out = pad_mask_collate([{"tokens": np.array([5, 0, 7]), "label": 1}, {"tokens": np.array([9]), "label": 0}])
    >>> out["tokens"].tolist(), out["mask"].tolist(), out["label"].tolist()
    ([[5, 0, 7], [9, 0, 0]], [[True, True, True], [True, False, False]], [1, 0])
    """
    lengths = [len(sample["tokens"]) for sample in batch]
    tokens = torch.zeros(len(batch), max(lengths), dtype=torch.int64)  # 0 is the padding id
    mask = torch.zeros(len(batch), max(lengths), dtype=torch.bool)
    for i, sample in enumerate(batch):
        tokens[i, : lengths[i]] = torch.as_tensor(sample["tokens"])
        mask[i, : lengths[i]] = True  # from the length, not tokens != 0: a real token may be 0
    return {"tokens": tokens, "mask": mask, "label": torch.tensor([s["label"] for s in batch], dtype=torch.int64)}
