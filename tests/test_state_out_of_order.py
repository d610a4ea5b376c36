"""Resuming with ``in_order=False``, and a stateless IterableDataset resumed by replay.

Out of order, the batches had before a save need not be the first ones of the epoch: a slow sample is
overtaken. The saved state names the first task still missing (``tasks_done``) and the ones after it that
were had already (``done_ahead``), so the resumed loader gives every other batch exactly once. A gate (an
Event the main process sets) holds the slow sample, so which batches overtake it is the same on every machine.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import pickle
import threading
import warnings

import pytest

import minidl
from minidl_course import toy

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(180)]


def _event(worker_method: str):
    return threading.Event() if worker_method == "thread" else multiprocessing.get_context().Event()


class HeldSample(minidl.Dataset):
    """``held`` waits for ``gate`` to be set: every other sample overtakes it."""

    def __init__(self, n: int, held: int, gate) -> None:
        self.n, self.held, self.gate = n, held, gate

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.held and not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        return index


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


class GatedShards(minidl.IterableDataset):
    """Worker w streams its shard of 0..n-1; worker 1's first item waits for ``gate``. Saves its position."""

    def __init__(self, n: int, gate) -> None:
        self.n, self.gate, self.pos, self._resume_at = n, gate, None, None

    def __iter__(self):
        info = minidl.get_worker_info()
        per = math.ceil(self.n / info.num_workers)
        start, stop = info.id * per, min((info.id + 1) * per, self.n)
        first, self._resume_at = (start if self._resume_at is None else self._resume_at), None
        for i in range(first, stop):
            if i == start and info.id == 1 and not self.gate.wait(timeout=60):
                raise TimeoutError("the test never opened the gate")
            self.pos = i + 1
            yield i

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self._resume_at = state["pos"]


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


class StatelessShards(minidl.IterableDataset):
    """Worker w streams its shard of 0..n-1, with no state_dict(): resuming it means replaying."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = minidl.get_worker_info()
        workers, worker_id = (1, 0) if info is None else (info.num_workers, info.id)
        per = math.ceil(self.n / workers)
        return iter(range(worker_id * per, min((worker_id + 1) * per, self.n)))


@pytest.mark.parametrize(("num_workers", "every"), [(0, 1), (2, 1), (2, 3), (3, 1)])
def test_a_stateless_iterable_dataset_is_resumed_by_replaying_its_epoch(num_workers, every):
    # torchdata's fast-forward: the epoch starts again with the same seeds, and the batches had are dropped.
    def make():
        return minidl.DataLoader(StatelessShards(23), batch_size=2, num_workers=num_workers, stateful=True,
                                 snapshot_every_n_steps=every)

    expected = [b.tolist() for b in make()]
    loader = make()
    it = iter(loader)
    had = [next(it).tolist() for _ in range(4)]
    state = loader.state_dict()
    del it
    resumed = make()
    with pytest.warns(UserWarning, match="StatelessShards has no state_dict\\(\\)/load_state_dict\\(\\).*drops the 4 "
                                         "batches already had"):
        resumed.load_state_dict(state)
    assert had + [b.tolist() for b in resumed] == expected
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*has no state_dict")
        fresh = make()
        fresh.load_state_dict(make().state_dict())  # between epochs there is nothing to replay: no warning
    assert [b.tolist() for b in fresh] == expected


@pytest.mark.parametrize("done_ahead", [[0], [3, 2], [2, 2], ["3"], [40]])
def test_a_bad_done_ahead_is_refused(done_ahead):
    dataset = toy.RangeDataset(20)
    loader = minidl.DataLoader(dataset, num_workers=1, stateful=True, in_order=False)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    state["done_ahead"] = done_ahead
    with pytest.raises(ValueError, match="state_dict key 'done_ahead'"):
        minidl.DataLoader(dataset, num_workers=1, stateful=True, in_order=False).load_state_dict(state)
