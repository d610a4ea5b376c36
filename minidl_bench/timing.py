"""Timing one callable: a warm-up, then repeats, summarised; and how sure a median of ratios is.

Shared by the benchmark harness and the plots (neither imports the other for these).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_REPEATS = 3


@dataclass(frozen=True)
class Timing:
    """Seconds for one callable: median, min and max over ``repeats`` timed calls after a warm-up."""

    median: float
    min: float
    max: float
    repeats: int
    first: float  # the warm-up call alone: it pays one-time costs (JIT compile, pool start, caches)

    def __str__(self) -> str:
        spread = f"min {format_seconds(self.min)}, max {format_seconds(self.max)}"
        return f"{format_seconds(self.median)} ({spread}, {self.repeats} repeats)"


def format_seconds(seconds: float) -> str:
    """Three significant figures in the largest unit that fits.

    >>> format_seconds(0.0123), format_seconds(2.5e-5)
    ('12.3 ms', '25 µs')
    """
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def time_it(fn: Callable[[], Any], repeats: int = 5) -> Timing:
    """Call ``fn`` once to warm up, then ``repeats`` (at least 3) more times; summarise the timed calls."""
    if repeats < MIN_REPEATS:
        raise ValueError(f"repeats must be at least {MIN_REPEATS}, got {repeats}")
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return Timing(statistics.median(times), min(times), max(times), repeats, first)


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free confidence interval for the median: ``(low, high, coverage)``.

    The k-th smallest and k-th largest values bracket the true median unless at least n - k + 1 of
    the n values fall on one side of it, which happens with probability 2 * P(Binomial(n, 1/2) < k).
    k is the largest whose coverage is still at least ``level``; with too few values for that (fewer
    than 6 at 95%) the interval is the whole range, min to max, and ``coverage`` says what it is worth.

    >>> median_ci([5, 1, 4, 2, 3, 9, 8, 7, 6, 10, 11])  # 11 values: the 2nd smallest to the 2nd largest
    (2, 10, 0.98828125)
    >>> median_ci([3, 1, 2])
    (1, 3, 0.75)
    """
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median_ci() needs at least one value")

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return ordered[k - 1], ordered[n - k], coverage(k)


def expect(holds: bool, claim: str, measured: Any = None) -> str:
    """Say whether this run's timings show ``claim``, as a line to print. A notebook prints it, never asserts it:
    timings move with the machine and whatever else it is running, while the lesson's claim is what an idle
    2-core machine shows.

    >>> expect(True, "threads overlap the waits", "x3.6")
    'As expected on this run: threads overlap the waits (measured: x3.6)'
    >>> expect(False, "threads overlap the waits")[:56]
    'Not on this run: threads overlap the waits. An idle 2-co'
    """
    shown = "" if measured is None else f" (measured: {measured})"
    if holds:
        return f"As expected on this run: {claim}{shown}"
    return (f"Not on this run: {claim}{shown}. An idle 2-core machine shows it; a busy machine, another CPU or "
            "a short quick-mode run can hide it: re-run this cell when the machine is quiet.")
