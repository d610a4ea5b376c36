"""Checker for exercise ch01: a Numba kernel that releases the GIL, and two threads' speedup from it, every figure
held to the rounds ``one_thread`` and ``two_threads`` clocked."""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, call, first_hint

KERNEL_SECONDS = 0.15  # how long one half of the timed work runs: long next to thread start, short for a checker
ROUNDS = 5
SPEEDUP_FACTOR = 1.05  # your speedup may be this far from the median of your latest rounds on the checker's clock
STANDIN_SECONDS = 0.05  # how long each half of a stand-in kernel sleeps, when a timing function is checked
STANDIN_ROUNDS = 3
CASES = [(1, 3), (1, 8), (1, 2), (27, 28), (2, 3), (100, 200), (1, 1000), (5000, 5001), (999, 1000), (10, 10)]
RUNS: deque[tuple[Any, int, int, int, float]] = deque(maxlen=4096)  # (kernel, threads, start, stop, seconds) a run
OTHER_WAY = "you divided the other way round: speedup = one thread's time / two threads' time, above 1 if threads help."
BOTH_WAYS = "one_thread(kernel, 1, 1 + span) and two_threads(kernel, 1, 1 + span)"


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
    middle, began = (start + stop) // 2, time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(kernel, (start, middle), (middle, stop)))
    RUNS.append((kernel, 2, start, stop, time.perf_counter() - began))
    return results


def one_thread(kernel: Callable[[int, int], Any], start: int, stop: int) -> list[Any]:
    """The same two halves as ``two_threads``, one after the other in this thread."""
    middle, began = (start + stop) // 2, time.perf_counter()
    results = [kernel(start, middle), kernel(middle, stop)]
    RUNS.append((kernel, 1, start, stop, time.perf_counter() - began))
    return results


def logged_rounds(kernel: Any, runs: Any = RUNS) -> list[float]:
    """The speedups of the rounds the helpers ran ``kernel`` in: one thread and two, same span, one after the other."""
    mine, rounds, k = [r for r in runs if r[0] is kernel], [], 0
    while k + 1 < len(mine):
        (_, n, a, b, s), (_, m, c, d, t) = mine[k], mine[k + 1]
        paired = (a, b) == (c, d) and n != m
        if paired:
            rounds.append(s / t if n == 1 else t / s)
        k += 2 if paired else 1
    return rounds


class Measured(NamedTuple):
    """Your thread_speedups' rounds on your kernel, and the checker's clock of them and of your notebook's rounds."""
    speedups: list[float]
    work: int  # integers per half
    clocked: Sequence[float] = ()  # the same rounds on the checker's clock
    problem: str = ""  # what your timing left out
    yours: Sequence[float] = ()  # your notebook's rounds on your kernel, on the checker's clock

    @property
    def speedup(self) -> float:
        return statistics.median(self.speedups)


class _Yours:
    """The kernel under a name of its own, for this call's runs; ``before``: its calls before the helpers ran it."""

    def __init__(self, kernel: Callable[[int, int], Any]) -> None:
        self.kernel, self.before = kernel, 0

    def __call__(self, start: int, stop: int) -> Any:
        self.before += not any(run[0] is self for run in RUNS)
        return self.kernel(start, stop)


def measure(kernel: Callable[[int, int], Any], thread_speedups: Callable[[Callable, int, int], Any],
            rounds: int = ROUNDS) -> Measured:
    """``thread_speedups(kernel, span, rounds)``, a half of the span ``KERNEL_SECONDS`` long, clocked by the helpers."""
    yours, n, took = logged_rounds(kernel), 250, 0.0  # the notebook's rounds, before the checker runs any
    kernel(1, 100)  # compiled, before it is timed
    while took <= 0.02 and n <= 1 << 26:
        n *= 4
        start = time.perf_counter()
        kernel(1, 1 + n)
        took = time.perf_counter() - start
    work = max(1000, int(n * KERNEL_SECONDS / max(took, 1e-9)))
    mine = _Yours(kernel)
    got = call(thread_speedups, mine, 2 * work, rounds, what="thread_speedups", case="your kernel")
    runs = [run for run in RUNS if run[0] is mine and run[2:4] == (1, 1 + 2 * work)]
    clocked, firsts = logged_rounds(mine, runs), {run[1] for run in runs[::2]}
    problem = first_hint(
        "", (len(runs) != 2 * rounds, f"your thread_speedups ran the kernel on the halves of the span {2 * len(runs)} "
             f"times for {rounds} rounds; each round runs both halves in one thread, then in two (4 calls a round)"),
        (len(clocked) != rounds, "your rounds did not each run the halves once in one thread and once in two"),
        (mine.before <= 2, "your thread_speedups timed the kernel's first call: call it once before anything is "
         "timed, so that compiling (or a cold cache) is not"),
        (rounds > 1 and len(firsts) < 2, f"every round ran {'one thread' if 1 in firsts else 'two threads'} first: "
         "swap which goes first from one round to the next, so a drift in the load falls on both sides"))
    return Measured(harness.positive_numbers(got) or [], work, clocked, problem, yours)


