"""What the loader's modules share, as ``torch/utils/data/_utils/__init__.py``.

It also holds minidl's ``ExceptionWrapper``, which torch keeps in ``torch/_utils.py``, and what
``torch/utils/data/_utils/signal_handling.py`` does.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback

# How often, in seconds, a waiting worker checks that its parent is alive.
# A waiting main process checks its workers as often. torch waits 5.0 seconds.
# A shorter interval reports a dead worker sooner, and it costs nothing while batches flow.
MP_STATUS_CHECK_INTERVAL = 1.0

# The one clock that tracing and the loader read.
# perf_counter is system-wide and monotonic on Linux and macOS.
# So times taken in worker processes and in the main process share one axis.
now = time.perf_counter


def process_cpu_count() -> int:
    """The number of cores this process may run on.

    Linux gives each process an affinity mask, and this counts it. ``os.process_cpu_count`` does the same
    from Python 3.13. A Mac before 3.13 has neither, and gets ``os.cpu_count()``.
    """
    if hasattr(os, "process_cpu_count"):
        return os.process_cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def join_worker(w, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for worker ``w`` to end: ``w.join(timeout)``, polling its exit status too.

    ``Process.join`` waits on the process's sentinel, a pipe that reads as closed once no process holds its other
    end. A spawned worker that sends a tensor under the ``file_system`` sharing strategy (a Mac's only one) starts a
    ``torch_shm_manager``, which inherits that end and outlives the worker, so ``join`` alone waits out its whole
    timeout after the worker has gone (torch's shutdown waits its 5 s per worker there). ``is_alive()`` asks the OS.
    """
    deadline = now() + timeout
    while w.is_alive() and now() < deadline:
        w.join(timeout=0.01)


class DoneFlag:
    """The workers' done event, made so that no process can leave it locked.

    torch passes ``multiprocessing.Event()``. Its ``is_set()`` takes a lock shared by every process, so a worker
    killed inside ``is_set()`` leaves the lock held, and the main process's ``set()`` at shutdown waits for ever.
    Here it is one byte of shared memory, read and written without a lock. Only the main process writes it.
    """

    def __init__(self, context) -> None:
        self._flag = context.RawValue("b", 0)

    def is_set(self) -> bool:
        return bool(self._flag.value)

    def set(self) -> None:
        self._flag.value = 1


class ExceptionWrapper:
    """An exception caught in a worker, carried to the main process with its traceback."""

    def __init__(self, exc_info=None, where: str = "in background") -> None:
        exc_type, exc, tb = exc_info if exc_info is not None else sys.exc_info()
        self.exc_type = exc_type
        self.exc_msg = "".join(traceback.format_exception(exc_type, exc, tb))
        self.where = where

    def reraise(self):
        """Raise the same exception type here, its message holding the worker's traceback."""
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.exc_msg}"
        if self.exc_type is KeyError:
            msg = _KeyErrorMessage(msg)  # KeyError shows its argument's repr, and this keeps newlines readable
        elif getattr(self.exc_type, "message", None):
            raise self.exc_type(message=msg)  # a type whose first argument is not the message
        try:
            exception = self.exc_type(msg)
        except Exception:
            # Some exception types need more than one argument. torch then raises a RuntimeError, and so do we.
            raise RuntimeError(msg) from None
        try:
            raise exception
        finally:
            # The traceback holds this frame, and the frame would hold the exception.
            # That reference cycle would keep the iterator and its workers alive until the garbage collector runs.
            del exception


class _KeyErrorMessage(str):
    def __repr__(self) -> str:
        return str(self)


# --- noticing a dead worker process at once (torch/utils/data/_utils/signal_handling.py) ----------
# The main thread registers its workers' pids. When any child ends, SIGCHLD runs the handler.
# The handler looks whether a registered worker ended badly, and raises if one did.
# It looks with WNOWAIT, so it reaps no child.

_worker_pids: dict[int, tuple[int, ...]] = {}  # id(iterator) -> its worker processes' pids
_SIGCHLD_handler_set = False


def _set_worker_pids(key: int, pids: tuple[int, ...]) -> None:
    _worker_pids[key] = pids


def _remove_worker_pids(key: int) -> None:
    _worker_pids.pop(key, None)


def describe_exit(pid: int, exitcode: int | None) -> str:
    """How a worker process ended, in the words of torch's C++ ``_error_if_any_worker_fails``.

    A negative exit code names the signal that killed it. A worker that ended with neither a signal nor an exit
    code gets the words of torch's status check.
    """
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.strsignal(-exitcode) or signal.Signals(-exitcode).name
        except ValueError:
            name = f"Unknown signal {-exitcode}"
        words = f"DataLoader worker (pid {pid}) is killed by signal: {name}. "
        if -exitcode == getattr(signal, "SIGBUS", None):
            words += ("It is possible that dataloader's workers are out of shared memory. Please try to raise your "
                      "shared memory limit.")
        return words
    if exitcode:
        return (f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {exitcode}. Details are lost due "
                "to multiprocessing. Rerunning with num_workers=0 may give better error trace.")
    return f"DataLoader worker (pid(s) {pid}) exited unexpectedly"


def worker_failure_message(ended: list[tuple[int, int]]) -> str:
    """The one message for dead workers, given ``(pid, exit code)`` pairs.

    It holds torch's sentence for each worker, separated by spaces. torch names only the first dead worker it
    finds, and minidl names every one.
    """
    text = ""
    for words in (describe_exit(*e) for e in ended):
        text += words if not text or text.endswith(" ") else " " + words
    return text


def _exit_code(pid: int) -> int | None:
    """A child's exit code as multiprocessing reports it, without reaping the child.

    A code of -N means signal N. It is None while the child runs.
    """
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # multiprocessing reaped it already, and is_alive() tells the rest
        return None
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _error_if_any_worker_fails() -> None:
    for key, pids in list(_worker_pids.items()):
        ended = [(pid, code) for pid in pids if (code := _exit_code(pid)) not in (None, 0)]
        if ended:
            _remove_worker_pids(key)  # raise only once, because the iterator reports it on every later next()
            raise RuntimeError(worker_failure_message(ended))


def _set_SIGCHLD_handler() -> None:  # noqa: N802 -- torch's name
    """Install a SIGCHLD handler that raises when a worker dies badly. It is installed once, in the main thread."""
    global _SIGCHLD_handler_set
    if _SIGCHLD_handler_set or not hasattr(signal, "SIGCHLD"):
        return
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set a signal handler
    previous = signal.getsignal(signal.SIGCHLD)
    if not callable(previous):
        previous = None

    def handler(signum, frame):
        _error_if_any_worker_fails()
        if previous is not None:
            previous(signum, frame)

    signal.signal(signal.SIGCHLD, handler)
    _SIGCHLD_handler_set = True
