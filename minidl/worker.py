"""The worker loop: what each DataLoader worker runs, in a process or in a thread.

Mirrors ``torch/utils/data/_utils/worker.py``.
Everything here lives at module top level so it can be pickled by reference under the ``spawn``
and ``forkserver`` start methods: a worker can only run what it can import.
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
# thread and its sibling workers, so it keeps its WorkerInfo in thread-local storage instead.
_worker_info: WorkerInfo | None = None
_thread_local = threading.local()


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


class _ThreadWatchdog:
    """A thread worker's parent is the main thread: stop if the interpreter is shutting down."""

    def is_alive(self) -> bool:
        return threading.main_thread().is_alive()


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
    if worker_method == "thread":
        torch_generator = None
        if _random.HAS_TORCH:
            import torch

            torch_generator = torch.Generator()
            torch_generator.manual_seed(seed)
        return seed, _RNG(random.Random(seed), torch_generator, np.random.default_rng(np_state))
    random.seed(seed)
    np.random.seed(np_state)
    if _random.HAS_TORCH:
        import torch

        torch.set_num_threads(1)  # N workers x all cores of intra-op threads would oversubscribe
        torch.manual_seed(seed)
    return seed, None


def _forget_thread_worker_info() -> None:
    """In a child forked from a thread worker (a dataset that starts a loader of its own): the forking thread's
    info came along with the fork, but this process is no thread worker, so it must not answer there."""
    _thread_local.info = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_thread_worker_info)


def _thread_aware_get_worker_info():
    """torch's ``get_worker_info`` body while thread workers run: the calling thread's info first."""
    info = getattr(_minidl_thread_local, "info", None)
    return info if info is not None else _worker_info


_minidl_thread_local = _thread_local  # the name _thread_aware_get_worker_info looks up

# NOTE [ torch's get_worker_info in thread workers ]
# A dataset written for torch shards itself with torch's get_worker_info(), which reads one module global: right
# for process workers (minidl sets it, as torch's worker does), wrong for threads, which share it. So while thread
# workers run, torch's function gets the thread-aware body above (its code object is swapped, so that even a
# `from torch.utils.data import get_worker_info` made earlier sees it). The first thread worker to start installs
# it, the last to leave its loop puts torch's own body back: torch is as it was whenever no thread worker runs.
_torch_swap_lock = threading.Lock()
_torch_swap_users = 0  # thread workers running with torch's function swapped
_torch_own_code = None  # torch's own get_worker_info.__code__, while swapped


def _tell_torch(info: WorkerInfo) -> bool:
    """Let a dataset written for torch (calling torch's get_worker_info) shard itself here too.

    A process worker sets torch's module global, as torch's own worker does. A thread worker installs the
    thread-aware body (see NOTE above) and returns True: it must call ``_untell_torch`` when it leaves.
    """
    global _torch_swap_users, _torch_own_code
    torch_worker = sys.modules.get("torch.utils.data._utils.worker")
    if torch_worker is None:
        return False
    if info.worker_method != "thread":
        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset
        )
        return False
    with _torch_swap_lock:
        _torch_swap_users += 1
        if _torch_swap_users == 1:
            _torch_own_code = torch_worker.get_worker_info.__code__
            torch_worker._minidl_thread_local = _thread_local
            torch_worker.get_worker_info.__code__ = _thread_aware_get_worker_info.__code__
    return True


def _untell_torch() -> None:
    """A thread worker leaves: the last one puts torch's own get_worker_info back."""
    global _torch_swap_users, _torch_own_code
    torch_worker = sys.modules["torch.utils.data._utils.worker"]
    with _torch_swap_lock:
        _torch_swap_users -= 1
        if _torch_swap_users == 0:
            torch_worker.get_worker_info.__code__ = _torch_own_code
            del torch_worker._minidl_thread_local
            _torch_own_code = None


@dataclass(frozen=True)
class _WorkerOptions:
    """What minidl's worker needs beyond torch's parameters (torch's 14th is IterDataPipe's shared_seed).

    ``layers`` are the worker sides of minidl's optional layers (tracing, resume), given by the iterator
    that chose them: each is called in the worker as ``layer(worker_id, index_queue, data_queue,
    create_fetcher)`` and returns the three to use instead (wrapped queues, a fetcher factory). They
    must be picklable (module-level classes) for spawn; the worker loop itself never names them.
    What a layer records travels with the worker's message (``ship``) and is taken off in the main
    process by that layer's ``_get_data`` (``unship``).
    """

    worker_method: str = "multiprocessing"  # or "thread"
    layers: tuple = ()
    shared_seed: int | None = None  # torch's 14th argument: seeds an IterDataPipe's random datapipes (see below)


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
    options=None,
) -> None:
    """Fetch batches for the tasks on ``index_queue`` and put the results on ``data_queue``.

    See NOTE [ Worker queues and shutdown ] in dataloader.py for the protocol. A task is
    ``(task_idx, indices)``; the answer is ``(task_idx, batch)``, where batch may be an
    ``ExceptionWrapper`` or, for an exhausted IterableDataset, ``_IterableDatasetStopIteration``.
    ``options`` (a ``_WorkerOptions``) holds minidl's additions: thread workers, and the worker sides
    of the layers the iterator chose (tracing, resume), which wrap the queues and the fetcher factory.
    """
    global _worker_info
    options = options or _WorkerOptions()
    in_thread = options.worker_method == "thread"
    where = f"in DataLoader worker {'thread' if in_thread else 'process'} {worker_id}"  # ExceptionWrapper's words
    told_torch = False  # whether this worker swapped torch's get_worker_info (see NOTE above _tell_torch)
    try:
        seed, rng = _seed_worker(base_seed, worker_id, options.worker_method)
        if _is_iter_datapipe(dataset):  # see the DataPipes block
            if options.shared_seed is None:
                raise AssertionError("shared_seed must be provided for IterDataPipe workers")  # torch's words
            dataset = _apply_shared_seed(dataset, options.shared_seed)
        info = WorkerInfo(worker_id, num_workers, seed, dataset, rng, options.worker_method)
        if in_thread:
            _thread_local.info = info
        else:
            _worker_info = info
        told_torch = _tell_torch(info)

        create_fetcher = _DatasetKind.create_fetcher
        for layer in options.layers:  # minidl's layers (tracing, resume) wrap the queues and the fetcher factory
            index_queue, data_queue, create_fetcher = layer(worker_id, index_queue, data_queue, create_fetcher)

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


# --- thread workers -------------------------------------------------------------------------
# The multi-worker iterator talks to a "context" that makes queues, events and workers. For
# process workers that is a multiprocessing context; for thread workers it is this adapter, so
# the same iterator and the same _worker_loop drive both.


class _ThreadQueue(queue.Queue):
    """A queue.Queue with the two multiprocessing.Queue methods the shutdown protocol calls."""

    def cancel_join_thread(self) -> None:
        pass

    def close(self) -> None:
        pass


class _WorkerThread(threading.Thread):
    """A worker thread that answers the questions the iterator asks of a worker process."""

    pid = None  # threads share the main process's pid
    exitcode = None

    def terminate(self) -> None:
        pass  # a thread can't be killed from outside: it exits when it sees the sentinel


class _ThreadContext:
    """Stands in for a multiprocessing context when ``worker_method="thread"``."""

    Queue = _ThreadQueue
    Event = threading.Event

    @staticmethod
    def Process(target, args, name=None) -> _WorkerThread:  # noqa: N802 -- multiprocessing's spelling
        return _WorkerThread(target=target, args=args, name=name)
