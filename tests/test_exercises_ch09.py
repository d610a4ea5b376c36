"""The exercise checkers, ch09 (threads or processes): each passes a learner's copy of the reference answer and
rejects typical wrong answers with the hint that names the mistake.
"""


import pytest
from exercise_support import (
    rejects_with_hint,
)

from minidl.course.exercises import ch09_threads_or_processes as ch09

# --- ch09: threads or processes ----------------------------------------------------------------------


def ch09_measured(loop=(1.0, 0.5), sleep=(0.2, 0.1)):
    """loop / sleep: (multiprocessing seconds, thread seconds)."""
    return ch09.Measured({"python_loop": dict(zip(ch09.METHODS, ([loop[0]] * 3, [loop[1]] * 3))),
                          "sleep_numpy": dict(zip(ch09.METHODS, ([sleep[0]] * 3, [sleep[1]] * 3)))})


@pytest.mark.timeout(90)
def test_ch09_correct_answer_end_to_end(capsys):
    measured = ch09.measure(rounds=2)
    answer = {name: measured.faster(name) for name in ch09.WORKLOADS}
    ch09.check_choice(answer, measure=lambda: measured)
    assert "All 3 checks passed" in capsys.readouterr().out


def test_ch09_right_answer_passes_and_a_close_call_accepts_either(capsys):
    right = {"python_loop": "multiprocessing", "sleep_numpy": "thread"}
    ch09.judge(right, ch09_measured(loop=(0.5, 1.0)))
    ch09.judge({"python_loop": "thread", "sleep_numpy": "thread"}, ch09_measured(loop=(0.5, 0.55)))
    assert "either answer is accepted" in capsys.readouterr().out


def test_ch09_cheat_same_answer_for_both_is_rejected():
    rejects_with_hint(ch09.judge, {"python_loop": "thread", "sleep_numpy": "thread"}, ch09_measured(loop=(0.5, 1.0)),
                      hint="holds the GIL")


@pytest.mark.parametrize("answer, hint", [
    ({"python_loop": "thread", "sleep_numpy": "multiprocessing"}, "holds the GIL"),
    ({"python_loop": "processes", "sleep_numpy": "thread"}, "worker_method='multiprocessing'"),
    ({"loop": "multiprocessing", "sleep": "thread"}, "one answer per workload"),
    ("multiprocessing", "write a dict"),
])
def test_ch09_wrong_answers_are_rejected(answer, hint):
    rejects_with_hint(ch09.check_choice, answer, measure=lambda: ch09_measured(loop=(0.5, 1.0)), hint=hint)


def test_ch09_multiprocessing_for_the_sleep_workload_is_rejected():
    rejects_with_hint(ch09.judge, {"python_loop": "multiprocessing", "sleep_numpy": "multiprocessing"},
                      ch09_measured(loop=(0.5, 1.0), sleep=(0.2, 0.1)), hint="release the GIL")


def test_ch09_rounds_that_disagree_accept_either_answer(capsys):
    # The browser run's busy machine: threads faster in the median on the Python loop, processes in one round.
    busy = ch09.Measured({"python_loop": {"multiprocessing": [0.50, 0.60, 0.62], "thread": [0.52, 0.40, 0.41]},
                          "sleep_numpy": {"multiprocessing": [0.2] * 3, "thread": [0.1] * 3}})
    assert busy.faster("python_loop") == "thread" and busy.gap("python_loop") > ch09.BAND
    ch09.judge({"python_loop": "multiprocessing", "sleep_numpy": "thread"}, busy)
    assert "rounds range from 0.96x" in capsys.readouterr().out
    # The same median with every round agreeing still refuses the answer the rounds contradict.
    steady = ch09.Measured({"python_loop": {"multiprocessing": [0.60] * 3, "thread": [0.40] * 3},
                            "sleep_numpy": {"multiprocessing": [0.2] * 3, "thread": [0.1] * 3}})
    rejects_with_hint(ch09.judge, {"python_loop": "multiprocessing", "sleep_numpy": "thread"}, steady,
                      hint="holds the GIL")
