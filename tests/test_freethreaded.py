"""minidl on a free-threaded (no-GIL) CPython: the GIL stays off, and thread workers give the right batches.

`make test-ft` runs this file under .venv-ft (scripts/ft.sh builds or finds CPython 3.13t). Under a regular
build, the checks of the GIL's state skip with a reason; the batch checks run under both, since thread
workers must give the same batches whether or not they really run in parallel. No speed is asserted.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import sysconfig
import threading

import numpy as np
import pytest

import minidl
from minidl_course import toy

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
needs_free_threading = pytest.mark.skipif(
    not FREE_THREADED, reason="needs a free-threaded (no-GIL) CPython build: make test-ft"
)


def gil_enabled() -> bool:
    """The GIL's state now; interpreters before 3.13 have no sys._is_gil_enabled and always have a GIL."""
    return getattr(sys, "_is_gil_enabled", lambda: True)()


def collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


# The CPU-bound, pure-Python dataset of the course: with a GIL, thread workers take turns on it;
# without one they run at once.
CollatzDataset = toy.CpuBoundDataset


def expected_total(dataset: toy.CpuBoundDataset, index: int) -> int:
    return dataset[index][1]


# --- the GIL -----------------------------------------------------------------------------------------


def test_gil_state_matches_the_build():
    if FREE_THREADED and os.environ.get("PYTHON_GIL") == "1":
        pytest.skip("PYTHON_GIL=1 turns the GIL back on for this run")
    # Everything the test session imported so far (minidl, numpy, pytest and its plugins) is in.
    assert gil_enabled() is not FREE_THREADED


@needs_free_threading
@pytest.mark.parametrize("modules", ["minidl", "minidl, numpy", "minidl, numpy, psutil, PIL.Image, tqdm"])
def test_gil_stays_off_after_imports(modules):
    # In a fresh interpreter with the default settings: an extension module that doesn't declare
    # free-threading support turns the GIL back on when imported (with a RuntimeWarning).
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    code = f"import sys\nimport {modules}\nprint(sys._is_gil_enabled())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"], f"importing {modules} re-enabled the GIL: {proc.stderr}"


@needs_free_threading
def test_gil_can_be_forced_back_on():
    # -X gil=1 is the escape hatch for a package that isn't thread-safe yet; the build must honour it.
    code = "import sys, minidl, numpy; print(sys._is_gil_enabled())"
    proc = subprocess.run([sys.executable, "-X", "gil=1", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True"]


# --- thread workers ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [2, 4])
def test_thread_workers_give_the_right_batches(num_workers):
    data = CollatzDataset(48)
    loader = minidl.DataLoader(data, batch_size=4, num_workers=num_workers, worker_method="thread",
                               collate_fn=minidl.numpy_collate)
    batches = list(loader)
    assert len(batches) == 12
    for k, (idx, totals, workers) in enumerate(batches):
        assert idx.tolist() == list(range(4 * k, 4 * k + 4))  # in order, none lost or repeated
        assert totals.tolist() == [expected_total(data, int(i)) for i in idx]
        assert workers.tolist() == [k % num_workers] * 4  # round-robin: batch k goes to worker k % n
    assert minidl.get_worker_info() is None  # the workers' WorkerInfo is thread-local


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.timeout(60)
def test_thread_workers_match_the_single_process_loader_over_epochs():
    data = CollatzDataset(30, work=200)

    def epochs(**kwargs):
        loader = minidl.DataLoader(data, batch_size=4, shuffle=True, generator=np.random.default_rng(7),
                                   collate_fn=minidl.numpy_collate, **kwargs)
        return [[(b[0].tolist(), b[1].tolist()) for b in loader] for _ in range(3)]

    reference = epochs()  # the sampler shuffles in the main thread, so workers must not change the order
    assert epochs(num_workers=3, worker_method="thread", prefetch_factor=4) == reference
    # Persistent workers draw their base seed from the generator once, not every epoch (as torch does),
    # so only the first epoch's order is the same; every epoch still has every item, right.
    persistent = epochs(num_workers=2, worker_method="thread", persistent_workers=True)
    assert persistent[0] == reference[0]
    for epoch in persistent:
        items = sorted((i, t) for idx, totals in epoch for i, t in zip(idx, totals))
        assert items == [(i, expected_total(data, i)) for i in range(30)]


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.timeout(60)
def test_two_thread_loaders_at_once():
    # Two loaders' workers (4 threads) hammering the same dataset object from two consumer threads.
    data = CollatzDataset(40, work=100)
    expected = [expected_total(data, i) for i in range(40)]
    results, errors = {}, []

    def consume(name):
        try:
            loader = minidl.DataLoader(data, batch_size=5, num_workers=2, worker_method="thread",
                                       collate_fn=minidl.numpy_collate)
            results[name] = [t for b in loader for t in b[1].tolist()]
        except BaseException as e:  # reported below, in the test's own thread
            errors.append(e)

    consumers = [threading.Thread(target=consume, args=(name,)) for name in ("a", "b")]
    for t in consumers:
        t.start()
    for t in consumers:
        t.join(50)
    assert not errors, errors
    assert results == {"a": expected, "b": expected}


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("how", ["exhaust", "break", "del", "consumer_error", "worker_error"])
def test_thread_workers_stop_every_way(how, persistent):
    # tests/test_shutdown.py covers this with default_collate (torch tensors); here with NumPy, so it runs
    # under the free-threaded build too, where nothing serialises the workers' exits.
    data = CollatzDataset(24, work=50)
    if how == "worker_error":
        data = toy.FailingDataset(24, bad_index=9, exc_type=ValueError)  # in batch 4, so worker 0's
    loader = minidl.DataLoader(data, batch_size=2, num_workers=2, worker_method="thread",
                               persistent_workers=persistent, collate_fn=minidl.numpy_collate)
    if how == "exhaust":
        assert len(list(loader)) == 12
    elif how == "break":
        for i, _ in enumerate(loader):
            if i == 3:
                break
    elif how == "del":
        it = iter(loader)
        next(it)
        del it
    elif how == "consumer_error":
        with pytest.raises(RuntimeError, match="consumer bug"):
            for _ in loader:
                raise RuntimeError("consumer bug")
    else:
        with pytest.raises(ValueError, match="Caught ValueError in DataLoader worker thread 0"):
            list(loader)
    del loader  # persistent workers live as long as their loader
    gc.collect()  # the no_leaks fixture then waits up to 5 s for every worker thread to end
