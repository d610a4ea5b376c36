"""The multi-worker iterator against torch's: same batches, same order, same worker seeds."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402
from loadertools import TorchShardedRange  # noqa: E402

import minidl  # noqa: E402
from minidl.worker import _generate_state  # noqa: E402
from minidl_course import toy  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaks")


class TorchWorkerIdDataset(tud.Dataset):
    """(index, worker id, worker seed) through torch's get_worker_info, for torch's loader."""

    def __len__(self):
        return 24

    def __getitem__(self, index):
        info = tud.get_worker_info()
        return index, info.id, info.seed


class TorchGlobalRandomDataset(toy.GlobalRandomDataset, tud.Dataset):
    pass


def loaders(minidl_dataset, torch_dataset, seed=0, worker_method="multiprocessing", **kwargs):
    """A minidl and a torch DataLoader with equal arguments and equally seeded generators."""
    return (
        minidl.DataLoader(minidl_dataset, generator=torch.Generator().manual_seed(seed),
                          worker_method=worker_method, **kwargs),
        tud.DataLoader(torch_dataset, generator=torch.Generator().manual_seed(seed), **kwargs),
    )


def as_lists(batches):
    return [[x.tolist() if isinstance(x, torch.Tensor) else x for x in b] if isinstance(b, list) else b.tolist()
            for b in batches]


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("prefetch_factor", [1, 2, 4])
def test_same_batches_and_worker_assignment_as_torch(num_workers, prefetch_factor):
    ours, theirs = loaders(minidl.TensorDataset(torch.arange(50)), tud.TensorDataset(torch.arange(50)),
                           batch_size=4, shuffle=True, num_workers=num_workers, prefetch_factor=prefetch_factor)
    assert as_lists(ours) == as_lists(theirs)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_worker_ids_and_seeds_equal_torch(num_workers):
    # toy.WorkerIdDataset asks minidl; the torch twin asks torch; both must agree on who fetched what.
    ours, theirs = loaders(toy.WorkerIdDataset(24), TorchWorkerIdDataset(), batch_size=3, num_workers=num_workers,
                           shuffle=True)
    mine = [(i, w, s) for idx, wid, seed, _ in ours for i, w, s in zip(idx.tolist(), wid.tolist(), seed.tolist())]
    ref = [(i, w, s) for idx, wid, seed in theirs for i, w, s in zip(idx.tolist(), wid.tolist(), seed.tolist())]
    assert mine == ref
    assert len({w for _, w, _ in mine}) == num_workers


def test_augmentations_in_workers_equal_torch_and_reproduce():
    # Each worker seeds random, NumPy and torch as torch does: every draw matches torch's loader.
    def draws(loader):
        return [(int(i), {k: round(float(v), 12) for k, v in d.items()}) for idx, dd in loader
                for i, d in zip(idx, [dict(zip(dd, vals)) for vals in zip(*dd.values())])]

    ours, theirs = loaders(toy.GlobalRandomDataset(16), TorchGlobalRandomDataset(16), seed=42, batch_size=4,
                           num_workers=2)
    first = draws(ours)
    assert first == draws(theirs)
    again, _ = loaders(toy.GlobalRandomDataset(16), TorchGlobalRandomDataset(16), seed=42, batch_size=4,
                       num_workers=2)
    assert draws(again) == first


def test_duplicate_augmentation_pitfall_is_fixed_per_worker():
    """The classic bug: workers forked with one NumPy state would draw the same numbers.

    torch (and minidl) reseed NumPy per worker, so different workers draw differently, while
    the same generator seed reproduces the same draws run to run.
    """
    def numpy_draws(seed):
        loader = minidl.DataLoader(toy.GlobalRandomDataset(8), batch_size=1, num_workers=2,
                                   generator=torch.Generator().manual_seed(seed))
        return [float(d["numpy"]) for _, d in loader]

    run1, run2 = numpy_draws(5), numpy_draws(5)
    assert run1 == run2  # reproducible
    worker0, worker1 = run1[0::2], run1[1::2]  # round-robin: batches alternate between workers
    assert worker0 != worker1 and not set(worker0) & set(worker1)  # no two workers share a stream


def test_numpy_seed_state_matches_torch():
    from torch.utils.data._utils.worker import _generate_state as torch_generate_state

    for base_seed in [0, 1, 2**40 + 7, -3 % 2**63]:
        for worker_id in range(4):
            assert _generate_state(base_seed, worker_id) == torch_generate_state(base_seed, worker_id)


def test_in_order_false_yields_the_same_multiset_and_lets_fast_batches_pass():
    ds = toy.SlowDataset(12, slow=(0,), slow_delay=1.0)
    batches = [b.tolist() for b in minidl.DataLoader(ds, batch_size=2, num_workers=2, in_order=False)]
    assert sorted(map(tuple, batches)) == [(i, i + 1) for i in range(0, 12, 2)]
    assert batches[0] != [0, 1]  # the slow first batch no longer holds the others back
    in_order = [b.tolist() for b in minidl.DataLoader(ds, batch_size=2, num_workers=2)]
    assert in_order == [[i, i + 1] for i in range(0, 12, 2)]


@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
def test_persistent_workers_over_epochs(worker_method):
    loader = minidl.DataLoader(toy.WorkerIdDataset(10), batch_size=2, num_workers=2, persistent_workers=True,
                               shuffle=True, generator=torch.Generator().manual_seed(0), worker_method=worker_method)
    ref = tud.DataLoader(toy.RangeDataset(10), batch_size=2, shuffle=True, num_workers=2, persistent_workers=True,
                         generator=torch.Generator().manual_seed(0))
    pids = set()
    for _ in range(3):
        epoch = list(loader)
        assert [b[0].tolist() for b in epoch] == [b.tolist() for b in ref]
        pids |= {int(p) for b in epoch for p in b[3]}
    expected_pids = 2 if worker_method == "multiprocessing" else 1  # threads share the main pid
    assert len(pids) == expected_pids  # the same workers served every epoch
    loader._iterator._shutdown_workers()
    ref._iterator._shutdown_workers()


@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_iterable_dataset_sharded_with_get_worker_info(worker_method, num_workers):
    ours = minidl.DataLoader(toy.ShardedRange(0, 20), batch_size=3, num_workers=num_workers,
                             worker_method=worker_method)
    theirs = tud.DataLoader(TorchShardedRange(0, 20), batch_size=3, num_workers=num_workers)
    assert as_lists(ours) == as_lists(theirs)
    assert sorted(x for b in ours for x in b.tolist()) == list(range(20))


def test_unsharded_iterable_dataset_duplicates_data_like_torch():
    batches = list(minidl.DataLoader(toy.UnshardedRange(0, 4), batch_size=None, num_workers=2))
    assert sorted(int(b) for b in batches) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_worker_init_fn_runs_in_each_worker_and_sees_worker_info():
    loader = minidl.DataLoader(toy.GlobalRandomDataset(4), batch_size=1, num_workers=2,
                               worker_init_fn=toy.seed_numpy_from_worker,
                               generator=torch.Generator().manual_seed(1))
    got = [float(d["numpy"]) for _, d in loader]
    base = torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(1)).item()
    expected = []
    for worker_id in (0, 1):
        np.random.seed((base + worker_id) % 2**32)
        expected.append([np.random.rand() for _ in range(2)])
    assert got == [expected[0][0], expected[1][0], expected[0][1], expected[1][1]]


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_every_start_method(method):
    ours, theirs = loaders(toy.WorkerIdDataset(12), TorchWorkerIdDataset(), batch_size=3, num_workers=2,
                           multiprocessing_context=method)
    assert [b[:3] for b in as_lists(ours)] == as_lists(theirs)[:4]


def test_thread_workers_give_the_same_batches_and_own_rngs():
    ours, theirs = loaders(minidl.TensorDataset(torch.arange(30)), tud.TensorDataset(torch.arange(30)),
                           batch_size=4, shuffle=True, num_workers=3, worker_method="thread")
    assert as_lists(ours) == as_lists(theirs)
    draws = [(int(i), v) for idx, vals in minidl.DataLoader(toy.WorkerRandomDataset(8), batch_size=2,
                                                            num_workers=2, worker_method="thread",
                                                            generator=torch.Generator().manual_seed(3))
             for i, v in zip(idx.tolist(), vals.tolist())]
    again = [(int(i), v) for idx, vals in minidl.DataLoader(toy.WorkerRandomDataset(8), batch_size=2,
                                                            num_workers=2, worker_method="thread",
                                                            generator=torch.Generator().manual_seed(3))
             for i, v in zip(idx.tolist(), vals.tolist())]
    assert draws == again and len({v for _, v in draws}) == 8


def test_thread_workers_batches_are_not_in_shared_memory():
    batch = next(iter(minidl.DataLoader(minidl.TensorDataset(torch.arange(8)), batch_size=4, num_workers=1,
                                        worker_method="thread")))
    assert not batch[0].is_shared()


def test_process_workers_send_tensors_through_shared_memory():
    batch = next(iter(minidl.DataLoader(minidl.TensorDataset(torch.arange(8)), batch_size=4, num_workers=1)))
    assert batch[0].is_shared()


class LoadsItsOwnItems(minidl.Dataset):
    """A dataset whose every item runs a loader of its own, with 2 process workers, over a sharded stream."""

    def __init__(self, n, inner):
        self.n, self.inner = n, inner

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if self.inner == "minidl":
            loader = minidl.DataLoader(toy.ShardedRange(0, 6), batch_size=None, num_workers=2,
                                       multiprocessing_context="fork")
        else:
            loader = tud.DataLoader(TorchShardedRange(0, 6), batch_size=None, num_workers=2,
                                    multiprocessing_context="fork")
        return sorted(int(x) for x in loader)


@pytest.mark.parametrize("inner", ["minidl", "torch"])
def test_a_loader_forked_from_a_thread_worker_gives_its_workers_their_own_info(inner):
    # fork on purpose: the thread's worker info is copied into the child with the forking thread.
    outer = minidl.DataLoader(LoadsItsOwnItems(2, inner), batch_size=None, num_workers=2, worker_method="thread")
    assert list(outer) == [list(range(6))] * 2  # each item once: the inner workers shard by their own ids


def test_thread_workers_answer_minidls_get_worker_info_and_leave_torchs_as_it_is():
    # torch's function reads one module global, which threads would share: minidl neither sets nor swaps it.
    import torch.utils.data._utils.worker as torch_worker

    own = torch_worker.get_worker_info.__code__
    seen = []

    class Peek(minidl.Dataset):  # what each library's get_worker_info answers while a thread worker fetches
        def __len__(self):
            return 4

        def __getitem__(self, index):
            seen.append((torch_worker.get_worker_info.__code__ is own, tud.get_worker_info(),
                         minidl.get_worker_info().id))
            return index

    assert list(minidl.DataLoader(Peek(), batch_size=None, num_workers=2, worker_method="thread")) == [0, 1, 2, 3]
    assert {(torchs_own, torchs_info) for torchs_own, torchs_info, _ in seen} == {(True, None)}
    assert sorted({worker_id for *_, worker_id in seen}) == [0, 1]
    threads = minidl.DataLoader(toy.ShardedRange(0, 12), batch_size=None, num_workers=2, worker_method="thread")
    assert sorted(int(x) for x in threads) == list(range(12))  # sharded with minidl.get_worker_info
    assert minidl.get_worker_info() is None and tud.get_worker_info() is None
