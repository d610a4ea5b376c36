"""The exercise checkers, ch01 (the GIL-releasing Numba kernel): each passes a learner's copy of the reference answer
and rejects typical wrong answers with the hint that names the mistake.
"""


import numba
import pytest
from exercise_support import (
    learner_copy,
    rejects_with_hint,
)

from minidl.course.exercises import ch01_nogil as ch01
from minidl.course.toy import CpuBoundDataset

collatz_steps = learner_copy("ch01_nogil").collatz_steps


# --- ch01: a GIL-releasing Numba kernel ----------------------------------------------------------


def ch01_measured(speedup=1.6, progress=0.8):
    return ch01.Measured([speedup] * 3, progress, 10_000)


@pytest.mark.timeout(60)
def test_ch01_measure_runs_the_kernel_both_ways_and_gives_a_figure_per_round():
    """What it measures depends on the machine's load: only its shape is asserted here."""
    measured = ch01.measure(collatz_steps, rounds=2)
    assert 0 <= measured.python_progress <= 1 and measured.work >= 1000
    assert len(measured.speedups) in (1, 2) and all(s > 0 for s in measured.speedups)  # 1: judged GIL-holding


def test_ch01_correct_solution_end_to_end(capsys):
    """Every check of the kernel runs for real; the verdict on the figures comes from a scripted measurement."""
    ch01.check_nogil(collatz_steps, 1.5, measure=lambda k: ch01_measured(1.6))
    out = capsys.readouterr().out
    assert "Measured: a Python thread ran during 80%" in out and "All 12 checks passed" in out


def test_ch01_judge_accepts_a_speedup_within_tolerance():
    ch01.judge(collatz_steps, 1.4, ch01_measured(1.6))
    ch01.judge(collatz_steps, 1.9, ch01_measured(1.6))


def test_ch01_cheat_pure_python_delegating_to_the_library_is_rejected():
    def cheat(start, stop):  # minidl's own Collatz dataset, in plain Python: holds the GIL
        dataset = CpuBoundDataset(stop, work=1)
        return sum(dataset[i][1] for i in range(start - 1, stop - 1))

    ch01.check_output(cheat, ch01._Checks())  # its output is right: only the GIL test can catch it
    rejects_with_hint(ch01.judge, cheat, 1.6, ch01_measured(progress=0.02), hint="plain Python, which holds the GIL")


def test_ch01_cheat_hard_coded_ideal_speedup_is_rejected():
    rejects_with_hint(ch01.judge, collatz_steps, 2.0, ch01_measured(1.2), hint="2.0 is the ideal")


def test_ch01_njit_without_nogil_is_rejected():
    kernel = numba.njit(collatz_steps.py_func)
    kernel(1, 2)
    rejects_with_hint(ch01.judge, kernel, 1.0, ch01_measured(1.0, progress=0.03),
                      hint="without nogil, Numba's code keeps")


@pytest.mark.parametrize("wrong, hint", [
    (lambda a, b: sum(ch01.collatz_steps_python(n, n + 1) for n in range(a, b + 1)), "stop is excluded"),
    (lambda a, b: ch01.collatz_steps_python(a, b) + (b - a), "one step too many"),
    (lambda a, b: 111, "count the steps of every n"),
])
def test_ch01_wrong_kernels_are_rejected(wrong, hint):
    rejects_with_hint(ch01.check_nogil, wrong, 1.5, measure=lambda k: pytest.fail("measured a wrong kernel"), hint=hint)


@pytest.mark.parametrize("speedup, hint", [
    (0.6, "divided the other way round"),
    (3.2, "twice the work of one"),
    ("1.6x", "should be a number"),
    (1.0, "interleaved rounds"),
])
def test_ch01_wrong_speedups_are_rejected(speedup, hint):
    rejects_with_hint(ch01.judge, collatz_steps, speedup, ch01_measured(1.6), hint=hint)


def test_ch01_measures_a_gil_holding_kernel_as_holding_it():
    kernel = numba.njit(collatz_steps.py_func)
    measured = ch01.measure(kernel, rounds=1)
    released = ch01.measure(collatz_steps, rounds=1)
    assert measured.python_progress < released.python_progress


def test_a_figure_within_the_spread_of_the_checkers_own_rounds_is_accepted(capsys):
    # A busy machine: the checker's rounds went from 0.95x to 1.4x; the learner's 1.3x, from other rounds, fits.
    busy = ch01.Measured([0.95, 1.05, 1.4], 0.8, 10_000)
    ch01.judge(collatz_steps, 1.3, busy)
    quiet = ch01.Measured([0.95, 0.96, 0.97], 0.8, 10_000)  # on a quiet one the same figure is too far off
    rejects_with_hint(ch01.judge, collatz_steps, 1.3, quiet, hint="interleaved rounds")
