"""Lets a timeout test wait until its workers run, so it times a slow batch, not a worker's start-up.

Under spawn and forkserver a worker imports torch and minidl before its first batch: seconds on a busy
machine, longer than the short timeouts those tests use. Workers get it by name: this module is importable.
"""

from __future__ import annotations

import functools
import multiprocessing


def _started(semaphore, worker_id: int) -> None:
    semaphore.release()


class WorkersUp:
    """``worker_init_fn=up.worker_init_fn``, then ``up.wait()`` returns once every worker has started."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.semaphore = multiprocessing.get_context().Semaphore(0)  # the loader's default context
        self.worker_init_fn = functools.partial(_started, self.semaphore)

    def wait(self, timeout: float = 60.0) -> None:
        for _ in range(self.num_workers):
            assert self.semaphore.acquire(timeout=timeout), "a worker did not start"
