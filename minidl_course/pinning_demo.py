"""Stand-ins for notebook 07 (pinned memory) on a machine without an accelerator.

torch's ``Tensor.pin_memory()`` raises where no accelerator exists, so ``FakePinnable`` pins "by copy" the way a
tensor does, and lets ``pin_memory()`` and the pin thread run for real; ``lock_pages`` shows what the operating
system offers by itself (``mlock``, Linux and macOS: kept in RAM, not fixed in place as a pinned buffer is).
These live in the package, not in a notebook cell, because the pin thread and worker processes run them.
Nothing here is part of PyTorch.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import ctypes.util
import os
import resource
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from minidl_course import osfacts


class FakePinnable:
    """Stands in for a tensor: ``pin_memory()`` returns a copy marked with the thread that pinned it.

    >>> batch = FakePinnable(3)
    >>> batch, batch.pin_memory().is_pinned(), batch.is_pinned()
    (FakePinnable(3, pageable), True, False)
    """

    def __init__(self, value: Any, pinned_in: str | None = None) -> None:
        self.value = value
        self.pinned_in = pinned_in  # name of the thread that made this pinned copy; None: pageable

    def pin_memory(self) -> FakePinnable:
        # A real tensor copies its bytes into a page-locked buffer and returns that: a new object, same values.
        value = self.value.copy() if isinstance(self.value, np.ndarray) else self.value
        return FakePinnable(value, pinned_in=threading.current_thread().name)

    def is_pinned(self) -> bool:
        return self.pinned_in is not None

    def __repr__(self) -> str:
        where = "pageable" if self.pinned_in is None else f"pinned in {self.pinned_in}"
        if isinstance(self.value, np.ndarray):
            return f"FakePinnable(array of {self.value.size} {self.value.dtype}, {where})"
        return f"FakePinnable({self.value!r}, {where})"


def fake_pinnable_collate(samples: Sequence[Any]) -> FakePinnable:
    """Collate samples into one ``FakePinnable`` holding them as a NumPy array (a stand-in batch tensor)."""
    return FakePinnable(np.asarray(samples))


# --- what the operating system does: page faults and page locking -----------------------------------


def page_faults() -> int:
    """Page faults this process has taken so far (minor and major): each is the OS mapping in a page."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


def locked_bytes() -> int | None:
    """Bytes of this process's memory that are locked in RAM (``VmLck``), or None where the OS can't say (no /proc)."""
    return osfacts.locked_bytes()


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c")
    if name is None:
        raise OSError("no C library found: page locking needs mlock() (Linux or macOS)")
    return ctypes.CDLL(name, use_errno=True)


@contextlib.contextmanager
def lock_pages(array: np.ndarray) -> Iterator[np.ndarray]:
    """Lock ``array``'s memory in RAM with ``mlock`` for the ``with`` block, then unlock it.

    ``mlock`` maps every page in at once and promises only that none is swapped out: Linux may still move a
    locked page to another physical frame, so this is not CUDA's pinning (the driver fixes the pages for the
    device itself). Raises OSError, saying why, if the OS refuses (``ulimit -l`` too small).
    """
    libc = _libc()
    address, size = ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(array.nbytes)
    if libc.mlock(address, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mlock of {array.nbytes:,} bytes failed: {os.strerror(err)} "
                           f"(the limit on locked memory, `ulimit -l`, is {_memlock_limit()})")
    try:
        yield array
    finally:
        libc.munlock(address, size)


def _memlock_limit() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft:,} bytes"


# --- measured GPU results, from `python -m minidl_bench gpu` on a CUDA machine -----------------------


def gpu_results(start: str | Path = ".") -> dict[Path, list[dict[str, str]]]:
    """The rows of every ``results/<machine-tag>/gpu.csv`` of the project that ``start`` is in.

    The project root is the first folder above ``start`` holding ``pyproject.toml``. Empty when no GPU
    run has been committed; a file without rows (what the suite leaves on a machine without CUDA) is left
    out. Rows are as ``minidl_bench`` writes them (``task``, ``method``, ``size``, ``median_s``, ``note``,
    the machine's fields, ...).
    """
    here = Path(start).resolve()
    root = next((folder for folder in (here, *here.parents) if (folder / "pyproject.toml").is_file()), None)
    if root is None:
        return {}
    found = {}
    for path in sorted((root / "results").glob("*/gpu.csv")):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if rows:
            found[path] = rows
    return found
