"""The exercise checkers, ch10 (minidl's per-batch cost next to torch's): each passes a learner's copy of the
reference answer and rejects typical wrong answers with the hint that names the mistake.
"""

import statistics

import pytest
from exercise_support import (
    learner_copy,
    rejects_with_hint,
)

from minidl_course.exercises import ch10_overhead_ratio as ch10

per_batch_seconds = learner_copy("ch10_overhead_ratio").per_batch_seconds


# --- ch10: minidl's per-batch cost next to torch's -----------------------------------------------------


def ch10_measured(ratio):
    return ch10.harness.Rounds({"minidl": [ratio * 1e-5] * 5, "torch": [1e-5] * 5})


def test_ch10_measure_runs_the_learners_timer_on_both_loaders_in_rotating_rounds():
    """The checker's rounds call the learner's per_batch_seconds: a warm-up each, then minidl, torch; torch, minidl."""
    calls, values = [], iter([9.0, 9.0, 2.0, 1.0, 0.8, 2.2])

    def timer(loader):
        calls.append(loader.loader)  # the checker's clocked wrapper around each loader
        return next(values)

    measured = ch10.measure(timer, rounds=2, loaders={"minidl": "m", "torch": "t"})
    assert calls == ["m", "t", "m", "t", "t", "m"]
    assert measured["minidl"] == [2.0, 2.2] and measured["torch"] == [1.0, 0.8]
    assert measured.ratios("minidl", "torch") == [2.0, 2.75]


def test_ch10_a_timer_that_returns_no_number_on_the_real_loaders_is_named():
    with pytest.raises(AssertionError, match="returned None for the minidl loader"):
        ch10.measure(lambda loader: None, rounds=1, loaders={"minidl": "m", "torch": "t"})


# the two loaders at the same cost per batch: known timings, the same on a busy machine
SAME_COST = {"minidl": ch10.PacedLoader(21, 0.0, 0.003), "torch": ch10.PacedLoader(21, 0.0, 0.003)}


@pytest.mark.measures
@pytest.mark.timeout(60)
def test_ch10_a_guessed_ratio_is_refused_and_the_measured_one_accepted(capsys):
    """The checker runs the learner's own timer: the README's 0.36, typed in where that timer measures the two
    loaders at the same cost, is refused; the ratio the learner's rounds gave is accepted."""
    def measure(timer):
        return ch10.measure(timer, loaders=SAME_COST)

    ratios = [per_batch_seconds(SAME_COST["minidl"]) / per_batch_seconds(SAME_COST["torch"]) for _ in range(3)]
    ratio = sorted(ratios)[1]
    ch10.check_overhead(per_batch_seconds, ratio, measure=measure)
    assert "All 3 checks passed" in capsys.readouterr().out
    rejects_with_hint(ch10.check_overhead, per_batch_seconds, 0.36, measure=measure,
                      hint="report the number your code computed")
    rejects_with_hint(ch10.check_overhead, per_batch_seconds, 0.3612345, measure=measure,
                      hint="not a figure from the README")


def test_the_checker_carries_no_copy_of_the_answer():
    import inspect

    source = inspect.getsource(ch10)
    assert "first = last = time.perf_counter()" not in source and "def reference_per_batch" not in source


@pytest.mark.measures
@pytest.mark.timeout(60)
def test_ch10_correct_solution_end_to_end(capsys):
    measured = ch10.measure(per_batch_seconds, rounds=3)
    ratio = statistics.median(measured.ratios("minidl", "torch"))
    ch10.check_overhead(per_batch_seconds, ratio, measure=lambda timer: measured)
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


@pytest.mark.parametrize("ratio, hint", [(2.5000001, "other way round"), (0.9000001, "not a figure from"),
                                         ("0.4", "positive"), (0.4, "at most three decimals"),
                                         (0.9123456, "not a figure from")])
def test_ch10_wrong_ratios_are_rejected(ratio, hint):
    rejects_with_hint(ch10.judge, ratio, ch10_measured(0.4), hint=hint)


# --- the learner's timer held to the checker's clock --------------------------------------------------------


def _constant_on_real_loaders(loader):  # honest on the paced stand-ins, a constant on the loaders
    return per_batch_seconds(loader) if len(loader) < 100 else 1.2345e-5


def _times_nothing(loader):
    return 0.0100001 if len(loader) == 11 else 0.0500001


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timer, hint", [
    (_constant_on_real_loaders, r"returned 1.2345e-05 without running an epoch of the minidl loader"),
    (_times_nothing, r"returned 0.0100001 without running an epoch of the paced loader"),
])
def test_ch10_a_timer_that_returns_a_constant_is_refused_on_the_checkers_clock(timer, hint):
    rejects_with_hint(ch10.check_overhead, timer, 1.0000001, hint=hint)


def test_ch10_a_timer_in_milliseconds_is_named():
    def in_ms(loader):
        return per_batch_seconds(loader) * 1000

    rejects_with_hint(ch10.check_timer, in_ms, ch10._Checks(), hint="milliseconds")
