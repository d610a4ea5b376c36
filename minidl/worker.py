"""The worker loop: what each DataLoader worker runs, in a process or in a thread.

Mirrors ``torch/utils/data/_utils/worker.py``, in torch's order. A thread worker seeds itself, keeps its
WorkerInfo and watches its parent in its own way: ``_InThread`` in minidl/_thread_workers.py does those steps,
handed to the loop in ``_WorkerOptions``. Everything here lives at module top level, so that ``spawn`` and
``forkserver`` can pickle it by reference: a worker can only run what it can import.
"""

from __future__ import annotations

import os
import queue
import random
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from minidl import _random
from minidl._utils import MP_STATUS_CHECK_INTERVAL, ExceptionWrapper
from minidl.fetch import _DatasetKind

# >>> thread workers: a thread worker's WorkerInfo lives here (minidl/_thread_workers.py), as threads share the
# module global below
_thread_local = threading.local()
# <<< thread workers


class ManagerWatchdog:
    """Lets a process worker notice that the main process died: the worker then has a new parent."""

    def __init__(self) -> None:
        self.manager_pid = os.getppid()

    def is_alive(self) -> bool:
        return os.getppid() == self.manager_pid


# The WorkerInfo of the worker this process is. It stays None in the main process.
_worker_info: WorkerInfo | None = None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker knows about itself. ``get_worker_info()`` returns it inside a worker."""

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rng: _RNG | None = None  # None in a process worker, which owns the global streams
    worker_method: str | None = "multiprocessing"  # or "thread"


def get_worker_info() -> WorkerInfo | None:
    """The current worker's ``WorkerInfo``, or ``None`` in the main process, as in torch.

    It answers in thread workers too, each thread for itself. torch's ``torch.utils.data.get_worker_info()`` answers
    in process workers only (minidl's set it as torch's do), so a dataset meant for thread workers calls this one.
    """
    # >>> thread workers: a thread worker's own info comes first, because threads share the module global
    info = getattr(_thread_local, "info", None)
    if info is not None:
        return info
    # <<< thread workers
    return _worker_info


@dataclass(frozen=True)
class _IterableDatasetStopIteration:
    """Sent by a worker whose IterableDataset replica is exhausted."""

    worker_id: int


@dataclass(frozen=True)
class _ResumeIteration:
    """Sent to persistent workers at the start of each new epoch. A worker echoes it back as an ack.

    ``seed`` is the epoch's shared seed when the dataset is an IterDataPipe, as in torch's ``_ResumeIteration(seed)``.
    """

    seed: int | None = None


@dataclass(frozen=True, slots=True)
class _RNG:
    """A thread worker's own random streams, as torch 2.13's ``_RNG``. Threads share the global ones.

    torch 2.13 defines this container but starts no thread workers itself.
    """

    random_generator: random.Random
    torch_generator: Any  # a torch.Generator, or None where torch is not installed
    numpy_generator: np.random.Generator | None = None


def _generate_state(base_seed: int, worker_id: int) -> list[int]:
    """Four 32-bit words that seed a worker's NumPy stream from ``(base_seed, worker_id)``, as torch computes them.

    It is NumPy's SeedSequence hash. Neighbouring worker ids get unrelated streams, and the NumPy draws in
    minidl's workers match those in torch's.
    """
    mask32 = 0xFFFFFFFF
    entropy = [worker_id, base_seed & mask32, base_seed >> 32, 0]
    hash_const_a = 0x43B0D7E5

    def hash32(value: int) -> int:
        nonlocal hash_const_a
        value = (value ^ hash_const_a) & mask32
        hash_const_a = (hash_const_a * 0x931E8875) & mask32
        value = (value * hash_const_a) & mask32
        return (value ^ (value >> 16)) & mask32

    def mix(x: int, y: int) -> int:
        result = ((0xCA01F9DD * x) - (0x4973F715 * y)) & mask32
        return (result ^ (result >> 16)) & mask32

    pool = [hash32(e) for e in entropy]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hash32(pool[src]))

    hash_const_b = 0x8B51F9DD
    state = []
    for value in pool:
        value = (value ^ hash_const_b) & mask32
        hash_const_b = (hash_const_b * 0x58F38DED) & mask32
        value = (value * hash_const_b) & mask32
        state.append((value ^ (value >> 16)) & mask32)
    return state


# What minidl passes to _worker_loop besides torch's arguments comes last, in one _WorkerOptions.
class _InProcess:
    """A worker in a process of its own, as every torch worker is. torch's loop does these steps inline.

    ``_InThread`` in minidl/_thread_workers.py has the same members, for a worker in a thread.
    """

    worker_method = "multiprocessing"  # WorkerInfo.worker_method
    kind = "process"  # ExceptionWrapper's words: "in DataLoader worker process 0"
    watchdog = ManagerWatchdog

    @staticmethod
    def seed(base_seed: int, worker_id: int) -> tuple[int, _RNG | None]:
        """Seed the process's global ``random``, NumPy and torch streams as torch does, and return the seed."""
        seed = base_seed + worker_id
        random.seed(seed)
        np.random.seed(_generate_state(base_seed, worker_id))
        if _random.HAS_TORCH:
            import torch

            torch.set_num_threads(1)  # each worker uses one core for torch's operations, not all of them
            torch.manual_seed(seed)
        return seed, None

    @staticmethod
    def set_worker_info(info: WorkerInfo) -> None:
        """Keep ``info`` in the module global, and in torch's too when torch is imported.

        A dataset written for torch calls torch's ``get_worker_info()``; with this, it shards itself here as well.
        """
        global _worker_info
        _worker_info = info
        torch_worker = sys.modules.get("torch.utils.data._utils.worker")
        if torch_worker is not None:
            torch_worker._worker_info = torch_worker.WorkerInfo(
                id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset
            )

    @staticmethod
    def leave() -> None:
        """Nothing to undo: the process ends when its loop does."""


