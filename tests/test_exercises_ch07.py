"""The exercise checkers, ch07 (what a new locked buffer per batch costs): each passes a learner's copy of the reference
answer and rejects typical wrong answers with the hint that names the mistake.
"""


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


def ch07_measured(ratio):
    return ch07.Measured([ratio * 1e-4] * 5, [1e-4] * 5)


@pytest.mark.measures
@pytest.mark.timeout(60)
def test_ch07_correct_solution_end_to_end(capsys):
    measured = ch07.measure(pin_copy)
    ch07.check_pin_copy(pin_copy, measured.ratio, measured.ratio > 1.3, measure=lambda f: measured)
    assert "All 7 checks passed" in capsys.readouterr().out
    assert pinning_demo.locked_bytes() in (0, None)  # every lock was released


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
    (1.0000001, True, "interleaved rounds"),
    (5.0000001, False, "reusing pays"),
    (5.0000001, "yes", "True or False"),
    (5.5, True, "at most three decimals"),
])
def test_ch07_wrong_conclusions_are_rejected(ratio, reuse_pays, hint):
    rejects_with_hint(ch07.judge, ratio, reuse_pays, ch07_measured(5.5), hint=hint)


def test_ch07_reuse_pays_true_is_rejected_when_fresh_is_as_cheap():
    rejects_with_hint(ch07.judge, 1.0500001, True, ch07_measured(1.05), hint="answer False")


# --- a ratio held to the median of the rounds, not their range ----------------------------------------------


def test_ch07_a_ratio_is_held_to_the_median_of_the_rounds_not_their_range():
    spread = ch07.Measured([10.4e-4, 10.4e-4, 10.4e-4, 20e-4, 40e-4], [1e-4] * 5)  # median 10.4, range 10.4-40
    rejects_with_hint(ch07.judge, 46.6000001, True, spread, hint="interleaved rounds")
    ch07.judge(12.1234567, True, spread)


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
