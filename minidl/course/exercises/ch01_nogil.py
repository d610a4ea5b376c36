"""Checker for exercise ch01: a Numba kernel that releases the GIL, and the speedup two threads get from it.

The learner writes ``collatz_steps(start, stop)``, the total number of Collatz steps of the integers
``start .. stop - 1`` (``start >= 1``), compiles it with ``numba.njit(nogil=True)``, times the same work on one
thread and split over two, and reports the speedup. The checker checks the kernel's output, checks that a
Python thread keeps running while the kernel does (the GIL really is released), measures the speedup itself
and compares.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minidl.course.exercises._common import _Checks
from minidl.course.exercises._measure import agrees, as_number, close, interleaved, measure_then_judge

KERNEL_SECONDS = 0.15  # how long one half of the timed work runs: long next to thread start, short for a checker
ROUNDS = 5
GIL_FREE_FRACTION = 0.2  # a Python thread must make progress for at least this part of the kernel's run
SPEEDUP_FACTOR = 1.3  # a reported speedup within this factor of the measured one is accepted


def collatz_steps_python(start: int, stop: int) -> int:
    """The total Collatz steps of ``start .. stop - 1``, in plain Python: the spec, slow and holding the GIL.

    >>> collatz_steps_python(1, 2), collatz_steps_python(27, 28), collatz_steps_python(1, 8)
    (0, 111, 39)
    """
    total = 0
    for n in range(start, stop):
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            total += 1
    return total


def two_threads(kernel: Callable[[int, int], Any], start: int, stop: int) -> list[Any]:
    """Run ``kernel`` on the two halves of ``start .. stop - 1`` in two threads at once; their results in order."""
    middle = (start + stop) // 2
    results: list[Any] = [None, None]

    def half(k: int, a: int, b: int) -> None:
        results[k] = kernel(a, b)

    threads = [threading.Thread(target=half, args=(0, start, middle)),
               threading.Thread(target=half, args=(1, middle, stop))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def one_thread(kernel: Callable[[int, int], Any], start: int, stop: int) -> list[Any]:
    """The same two halves as ``two_threads``, one after the other in this thread."""
    middle = (start + stop) // 2
    return [kernel(start, middle), kernel(middle, stop)]


@dataclass(frozen=True)
class Measured:
    """What the checker measured: the speedup of two threads over one (each round's), and the GIL test."""

    speedups: list[float]  # one thread's time / two threads' time, per round
    python_progress: float  # the part of the kernel's run during which a Python thread made progress
    work: int  # integers per half

    @property
    def speedup(self) -> float:
        return statistics.median(self.speedups)


def calibrate(kernel: Callable[[int, int], Any], seconds: float = KERNEL_SECONDS) -> int:
    """How many integers ``kernel`` gets through in about ``seconds`` (after a first, compiling call)."""
    kernel(1, 100)
    n = 1000
    while True:
        start = time.perf_counter()
        kernel(1, 1 + n)
        took = time.perf_counter() - start
        if took > 0.02 or n > 1 << 26:
            return max(1000, int(n * seconds / max(took, 1e-9)))
        n *= 4


def python_progress(kernel: Callable[[int, int], Any], work: int) -> float:
    """The part of one ``kernel(1, 1 + work)`` call during which this (Python) thread kept counting.

    First counts alone for 50 ms to learn its rate; then counts while a thread runs the kernel. A kernel that
    holds the GIL stops the counting for as long as it runs: the result is near 0. One that releases it: near 1
    (less when another process takes the core).
    """
    def count_while(thread: threading.Thread) -> tuple[int, float]:
        count, start = 0, time.perf_counter()
        thread.start()
        while thread.is_alive():
            count += 1
        return count, time.perf_counter() - start

    count, took = count_while(threading.Thread(target=time.sleep, args=(0.05,)))  # alone: the GIL is free
    rate = count / took
    count, took = count_while(threading.Thread(target=kernel, args=(1, 1 + work)))
    return min(1.0, count / (rate * took))


def measure(kernel: Callable[[int, int], Any], rounds: int = ROUNDS) -> Measured:
    """Time ``kernel`` on one thread and on two (interleaved rounds), and test whether it releases the GIL."""
    work = calibrate(kernel)
    progress = python_progress(kernel, work)
    if progress < GIL_FREE_FRACTION:  # it holds the GIL: two threads can't overlap, time one round only
        rounds = 1
    times = interleaved({"one": lambda: one_thread(kernel, 1, 1 + 2 * work),
                         "two": lambda: two_threads(kernel, 1, 1 + 2 * work)}, rounds=rounds, warmup=False)
    return Measured([o / t for o, t in zip(times["one"], times["two"])], progress, work)


CASES = [(1, 3), (1, 8), (1, 2), (27, 28), (2, 3), (100, 200), (1, 1000), (5000, 5001), (999, 1000), (10, 10)]


def check_nogil(kernel: Callable[[int, int], Any], speedup: Any,
                measure: Callable[[Callable], Measured] = measure) -> Measured:
    """Check ch01: the kernel's output, that it releases the GIL, and the ``speedup`` you measured.

    Prints what it measured. Raises AssertionError at the first problem, with a hint.
    """
    return measure_then_judge(
        [kernel], lambda checks: check_output(kernel, checks), lambda: measure(kernel),
        lambda measured: (f"Measured: a Python thread ran during {measured.python_progress:.0%} of the kernel's run; "
                          f"two threads over one: {measured.speedup:.2f}x (median of {len(measured.speedups)} "
                          f"rounds, {measured.work:,} integers per thread)"),
        lambda measured, checks: judge(kernel, speedup, measured, checks))


def check_output(kernel: Callable[[int, int], Any], checks: _Checks) -> None:
    for start, stop in CASES:
        want = collatz_steps_python(start, stop)
        try:
            got = kernel(start, stop)
        except Exception as e:
            e.add_note(f"(raised by your kernel, for collatz_steps({start}, {stop}))")
            raise
        if got != want:
            hint = "count the steps of every n in range(start, stop), until n reaches 1."
            if got == collatz_steps_python(start, stop + 1):
                hint = "stop is excluded, as in range(start, stop)."
            elif got == collatz_steps_python(start, stop) + (stop - start):
                hint = "you count one step too many per number: a number that is already 1 takes 0 steps."
            checks.fail(f"collatz_steps({start}, {stop})", f"should be {want}, but it is {got!r}", hint)
        checks.passed += 1


def judge(kernel: Any, speedup: Any, measured: Measured, checks: _Checks | None = None) -> None:
    """The verdict on the GIL test and the reported ``speedup``, from the checker's measurement alone."""
    checks = checks or _Checks()
    case = "the GIL test: a Python thread counting while your kernel runs in another"
    if measured.python_progress < GIL_FREE_FRACTION:
        options = getattr(kernel, "targetoptions", None)
        if options is None:
            hint = ("your kernel is plain Python, which holds the GIL: compile it with @numba.njit(nogil=True) "
                    "(no Python objects inside).")
        elif not options.get("nogil"):
            hint = "compile it with @numba.njit(nogil=True): without nogil, Numba's code keeps the GIL while it runs."
        else:
            hint = "the machine may be very busy: run the checker again."
        checks.fail(case, f"the Python thread ran during only {measured.python_progress:.0%} of your kernel's run",
                    hint)
    checks.passed += 1
    case = f"your speedup, {speedup!r}, against the {measured.speedup:.2f}x measured"
    number = as_number(speedup)
    if number is None:
        checks.fail(case, f"speedup should be a number, but it is {speedup!r}",
                    "report one thread's time divided by two threads' time, a float such as 1.7.")
    if number <= 0:
        checks.fail(case, "a speedup is a positive number", "one thread's time / two threads' time.")
    if not agrees(number, measured.speedups, SPEEDUP_FACTOR):
        hint = ("time the same total work both ways (one thread doing both halves; two threads, one half each), "
                "in several interleaved rounds, and report the median of one thread's time / two threads' time.")
        if close(1 / number, measured.speedup, SPEEDUP_FACTOR) and number < 1:
            hint = ("you divided the other way round: speedup = one thread's time / two threads' time, above 1 if "
                    "threads help.")
        elif number == 2:
            hint = "2.0 is the ideal on 2 free cores, not what this machine gave: report what you measured."
        elif close(number / 2, measured.speedup, SPEEDUP_FACTOR):
            hint = ("your two threads did twice the work of one: split the same range into two halves, don't give "
                    "each thread the whole range.")
        checks.fail(case, f"that is more than {SPEEDUP_FACTOR}x away from what the checker measured", hint)
    checks.passed += 1