@dataclass(frozen=True)
class _WorkerOptions:
    """What minidl's worker takes beyond torch's arguments. It comes last, as ``_worker_loop``'s ``options``."""

    runs_in: type = _InProcess  # or _InThread (minidl/_thread_workers.py)
    # >>> layer: shared by tracing and resume (see the block above _worker_loop)
    layers: tuple = ()  # the worker sides of the layers the iterator chose
    # <<< layer: shared


# >>> DataPipes: torch's forward compatibility, where the dataset is an IterDataPipe graph.
# The main process draws one shared_seed, and each worker seeds its copy of the graph with it.
# So every worker shuffles the same way before its sharding_filter keeps its own share.
# Each epoch's _ResumeIteration brings a persistent worker the new epoch's seed.
def _is_iter_datapipe(dataset) -> bool:
    torch_data = sys.modules.get("torch.utils.data")  # without torch imported, nothing can be a datapipe
    return torch_data is not None and isinstance(dataset, torch_data.IterDataPipe)


def _apply_shared_seed(datapipe, shared_seed: int):
    """``graph_settings.apply_random_seed`` from a generator seeded with ``shared_seed``, as torch's worker does."""
    import torch
    from torch.utils.data.graph_settings import apply_random_seed

    shared_rng = torch.Generator()
    shared_rng.manual_seed(shared_seed)
    return apply_random_seed(datapipe, shared_rng)
# <<< DataPipes


# >>> layer: shared by tracing and resume.
# A layer's worker side comes in _WorkerOptions.layers. The worker calls it as layer(worker_id, index_queue,
# data_queue, create_fetcher), and it returns the three to use instead: wrapped queues and a fetcher factory.
# It is a module-level class, so that spawn can pickle it. The loop never names a layer.
# What a layer records travels with the worker's message (ship). That layer's _get_data takes it off in the main
# process (unship).
def ship(r: tuple, key: str, value) -> tuple:
    """A layer's worker side sends ``value`` with the message ``r`` = ``(idx, data)``.

    It rides in the idx slot, as ``(idx, {layer: value, ...})``, because the pin-memory thread passes idx on
    untouched. A message that no layer added to stays torch's ``(idx, data)``.
    """
    idx, data = r
    idx, extras = idx if isinstance(idx, tuple) else (idx, {})
    extras[key] = value
    return (idx, extras), data


def unship(r: tuple, key: str) -> tuple:
    """Take this layer's value off ``r`` in the main process: ``(r without it, idx, the value or None)``."""
    idx, data = r
    if not isinstance(idx, tuple):
        return r, idx, None
    idx, extras = idx
    value = extras.pop(key, None)
    return ((idx, extras) if extras else idx, data), idx, value
