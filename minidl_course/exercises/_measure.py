"""What the measuring exercises (ch01, ch07, ch09, ch10, ch11, ch12) share: one rhythm, interleaved rounds, and
tolerant comparison.

Every measuring checker has the rhythm of ``measure_then_judge``: check the answer is right before anything is
timed, measure, print what was measured, judge from the measurement alone. A measuring checker never trusts one
timing: it runs the things it compares in rotating rounds (a, b, then b, a,
...) so that a burst of load on a busy machine hits both, and it compares medians of per-round ratios. Its
verdict comes from a pure function of the learner's answer and the measurement, so tests can feed it fixed
numbers; the measurement itself is passed in (``measure=``) or made by the checker.
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
    """The measuring checkers' one rhythm; returns the measurement.

    1. refuse an answer imported from the reference answers (``refuse_reference``);
    2. ``check_first(checks)``: the answer's values, before anything is timed (a wrong answer is never timed);
    3. ``measure()``: the checker's own measurement (a test or a notebook can pass fixed numbers instead);
    4. print ``report(measured)``, so the learner sees what the verdict rests on;
    5. ``judge(measured, checks)``: the verdict, a pure function of the answer and the measurement;
    6. print ``All N checks passed``.
    Each step raises AssertionError at the first problem, with a hint.
    """
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
    """Seconds per call of each function, ``rounds`` times, the order rotating each round; one untimed warm-up.

    ``clock`` reads the time (``time.perf_counter``; a test passes a scripted one).

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
    """True when ``value`` has at most three decimals (1.9, 46.6, 2.0): typed in or rounded, never a ratio of two
    clock readings as computed (those have fifteen significant digits).

    >>> typed(1.9), typed(2.0), typed(1.8834521977), typed(0.6 / 0.31)
    (True, True, False, False)
    """
    return abs(value - round(value, 3)) < 1e-12


TYPED = ("report the number your code computed, unrounded (a number typed in, or rounded, can't be told from a "
         "guess): e.g. speedup = statistics.median(rounds).")


class Stopwatch:
    """Wraps what the checker hands to the learner's timing code, and times each call with the checker's clock:
    ``calls`` holds ``(args, seconds)`` in call order. The learner's figures are then held to these, call by call
    (``off_the_clock``): a fake timer, a repeated round or a typed-in time can't match them, and a busy moment
    slows both alike."""

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
    """The first round whose time from the learner's code is not the checker's time of the same call (within
    ``factor`` and ``slack`` seconds), matching the last ``len(yours)`` calls; None when all agree. A round
    with no call behind it disagrees.

    >>> off_the_clock([0.10, 0.21], [0.5, 0.1, 0.2]), off_the_clock([0.1, 0.1], [0.1, 0.3]), off_the_clock([1.0], [])
    (None, 1, 0)
    """
    ours = list(ours)[-len(yours):] if yours else []
    for r, y in enumerate(yours):
        if r >= len(ours) or not ours[r] / factor - slack <= y <= ours[r] * factor + slack:
            return r
    return None


def twice(measure: Callable[[], M], agree: Callable[[M], bool]) -> M:
    """``measure()``, and once more if ``agree`` says the first disagrees: a burst of load that flipped the first
    rarely flips both. Returns the one that agrees, else the second."""
    first = measure()
    return first if agree(first) else measure()


def agrees(reported: float, per_round: Sequence[float], factor: float) -> bool:
    """True when ``reported`` lies within a factor ``factor`` of the range the checker's own rounds spanned.

    On a quiet machine the rounds agree and this is ``close(reported, median, factor)``; on a busy one they
    spread, and so does what an honest measurement can give: a learner's figure is judged against the range
    the checker itself saw, not against one number a busy machine happened to give it.

    >>> agrees(1.3, [0.95, 0.97, 0.96], 1.3), agrees(1.3, [0.95, 1.05, 1.4], 1.3)
    (False, True)
    """
    rounds = [r for r in per_round if r > 0]
    return bool(rounds) and reported > 0 and min(rounds) / factor <= reported <= max(rounds) * factor
