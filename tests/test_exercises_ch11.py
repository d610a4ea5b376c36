"""The exercise checkers, ch11 (the row loop, whole-array per image, per batch; vectorise or add workers): each passes
a learner's copy of the reference answer and rejects typical wrong answers with the hint that names the mistake.
"""

import statistics
from operator import methodcaller

import numpy as np
import pytest
from exercise_support import learner_copy, no_children_left, rejects_with_hint

from minidl_course.exercises import ch11_vectorise_or_workers as ch11

answer = learner_copy("ch11_vectorise_or_workers")
transform_sample, transform_batch = answer.transform_sample, answer.transform_batch
M4, S4 = ch11.MEAN.reshape(1, 3, 1, 1), ch11.STD.reshape(1, 3, 1, 1)


def ch11_measured(workers=(0.2512345,) * 3, vectorised=(0.0101234,) * 3):
    return ch11.Measured(list(workers), list(vectorised))


def _learners_rounds(rounds=3):
    """The learner's cell: a warm-up each, then interleaved rounds; the medians and the faster option."""
    images = ch11.make_images(96)
    options = {"workers": lambda: ch11.workers_epoch(images),
               "vectorised": lambda: ch11.vectorised_epoch(images, transform_batch)}
    times = {name: [] for name in options}
    for run in options.values():
        run()
    for r in range(rounds):
        for name in list(options)[::1 if r % 2 == 0 else -1]:
            start = ch11.time.perf_counter()
            options[name]()
            times[name].append(ch11.time.perf_counter() - start)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    return seconds, "vectorise" if seconds["vectorised"] < seconds["workers"] else "workers"


@pytest.mark.measures
@pytest.mark.timeout(120)
def test_ch11_the_learners_own_epochs_decide_and_a_typed_or_borrowed_time_is_refused(capsys):
    """The epochs are noted on the checker's clock as the learner's cell runs them: the medians the cell computed
    pass, whatever the load did since; times typed in (the README's, another run's) fail, however many decimals."""
    ch11.EPOCHS.clear()
    seconds, choice = _learners_rounds()
    ch11.check_decision(transform_sample, transform_batch, seconds, choice)
    out = capsys.readouterr().out
    assert "Your notebook's epochs" in out
    assert "All 12 checks passed" in out and not no_children_left()
    borrowed = {"workers": 1.0517, "vectorised": 0.03461}
    rejects_with_hint(ch11.judge, borrowed, "vectorise", ch11.measure(),
                      hint="set seconds from your own rounds")


def test_ch11_compare_transforms_times_the_three_ways_on_one_batch(capsys):
    times = ch11.compare_transforms(transform_sample, transform_batch, rounds=1)
    assert list(times) == ["the row loop, per image", "whole-array, per image", "whole-array, per batch"]
    assert all(t > 0 for t in times.values()) and "the row loop removed" in capsys.readouterr().out


def test_ch11_with_no_epochs_run_the_times_are_refused():
    rejects_with_hint(ch11.judge, {"workers": 0.2512345, "vectorised": 0.0101234}, "vectorise",
                      ch11_measured((), ()), hint="it notes each epoch on the checker's clock")


def _per_image_loop(images):  # vectorised within each image, but a Python loop over the batch
    x = images.transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255)
    return np.stack([(image - M4[0]) / S4[0] for image in x])


def _maps_the_per_sample_transform(images):
    return np.stack(list(map(ch11.per_sample_transform, images)))


def _a_per_image_loop_run_in_c(images):
    x = np.stack(list(map(methodcaller("transpose", 2, 0, 1), images))).astype(np.float32) / np.float32(255)
    return (x - M4) / S4


@pytest.mark.parametrize("cheat", [lambda images: np.stack([ch11.per_sample_transform(i) for i in images]),
                                   _per_image_loop, _maps_the_per_sample_transform, _a_per_image_loop_run_in_c])
def test_ch11_a_loop_over_the_images_is_refused_as_not_vectorised(cheat):
    """Right values; what gives a loop away is work that grows with the batch (Python steps, or arrays made from the
    input one image at a time, in C too), counted, not timed."""
    rejects_with_hint(ch11.check_transforms, transform_sample, cheat, ch11._Checks(),
                      hint="(?s)transform_batch on 4 and on 36 images.*work for every one of the images.*not "
                           "vectorised")


