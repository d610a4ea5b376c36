"""Checkers for exercise ch12: three loaders to debug, each checked by measuring or running it safely.

1. **Copy-on-read.** ``ListDataset`` keeps its items as a Python list of float objects. A forked worker shares
   the parent's memory until it writes to a page, and merely reading a Python object writes to it (its reference
   count), so each worker ends up with a private copy of every page it read: its memory grows as it works. The
   learner writes a dataset holding one NumPy array instead; ``check_no_leak`` measures each worker's PSS growth
   over an epoch for theirs and for ``ListDataset``.
2. **A hang at fork.** A background thread holds ``LOCK`` most of the time, and ``LockedDataset`` takes it for
   every item. A forked worker inherits the lock *held*, with no thread left to release it, and waits forever.
   The learner chooses DataLoader arguments that avoid it; ``check_no_hang`` runs the loader in a separate
   process under a timeout and kills it (workers included) if it hangs.
3. **How many workers.** The learner sweeps ``num_workers`` over ``SWEEP`` for ``DecodeDataset``, plots epoch
   time, and picks one; ``check_num_workers`` runs its own sweep and accepts any choice within ``TOLERANCE`` of
   its fastest.
"""

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from minidl.course.exercises._common import _Checks
from minidl.course.exercises._measure import interleaved, measure_then_judge
from minidl.dataloader import DataLoader
from minidl.dataset import Dataset
from minidl.worker import get_worker_info

# --- 1. copy-on-read --------------------------------------------------------------------------------

ITEMS = 1_000_000
LEAK_FRACTION = 0.3  # your dataset's worker growth must be under this part of ListDataset's
LEAK_FLOOR_MB = 2.0  # ... or under this many MB, whichever is larger


def item_value(index: int) -> float:
    """What item ``index`` of every dataset in part 1 is: ``index * 0.5``."""
    return index * 0.5


