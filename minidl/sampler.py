"""Samplers: which dataset indices to visit, in what order, and how to group them into batches.

Mirrors ``torch/utils/data/sampler.py``. A sampler only yields integers, or lists of them. It never
touches the data. Random draws go through ``minidl._random``. So with torch installed and the same seed,
every sampler yields exactly the order torch's does. Without torch, NumPy draws instead.
minidl adds one thing: any ``generator=`` here may also be a ``numpy.random.Generator``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Generic, TypeVar

import numpy as np

from minidl import _random
from minidl._random import Generator, draw_seed, make_generator, multinomial, randint, randperm

__all__ = ["BatchSampler", "RandomSampler", "Sampler", "SequentialSampler", "SubsetRandomSampler",
           "WeightedRandomSampler"]

T_co = TypeVar("T_co", covariant=True)
Batch = list[int]  # one mini-batch of dataset indices


class Sampler(Generic[T_co]):
    """Base class for all samplers. ``__iter__`` yields indices, or batches of them.

    Subclasses may add ``__len__``. There is deliberately no default (see torch's NOTE
    [ Lack of Default `__len__` in Python Abstract Base Classes ]).
    """

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError


class SequentialSampler(Sampler[int]):
    """Yields ``0, 1, ..., len(data_source) - 1``, always in that order.

    >>> list(SequentialSampler(range(5)))
    [0, 1, 2, 3, 4]
    """

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler[int]):
    """Yields indices in random order, as a shuffle or as ``num_samples`` draws with replacement.

    >>> sorted(RandomSampler(range(5), generator=make_generator(0)))
    [0, 1, 2, 3, 4]
    >>> len(RandomSampler(range(5), replacement=True, num_samples=8))
    8
    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: Generator = None,
    ) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={replacement}")
        # As in torch, a bool passes here, with True counted as 1. An empty dataset fails, with num_samples=0.
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={self.num_samples}"
            )

    @property
    def num_samples(self) -> int:
        # Read len() late, because the dataset may grow or shrink between epochs.
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        # With no generator given, seed a fresh one from the global RNG once per epoch, as torch does.
        generator = self.generator
        if generator is None:
            generator = make_generator(draw_seed(None))

        if self.replacement:
            # Draw in chunks of 32, like torch, so both consume the generator identically.
            for _ in range(self.num_samples // 32):
                yield from randint(n, 32, generator)
            yield from randint(n, self.num_samples % 32, generator)
        else:
            # Whole permutations, then the head of one more. torch draws that last permutation
            # even when num_samples % n == 0. So do we, to keep a shared generator in step.
            for _ in range(self.num_samples // n):
                yield from randperm(n, generator)
            yield from randperm(n, generator)[: self.num_samples % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler[int]):
    """Yields the given indices in random order, each once.

    >>> sorted(SubsetRandomSampler([7, 3, 5], generator=make_generator(0)))
    [3, 5, 7]
    """

    def __init__(self, indices: Sequence[int], generator: Generator = None) -> None:
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        for i in randperm(len(self.indices), self.generator):
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler[int]):
    """Yields ``num_samples`` indices of ``weights``, each drawn with probability proportional to its weight.

    ``weights`` are taken and checked as torch takes and checks them. With torch installed, they are converted by
    torch's own ``torch.as_tensor(weights, dtype=torch.double)`` and kept as that float64 tensor. Their values
    (negative, infinite, NaN, summing to 0, too few without replacement) are refused when the first draw is made,
    with ``torch.multinomial``'s errors. Without torch, NumPy converts them into a float64 array, and refuses text and
    objects with a ``TypeError``.

    >>> sorted(WeightedRandomSampler([0.0, 2.0, 0.0, 1.0], 2, replacement=False))
    [1, 3]
    """

    def __init__(
        self,
        weights: Sequence[float],
        num_samples: int,
        replacement: bool = True,
        generator: Generator = None,
    ) -> None:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={num_samples}"
            )
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got replacement={replacement}")
        weights_array = _as_float64(weights)
        if weights_array.ndim != 1:
            raise ValueError(
                f"weights should be a 1d sequence but given weights have shape {tuple(weights_array.shape)}"
            )
        self.weights = weights_array
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        yield from multinomial(self.weights, self.num_samples, self.replacement, self.generator)

    def __len__(self) -> int:
        return self.num_samples


def _as_float64(weights):
    """``weights`` as a float64 tensor, as torch converts them; without torch, as a float64 NumPy array."""
    if _random.HAS_TORCH:
        torch = _random._torch()
        return torch.as_tensor(weights, dtype=torch.double)
    if isinstance(weights, str | bytes):  # torch's words for these
        raise TypeError(f"new(): invalid data type '{type(weights).__name__}'")
    array = np.asarray(weights)  # a ragged list raises a ValueError, as in torch
    if array.dtype.kind not in "biuf":
        raise TypeError(f"weights should be real numbers, but got an array of dtype {array.dtype}")
    return array.astype(np.float64)


class BatchSampler(Sampler[Batch]):
    """Groups the indices of another sampler (or any iterable) into lists of ``batch_size``.

    >>> list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False))
    [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    >>> list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=True))
    [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    """

    def __init__(self, sampler: Sampler[int] | Iterable[int], batch_size: int, drop_last: bool) -> None:
        # No isinstance check on sampler: anything iterable will do, as in torch.
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[Batch]:
        batch: Batch = []
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        # What is left is one short batch. It is kept unless drop_last asks to drop it.
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        # Only works when the wrapped sampler has a length.
        if self.drop_last:
            return len(self.sampler) // self.batch_size  # type: ignore[arg-type]
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size  # type: ignore[arg-type]
