"""Tests for minidl/distributed.py: the same shards as torch's DistributedSampler, padding included."""

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl._random
from minidl.distributed import DistributedSampler

try:
    import torch
    import torch.distributed as dist
    import torch.utils.data as tud
except ImportError:  # the NumPy-only tests below still run
    torch = dist = tud = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is the oracle")
few = settings(max_examples=50, deadline=None)


def shards(n, num_replicas, **kwargs):
    return [list(DistributedSampler(range(n), num_replicas, rank, **kwargs)) for rank in range(num_replicas)]


@needs_torch
@pytest.mark.parametrize("n", [0, 1, 2, 5, 10, 11, 17])
@pytest.mark.parametrize("num_replicas", [1, 2, 3, 4, 8])
def test_matches_torch(n, num_replicas):
    grid = itertools.product(range(num_replicas), [True, False], [0, 7, -3], [False, True], [0, 1, 5])
    for rank, shuffle, seed, drop_last, epoch in grid:
        kwargs = dict(num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        ours, theirs = DistributedSampler(range(n), **kwargs), tud.DistributedSampler(range(n), **kwargs)
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert (ours.num_samples, ours.total_size) == (theirs.num_samples, theirs.total_size)
        assert len(ours) == len(theirs)
        assert list(ours) == list(theirs)


@few
@given(
    n=st.integers(0, 80),
    num_replicas=st.integers(1, 9),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 100),
    shuffle=st.booleans(),
)
def test_padded_shards_cover_the_dataset(n, num_replicas, seed, epoch, shuffle):
    parts = []
    for rank in range(num_replicas):
        sampler = DistributedSampler(range(n), num_replicas, rank, shuffle=shuffle, seed=seed)
        sampler.set_epoch(epoch)
        parts.append(list(sampler))
    assert all(len(p) == len(parts[0]) == -(-n // num_replicas) for p in parts)
    # Interleaved back, the shards are one permutation of the dataset padded with its own head.
    order = [p[i] for i in range(len(parts[0])) for p in parts]
    padding = len(order) - n
    assert sorted(order[:n]) == list(range(n))
    assert order[n:] == (order[:n] * num_replicas)[:padding]
    if padding == 0:
        assert Counter(order) == Counter(range(n))  # so the shards are disjoint


@few
@given(n=st.integers(0, 80), num_replicas=st.integers(1, 9), seed=st.integers(0, 999), shuffle=st.booleans())
def test_drop_last_shards_are_disjoint_and_equal(n, num_replicas, seed, shuffle):
    parts = shards(n, num_replicas, shuffle=shuffle, seed=seed, drop_last=True)
    flat = [i for p in parts for i in p]
    assert all(len(p) == n // num_replicas for p in parts)
    assert len(set(flat)) == len(flat) == n // num_replicas * num_replicas
    assert set(flat) <= set(range(n))


def test_set_epoch_reshuffles():
    sampler = DistributedSampler(range(50), num_replicas=2, rank=0, seed=1)
    first = list(sampler)
    assert list(sampler) == first
    sampler.set_epoch(1)
    assert list(sampler) != first and sampler.epoch == 1
    sampler.set_epoch(0)
    assert list(sampler) == first


def test_unshuffled_strides_and_pads():
    assert shards(10, 3, shuffle=False) == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert shards(10, 3, shuffle=False, drop_last=True) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    # A dataset smaller than the padding repeats several times over.
    assert shards(2, 5, shuffle=False) == [[0], [1], [0], [1], [0]]


@pytest.mark.parametrize("num_replicas, rank", [(2, 2), (2, -1), (1, 5), (0, 0)])
def test_invalid_rank(num_replicas, rank):
    with pytest.raises(ValueError, match="rank"):
        DistributedSampler(range(4), num_replicas=num_replicas, rank=rank)
    if tud is not None:
        with pytest.raises(ValueError, match="rank"):
            tud.DistributedSampler(range(4), num_replicas=num_replicas, rank=rank)


@needs_torch
@pytest.mark.parametrize("kwargs", [{}, {"num_replicas": 2}, {"rank": 0}])
def test_without_process_group_raises_like_torch(kwargs):
    assert not dist.is_initialized()
    with pytest.raises(ValueError) as ours:
        DistributedSampler(range(4), **kwargs)
    with pytest.raises(ValueError, match="init_process_group") as theirs:
        tud.DistributedSampler(range(4), **kwargs)
    assert str(ours.value) == str(theirs.value)


def shrink_or_grow(items: list, change: int) -> None:
    if change > 0:
        items.extend(range(change))
    else:
        del items[change:]


@needs_torch
@pytest.mark.parametrize(("change", "drop_last"), [(5, False), (-3, True)], ids=["grew", "shrank"])
def test_a_dataset_resized_after_construction_raises_like_torch(change, drop_last):
    # The sampler sized its shards at construction; iterating a dataset of another size breaks that promise.
    outcomes = []
    for lib in (tud, minidl):
        items = list(range(10))
        sampler = lib.DistributedSampler(items, num_replicas=3, rank=2, shuffle=False, drop_last=drop_last)
        shrink_or_grow(items, change)
        with pytest.raises(AssertionError) as info:
            list(sampler)
        outcomes.append(str(info.value))
    assert outcomes[0] == outcomes[1]


@needs_torch
def test_generic_like_torch():
    assert tud.DistributedSampler[int] is not None  # torch's is Sampler[_T_co], so it subscripts
    assert DistributedSampler[int].__origin__ is DistributedSampler
    assert DistributedSampler[int](range(4), num_replicas=2, rank=1).__class__ is DistributedSampler


@needs_torch
def test_asks_the_process_group(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ours, theirs = DistributedSampler(range(7), seed=2), tud.DistributedSampler(range(7), seed=2)
        assert (ours.num_replicas, ours.rank) == (theirs.num_replicas, theirs.rank) == (1, 0)
        assert list(ours) == list(theirs)
    finally:
        dist.destroy_process_group()


def test_without_torch(monkeypatch):
    monkeypatch.setattr(minidl._random, "HAS_TORCH", False)
    with pytest.raises(RuntimeError, match="distributed package"):
        DistributedSampler(range(4))
    parts = shards(11, 3, seed=4)
    assert parts == shards(11, 3, seed=4)
    assert {i for p in parts for i in p} == set(range(11))
    assert isinstance(minidl._random.make_generator(4), np.random.Generator)
    sampler = DistributedSampler(range(11), num_replicas=3, rank=0, seed=-1)  # negative seeds work too
    assert len(list(sampler)) == 4