# <<< layer: shared


def _worker_loop(
    dataset_kind,
    dataset,
    index_queue,
    data_queue,
    done_event,
    auto_collation,
    collate_fn,
    drop_last,
    base_seed,
    init_fn,
    worker_id,
    num_workers,
    persistent_workers,
    shared_seed,
    options=None,
) -> None:
    """Fetch batches for the tasks on ``index_queue`` and put the results on ``data_queue``.

    See NOTE [ Worker queues and shutdown ] in dataloader.py for the protocol. A task is
    ``(task_idx, indices)``. The answer is ``(task_idx, batch)``, where batch may also be an
    ``ExceptionWrapper`` or, for an exhausted IterableDataset, ``_IterableDatasetStopIteration``.
    The arguments are torch's, in torch's order. ``options`` (a ``_WorkerOptions``) holds what minidl adds.
    """
    options = options or _WorkerOptions()
    runs_in = options.runs_in  # _InProcess, or _InThread for a thread worker
    where = f"in DataLoader worker {runs_in.kind} {worker_id}"  # ExceptionWrapper's words
    try:
        seed, rng = runs_in.seed(base_seed, worker_id)
        if _is_iter_datapipe(dataset):  # see the DataPipes block
            if shared_seed is None:
                raise AssertionError("shared_seed must be provided for IterDataPipe workers")  # torch's words
            dataset = _apply_shared_seed(dataset, shared_seed)
        runs_in.set_worker_info(WorkerInfo(worker_id, num_workers, seed, dataset, rng, runs_in.worker_method))

        create_fetcher = _DatasetKind.create_fetcher
        # >>> layer: shared by tracing and resume
        for layer in options.layers:  # their worker sides wrap the queues and the fetcher factory
            index_queue, data_queue, create_fetcher = layer(worker_id, index_queue, data_queue, create_fetcher)
        # <<< layer: shared

        # An error in worker_init_fn or in building the fetcher is sent as the answer to the first task.
        # The main process then raises it like any other error, instead of finding a dead worker.
        init_exception = None
        fetcher = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = create_fetcher(dataset_kind, dataset, auto_collation, collate_fn, drop_last)
        except Exception:
            init_exception = ExceptionWrapper(where=where)

        iteration_end = False  # this worker's IterableDataset replica has run out
        watchdog = runs_in.watchdog()
        while watchdog.is_alive():
            try:
                r = index_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)
            except queue.Empty:
                if done_event.is_set():
                    break  # shutting down, and the sentinel was lost when its queue closed at GC: leave anyway
                continue
            if isinstance(r, _ResumeIteration):
                data_queue.put((r, None))  # the ack tells the main process that the new epoch starts clean
                iteration_end = False
                if _is_iter_datapipe(dataset):  # the new epoch's shared seed rides on the message
                    if r.seed is None:
                        raise AssertionError("resume iteration seed is None for IterDataPipe")  # torch's words
                    dataset = _apply_shared_seed(dataset, r.seed)
                fetcher = create_fetcher(dataset_kind, dataset, auto_collation, collate_fn, drop_last)
                continue
            if r is None:  # the sentinel: the loader shuts down, or needs this worker no more
                if done_event.is_set() or iteration_end:
                    break
                raise AssertionError("Received final signal but neither done_event nor iteration_end is set")
            if done_event.is_set() or iteration_end:
                continue  # drain the queue without working until the sentinel arrives
            idx, index = r
            if init_exception is not None:
                data, init_exception = init_exception, None
            else:
                try:
                    data = fetcher.fetch(index)
                except StopIteration:
                    if dataset_kind != _DatasetKind.Iterable:
                        data = ExceptionWrapper(where=where)
                    else:
                        data = _IterableDatasetStopIteration(worker_id)
                        iteration_end = True
                except Exception:
                    data = ExceptionWrapper(where=where)
            data_queue.put((idx, data))
            del data, idx, index, r  # drop the references now, because a batch may be large
    except KeyboardInterrupt:
        pass  # the main process decides what Ctrl-C means, so the worker just exits quietly
    finally:
        runs_in.leave()
    if done_event.is_set():
        # Don't wait at exit for the feeder thread to flush results that nobody will read.
        data_queue.cancel_join_thread()
        data_queue.close()
