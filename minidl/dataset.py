"""Datasets: map-style (``dataset[i]``) and iterable-style (``iter(dataset)``), and ways to combine them.

Mirrors ``torch/utils/data/dataset.py``. Nothing here imports torch. ``TensorDataset`` indexes
anything with ``.shape[0]`` and ``__getitem__``, so torch tensors and NumPy arrays both work.
"""

from __future__ import annotations

import bisect
import itertools
import math
import warnings
from collections.abc import Iterator, Sequence

# Iterable comes from typing, as torch imports it. IterableDataset's bases then put collections.abc.Iterable
# ahead of Generic. So a non-generic subclass such as ChainDataset still subscripts, as ChainDataset[int].
from typing import Any, Generic, Iterable, TypeVar  # noqa: UP035

from minidl._random import Generator, randperm

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "StackDataset", "ConcatDataset", "ChainDataset", "Subset",
           "random_split"]  # torch's, in torch's order

T_co = TypeVar("T_co", covariant=True)
T_stack = TypeVar("T_stack", tuple[Any, ...], dict[str, Any])  # a StackDataset item: a tuple or a dict


class Dataset(Generic[T_co]):
    """Base class for map-style datasets. Subclasses define ``__getitem__``, and usually ``__len__``.

    A subclass may also define ``__getitems__(indices)`` to fetch a whole batch in one call.
    """

    def __getitem__(self, index) -> T_co:
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other: Dataset[T_co]) -> ConcatDataset[T_co]:
        return ConcatDataset([self, other])

    # There is no default __len__ (see NOTE [ Lack of Default `__len__` ... ] in torch's sampler.py).


class IterableDataset(Dataset[T_co], Iterable[T_co]):
    """Base class for stream-like datasets. Subclasses define ``__iter__``, read front to back.

    In a DataLoader with workers, every worker iterates its own copy. Use ``get_worker_info()`` to
    give each worker its own share of the stream.
    """

    def __add__(self, other: Dataset[T_co]) -> ChainDataset:
        return ChainDataset([self, other])


class TensorDataset(Dataset[tuple[Any, ...]]):
    """Rows of several equally long arrays. Item ``i`` is ``(a[i], b[i], ...)``.

    >>> import numpy as np
    >>> ds = TensorDataset(np.arange(6).reshape(3, 2), np.array([10, 20, 30]))
    >>> len(ds), ds[2][0].tolist(), int(ds[2][1])
    (3, [4, 5], 30)
    """

    def __init__(self, *tensors: Any) -> None:
        # .shape[0] rather than torch's .size(0), so NumPy arrays work as well as tensors.
        if any(tensors[0].shape[0] != tensor.shape[0] for tensor in tensors):
            raise AssertionError("Size mismatch between tensors")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(tensor[index] for tensor in self.tensors)

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])


def _fetch_many(dataset: Any, indices: list) -> list:
    # Take a whole batch in one call where the dataset offers __getitems__, and else one item at a time.
    if callable(getattr(dataset, "__getitems__", None)):
        items = dataset.__getitems__(indices)
        if len(items) != len(indices):
            raise ValueError(
                f"Nested dataset's output size mismatch. Expected {len(indices)}, got {len(items)}"
            )
        return items
    return [dataset[i] for i in indices]


class StackDataset(Dataset[T_stack]):
    """Zips equally long datasets: ``StackDataset(a, b)[i] == (a[i], b[i])``, or a dict with keywords.

    >>> StackDataset(range(3), "abc")[1], StackDataset(x=range(3), y="abc")[2]
    ((1, 'b'), {'x': 2, 'y': 'c'})
    """

    def __init__(self, *args: Dataset[T_co], **kwargs: Dataset[T_co]) -> None:
        if args and kwargs:
            raise ValueError(  # torch 2.13's words, missing space included
                "Supported either ``tuple``- (via ``args``) or"
                "``dict``- (via ``kwargs``) like input/output, but both types are given."
            )
        if not args and not kwargs:
            raise ValueError("At least one dataset should be passed")
        datasets = list(args) or list(kwargs.values())
        self._length = len(datasets[0])
        if any(self._length != len(dataset) for dataset in datasets):
            raise ValueError("Size mismatch between datasets")
        self.datasets: tuple | dict = args or kwargs

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: dataset[index] for k, dataset in self.datasets.items()}
        return tuple(dataset[index] for dataset in self.datasets)

    def __getitems__(self, indices: list) -> list:
        # Fetch one column per stacked dataset (batched where it can be), then zip columns into rows.
        if isinstance(self.datasets, dict):
            columns = {k: _fetch_many(dataset, indices) for k, dataset in self.datasets.items()}
            return [{k: column[row] for k, column in columns.items()} for row in range(len(indices))]
        return list(zip(*(_fetch_many(dataset, indices) for dataset in self.datasets)))

    def __len__(self) -> int:
        return self._length