def _standin(hold: Any, start: int, stop: int) -> int:
    with hold:  # a kernel of known speedup: two threads sleep at once (x2), or take turns on a lock (x1)
        time.sleep((stop - start) * STANDIN_SECONDS / 1000)
    return 0


STANDINS = ((functools.partial(_standin, contextlib.nullcontext()), 2.0,
             "a stand-in kernel that sleeps, releasing the GIL: two threads overlap"),
            (functools.partial(_standin, threading.Lock()), 1.0,
             "a stand-in kernel that sleeps holding a lock: two threads take turns"))


def check_nogil(kernel: Callable[[int, int], Any], thread_speedups: Callable[[Callable, int, int], Any],
                speedup: Any, measure: Callable[[Callable, Callable], Measured] = measure) -> Measured:
    """Check ch01: the kernel's output, ``thread_speedups(kernel, span, rounds)`` (on two stand-ins of known speedup,
    then on yours), its Numba options, and ``speedup``."""
    def report(m: Measured) -> str:
        two = [", ".join(f"{x:.2f}" for x in xs) for xs in (m.speedups, m.clocked, m.yours[-12:])]
        nogil = (getattr(kernel, "targetoptions", None) or {}).get("nogil")
        return (f"Your kernel was compiled with nogil={bool(nogil)} (its Numba options: what decides whether it "
                f"releases the GIL). Your thread_speedups on it ({m.work:,} integers per thread), per round: "
                f"{two[0]}; on the checker's clock: {two[1]}" + (f"; median {m.speedup:.2f}x" if m.speedups else "")
                + f"; the rounds your notebook ran on your kernel, on the checker's clock: {two[2] or 'none'}")
    return harness.measure_then_judge(
        [kernel, thread_speedups], lambda checks: (check_output(kernel, checks), check_timer(thread_speedups, checks)),
        lambda: measure(kernel, thread_speedups), report, lambda m, checks: judge(kernel, speedup, m, checks))


def check_timer(thread_speedups: Callable[[Callable, int, int], Any], checks: _Checks) -> None:
    """Your ``thread_speedups`` on the two stand-ins: a list of ``rounds`` ratios, their median near x2 and x1."""
    def in_band(got: Any, want: int) -> bool:  # wide: a busy machine wakes a sleeping thread late
        ratios = harness.positive_numbers(got, STANDIN_ROUNDS)
        median = statistics.median(ratios) if ratios is not None else 0.0
        return 1.4 <= median <= 2.6 if want == 2 else 0.7 <= median <= 1.3

    for standin, want, case in STANDINS:
        got = harness.twice(functools.partial(call, thread_speedups, standin, 2000, STANDIN_ROUNDS,
                                              what="thread_speedups", case=case),
                            functools.partial(in_band, want=want))
        ratios = harness.positive_numbers(got, STANDIN_ROUNDS)
        if ratios is None:
            checks.fail(case, f"thread_speedups(kernel, 2000, {STANDIN_ROUNDS}) should return {STANDIN_ROUNDS} "
                        f"positive numbers, but it returned {got!r}", "return the list of the rounds' speedups, one "
                        "per round; speedup is their median.")
        median = statistics.median(ratios)
        if not in_band(got, want):
            checks.fail(case, f"its speedup is about x{want:g}, but your thread_speedups gave a median of {median:.2f}",
                        first_hint(f"time {BOTH_WAYS} in each round; its ratio is one thread's time / two threads'.",
                                   (want == 2 and 1 / 2.6 <= median <= 1 / 1.4, OTHER_WAY),
                                   (want == 1, "two threads that take turns can't beat one: time each round.")))
        checks.passed += 1


