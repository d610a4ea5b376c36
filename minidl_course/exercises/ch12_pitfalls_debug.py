"""Checkers for exercise ch12, three loaders to debug: copy-on-read, a hang at fork, and how many workers."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from minidl.dataloader import DataLoader
from minidl.dataset import Dataset
from minidl.worker import get_worker_info
from minidl_course import osfacts
from minidl_course.cores import core_count, worker_sweep
from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, call, first_hint, yours
from minidl_course.toy import RangeDataset, SlowDataset

# --- 1. copy-on-read --------------------------------------------------------------------------------
ITEMS = 1_000_000
LEAK_FRACTION, LEAK_FLOOR_MB = 0.3, 2.0  # your workers' growth must be under 30% of ListDataset's, or under 2 MB
LeakMeasured = namedtuple("LeakMeasured", "yours buggy")  # the median worker's growth over an epoch, in MB


def item_value(index: int) -> float:
    return index * 0.5


class ListDataset(Dataset):
    """The buggy dataset: ``n`` Python float objects in a list."""
    def __init__(self, n: int = ITEMS) -> None:
        self.items = [item_value(i) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> float:
        return self.items[index]


def worker_growth(dataset: Dataset, num_workers: int = 2, batch_size: int = 5000) -> list[float]:
    """Each worker's growth in private memory (USS: no other process moves it), in MB, over an epoch, forked."""
    def collate(batch: list[float]) -> tuple[int, int]:  # in the worker: its id and its private memory
        if (size := osfacts.uss_bytes()) is None:
            raise OSError(osfacts.uss().line())
        return getattr(get_worker_info(), "id", -1), size
    sizes: dict[int, list[int]] = {}
    with warnings.catch_warnings(action="ignore"):  # fork beside threads: the point of part 2, not of this one
        for worker, size in DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate,
                                       multiprocessing_context="fork"):
            sizes.setdefault(worker, []).append(size)
    return [(s[-1] - s[0]) / 2**20 for _, s in sorted(sizes.items())]


def measure_leak(dataset_cls: Callable[[int], Dataset], n: int = ITEMS) -> LeakMeasured:
    """Build both datasets before the workers fork, run an epoch of each, and take the median worker's growth."""
    return LeakMeasured(statistics.median(worker_growth(dataset_cls(n))),
                        statistics.median(worker_growth(ListDataset(n))))


def check_no_leak(dataset_cls: Callable[[int], Dataset],
                  measure: Callable[[Callable], LeakMeasured] = measure_leak) -> LeakMeasured:
    """Check part 1: ``dataset_cls(n)`` gives ListDataset's items, and its workers' memory does not grow like it."""
    return harness.measure_then_judge(
        [dataset_cls], lambda checks: check_items(dataset_cls, checks), lambda: measure(dataset_cls),
        lambda m: (f"Measured: over one epoch of {ITEMS:,} items with 2 forked workers, each worker's private memory "
                   f"(USS) grew by {m.yours:.1f} MB with your dataset, {m.buggy:.1f} MB with ListDataset"),
        lambda measured, checks: judge_leak(dataset_cls, measured, checks))


def check_items(dataset_cls: Callable[[int], Dataset], checks: _Checks) -> None:
    for n in (1, 7, 1000):
        case = f"{getattr(dataset_cls, '__name__', dataset_cls)}({n})"
        with yours("dataset", case):
            dataset = dataset_cls(n)
            size, got = len(dataset), [dataset[i] for i in range(n)]
        if size != n:
            checks.fail(case, f"len() should be {n}, but it is {size}")
        i = next((i for i, v in enumerate(got) if not isinstance(v, float | np.floating) or v != item_value(i)), n)
        if i < n:
            checks.fail(case, f"item {i} should be {item_value(i)!r} (a float), but it is {got[i]!r}",
                        "item i is i * 0.5, a float: np.arange(n) * 0.5 holds them all in one array.")
        checks.passed += 1


