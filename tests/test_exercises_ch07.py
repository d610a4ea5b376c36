"""The exercise checkers, ch07 (what a new locked buffer per batch costs): each passes a learner's copy of the reference
answer and rejects typical wrong answers with the hint that names the mistake.
"""

import statistics
import time
from collections import deque

import numpy as np
import pytest
from exercise_support import (
    learner_copy,
    rejects_with_hint,
)

from minidl_course import pinning_demo
from minidl_course.exercises import ch07_pinning_cost as ch07
from minidl_course.pinning_demo import FakePinnable

pin_copy = learner_copy("ch07_pinning_cost").pin_copy


# --- ch07: what a new locked buffer per batch costs -------------------------------------------------


def ch07_measured(ratio, calls=ch07.MIN_LOGGED):
    return ch07.Measured([ratio * 1e-4] * calls, [1e-4] * calls)


def learners_rounds(rounds=6, calls=5):
    """The solution's timing loop, as a learner runs it: interleaved rounds with the exercise's clocked functions."""
    batch, per_call = ch07.make_batch(), {"pin": [], "copy": []}
    reused = np.empty_like(batch)
    for r in range(rounds):
        for name in (("pin", "copy") if r % 2 == 0 else ("copy", "pin")):
            start = time.perf_counter()
            for _ in range(calls):
                pin_copy(batch, ch07.lock_pages) if name == "pin" else ch07.copy_into(reused, batch)
            per_call[name].append((time.perf_counter() - start) / calls)
    return statistics.median(p / c for p, c in zip(per_call["pin"], per_call["copy"]))


@pytest.mark.measures
@pytest.mark.timeout(60)
def test_ch07_correct_solution_end_to_end(capsys):
    ch07.CALLS.clear()
    ratio = learners_rounds()
    ch07.check_pin_copy(pin_copy, ratio, ratio > 1.3)
    out = capsys.readouterr().out
    assert "All 7 checks passed" in out and "Clocked: 30 of your latest calls inside lock_pages, 30 of copy_into" in out
    assert pinning_demo.locked_bytes() in (0, None)  # every lock was released


def test_ch07_the_exercises_functions_clock_each_call_and_the_latest_are_judged():
    calls = deque([("pin", 9.0)] * 40 + [("copy", 1.0)] * 30 + [("pin", 4.0)] * ch07.LOGGED)
    measured = ch07.clocked(calls=calls)
    assert (len(measured.pinned), len(measured.reused), measured.ratio) == (ch07.LOGGED, 30, 4.0)  # 9 s calls: older
    ch07.CALLS.clear()
    batch = ch07.make_batch(4096)
    with ch07.lock_pages(np.empty_like(batch)):
        pass
    ch07.copy_into(np.empty_like(batch), batch)
    assert [kind for kind, seconds in ch07.CALLS if seconds > 0] == ["pin", "copy"]


@pytest.mark.parametrize("calls", [0, ch07.MIN_LOGGED - 1])
def test_ch07_a_ratio_with_too_few_clocked_calls_behind_it_is_refused(calls):
    ch07.CALLS.clear()
    ch07.CALLS.extend([("pin", 4e-3)] * calls + [("copy", 1e-4)] * calls)
    rejects_with_hint(ch07.check_pin_copy, pin_copy, 40.1234567, True, hint="imported from this exercise")


def test_ch07_judge_tolerance_and_band(capsys):
    ch07.judge(4.0000001, True, ch07_measured(5.5))
    ch07.judge(1.3000001, False, ch07_measured(1.3))
    ch07.judge(1.3000001, True, ch07_measured(1.3))
    assert "either answer is accepted" in capsys.readouterr().out


def test_ch07_cheat_delegating_to_fake_pinnable_is_rejected():
    def cheat(batch, lock_pages):
        return FakePinnable(batch).pin_memory().value

    rejects_with_hint(ch07.check_copies, cheat, ch07._Checks(), hint="leaves out the locking")


_module_buffer = {}


@pytest.mark.parametrize("wrong, hint", [
    (lambda batch, lock: batch, "holding a copy of the batch"),
    (lambda batch, lock: batch.astype(np.int16), "np.empty_like"),
    (lambda batch, lock: _lock_the_batch(batch, lock), "not the batch"),
    (lambda batch, lock: _reuse(batch, lock), "allocate it inside pin_copy"),
])
def test_ch07_wrong_copies_are_rejected(wrong, hint):
    rejects_with_hint(ch07.check_pin_copy, wrong, 5.0, True, measure=lambda f: pytest.fail("measured"), hint=hint)


def _lock_the_batch(batch, lock_pages):
    with lock_pages(batch):
        return batch.copy()


def _reuse(batch, lock_pages):
    out = _module_buffer.get(batch.shape)
    if out is None:
        out = _module_buffer[batch.shape] = np.empty_like(batch)
    with lock_pages(out):
        np.copyto(out, batch)
    return out


@pytest.mark.parametrize("ratio, reuse_pays, hint", [
    (0.1800001, True, "divided the other way round"),
    (1.0000001, True, "rounds you timed"),
    (5.0000001, False, "reusing pays"),
    (5.0000001, "yes", "True or False"),
    (5.5, True, "at most three decimals"),
])
def test_ch07_wrong_conclusions_are_rejected(ratio, reuse_pays, hint):
    rejects_with_hint(ch07.judge, ratio, reuse_pays, ch07_measured(5.5), hint=hint)


def test_ch07_reuse_pays_true_is_rejected_when_fresh_is_as_cheap():
    rejects_with_hint(ch07.judge, 1.0500001, True, ch07_measured(1.05), hint="answer False")


def test_ch07_a_ratio_is_held_to_the_median_of_the_clocked_calls_not_their_range():
    spread = ch07.Measured([10.4e-4] * 12 + [40e-4] * 8, [1e-4] * 20)  # median 10.4, range 10.4-40
    rejects_with_hint(ch07.judge, 40.1234567, True, spread, hint="rounds you timed")
    ch07.judge(12.1234567, True, spread)


def test_ch07_a_ratio_of_rounds_a_burst_of_load_lengthened_is_held_to_the_calls_means():
    # A round's time is a sum: a burst of load that holds up two short copies moves the learner's per-round ratio
    # towards the ratio of the calls' means, far from the ratio of their medians (30 here, means 6.1).
    burst = ch07.Measured([30e-4] * 20, [1e-4] * 18 + [40e-4] * 2)
    ch07.judge(8.0000001, True, burst)
    # rounds a burst reached in part: the median round's ratio lies between the two, far (here 1.8x, 2.8x) from both
    ch07.judge(17.0000001, True, burst)
    for wrong in (3.0000001, 70.0000001):
        rejects_with_hint(ch07.judge, wrong, True, burst, hint="rounds you timed")


_two_buffers = {}


def _alternates_two_buffers(batch, lock_pages):
    pair, turn = _two_buffers.setdefault(batch.shape, ([np.empty_like(batch), np.empty_like(batch)], [0]))
    out = pair[turn[0] % 2]
    turn[0] += 1
    with lock_pages(out):
        np.copyto(out, batch)
    return out


def test_ch07_a_pin_copy_that_alternates_two_preallocated_buffers_is_refused():
    rejects_with_hint(ch07.check_pin_copy, _alternates_two_buffers, 5.0000001, True,
                      measure=lambda f: pytest.fail("measured"),
                      hint="(?s)call 5:.*the one call 3 returned.*buffers kept")
