"""A dataset that kills the process fetching one sample, for torch's DataLoader as much as minidl's.

``toy.DyingDataset`` decides it is in a worker through ``minidl.get_worker_info()``, which only
minidl's workers set. This one compares process ids instead: it remembers the pid that built it
(the main process) and dies only in another process, whichever library started that process.
Thread workers share the main process's pid, so they never die here.
"""

from __future__ import annotations

import os
import signal

from minidl.dataset import Dataset


class DiesInWorker(Dataset):
    """``0 .. n-1``; the process (other than the builder's) fetching ``bad_index`` dies.

    ``how`` is ``"sigkill"`` (the process is killed by ``SIGKILL``, as the OOM killer does) or
    ``"exit"`` (``os._exit(code)``: gone without running another line of Python).

    In the process that built it, every index is safe:

    >>> DiesInWorker(4, bad_index=2)[2]
    2
    >>> DiesInWorker(4, bad_index=2, how="segfault")
    Traceback (most recent call last):
    ...
    ValueError: how must be 'sigkill' or 'exit', got 'segfault'
    """

    def __init__(self, n: int, bad_index: int, how: str = "sigkill", code: int = 3) -> None:
        if how not in ("sigkill", "exit"):
            raise ValueError(f"how must be 'sigkill' or 'exit', got {how!r}")
        self.n, self.bad_index, self.how, self.code = n, bad_index, how, code
        self.owner_pid = os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.bad_index and os.getpid() != self.owner_pid:
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(self.code)
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} items")
        return index
