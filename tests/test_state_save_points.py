"""Saving at awkward points, and what a saved state keeps: after a `break`, between epochs, from another thread,
between snapshots, before iterating; the dataset's, the iterator's and the samplers' own states.

The oracle is the uninterrupted run (or torch, where torch has the behaviour).
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import minidl
from minidl_course import toy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Under another start method (make unit-spawn, unit-forkserver) every worker process starts a fresh interpreter
# that imports torch. There the file runs the cases that start worker processes (num_workers=0 and thread workers
# run the same under every start method), and the sweeps take fewer points: two of the six snapshot settings
# (one ships states every 3 batches without persistent workers, one never ships them, with), two of the eight save
# points (one just after a snapshot, one between snapshots), two of the three cuts around a shard's end, and the
# state taken before iterating with persistent workers only.
OTHER_START_METHOD = bool(os.environ.get("MINIDL_START_METHOD"))
SNAPSHOT_SETTINGS = ([(False, 3), (True, 0)] if OTHER_START_METHOD
                     else [(persistent, every) for persistent in (False, True) for every in (3, 0, None)])
CUTS = (1, 4) if OTHER_START_METHOD else tuple(range(8))
SHARD_END_CUTS = (5, 7) if OTHER_START_METHOD else (5, 6, 7)
WORKER_METHODS = ("multiprocessing",) if OTHER_START_METHOD else ("multiprocessing", "thread")


def worker_counts(*counts: int) -> list[int]:
    """The ``num_workers`` values to test: under another start method, only those that start worker processes."""
    return [n for n in counts if n or not OTHER_START_METHOD]


def seed_everything(s: int) -> None:
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def flat(batches) -> list:
    return [x for b in batches for x in (b.tolist() if hasattr(b, "tolist") else b)]


def resume_from(make, state) -> minidl.DataLoader:
    loader = make()
    loader.load_state_dict(pickle.loads(pickle.dumps(state)))
    return loader


# --- after a break, between epochs, and a dataset's live state_dict() ---------------------------


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_state_dict_after_breaking_out_of_a_for_loop_resumes_after_the_break(num_workers):
    # The loader held its iterator only weakly: leaving the loop dropped it, and state_dict() restarted the epoch.
    def make():
        return minidl.DataLoader(toy.RangeDataset(10), num_workers=num_workers, stateful=True, collate_fn=list)

    loader = make()
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert flat(resume_from(make, loader.state_dict())) == list(range(3, 10))


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_state_between_epochs_with_shuffle_and_no_generator_gives_the_next_two_epochs(num_workers):
    def make():
        return minidl.DataLoader(toy.RangeDataset(8), shuffle=True, num_workers=num_workers, stateful=True,
                                 collate_fn=list)

    # Between epochs, the next epoch's draws come from the global generator as it stands then, as in torch: a
    # training loop checkpoints its own RNG state beside the loader's, and restores both.
    torch.manual_seed(0)
    loader = make()
    list(loader)
    state, rng = loader.state_dict(), torch.get_rng_state()
    later = [flat(loader), flat(loader)]
    torch.manual_seed(99)  # another process...
    resumed = resume_from(make, state)
    torch.set_rng_state(rng)  # ...that restores the checkpoint
    assert [flat(resumed), flat(resumed)] == later
    assert later[0] != later[1]


class EpochCounter(minidl.IterableDataset):
    """Yields (epoch, i) for i < 4; counts its epochs in its own state."""

    def __init__(self) -> None:
        self.epoch, self.position = 0, 0

    def __iter__(self):
        while self.position < 4:
            self.position += 1
            yield self.epoch, self.position - 1
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


def test_state_between_epochs_keeps_an_iterable_dataset_s_own_state():
    loader = minidl.DataLoader(EpochCounter(), batch_size=None, stateful=True)
    list(loader)
    state = loader.state_dict()
    resumed = minidl.DataLoader(EpochCounter(), batch_size=None, stateful=True)
    resumed.load_state_dict(state)
    assert [tuple(x) for x in resumed] == [tuple(x) for x in loader] == [(1, i) for i in range(4)]


def test_state_between_epochs_keeps_persistent_workers_random_streams():
    def make():
        return minidl.DataLoader(toy.ResumableStream(8), batch_size=2, num_workers=2, persistent_workers=True,
                                 stateful=True, generator=torch.Generator().manual_seed(0))

    loader = make()
    list(loader)
    state = loader.state_dict()
    later = [[repr(b) for b in loader] for _ in range(2)]
    resumed = resume_from(make, state)
    assert [[repr(b) for b in resumed] for _ in range(2)] == later


class LiveState(minidl.IterableDataset):
    """Counts 0..7 and returns its live state dict (mutated as it goes), as a careless dataset may."""

    def __init__(self) -> None:
        self.state = {"next": 0}

    def __iter__(self):
        while self.state["next"] < 8:
            self.state["next"] += 1
            yield self.state["next"] - 1

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


@pytest.mark.parametrize("num_workers", worker_counts(0, 1))
def test_a_dataset_returning_its_live_state_dict_is_saved_where_the_consumer_stands(num_workers):
    def make():
        return minidl.DataLoader(LiveState(), batch_size=None, num_workers=num_workers, stateful=True)

    loader = make()
    it = iter(loader)
    got = [next(it), next(it)]
    state = loader.state_dict()
    del it
    assert got + list(resume_from(make, state)) == list(range(8))


# --- a sampler's own generator, slow or ended workers, another thread, a failing state_dict() -----


class OwnShuffleBatchSampler:
    """A batch sampler that owns its generator: pairs of a fresh permutation of 0..7 each epoch."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(5)

    def __iter__(self):
        order = torch.randperm(8, generator=self.generator).tolist()
        return iter([order[i:i + 2] for i in range(0, 8, 2)])

    def __len__(self) -> int:
        return 4


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_a_custom_batch_sampler_s_own_generator_is_saved(num_workers):
    def make():
        return minidl.DataLoader(toy.RangeDataset(8), batch_sampler=OwnShuffleBatchSampler(), num_workers=num_workers,
                                 stateful=True, collate_fn=list)

    full = make()
    epochs = [flat(full), flat(full)]
    loader = make()
    list(loader)  # epoch 0
    it = iter(loader)  # epoch 1: stop after two batches
    got = [next(it), next(it)]
    state = loader.state_dict()
    del it
    assert flat(got) + flat(resume_from(make, state)) == epochs[1]


