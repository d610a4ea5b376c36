"""The stream dataset of the ch06 exercises, a torch ``IterableDataset`` so that torch's DataLoader takes it too;
imported only when a ch06 check or helper runs (``import minidl_course.exercises`` needs NumPy alone)."""

from collections.abc import Iterator

import torch.utils.data


class RangeStream(torch.utils.data.IterableDataset):
    """Streams ``start .. end-1`` (``RangeStream(3, 6)``: 3, 4, 5). It doesn't shard itself: with workers, each
    replays all of it unless told otherwise."""
    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))

    def __repr__(self) -> str:
        return f"RangeStream({self.start}, {self.end})"