class ConcatDataset(Dataset[T_co]):
    """Map-style datasets end to end: indices run through the first, then the second, and so on.

    torch's deprecated misspelling ``cummulative_sizes`` is left out. Use ``cumulative_sizes``.

    >>> ds = ConcatDataset([range(3), range(10, 12)])
    >>> len(ds), ds[3], ds[-1], ds.cumulative_sizes
    (5, 10, 11, [3, 5])
    """

    @staticmethod
    def cumsum(sequence: Iterable[Any]) -> list[int]:
        """Running totals of the lengths. Each says where one dataset ends in the concatenation."""
        return list(itertools.accumulate(len(e) for e in sequence))

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if len(self.datasets) == 0:
            raise AssertionError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise AssertionError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        # The first dataset whose end lies beyond idx holds it.
        dataset_idx = bisect.bisect_right(self.cumulative_sizes, idx)
        start = self.cumulative_sizes[dataset_idx - 1] if dataset_idx > 0 else 0
        return self.datasets[dataset_idx][idx - start]


class ChainDataset(IterableDataset):
    """Iterable datasets one after another, chained lazily as they are read.

    >>> class Count(IterableDataset):
    ...     def __init__(self, n): self.n = n
    ...     def __iter__(self): return iter(range(self.n))
    >>> list(Count(2) + Count(3))
    [0, 1, 0, 1, 2]
    """

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = datasets

    def __iter__(self) -> Iterator:
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError("ChainDataset only supports IterableDataset")
            yield from d

    def __len__(self) -> int:
        total = 0
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError("ChainDataset only supports IterableDataset")
            total += len(d)  # type: ignore[arg-type]
        return total


class Subset(Dataset[T_co]):
    """The items of ``dataset`` at ``indices``, renumbered from 0.

    >>> list(Subset("abcde", [4, 0, 2]))
    ['e', 'a', 'c']
    """

    def __init__(self, dataset: Dataset[T_co], indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices
        # The DataLoader fetches batches through __getitems__, which would skip an overridden
        # __getitem__ without a word. torch refuses such a subclass, and so do we.
        cls = type(self)
        if cls.__getitem__ is not Subset.__getitem__ and cls.__getitems__ is Subset.__getitems__:
            raise NotImplementedError(
                f"{cls.__name__} overrides __getitem__ but not __getitems__. When subclassing Subset "
                "and overriding __getitem__, you must also override __getitems__ to ensure DataLoader "
                "works correctly with your custom logic. A simple implementation:\n\n"
                "def __getitems__(self, indices):\n"
                "    return [self.__getitem__(idx) for idx in indices]"
            )

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: list[int]) -> list[T_co]:
        parent_indices = [self.indices[i] for i in indices]
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__(parent_indices)  # type: ignore[attr-defined]
        return [self.dataset[i] for i in parent_indices]

    def __len__(self) -> int:
        return len(self.indices)


def random_split(
    dataset: Dataset[T_co], lengths: Sequence[int | float], generator: Generator = None
) -> list[Subset[T_co]]:
    """Split ``dataset`` into non-overlapping random ``Subset``s of the given lengths (or fractions).

    minidl's default is ``generator=None`` where torch's is ``torch.default_generator``. Both mean the same
    global stream, and minidl's names it without importing torch. A NumPy ``Generator`` also works here.

    >>> [len(s) for s in random_split(range(10), [0.5, 0.3, 0.2])]
    [5, 3, 2]
    """
    # Fractions summing to 1 become floor(frac * n) each. What is left over goes out one by one,
    # round-robin from the first split.
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
        n = len(dataset)  # type: ignore[arg-type]
        sizes = [math.floor(n * frac) for frac in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        lengths = sizes
        for i, length in enumerate(lengths):
            if length == 0:
                warnings.warn(
                    f"Length of split at index {i} is 0. This might result in an empty dataset.",
                    stacklevel=2,
                )

    if sum(lengths) != len(dataset):  # type: ignore[arg-type]
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")

    # One permutation of all indices, cut into consecutive pieces. generator=None draws from the
    # global generator, as torch's default_generator does.
    indices = randperm(sum(lengths), generator)  # type: ignore[arg-type]
    return [
        Subset(dataset, indices[offset - length : offset])
        for offset, length in zip(itertools.accumulate(lengths), lengths)  # type: ignore[arg-type]
    ]
