"""A state saved between epochs (or before the first) is the next epoch's start: the epochs after it are the
uninterrupted run's, persistent workers keep their base_seed and random streams, and a dataset keeps its own state."""

from __future__ import annotations

import pytest
from resumetools import (
    CONFIGS,
    OTHER_START_METHOD,
    SHARD_END_CUTS,
    EpochCounter,
    IteratorHoldsState,
    NoLenSampler,
    SavesTheGlobalGenerator,
    UnevenStream,
    batches_of,
    flat,
    interrupted_equals_uninterrupted,
    maker,
    resume_from,
    seed_everything,
    worker_counts,
)

import minidl
from minidl_bench.batches import assert_same_batches
from minidl_course import toy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]


@pytest.mark.parametrize("persistent", [False, True])
def test_state_between_epochs_starts_the_next_epoch_identically(persistent):
    make = maker(dict(CONFIGS["processes, shuffle with a generator"], persistent_workers=persistent))
    seed_everything(0)
    loader = make()
    batches_of(loader)
    state = loader.state_dict()
    second = batches_of(loader)
    other = make()
    other.load_state_dict(state)
    assert_same_batches(batches_of(other), second)


def test_persistent_workers_resume():
    def make():
        return minidl.DataLoader(toy.GlobalRandomDataset(12), batch_size=2, num_workers=2, persistent_workers=True,
                                 stateful=True, shuffle=True)

    full, resumed = interrupted_equals_uninterrupted(make, cut=2, epochs_before=1)
    assert_same_batches(resumed, full)


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("past_the_end", [False, True])
def test_iterable_dataset_resumed_at_the_end_of_an_epoch_then_gives_full_epochs(num_workers, persistent,
                                                                                 past_the_end):
    def make():
        return minidl.DataLoader(toy.ResumableStream(9), batch_size=2, num_workers=num_workers,
                                 stateful=True, persistent_workers=persistent, collate_fn=list)

    loader = make()
    it = iter(loader)
    n = len(list(make()))
    [next(it) for _ in range(n)]  # every batch of the epoch consumed
    if past_the_end:
        assert next(it, None) is None
    state = loader.state_dict()
    del it, loader
    resumed = make()
    resumed.load_state_dict(state)
    rest = sorted(x for b in resumed for x, _ in b)
    assert rest == (list(range(9)) if past_the_end else [])  # saved after StopIteration: the next epoch
    for _ in range(2):
        assert sorted(x for b in resumed for x, _ in b) == list(range(9))


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


def test_a_persistent_loader_s_state_between_epochs_loads_into_a_non_persistent_one():
    def make(persistent):
        return minidl.DataLoader(toy.RangeDataset(10), batch_size=2, sampler=NoLenSampler(10), num_workers=2,
                                 persistent_workers=persistent, stateful=True, snapshot_every_n_steps=0)

    loader = make(True)
    list(loader)
    state = loader.state_dict()  # n=0 and no __len__: no batch shipped a state, the epoch's end asked for them
    assert state["workers"] is not None and state["tasks_done"] == state["replay"] == 0
    loader = None
    resumed = make(False)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert [b.tolist() for b in resumed] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