@pytest.mark.parametrize("worker_method", WORKER_METHODS)
def test_state_dict_never_waits_on_a_slow_worker_nor_takes_a_late_answer(worker_method):
    # Before: state_dict() asked the workers and waited up to `timeout`; a late answer was taken by the next call.
    dataset = toy.SlowOnceDataset(12, slow_index=4, delay=4.0)
    # fork: a spawned worker's start (importing torch) may take longer than the timeout on a busy machine
    context = "fork" if worker_method == "multiprocessing" else None

    def make(timeout=0.0):
        return minidl.DataLoader(dataset, batch_size=1, num_workers=2, timeout=timeout, stateful=True,
                                 worker_method=worker_method, collate_fn=list, multiprocessing_context=context)

    loader = make(timeout=3.0)
    it = iter(loader)
    got = [next(it) for _ in range(3)]
    first = loader.state_dict()  # worker 0 is busy in item 4's slow __getitem__ here
    got.append(next(it))  # item 3
    second = loader.state_dict()
    del it
    assert flat(got[:3]) + flat(resume_from(make, first)) == list(range(12))
    assert flat(got) + flat(resume_from(make, second)) == list(range(12))


class UnevenStream(minidl.IterableDataset):
    """Worker 0 streams 0..5, worker 1 streams 6..7, each item with a draw from NumPy's global stream."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        info = minidl.get_worker_info()
        shard = range(0, 6) if info.id == 0 else range(6, 8)
        while self.position < len(shard):
            self.position += 1
            yield shard[self.position - 1], float(np.random.rand())
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


@pytest.mark.parametrize("cut", SHARD_END_CUTS)
def test_persistent_workers_whose_shard_ended_keep_their_random_streams(cut):
    # Worker 1's shard ends at task 5; a state saved after the loader stopped sending it work must still hold
    # its streams, or the next epoch, on the same persistent worker, replays the draws of the first.
    def make():
        return minidl.DataLoader(UnevenStream(), batch_size=None, num_workers=2, persistent_workers=True,
                                 stateful=True, generator=torch.Generator().manual_seed(0))

    uninterrupted = make()
    full = [repr(b) for _ in range(2) for b in uninterrupted]
    loader = make()
    it = iter(loader)
    got = [repr(next(it)) for _ in range(cut)]
    state = loader.state_dict()
    del it
    resumed = resume_from(make, state)
    assert got + [repr(b) for _ in range(2) for b in resumed][:16 - cut] == full


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_state_dict_from_another_thread_while_the_loop_runs(num_workers):
    loader = minidl.DataLoader(toy.SlowDataset(40, delay=0.005), batch_size=2, num_workers=num_workers,
                               stateful=True, collate_fn=list)
    got, states, errors = [], [], []
    it = iter(loader)
    stop = threading.Event()

    def checkpointer():
        while not stop.is_set():
            try:
                states.append(loader.state_dict())
            except Exception as e:  # noqa: BLE001 -- the test reports it
                errors.append(e)
                return

    def consume():
        got.extend(it)

    threads = [threading.Thread(target=checkpointer, daemon=True), threading.Thread(target=consume, daemon=True)]
    for t in threads:
        t.start()
    threads[1].join(timeout=60)
    stop.set()
    threads[0].join(timeout=60)
    assert not any(t.is_alive() for t in threads), "state_dict() from another thread hung the loop"
    assert not errors and states
    assert flat(got) == list(range(40))


class StateDictRaises(toy.RangeDataset):
    def state_dict(self) -> dict:
        raise ZeroDivisionError("the dataset's state_dict() failed")

    def load_state_dict(self, state: dict) -> None:
        pass


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_a_map_dataset_whose_state_dict_raises_forwards_the_error(num_workers):
    loader = minidl.DataLoader(StateDictRaises(8), num_workers=num_workers, stateful=True)
    with pytest.raises(ZeroDivisionError, match="the dataset's state_dict\\(\\) failed"):
        it = iter(loader)
        next(it)
        loader.state_dict()


class StateDictFailsOnce(toy.RangeDataset):
    """Worker 0's third state_dict() raises: its third batch (task 4) comes without its state."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.calls = 0

    def state_dict(self) -> dict:
        self.calls += 1
        if minidl.get_worker_info().id == 0 and self.calls == 3:
            raise ZeroDivisionError("worker 0's third state_dict()")
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]


