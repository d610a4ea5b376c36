"""Checker for exercise ch01: a Numba kernel that releases the GIL, and the speedup two threads get from it. It runs
``thread_speedups`` on two stand-in kernels of known speedup, then on the learner's, and holds every figure to the
rounds ``one_thread`` and ``two_threads`` clocked; ``speedup`` to the rounds the learner's own cell ran."""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, call, first_hint

KERNEL_SECONDS = 0.15  # how long one half of the timed work runs: long next to thread start, short for a checker
ROUNDS = 5
GIL_FREE_FRACTION = 0.2  # below this part of the kernel's run with a Python thread running, it held the GIL
SPEEDUP_FACTOR = 1.05  # your speedup may be this far from the median of your latest rounds on the checker's clock
STANDIN_SECONDS = 0.05  # how long each half of a stand-in kernel sleeps, when a timing function is checked
STANDIN_ROUNDS = 3
CASES = [(1, 3), (1, 8), (1, 2), (27, 28), (2, 3), (100, 200), (1, 1000), (5000, 5001), (999, 1000), (10, 10)]
# Every run of one_thread or two_threads, on the checker's clock: (kernel, threads, start, stop, seconds).
RUNS: deque[tuple[Any, int, int, int, float]] = deque(maxlen=4096)
OTHER_WAY = ("you divided the other way round: speedup = one thread's time / two threads' time, above 1 if threads "
             "help.")


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
    middle, results = (start + stop) // 2, [None, None]

    def half(k: int, a: int, b: int) -> None:
        results[k] = kernel(a, b)

    began = time.perf_counter()
    threads = [threading.Thread(target=half, args=(0, start, middle)),
               threading.Thread(target=half, args=(1, middle, stop))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    RUNS.append((kernel, 2, start, stop, time.perf_counter() - began))
    return results


def one_thread(kernel: Callable[[int, int], Any], start: int, stop: int) -> list[Any]:
    """The same two halves as ``two_threads``, one after the other in this thread."""
    middle, began = (start + stop) // 2, time.perf_counter()
    results = [kernel(start, middle), kernel(middle, stop)]
    RUNS.append((kernel, 1, start, stop, time.perf_counter() - began))
    return results


def logged_rounds(kernel: Any, runs: Any = RUNS) -> list[float]:
    """The speedups of the rounds ``one_thread`` and ``two_threads`` ran ``kernel`` in, on the checker's clock: a
    round is a one-thread run and a two-thread run of the same span, one right after the other."""
    mine, rounds, k = [r for r in runs if r[0] is kernel], [], 0
    while k + 1 < len(mine):
        (_, n, a, b, s), (_, m, c, d, t) = mine[k], mine[k + 1]
        paired = (a, b) == (c, d) and n != m
        if paired:
            rounds.append(s / t if n == 1 else t / s)
        k += 2 if paired else 1
    return rounds


@dataclass(frozen=True)
class Measured:
    """Your ``thread_speedups`` on your kernel per round; the GIL test; the same rounds on the checker's clock, and
    what your timing left out; your notebook's rounds on your kernel, on the checker's clock."""

    speedups: list[float]
    python_progress: float  # the part of the kernel's run during which a Python thread made progress
    work: int  # integers per half
    clocked: list[float] = field(default_factory=list)
    problem: str = ""
    yours: list[float] = field(default_factory=list)

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
    """The part of one ``kernel(1, 1 + work)`` call during which this (Python) thread kept counting, at the rate it
    counts alone: near 0 for a kernel that holds the GIL, near 1 for one that releases it."""
    def count_while(thread: threading.Thread) -> float:
        count, start = 0, time.perf_counter()
        thread.start()
        while thread.is_alive():
            count += 1
        return count / (time.perf_counter() - start)

    alone = count_while(threading.Thread(target=time.sleep, args=(0.05,)))
    return min(1.0, count_while(threading.Thread(target=kernel, args=(1, 1 + work))) / alone)


def measure(kernel: Callable[[int, int], Any], thread_speedups: Callable[[Callable, int, int], Any],
            rounds: int = ROUNDS) -> Measured:
    """The GIL test, then ``thread_speedups(kernel, span, rounds)``, its rounds clocked by the helpers."""
    yours, work = logged_rounds(kernel), calibrate(kernel)  # the notebook's rounds, before the checker runs any
    progress = python_progress(kernel, work)
    rounds = rounds if progress >= GIL_FREE_FRACTION else 1  # it holds the GIL: threads can't overlap
    mine = functools.partial(kernel)  # the kernel under a name of its own: the runs logged under it are this call's
    got = call(thread_speedups, mine, 2 * work, rounds, what="thread_speedups", case="your kernel")
    runs = [run for run in RUNS if run[0] is mine and run[2:4] == (1, 1 + 2 * work)]
    clocked = logged_rounds(mine, runs)
    problem = first_hint(
        "", (len(runs) != 2 * rounds, f"your thread_speedups ran the kernel on the halves of the span {2 * len(runs)} "
             f"times for {rounds} rounds; each round runs both halves in one thread, then in two (4 calls a round)"),
        (len(clocked) != rounds, "your rounds did not each run the halves once in one thread and once in two"))
    return Measured(harness.positive_numbers(got) or [], progress, work, clocked, problem, yours)


def _standin(hold: Any, start: int, stop: int) -> int:
    """A kernel of known speedup whatever the load: it sleeps in proportion to its range, releasing the GIL (two
    threads overlap: x2) or holding a lock, as a kernel holding the GIL would (they take turns: x1)."""
    with hold:
        time.sleep((stop - start) * STANDIN_SECONDS / 1000)
    return 0


STANDINS = ((functools.partial(_standin, contextlib.nullcontext()), 2.0,
             "a stand-in kernel that sleeps, releasing the GIL: two threads overlap"),
            (functools.partial(_standin, threading.Lock()), 1.0,
             "a stand-in kernel that sleeps holding a lock: two threads take turns"))


def check_nogil(kernel: Callable[[int, int], Any], thread_speedups: Callable[[Callable, int, int], Any],
                speedup: Any, measure: Callable[[Callable, Callable], Measured] = measure) -> Measured:
    """Check ch01: the kernel's output, ``thread_speedups(kernel, span, rounds)`` (on two stand-in kernels of known
    speedup, then on yours), that the kernel releases the GIL, and ``speedup``. Prints what it measured; raises
    AssertionError at the first problem, with a hint."""
    def report(m: Measured) -> str:
        return (f"Measured: a Python thread ran during {m.python_progress:.0%} of the kernel's run; your "
                f"thread_speedups on your kernel ({m.work:,} integers per thread), per round: "
                + ", ".join(f"{x:.2f}" for x in m.speedups) + "; on the checker's clock: "
                + ", ".join(f"{x:.2f}" for x in m.clocked) + (f"; median {m.speedup:.2f}x" if m.speedups else "")
                + "; the rounds your notebook ran on your kernel, on the checker's clock: "
                + (", ".join(f"{x:.2f}" for x in m.yours[-12:]) or "none"))

    return harness.measure_then_judge(
        [kernel, thread_speedups], lambda checks: (check_output(kernel, checks), check_timer(thread_speedups, checks)),
        lambda: measure(kernel, thread_speedups), report, lambda m, checks: judge(kernel, speedup, m, checks))


def check_timer(thread_speedups: Callable[[Callable, int, int], Any], checks: _Checks) -> None:
    """Your ``thread_speedups`` on the two stand-ins: a list of ``rounds`` ratios, their median near x2 and x1."""
    for standin, want, case in STANDINS:
        got = call(thread_speedups, standin, 2000, STANDIN_ROUNDS, what="thread_speedups", case=case)
        ratios = harness.positive_numbers(got, STANDIN_ROUNDS)
        if ratios is None:
            checks.fail(case, f"thread_speedups returned one number, {got!r}" if harness.as_number(got) is not None else
                        f"thread_speedups(kernel, 2000, {STANDIN_ROUNDS}) should return {STANDIN_ROUNDS} positive "
                        f"numbers, one per round, but it returned {got!r}", "return the list of the rounds' speedups "
                        "(one per round, time both ways in each of `rounds` rounds); speedup is their median.")
        median = statistics.median(ratios)
        if not (1.4 <= median <= 2.6 if want == 2 else 0.7 <= median <= 1.3):  # wide: a busy machine wakes late
            checks.fail(case, f"its speedup is about x{want:g}, but your thread_speedups gave a median of "
                        f"{median:.2f}", first_hint(
                "time the same span both ways in each round: one_thread(kernel, 1, 1 + span) and two_threads(kernel, "
                "1, 1 + span); each round's ratio is one thread's time / two threads' time.",
                (want == 2 and 1 / 2.6 <= median <= 1 / 1.4, OTHER_WAY),
                (want == 1, "two threads that take turns can't beat one: measure each round's times, don't assume a "
                 "speedup.")))
        checks.passed += 1


def check_output(kernel: Callable[[int, int], Any], checks: _Checks) -> None:
    for start, stop in CASES:
        want, case = collatz_steps_python(start, stop), f"collatz_steps({start}, {stop})"
        got = call(kernel, start, stop, what="kernel", case=case)
        if got != want:
            checks.fail(case, f"should be {want}, but it is {got!r}", first_hint(
                "count the steps of every n in range(start, stop), until n reaches 1.",
                (got == collatz_steps_python(start, stop + 1), "stop is excluded, as in range(start, stop)."),
                (got == want + (stop - start), "you count one step too many per number: a number that is already 1 "
                 "takes 0 steps.")))
        checks.passed += 1


def judge(kernel: Any, speedup: Any, measured: Measured, checks: _Checks | None = None) -> None:
    """The verdict, from the measurement alone: the kernel compiled with ``nogil=True`` (a fact whatever the load;
    the counting thread's share is printed, not judged); each of your rounds within 1.25x of the same round on the
    checker's clock; ``speedup`` your code's number, within ``SPEEDUP_FACTOR`` of the median of your notebook's
    latest rounds (3 or more) on the checker's clock."""
    checks, options, rounds = checks or _Checks(), getattr(kernel, "targetoptions", None), measured.yours
    if not (options or {}).get("nogil"):
        checks.fail("the GIL test: a Python thread counting while your kernel runs in another",
                    f"the Python thread ran during {measured.python_progress:.0%} of your kernel's run, and your "
                    f"kernel {'was compiled without nogil=True' if options is not None else 'is not compiled'}",
                    "compile it with @numba.njit(nogil=True): without nogil, Numba's code keeps the GIL while it runs."
                    if options is not None else "your kernel is plain Python, which holds the GIL: compile it with "
                    "@numba.njit(nogil=True) (no Python objects inside).")
    checks.passed += 1
    case = "your thread_speedups on your kernel, against the same rounds on the checker's clock"
    if not measured.speedups:
        checks.fail(case, "your thread_speedups returned no list of positive numbers for your kernel",
                    "return one speedup per round, as it did for the stand-in kernels.")
    if measured.problem:
        checks.fail(case, measured.problem, "time every round: time one_thread(kernel, 1, 1 + span) and two_threads("
                    "kernel, 1, 1 + span) in each round; a round timed once and its ratio repeated is one "
                    "measurement, not several.")
    r = harness.off_the_clock(measured.speedups, measured.clocked, slack=0)
    if r is not None:
        checks.fail(case, f"round {r + 1}: your thread_speedups says x{measured.speedups[r]:.2f}, but the kernel's "
                    f"calls in that round give " + (f"x{measured.clocked[r]:.2f}" if r < len(measured.clocked) else
                                                    "no round"), "time each run with time.perf_counter() just "
                    "before and just after it, and divide one thread's time by two threads' time of the same round.")
    if not rounds:
        checks.fail(case, "one_thread and two_threads never ran your kernel in this notebook", "in thread_speedups, "
                    "time one_thread(kernel, 1, 1 + span) and two_threads(kernel, 1, 1 + span); run it on your kernel "
                    "and set speedup to the median of what it returned.")
    checks.passed += 1
    harness.judge_figure(
        checks, f"your speedup, {speedup!r}, against the rounds your cell timed", "speedup", speedup,
        [statistics.median(rounds[-k:]) for k in range(min(3, len(rounds)), len(rounds) + 1)], SPEEDUP_FACTOR,
        "set speedup = statistics.median(thread_speedups(collatz_steps, span, rounds)).",
        "your notebook's rounds on your kernel, as one_thread and two_threads clocked them, were "
        + ", ".join(f"x{x:.2f}" for x in rounds[-8:]) + f": {speedup} is more than {SPEEDUP_FACTOR}x from "
        "the median of the last 3 or more of them",
        "set speedup from what your thread_speedups returned (the median of its rounds), not a number from "
        "elsewhere; if you ran it again since, take the median of the new rounds.", OTHER_WAY,
        {2.0: "2.0 is the ideal on 2 free cores, not what this machine gave: report what you measured."})
