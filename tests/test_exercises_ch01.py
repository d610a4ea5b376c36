"""The exercise checkers, ch01 (the GIL-releasing Numba kernel): each passes a learner's copy of the reference answer
and rejects typical wrong answers with the hint that names the mistake.
"""

import statistics
import threading
import time

import numba
import pytest
from exercise_support import (
    learner_copy,
    rejects_with_hint,
)

from minidl_course.exercises import ch01_nogil as ch01
from minidl_course.toy import CpuBoundDataset

answer = learner_copy("ch01_nogil")
collatz_steps, thread_speedups = answer.collatz_steps, answer.thread_speedups


# --- ch01: a GIL-releasing Numba kernel ----------------------------------------------------------


def ch01_measured(speedup=1.6, progress=0.8):
    return ch01.Measured([speedup] * 3, progress, 10_000)


@pytest.mark.timeout(60)
def test_ch01_measure_runs_the_kernel_both_ways_and_gives_a_figure_per_round():
    """What it measures depends on the machine's load: only its shape is asserted here."""
    measured = ch01.measure(collatz_steps, thread_speedups, rounds=2)
    assert 0 <= measured.python_progress <= 1 and measured.work >= 1000
    assert len(measured.speedups) in (1, 2) and all(s > 0 for s in measured.speedups)  # 1: judged GIL-holding


def test_ch01_correct_solution_end_to_end(capsys):
    """Every check of the kernel and of the timing function runs for real; the verdict on the figures comes from a
    scripted measurement."""
    ch01.check_nogil(collatz_steps, thread_speedups, 1.5, measure=lambda k, f: ch01_measured(1.6))
    out = capsys.readouterr().out
    assert "Measured: a Python thread ran during 80%" in out and "All 14 checks passed" in out


_TURNS = threading.Lock()


def _taking_turns(start, stop):
    """The learner's kernel behind a lock: right answers, the GIL released, but two threads take turns (x1). It
    also sleeps 2 µs per integer, ten times its compute, so a busy machine can't make one round differ."""
    with _TURNS:
        time.sleep((stop - start) * 2e-6)
        return collatz_steps(start, stop)


@pytest.mark.timeout(120)
def test_ch01_a_guessed_speedup_is_refused_and_the_measured_one_accepted(capsys):
    """The checker runs the learner's own thread_speedups on the kernel: notebook 01's 1.8 typed in is refused where
    two threads take turns (x1 on any machine, however busy), and what the learner's code measured is accepted."""
    measured = statistics.median(thread_speedups(_taking_turns, 100_000, 3))
    assert measured < 1.3  # a lock makes the two threads take turns
    ch01.check_nogil(_taking_turns, thread_speedups, measured)
    assert "All 14 checks passed" in capsys.readouterr().out
    rejects_with_hint(ch01.check_nogil, _taking_turns, thread_speedups, 1.8, hint="not a number from elsewhere")


def _one_round_only(kernel, span, rounds):
    return thread_speedups(kernel, span, 1)


@pytest.mark.parametrize("timer, hint", [
    (lambda kernel, span, rounds: [1.8] * rounds, "take turns can't beat one"),
    (lambda kernel, span, rounds: [1 / x for x in thread_speedups(kernel, span, rounds)], "other way round"),
    (lambda kernel, span, rounds: statistics.median(thread_speedups(kernel, span, rounds)), "return the list"),
    (_one_round_only, "one per round"),
])
def test_ch01_wrong_timing_functions_are_rejected_on_the_stand_ins(timer, hint):
    rejects_with_hint(ch01.check_nogil, collatz_steps, timer, 1.5, measure=lambda k, f: pytest.fail("measured"),
                      hint=hint)


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
    rejects_with_hint(ch01.check_nogil, wrong, thread_speedups, 1.5,
                      measure=lambda k, f: pytest.fail("measured a wrong kernel"), hint=hint)


@pytest.mark.parametrize("speedup, hint", [
    (0.6, "divided the other way round"),
    ("1.6x", "should be a number"),
    (1.0, "not a number from elsewhere"),
])
def test_ch01_wrong_speedups_are_rejected(speedup, hint):
    rejects_with_hint(ch01.judge, collatz_steps, speedup, ch01_measured(1.6), hint=hint)


def test_ch01_measures_a_gil_holding_kernel_as_holding_it():
    kernel = numba.njit(collatz_steps.py_func)
    measured = ch01.measure(kernel, thread_speedups, rounds=1)
    released = ch01.measure(collatz_steps, thread_speedups, rounds=1)
    assert measured.python_progress < released.python_progress


def test_a_figure_within_the_spread_of_the_checkers_own_rounds_is_accepted(capsys):
    # A busy machine: the checker's rounds went from 0.95x to 1.4x; the learner's 1.3x, from other rounds, fits.
    busy = ch01.Measured([0.95, 1.05, 1.4], 0.8, 10_000)
    ch01.judge(collatz_steps, 1.3, busy)
    quiet = ch01.Measured([0.95, 0.96, 0.97], 0.8, 10_000)  # on a quiet one the same figure is too far off
    rejects_with_hint(ch01.judge, collatz_steps, 1.3, quiet, hint="not a number from elsewhere")
