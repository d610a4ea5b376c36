"""Resume in the harder cases: a second resume, a caught error, out of order, a failed resume; each resumed
run against the uninterrupted one, and torchdata's ``StatefulDataLoader`` as the oracle where it is right."""

from __future__ import annotations

import multiprocessing
import os
import threading
import warnings

import pytest

import minidl
from minidl_bench.batches import assert_same_batches
from minidl_course import toy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(180)]


def _shuffled_persistent(n: int = 11):
    return minidl.DataLoader(toy.RangeDataset(n), batch_size=2, shuffle=True, num_workers=2, persistent_workers=True,
                             stateful=True, generator=torch.Generator().manual_seed(5))


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


class GatedShards(minidl.IterableDataset):
    """Each worker streams its own shard, no state_dict(); worker 0's first item waits for ``gate``."""

    def __init__(self, n: int, gate) -> None:
        self.n, self.gate = n, gate

    def __iter__(self):
        info = minidl.get_worker_info()
        workers, worker_id = (1, 0) if info is None else (info.num_workers, info.id)
        for item in range(worker_id, self.n, workers):
            if item == 0 and not self.gate.wait(timeout=60):
                raise TimeoutError("the test never opened the gate")
            yield item


def _event(worker_method: str):
    return threading.Event() if worker_method == "thread" else multiprocessing.get_context().Event()


@pytest.mark.parametrize("every", [1, 3])
def test_out_of_order_a_stateless_iterable_dataset_replays_each_worker_s_own_batches(every):
    gate = _event("multiprocessing")
    dataset = GatedShards(14, gate)

    def make():
        return minidl.DataLoader(dataset, num_workers=2, in_order=False, stateful=True,
                                 snapshot_every_n_steps=every)

    loader = make()
    it = iter(loader)
    had = [int(next(it)) for _ in range(3)]
    assert had == [1, 3, 5]  # worker 1's: worker 0 waits at the gate
    state = loader.state_dict()
    gate.set()
    rest = [int(b) for b in it]
    it = None
    assert sorted(had + rest) == list(range(14))
    resumed = make()
    with pytest.warns(UserWarning, match="GatedShards has no state_dict"):
        resumed.load_state_dict(state)
    again = [int(b) for b in resumed]
    assert sorted(had + again) == list(range(14))  # every sample once: worker 1's first three are the ones dropped


def _catching(it, n: int | None = None) -> list:
    """Up to ``n`` next()s (all, with None), each batch or the type of the error it raised, as a training loop that
    catches errors and goes on."""
    out = []
    while n is None or len(out) < n:
        try:
            out.append(next(it).tolist())
        except StopIteration:
            break
        except KeyError as e:
            out.append(type(e).__name__)
    return out


@pytest.mark.parametrize(("num_workers", "every"), [(0, 1), (2, 1), (2, 3)])
@pytest.mark.parametrize("cut", [3, 4, 5])
def test_a_caught_error_before_the_save_is_not_fetched_again(num_workers, every, cut):
    def make():
        return minidl.DataLoader(toy.FailingDataset(16, bad_index=4), batch_size=2, num_workers=num_workers,
                                 stateful=True, snapshot_every_n_steps=every)

    expected = _catching(iter(make()))
    assert expected[2] == "KeyError"
    loader = make()
    it = iter(loader)
    had = _catching(it, cut)
    state = loader.state_dict()
    it = loader = None
    resumed = make()
    resumed.load_state_dict(state)
    assert had + _catching(iter(resumed)) == expected


class DiesWhenAsked(toy.RangeDataset):
    """The worker fetching ``bad_index`` exits while ``gate`` is set: a transient failure."""

    def __init__(self, n: int, bad_index: int, gate) -> None:
        super().__init__(n)
        self.bad_index, self.gate = bad_index, gate

    def __getitem__(self, index: int) -> int:
        if index == self.bad_index and self.gate.is_set() and minidl.get_worker_info() is not None:
            os._exit(3)
        return super().__getitem__(index)


