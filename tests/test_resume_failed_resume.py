"""A resume that fails (its workers die, its replay meets an error the consumer never had) raises, and the
loader keeps the state: iter() again resumes where the save stood."""

from __future__ import annotations

import pytest
from resumetools import DiesWhenAsked, RaisesOnceShards, _event

import minidl

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]


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


def test_a_replay_that_meets_an_error_the_consumer_never_had_raises_and_a_retry_resumes():
    # A stateless stream (sharded by worker), saved after 3 batches between snapshots: the resumed loader replays
    # the 3 batches, and worker 0's dataset raises once at item 2. Dropping that error would lose batches without
    # a word ([9, 11] would come first); it is raised, and iter() again resumes where the save stood.
    armed = _event("multiprocessing")

    def make():
        return minidl.DataLoader(RaisesOnceShards(16, armed), batch_size=2, num_workers=2, stateful=True,
                                 snapshot_every_n_steps=4)

    loader = make()
    it = iter(loader)
    had = [next(it).tolist() for _ in range(3)]
    state = loader.state_dict()
    it = loader = None
    assert had == [[0, 2], [1, 3], [4, 6]] and state["replay"] == 3
    resumed = make()
    with pytest.warns(UserWarning, match="RaisesOnceShards has no state_dict"):
        resumed.load_state_dict(state)
    armed.set()
    with pytest.raises(OSError, match="transient read error at item 2"):
        iter(resumed)
    assert not armed.is_set() and resumed.state_dict() == state  # raised once; still the point to resume from
    assert [b.tolist() for b in resumed] == [[5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
