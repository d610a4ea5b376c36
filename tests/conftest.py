"""Shared fixtures: torch as the oracle, and a check that nothing a loader started outlives it."""

from __future__ import annotations

import os
import time

import pytest
from loadertools import alive_children, worker_threads


def wait_until_clean(timeout: float = 5.0) -> tuple[list, list]:
    """Wait up to ``timeout`` s for worker processes and threads to go; return what is left."""
    deadline = time.monotonic() + timeout
    while True:
        procs, threads = alive_children(), worker_threads()
        if (not procs and not threads) or time.monotonic() > deadline:
            return procs, threads
        time.sleep(0.05)


def shm_segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(("torch_", "psm_", "mp-"))}
    except FileNotFoundError:
        return set()


@pytest.fixture
def no_leaks():
    """Fails the test if a worker process, worker thread or shm segment survives it by 5 s."""
    import gc

    before_shm = shm_segments()
    yield
    gc.collect()
    procs, threads = wait_until_clean(5.0)
    assert not procs, f"worker processes survived: {procs}"
    assert not threads, f"worker threads survived: {threads}"
    # /dev/shm is the machine's, not this process's: another program's short-lived segments come and go in it.
    # A leak is a new segment still there after 5 s, present in every look meanwhile.
    deadline = time.monotonic() + 5.0
    left = shm_segments() - before_shm
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left &= shm_segments()
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