class ListDataset(Dataset):
    """The buggy dataset: ``n`` Python float objects in a list (``item_value(i)`` for each ``i``)."""

    def __init__(self, n: int = ITEMS) -> None:
        self.items = [item_value(i) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> float:
        return self.items[index]


def pss_bytes() -> int:
    """This process's proportional set size: private pages, plus shared pages divided by how many share them."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return psutil.Process().memory_full_info().pss


def memory_collate(batch: list[float]) -> tuple[int, int, float]:
    """Runs in the worker: ``(worker id, the worker's PSS now, sum of the batch)``; the sum keeps the work real."""
    info = get_worker_info()
    return (-1 if info is None else info.id), pss_bytes(), float(sum(batch))


def worker_growth(dataset: Dataset, num_workers: int = 2, batch_size: int = 5000) -> list[float]:
    """Each worker's PSS growth in MB, from its first batch to its last, over one epoch with forked workers."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=memory_collate,
                        multiprocessing_context="fork")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fork with threads around: the point of part 2, not of this one
        for worker, pss, _ in loader:
            first.setdefault(worker, pss)
            last[worker] = pss
    return [(last[w] - first[w]) / 2**20 for w in sorted(first)]


@dataclass(frozen=True)
class LeakMeasured:
    """Median worker PSS growth (MB) over an epoch, for your dataset and for ListDataset."""

    yours: float
    buggy: float


def measure_leak(dataset_cls: Callable[[int], Dataset], n: int = ITEMS) -> LeakMeasured:
    """Build both datasets before the workers fork, run an epoch of each, and take the median worker's growth."""
    yours = statistics.median(worker_growth(dataset_cls(n)))
    buggy = statistics.median(worker_growth(ListDataset(n)))
    return LeakMeasured(yours, buggy)


def check_no_leak(dataset_cls: Callable[[int], Dataset],
                  measure: Callable[[Callable], LeakMeasured] = measure_leak) -> LeakMeasured:
    """Check part 1: ``dataset_cls(n)`` gives ListDataset's items, and its workers' memory does not grow like it.

    Prints what it measured. Raises AssertionError at the first problem, with a hint.
    """
    return measure_then_judge(
        [dataset_cls], lambda checks: check_items(dataset_cls, checks), lambda: measure(dataset_cls),
        lambda measured: (f"Measured: over one epoch of {ITEMS:,} items with 2 forked workers, each worker's PSS "
                          f"grew by {measured.yours:.1f} MB with your dataset, {measured.buggy:.1f} MB with "
                          "ListDataset"),
        lambda measured, checks: judge_leak(dataset_cls, measured, checks))


def check_items(dataset_cls: Callable[[int], Dataset], checks: _Checks) -> None:
    for n in (1, 7, 1000):
        case = f"{getattr(dataset_cls, '__name__', dataset_cls)}({n})"
        try:
            dataset = dataset_cls(n)
            got_len = len(dataset)
            got = [dataset[i] for i in range(n)]
        except Exception as e:
            e.add_note(f"(raised by your dataset, for {case})")
            raise
        if got_len != n:
            checks.fail(case, f"len() should be {n}, but it is {got_len}")
        for i, value in enumerate(got):
            if not isinstance(value, float | np.floating) or value != item_value(i):
                checks.fail(case, f"item {i} should be {item_value(i)!r} (a float), but it is {value!r}",
                            "item i is i * 0.5, a float: np.arange(n) * 0.5 holds them all in one array.")
        checks.passed += 1


def judge_leak(dataset_cls: Any, measured: LeakMeasured, checks: _Checks | None = None) -> None:
    """The verdict on part 1, from the measurement alone (and the dataset, for the hint)."""
    checks = checks or _Checks()
    case = f"worker PSS growth: {measured.yours:.1f} MB with your dataset, {measured.buggy:.1f} MB with ListDataset"
    limit = max(LEAK_FRACTION * measured.buggy, LEAK_FLOOR_MB)
    if measured.yours > limit:
        hint = ("hold the items in one NumPy array (np.arange(n) * 0.5): its data is one block of raw bytes with no "
                "reference counts, so reading it writes nothing and the pages stay shared.")
        held = _held_containers(dataset_cls)
        if "object array" in held:
            hint = ("an array of dtype object holds pointers to Python objects, whose reference counts still change "
                    "on every read: use a float64 array.")
        elif "list" in held or "tuple" in held:
            hint = ("your dataset still reads from a Python list or tuple of float objects: read from the NumPy array "
                    "in __getitem__, and don't keep the list.")
        checks.fail(case, f"your workers' memory grew by more than {limit:.1f} MB", hint)
    checks.passed += 1


def _held_containers(dataset_cls: Any) -> set[str]:
    """What a small instance of the learner's dataset keeps in its attributes: 'list', 'tuple', 'object array'."""
    try:
        dataset = dataset_cls(10)
    except Exception:
        return set()
    kinds = set()
    for value in vars(dataset).values():
        if isinstance(value, list | tuple):
            kinds.add(type(value).__name__)
        if isinstance(value, np.ndarray) and value.dtype == object:
            kinds.add("object array")
    return kinds


# --- 2. a hang at fork --------------------------------------------------------------------------------

LOCK = threading.Lock()
HANG_TIMEOUT_S = 30.0  # spawn starts two fresh interpreters: a few seconds, more on a busy machine


def hold_lock_forever() -> threading.Thread:
    """Start a daemon thread that holds ``LOCK`` nearly all the time (a logger flushing, say), letting go briefly."""

    def busy() -> None:
        while True:
            with LOCK:
                time.sleep(0.05)
            time.sleep(0.0005)

    thread = threading.Thread(target=busy, name="busy-logger", daemon=True)
    thread.start()
    return thread


class LockedDataset(Dataset):
    """Item ``i`` is ``i``, read while holding ``LOCK`` (as code that logs, or uses a shared client, does)."""

    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        with LOCK:
            return index


def _run_locked_loader(loader_kwargs: dict[str, Any]) -> None:
    """What the separate process runs: the busy thread, then an epoch of LockedDataset with 2 workers.

    The program being debugged starts its workers with ``fork``, Linux's default up to Python 3.13, whatever
    this machine's default is: the pitfall is fork's, so only ``loader_kwargs`` may choose another start method.
    """
    multiprocessing.set_start_method("fork", force=True)
    hold_lock_forever()
    time.sleep(0.1)
    warnings.simplefilter("ignore")
    loader = DataLoader(LockedDataset(), batch_size=4, num_workers=2, **loader_kwargs)
    batches = [batch.tolist() if hasattr(batch, "tolist") else batch for batch in loader]
    print("OK", json.dumps(batches))


@dataclass(frozen=True)
class Outcome:
    """How the loader in the separate process ended: "ok", "hang" (killed at the timeout) or "error"."""

    status: str
    detail: str = ""
    seconds: float = 0.0


def run_locked_loader(loader_kwargs: Mapping[str, Any], timeout: float = HANG_TIMEOUT_S) -> Outcome:
    """Run ``_run_locked_loader(loader_kwargs)`` in a new Python process; kill it and its workers after ``timeout``.

    The process gets its own session, so a hang is ended by killing the whole process group: nothing is left
    running, and the notebook's kernel never waits longer than ``timeout``.
    """
    root = str(Path(__file__).resolve().parents[3])  # the folder holding the minidl package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", f"import json, sys; from {__name__} import _run_locked_loader; "
                                     "_run_locked_loader(json.loads(sys.argv[1]))", json.dumps(dict(loader_kwargs))]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return Outcome("hang", f"no epoch after {timeout:.0f} s: killed", time.perf_counter() - start)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    seconds = time.perf_counter() - start
    if process.returncode == 0 and out.startswith("OK"):
        return Outcome("ok", out.strip(), seconds)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return Outcome("error", lines[-1] if lines else f"exit code {process.returncode}", seconds)


EXPECTED_BATCHES = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]