def test_a_save_just_after_a_batch_without_its_state_resumes_from_the_batch_before():
    # With snapshot_every_n_steps=1 the loader takes a snapshot only around a batch that came without its state;
    # the save must still fall back to the last batch before it, not to the epoch's start.
    loader = minidl.DataLoader(StateDictFailsOnce(20), num_workers=2, stateful=True)
    it, got = iter(loader), []
    while len(got) < 4:
        got.append(next(it).item())
    with pytest.raises(ZeroDivisionError, match="third state_dict"):
        next(it)
    state = loader.state_dict()
    del it
    assert (got, state["tasks_done"], state["num_yielded"], state["replay"]) == ([0, 1, 2, 3], 4, 4, 1)
    resumed = minidl.DataLoader(StateDictFailsOnce(20), num_workers=2, stateful=True)
    resumed.load_state_dict(state)
    assert [b.item() for b in resumed] == list(range(5, 20))  # the error is replayed and dropped, as torchdata does


REDUCED = textwrap.dedent("""
    import minidl

    class Reduced(minidl.Dataset):  # in __main__, but pickles by value: the worker never imports it
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i

        def __reduce__(self):
            return (list, ([0, 1, 2, 3],))

    loader = {make}(Reduced(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    print([b.tolist() for b in loader])
""")


def test_a_main_class_that_pickles_by_value_reaches_spawned_workers_as_in_torch():
    env = {**os.environ, "PYTHONPATH": ROOT}
    for make in ("minidl.DataLoader", "__import__('torch').utils.data.DataLoader"):
        done = subprocess.run([sys.executable, "-c", REDUCED.format(make=make)], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=240)
        assert done.returncode == 0, (make, done.stderr)
        assert done.stdout.split("\n")[0] == "[[0, 1], [2, 3]]"


def test_prefetch_factor_without_workers_says_what_torch_says():
    with pytest.raises(ValueError) as torch_error:
        torch.utils.data.DataLoader(range(4), prefetch_factor=2)
    with pytest.raises(ValueError) as minidl_error:
        minidl.DataLoader(range(4), prefetch_factor=2)
    assert str(minidl_error.value) == str(torch_error.value)


