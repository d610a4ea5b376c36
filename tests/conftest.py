"""Shared fixtures: torch as the oracle, and a check that nothing a loader started outlives it."""

from __future__ import annotations

import os
import time

import pytest
from loadertools import alive_children, worker_threads

from minidl_course import osfacts

# Two modules named sitecustomize (the start-method runs' and the Mac stand-in's) are loaded by Python at start-up,
# not tests: collecting both for doctests (`make unit`) would import one under the other's name.
collect_ignore = ["start_method/sitecustomize.py", "mac_standin/sitecustomize.py"]


def wait_until_clean(timeout: float = 5.0) -> tuple[list, list]:
    """Wait up to ``timeout`` s for worker processes and threads to go; return what is left."""
    deadline = time.monotonic() + timeout
    while True:
        procs, threads = alive_children(), worker_threads()
        if (not procs and not threads) or time.monotonic() > deadline:
            return procs, threads
        time.sleep(0.05)


class OwnProcesses:
    """The pids of this process and of every process ``multiprocessing`` starts from it while a test runs.

    Workers may be gone by the end of the test, so each start is recorded as it happens (``BaseProcess.start``,
    which torch's and minidl's loaders, Pools and every start method go through); live descendants are added at
    the end. No thread: a thread running while a test forks is the very pitfall notebook 12 shows.
    """

    def __init__(self) -> None:
        import multiprocessing.process

        self.pids = {os.getpid()}
        self._cls = multiprocessing.process.BaseProcess
        self._start = self._cls.start
        own = self

        def start(process):
            own._start(process)
            own.pids.add(process.pid)

        self._cls.start = start

    def stop(self) -> set[int]:
        import psutil

        self._cls.start = self._start
        try:
            self.pids.update(p.pid for p in psutil.Process().children(recursive=True))
        except psutil.Error:
            pass
        return self.pids


def shm_segments(pids) -> set[str]:
    """torch's files in /dev/shm made by ``pids`` (torch_<pid>_...): another program's are not this test's."""
    return set(osfacts.shm_files(pids) or [])


def shm_made_since(before: set[str], pids) -> set[str]:
    """The files of ``pids`` that were not there ``before`` (all of torch's files when the test began): a file an
    earlier process left is not this test's, even when a worker of the test now has that pid (pids are reused:
    pid_max may be 32,768, and a test run starts thousands of processes)."""
    return shm_segments(pids) - before


@pytest.fixture
def no_leaks():
    """Fails the test if a worker process, worker thread or shm segment of this test survives it by 5 s."""
    import gc

    before = set(osfacts.shm_files() or [])  # this process's files from earlier tests, and stale ones (shm_made_since)
    own = OwnProcesses()
    yield
    pids = own.stop()
    if alive_children() or worker_threads() or shm_made_since(before, pids):
        gc.collect()  # an iterator in a reference cycle shuts its workers down only when collected (~0.1 s a call)
    procs, threads = wait_until_clean(5.0)
    pids |= {p.pid for p in procs}
    assert not procs, f"worker processes survived: {procs}"
    assert not threads, f"worker threads survived: {threads}"
    # /dev/shm is the machine's: only files named after this test's processes count (another program's
    # torch_<pid>_... files must not fail a clean run). A file being freed may take a moment: a leak is one still
    # there after 5 s, present in every look meanwhile.
    deadline = time.monotonic() + 5.0
    left = shm_made_since(before, pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left &= shm_segments(pids)
    assert not left, f"shared memory left behind: {left}"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: skip them, visibly, where torch sees no CUDA device."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on a GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
