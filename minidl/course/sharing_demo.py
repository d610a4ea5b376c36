"""How a batch gets from a process worker to the main process, made visible (notebooks 09 and 10).

With torch installed, ``default_collate`` in a process worker stacks the batch straight into shared
memory and the queue carries only a handle to it; ``numpy_collate``'s arrays are pickled through the pipe,
every byte. The dataset here runs in workers, so it must live in the package; the rest reads ``/proc``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

import numpy as np

from minidl.dataset import Dataset

PAGE = 4096  # bytes in a page on x86-64 and most ARM64 Linux kernels
PTE = 8  # bytes in one page-table entry (64-bit)
PTES_PER_TABLE = PAGE // PTE  # 512 entries fill one page-table page
SHM = "/dev/shm"


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


def _is_shared_memory(target: str) -> bool:
    """A torch storage in /dev/shm (named, or unlinked: "... (deleted)"), or an anonymous memfd."""
    return target.startswith((SHM + "/torch_", "/memfd:"))


def shm_fds(pid: int) -> list[str]:
    """What the process's open file descriptors point at, for those that are shared-memory files."""
    folder, found = f"/proc/{pid}/fd", []
    for fd in os.listdir(folder):
        try:
            target = os.readlink(f"{folder}/{fd}")
        except OSError:  # closed between listdir and readlink
            continue
        if _is_shared_memory(target):
            found.append(target)
    return sorted(found)


def shm_maps(pid: int) -> list[str]:
    """The shared-memory files mapped into the process's address space (one name per file)."""
    names = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and _is_shared_memory(fields[5].strip()):
                names.add(fields[5].strip())
    return sorted(names)


def shm_files(pids: Iterable[int] | None = None) -> list[str]:
    """torch's files in ``/dev/shm``, what the file_system strategy leaves; only those ``pids`` made, if given.

    torch names each one ``torch_<pid of the process that made it>_<random>_<count>``, and /dev/shm is the
    machine's: another program's torch files are in the listing too.
    """
    prefixes = ("torch_",) if pids is None else tuple(f"torch_{pid}_" for pid in pids)
    return sorted(name for name in os.listdir(SHM) if name.startswith(prefixes))


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def status_kib(pid: int, field: str) -> int:
    """One ``kB`` field of ``/proc/<pid>/status``, such as ``VmPTE`` (page tables) or ``VmRSS``."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(f"no field {field!r} in /proc/{pid}/status")


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
