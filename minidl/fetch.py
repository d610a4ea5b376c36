"""Fetchers: turn one index (or one list of indices) from the sampler into one collated batch.

Mirrors ``torch/utils/data/_utils/fetch.py``. The same fetcher runs in the main process and in
every worker, so it holds no state about which worker it is in. An iterable fetcher only
remembers where its dataset iterator stands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Index = Any  # one dataset key, or a list of them when auto_collation is on


class _BaseDatasetFetcher:
    """What every fetcher holds: the dataset and how to turn fetched samples into a batch."""

    def __init__(self, dataset: Any, auto_collation: bool, collate_fn: Callable, drop_last: bool) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation  # True: the sampler yields lists of indices (batches)
        self.collate_fn = collate_fn
        self.drop_last = drop_last

    def fetch(self, possibly_batched_index: Index) -> Any:
        """The collated batch (or converted sample) for ``possibly_batched_index``."""
        raise NotImplementedError


class _MapDatasetFetcher(_BaseDatasetFetcher):
    """Fetches from a map-style dataset by index: ``dataset[i]`` for each ``i`` in the batch."""

    def fetch(self, possibly_batched_index: Index) -> Any:
        """Fetch every index in the batch, then collate. Without auto_collation, fetch one item."""
        if not self.auto_collation:
            return self.collate_fn(self.dataset[possibly_batched_index])
        # A dataset may fetch a whole batch at once, with one database query or one slice of an array.
        # Setting __getitems__ = None switches that off, as in torch.
        if getattr(self.dataset, "__getitems__", None):
            data = self.dataset.__getitems__(possibly_batched_index)
        else:
            data = []
            for idx in possibly_batched_index:
                data.append(self.dataset[idx])
        return self.collate_fn(data)


class _IterableDatasetFetcher(_BaseDatasetFetcher):
    """Fetches from an iterable-style dataset: the next ``len(batch)`` items of its iterator.

    The indices themselves are ignored, because the sampler yields ``None``. Only their number counts.
    """

    def __init__(
        self, dataset: Iterable, auto_collation: bool, collate_fn: Callable, drop_last: bool
    ) -> None:
        super().__init__(dataset, auto_collation, collate_fn, drop_last)
        self.dataset_iter = iter(dataset)
        self.ended = False  # the iterator is exhausted: every later fetch raises StopIteration

    def fetch(self, possibly_batched_index: Index) -> Any:
        """Pull up to one batch of items and collate it. Raise StopIteration when none are left."""
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            return self.collate_fn(next(self.dataset_iter))
        data = []
        for _ in possibly_batched_index:
            try:
                data.append(next(self.dataset_iter))
            except StopIteration:
                self.ended = True
                break
        if len(data) == 0 or (self.drop_last and len(data) < len(possibly_batched_index)):
            raise StopIteration  # nothing left, or a short final batch that drop_last discards
        return self.collate_fn(data)


class _DatasetKind:
    """Which fetcher a dataset needs: by index (``Map``) or by iteration (``Iterable``)."""

    Map = 0
    Iterable = 1

    @staticmethod
    def create_fetcher(
        kind: int, dataset: Any, auto_collation: bool, collate_fn: Callable, drop_last: bool
    ) -> _BaseDatasetFetcher:
        """The fetcher for ``kind``, built for ``dataset``.

        >>> fetcher = _DatasetKind.create_fetcher(_DatasetKind.Map, "abcdef", True, list, False)
        >>> fetcher.fetch([0, 2, 4])
        ['a', 'c', 'e']
        """
        if kind == _DatasetKind.Map:
            return _MapDatasetFetcher(dataset, auto_collation, collate_fn, drop_last)
        return _IterableDatasetFetcher(dataset, auto_collation, collate_fn, drop_last)