def check_output(kernel: Callable[[int, int], Any], checks: _Checks) -> None:
    for start, stop in CASES:
        want, case = collatz_steps_python(start, stop), f"collatz_steps({start}, {stop})"
        got = call(kernel, start, stop, what="kernel", case=case)
        if got != want:
            checks.fail(case, f"should be {want}, but it is {got!r}", first_hint(
                "count the steps of every n in range(start, stop), until n reaches 1.",
                (got == collatz_steps_python(start, stop + 1), "stop is excluded, as in range(start, stop)."),
                (got == want + (stop - start), "you count one step too many per number: 1 itself takes 0 steps.")))
        checks.passed += 1


def judge(kernel: Any, speedup: Any, measured: Measured, checks: _Checks | None = None) -> None:
    """From the measurement alone: ``nogil=True``, your rounds on the checker's clock, ``speedup`` their median."""
    checks, options, rounds = checks or _Checks(), getattr(kernel, "targetoptions", None), measured.yours
    if not (options or {}).get("nogil"):
        checks.fail("your kernel's Numba options", "it was compiled without nogil=True" if options is not None else
                    "it is not compiled by Numba", "without nogil=True, Numba's code keeps the GIL, and plain Python "
                    "always holds it; compile it with @numba.njit(nogil=True) (no Python objects inside).")
    checks.passed += 1
    r = harness.off_the_clock(measured.speedups, measured.clocked, slack=0)
    off = r is not None and (f"round {r + 1}: your thread_speedups says x{measured.speedups[r]:.2f}, but the kernel's "
                             "calls in that round give " + (f"x{measured.clocked[r]:.2f}" if r < len(measured.clocked)
                                                            else "no round"))
    checks.first(
        "your thread_speedups on your kernel, against the checker's clock",
        (not measured.speedups, "your thread_speedups returned no list of positive numbers for your kernel",
         "return one speedup per round, as it did for the stand-in kernels."),
        (measured.problem, measured.problem, f"time every round: time {BOTH_WAYS} in each; one round's ratio "
         "repeated is one measurement, not several."),
        (off, off, "time each run with time.perf_counter() just before and after it; divide one thread's time by two "
         "threads' time of the same round."),
        (not rounds, "one_thread and two_threads never ran your kernel in this notebook", f"in thread_speedups, time "
         f"{BOTH_WAYS}; run it on your kernel and set speedup to the median of what it returned."))
    checks.passed += 1
    number, windows = harness.as_number(speedup), [rounds[-k:] for k in range(min(3, len(rounds)), len(rounds) + 1)]
    rule = number and not any(harness.close(number, statistics.median(w), SPEEDUP_FACTOR) for w in windows) and next(
        (name for name, f in (("max", max), ("min", min), ("mean", statistics.mean)) for w in windows
         if harness.close(number, f(w), 1.01)), None)
    if rule and not harness.typed(number):
        checks.fail(f"your speedup, {speedup!r}, against the rounds your cell timed", f"{speedup} is the {rule} of "
                    "your rounds", "speedup is their median (statistics.median): one outlier round can't move it.")
    harness.judge_figure(
        checks, f"your speedup, {speedup!r}, against the rounds your cell timed", "speedup", speedup,
        [statistics.median(w) for w in windows], SPEEDUP_FACTOR,
        "set speedup = statistics.median(thread_speedups(collatz_steps, span, rounds)).", "your notebook's rounds on "
        "your kernel, on the checker's clock, were " + ", ".join(f"x{x:.2f}" for x in rounds[-8:]) + f": {speedup} is "
        f"more than {SPEEDUP_FACTOR}x from the median of the last 3 or more", "set speedup from what your "
        "thread_speedups returned (the median of its rounds), not a number from elsewhere, or from an older run.",
        OTHER_WAY, {2.0: "2.0 is the ideal on 2 free cores, not what this machine gave: report what you measured."})
