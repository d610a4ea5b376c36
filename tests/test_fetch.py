"""minidl.fetch against torch.utils.data._utils.fetch: the same batches, the same stops."""

import pytest
import torch
import torch.utils.data._utils.fetch as torch_fetch
from torch.utils.data.dataloader import _DatasetKind as TorchDatasetKind

from minidl.collate import default_collate, default_convert
from minidl.fetch import (
    _DatasetKind,
    _IterableDatasetFetcher,
    _MapDatasetFetcher,
)


class Squares:
    """A map-style dataset that counts how it is read."""

    def __init__(self, n=10):
        self.n = n
        self.getitem_calls = 0

    def __getitem__(self, i):
        self.getitem_calls += 1
        return {"x": i * i, "i": i}

    def __len__(self):
        return self.n


class BatchedSquares(Squares):
    """Also fetches a whole batch at once, and counts those calls."""

    def __init__(self, n=10):
        super().__init__(n)
        self.getitems_calls = 0

    def __getitems__(self, indices):
        self.getitems_calls += 1
        return [{"x": i * i, "i": i} for i in indices]


class OptedOut(BatchedSquares):
    __getitems__ = None  # torch's way to switch batch fetching off


def drain(fetcher, batch_size):
    """Fetch batches until the fetcher says stop."""
    batches = []
    while True:
        try:
            batches.append(fetcher.fetch([None] * batch_size))
        except StopIteration:
            return batches


def test_dataset_kind_values_match_torch():
    assert (_DatasetKind.Map, _DatasetKind.Iterable) == (TorchDatasetKind.Map, TorchDatasetKind.Iterable)
    assert isinstance(
        _DatasetKind.create_fetcher(_DatasetKind.Map, [], True, list, False), _MapDatasetFetcher
    )
    assert isinstance(
        _DatasetKind.create_fetcher(_DatasetKind.Iterable, [], True, list, False), _IterableDatasetFetcher
    )


def test_map_fetcher_uses_getitems_once_per_batch():
    dataset = BatchedSquares()
    fetcher = _DatasetKind.create_fetcher(_DatasetKind.Map, dataset, True, default_collate, False)
    batch = fetcher.fetch([3, 1, 4])
    assert dataset.getitems_calls == 1 and dataset.getitem_calls == 0
    assert batch["x"].tolist() == [9, 1, 16]


@pytest.mark.parametrize("dataset_type", [Squares, OptedOut])
def test_map_fetcher_falls_back_to_one_getitem_per_index(dataset_type):
    dataset = dataset_type()
    fetcher = _MapDatasetFetcher(dataset, True, default_collate, False)
    fetcher.fetch([0, 5, 2, 2])
    assert dataset.getitem_calls == 4
    assert getattr(dataset, "getitems_calls", 0) == 0


@pytest.mark.parametrize("dataset_type", [Squares, BatchedSquares])
@pytest.mark.parametrize("auto_collation", [True, False])
def test_map_fetcher_matches_torch(dataset_type, auto_collation):
    index = [7, 0, 3] if auto_collation else 7
    collate_fn = default_collate if auto_collation else default_convert
    ours = _MapDatasetFetcher(dataset_type(), auto_collation, collate_fn, False).fetch(index)
    theirs = torch_fetch._MapDatasetFetcher(dataset_type(), auto_collation, collate_fn, False).fetch(index)
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert type(ours[key]) is type(theirs[key])
        assert torch.equal(torch.as_tensor(ours[key]), torch.as_tensor(theirs[key]))


@pytest.mark.parametrize("n,batch_size", [(10, 4), (8, 4), (3, 5), (0, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_fetcher_matches_torch(n, batch_size, drop_last):
    ours = _DatasetKind.create_fetcher(_DatasetKind.Iterable, range(n), True, list, drop_last)
    theirs = TorchDatasetKind.create_fetcher(TorchDatasetKind.Iterable, range(n), True, list, drop_last)
    assert drain(ours, batch_size) == drain(theirs, batch_size)
    assert ours.ended == theirs.ended


def test_iterable_fetcher_drop_last_drops_the_short_batch_then_stays_stopped():
    fetcher = _IterableDatasetFetcher(iter(range(10)), True, default_collate, drop_last=True)
    assert fetcher.fetch([None] * 4).tolist() == [0, 1, 2, 3]
    assert fetcher.fetch([None] * 4).tolist() == [4, 5, 6, 7]
    assert not fetcher.ended
    with pytest.raises(StopIteration):
        fetcher.fetch([None] * 4)  # only 8 and 9 are left: a short batch, dropped
    assert fetcher.ended
    with pytest.raises(StopIteration):
        fetcher.fetch([None] * 4)


def test_iterable_fetcher_keeps_the_short_batch_without_drop_last():
    fetcher = _IterableDatasetFetcher(range(5), True, default_collate, drop_last=False)
    assert [b.tolist() for b in drain(fetcher, 2)] == [[0, 1], [2, 3], [4]]
    assert fetcher.ended


def test_iterable_fetcher_without_auto_collation_yields_items_then_stops():
    fetcher = _IterableDatasetFetcher(["a", "b"], False, default_convert, False)
    assert [fetcher.fetch(None), fetcher.fetch(None)] == ["a", "b"]
    with pytest.raises(StopIteration):
        fetcher.fetch(None)