def test_a_resume_whose_iter_failed_can_be_retried():
    gate = _event("multiprocessing")

    def make():
        return minidl.DataLoader(DiesWhenAsked(20, bad_index=4, gate=gate), batch_size=1, num_workers=2,
                                 stateful=True, snapshot_every_n_steps=4)

    expected = [int(b) for b in make()]
    loader = make()
    it = iter(loader)
    had = [int(next(it)) for _ in range(7)]  # a snapshot after 4 batches: 3 batches to replay, 4 among them
    state = loader.state_dict()
    it = loader = None
    assert state["replay"] == 3
    resumed = make()
    resumed.load_state_dict(state)
    gate.set()
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        iter(resumed)
    assert resumed.state_dict() == state  # still the point to resume from
    gate.clear()
    assert had + [int(b) for b in resumed] == expected


class HalfStateful(toy.RangeDataset):
    """Has ``state_dict()`` but no ``load_state_dict()``: not stateful, as torchdata's ``Stateful`` protocol says."""

    def state_dict(self) -> dict:
        return {"n": self.n}


class HalfStatefulStream(toy.ShardedRange):
    def state_dict(self) -> dict:
        return {"end": self.end}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("iterable", [False, True])
def test_a_dataset_with_state_dict_but_no_load_state_dict_is_stateless(num_workers, iterable):
    def make():
        dataset = HalfStatefulStream(0, 15) if iterable else HalfStateful(15)
        return minidl.DataLoader(dataset, batch_size=2, num_workers=num_workers, stateful=True)

    expected = [b.tolist() for b in make()]
    loader = make()
    it = iter(loader)
    had = [next(it).tolist() for _ in range(3)]
    state = loader.state_dict()
    it = loader = None
    resumed = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the iterable one is replayed, and says so
        resumed.load_state_dict(state)
    assert had + [b.tolist() for b in resumed] == expected


@pytest.mark.parametrize(("num_workers", "every", "stream"), [(0, 1, True), (2, 3, False), (2, 1, True)])
def test_a_traced_resume_records_only_the_batches_it_delivers(num_workers, every, stream):
    def make(trace=False):
        return minidl.DataLoader(StatelessStream(12) if stream else toy.RangeDataset(12), batch_size=2,
                                 num_workers=num_workers, stateful=True, trace=trace, snapshot_every_n_steps=every)

    loader = make()
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    it = loader = None
    resumed = make(trace=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed.load_state_dict(state)
    delivered = list(resumed)
    yields = [e for e in resumed.trace.events if e["event"] == "yield"]
    assert len(yields) == len(delivered) == 2


class StatelessStream(minidl.IterableDataset):
    """``0 .. n-1``, sharded round-robin by worker, with no state_dict()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = minidl.get_worker_info()
        workers, worker_id = (1, 0) if info is None else (info.num_workers, info.id)
        return iter(range(worker_id, self.n, workers))


def test_the_replay_warning_names_the_user_s_datapipe():
    from torch.utils.data.datapipes.iter import IterableWrapper

    def make():
        return minidl.DataLoader(IterableWrapper(range(10)), batch_size=2, stateful=True)

    loader = make()
    it = iter(loader)
    had = [next(it).tolist() for _ in range(2)]
    state = loader.state_dict()
    it = loader = None
    resumed = make()
    with pytest.warns(UserWarning, match="^IterableWrapperIterDataPipe has no state_dict") as record:
        resumed.load_state_dict(state)
    assert "SerializationWrapper" not in str(record[0].message)
    assert had + [b.tolist() for b in resumed] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


class NoLenSampler(minidl.Sampler):
    """``0 .. n-1`` in order, without ``__len__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def test_a_persistent_loader_s_state_between_epochs_loads_into_a_non_persistent_one():
    def make(persistent):
        return minidl.DataLoader(toy.RangeDataset(10), batch_size=2, sampler=NoLenSampler(10), num_workers=2,
                                 persistent_workers=persistent, stateful=True, snapshot_every_n_steps=0)

    loader = make(True)
    list(loader)
    state = loader.state_dict()  # with n=0 and no __len__, no worker's last state came: saved at the epoch's start
    assert state["exhausted"]
    loader = None
    resumed = make(False)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert [b.tolist() for b in resumed] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