# --- torchdata's contracts adopted ----------------------------------------------------------------


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_the_state_is_json_safe(num_workers):
    def make():
        return minidl.DataLoader(toy.GlobalRandomDataset(12), batch_size=2, shuffle=True, num_workers=num_workers,
                                 stateful=True)

    seed_everything(0)
    full = [repr(b) for b in make()]
    seed_everything(0)
    loader = make()
    it = iter(loader)
    got = [repr(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert got + [repr(b) for b in resumed] == full


# --- snapshot_every_n_steps (torchdata's name and meaning) ---------------------------------------------


@pytest.mark.parametrize(("persistent", "every"), SNAPSHOT_SETTINGS)
def test_snapshot_every_n_steps_resumes_at_every_cut(persistent, every):
    # Workers ship their state only before every n-th batch (never, with 0 or None); a state saved between
    # snapshots resumes from the last one and fetches the batches since again: the same batches either way.
    def make():
        return minidl.DataLoader(toy.GlobalRandomDataset(14), batch_size=2, shuffle=True, num_workers=2,
                                 persistent_workers=persistent, stateful=True, snapshot_every_n_steps=every,
                                 generator=torch.Generator().manual_seed(3))

    full = make()
    epochs = [[repr(b) for b in full] for _ in range(2)]
    replays = []
    for cut in CUTS:
        loader = make()
        it = iter(loader)
        got = [repr(next(it)) for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict()))
        replays.append(state["replay"])
        del it
        resumed = resume_from(make, state)
        assert got + [repr(b) for b in resumed] == epochs[0], cut
        assert [repr(b) for b in resumed] == epochs[1], cut
    expected = [0, 1, 2, 0, 1, 2, 0, 0] if every == 3 else list(range(7)) + [0]  # at cuts 0 to 7
    assert replays == [expected[cut] for cut in CUTS]


def test_snapshot_every_n_steps_is_checked():
    with pytest.raises(ValueError, match="snapshot_every_n_steps"):
        minidl.DataLoader(range(4), stateful=True, snapshot_every_n_steps=-1)


# --- torchdata's suite reads its private keys in a few tests: the same checks on minidl's state ----------


@pytest.mark.parametrize("persistent", [True] if OTHER_START_METHOD else [False, True])
def test_a_state_taken_before_iterating_resumes_whole_epochs(persistent):
    # torchdata's TestInitialState: its state has one snapshot per worker before any batch; minidl's says the
    # workers start fresh (None), and either way loading it gives the whole epoch, twice.
    def make():
        return minidl.DataLoader(toy.RangeDataset(20), batch_size=2, num_workers=4, persistent_workers=persistent,
                                 stateful=True, collate_fn=list)

    loader = make()
    state = loader.state_dict()
    assert state["tasks_done"] == 0 and state["workers"] in (None, [None] * 4)
    expected = flat(loader)
    it = iter(loader)
    next(it), next(it)
    loader.load_state_dict(state)
    assert flat(loader) == flat(loader) == expected


class GrowingState(minidl.IterableDataset):
    """Its state_dict() grows with every item: a list of what it has yielded, as torchdata's DynamicState test."""

    def __init__(self) -> None:
        self.seen = []

    def __iter__(self):
        while len(self.seen) < 40:
            self.seen.append(len(self.seen))
            yield self.seen[-1]

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = list(state["seen"])


def test_a_saved_state_is_not_changed_by_later_batches():
    # torchdata's TestDynamicState reads worker_0's dataset state: here it is state["workers"][0]["dataset"].
    loader = minidl.DataLoader(GrowingState(), batch_size=None, num_workers=2, stateful=True)
    it = iter(loader)
    [next(it) for _ in range(6)]
    state = loader.state_dict()
    kept = copy.deepcopy(state)
    [next(it) for _ in range(4)]
    later = loader.state_dict()
    assert state == kept and later != state
    assert [len(w["dataset"]["seen"]) for w in state["workers"]] == [3, 3]
    assert [len(w["dataset"]["seen"]) for w in later["workers"]] == [5, 5]


class CountingIterator:
    """An iterator over 0..n-1 that holds the state itself (its dataset has none)."""

    def __init__(self, n: int) -> None:
        self.i, self.n = 0, n

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, state: dict) -> None:
        self.i = state["i"]


class IteratorHoldsState(minidl.IterableDataset):
    def __iter__(self):
        return CountingIterator(10)


class OwnIterator(minidl.IterableDataset, CountingIterator):
    """A dataset that is its own iterator: iter() starts it over, so its state goes back after iter()."""

    def __init__(self) -> None:
        CountingIterator.__init__(self, 10)

    def __iter__(self):
        self.i = 0
        return self


