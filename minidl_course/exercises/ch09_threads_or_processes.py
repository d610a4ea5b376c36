"""Checker for exercise ch09: threads or processes for two workloads, as ``time_methods`` measures them."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from minidl.dataloader import DataLoader
from minidl.dataset import Dataset
from minidl_course import toy
from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, _short, call, first_hint

METHODS = ("multiprocessing", "thread")
WORKLOADS = ("python_loop", "sleep_numpy")
BAND = 1.15  # when the slower one takes less than BAND x the faster one's time, either answer is accepted
ROUNDS = 3
CLOCK_HINT = ("time each run_epoch(method) call with time.perf_counter() just before and just after it, every round, "
              "and return those times: the checker clocks the same calls, and a made-up or reused number won't match.")
STANDIN_SECONDS = {"multiprocessing": 0.08, "thread": 0.04}  # the stand-in's epoch times: threads twice as fast
WHY = {  # why the usual answer holds, where this machine measured it too
    ("python_loop", "multiprocessing"): "a pure-Python loop holds the GIL, so two threads take turns on one core; "
                                        "two processes each have their own interpreter and GIL.",
    ("sleep_numpy", "thread"): "sleeping (like reading a file) and NumPy release the GIL, so threads overlap as well "
                               "as processes do, without starting processes or sending arrays between them."}


class PythonLoopDataset(toy.RangeDataset):
    """Item ``i``: ``(i, s)``, s a sum computed by a pure-Python loop of ``work`` steps (about 1 ms per 20,000)."""

    def __init__(self, n: int = 32, work: int = 250_000) -> None:
        self.n, self.work = n, work

    def __getitem__(self, index: int) -> tuple[int, int]:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} items")
        s = 0
        for k in range(self.work):
            s = (s + k * index) % 1_000_003
        return index, s


class SleepNumpyDataset(toy.RangeDataset):
    """Item ``i``: a (64, 64) float32 array of ``i``, after ``wait`` seconds asleep (a read, say): no GIL held."""

    def __init__(self, n: int = 48, wait: float = 0.004) -> None:
        self.n, self.wait = n, wait

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} items")
        time.sleep(self.wait)
        return np.full((64, 64), index, dtype=np.float32) * np.float32(1.5)


def make_datasets() -> dict[str, Dataset]:
    """The two workloads, by name, at the sizes the checker uses."""
    return {"python_loop": PythonLoopDataset(), "sleep_numpy": SleepNumpyDataset()}


def epoch(dataset: Dataset, worker_method: str, num_workers: int = 2) -> None:
    """One epoch of ``minidl.DataLoader(dataset, batch_size=4, num_workers=2, worker_method=...)``, workers started."""
    with warnings.catch_warnings(action="ignore"):
        for _ in DataLoader(dataset, batch_size=4, num_workers=num_workers, worker_method=worker_method):
            pass


class Measured(harness.Rounds):
    """``{workload: {method: [seconds per round]}}`` as your time_methods measured it, and ``problem``."""

    def verdict(self, workload: str) -> tuple[str, float, list[float]]:
        """The faster method; the other's median time over its (1.0: a tie), and round by round (below 1: disagrees)."""
        medians = {m: statistics.median(self[workload][m]) for m in METHODS}
        best, other = sorted(METHODS, key=medians.get)
        return best, medians[other] / medians[best], harness.Rounds(self[workload]).ratios(other, best)

    def refuses(self, workload: str, answer: str) -> bool:
        """Whether ``judge`` refuses ``answer``: a clear gap, in the median and every round, the other way."""
        best, gap, rounds = self.verdict(workload)
        return min(gap, *rounds) >= BAND and answer != best


def timed(time_methods: Callable, run: Callable[[str], Any], rounds: int, case: str) -> tuple[Any, Any, str]:
    """Your ``time_methods`` on a Stopwatch of ``run``: what it returned, as ``{method: [seconds]}`` or None, and a
    problem: where it first left the checker's clock ("" if nowhere)."""
    watch = harness.Stopwatch(run)
    got = call(time_methods, watch, rounds, what="time_methods", case=case)
    ok = isinstance(got, Mapping) and set(got) == set(METHODS)
    seconds = {m: harness.positive_numbers(got[m], rounds) for m in METHODS} if ok else {}
    if not ok or None in seconds.values():
        return got, None, ""
    for method, yours in seconds.items():
        ours = watch.seconds(method)
        if (r := harness.off_the_clock(yours, ours)) is not None:
            took = (f"took {ours[r - len(yours)]:.3f} s" if len(ours) >= len(yours) else
                    f"was made {len(ours)} times for {len(yours)} rounds")
            return got, seconds, (f"your time_methods says round {r + 1} of {method!r} took {yours[r]:.3f} s, "
                                  f"but the run_epoch({method!r}) call behind it {took} on the checker's clock")
    return got, seconds, ""


def measure(time_methods: Callable[[Callable[[str], Any], int], Any], rounds: int = ROUNDS,
            runs: Mapping[str, Callable[[str], Any]] | None = None) -> Measured:
    """Your ``time_methods`` on each workload's ``run_epoch`` (an epoch of both datasets by default)."""
    runs = runs or {name: (lambda method, d=dataset: epoch(d, method)) for name, dataset in make_datasets().items()}
    measured = Measured()
    for name, run in runs.items():
        got, measured[name], off = timed(time_methods, run, rounds, name)
        if measured[name] is None:
            raise AssertionError(f"your time_methods returned {_short(got)} for {name}: it should return "
                                 f"{{method: [seconds of each round]}}, as it did for the stand-in")
        measured.problem = measured.problem or (off and f"{name}: {off}")
    return measured


