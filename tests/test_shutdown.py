"""Fault injection: errors, dead workers, timeouts and every way an iterator ends, without hangs or leaks.

Each test runs under pytest-timeout, so a hang fails the test instead of stalling CI, and under
the ``no_leaks`` fixture: no worker process (zombies included), worker thread or shared-memory
segment may outlive it by more than 5 s.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from workers_up import WorkersUp

import minidl
from minidl import _random
from minidl_course import toy

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(60)]

METHODS = ["multiprocessing", "thread"]
# torch tensors when torch is here (they cross processes through shared memory, which must not leak);
# NumPy arrays on an interpreter without torch (the free-threaded run of `make test-ft`).
COLLATE = minidl.default_collate if _random.HAS_TORCH else minidl.numpy_collate


def loader_of(dataset, **kwargs) -> minidl.DataLoader:
    return minidl.DataLoader(dataset, collate_fn=COLLATE, **kwargs)


@pytest.mark.parametrize("worker_method", METHODS)
@pytest.mark.parametrize("exc_type", [KeyError, ValueError, IndexError])
def test_worker_exception_reaches_consumer_with_type_worker_id_and_traceback(worker_method, exc_type):
    # index 5 is in the third batch of 2, which round-robin sends to worker 0 of 2
    loader = loader_of(toy.FailingDataset(10, bad_index=5, exc_type=exc_type), batch_size=2,
                               num_workers=2, worker_method=worker_method)
    got = []
    with pytest.raises(exc_type) as info:
        for batch in loader:
            got.append(batch.tolist())
    msg = str(info.value)
    kind = "thread" if worker_method == "thread" else "process"  # a thread worker says so, not "process"
    assert f"Caught {exc_type.__name__} in DataLoader worker {kind} 0" in msg
    assert "Original Traceback" in msg and "bad sample 5" in msg and "toy.py" in msg
    assert got == [[0, 1], [2, 3]]  # the batches before the bad one arrived, in order


def test_worker_init_fn_failure_is_reported_as_an_exception():
    loader = loader_of(toy.RangeDataset(4), num_workers=1, worker_init_fn=_failing_init)
    with pytest.raises(ZeroDivisionError, match="worker process 0"):
        list(loader)


def _failing_init(worker_id):
    return 1 / 0


@pytest.mark.parametrize("how", ["sigkill", "exit", "segfault"])
def test_dead_worker_raises_runtime_error_naming_pid_and_exit_status(how):
    loader = loader_of(toy.DyingDataset(20, bad_index=6, how=how), batch_size=2, num_workers=2)
    with pytest.raises(RuntimeError, match=r"^DataLoader worker \(pid \d+\) ") as info:
        list(loader)
    expected = {"sigkill": r"is killed by signal: Killed\. ",  # torch 2.13's words, to the letter
                "exit": r"exited unexpectedly with exit code 3\. Details are lost due to multiprocessing\. "
                        r"Rerunning with num_workers=0 may give better error trace\.",
                "segfault": r"is killed by signal: Segmentation fault\. "}[how]
    assert re.fullmatch(r"DataLoader worker \(pid \d+\) " + expected, str(info.value)), str(info.value)


@pytest.mark.parametrize("worker_method", METHODS)
def test_timeout_raises_runtime_error_naming_it(worker_method):
    up = WorkersUp(1)
    loader = loader_of(toy.SlowDataset(6, slow=(2,), slow_delay=2.0), batch_size=1, num_workers=1,
                               timeout=0.5, worker_method=worker_method, worker_init_fn=up.worker_init_fn)
    it = iter(loader)
    up.wait()  # time the slow batch, not the start-up
    assert [next(it).tolist(), next(it).tolist()] == [[0], [1]]
    with pytest.raises(RuntimeError, match="DataLoader timed out after 0.5 seconds"):
        next(it)


@pytest.mark.parametrize("worker_method", METHODS)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("how", ["exhaust", "break", "del", "gc", "consumer_error", "keyboard_interrupt"])
def test_every_way_to_stop_leaves_nothing_running(worker_method, persistent, how):
    loader = loader_of(toy.RangeDataset(40), batch_size=2, num_workers=2, worker_method=worker_method,
                               persistent_workers=persistent)
    if how == "exhaust":
        assert len(list(loader)) == 20
    elif how == "break":
        for i, _ in enumerate(loader):
            if i == 3:
                break
    elif how in ("del", "gc"):
        it = iter(loader)
        next(it)
        if how == "gc":
            it.cycle = it  # a reference cycle: only the garbage collector can free it
        del it
    elif how == "consumer_error":
        with pytest.raises(ZeroDivisionError):
            for _ in loader:
                _ = 1 / 0
    else:
        with pytest.raises(KeyboardInterrupt):
            for i, _ in enumerate(loader):
                if i == 2:
                    raise KeyboardInterrupt
    del loader  # persistent workers live as long as their loader
    gc.collect()
    # the no_leaks fixture now checks every worker is gone within 5 s


SCRIPT = textwrap.dedent("""
    import json, multiprocessing, os, signal, sys, time
    import minidl
    from minidl_course import toy

    # The guard: under spawn or forkserver (Linux's default from Python 3.14) workers import this file.
    if __name__ == "__main__":
        worker_method, persistent, ending = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
        loader = minidl.DataLoader(toy.SlowDataset(1000, delay=0.01), batch_size=2, num_workers=2,
                                   worker_method=worker_method, persistent_workers=persistent,
                                   collate_fn=minidl.numpy_collate)
        it = iter(loader)
        next(it)
        # The workers this process started (under forkserver they are the fork server's children, not ours).
        print(json.dumps([p.pid for p in multiprocessing.active_children()]), flush=True)
        if ending == "sigint":
            # A process started in the background by a shell inherits SIGINT ignored, and Python then leaves it
            # so: Ctrl-C's handler is put back by hand, as an interactive session has it.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in it:
                    pass
            except KeyboardInterrupt:
                del it
                print("interrupted", flush=True)
        # else: fall off the end of the script while the iterator is alive and mid-epoch
