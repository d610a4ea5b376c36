"""minidl_course.sharing_demo: how batches cross from process workers, with torch's DataLoader as the oracle."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from conftest import shm_made_since

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402

import minidl  # noqa: E402
from minidl_course.sharing_demo import (  # noqa: E402
    BlockDataset,
    leaf_table_kib,
    shm_fds,
    shm_files,
    shm_maps,
    status_kib,
    use_file_system_strategy,
    wait_for,
)

LOADERS = {"minidl": minidl.DataLoader, "torch": TorchDataLoader}


def test_block_dataset_samples_have_the_size_and_value_asked_for():
    ds = BlockDataset(3, kib=8)
    assert len(ds) == 3
    sample = ds[2]
    assert sample.dtype == np.float32 and sample.nbytes == 8 * 1024 and (sample == 2).all()
    with pytest.raises(IndexError, match="out of range"):
        ds[3]


@pytest.mark.parametrize("library", LOADERS)
@pytest.mark.parametrize(("workers", "shared"), [(0, False), (2, True)])
def test_process_workers_hand_over_batches_in_shared_memory_as_torch_does(no_leaks, library, workers, shared):
    batch = next(iter(LOADERS[library](BlockDataset(8, kib=4), batch_size=4, num_workers=workers)))
    assert batch.is_shared() is shared


def test_thread_workers_and_numpy_batches_are_not_in_shared_memory(no_leaks):
    threaded = next(iter(minidl.DataLoader(BlockDataset(8, kib=4), batch_size=4, num_workers=2,
                                           worker_method="thread")))
    assert not threaded.is_shared()
    arrays = next(iter(minidl.DataLoader(BlockDataset(8, kib=4), batch_size=4, num_workers=2,
                                         collate_fn=minidl.numpy_collate)))
    assert isinstance(arrays, np.ndarray) and (arrays[:, 0] == np.arange(4)).all()


@pytest.mark.timeout(60)
def test_file_descriptor_strategy_maps_unlinked_files_and_leaves_none_in_dev_shm(no_leaks):
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"
    before_maps, stale = set(shm_maps(os.getpid())), set(shm_files())  # a reused pid's old files are not ours
    it = iter(minidl.DataLoader(BlockDataset(16, kib=64), batch_size=4, num_workers=2))
    batch = next(it)
    ours = [os.getpid(), *(w.pid for w in it._workers)]
    mapped = set(shm_maps(os.getpid())) - before_maps
    assert mapped and all(m.endswith(" (deleted)") for m in mapped)  # unlinked as soon as made
    # A worker still making a prefetched batch may show its file for the moment between creating and unlinking it.
    assert wait_for(lambda: not shm_made_since(stale, ours))
    del it, batch
    gc.collect()
    assert wait_for(lambda: set(shm_maps(os.getpid())) <= before_maps)


@pytest.mark.timeout(60)
def test_file_system_strategy_leaves_named_files_until_the_batches_are_freed(no_leaks):
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        # the strategy is per process: a spawned or forkserver worker starts with the default, so it is set there too
        stale = set(shm_files())  # files an earlier process with a worker's pid left are not ours
        it = iter(minidl.DataLoader(BlockDataset(16, kib=64), batch_size=4, num_workers=2,
                                    worker_init_fn=use_file_system_strategy))
        pids = [w.pid for w in it._workers]
        kept = list(it)
        named = shm_made_since(stale, pids)
        assert len(named) == len(kept) == 4
        assert {f"/dev/shm/{n}" for n in named} <= set(shm_maps(os.getpid()))
        assert not shm_fds(os.getpid())  # a name, not a descriptor, is the handle
        del kept
        gc.collect()
        assert wait_for(lambda: not shm_made_since(stale, pids))
    finally:
        torch.multiprocessing.set_sharing_strategy("file_descriptor")


def test_workers_hold_descriptors_for_the_batches_they_have_made(no_leaks):
    it = iter(minidl.DataLoader(BlockDataset(64, kib=64), batch_size=4, num_workers=1, prefetch_factor=2))
    next(it)
    (worker,) = it._workers
    assert wait_for(lambda: len(shm_fds(worker.pid)) >= 1)
    assert all(fd.startswith("/dev/shm/torch_") for fd in shm_fds(worker.pid))
    del it


def test_status_fields_and_page_table_arithmetic():
    assert status_kib(os.getpid(), "VmPTE") > 0
    assert status_kib(os.getpid(), "VmRSS") >= leaf_table_kib(0)
    assert status_kib(os.getpid(), "VmNothing") is None  # no such line: None, as where there is no /proc
    assert leaf_table_kib(0) == 0
    assert leaf_table_kib(4) == 4  # one page needs a whole table page
    assert leaf_table_kib(2048) == 4  # 512 pages of 4 KiB: exactly one table page
    assert leaf_table_kib(2052) == 8
    assert leaf_table_kib(1024 * 1024) == 2048  # 1 GiB resident: 2 MiB of last-level tables
