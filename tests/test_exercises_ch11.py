"""The exercise checkers, ch11 (vectorise or add workers): each passes a learner's copy of the reference answer and
rejects typical wrong answers with the hint that names the mistake.
"""

import statistics

import numpy as np
import pytest
from exercise_support import (
    learner_copy,
    rejects_with_hint,
)

from minidl_course.exercises import ch11_vectorise_or_workers as ch11

transform_batch = learner_copy("ch11_vectorise_or_workers").transform_batch


# --- ch11: vectorise or add workers ----------------------------------------------------------------------


def ch11_measured(workers=0.2512345, vectorised=0.0101234, batch_speedup=30.0):
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


def _per_image_loop(images):  # vectorised within each image, but a Python loop over the batch
    x = images.transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255)
    mean, std = ch11.MEAN.reshape(3, 1, 1), ch11.STD.reshape(3, 1, 1)
    return np.stack([(image - mean) / std for image in x])


def _maps_the_per_sample_transform(images):
    return np.stack(list(map(ch11.per_sample_transform, images)))


@pytest.mark.parametrize("cheat", [lambda images: np.stack([ch11.per_sample_transform(i) for i in images]),
                                   _per_image_loop, _maps_the_per_sample_transform])
def test_ch11_a_loop_over_the_images_is_refused_as_not_vectorised(cheat):
    """Right values, and a per-image loop of whole-image operations is many times faster than the row loop: what
    gives it away is Python work that grows with the batch, counted, not timed."""
    rejects_with_hint(ch11.check_transform, cheat, ch11._Checks(),
                      hint="(?s)Python work for every image.*not vectorised")


def test_ch11_the_reference_transform_runs_the_same_python_for_any_batch_size():
    small, large = (ch11.python_steps(transform_batch, ch11.make_images(b, 8)) for b in (4, 36))
    assert large == small


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
    ({"workers": 0.2512345, "vectorised": 0.0101234}, "workers", "choose 'vectorise'"),
    ({"workers": 0.0101234, "vectorised": 0.2512345}, "vectorise", "swapped"),
    ({"workers": 0.2512345, "vectorised": 0.2012345}, "vectorise", "interleaved rounds"),
    ({"workers": 0.25, "vectorised": 0.01}, "vectorise", "at most three decimals"),
])
def test_ch11_wrong_conclusions_are_rejected(seconds, choice, hint):
    rejects_with_hint(ch11.judge, seconds, choice, ch11_measured(), hint=hint)


def test_ch11_a_close_call_accepts_either_choice(capsys):
    ch11.judge({"workers": 0.1000001, "vectorised": 0.1050001}, "workers", ch11_measured(0.1, 0.105))
    assert "either choice is accepted" in capsys.readouterr().out


def test_ch11_speedup_is_the_median_of_per_round_ratios():
    measured = ch11.Measured([1.0, 4.0, 2.0], [1.0, 1.0, 2.0], 30.0)
    assert measured.speedup == 1.0  # rounds 1.0, 4.0, 1.0: the ratio of medians would say 2.0


def test_ch11_times_are_held_to_the_median_of_the_rounds_not_their_range():
    spread = ch11.Measured([1.0, 1.0, 1.0], [0.1, 0.1, 0.01], 30.0)  # median x10, range x10 to x100
    rejects_with_hint(ch11.judge, {"workers": 0.5012345, "vectorised": 0.0050123}, "vectorise", spread,
                      hint="interleaved rounds")


def test_ch11_times_in_milliseconds_are_named_even_when_their_ratio_is_right():
    rejects_with_hint(ch11.judge, {"workers": 251.2345, "vectorised": 10.1234}, "vectorise", ch11_measured(),
                      hint="milliseconds")