def check_no_hang(loader_kwargs: Any, run: Callable[[Mapping[str, Any]], Outcome] = run_locked_loader) -> Outcome:
    """Check part 2: with ``loader_kwargs``, two workers finish an epoch of LockedDataset beside the busy thread.

    Runs it in a separate process under a timeout. Raises AssertionError with a hint if it hangs or fails.
    """
    return measure_then_judge(
        [], lambda checks: check_kwargs(loader_kwargs, checks), lambda: run(loader_kwargs),
        lambda outcome: (f"Ran DataLoader(LockedDataset(), batch_size=4, num_workers=2, **{loader_kwargs!r}) in a "
                         f"separate process: {outcome.status} after {outcome.seconds:.1f} s ({outcome.detail[:80]})"),
        lambda outcome, checks: judge_hang(loader_kwargs, outcome, checks))


def check_kwargs(loader_kwargs: Any, checks: _Checks) -> None:
    case = f"loader_kwargs = {loader_kwargs!r}"
    if not isinstance(loader_kwargs, dict):
        checks.fail(case, f"loader_kwargs should be a dict, but it is {type(loader_kwargs).__name__}",
                    "a dict of DataLoader keyword arguments, e.g. {'multiprocessing_context': ...}.")
    for key in ("num_workers", "dataset", "batch_size"):
        if key in loader_kwargs:
            checks.fail(case, f"loader_kwargs sets {key}, which the exercise fixes",
                        "keep two worker processes: avoiding workers hides the bug instead of fixing it."
                        if key == "num_workers" else "change how workers start, not the data.")
    if loader_kwargs.get("worker_method") == "thread":
        print("worker_method='thread' starts no process, so nothing is forked: accepted, though the lesson is "
              "about processes.")
    try:
        json.dumps(loader_kwargs)
    except TypeError:
        checks.fail(case, "loader_kwargs must be plain values (strings, numbers, booleans)",
                    "name the start method as a string: 'spawn' or 'forkserver', not a context object.")
    checks.passed += 1


def judge_hang(loader_kwargs: Mapping[str, Any], outcome: Outcome, checks: _Checks | None = None) -> None:
    """The verdict on part 2, from the outcome of the run alone."""
    checks = checks or _Checks()
    case = f"DataLoader(LockedDataset(), batch_size=4, num_workers=2, **{dict(loader_kwargs)!r})"
    context = loader_kwargs.get("multiprocessing_context")
    if outcome.status == "hang":
        hint = ("a forked worker starts with a copy of the parent's memory, LOCK included, taken by a thread that "
                "does not exist in the child: start workers with multiprocessing_context='spawn' (or "
                "'forkserver'), which run a fresh interpreter.")
        if context in (None, "fork"):
            if loader_kwargs.get("persistent_workers"):
                hint = "persistent workers are still forked once, with the lock held: " + hint
            elif context == "fork":
                hint = "'fork' is the start method that copies the held lock; " + hint
        checks.fail(case, f"it hung: {outcome.detail}", hint)
    if outcome.status == "error":
        hint = "read the error: the arguments must be ones DataLoader accepts."
        if "timed out" in outcome.detail.lower() or "timeout" in outcome.detail.lower():
            hint = ("a timeout turns the hang into an error, but the worker is still stuck on the copied lock: "
                    "change how the workers start.")
        checks.fail(case, f"it failed: {outcome.detail}", hint)
    if outcome.status == "ok" and "OK " + json.dumps(EXPECTED_BATCHES) != outcome.detail:
        checks.fail(case, f"it finished, but with other batches: {outcome.detail}",
                    f"the epoch should give {EXPECTED_BATCHES}.")
    checks.passed += 1


# --- 3. how many workers ------------------------------------------------------------------------------

