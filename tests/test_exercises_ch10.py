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


def test_ch10_measure_takes_a_short_epoch_from_a_long_one_so_start_up_cancels():
    """The checker's own measurement, not the learner's formula: (long epoch - short epoch) / the batches between."""
    # interleaved's order: round 0 minidl-long, torch-long, minidl-short, torch-short; round 1 starts one later
    clock = ScriptedClock([3.0, 1.5, 1.0, 0.5, 1.2, 1.1, 0.4, 3.3])
    measured = ch10.measure(rounds=2, clock=clock)
    between = ch10.BATCHES - ch10.SHORT
    assert measured.minidl == pytest.approx([2.0 / between, 2.2 / between])
    assert measured.torch == pytest.approx([1.0 / between, 0.8 / between])
    assert measured.ratio == pytest.approx((2.0 + 2.75) / 2)  # the median of the per-round ratios 2.0 and 2.75


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