def _row_loop_in_c(image):
    x = image.transpose(2, 0, 1)
    rows = np.stack(list(map(methodcaller("astype", np.float32), x.reshape(-1, x.shape[2]))))  # a row at a time
    return (rows.reshape(x.shape) / np.float32(255) - M4[0]) / S4[0]


@pytest.mark.parametrize("wrong", [ch11.per_sample_transform, _row_loop_in_c])
def test_ch11_a_sample_transform_that_loops_over_rows_is_refused(wrong):
    rejects_with_hint(ch11.check_transforms, wrong, transform_batch, ch11._Checks(),
                      hint="(?s)transform_sample on 4 and on 36 rows.*not vectorised")


def test_ch11_the_reference_transforms_run_the_same_python_for_any_size():
    assert len({ch11.python_steps(transform_batch, "b", ch11.make_images(b, 8)) for b in (4, 36)}) == 1
    assert len({ch11.python_steps(transform_sample, "s", ch11.make_images(1, s)[0]) for s in (4, 36)}) == 1


def test_ch11_other_right_transforms_are_accepted():
    def by_moveaxis(images):
        return ((np.moveaxis(images, -1, -3) / np.float32(255)).astype(np.float32) - M4[0] if images.ndim == 3
                else (np.moveaxis(images, -1, -3) / np.float32(255)).astype(np.float32) - M4) / (
                    S4[0] if images.ndim == 3 else S4)

    checks = ch11._Checks()
    ch11.check_transforms(by_moveaxis, by_moveaxis, checks)
    assert checks.passed == 8


@pytest.mark.parametrize("wrong, hint", [
    (lambda x: (x.astype(np.float32) / np.float32(255) - ch11.MEAN) / ch11.STD, "channels first"),
    (lambda x: (x.transpose(0, 3, 1, 2).astype(np.float32) - M4) / S4, "divide by 255 first"),
    (lambda x: (x.transpose(0, 3, 1, 2) / 255.0 - M4.astype(np.float64)) / S4.astype(np.float64),
     "should be float32"),
])
def test_ch11_wrong_transforms_are_rejected(wrong, hint):
    rejects_with_hint(ch11.check_decision, transform_sample, wrong, {"workers": 0.25, "vectorised": 0.01},
                      "vectorise", measure=lambda: pytest.fail("measured"), hint=hint)


@pytest.mark.parametrize("seconds, choice, hint", [
    ({"workers": 0.2512345, "vectorised": 0.0101234}, "workers", "choose the faster option, as your times say"),
    ({"workers": 0.0101234, "vectorised": 0.2512345}, "vectorise", "swapped"),
    ({"workers": 0.2512345, "vectorised": 0.2012345}, "vectorise", "set seconds from your own rounds"),
    ({"workers": 0.25, "vectorised": 0.01}, "vectorise", "set seconds from your own rounds"),
    ({"workers": 251.2345, "vectorised": 10.1234}, "vectorise", "milliseconds"),
])
def test_ch11_wrong_conclusions_are_rejected(seconds, choice, hint):
    rejects_with_hint(ch11.judge, seconds, choice, ch11_measured(), hint=hint)


def test_ch11_a_close_call_accepts_either_choice(capsys):
    ch11.judge({"workers": 0.1000001, "vectorised": 0.1050001}, "workers", ch11_measured([0.1] * 3, [0.105] * 3))
    assert "either choice is accepted" in capsys.readouterr().out


def test_ch11_times_are_held_to_the_median_of_the_latest_epochs_not_their_range():
    spread = ch11_measured([1.0, 1.0, 1.0], [0.1, 0.1, 0.01])  # latest 2: median 0.055; all 3: 0.1
    rejects_with_hint(ch11.judge, {"workers": 1.0000001, "vectorised": 0.0300123}, "vectorise", spread,
                      hint="set seconds from your own rounds")
    ch11.judge({"workers": 1.0000001, "vectorised": 0.1000001}, "vectorise", spread)
