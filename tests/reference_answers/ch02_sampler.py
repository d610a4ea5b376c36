"""Reference answer to ch02_sampler."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from minidl.sampler import Batch, Sampler


class SortedBatchSampler(Sampler[Batch]):
    """Batches of indices of similar length; ``shuffle`` permutes whole batches, anew each epoch.

    >>> list(SortedBatchSampler([3, 1, 2, 1, 3], batch_size=2))
    [[1, 3], [2, 0], [4]]
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, drop_last: bool = False, shuffle: bool = False,
                 generator=None) -> None:
        self.lengths = lengths
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.generator = generator

    def _sorted_batches(self) -> list[Batch]:
        # sorted() is stable: items of equal length keep their index order.
        order = sorted(range(len(self.lengths)), key=lambda i: self.lengths[i])
        batches = [order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __iter__(self) -> Iterator[Batch]:
        batches = self._sorted_batches()
        if not self.shuffle:
            yield from batches
            return
        for i in torch.randperm(len(batches), generator=self.generator).tolist():  # a new order every epoch
            yield batches[i]

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.lengths) // self.batch_size
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size