def judge_leak(dataset_cls: Any, measured: LeakMeasured, checks: _Checks) -> None:
    """The verdict on part 1, from the measurement alone (and a small dataset's attributes, for the hint)."""
    limit = max(LEAK_FRACTION * measured.buggy, LEAK_FLOOR_MB)
    if measured.yours > limit:
        values = getattr(dataset_cls(10), "__dict__", {}).values()
        checks.fail(f"worker memory growth: {measured.yours:.1f} MB with your dataset, {measured.buggy:.1f} MB with "
                    f"ListDataset", f"your workers' memory grew by more than {limit:.1f} MB", first_hint(
            "hold the items in one float64 array (np.arange(n) * 0.5): no reference counts, so reads write nothing.",
            (any(isinstance(v, np.ndarray) and v.dtype == object for v in values), "an array of dtype object holds "
             "Python objects, whose reference counts change on every read: use float64."),
            (any(isinstance(v, list | tuple) for v in values), "your dataset still reads from a Python list or tuple: "
             "read from the NumPy array, and don't keep the list.")))
    checks.passed += 1


# --- 2. a hang at fork --------------------------------------------------------------------------------
LOCK = threading.Lock()
HANG_TIMEOUT_S = 90.0  # spawn starts two fresh interpreters: a few seconds, 40 s at a load of 26 on 2 cores
EXPECTED_BATCHES = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
Outcome = namedtuple("Outcome", "status detail seconds", defaults=("", 0.0))  # status: "ok", "hang" or "error"
KEEP = "keep two worker processes: avoiding them hides the bug instead of fixing it; change how they start."


def hold_lock_forever() -> threading.Thread:
    """Start a daemon thread that holds ``LOCK`` all but half a millisecond a second (a logger on a slow disk, say)."""

    def busy() -> None:
        while True:
            with LOCK:
                time.sleep(1.0)
            time.sleep(0.0005)

    thread = threading.Thread(target=busy, name="busy-logger", daemon=True)
    thread.start()
    return thread


class LockedDataset(RangeDataset):
    """Item ``i`` is ``i``, read while holding ``LOCK`` (as code that logs, or uses a shared client, does)."""
    def __init__(self, n: int = 16) -> None:
        super().__init__(n)

    def __getitem__(self, index: int) -> int:
        with LOCK:
            return index


def _run_locked_loader(loader_kwargs: dict[str, Any]) -> None:
    """The separate process: the busy thread, then an epoch with 2 workers, forked unless ``loader_kwargs`` says."""
    multiprocessing.set_start_method("fork", force=True)
    hold_lock_forever()
    time.sleep(0.1)
    warnings.simplefilter("ignore")
    loader = DataLoader(LockedDataset(), batch_size=4, num_workers=2, **loader_kwargs)
    print("OK", json.dumps([batch.tolist() if hasattr(batch, "tolist") else batch for batch in loader]))


def run_locked_loader(loader_kwargs: Mapping[str, Any], timeout: float = HANG_TIMEOUT_S) -> Outcome:
    """``_run_locked_loader(loader_kwargs)`` in a new session: still running after ``timeout`` s, its process group
    (it and its workers) is killed."""
    command = [sys.executable, "-c", f"import json, sys; from {__name__} import _run_locked_loader; "
                                     "_run_locked_loader(json.loads(sys.argv[1]))", json.dumps(dict(loader_kwargs))]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = None, f"no epoch after {timeout:.0f} s: killed"
    finally:
        if process.poll() is None:  # it hung (or this process was interrupted)
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    seconds = time.perf_counter() - start
    if out is None:
        return Outcome("hang", err, seconds)
    if process.returncode == 0 and out.startswith("OK"):
        return Outcome("ok", out.strip(), seconds)
    return Outcome("error", (err.strip().splitlines() or [f"exit code {process.returncode}"])[-1], seconds)


