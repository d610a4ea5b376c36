"""Small datasets for the course, the exercises and the tests, each showing one behaviour.

They live in the package, not in notebook cells, because a worker started with ``spawn`` or
``forkserver`` must import what it runs, and a notebook cell can't be imported.
"""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np

from minidl.dataset import Dataset, IterableDataset
from minidl.worker import get_worker_info


class RangeDataset(Dataset):
    """Items ``0 .. n-1``, as plain ints: the simplest map-style dataset."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for RangeDataset({self.n})")
        return index


class GlobalRandomDataset(RangeDataset):
    """Each item is ``(index, draws)`` from the global ``random``, NumPy and torch streams.

    The classic augmentation pitfall: the draws depend on how each worker was seeded.
    """

    def __getitem__(self, index: int):
        draws = {"random": random.random(), "numpy": float(np.random.rand())}
        try:
            import torch

            draws["torch"] = float(torch.rand(()))
        except ImportError:
            pass
        return index, draws


class WorkerRandomDataset(RangeDataset):
    """Like GlobalRandomDataset, but safe with thread workers: each draws from its own generator.

    A thread worker's ``get_worker_info().rng`` holds its own ``random``, torch and NumPy
    generators; a process worker has ``rng=None`` and owns the global streams, seeded per worker.
    """

    def __getitem__(self, index: int):
        info = get_worker_info()
        if info is None:
            return index, float(np.random.default_rng(index).random())
        if info.rng is None:
            return index, float(np.random.rand())
        return index, float(info.rng.numpy_generator.random())


class WorkerGeneratorsDataset(RangeDataset):
    """Each item is ``(index, draws)``: one draw from each of a thread worker's own generators.

    ``get_worker_info().rng`` (torch 2.13's container) is set in thread workers only: a process
    worker has ``rng=None`` and draws from the global streams (``GlobalRandomDataset``).
    """

    def __getitem__(self, index: int):
        import torch

        rng = get_worker_info().rng
        return index, {"random": rng.random_generator.random(), "numpy": float(rng.numpy_generator.random()),
                       "torch": float(torch.rand((), generator=rng.torch_generator))}


class WorkerIdDataset(RangeDataset):
    """Each item is ``(index, worker id, worker seed, pid)``: which worker fetched what."""

    def __getitem__(self, index: int):
        info = get_worker_info()
        if info is None:
            return index, -1, -1, os.getpid()
        return index, info.id, info.seed, os.getpid()


class SlowDataset(RangeDataset):
    """Sleeps ``delay`` seconds per item, and ``slow_delay`` for the items in ``slow``."""

    def __init__(self, n: int, delay: float = 0.0, slow: tuple[int, ...] = (), slow_delay: float = 0.5):
        super().__init__(n)
        self.delay, self.slow, self.slow_delay = delay, tuple(slow), slow_delay

    def __getitem__(self, index: int) -> int:
        time.sleep(self.slow_delay if index in self.slow else self.delay)
        return super().__getitem__(index)


class FailingDataset(RangeDataset):
    """Raises ``exc_type`` when asked for ``bad_index``: a bug inside a worker."""

    def __init__(self, n: int, bad_index: int, exc_type: type[Exception] = KeyError):
        super().__init__(n)
        self.bad_index, self.exc_type = bad_index, exc_type

    def __getitem__(self, index: int) -> int:
        if index == self.bad_index:
            raise self.exc_type(f"bad sample {index}")
        return super().__getitem__(index)


class DyingDataset(RangeDataset):
    """Kills the worker process fetching ``bad_index``: ``how`` is "sigkill", "exit" or "segfault"."""

    def __init__(self, n: int, bad_index: int, how: str = "sigkill"):
        super().__init__(n)
        self.bad_index, self.how = bad_index, how

    def __getitem__(self, index: int) -> int:
        if index == self.bad_index and get_worker_info() is not None:
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.how == "exit":
                os._exit(3)
            else:
                import ctypes
                import faulthandler

                faulthandler.disable()  # the crash is the point; skip the inherited traceback dump
                ctypes.string_at(0)  # reads address 0: a real segmentation fault
        return super().__getitem__(index)


class ShardedRange(IterableDataset):
    """Streams ``start .. end-1``; with workers, each takes its own contiguous shard."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.start, self.end))
        per_worker = -(-(self.end - self.start) // info.num_workers)  # ceil division
        lo = self.start + info.id * per_worker
        return iter(range(lo, min(lo + per_worker, self.end)))

    def __len__(self) -> int:
        return self.end - self.start


class UnshardedRange(ShardedRange):
    """The same stream, but every worker replays all of it: the duplicated-data mistake."""

    def __iter__(self):
        return iter(range(self.start, self.end))


def seed_numpy_from_worker(worker_id: int) -> None:
    """A ``worker_init_fn`` that reseeds NumPy's global stream from the worker's seed."""
    info = get_worker_info()
    np.random.seed(info.seed % 2**32)


class ResumableStream(IterableDataset):
    """Streams ``(item, noise)`` for ``0 .. n-1``, sharded by worker, and can save where it stands.

    ``state_dict``/``load_state_dict`` are what ``DataLoader.state_dict()`` needs from an
    IterableDataset to resume mid-epoch; the noise comes from NumPy's global stream, which each
    process worker owns.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.position = 0  # next item of this replica's shard

    def _shard(self) -> range:
        info = get_worker_info()
        return range(self.n) if info is None else range(info.id, self.n, info.num_workers)

    def __iter__(self):
        shard = self._shard()
        while self.position < len(shard):
            item = shard[self.position]
            self.position += 1
            yield item, float(np.random.rand())
        self.position = 0  # the next epoch starts from the top

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


class CpuBoundDataset(RangeDataset):
    """Pure-Python, CPU-bound items that hold the GIL: ``(i, Collatz steps of a block, worker id)``.

    Item ``i`` adds up the Collatz stopping times of ``i*work+1 .. i*work+work``: a few ms of
    interpreter work, no I/O and no NumPy, so only processes (or a free-threaded interpreter) run
    two of them at once.
    """

    def __init__(self, n: int, work: int = 300) -> None:
        super().__init__(n)
        self.work = work

    def __getitem__(self, index: int):
        super().__getitem__(index)  # bounds check
        steps = 0
        for x in range(index * self.work + 1, index * self.work + self.work + 1):
            while x != 1:
                x = x // 2 if x % 2 == 0 else 3 * x + 1
                steps += 1
        info = get_worker_info()
        return index, steps, -1 if info is None else info.id


class SlowOnceDataset(RangeDataset):
    """Item ``slow_index`` takes ``delay`` seconds the first time this replica fetches it, then none.

    For timeouts that pass: the batch arrives late once, and a later epoch runs at full speed.
    """

    def __init__(self, n: int, slow_index: int, delay: float) -> None:
        super().__init__(n)
        self.slow_index, self.delay, self.slowed = slow_index, delay, False

    def __getitem__(self, index: int) -> int:
        if index == self.slow_index and not self.slowed:
            self.slowed = True
            time.sleep(self.delay)
        return super().__getitem__(index)


class KeywordOnlyError(Exception):
    """An exception built only as ``KeywordOnlyError(message=...)``, like some libraries' own."""

    message = "a keyword-only error"  # the class attribute torch's ExceptionWrapper looks for

    def __init__(self, *, message: str) -> None:
        super().__init__(message)
        self.message = message


class KeywordErrorDataset(RangeDataset):
    """Raises ``KeywordOnlyError`` for ``bad_index``."""

    def __init__(self, n: int, bad_index: int) -> None:
        super().__init__(n)
        self.bad_index = bad_index

    def __getitem__(self, index: int) -> int:
        if index == self.bad_index:
            raise KeywordOnlyError(message=f"bad sample {index}")
        return super().__getitem__(index)

