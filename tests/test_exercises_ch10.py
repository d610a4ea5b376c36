"""The exercise checkers, ch10 (minidl's per-batch cost next to torch's): each passes a learner's copy of the
reference answer and rejects typical wrong answers with the hint that names the mistake.
"""


import pytest
from exercise_support import (
    ScriptedClock,
    learner_copy,
    rejects_with_hint,
)

from minidl.course.exercises import ch10_overhead_ratio as ch10

per_batch_seconds = learner_copy("ch10_overhead_ratio").per_batch_seconds


# --- ch10: minidl's per-batch cost next to torch's -----------------------------------------------------


def ch10_measured(ratio):
    return ch10.Measured([ratio * 1e-5] * 5, [1e-5] * 5)


def test_ch10_measure_times_whole_epochs_and_divides_by_the_batches():
    """The checker's own measurement, not the learner's formula: epoch seconds / batches, per round."""
    clock = ScriptedClock([3.0, 1.5, 1.2, 3.3, 3.6, 1.2])  # minidl, torch, torch, minidl, minidl, torch
    measured = ch10.measure(rounds=3, clock=clock)
    per = ch10.BATCHES
    assert measured.minidl == pytest.approx([3.0 / per, 3.3 / per, 3.6 / per])
    assert measured.torch == pytest.approx([1.5 / per, 1.2 / per, 1.2 / per])
    assert measured.ratio == pytest.approx(2.75)  # the median of 2.0, 2.75, 3.0


def test_the_checker_carries_no_copy_of_the_answer():
    import inspect

    source = inspect.getsource(ch10)
    assert "first = last = time.perf_counter()" not in source and "def reference_per_batch" not in source


@pytest.mark.timeout(60)
def test_ch10_correct_solution_end_to_end(capsys):
    measured = ch10.measure(rounds=3)
    ch10.check_overhead(per_batch_seconds, measured.ratio, measure=lambda: measured)
    assert "All 3 checks passed" in capsys.readouterr().out


def test_ch10_cheat_hard_coded_timer_and_ratio_are_rejected():
    rejects_with_hint(ch10.check_timer, lambda loader: 3.6e-6, ch10._Checks(), hint="not one next")
    rejects_with_hint(ch10.judge, 1.0, ch10_measured(0.4), hint="not a guess")


def _with_startup(loader):
    import time

    start = time.perf_counter()
    n = sum(1 for _ in loader)
    return (time.perf_counter() - start) / n


def _divided_by_all(loader):
    return per_batch_seconds(loader) * (len(loader) - 1) / len(loader)


@pytest.mark.parametrize("wrong, hint", [
    (_with_startup, "included the wait for the first batch"),
    (_divided_by_all, "n - 1"),
    (lambda loader: 1 / per_batch_seconds(loader), "batches per second"),
])
def test_ch10_wrong_timers_are_rejected(wrong, hint):
    rejects_with_hint(ch10.check_overhead, wrong, 0.4, measure=lambda: pytest.fail("measured"), hint=hint)


@pytest.mark.parametrize("ratio, hint", [(2.5, "other way round"), (0.9, "interleaved rounds"), ("0.4", "positive")])
def test_ch10_wrong_ratios_are_rejected(ratio, hint):
    rejects_with_hint(ch10.judge, ratio, ch10_measured(0.4), hint=hint)
