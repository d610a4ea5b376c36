"""Thread workers: what lets the process workers' loop and iterator run on threads too.

minidl's addition: torch 2.13 starts no thread workers. The multi-worker iterator asks a "context" for queues,
events and workers. A multiprocessing context gives process workers, and ``_ThreadContext`` gives thread workers,
so one iterator drives both. ``_InThread`` makes the worker loop's four choices for a thread (see worker.py).
It also makes torch's own ``get_worker_info`` answer inside minidl's thread workers (see the NOTE below).
"""

from __future__ import annotations

import os
import queue
import random
import sys
import threading

import numpy as np

from minidl import _random
from minidl.worker import _RNG, _generate_state, _thread_local


def _forget_thread_worker_info() -> None:
    """Clear the thread worker's info in a child forked from a thread worker.

    This happens when a dataset starts a loader of its own. The forking thread's info comes along with the fork,
    but the child is no thread worker, so it must not answer with that info.
    """
    _thread_local.info = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_thread_worker_info)


def _thread_aware_get_worker_info():
    """The body torch's ``get_worker_info`` runs while thread workers run: the calling thread's info comes first."""
    info = getattr(_minidl_thread_local, "info", None)
    return info if info is not None else _worker_info


# The body above runs with the globals of torch's module. There these two names are ours and torch's global.
_minidl_thread_local = _thread_local
_worker_info = None  # never set here: only the copy in torch's module is read

# NOTE [ torch's get_worker_info in thread workers ]
# A dataset written for torch shards itself with torch's get_worker_info(), which reads one module global. That
# is right for process workers, where minidl sets it as torch's worker does. It is wrong for threads, which share
# it. So while thread workers run, torch's function runs the thread-aware body above. Its code object is swapped,
# so even a `from torch.utils.data import get_worker_info` made earlier sees the change. The first thread worker
# to start installs it. The last one to leave its loop puts torch's own body back, so torch is as it was whenever
# no thread worker runs.
_torch_swap_lock = threading.Lock()
_torch_swap_users = 0  # thread workers running with torch's function swapped
_torch_own_code = None  # torch's own get_worker_info.__code__, while it is swapped


def _tell_torch() -> bool:
    """Install the thread-aware body in torch's ``get_worker_info`` (see the NOTE above).

    It returns True when it did, and the thread worker must then call ``_untell_torch`` when it leaves.
    It returns False when torch is not imported.
    """
    global _torch_swap_users, _torch_own_code
    torch_worker = sys.modules.get("torch.utils.data._utils.worker")
    if torch_worker is None:
        return False
    with _torch_swap_lock:
        _torch_swap_users += 1
        if _torch_swap_users == 1:
            _torch_own_code = torch_worker.get_worker_info.__code__
            torch_worker._minidl_thread_local = _thread_local
            torch_worker.get_worker_info.__code__ = _thread_aware_get_worker_info.__code__
    return True


def _untell_torch() -> None:
    """A thread worker leaves. The last one to leave puts torch's own ``get_worker_info`` back."""
    global _torch_swap_users, _torch_own_code
    torch_worker = sys.modules["torch.utils.data._utils.worker"]
    with _torch_swap_lock:
        _torch_swap_users -= 1
        if _torch_swap_users == 0:
            torch_worker.get_worker_info.__code__ = _torch_own_code
            del torch_worker._minidl_thread_local
            _torch_own_code = None


class _ThreadWatchdog:
    """A thread worker's parent is the main thread. The worker stops when the interpreter shuts down."""

    def is_alive(self) -> bool:
        return threading.main_thread().is_alive()


class _InThread:
    """A worker in a thread of the main process, passed to ``_worker_loop`` in ``_WorkerOptions.runs_in``.

    It has the same five members as ``_InProcess`` in worker.py. Threads share the interpreter's global random
    streams, the module global that holds a worker's info, and the main process as their parent.
    """

    worker_method = "thread"  # WorkerInfo.worker_method
    kind = "thread"  # ExceptionWrapper's words: "in DataLoader worker thread 0"
    watchdog = _ThreadWatchdog

    @staticmethod
    def seed(base_seed: int, worker_id: int) -> tuple:
        """Give the worker its own ``random``, torch and NumPy generators, and leave the global streams alone.

        They are seeded with the numbers a process worker gives the global streams. It returns the seed and the
        three generators in an ``_RNG``.
        """
        seed = base_seed + worker_id
        torch_generator = None
        if _random.HAS_TORCH:
            import torch

            torch_generator = torch.Generator()
            torch_generator.manual_seed(seed)
        numpy_generator = np.random.default_rng(_generate_state(base_seed, worker_id))
        return seed, _RNG(random.Random(seed), torch_generator, numpy_generator)

    @staticmethod
    def set_worker_info(info) -> None:
        """Keep ``info`` for this thread alone, and make torch's ``get_worker_info`` return it too."""
        _thread_local.info = info
        _thread_local.told_torch = _tell_torch()

    @staticmethod
    def leave() -> None:
        """Forget this thread's info. The last thread worker to leave puts torch's ``get_worker_info`` back."""
        _thread_local.info = None
        if getattr(_thread_local, "told_torch", False):
            _thread_local.told_torch = False
            _untell_torch()


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