def check_no_hang(loader_kwargs: Any, run: Callable[[Mapping[str, Any]], Outcome] = run_locked_loader) -> Outcome:
    """Check part 2: with ``loader_kwargs``, two workers finish an epoch of LockedDataset beside the busy thread."""
    return harness.measure_then_judge(
        [], lambda checks: check_kwargs(loader_kwargs, checks), lambda: run(loader_kwargs),
        lambda outcome: (f"Ran DataLoader(LockedDataset(), batch_size=4, num_workers=2, **{loader_kwargs!r}) in a "
                         f"separate process: {outcome.status} after {outcome.seconds:.1f} s ({outcome.detail[:80]})"),
        lambda outcome, checks: judge_hang(loader_kwargs, outcome, checks))


def check_kwargs(loader_kwargs: Any, checks: _Checks) -> None:
    case = f"loader_kwargs = {loader_kwargs!r}"
    if not isinstance(loader_kwargs, dict):
        checks.fail(case, f"loader_kwargs should be a dict, but it is {type(loader_kwargs).__name__}",
                    "a dict of DataLoader keyword arguments, e.g. {'multiprocessing_context': ...}.")
    fixed = next((key for key in ("num_workers", "dataset", "batch_size") if key in loader_kwargs), None)
    method = loader_kwargs.get("worker_method", "multiprocessing")
    checks.first(case, (fixed, f"loader_kwargs sets {fixed}, which the exercise fixes",
                        KEEP if fixed == "num_workers" else "change how workers start, not the data."),
                 (method != "multiprocessing", f"loader_kwargs sets worker_method={method!r}: no worker process "
                  "starts, so nothing is forked", KEEP))
    try:
        json.dumps(loader_kwargs)
    except TypeError:
        checks.fail(case, "loader_kwargs must be plain values (strings, numbers, booleans)",
                    "name the start method as a string: 'spawn' or 'forkserver', not a context object.")
    checks.passed += 1


def judge_hang(loader_kwargs: Mapping[str, Any], outcome: Outcome, checks: _Checks) -> None:
    """The verdict on part 2, from the outcome of the run alone."""
    context, status, detail = loader_kwargs.get("multiprocessing_context"), outcome.status, outcome.detail
    fresh = ("a forked worker copies LOCK as held, and the thread that would free it is not in the child: start "
             "workers with multiprocessing_context='spawn' (or 'forkserver'), a fresh interpreter.")
    if status != "ok" or detail != "OK " + json.dumps(EXPECTED_BATCHES):
        checks.fail(f"DataLoader(LockedDataset(), batch_size=4, num_workers=2, **{dict(loader_kwargs)!r})",
                    {"hang": "it hung: ", "error": "it failed: "}.get(status, "it finished, but with other batches: ")
                    + detail, first_hint(
            f"the epoch should give {EXPECTED_BATCHES}.",
            (status == "hang" and context in (None, "fork") and loader_kwargs.get("persistent_workers"),
             "persistent workers are still forked once, with the lock held: " + fresh),
            (status == "hang" and context == "fork", "'fork' is the start method that copies the held lock; " + fresh),
            (status == "hang", fresh),
            (status == "error" and ("timeout" in detail.lower() or "timed out" in detail.lower()),
             "a timeout turns the hang into an error; the worker is still stuck: change how the workers start."),
            (status == "error", "read the error: the arguments must be ones DataLoader accepts.")))
    checks.passed += 1


# --- 3. how many workers ------------------------------------------------------------------------------
SWEEP = worker_sweep()  # num_workers to try on this machine: 0 ... past its core count (0-4 on 2 cores)
TOLERANCE = 1.3  # any num_workers whose epoch (in your sweep) is within this factor of the fastest is accepted
SWEEP_FACTOR = 1.1  # each time in your sweep within this factor (and 5 ms) of the median of your latest epochs
CLOCK_HINT = ("time the epoch you run: start = time.perf_counter() just before sweep_epoch(w, dataset), with the w "
              "you were given, and return time.perf_counter() - start just after it (seconds, not a number typed in).")
