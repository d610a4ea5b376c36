"""Notebook 09's measurement of how a process worker's batch reaches the main process: a tensor or a pickle.

A tensor batch crosses as a handle to shared memory; a NumPy batch is pickled through the result queue's pipe.
Both functions time what the main process waits for in ``next()`` (the worker given time to make the batch
first), the second what unpickling alone costs. They use ``sharing_demo.BlockDataset`` (importable by workers).
"""

from __future__ import annotations

import pickle
import time
import timeit
from collections.abc import Callable

import minidl
from minidl_course.sharing_demo import BlockDataset


def receive_seconds(collate_fn: Callable, mib: int, batches: int = 8) -> float:
    """Best time the main process spends in ``next()`` for a batch of ``mib`` MiB from one process worker."""
    loader = minidl.DataLoader(BlockDataset(4 * batches, kib=256 * mib), batch_size=4, num_workers=1,
                               collate_fn=collate_fn)
    it, times = iter(loader), []
    for _ in range(batches):
        time.sleep(0.05 + 0.01 * mib)  # time enough for the worker to make and send the next batch
        start = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - start)
    del it  # shuts the worker down
    return min(times)  # other programs can only add time: the best of the batches is the cost


def unpickle_seconds(mib: int, repeat: int = 8) -> float:
    """Best of ``repeat``: unpickling a NumPy batch of ``mib`` MiB in this process, no pipe (``next()``'s last step)."""
    blob = pickle.dumps(minidl.numpy_collate([BlockDataset(4, kib=256 * mib)[i] for i in range(4)]))
    return min(timeit.repeat(lambda: pickle.loads(blob), number=1, repeat=repeat))
