"""Fault injection: a dead worker is named every time, and after an error no epoch ends quietly short.

Each test runs under pytest-timeout and the ``no_leaks`` fixture (no worker process, thread or
shared-memory segment may outlive it).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import resource
import signal
import time

import pytest
from workers_up import WorkersUp

import minidl
from minidl import _random
from minidl_course import toy

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(120)]

METHODS = ["multiprocessing", "thread"]
COLLATE = minidl.default_collate if _random.HAS_TORCH else minidl.numpy_collate
KILLED = r"DataLoader worker \(pid \d+\) is killed by signal: "  # torch's test_segfault matches this
DEAD = rf"{KILLED}|DataLoader worker \(pid \d+\) exited unexpectedly with exit code "  # either, in torch's words


def flat(batches) -> list[int]:
    return [int(x) for b in batches for x in b]


def read_the_done_event_forever(done_event) -> None:
    """What a worker does after every task, in a tight loop: ask whether the loader is shutting down."""
    while not done_event.is_set():
        pass


def test_a_worker_killed_while_it_reads_the_done_event_cannot_hang_shutdown():
    # torch's done event is a multiprocessing.Event: is_set() holds a lock shared by every process, and a worker
    # killed while holding it leaves it held, so set() at shutdown waits for ever (seen here under load). A process
    # reading the event in a tight loop, killed, almost always dies holding that lock; three times in a row, always.
    for _ in range(3):
        it = iter(minidl.DataLoader(toy.RangeDataset(8), batch_size=2, num_workers=1, collate_fn=COLLATE))
        first = next(it)
        reader = multiprocessing.get_context().Process(target=read_the_done_event_forever,
                                                       args=(it._workers_done_event,))
        reader.start()
        time.sleep(0.3)
        os.kill(reader.pid, signal.SIGKILL)
        reader.join()
        assert flat([first, *it]) == list(range(8))  # the epoch ends, and shutting down returns


def test_os_exit_in_getitem_is_a_runtime_error_naming_the_pid_every_time():
    # Racy before: the dead worker's last batch handle can't be opened, and EOFError or
    # ConnectionResetError escaped. scripts/fault_loop.py runs this 50+ times beside torch.
    outcomes = []
    for _ in range(10):
        loader = minidl.DataLoader(toy.DyingDataset(40, bad_index=9, how="exit"), batch_size=2, num_workers=2,
                                   collate_fn=COLLATE)
        try:
            list(loader)
            outcomes.append("no error")
        except Exception as e:  # noqa: BLE001 -- which exception is exactly what is tested
            outcomes.append(f"{type(e).__name__}: {e}")
    for outcome in outcomes:
        assert re.fullmatch(r"RuntimeError: DataLoader worker \(pid \d+\) exited unexpectedly with exit code 3\. "
                            r"Details are lost due to multiprocessing\. Rerunning with num_workers=0 may give better "
                            r"error trace\.", outcome), outcome


def test_a_worker_killed_by_a_signal_is_reported_at_once_by_the_sigchld_handler():
    # forkserver's workers are children of its server, not of this process: no SIGCHLD reaches us (nor
    # torch's handler), and the death shows at the next status check instead. This test needs our own children.
    context = "spawn" if multiprocessing.get_start_method() == "forkserver" else None
    loader = minidl.DataLoader(toy.RangeDataset(40), batch_size=2, num_workers=2, collate_fn=COLLATE,
                               multiprocessing_context=context)
    it = iter(loader)
    next(it)
    victim = it._workers[1].pid
    # The main process is busy elsewhere (a training step): the handler interrupts it, naming the worker.
    named = rf"^DataLoader worker \(pid {victim}\) is killed by signal: Killed\. $"  # torch's words, to the letter
    with pytest.raises(RuntimeError, match=named):
        os.kill(victim, signal.SIGKILL)
        for _ in range(100):
            time.sleep(0.1)
    with pytest.raises(RuntimeError, match=KILLED + "Killed"):
        list(it)


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_after_a_dead_worker_every_later_next_raises_again(how):
    it = iter(minidl.DataLoader(toy.DyingDataset(40, bad_index=9, how=how), batch_size=2, num_workers=2,
                                collate_fn=COLLATE))
    got = []
    with pytest.raises(RuntimeError, match=DEAD) as first:
        for batch in it:
            got.append(batch)
    assert flat(got) == list(range(len(flat(got))))  # what came before was in order
    for _ in range(3):  # never a StopIteration that would pass for a complete epoch
        with pytest.raises(RuntimeError, match=DEAD):
            next(it)
    assert str(it._workers[1].pid) in str(first.value) or str(it._workers[0].pid) in str(first.value)


def test_persistent_workers_after_a_dead_worker_raise_naming_it_not_a_closed_queue():
    loader = minidl.DataLoader(toy.DyingDataset(40, bad_index=9, how="exit"), batch_size=2, num_workers=2,
                               persistent_workers=True, collate_fn=COLLATE)
    with pytest.raises(RuntimeError):
        list(loader)
    with pytest.raises(RuntimeError, match=r"exited unexpectedly with exit code 3\."):  # as torch: no next epoch
        list(loader)
    del loader


# The slow batch's worker starts it as soon as it is free, before the main process asks for it, and a busy machine
# can put half a second between the two: the delay outlasts the timeout by 1.5 s, and after the timeout the wait
# left for that batch (1.5 s) is 1.5 s inside the next one.
TIMEOUT, SLOW = 3.0, 4.5


@pytest.mark.parametrize("worker_method", METHODS)
def test_after_a_timeout_the_iterator_serves_the_rest_of_the_epoch(worker_method):
    up = WorkersUp(2)
    loader = minidl.DataLoader(toy.SlowOnceDataset(12, slow_index=4, delay=SLOW), batch_size=2, num_workers=2,
                               timeout=TIMEOUT, worker_method=worker_method, collate_fn=COLLATE,
                               worker_init_fn=up.worker_init_fn)
    it = iter(loader)
    up.wait()  # time the slow batch, not the start-up
    got = [next(it), next(it)]
    with pytest.raises(RuntimeError, match=f"DataLoader timed out after {TIMEOUT} seconds"):
        next(it)
    got += list(it)  # the slow batch arrives after all, and then the rest: a full epoch, in order
    assert flat(got) == list(range(12))


@pytest.mark.parametrize("worker_method", METHODS)
def test_persistent_workers_serve_the_next_epoch_after_a_timeout(worker_method):
    up = WorkersUp(2)
    loader = minidl.DataLoader(toy.SlowOnceDataset(12, slow_index=4, delay=SLOW), batch_size=2, num_workers=2,
                               timeout=TIMEOUT, worker_method=worker_method, persistent_workers=True,
                               collate_fn=COLLATE, worker_init_fn=up.worker_init_fn)
    it = iter(loader)
    up.wait()  # time the slow batch, not the start-up
    with pytest.raises(RuntimeError, match="timed out"):
        list(it)
    assert flat(loader) == list(range(12))  # the next epoch, whole (torch does the same)
    assert flat(loader) == list(range(12))
    del loader


def test_a_failed_read_when_out_of_file_descriptors_says_ulimit_or_file_system():
    loader = minidl.DataLoader(toy.RangeDataset(8), batch_size=2, num_workers=1, worker_method="thread",
                               collate_fn=COLLATE)
    it = iter(loader)
    next(it)

    def failed_read(*args, **kwargs):
        raise ConnectionResetError("the read a process worker's batch handle needs")

    it._data_queue.get = failed_read
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The limit caps a new descriptor's number, not how many are open: three free numbers below it, whatever
    # gaps the open ones leave (pytest-xdist's and multiprocessing's descriptors sit high).
    taken, limit, free = {int(fd) for fd in os.listdir("/proc/self/fd")}, 0, 0
    while free < 3:
        free += limit not in taken
        limit += 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        with pytest.raises(RuntimeError, match=r"Too many open files.*`ulimit -n`.*'file_system'"):
            next(it)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        it._shutdown_workers()


def test_a_failed_read_with_file_descriptors_left_raises_the_read_error():
    loader = minidl.DataLoader(toy.RangeDataset(8), batch_size=2, num_workers=1, worker_method="thread",
                               collate_fn=COLLATE)
    it = iter(loader)

    def failed_read(*args, **kwargs):
        raise ConnectionResetError("nothing to do with file descriptors")

    it._data_queue.get = failed_read
    with pytest.raises(ConnectionResetError, match="nothing to do"):
        next(it)
    it._shutdown_workers()


class SegfaultsAt(minidl.Dataset):
    """A real segmentation fault in the worker fetching ``bad_index`` (any loader's worker: not the main process)."""

    def __init__(self, n: int, bad_index: int) -> None:
        self.n, self.bad_index, self.main_pid = n, bad_index, os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.bad_index and os.getpid() != self.main_pid:
            import ctypes
            import faulthandler

            faulthandler.disable()
            ctypes.string_at(0)
        return index


def _error_words(loader_cls) -> list[str]:
    """The RuntimeError a loader raises when a worker segfaults, and its cause's, pids as N."""
    try:
        list(loader_cls(SegfaultsAt(8, bad_index=3), num_workers=2))
    except RuntimeError as e:
        return [re.sub(r"pid(\(s\))? \d+", "pid N", str(x)) for x in (e, e.__cause__) if x is not None]
    return ["no error"]


@pytest.mark.skipif(not _random.HAS_TORCH, reason="torch is the oracle")
def test_a_segfault_is_reported_in_torch_s_words():
    import torch.utils.data

    words = "DataLoader worker (pid N) is killed by signal: Segmentation fault. "
    assert _error_words(minidl.DataLoader)[0] == words
    # torch's SIGCHLD handler raises these words; while the main process waits on the queue, torch's status check
    # catches them and raises "DataLoader worker (pid(s) N) exited unexpectedly" from them (its test_segfault
    # reads the whole traceback). minidl raises the handler's words itself.
    torch_words = _error_words(torch.utils.data.DataLoader)
    if multiprocessing.get_start_method() == "forkserver":
        # Under forkserver the workers are the server's children, not the main process's: torch's waitid() on their
        # pids finds nothing to report, so it can only say they died. minidl reads the exit code the server sends
        # back (Process.exitcode) and still names the signal.
        assert torch_words[0] == "DataLoader worker (pid N) exited unexpectedly"
    else:
        assert words in torch_words
