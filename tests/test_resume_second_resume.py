"""A resumed loader saves again: its state, before or after its first batch, resumes a third loader exactly."""

from __future__ import annotations

import pickle

import pytest
from resumetools import _shuffled_persistent, batches_of, interrupted_equals_uninterrupted

import minidl
from minidl_bench.batches import assert_same_batches
from minidl_course import toy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_right_after_load_state_dict_keeps_the_resume_point(num_workers):
    def make():
        return minidl.DataLoader(toy.RangeDataset(12), batch_size=2, shuffle=True, num_workers=num_workers,
                                 stateful=True, generator=torch.Generator().manual_seed(1))

    full, _ = interrupted_equals_uninterrupted(make, cut=3)
    loader = make()
    it = iter(loader)
    [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    preempted = make()
    preempted.load_state_dict(state)
    again = preempted.state_dict()  # preempted a second time before its first batch
    final = make()
    final.load_state_dict(pickle.loads(pickle.dumps(again)))
    assert_same_batches(batches_of(final), full[3:])


@pytest.mark.parametrize("first_cut", [None, 1])  # None: the first checkpoint is the end of epoch 0
def test_persistent_workers_resumed_twice_keep_epoch_one_s_permutation(first_cut):
    loader = _shuffled_persistent()
    list(loader)
    expected = list(loader)  # epoch 1, uninterrupted

    loader = _shuffled_persistent()
    list(loader)
    had = []
    if first_cut is not None:
        it = iter(loader)
        had += [next(it) for _ in range(first_cut)]
    state = loader.state_dict()
    loader = None
    resumed = _shuffled_persistent()
    resumed.load_state_dict(state)
    it = iter(resumed)
    had += [next(it) for _ in range(2)]  # preempted again, mid-epoch 1
    state = resumed.state_dict()
    it = resumed = None
    again = _shuffled_persistent()
    again.load_state_dict(state)
    assert_same_batches(had + list(again), expected)
