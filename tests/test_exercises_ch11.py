"""The exercise checkers, ch11 (vectorise or add workers): each passes a learner's copy of the reference answer and
rejects typical wrong answers with the hint that names the mistake.
"""

import statistics

import numpy as np
import pytest
from exercise_support import (
    ScriptedClock,
    learner_copy,
    rejects_with_hint,
)

from minidl_course.exercises import ch11_vectorise_or_workers as ch11

transform_batch = learner_copy("ch11_vectorise_or_workers").transform_batch


# --- ch11: vectorise or add workers ----------------------------------------------------------------------


def ch11_measured(workers=0.25, vectorised=0.01, batch_speedup=30.0):
    return ch11.Measured([workers] * 3, [vectorised] * 3, batch_speedup)


@pytest.mark.timeout(60)
def test_ch11_measure_times_both_epochs_each_round():
    """What it measures depends on the machine's load: only its shape is asserted here."""
    measured = ch11.measure(transform_batch, rounds=2)
    assert len(measured.workers) == len(measured.vectorised) == 2
    assert all(t > 0 for t in measured.workers + measured.vectorised) and measured.batch_speedup > 0


def test_ch11_correct_solution_end_to_end(capsys):
    """Every check of the transform runs for real; the verdict on the figures comes from a scripted measurement."""
    measured = ch11_measured()
    seconds = {"workers": statistics.median(measured.workers), "vectorised": statistics.median(measured.vectorised)}
    ch11.check_decision(transform_batch, seconds, "vectorise", measure=lambda f: measured)
    assert "All 7 checks passed" in capsys.readouterr().out


def test_ch11_cheat_loop_over_the_per_sample_transform_is_rejected():
    def cheat(images):
        return np.stack([ch11.per_sample_transform(image) for image in images])

    ch11.check_transform(cheat, ch11._Checks())  # right values: only its speed gives it away
    # the loop and the cheat take about as long; batch_speedup is the ratio of their medians: 1.1, below the bar
    loop, cheat_run = [1.1, 1.0, 1.2, 1.1, 1.1], [1.0] * 5
    timed = [loop[0], cheat_run[0], cheat_run[1], loop[1], loop[2], cheat_run[2], cheat_run[3], loop[3], loop[4],
             cheat_run[4]]  # interleaved's order: loop, batch, then batch, loop, ...
    assert ch11.batch_speedup(cheat, clock=ScriptedClock(timed)) == pytest.approx(1.1)
    rejects_with_hint(ch11.judge, {"workers": 0.25, "vectorised": 0.2}, "vectorise", ch11_measured(0.25, 0.2, 1.1),
                      hint="not vectorised")


@pytest.mark.parametrize("wrong, hint", [
    (lambda x: (x.astype(np.float32) / np.float32(255) - ch11.MEAN) / ch11.STD, "channels first"),
    (lambda x: (x.transpose(0, 3, 1, 2).astype(np.float32) - ch11.MEAN.reshape(1, 3, 1, 1)) / ch11.STD.reshape(
        1, 3, 1, 1), "divide by 255 first"),
    (lambda x: (x.transpose(0, 3, 1, 2) / 255.0 - ch11.MEAN.astype(np.float64).reshape(1, 3, 1, 1))
     / ch11.STD.astype(np.float64).reshape(1, 3, 1, 1), "should be float32"),
])
def test_ch11_wrong_transforms_are_rejected(wrong, hint):
    rejects_with_hint(ch11.check_decision, wrong, {"workers": 0.25, "vectorised": 0.01}, "vectorise",
                      measure=lambda f: pytest.fail("measured"), hint=hint)


@pytest.mark.parametrize("seconds, choice, hint", [
    ({"workers": 0.25, "vectorised": 0.01}, "workers", "choose 'vectorise'"),
    ({"workers": 0.01, "vectorised": 0.25}, "vectorise", "swapped"),
    ({"workers": 0.25, "vectorised": 0.2}, "vectorise", "interleaved rounds"),
])
def test_ch11_wrong_conclusions_are_rejected(seconds, choice, hint):
    rejects_with_hint(ch11.judge, seconds, choice, ch11_measured(), hint=hint)


def test_ch11_a_close_call_accepts_either_choice(capsys):
    ch11.judge({"workers": 0.1, "vectorised": 0.105}, "workers", ch11_measured(0.1, 0.105))
    assert "either choice is accepted" in capsys.readouterr().out


def test_ch11_speedup_is_the_median_of_per_round_ratios():
    measured = ch11.Measured([1.0, 4.0, 2.0], [1.0, 1.0, 2.0], 30.0)
    assert measured.speedups == [1.0, 4.0, 1.0] and measured.speedup == 1.0  # the ratio of medians would say 2.0
