"""How a batch gets from a process worker to the main process, made visible (notebooks 09 and 10).

With torch installed, ``default_collate`` in a process worker stacks the batch straight into shared
memory and the queue carries only a handle to it; ``numpy_collate``'s arrays are pickled through the pipe,
every byte. The dataset here runs in workers, so it must live in the package; what a process holds
is read through ``osfacts`` (``/proc`` on Linux).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from minidl.dataset import Dataset
from minidl_course import osfacts

PAGE = 4096  # bytes in a page on x86-64 and most ARM64 Linux kernels
PTE = 8  # bytes in one page-table entry (64-bit)
PTES_PER_TABLE = PAGE // PTE  # 512 entries fill one page-table page
SHM = osfacts.SHM


class BlockDataset(Dataset):
    """``n`` float32 samples of ``kib`` KiB each, sample ``i`` filled with ``i``: batches of a known size."""

    def __init__(self, n: int, kib: int = 256) -> None:
        self.n, self.kib = n, kib

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for BlockDataset({self.n})")
        return np.full(self.kib * 1024 // 4, index, dtype=np.float32)


# What a process has open, mapped, or left in /dev/shm is asked of osfacts, the one place the course reads /proc
# and /dev/shm: each returns None where the platform can't show it (no /proc on a Mac).
shm_fds = osfacts.open_shm_files
shm_maps = osfacts.mapped_shm_files
shm_files = osfacts.shm_files
status_kib = osfacts.status_kib


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def leaf_table_kib(resident_kib: int) -> int:
    """The smallest page-table memory that maps ``resident_kib`` KiB in 4 KiB pages: the last level only.

    One 8-byte entry per page, 512 entries per 4 KiB table page, so a table page maps 2 MiB; the
    upper levels add about 1/512 of that again.
    """
    pages = -(-resident_kib * 1024 // PAGE)
    tables = -(-pages // PTES_PER_TABLE)
    return tables * PAGE // 1024


def use_file_system_strategy(worker_id: int) -> None:
    """A ``worker_init_fn`` that switches the worker to torch's ``file_system`` sharing strategy.

    The strategy is a per-process setting: a forked worker inherits the parent's, but a worker started with
    ``spawn`` or ``forkserver`` starts with the default (``file_descriptor``), so it has to be set there too.
    """
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy("file_system")