def check_choice(time_methods: Callable[[Callable[[str], Any], int], Any], faster: Any,
                 measure: Callable[[Callable], Measured] = measure) -> Measured:
    """Check ch09: ``time_methods(run_epoch, rounds)`` on a stand-in, then each workload; ``faster``, what it found."""
    def report(measured: Measured) -> str:
        return "\n".join(f"Measured by your time_methods, {name}: "
                         + ", ".join(f"{m} {statistics.median(measured[name][m]) * 1e3:.0f} ms" for m in METHODS)
                         + f" per epoch (median of {len(measured[name][METHODS[0]])} rounds)" for name in WORKLOADS)
    def judge_again(measured: Measured, checks: _Checks) -> None:  # the load may have changed since your cell ran
        if not measured.problem and any(measured.refuses(name, faster[name]) for name in WORKLOADS):
            print("Your answer differs from this measurement, so the checker measures once more:")
            print(report(measured := measure(time_methods)))
        judge(faster, measured, checks)
    return harness.measure_then_judge(
        [time_methods], lambda checks: (check_answer_shape(faster, checks), check_timer(time_methods, checks)),
        lambda: measure(time_methods), report, judge_again)


def check_timer(time_methods: Callable[[Callable[[str], Any], int], Any], checks: _Checks) -> None:
    """Your ``time_methods`` on a stand-in ``run_epoch`` that sleeps 80 ms for processes and 40 ms for threads."""
    case = "a stand-in run_epoch(method) that sleeps " + " and ".join(f"{s * 1e3:.0f} ms for {m!r}"
                                                                      for m, s in STANDIN_SECONDS.items())
    got, seconds, problem = timed(time_methods, lambda method: time.sleep(STANDIN_SECONDS[method]), ROUNDS, case)
    if seconds is None:
        checks.fail(case, f"time_methods(run_epoch, {ROUNDS}) should return {{method: [seconds of each round]}} for "
                    f"{list(METHODS)}, {ROUNDS} positive numbers each, but it returned {_short(got)}",
                    "one list per method, one epoch time per round, in seconds.")
    medians = {m: statistics.median(seconds[m]) for m in METHODS}
    def near(want: Callable[[str], float], scale: float = 1) -> bool:  # every median near want(method)
        return all(0.8 * want(m) <= medians[m] / scale <= 2 * want(m) for m in METHODS)
    if not near(STANDIN_SECONDS.get):
        swapped = near(lambda m: STANDIN_SECONDS[METHODS[1 - METHODS.index(m)]])
        summed = all(b - a >= 0.8 * sum(STANDIN_SECONDS.values()) for t in seconds.values() for a, b in zip(t, t[1:]))
        said = ", ".join(f"{m} {t * 1e3:.0f} ms" for m, t in medians.items())
        checks.fail(case, f"your medians are {said}", first_hint(
            "time each run_epoch(method) call alone, with time.perf_counter() just before and after it.",
            (swapped, "your times are under the wrong method: keep each epoch's time under the method that ran it."),
            (near(STANDIN_SECONDS.get, 1000), harness.MILLISECONDS),
            (summed, "each time includes the rounds before it: restart the clock just before each run_epoch call.")))
    if problem:
        checks.fail(case, f"the stand-in: {problem}", CLOCK_HINT)
    checks.passed += 1


def check_answer_shape(faster: Any, checks: _Checks) -> None:
    case, mapping = f"faster = {faster!r}", isinstance(faster, Mapping)
    if not mapping or set(faster) != set(WORKLOADS):
        checks.fail(case, f"faster should be a dict with the keys {list(WORKLOADS)}, but it is "
                    + (f"one with {list(faster)}" if mapping else type(faster).__name__),
                    "write a dict with one answer per workload under these keys: 'multiprocessing' or 'thread'.")
    for name, answer in faster.items():
        if answer not in METHODS:
            checks.fail(case, f"faster[{name!r}] should be one of {METHODS}, but it is {answer!r}", "DataLoader calls "
                        "processes worker_method='multiprocessing'." if str(answer).lower().startswith("process") else
                        "use the names DataLoader's worker_method takes.")
    checks.passed += 1


def judge(faster: Mapping[str, str], measured: Measured, checks: _Checks | None = None) -> None:
    """The verdict on each answer, from what your ``time_methods`` measured in the check alone."""
    checks = checks or _Checks()
    if measured.problem:
        checks.fail("your time_methods on the workloads, against the checker's clock", measured.problem, CLOCK_HINT)
    for name in WORKLOADS:
        best, gap, rounds = measured.verdict(name)
        if gap < BAND:
            print(f"{name}: the two are within {BAND}x of each other here ({gap:.2f}x), so either answer is accepted")
        elif min(rounds) < BAND:  # a busy machine: one round says otherwise, or nearly; no verdict to hold you to
            print(f"{name}: {best} was faster by {gap:.2f}x in the median, but your rounds here range from "
                  f"{min(rounds):.2f}x to {max(rounds):.2f}x, so either answer is accepted (on an idle machine the "
                  "rounds agree)")
        elif faster[name] != best:
            checks.fail(f"{name}: you answered {faster[name]!r}; your time_methods measured {best!r} faster by "
                        f"{gap:.2f}x", f"{faster[name]!r} was {gap:.2f}x slower than {best!r}", WHY.get((name, best), (
                            f"your time_methods measured {best!r} faster in every round: answer what this machine "
                            "measured, not what you expected (processes lose where cores are few or busy)")))
        checks.passed += 1
