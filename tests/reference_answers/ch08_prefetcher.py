"""Reference answer to ch08_prefetcher."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch


def prefetch(loader: Iterable[Any], mean: Sequence[float], std: Sequence[float]) -> Iterator[Any]:
    """Yield ``loader``'s ``(images, targets)`` normalised, each only once the next one is fetched."""
    shape = (1, len(mean), 1, 1)  # broadcasts over (N, C, H, W)
    scale = torch.tensor([m * 255 for m in mean], dtype=torch.float32).view(shape)
    spread = torch.tensor([s * 255 for s in std], dtype=torch.float32).view(shape)
    held = None  # the batch to hand out next
    for images, targets in loader:
        upcoming = ((images.to(torch.float32) - scale) / spread, targets)  # started before `held` goes out
        if held is not None:
            yield held
        held = upcoming
    if held is not None:  # the loader ran out: the batch still held is the last one
        yield held
