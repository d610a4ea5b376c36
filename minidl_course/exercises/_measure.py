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
