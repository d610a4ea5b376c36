"""The exercise checkers, ch10 (minidl's per-batch cost next to torch's): each passes a learner's copy of the
reference answer and rejects typical wrong answers with the hint that names the mistake.
"""

import statistics
from itertools import chain, count

import pytest
from exercise_support import (
    learner_copy,
    rejects_with_hint,
)

from minidl_course.exercises import _measure as harness
from minidl_course.exercises import ch10_overhead_ratio as ch10

per_batch_seconds = learner_copy("ch10_overhead_ratio").per_batch_seconds


# --- ch10: minidl's per-batch cost next to torch's -----------------------------------------------------


def ch10_measured(ratio):
    return ch10.logged([("minidl", ratio * 1e-5), ("torch", 1e-5)] * 5)


def test_ch10_the_learners_rounds_are_read_from_the_epochs_make_loaders_stamped():
    """Warm-ups and rounds in either order pair up; a loader run twice in a row pairs with the next other one."""
    epochs = [("minidl", 9.0), ("torch", 9.0), ("minidl", 2.0), ("torch", 1.0), ("torch", 0.8), ("minidl", 2.2),
              ("minidl", 5.0), ("minidl", 3.0), ("torch", 1.0)]
    measured = ch10.logged(epochs)
    assert measured.ratios("minidl", "torch") == [1.0, 2.0, 2.75, 3.0]


@pytest.mark.timeout(60)
def test_ch10_make_loaders_stamps_each_epoch_run_to_its_end_and_the_reference_timer_agrees():
    loaders = ch10.make_loaders(200)
    ch10.EPOCHS.clear()
    yours = [per_batch_seconds(loaders[name]) for name in ("minidl", "torch")]
    next(iter(loaders["minidl"]))  # a half-read epoch is not one
    assert [name for name, _ in ch10.EPOCHS] == ["minidl", "torch"]
    assert all(abs(y / s - 1) < 0.1 for y, (_, s) in zip(yours, ch10.EPOCHS)), (yours, list(ch10.EPOCHS))


def _rounds(loaders, rounds=5):
    """A learner's cell: a warm-up each, then rounds in alternating order; the median of per-round ratios."""
    for name in loaders:
        per_batch_seconds(loaders[name])
    ratios = []
    for r in range(rounds):
        took = {name: per_batch_seconds(loaders[name]) for name in (("minidl", "torch"), ("torch", "minidl"))[r % 2]}
        ratios.append(took["minidl"] / took["torch"])
    return statistics.median(ratios)


def _none_of_these_rounds_gave(ratios):
    """The README's figure, else its other one, else one further off: the first that no median of the latest 3 or
    more rounds comes within the checker's factor of, either way round (a busy machine's rounds can reach both)."""
    medians = harness.latest_medians(ratios)

    def gave(x):
        return any(harness.close(y, m, ch10.RATIO_FACTOR) for y in (x, 1 / x) for m in medians)

    candidates = chain((0.36217, 0.7221745), (max(medians) * 3.0001**k for k in count(1)))
    return next(x for x in candidates if not gave(x))


@pytest.mark.parametrize(("rounds", "guess"), [
    ([2.0, 2.1, 1.9], 0.36217),
    ([0.35, 0.37, 0.36], 0.7221745),
    ([0.46, 0.16, 2.19, 0.15, 0.52, 0.16], 0.7221745),  # a busy machine's: the latest 4 give 0.34, near 0.36
    ([0.36] * 5 + [0.72] * 3, None),  # medians near both README figures: one further off
])
def test_the_guess_is_a_figure_the_rounds_did_not_give_and_is_refused(rounds, guess):
    chosen = _none_of_these_rounds_gave(rounds)
    assert chosen == guess if guess else chosen not in (0.36217, 0.7221745)
    measured = ch10.logged([pair for r in rounds for pair in (("minidl", r * 1e-5), ("torch", 1e-5))])
    rejects_with_hint(ch10.judge, chosen, measured, hint="not a figure from the README")


@pytest.mark.measures
@pytest.mark.timeout(60)
def test_ch10_a_guessed_ratio_is_refused_and_the_measured_one_accepted(capsys):
    """The learner's rounds are stamped as they run: the README's 0.36, typed in or dressed up, is refused unless the
    learner's own rounds gave it; the ratio the rounds gave is accepted."""
    ch10.EPOCHS.clear()
    ratio = _rounds(ch10.make_loaders(500))
    ch10.check_overhead(per_batch_seconds, ratio)
    assert "All 3 checks passed" in capsys.readouterr().out
    wrong = _none_of_these_rounds_gave(ch10.logged().ratios("minidl", "torch"))
    rejects_with_hint(ch10.check_overhead, per_batch_seconds, wrong, hint="not a figure from the README")
    rejects_with_hint(ch10.check_overhead, per_batch_seconds, 0.36, hint="report the number your code computed")
    ch10.EPOCHS.clear()
    rejects_with_hint(ch10.check_overhead, per_batch_seconds, ratio, hint="(?s)no epoch of make_loaders.*time rounds")


def test_the_checker_carries_no_copy_of_the_answer():
    import inspect

    source = inspect.getsource(ch10)
    assert "first = last = time.perf_counter()" not in source and "def reference_per_batch" not in source


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


def _first_batch_only(loader):
    import time

    start = time.perf_counter()
    next(iter(loader))
    return time.perf_counter() - start


@pytest.mark.parametrize("wrong, hint", [
    (_with_startup, "included the wait for the first batch"),
    (_first_batch_only, r"timed iter\(\) and the first next\(\): the wait for the first batch alone"),
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


def _times_nothing(loader):
    return 0.0100001 if len(loader) == 11 else 0.0500001


def test_ch10_a_timer_that_returns_a_constant_is_refused_on_the_checkers_clock():
    rejects_with_hint(ch10.check_overhead, _times_nothing, 1.0000001,
                      hint=r"returned 0.0100001 without running an epoch of the paced loader")


def test_ch10_a_timer_in_milliseconds_is_named():
    def in_ms(loader):
        return per_batch_seconds(loader) * 1000

    rejects_with_hint(ch10.check_timer, in_ms, ch10._Checks(), hint="milliseconds")