""")


@pytest.mark.parametrize("worker_method", METHODS)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("ending", ["exit", "sigint"])
def test_interpreter_exit_while_iterating_does_not_hang(worker_method, persistent, ending, tmp_path):
    import psutil

    script = tmp_path / "iterate_and_exit.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, str(script), worker_method, "1" if persistent else "0", ending],
                          capture_output=True, text=True, timeout=45, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    if ending == "sigint":
        assert lines[-1] == "interrupted"
    worker_pids = json.loads(lines[0])
    assert worker_method == "thread" or len(worker_pids) >= 2
    for pid in worker_pids:  # orphans would have been re-parented and still be running
        try:
            p = psutil.Process(pid)
            assert not p.is_running() or p.status() == "zombie" and p.ppid() != os.getpid(), f"pid {pid} survived"
        except psutil.NoSuchProcess:
            pass


def test_a_forked_child_dropping_an_inherited_iterator_leaves_its_parents_workers_alone():
    # A process forked while an iterator is alive inherits the object but not the workers: when the
    # child drops it, __del__ must not try to shut down (join, terminate) processes it doesn't own.
    loader = loader_of(toy.RangeDataset(20), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what __del__ raised, if anything, and leave at once
        os.close(read_end)
        raised = []
        sys.unraisablehook = lambda hook_args: raised.append(repr(hook_args.exc_value))
        del it  # the child's only reference: __del__ runs here
        gc.collect()
        os.write(write_end, json.dumps(raised).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        raised = json.loads(f.read())
    os.waitpid(pid, 0)
    assert raised == []
    assert all(w.is_alive() for w in it._workers)  # the parent's workers still serve the parent
    assert len(list(it)) == 9


def test_a_worker_is_joined_when_it_exits_though_a_process_it_started_holds_its_sentinel(tmp_path):
    # A spawned worker inherits its end of the sentinel pipe, and a process it starts keeps it open after the worker
    # exits: torch_shm_manager does so under the file_system sharing strategy (a Mac's). join() alone would wait out
    # its whole timeout; the loader's join_worker must return once the worker has gone (pytest-timeout ends a wait).
    import multiprocessing.connection
    import signal
    import time

    pid_file = tmp_path / "pid"
    holder = ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 600"]
    worker = multiprocessing.get_context("spawn").Process(target=subprocess.Popen, args=(holder,),
                                                          kwargs={"close_fds": False})
    worker.start()
    try:
        minidl._utils.join_worker(worker, timeout=3600)
        assert worker.exitcode == 0
        assert multiprocessing.connection.wait([worker.sentinel], timeout=0) == []  # its pipe is held open still
    finally:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
