"""The worker loop: what each DataLoader worker runs, in a process or in a thread.

Mirrors ``torch/utils/data/_utils/worker.py``; what thread workers need besides lives in minidl/_thread_workers.py.
Everything here lives at module top level so it can be pickled by reference under the ``spawn``
and ``forkserver`` start methods: a worker can only run what it can import.
"""

from __future__ import annotations

import os
import queue
import random
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from minidl import _random
from minidl._thread_workers import _own_streams, _tell_torch, _thread_local, _ThreadWatchdog, _untell_torch
from minidl._utils import MP_STATUS_CHECK_INTERVAL, ExceptionWrapper
from minidl.fetch import _DatasetKind


@dataclass(frozen=True, slots=True)
class _RNG:
    """A thread worker's own random streams, as torch 2.13's ``_RNG``: threads share the global ones.

    torch 2.13 defines this container but starts no thread workers itself.
    """

    random_generator: random.Random
    torch_generator: Any  # a torch.Generator, or None where torch is not installed
    numpy_generator: np.random.Generator | None = None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker knows about itself; ``get_worker_info()`` returns it inside a worker."""

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rng: _RNG | None = None  # None in a process worker, which owns the global streams
    worker_method: str | None = "multiprocessing"  # or "thread"


# A process worker sets the module global; a thread worker shares the module with the main
# thread and its sibling workers, so it keeps its WorkerInfo in thread-local storage (_thread_local) instead.
_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """The current worker's ``WorkerInfo``, or ``None`` in the main process (as in torch)."""
    return getattr(_thread_local, "info", None) or _worker_info


@dataclass(frozen=True)
class _IterableDatasetStopIteration:
    """Sent by a worker whose IterableDataset replica is exhausted."""

    worker_id: int


@dataclass(frozen=True)
class _ResumeIteration:
    """Sent to persistent workers at the start of each new epoch; echoed back as an ack.

    ``seed`` is the epoch's shared seed when the dataset is an IterDataPipe (torch's ``_ResumeIteration(seed)``).
    """

    seed: int | None = None


class ManagerWatchdog:
    """Lets a process worker notice that the main process died (it is re-parented)."""

    def __init__(self) -> None:
        self.manager_pid = os.getppid()

    def is_alive(self) -> bool:
        return os.getppid() == self.manager_pid


def _generate_state(base_seed: int, worker_id: int) -> list[int]:
    """Four 32-bit words seeding a worker's NumPy RNG from (base_seed, worker_id), as torch does.

    An avalanche hash (the SeedSequence construction) so neighbouring worker ids get unrelated
    streams; torch computes exactly this, so NumPy draws in workers match torch's.
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


def _seed_worker(base_seed: int, worker_id: int, worker_method: str) -> tuple[int, _RNG | None]:
    """Seed this worker's random streams; return its seed and, for a thread worker, its own ``_RNG``.

    A process worker owns its interpreter, so it seeds the global ``random``, torch and NumPy
    streams exactly as torch does. Thread workers share those globals with each other and the
    main thread, so they leave them alone: each gets its own three generators, seeded from the same
    numbers (``seed`` for ``random`` and torch, the four words of ``_generate_state`` for NumPy).
    """
    seed = base_seed + worker_id
    np_state = _generate_state(base_seed, worker_id)
    # >>> thread workers (minidl/_thread_workers.py): threads share the global streams, so each gets its own
    if worker_method == "thread":
        return seed, _RNG(*_own_streams(seed, np_state))
    # <<< thread workers
    random.seed(seed)
    np.random.seed(np_state)
    if _random.HAS_TORCH:
        import torch

        torch.set_num_threads(1)  # N workers x all cores of intra-op threads would oversubscribe
        torch.manual_seed(seed)
    return seed, None


@dataclass(frozen=True)
class _WorkerOptions:
    """What minidl's worker takes beyond torch's arguments, passed after them as ``_worker_loop``'s ``options``."""

    worker_method: str = "multiprocessing"  # or "thread" (minidl/_thread_workers.py)
    # >>> layer: shared by tracing and resume (see the block above _worker_loop)
    layers: tuple = ()  # the worker sides of the layers the iterator chose
    # <<< layer: shared