SWEEP = (0, 1, 2, 3, 4, 6)
TOLERANCE = 1.3  # any num_workers whose epoch is within this factor of the fastest is accepted
SWEEP_ROUNDS = 3


class DecodeDataset(Dataset):
    """Item ``i``: ``wait`` seconds of waiting (a read), then ``work`` steps of Python (a decode that holds the GIL)."""

    def __init__(self, n: int = 64, wait: float = 0.006, work: int = 15_000) -> None:
        self.n, self.wait, self.work = n, wait, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} items")
        time.sleep(self.wait)
        s = 0
        for k in range(self.work):
            s = (s + k * index) % 65_521
        return s


def sweep_epoch(num_workers: int, dataset: Dataset | None = None) -> None:
    """One epoch of ``DecodeDataset`` with ``num_workers`` worker processes, batch_size 4, workers started inside."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more workers than cores, on purpose
        for _ in DataLoader(dataset or DecodeDataset(), batch_size=4, num_workers=num_workers):
            pass


def measure_sweep(rounds: int = SWEEP_ROUNDS, dataset: Dataset | None = None) -> dict[int, float]:
    """The median epoch time for each ``num_workers`` in ``SWEEP``, in interleaved rounds (of ``DecodeDataset()``
    unless another ``dataset`` is given)."""
    dataset = dataset or DecodeDataset()
    times = interleaved({w: (lambda w=w: sweep_epoch(w, dataset)) for w in SWEEP}, rounds=rounds)
    return {w: statistics.median(t) for w, t in times.items()}


def check_num_workers(num_workers: Any, sweep: Any, measure: Callable[[], dict[int, float]] = measure_sweep
                      ) -> dict[int, float]:
    """Check part 3: ``num_workers`` is fastest, or within ``TOLERANCE`` of it, in the checker's own sweep.

    ``sweep`` is your ``{num_workers: seconds}``. Prints what it measured. Raises AssertionError with a hint.
    """
    def report(measured: dict[int, float]) -> str:
        best = min(measured, key=measured.get)
        return ("Measured epoch times: " + ", ".join(f"{w}: {s * 1e3:.0f} ms" for w, s in measured.items())
                + f"; fastest num_workers={best}, and any within {TOLERANCE}x of it "
                f"({measured[best] * TOLERANCE * 1e3:.0f} ms) is accepted")

    return measure_then_judge([], lambda checks: check_sweep_answer(num_workers, sweep, checks), measure, report,
                              lambda measured, checks: judge_num_workers(num_workers, sweep, measured, checks))


def check_sweep_answer(num_workers: Any, sweep: Any, checks: _Checks) -> None:
    case = f"num_workers = {num_workers!r}, sweep = {sweep!r}"
    if not isinstance(sweep, dict) or sorted(sweep) != sorted(SWEEP):
        checks.fail(case, f"sweep should be a dict with one epoch time per num_workers in {SWEEP}",
                    "keep the sweep you ran and plotted: {num_workers: median seconds}.")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int | np.integer) or num_workers not in SWEEP:
        checks.fail(case, f"num_workers should be one of the values you swept, {SWEEP}, but it is {num_workers!r}",
                    "choose from what you measured, not from a rule of thumb.")
    checks.passed += 1


def judge_num_workers(num_workers: int, sweep: Mapping[int, float], measured: Mapping[int, float],
                      checks: _Checks | None = None) -> None:
    """The verdict on part 3, from the learner's sweep and the checker's alone."""
    checks = checks or _Checks()
    best = min(measured, key=measured.get)
    case = (f"num_workers={num_workers}: the checker measured {measured[num_workers] * 1e3:.0f} ms, the fastest "
            f"({best} workers) {measured[best] * 1e3:.0f} ms")
    if measured[num_workers] > measured[best] * TOLERANCE:
        yours = min(sweep, key=sweep.get)
        hint = (f"pick the num_workers of the lowest point of your sweep, or the fewest workers within {TOLERANCE}x "
                "of it.")
        if yours != num_workers and sweep[num_workers] > sweep[yours] * TOLERANCE:
            hint = f"your own sweep says {yours} workers was fastest ({sweep[yours]:.3f} s): choose from your data."
        elif num_workers == max(SWEEP):
            hint = ("more workers than cores don't help once the cores are busy: each one costs a process start "
                    "and memory. Choose the knee of the curve.")
        elif num_workers == 0:
            hint = "with no workers, the waiting and the Python work never overlap: workers pay here."
        checks.fail(case, f"{num_workers} workers was {measured[num_workers] / measured[best]:.2f}x slower than "
                          f"{best}", hint)
    checks.passed += 1