@pytest.mark.parametrize("dataset_cls", [IteratorHoldsState, OwnIterator])
@pytest.mark.parametrize("num_workers", worker_counts(0, 1))
def test_the_iterator_s_own_state_is_saved_and_loaded_after_iter(dataset_cls, num_workers):
    # torchdata saves the state of the iterator iter(dataset) returns, and loads it after iter().
    def make():
        return minidl.DataLoader(dataset_cls(), batch_size=2, num_workers=num_workers, stateful=True, collate_fn=list)

    loader = make()
    it = iter(loader)
    got = [next(it), next(it)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    assert flat(got) + flat(resume_from(make, state)) == list(range(10))
    saved = (state["workers"] or [state["main"]])[0]
    assert saved["iterator"] == {"i": 4} and saved["dataset"] is None  # stored once (torchdata's Duplication test)


class SavesTheGlobalGenerator(toy.RangeDataset):
    """A map dataset whose state is torch's global generator (as torchdata's DummyMapDataset)."""

    def state_dict(self) -> dict:
        return {"g": torch.get_rng_state().tolist()}

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(torch.tensor(state["g"], dtype=torch.uint8))


def test_a_map_dataset_s_state_goes_back_after_the_sampler_s_draws_are_replayed():
    def make():
        return minidl.DataLoader(SavesTheGlobalGenerator(30), shuffle=True, stateful=True, collate_fn=list)

    torch.manual_seed(0)
    full = flat(make())
    torch.manual_seed(0)
    loader = make()
    got = []
    for i, b in enumerate(loader):
        got.append(b)
        if i == 9:
            break
    state = loader.state_dict()
    torch.manual_seed(0)
    assert flat(got) + flat(resume_from(make, state)) == full


class CountsIterCalls(minidl.IterableDataset):
    """Streams 0..19 (sharded by worker); its state counts how often iter() was called on this replica."""

    def __init__(self) -> None:
        self.iter_calls, self.position = 0, 0

    def __iter__(self):
        self.iter_calls += 1
        info = minidl.get_worker_info()
        shard = range(20) if info is None else range(info.id, 20, info.num_workers)
        while self.position < len(shard):
            self.position += 1
            yield shard[self.position - 1]

    def state_dict(self) -> dict:
        return {"iter_calls": self.iter_calls, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.iter_calls, self.position = state["iter_calls"], state["position"]


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_iter_is_called_once_per_replica_also_when_resumed(num_workers):
    # torchdata's TestSingleIterCalled reads its private keys; here each replica's state says how often it was iter()ed.
    def make():
        return minidl.DataLoader(CountsIterCalls(), batch_size=2, num_workers=num_workers, stateful=True)

    def iter_calls(state):
        return [w["dataset"]["iter_calls"] for w in (state["workers"] or [state["main"]])]

    loader = make()
    it = iter(loader)
    [next(it) for _ in range(4)]
    state = loader.state_dict()
    assert iter_calls(state) == [1] * max(1, num_workers)
    resumed = resume_from(make, state)
    it = iter(resumed)
    [next(it) for _ in range(2)]
    assert iter_calls(resumed.state_dict()) == [2] * max(1, num_workers)  # the saved count, and this epoch's iter()


def test_between_epochs_a_persistent_worker_s_iterator_starts_afresh():
    def make():
        return minidl.DataLoader(IteratorHoldsState(), batch_size=2, num_workers=1, persistent_workers=True,
                                 stateful=True, collate_fn=list)

    loader = make()
    list(loader)
    assert flat(resume_from(make, loader.state_dict())) == list(range(10))


def test_between_epochs_a_map_dataset_s_state_goes_back_before_the_next_epoch_s_draws():
    # torchdata's TestMultiEpochSDL: its dataset's state is the global generator, which the next epoch draws from.
    def make():
        return minidl.DataLoader(SavesTheGlobalGenerator(12), shuffle=True, stateful=True, collate_fn=list)

    torch.manual_seed(0)
    uninterrupted = make()
    full = [flat(uninterrupted) for _ in range(4)]
    torch.manual_seed(0)
    loader = make()
    first = [flat(loader) for _ in range(2)]
    resumed = resume_from(make, loader.state_dict())
    assert first + [flat(resumed) for _ in range(2)] == full