MEDIANS = "keep the medians your timer measured, {w: statistics.median(times[w]) for w in SWEEP}, not numbers typed in"


class DecodeDataset(SlowDataset):
    """Item ``i``: ``wait`` seconds of waiting (a read), then ``work`` steps of Python (a decode that holds the GIL)."""
    def __init__(self, n: int = 64, wait: float = 0.006, work: int = 15_000) -> None:
        super().__init__(n, delay=wait)
        self.work = work

    def __getitem__(self, index: int) -> int:
        super().__getitem__(index)  # the wait, and a check that index is in range
        s = 0
        for k in range(self.work):
            s = (s + k * index) % 65_521
        return s


EPOCHS: list[tuple[int, float]] = []  # (num_workers, seconds) of every sweep_epoch, on the checker's clock


def sweep_epoch(num_workers: int, dataset: Dataset | None = None) -> None:
    """An epoch of ``DecodeDataset``, batch_size 4, ``num_workers`` forked (spawn would time interpreter starts; Windows
    has only spawn), noted in ``EPOCHS``."""
    start = time.perf_counter()
    context = "fork" if num_workers > 0 and "fork" in multiprocessing.get_all_start_methods() else None
    with warnings.catch_warnings(action="ignore"):  # more workers than cores, on purpose; fork beside threads
        for _ in DataLoader(dataset or DecodeDataset(), batch_size=4, num_workers=num_workers,
                            multiprocessing_context=context):  # torch refuses a context without workers
            pass
    EPOCHS.append((num_workers, time.perf_counter() - start))


def logged(epochs: Sequence[tuple[int, float]]) -> dict[int, list[float]]:
    return {w: [s for n, s in epochs if n == w] for w in SWEEP}


def measure_sweep(time_epoch: Callable[[int], Any], rounds: int = 1,
                  sweep: Sequence[int] | None = None) -> harness.Rounds:
    """``time_epoch(w)`` over ``sweep``, ``rounds`` times; ``problem``: a call off the clock or leaving workers."""
    measured = harness.Rounds({w: [] for w in (SWEEP if sweep is None else sweep)})
    for w in [w for _ in range(rounds) for w in measured]:
        k, before = len(EPOCHS), set(multiprocessing.active_children())
        got = harness.as_number(call(time_epoch, w, what="time_epoch", case=f"time_epoch({w})"))
        ours = next((s for n, s in reversed(EPOCHS[k:]) if n == w), None)  # None: it ran no epoch of w
        alive = [p for p in multiprocessing.active_children() if p not in before and (p.join(2) or p.is_alive())]
        measured[w].append(np.nan if got is None else got)
        returned = "no number" if got is None else f"{got:.3f} s"
        measured.problem = measured.problem or first_hint(
            "", (ours is None, f"time_epoch({w}) returned {returned}, but it ran no sweep_epoch({w}, ...)"),
            (harness.off_the_clock([got or 0.0], [ours or 0.0]) is not None, f"time_epoch({w}) returned {returned}, "
             f"but the sweep_epoch({w}, ...) it ran took {ours or 0.0:.3f} s on the checker's clock" + (
                 f": {harness.MILLISECONDS}" if got and harness.close(got / 1000, ours or 0.0, 1.25) else "")),
            (alive, f"time_epoch({w}) left {len(alive)} worker process(es) running after it returned: read an epoch "
             "to its end (or delete its iterator), so its workers exit"))
    return measured


