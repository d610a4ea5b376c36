"""Thread workers: what lets the process workers' loop and iterator run on threads too.

minidl's addition: torch 2.13 starts no thread workers. The multi-worker iterator asks a "context" for queues,
events and workers. A multiprocessing context gives process workers, and ``_ThreadContext`` gives thread workers,
so one iterator drives both. ``_InThread`` makes the worker loop's four choices for a thread (see worker.py).

In a thread worker, ``minidl.get_worker_info()`` answers for that thread: its info is thread-local. torch's
``torch.utils.data.get_worker_info()`` reads one module global, which threads would share, so minidl leaves it alone
and it returns None in a thread worker. A dataset that shards itself under thread workers calls minidl's.
Process workers set both, as torch's own workers set torch's.
"""

from __future__ import annotations

import os
import queue
import random
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


class _ThreadWatchdog:
    """A thread worker's parent is the main thread. The worker stops when the interpreter shuts down."""

    def is_alive(self) -> bool:
        return threading.main_thread().is_alive()


class _InThread:
    """A worker in a thread of the main process, passed to ``_worker_loop`` in ``_WorkerOptions.runs_in``.

    It has the same five members as ``_InProcess`` in worker.py. Threads share the interpreter's global random
    streams, the module globals that hold a worker's info (minidl's and torch's), and the main process as their
    parent.
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
        """Keep ``info`` for this thread alone: ``minidl.get_worker_info()`` returns it here."""
        _thread_local.info = info

    @staticmethod
    def leave() -> None:
        """Forget this thread's info."""
        _thread_local.info = None


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
