"""What the measuring checkers share: one rhythm, rotating rounds, the checker's own clock, one verdict on a figure."""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from minidl_course.exercises._common import _Checks
from minidl_course.rounds import rotating

M = TypeVar("M")


def measure_then_judge(answers: Sequence[Any], check_first: Callable[[_Checks], None], measure: Callable[[], M],
                       report: Callable[[M], str], judge: Callable[[M, _Checks], None]) -> M:
    """Refuse a reference answer; check values before timing anything; measure, print the report, judge."""
    checks = _Checks(*answers)
    check_first(checks)
    measured = measure()
    print(report(measured))
    judge(measured, checks)
    checks.done()
    return measured


class Rounds(dict):
    """``{name: [figure per round]}``, and ``problem``: where a figure first left the checker's clock ("" if not)."""

    def __init__(self, figures: Any = (), problem: str = "") -> None:
        super().__init__(figures)
        self.problem = problem

    def ratios(self, numerator: Any, denominator: Any) -> list[float]:
        return [n / d for n, d in zip(self[numerator], self[denominator], strict=True)]


def interleaved(fns: Mapping[str, Callable[[], Any]], rounds: int, warmup: bool = True,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each function: a warm-up each, then ``rounds`` rounds, the order rotating each round."""
    times = {name: [] for name in fns}
    for r, name in rotating(list(fns), rounds, warmup):
        start = clock()
        fns[name]()
        if r >= 0:
            times[name].append(clock() - start)
    return times


class Stopwatch:
    """What the checker hands to the learner's timing code: ``calls``, ``(args, thread, start, end)`` per call."""

    def __init__(self, fn: Callable[..., Any], clock: Callable[[], float] = time.perf_counter) -> None:
        self.fn, self.clock, self.calls = fn, clock, []

    def __call__(self, *args: Any) -> Any:
        start = self.clock()
        try:
            return self.fn(*args)
        finally:
            self.calls.append((args, threading.get_ident(), start, self.clock()))

    def seconds(self, *args: Any) -> list[float]:
        return [end - start for a, _, start, end in self.calls if a == args]


def off_the_clock(yours: Sequence[float], ours: Sequence[float], factor: float = 1.25,
                  slack: float = 2e-3) -> int | None:
    """The first of your times not within ``factor`` and ``slack`` seconds of the checker's time of the same call
    (the last ``len(yours)``), or None; a time with no call behind it disagrees."""
    ours = list(ours)[-len(yours):] if yours else []
    for r, y in enumerate(yours):
        if r >= len(ours) or not ours[r] / factor - slack <= y <= ours[r] * factor + slack:
            return r
    return None


def latest_medians(figures: Sequence[float], least: int = 3) -> list[float]:
    """The medians of the latest ``least`` or more of ``figures`` (all, if fewer): what a learner's cell may report."""
    return [statistics.median(figures[-k:]) for k in range(min(least, len(figures)) or 1, len(figures) + 1)]


def as_number(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a real number (a string, None, a list, nan)."""
    if isinstance(value, bool) or not isinstance(value, int | float) and not hasattr(value, "__float__"):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def positive_numbers(got: Any, count: int | None = None) -> list[float] | None:
    """``got`` as a list of positive floats (``count`` of them, if given); None when it is not one."""
    numbers = [as_number(x) for x in got] if isinstance(got, list | tuple) else [None]
    ok = all(x is not None and x > 0 for x in numbers) and count in (None, len(numbers))
    return numbers if ok else None


def close(reported: float, measured: float, factor: float) -> bool:
    """Both positive, and within ``factor`` of each other."""
    return reported > 0 and measured > 0 and max(reported / measured, measured / reported) <= factor


def typed(value: float) -> bool:
    """At most three decimals: typed in or rounded, never a ratio of clock readings."""
    return abs(value - round(value, 3)) < 1e-12


MILLISECONDS = "your times are in milliseconds: return seconds, as time.perf_counter() gives them."
TYPED = ("report the number your code computed, unrounded (a number typed in, or rounded, can't be told from a "
         "guess): e.g. speedup = statistics.median(rounds).")


def judge_figure(checks: _Checks, case: str, name: str, value: Any, targets: Sequence[float], factor: float,
                 how: str, off: str, hint: str, other_way: str, guesses: Mapping[float, str] | None = None) -> None:
    """A positive number (else ``how``), unrounded (else ``guesses[value]`` or ``TYPED``), within ``factor`` of a
    target (else ``off``, with ``other_way`` when its inverse fits, else ``hint``)."""
    number = as_number(value)
    if number is None or number <= 0:
        checks.fail(case, f"{name} should be a positive number, but it is {value!r}", how)
    if typed(number):
        checks.fail(case, f"{number} has at most three decimals", (guesses or {}).get(number, TYPED))
    if not any(close(number, t, factor) for t in targets):
        flipped = any(close(1 / number, t, factor) for t in targets)
        checks.fail(case, off, other_way if flipped else hint)
    checks.passed += 1


def twice(measure: Callable[[], M], agree: Callable[[M], bool]) -> M:
    """``measure()``, and once more if ``agree`` says no: a burst of load rarely flips both."""
    first = measure()
    return first if agree(first) else measure()