def check_num_workers(num_workers: Any, sweep: Any, time_epoch: Callable[[int], float],
                      measure: Callable[[], harness.Rounds] | None = None) -> harness.Rounds:
    """Check part 3: ``sweep`` your epochs' medians, ``num_workers`` near its fastest, ``time_epoch`` on the clock."""
    yours = logged(list(EPOCHS))  # your notebook's epochs, before the checker runs any
    def report(measured: harness.Rounds) -> str:
        return ("Your notebook's epochs, on the checker's clock (latest 3): " + "; ".join(
            f"{w}: " + ", ".join(f"{s * 1e3:.0f}" for s in yours[w][-3:]) + " ms" for w in SWEEP)
            + ". Your time_epoch, run once more by the checker: "
            + ", ".join(f"{w}: {t[0] * 1e3:.0f} ms" for w, t in measured.items()))
    return harness.measure_then_judge(
        [], lambda checks: check_answers(num_workers, sweep, time_epoch, checks),
        measure or (lambda: measure_sweep(time_epoch)), report,
        lambda m, checks: judge_num_workers(num_workers, sweep, m, checks, yours))


def check_answers(num_workers: Any, sweep: Any, time_epoch: Any, checks: _Checks) -> None:
    """Your sweep and choice as values."""
    case = f"num_workers = {num_workers!r}, sweep = {sweep!r}"
    if not isinstance(sweep, dict) or sorted(sweep) != sorted(SWEEP):
        checks.fail(case, f"sweep should be a dict with one epoch time per num_workers in SWEEP, {SWEEP}",
                    "keep the sweep you ran and plotted: {num_workers: median seconds}.")
    if harness.positive_numbers(list(sweep.values())) is None:
        checks.fail(case, "every time in sweep should be a positive number of seconds", MEDIANS + ".")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int | np.integer) or num_workers not in SWEEP:
        checks.fail(case, f"num_workers should be one of the values you swept, {SWEEP}, but it is {num_workers!r}",
                    "choose from what you measured, not from a rule of thumb.")
    if not callable(time_epoch):
        checks.fail("time_epoch", f"time_epoch should be a function, but it is {time_epoch!r}", CLOCK_HINT)
    checks.passed += 1


def judge_num_workers(num_workers: int, sweep: Mapping[int, float], measured: harness.Rounds, checks: _Checks,
                      yours: Mapping[int, list[float]]) -> None:
    """Part 3: your timer against the checker's clock, your sweep against your epochs, your choice against it."""
    if measured.problem:
        checks.fail("your time_epoch, run by the checker", measured.problem, CLOCK_HINT)
    for w in SWEEP:
        epochs, value = yours.get(w, []), float(sweep[w])
        if not epochs:
            checks.fail(f"your sweep says {w} workers took {value!r} s", f"no sweep_epoch({w}, ...) ran in your "
                        "notebook", "time each w with your time_epoch, which runs sweep_epoch: it notes each epoch.")
        medians = harness.latest_medians(epochs, 2)
        if harness.typed(value) or not any(abs(value - m) <= m * (SWEEP_FACTOR - 1) + 5e-3 for m in medians):
            checks.fail(f"your sweep says {w} workers took {value!r} s", f"the sweep_epoch({w}, ...) epochs your "
                        "notebook ran took " + ", ".join(f"{s:.4f}" for s in epochs[-6:]) + " s: it is not the median "
                        "of the latest 2 or more", MEDIANS + "; if you ran epochs since, run your sweep cell again.")
    checks.passed += 1
    best = min(sweep, key=sweep.get)
    if sweep[num_workers] > sweep[best] * TOLERANCE:
        checks.fail(f"num_workers={num_workers}: your sweep says {sweep[num_workers] * 1e3:.0f} ms, the fastest "
                    f"({best} workers) {sweep[best] * 1e3:.0f} ms", f"{num_workers} workers was "
                    f"{sweep[num_workers] / sweep[best]:.2f}x slower than {best}", first_hint(
            f"your own sweep says {best} workers was fastest: pick it, or the fewest within {TOLERANCE}x of it.",
            (num_workers == max(SWEEP), f"more workers than cores ({core_count()} here) don't help once the cores are "
             f"busy, and each costs a start and memory: choose the fastest, or the fewest within {TOLERANCE}x."),
            (num_workers == 0, "with no workers, the waiting and the Python work never overlap: workers pay here.")))
    checks.passed += 1