# >>> DataPipes: torch's forward compatibility (an IterDataPipe graph as the dataset). Each worker's copy of the
# graph is seeded from the one shared_seed the main process drew, so every worker shuffles the same way before
# its sharding_filter keeps its own share; a persistent worker is re-seeded by each epoch's _ResumeIteration.
def _is_iter_datapipe(dataset) -> bool:
    torch_data = sys.modules.get("torch.utils.data")  # no torch imported: nothing can be a datapipe
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
# It is a module-level class, so spawn can pickle it; the loop never names a layer.
# What a layer records travels with the worker's message (ship). That layer's _get_data takes it off in the main
# process (unship).
def ship(r: tuple, key: str, value) -> tuple:
    """A layer's worker side sends ``value`` with the message ``r`` = ``(idx, data)``.

    It rides in the idx slot, as ``(idx, {layer: value, ...})``: the pin-memory thread passes idx on
    untouched, and a message no layer added to stays torch's ``(idx, data)``.
    """
    idx, data = r
    idx, extras = idx if isinstance(idx, tuple) else (idx, {})
    extras[key] = value
    return (idx, extras), data


def unship(r: tuple, key: str) -> tuple:
    """In the main process: ``(r without this layer's value, idx, the value or None)``."""
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
    ``(task_idx, indices)``; the answer is ``(task_idx, batch)``, where batch may be an
    ``ExceptionWrapper`` or, for an exhausted IterableDataset, ``_IterableDatasetStopIteration``.
    The arguments are torch's, in torch's order. ``options`` (a ``_WorkerOptions``) holds what minidl adds.
    """
    global _worker_info
    options = options or _WorkerOptions()
    in_thread = options.worker_method == "thread"
    where = f"in DataLoader worker {'thread' if in_thread else 'process'} {worker_id}"  # ExceptionWrapper's words
    told_torch = False  # whether this worker swapped torch's get_worker_info (see minidl/_thread_workers.py)
    try:
        seed, rng = _seed_worker(base_seed, worker_id, options.worker_method)
        if _is_iter_datapipe(dataset):  # see the DataPipes block
            if shared_seed is None:
                raise AssertionError("shared_seed must be provided for IterDataPipe workers")  # torch's words
            dataset = _apply_shared_seed(dataset, shared_seed)
        info = WorkerInfo(worker_id, num_workers, seed, dataset, rng, options.worker_method)
        if in_thread:
            _thread_local.info = info
        else:
            _worker_info = info
        told_torch = _tell_torch(info)

        create_fetcher = _DatasetKind.create_fetcher
        # >>> layer: shared by tracing and resume
        for layer in options.layers:  # their worker sides wrap the queues and the fetcher factory
            index_queue, data_queue, create_fetcher = layer(worker_id, index_queue, data_queue, create_fetcher)
        # <<< layer: shared

        # An error in worker_init_fn or building the fetcher is reported on the first task,
        # so it surfaces in the main process as a normal exception, not a dead worker.
        init_exception = None
        fetcher = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = create_fetcher(dataset_kind, dataset, auto_collation, collate_fn, drop_last)
        except Exception:
            init_exception = ExceptionWrapper(where=where)

        iteration_end = False  # this worker's IterableDataset replica has run out
        watchdog = _ThreadWatchdog() if in_thread else ManagerWatchdog()
        while watchdog.is_alive():
            try:
                r = index_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)
            except queue.Empty:
                if done_event.is_set():
                    break  # shutting down, and the sentinel was lost (its queue closed at GC): leave anyway
                continue
            if isinstance(r, _ResumeIteration):
                data_queue.put((r, None))  # ack, so the main process knows the epoch starts clean
                iteration_end = False
                if _is_iter_datapipe(dataset):  # the new epoch's shared seed rides on the message
                    if r.seed is None:
                        raise AssertionError("resume iteration seed is None for IterDataPipe")  # torch's words
                    dataset = _apply_shared_seed(dataset, r.seed)
                fetcher = create_fetcher(dataset_kind, dataset, auto_collation, collate_fn, drop_last)
                continue
            if r is None:  # the sentinel: shutdown, or this worker is no longer needed
                if done_event.is_set() or iteration_end:
                    break
                raise AssertionError("a worker got the sentinel while it still had work")
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
            del data, idx, index, r  # drop references now: a batch may be large
    except KeyboardInterrupt:
        pass  # the main process decides what Ctrl-C means; the worker just exits quietly
    finally:
        if in_thread:
            _thread_local.info = None
        if told_torch:
            _untell_torch()
    if done_event.is_set() and not in_thread:
        # Don't wait at exit for the feeder thread to flush results nobody will read.
        data_queue.cancel_join_thread()
        data_queue.close()
