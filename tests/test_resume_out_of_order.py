"""Resumed with in_order=False, each batch comes exactly once across the save; a stateless IterableDataset is
refused there, with what to do instead."""

from __future__ import annotations

import json
import pickle

import pytest
from resumetools import GatedShards, GatedStatelessShards, HeldSample, _event

import minidl
from minidl_course import toy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]


@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
@pytest.mark.parametrize("take", [1, 4, 7])
def test_out_of_order_a_resume_gives_every_sample_once(worker_method, take):
    gate = _event(worker_method)
    dataset = HeldSample(12, held=0, gate=gate)

    def make():
        return minidl.DataLoader(dataset, num_workers=2, in_order=False, stateful=True, worker_method=worker_method)

    loader = make()
    it = iter(loader)
    had = [int(next(it)) for _ in range(take)]
    state = loader.state_dict()
    assert 0 not in had  # held back: everything had so far overtook it
    # Task k is sample k here: the first missing task is 0, and the ones had are past it.
    assert state["tasks_done"] == 0 and state["done_ahead"] == sorted(had) and state["num_yielded"] == take
    assert json.loads(json.dumps(state)) == state
    gate.set()
    it._shutdown_workers()
    del it, loader

    resumed = make()
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    rest = [int(b) for b in resumed]
    assert sorted(had + rest) == list(range(12)) and len(had + rest) == 12  # none twice, none lost
    assert sorted(int(b) for b in resumed) == list(range(12))  # the next epoch is whole


@pytest.mark.parametrize("take", [2, 5])
def test_out_of_order_a_resume_from_a_resumed_loader(take):
    # Saved twice: the second state, from a loader that skipped done_ahead, still counts every batch once.
    gate = _event("thread")
    dataset = HeldSample(16, held=1, gate=gate)

    def make():
        return minidl.DataLoader(dataset, batch_size=2, num_workers=2, in_order=False, stateful=True,
                                 worker_method="thread")

    loader = make()
    it = iter(loader)
    had = [x for _ in range(take) for x in next(it).tolist()]
    state = loader.state_dict()
    assert state["tasks_done"] == 0 and len(state["done_ahead"]) == take
    gate.set()
    it._shutdown_workers()
    second = make()
    second.load_state_dict(state)
    it2 = iter(second)
    had += next(it2).tolist()
    state2 = second.state_dict()
    del it2
    third = make()
    third.load_state_dict(state2)
    had += [x for b in third for x in b.tolist()]
    assert sorted(had) == list(range(16)) and len(had) == 16


def test_out_of_order_every_batch_carries_its_state():
    # Out of order a replay can't drop the batches that were had: snapshot_every_n_steps is taken as 1.
    loader = minidl.DataLoader(toy.RangeDataset(20), num_workers=2, in_order=False, stateful=True,
                               snapshot_every_n_steps=5)
    it = iter(loader)
    had = [int(next(it)) for _ in range(3)]
    state = loader.state_dict()
    assert state["replay"] == 0 and state["num_yielded"] == 3
    del it
    resumed = minidl.DataLoader(toy.RangeDataset(20), num_workers=2, in_order=False, stateful=True,
                                snapshot_every_n_steps=5)
    resumed.load_state_dict(state)
    assert sorted(had + [int(b) for b in resumed]) == list(range(20))


@pytest.mark.parametrize("take", [2, 5])
def test_out_of_order_an_iterable_dataset_resumes_each_worker_where_it_stood(take):
    gate = _event("multiprocessing")

    def make():
        return minidl.DataLoader(GatedShards(10, gate), num_workers=2, in_order=False, stateful=True)

    loader = make()
    it = iter(loader)
    had = [int(next(it)) for _ in range(take)]
    assert had == list(range(take))  # worker 0's shard, 0..4: worker 1 is held
    state = loader.state_dict()
    worker0, worker1 = state["workers"]
    assert worker0["dataset"] == {"pos": take}  # torchdata's suite reads its own keys for this
    assert worker1 is None  # it has handed out nothing: it starts afresh
    gate.set()
    it._shutdown_workers()
    del it, loader
    resumed = make()
    resumed.load_state_dict(state)
    rest = [int(b) for b in resumed]
    assert sorted(had + rest) == list(range(10)) and len(had + rest) == 10
    assert [x for x in rest if x < 5] == list(range(take, 5))  # each worker's own stream stays in its order
    assert [x for x in rest if x >= 5] == list(range(5, 10))


def test_out_of_order_a_worker_whose_stream_ended_is_saved_as_ended():
    gate = _event("multiprocessing")
    loader = minidl.DataLoader(GatedShards(10, gate), num_workers=2, in_order=False, stateful=True)
    it = iter(loader)
    had = [int(next(it)) for _ in range(5)]  # worker 0's whole shard
    gate.set()
    had.append(int(next(it)))
    states = [loader.state_dict()]
    while not (states[-1]["workers"][0] or {}).get("ended") and len(had) < 10:
        had.append(int(next(it)))  # worker 0's end is read from the queue by some next() after its last batch
        states.append(loader.state_dict())
    state = states[-1]
    assert len(had) < 10 or state["workers"][0]["ended"]
    if len(had) < 10:
        assert not state["workers"][1]["ended"]
        resumed = minidl.DataLoader(GatedShards(10, gate), num_workers=2, in_order=False, stateful=True)
        resumed.load_state_dict(state)
        had += [int(b) for b in resumed]
    assert sorted(had) == list(range(10))
    del it


@pytest.mark.parametrize("every", [1, 3])
def test_out_of_order_a_stateless_iterable_dataset_is_refused_with_what_to_do(every):
    # Out of order, which batches were had depends on timing, and a replica without state_dict() can't be put
    # back where it stood: state_dict() says so, and names the two ways out.
    gate = _event("multiprocessing")
    loader = minidl.DataLoader(GatedStatelessShards(14, gate), num_workers=2, in_order=False, stateful=True,
                               snapshot_every_n_steps=every)
    it = iter(loader)
    had = [int(next(it)) for _ in range(3)]
    assert had == [1, 3, 5]  # worker 1's: worker 0 waits at the gate
    with pytest.raises(ValueError, match="in_order=False.*without state_dict.*or use in_order=True"):
        loader.state_dict()
    gate.set()
    assert sorted(had + [int(b) for b in it]) == list(range(14))  # the loader goes on
