"""Tests for minidl/dataset.py: the same items as torch.utils.data, and the same errors."""

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl._random
import minidl.dataset
from minidl.dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from minidl_bench.batches import assert_same_batch

try:
    import torch
    import torch.utils.data as tud
except ImportError:  # the NumPy-only tests below still run
    torch = tud = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is the oracle")
few = settings(max_examples=50, deadline=None)


class Squares(Dataset):
    """A map-style dataset with no __getitems__: item i is i * i."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return i * i

    def __len__(self):
        return self.n


class Batched(Squares):
    """The same, but fetching whole batches through __getitems__ (and counting the calls)."""

    calls = 0

    def __getitems__(self, indices):
        Batched.calls += 1
        return [i * i for i in indices]


class Count(IterableDataset):
    def __init__(self, start, stop):
        self.start, self.stop = start, stop

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __len__(self):
        return self.stop - self.start


# --- the base classes ----------------------------------------------------------------------------


def test_base_classes():
    with pytest.raises(NotImplementedError, match="__getitem__"):
        Dataset()[0]
    with pytest.raises(TypeError, match="__iter__"):
        IterableDataset()
    with pytest.raises(TypeError):
        len(Dataset())
    assert isinstance(Squares(2) + Squares(3), ConcatDataset)
    assert isinstance(Count(0, 2) + Count(5, 7), ChainDataset)
    assert list(Count(0, 2) + Count(5, 7)) == [0, 1, 5, 6]


@needs_torch
def test_generic_exactly_where_torch_is():
    # Dataset[T] in a type hint or a subclass, as torch's docs write it. ChainDataset is no generic
    # class in either library, yet subscripts: through collections.abc.Iterable, ahead of Generic.
    for name in ["Dataset", "IterableDataset", "StackDataset", "ConcatDataset", "Subset", "ChainDataset"]:
        assert getattr(minidl.dataset, name)[int] is not None, name
    with pytest.raises(TypeError):
        TensorDataset[int]
    with pytest.raises(TypeError):
        tud.TensorDataset[int]
    assert StackDataset[tuple].__args__ == tud.StackDataset[tuple].__args__ == (tuple,)


# --- TensorDataset -------------------------------------------------------------------------------


@needs_torch
def test_tensor_dataset_matches_torch():
    x, y = torch.randn(10, 3), torch.arange(10)
    ours, theirs = TensorDataset(x, y), tud.TensorDataset(x, y)
    assert len(ours) == len(theirs) == 10
    for i in [*range(10), -1, slice(2, 5), [1, 3]]:
        assert_same_batch(ours[i], theirs[i])


def test_tensor_dataset_with_numpy():
    x, y = np.arange(12).reshape(6, 2), np.arange(6) * 10
    ds = TensorDataset(x, y)
    assert len(ds) == 6 and isinstance(len(ds), int)
    a, b = ds[4]
    assert a.tolist() == [8, 9] and b == 40
    assert [row.tolist() for row in ds[1:3][0]] == [[2, 3], [4, 5]]
    assert len(TensorDataset(np.zeros((0, 2)))) == 0


def test_tensor_dataset_size_mismatch():
    with pytest.raises(AssertionError, match="Size mismatch"):
        TensorDataset(np.zeros(3), np.zeros(4))
    if torch is not None:
        with pytest.raises(AssertionError):
            tud.TensorDataset(torch.zeros(3), torch.zeros(4))


# --- ConcatDataset -------------------------------------------------------------------------------


@needs_torch
def test_concat_dataset_matches_torch():
    parts = [list(range(3)), [], TensorDataset(torch.arange(4) * 10), "abcde"]
    theirs_parts = [list(range(3)), [], tud.TensorDataset(torch.arange(4) * 10), "abcde"]
    ours, theirs = ConcatDataset(parts), tud.ConcatDataset(theirs_parts)
    assert len(ours) == len(theirs) == 12
    assert ours.cumulative_sizes == theirs.cumulative_sizes == [3, 3, 7, 12]
    for i in range(-12, 12):
        assert_same_batch(ours[i], theirs[i])
    for bad in [-13, 12]:
        for ds in (ours, theirs):
            with pytest.raises((ValueError, IndexError)):
                ds[bad]


def test_concat_dataset_errors():
    with pytest.raises(ValueError, match="index"):
        ConcatDataset([range(3)])[-4]
    with pytest.raises(IndexError):
        ConcatDataset([range(3)])[3]
    with pytest.raises(AssertionError, match="datasets should not be an empty"):
        ConcatDataset([])
    with pytest.raises(AssertionError, match="IterableDataset"):
        ConcatDataset([range(3), Count(0, 2)])
    with pytest.raises(AssertionError, match="IterableDataset"):
        Squares(3) + Count(0, 2)


# --- ChainDataset --------------------------------------------------------------------------------


@needs_torch
def test_chain_dataset_matches_torch():
    class TorchCount(tud.IterableDataset):
        __init__, __iter__, __len__ = Count.__init__, Count.__iter__, Count.__len__

    ours = ChainDataset([Count(0, 3), Count(10, 10), Count(20, 22)])
    theirs = tud.ChainDataset([TorchCount(0, 3), TorchCount(10, 10), TorchCount(20, 22)])
    assert list(ours) == list(theirs) == [0, 1, 2, 20, 21]
    assert len(ours) == len(theirs) == 5


def test_chain_dataset_rejects_map_style():
    chain = ChainDataset([Count(0, 2), Squares(3)])
    with pytest.raises(AssertionError, match="IterableDataset"):
        list(chain)
    with pytest.raises(AssertionError, match="IterableDataset"):
        len(chain)


# --- Subset --------------------------------------------------------------------------------------


@needs_torch
def test_subset_matches_torch():
    data = TensorDataset(torch.arange(10) * 2)
    indices = [9, 0, 4, 4]
    ours, theirs = Subset(data, indices), tud.Subset(data, indices)
    assert len(ours) == len(theirs)
    for i in range(-4, 4):
        assert_same_batch(ours[i], theirs[i])
    assert_same_batch(ours[[0, 2]], theirs[[0, 2]])
    assert_same_batch(ours.__getitems__([3, 1]), theirs.__getitems__([3, 1]))


def test_subset_uses_parent_getitems():
    Batched.calls = 0
    subset = Subset(Batched(10), [3, 5, 7])
    assert subset.__getitems__([2, 0]) == [49, 9] and Batched.calls == 1
    assert Subset(Squares(10), [3, 5]).__getitems__([1, 0]) == [25, 9]


def test_subset_subclass_must_override_getitems():
    class Doubled(Subset):
        def __getitem__(self, idx):
            return 2 * super().__getitem__(idx)

    with pytest.raises(NotImplementedError, match="__getitems__") as ours:
        Doubled(range(5), [1, 2])
    if tud is not None:  # word for word torch's message, the class name included
        TorchDoubled = type("Doubled", (tud.Subset,), {"__getitem__": Doubled.__getitem__})
        with pytest.raises(NotImplementedError) as theirs:
            TorchDoubled(range(5), [1, 2])
        assert str(ours.value) == str(theirs.value)

    class Fine(Doubled):
        def __getitems__(self, indices):
            return [self[i] for i in indices]

    assert Fine(range(5), [1, 2]).__getitems__([1, 0]) == [4, 2]


# --- StackDataset --------------------------------------------------------------------------------


@needs_torch
def test_stack_dataset_matches_torch():
    x = TensorDataset(torch.arange(5))
    as_tuple, as_dict = ((x, Squares(5), Batched(5)), {}), ((), {"x": x, "sq": Squares(5), "b": Batched(5)})
    for args, kwargs in [as_tuple, as_dict]:
        ours, theirs = StackDataset(*args, **kwargs), tud.StackDataset(*args, **kwargs)
        assert len(ours) == len(theirs) == 5
        for i in range(5):
            assert_same_batch(ours[i], theirs[i])
        for indices in ([], [4, 0, 2]):
            assert_same_batch(ours.__getitems__(indices), theirs.__getitems__(indices))


def test_stack_dataset_errors():
    with pytest.raises(ValueError, match="both"):
        StackDataset(range(2), y=range(2))
    with pytest.raises(ValueError, match="At least one dataset"):
        StackDataset()
    with pytest.raises(ValueError, match="Size mismatch"):
        StackDataset(range(2), range(3))
    with pytest.raises(ValueError, match="Size mismatch"):
        StackDataset(a=range(2), b=range(3))

    class Short(Batched):
        def __getitems__(self, indices):
            return super().__getitems__(indices)[:-1]

    with pytest.raises(ValueError, match="output size mismatch"):
        StackDataset(Short(3)).__getitems__([0, 1])


# --- random_split --------------------------------------------------------------------------------

SPLITS = [[10, 0, 20], [30], [0.3, 0.3, 0.4], [0.5, 0.5], [0.1, 0.2, 0.7], [1 / 3] * 3]


@needs_torch
@pytest.mark.parametrize("lengths", SPLITS)
@pytest.mark.parametrize("seed", [0, 1, 42])
def test_random_split_matches_torch(lengths, seed):
    ours = random_split(range(30), lengths, torch.Generator().manual_seed(seed))
    theirs = tud.random_split(range(30), lengths, torch.Generator().manual_seed(seed))
    assert [s.indices for s in ours] == [s.indices for s in theirs]
    torch.manual_seed(seed)
    ours = random_split(range(30), lengths)
    torch.manual_seed(seed)
    theirs = tud.random_split(range(30), lengths)
    assert [s.indices for s in ours] == [s.indices for s in theirs]


@needs_torch
@pytest.mark.parametrize("n", [0, 1, 2, 5, 7, 11, 101])
def test_random_split_fractions_round_robin_like_torch(n):
    for fractions in ([0.1, 0.2, 0.3, 0.4], [0.25] * 4, [0.5, 0.5], [1.0]):
        # Tiny n leaves some splits empty; both warn about it (checked in test_random_split_errors).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours = random_split(range(n), fractions, torch.Generator().manual_seed(n))
            theirs = tud.random_split(range(n), fractions, torch.Generator().manual_seed(n))
        assert [s.indices for s in ours] == [s.indices for s in theirs]


@few
@given(n=st.integers(0, 60), cuts=st.lists(st.integers(0, 60), max_size=4), seed=st.integers(0, 2**32))
def test_random_split_partitions(n, cuts, seed):
    bounds = sorted({0, n, *(c for c in cuts if c <= n)})
    lengths = [b - a for a, b in itertools.pairwise(bounds)] or [0]
    splits = random_split(range(n), lengths, minidl._random.make_generator(seed))
    assert [len(s) for s in splits] == lengths
    assert sorted(i for s in splits for i in s) == list(range(n))


def test_random_split_errors():
    with pytest.raises(ValueError, match="lengths"):
        random_split(range(10), [3, 3])
    with pytest.raises(ValueError, match="lengths"):
        random_split(range(10), [0.5, 0.6])
    with pytest.raises(ValueError, match="Fraction at index 0"):
        random_split(range(10), [-0.5, 1.5])
    with pytest.warns(UserWarning, match="index 1 is 0"):
        random_split(range(3), [0.9, 0.1])
    if tud is not None:
        with pytest.raises(ValueError):
            tud.random_split(range(10), [-0.5, 1.5])


def test_random_split_numpy_generator():
    first = random_split(range(20), [0.25, 0.75], np.random.default_rng(0))
    again = random_split(range(20), [0.25, 0.75], np.random.default_rng(0))
    assert [s.indices for s in first] == [s.indices for s in again]
    assert sorted(first[0].indices + first[1].indices) == list(range(20))


def test_random_split_without_torch(monkeypatch):
    monkeypatch.setattr(minidl._random, "HAS_TORCH", False)
    np.random.seed(3)
    first = random_split(range(9), [4, 5])
    np.random.seed(3)
    assert [s.indices for s in random_split(range(9), [4, 5])] == [s.indices for s in first]
    assert sorted(list(first[0]) + list(first[1])) == list(range(9))
