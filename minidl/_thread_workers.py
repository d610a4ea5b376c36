"""Thread workers: what lets the process workers' loop and iterator run on threads too.

minidl's addition; torch 2.13 starts no thread workers. The multi-worker iterator asks a "context"
for queues, events and workers: a multiprocessing context for process workers, ``_ThreadContext``
for thread workers, so the same iterator and the same ``_worker_loop`` drive both.
It also makes torch's own ``get_worker_info`` answer inside minidl's workers (see the NOTE below).
"""

from __future__ import annotations

import os
import queue
import random
import sys
import threading

import numpy as np

from minidl import _random

# A thread worker's WorkerInfo: threads share minidl.worker's module global, so each keeps its own here.
_thread_local = threading.local()


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


# The body above runs with the globals of torch's module, where these two names are torch's global and ours.
_minidl_thread_local = _thread_local
_worker_info = None  # never set here: only the copy in torch's module is read

# NOTE [ torch's get_worker_info in thread workers ]
# A dataset written for torch shards itself with torch's get_worker_info(), which reads one module global: right
# for process workers (minidl sets it, as torch's worker does), wrong for threads, which share it. So while thread
# workers run, torch's function gets the thread-aware body above (its code object is swapped, so that even a
# `from torch.utils.data import get_worker_info` made earlier sees it). The first thread worker to start installs
# it, the last to leave its loop puts torch's own body back: torch is as it was whenever no thread worker runs.
_torch_swap_lock = threading.Lock()
_torch_swap_users = 0  # thread workers running with torch's function swapped
_torch_own_code = None  # torch's own get_worker_info.__code__, while swapped


def _tell_torch(info) -> bool:
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


def _own_streams(seed: int, np_state: list[int]) -> tuple:
    """A thread worker's own ``random``, torch and NumPy generators, seeded with the numbers a process worker
    gives the global streams (``seed``, and ``np_state`` from ``_generate_state``)."""
    torch_generator = None
    if _random.HAS_TORCH:
        import torch

        torch_generator = torch.Generator()
        torch_generator.manual_seed(seed)
    return random.Random(seed), torch_generator, np.random.default_rng(np_state)


class _ThreadWatchdog:
    """A thread worker's parent is the main thread: stop if the interpreter is shutting down."""

    def is_alive(self) -> bool:
        return threading.main_thread().is_alive()


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
