"""IterDataPipe / MapDataPipe as the dataset, against torch 2.13's DataLoader (the DataPipes block of dataloader.py).

A datapipe graph shuffles and shards itself; the loader seeds its shufflers from one shared seed drawn from
loader.generator before base_seed, and shards it over the workers. Same seed, same batches, in the same order.
"""

from __future__ import annotations

import itertools
import multiprocessing

import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402
from loadertools import TorchShardedRange  # noqa: E402
from torch.utils.data.datapipes.iter import IterableWrapper  # noqa: E402
from torch.utils.data.datapipes.map import SequenceWrapper  # noqa: E402
from torch.utils.data.graph_settings import get_all_graph_pipes, traverse_dps  # noqa: E402

import minidl  # noqa: E402

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(120)]

N = 100


def shuffled_range(n: int = N):
    return IterableWrapper(range(n)).shuffle(buffer_size=16).sharding_filter()


def epochs(loader_cls, dataset, seeding: str, seed: int = 0, n_epochs: int = 2, **kwargs) -> list:
    """``n_epochs`` epochs of batches (as lists), the loader seeded by torch.manual_seed or by its own generator."""
    torch.manual_seed(seed)
    if seeding == "generator":
        torch.manual_seed(seed + 1000)  # the global stream differs: only the loader's generator may matter
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    loader = loader_cls(dataset, batch_size=10, **kwargs)
    return [[batch.tolist() for batch in loader] for _ in range(n_epochs)]


# Workers x persistence x shuffle= x seeding: the whole grid where workers start quickly (fork); a few cases under
# forkserver and spawn (make unit-forkserver / unit-spawn), where each worker imports torch anew.
WORKERS = [(0, False), (1, False), (1, True), (2, False), (2, True)]
FULL_GRID = list(itertools.product([True, False, None], WORKERS, ["manual_seed", "generator"]))
SHORT_GRID = [(True, (0, False), "generator"), (True, (2, False), "manual_seed"),
              (True, (2, True), "generator"), (None, (1, True), "manual_seed")]
GRID = FULL_GRID if multiprocessing.get_start_method() == "fork" else SHORT_GRID


@pytest.mark.parametrize(("shuffle", "workers", "seeding"), GRID)
def test_iterdatapipe_batches_equal_torchs_over_two_epochs(shuffle, workers, seeding):
    num_workers, persistent = workers
    kwargs = dict(shuffle=shuffle, num_workers=num_workers, persistent_workers=persistent)
    ours = epochs(minidl.DataLoader, shuffled_range(), seeding, **kwargs)
    theirs = epochs(tud.DataLoader, shuffled_range(), seeding, **kwargs)
    assert ours == theirs
    for epoch in ours:  # sharded, not duplicated: each element once per epoch, however many workers
        assert sorted(itertools.chain.from_iterable(epoch)) == list(range(N))
    if shuffle is False:  # the shuffler is off: each worker's share in order (with 2 workers, evens and odds)
        assert ours[0] == ours[1]
        assert all(batch == sorted(batch) for batch in ours[0])
    else:  # shuffle=True or left to the graph (its shuffler is on): a new shared seed each epoch
        assert ours[0] != ours[1]


def test_iterdatapipe_with_spawned_persistent_workers_equals_torch():
    """A spawn context named in the call (the default-start-method run covers fork): the seed travels pickled."""
    kwargs = dict(shuffle=True, num_workers=2, persistent_workers=True, multiprocessing_context="spawn")
    assert epochs(minidl.DataLoader, shuffled_range(40), "generator", **kwargs) == \
        epochs(tud.DataLoader, shuffled_range(40), "generator", **kwargs)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_same_seed_same_order_other_seed_other_order_same_elements(num_workers):
    first = epochs(minidl.DataLoader, shuffled_range(), "generator", seed=1, n_epochs=1, shuffle=True,
                   num_workers=num_workers)
    again = epochs(minidl.DataLoader, shuffled_range(), "generator", seed=1, n_epochs=1, shuffle=True,
                   num_workers=num_workers)
    other = epochs(minidl.DataLoader, shuffled_range(), "generator", seed=2, n_epochs=1, shuffle=True,
                   num_workers=num_workers)
    assert first == again
    assert first != other
    assert sorted(itertools.chain.from_iterable(first[0])) == sorted(itertools.chain.from_iterable(other[0]))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mapdatapipe_is_sampled_as_torch_samples_it(num_workers):
    kwargs = dict(shuffle=True, num_workers=num_workers)
    ours = epochs(minidl.DataLoader, SequenceWrapper(range(50)), "manual_seed", **kwargs)
    assert ours == epochs(tud.DataLoader, SequenceWrapper(range(50)), "manual_seed", **kwargs)
    assert sorted(itertools.chain.from_iterable(ours[0])) == list(range(50))


def test_datapipe_is_wrapped_as_torch_wraps_it():
    from torch.utils.data.datapipes.datapipe import (
        _IterDataPipeSerializationWrapper,
        _MapDataPipeSerializationWrapper,
    )

    assert type(minidl.DataLoader(shuffled_range()).dataset) is _IterDataPipeSerializationWrapper
    assert type(minidl.DataLoader(SequenceWrapper(range(3))).dataset) is _MapDataPipeSerializationWrapper


# --- worker_init_fn runs after the worker's share is set ------------------------------------------------------------

_sharding_seen_by_init = None  # set in each worker by record_sharding


def record_sharding(worker_id: int) -> None:
    """A user's worker_init_fn: what the graph's sharding_filter says when it runs."""
    global _sharding_seen_by_init
    info = tud.get_worker_info() or minidl.get_worker_info()
    (sharding_filter,) = [dp for dp in get_all_graph_pipes(traverse_dps(info.dataset))
                          if type(dp).__name__ == "ShardingFilterIterDataPipe"]
    _sharding_seen_by_init = (worker_id, sharding_filter.num_of_instances, sharding_filter.instance_id)


def tag_with_sharding_seen(x):
    return [x, *_sharding_seen_by_init]


def test_worker_init_fn_runs_after_sharding():
    def run(loader_cls):
        dataset = IterableWrapper(range(12)).sharding_filter().map(tag_with_sharding_seen)
        loader = loader_cls(dataset, batch_size=None, num_workers=2, worker_init_fn=record_sharding)
        return [batch if isinstance(batch, list) else batch.tolist() for batch in loader]

    ours = run(minidl.DataLoader)
    assert ours == run(tud.DataLoader)
    # Worker w keeps elements w, w + 2, ...: its init function already saw "2 instances, this one is w".
    assert ours == [[x, x % 2, 2, x % 2] for x in range(12)]


# --- what is refused ------------------------------------------------------------------------------------------------


def outcome(make_and_iterate):
    try:
        return "ok", make_and_iterate()
    except Exception as e:  # noqa: BLE001 -- the type and message are what is compared
        return type(e), str(e)


def test_other_iterable_datasets_still_refuse_shuffle_as_torch_does():
    ours = outcome(lambda: minidl.DataLoader(TorchShardedRange(0, 10), shuffle=True))
    theirs = outcome(lambda: tud.DataLoader(TorchShardedRange(0, 10), shuffle=True))
    assert ours[0] is ValueError
    assert ours == theirs


def test_thread_workers_refuse_a_datapipe_naming_worker_method():
    with pytest.raises(ValueError, match="worker_method='thread'"):
        minidl.DataLoader(shuffled_range(), num_workers=2, worker_method="thread")
    assert len(list(minidl.DataLoader(shuffled_range(), worker_method="thread", batch_size=10))) == 10  # no workers
