"""Errors the training loop caught: they come again at the same places after a resume, and are never fetched
twice; a dataset's failing state_dict() reaches the loop."""

from __future__ import annotations

import pytest
from resumetools import StateDictFailsOnce, StateDictRaises, _catching, worker_counts

import minidl
from minidl_course import toy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]


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


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_a_map_dataset_whose_state_dict_raises_forwards_the_error(num_workers):
    loader = minidl.DataLoader(StateDictRaises(8), num_workers=num_workers, stateful=True)
    with pytest.raises(ZeroDivisionError, match="the dataset's state_dict\\(\\) failed"):
        it = iter(loader)
        next(it)
        loader.state_dict()


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
