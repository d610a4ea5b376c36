"""What the measuring checkers (ch01, ch07, ch09-ch12) share: one rhythm, interleaved rounds, the checker's clock
around the learner's timing code, and one way to judge a reported figure.

A measuring checker never trusts one timing or a number handed to it: it runs what it compares in rotating rounds,
so a burst of load hits both sides, compares medians of per-round ratios, and holds each figure the learner's code
gives to the checker's own clock on the same call.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from minidl_course.exercises._common import _Checks, refuse_reference

M = TypeVar("M")


def measure_then_judge(answers: Sequence[Any], check_first: Callable[[_Checks], None], measure: Callable[[], M],
                       report: Callable[[M], str], judge: Callable[[M, _Checks], None]) -> M:
    """The one rhythm: refuse a reference answer; check the answer's values before anything is timed; measure
    (a test may pass fixed numbers); print what was measured; judge from the answer and the measurement alone;
    print ``All N checks passed``. Returns the measurement."""
    refuse_reference(*answers)
    checks = _Checks()
    check_first(checks)
    measured = measure()
    print(report(measured))
    judge(measured, checks)
    checks.done()
    return measured


def interleaved(fns: Mapping[str, Callable[[], Any]], rounds: int, warmup: bool = True,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each function, ``rounds`` times, the order rotating each round, after one warm-up call.

    >>> times = interleaved({"a": lambda: None, "b": lambda: None}, rounds=3)
    >>> sorted(times), [len(v) for v in times.values()]
    (['a', 'b'], [3, 3])
    """
    names = list(fns)
    if warmup:
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = clock()
            fns[name]()
            times[name].append(clock() - start)
    return times


def median_ratio(times: Mapping[str, list[float]], numerator: str, denominator: str) -> float:
    """The median over rounds of ``times[numerator][r] / times[denominator][r]``.

    >>> median_ratio({"slow": [2.0, 4.0, 3.0], "fast": [1.0, 1.0, 1.0]}, "slow", "fast")
    3.0
    """
    return statistics.median(n / d for n, d in zip(times[numerator], times[denominator]))


def as_number(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a real number (a string, None, a list, nan)."""
    if isinstance(value, bool) or not isinstance(value, int | float) and not hasattr(value, "__float__"):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def close(reported: float, measured: float, factor: float) -> bool:
    """True when ``reported`` is within a factor ``factor`` of ``measured`` (both positive), either way.

    >>> close(1.8, 1.5, 1.3), close(3.0, 1.5, 1.3)
    (True, False)
    """
    return reported > 0 and measured > 0 and max(reported / measured, measured / reported) <= factor


def typed(value: float) -> bool:
    """True when ``value`` has at most three decimals: typed in or rounded, never a ratio of clock readings.

    >>> typed(1.9), typed(2.0), typed(1.8834521977), typed(0.6 / 0.31)
    (True, True, False, False)
    """
    return abs(value - round(value, 3)) < 1e-12


TYPED = ("report the number your code computed, unrounded (a number typed in, or rounded, can't be told from a "
         "guess): e.g. speedup = statistics.median(rounds).")


def judge_figure(checks: _Checks, case: str, name: str, value: Any, targets: Sequence[float], factor: float,
                 how: str, off: str, hint: str, other_way: str, guesses: Mapping[float, str] | None = None) -> None:
    """The one verdict on a reported figure: a positive number (else ``how``), as code computes it (a typed or
    rounded one gets ``guesses[value]`` or ``TYPED``), within ``factor`` of one of ``targets`` (else ``off``, with
    ``other_way`` when its inverse fits, ``hint`` otherwise)."""
    number = as_number(value)
    if number is None or number <= 0:
        checks.fail(case, f"{name} should be a positive number, but it is {value!r}", how)
    if typed(number):
        checks.fail(case, f"{number} has at most three decimals", (guesses or {}).get(number, TYPED))
    if not any(close(number, t, factor) for t in targets):
        flipped = any(close(1 / number, t, factor) for t in targets)
        checks.fail(case, off, other_way if flipped else hint)
    checks.passed += 1


class Stopwatch:
    """Wraps what the checker hands to the learner's timing code and times each call on the checker's clock:
    ``calls`` holds ``(args, seconds)``, for ``off_the_clock`` to hold the learner's figures to."""

    def __init__(self, fn: Callable[..., Any], clock: Callable[[], float] = time.perf_counter) -> None:
        self.fn, self.clock, self.calls = fn, clock, []

    def __call__(self, *args: Any) -> Any:
        start = self.clock()
        try:
            return self.fn(*args)
        finally:
            self.calls.append((args, self.clock() - start))

    def seconds(self, *args: Any) -> list[float]:
        """The seconds of each call made with ``args``, in order."""
        return [s for a, s in self.calls if a == args]


def off_the_clock(yours: Sequence[float], ours: Sequence[float], factor: float = 1.25,
                  slack: float = 2e-3) -> int | None:
    """The first of the learner's times that is not the checker's time of the same call (the last ``len(yours)``),
    within ``factor`` and ``slack`` seconds; None when all agree. A time with no call behind it disagrees.

    >>> off_the_clock([0.10, 0.21], [0.5, 0.1, 0.2]), off_the_clock([0.1, 0.1], [0.1, 0.3]), off_the_clock([1.0], [])
    (None, 1, 0)
    """
    ours = list(ours)[-len(yours):] if yours else []
    for r, y in enumerate(yours):
        if r >= len(ours) or not ours[r] / factor - slack <= y <= ours[r] * factor + slack:
            return r
    return None


def twice(measure: Callable[[], M], agree: Callable[[M], bool]) -> M:
    """``measure()``, and once more if ``agree`` says no: a burst of load rarely flips both."""
    first = measure()
    return first if agree(first) else measure()


def unless_close(measure: Callable[[], M], reported: Any, figure: Callable[[M], float], factor: float) -> M:
    """``twice``, agreeing when ``reported`` is a number within ``factor`` of the measurement's ``figure``."""
    number = as_number(reported)
    return twice(measure, lambda m: number is not None and close(number, figure(m), factor))


def agrees(reported: float, per_round: Sequence[float], factor: float) -> bool:
    """True when ``reported`` lies within ``factor`` of the range the checker's rounds spanned.

    >>> agrees(1.3, [0.95, 0.97, 0.96], 1.3), agrees(1.3, [0.95, 1.05, 1.4], 1.3)
    (False, True)
    """
    rounds = [r for r in per_round if r > 0]
    return bool(rounds) and reported > 0 and min(rounds) / factor <= reported <= max(rounds) * factor
