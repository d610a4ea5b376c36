"""An IterableDataset without state_dict()/load_state_dict() (nor its iterator): its epoch starts again and
the batches had are fetched and dropped, with a warning that names the dataset."""

from __future__ import annotations

import warnings

import pytest
from resumetools import HalfStateful, HalfStatefulStream, StatelessShards, StatelessStream

import minidl
from minidl_course import toy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]


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
    with pytest.warns(UserWarning, match="StatelessShards has no state_dict\\(\\)/load_state_dict\\(\\).*the 4 "
                                         "batches had are fetched and dropped"):
        resumed.load_state_dict(state)
    assert had + [b.tolist() for b in resumed] == expected
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*has no state_dict")
        fresh = make()
        fresh.load_state_dict(make().state_dict())  # between epochs there is nothing to replay: no warning
    assert [b.tolist() for b in fresh] == expected


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
