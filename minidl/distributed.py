"""DistributedSampler: give each of ``num_replicas`` processes its own slice of the dataset.

Mirrors ``torch/utils/data/distributed.py``. Every rank shuffles with the same seed, pads (or trims)
the order to a multiple of ``num_replicas``, then takes every ``num_replicas``-th index from ``rank``.
It needs no process group when ``num_replicas`` and ``rank`` are given. Only otherwise is torch asked.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import TypeVar

from minidl import _random
from minidl._random import make_generator, randperm
from minidl.sampler import Sampler

__all__ = ["DistributedSampler"]

T_co = TypeVar("T_co", covariant=True)  # generic like torch's, so DistributedSampler[int] subscripts


def _process_group() -> object:
    # torch.distributed tells us the world size and our rank, when it can. It fails with torch's own errors.
    if not _random.HAS_TORCH:
        raise RuntimeError("Requires distributed package to be available")
    import torch.distributed as dist  # imported only when num_replicas or rank is left out

    if not dist.is_available():
        raise RuntimeError("Requires distributed package to be available")
    if not dist.is_initialized():
        raise ValueError(
            "Default process group has not been initialized, please make sure to call init_process_group."
        )
    return dist


class DistributedSampler(Sampler[T_co]):
    """Yields the indices that belong to ``rank``. Call ``set_epoch`` each epoch to reshuffle.

    Without a process group, leaving out ``num_replicas`` or ``rank`` raises torch's ``ValueError``: pass
    both to use it in a single process.

    With 10 items over 3 replicas, each rank gets 4. The order is padded with its own head, [0, 1].

    >>> [list(DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False)) for r in range(3)]
    [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    >>> list(DistributedSampler(range(10), num_replicas=3, rank=0, shuffle=False, drop_last=True))
    [0, 3, 6]
    >>> sampler = DistributedSampler(range(10), num_replicas=2, rank=1, seed=3)
    >>> sampler.set_epoch(5)
    >>> len(sampler), len(set(sampler))
    (5, 5)
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None:
            num_replicas = _process_group().get_world_size()
        if rank is None:
            rank = _process_group().get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            # Trim to the largest multiple of num_replicas below n, so every rank gets as many.
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            # Round up. The tail is padded with repeated indices instead.
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas  # across all ranks, padding included
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self) -> Iterator[T_co]:
        n = len(self.dataset)
        if self.shuffle:
            # Same seed and epoch on every rank, so all ranks agree on one permutation.
            indices = randperm(n, make_generator(self.seed + self.epoch))
        else:
            indices = list(range(n))

        if not self.drop_last:
            # Pad by repeating the order from its start (several times over if the dataset is tiny).
            padding_size = self.total_size - len(indices)
            if padding_size <= len(indices):
                indices += indices[:padding_size]
            else:
                indices += (indices * math.ceil(padding_size / len(indices)))[:padding_size]
        else:
            indices = indices[: self.total_size]
        if len(indices) != self.total_size:  # a dataset that shrank since construction
            raise AssertionError(f"Number of indices ({len(indices)}) does not match total_size ({self.total_size})")

        # Stride through the shared order. Rank r takes positions r, r + R, r + 2R, ...
        indices = indices[self.rank : self.total_size : self.num_replicas]
        if len(indices) != self.num_samples:
            raise AssertionError(
                f"Number of subsampled indices ({len(indices)}) does not match num_samples ({self.num_samples})"
            )
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which is added to ``seed``. Each epoch then shuffles differently."""
        self.epoch = epoch
