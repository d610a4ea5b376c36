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


def ch01_measured(speedup=1.6, yours=None):
    yours = [speedup] * 3 if yours is None else yours
    return ch01.Measured([speedup] * 3, 10_000, [speedup] * 3, yours=yours)


MEASURED_1_5 = 1.5000001234  # a number as a learner's code computes it: not three decimals


@pytest.mark.timeout(60)
def test_ch01_measure_runs_the_kernel_both_ways_and_gives_a_figure_per_round():
    """What it measures depends on the machine's load: only its shape is asserted here."""
    measured = ch01.measure(collatz_steps, thread_speedups, rounds=2)
    assert measured.work >= 1000 and measured.problem == ""
    assert len(measured.speedups) == 2 and all(s > 0 for s in measured.speedups)


@pytest.mark.measures
def test_ch01_correct_solution_end_to_end(capsys):
    """Every check of the kernel and of the timing function runs for real; the verdict on the figures comes from a
    scripted measurement."""
    ch01.check_nogil(collatz_steps, thread_speedups, MEASURED_1_5, measure=lambda k, f: ch01_measured(1.5))
    out = capsys.readouterr().out
    assert "Your kernel was compiled with nogil=True" in out and "All 15 checks passed" in out


_TURNS = threading.Lock()


def _taking_turns(start, stop):
    """The learner's kernel behind a lock: right answers, the GIL released, but two threads take turns (x1). It
    also sleeps 2 µs per integer, ten times its compute, so a busy machine can't make one round differ."""
    with _TURNS:
        time.sleep((stop - start) * 2e-6)
        return collatz_steps(start, stop)


_taking_turns.targetoptions = {"nogil": True}  # it releases the GIL (sleeping, and in collatz_steps), as declared


@pytest.mark.measures
@pytest.mark.timeout(120)
def test_ch01_a_guessed_speedup_is_refused_and_the_measured_one_accepted(capsys):
    """The checker runs the learner's own thread_speedups on the kernel: notebook 01's 1.8 typed in is refused where
    two threads take turns (x1 on any machine, however busy), and what the learner's code measured is accepted."""
    measured = statistics.median(thread_speedups(_taking_turns, 100_000, 3))
    assert measured < 1.3  # a lock makes the two threads take turns
    ch01.check_nogil(_taking_turns, thread_speedups, measured)
    assert "All 15 checks passed" in capsys.readouterr().out
    rejects_with_hint(ch01.check_nogil, _taking_turns, thread_speedups, 1.8123456789,
                      hint="not a number from elsewhere")


def _one_round_only(kernel, span, rounds):
    return thread_speedups(kernel, span, 1)


@pytest.mark.parametrize("timer, hint", [
    (lambda kernel, span, rounds: [1.8] * rounds, "take turns can't beat one"),
    (lambda kernel, span, rounds: [1 / x for x in thread_speedups(kernel, span, rounds)], "other way round"),
    (lambda kernel, span, rounds: statistics.median(thread_speedups(kernel, span, rounds)), "return the list"),
    (_one_round_only, "one per round"),
])
def test_ch01_wrong_timing_functions_are_rejected_on_the_stand_ins(timer, hint):
    rejects_with_hint(ch01.check_nogil, collatz_steps, timer, MEASURED_1_5,
                      measure=lambda k, f: pytest.fail("measured"),
                      hint=hint)


def test_ch01_judge_accepts_a_speedup_within_tolerance():
    ch01.judge(collatz_steps, 1.5300001, ch01_measured(1.6))
    ch01.judge(collatz_steps, 1.6700001, ch01_measured(1.6))
    rejects_with_hint(ch01.judge, collatz_steps, 1.5000001, ch01_measured(1.6), hint="not a number from elsewhere")


def test_ch01_cheat_pure_python_delegating_to_the_library_is_rejected():
    def cheat(start, stop):  # minidl's own Collatz dataset, in plain Python: holds the GIL
        dataset = CpuBoundDataset(stop, work=1)
        return sum(dataset[i][1] for i in range(start - 1, stop - 1))

    ch01.check_output(cheat, ch01._Checks())  # its output is right: only the GIL test can catch it
    rejects_with_hint(ch01.judge, cheat, 1.6000001, ch01_measured(),
                      hint="(?s)not compiled by Numba.*plain Python always holds it")


def test_ch01_cheat_hard_coded_ideal_speedup_is_rejected():
    rejects_with_hint(ch01.judge, collatz_steps, 2.0, ch01_measured(1.2), hint="2.0 is the ideal")


def test_ch01_njit_without_nogil_is_rejected():
    kernel = numba.njit(collatz_steps.py_func)
    kernel(1, 2)
    rejects_with_hint(ch01.judge, kernel, 1.0000001, ch01_measured(1.0),
                      hint="without nogil=True, Numba's code keeps")


@pytest.mark.parametrize("wrong, hint", [
    (lambda a, b: sum(ch01.collatz_steps_python(n, n + 1) for n in range(a, b + 1)), "stop is excluded"),
    (lambda a, b: ch01.collatz_steps_python(a, b) + (b - a), "one step too many"),
    (lambda a, b: 111, "count the steps of every n"),
])
def test_ch01_wrong_kernels_are_rejected(wrong, hint):
    rejects_with_hint(ch01.check_nogil, wrong, thread_speedups, MEASURED_1_5,
                      measure=lambda k, f: pytest.fail("measured a wrong kernel"), hint=hint)


@pytest.mark.parametrize("speedup, hint", [
    (0.6250001, "divided the other way round"),
    ("1.6x", "should be a positive number"),
    (1.0000001, "not a number from elsewhere"),
    (1.0, "(?s)at most three decimals.*report the number your code computed"),
    (1.6, "at most three decimals"),
    (46.6, "at most three decimals"),
])
def test_ch01_wrong_speedups_are_rejected(speedup, hint):
    rejects_with_hint(ch01.judge, collatz_steps, speedup, ch01_measured(1.6), hint=hint)


def test_ch01_a_speedup_is_held_to_the_median_of_the_learners_clocked_rounds_not_their_range():
    spread = ch01_measured(1.0, yours=[0.95, 1.05, 1.84])
    rejects_with_hint(ch01.judge, collatz_steps, 1.6123456, spread, hint="not a number from elsewhere")
    ch01.judge(collatz_steps, 1.0512345, spread)


def test_ch01_the_learners_own_rounds_decide_however_the_checkers_run_went():
    """The make-mac failure: the learner's cell measured x1.88; a moment later, with a core taken, the checker's run
    of the same code gave x0.99-x1.14. The speedup is judged on the learner's rounds, clocked as they ran."""
    busy = ch01_measured(1.05, yours=[1.84, 1.91, 1.88, 1.86, 1.90])
    ch01.judge(collatz_steps, 1.8812345, busy)
    rejects_with_hint(ch01.judge, collatz_steps, 1.05123, busy, hint="not a number from elsewhere")
    rejects_with_hint(ch01.judge, collatz_steps, 1.8812345, ch01_measured(1.88, yours=[]),
                      hint="run it on your kernel and set speedup")


@pytest.mark.measures
def test_ch01_the_helpers_clock_each_round_the_learners_cell_runs():
    ratios = thread_speedups(collatz_steps, 200_000, 3)
    logged = ch01.logged_rounds(collatz_steps)[-3:]
    assert len(logged) == 3
    assert all(abs(a / b - 1) < 0.25 for a, b in zip(ratios, logged)), (ratios, logged)
    runs = [("k", 1, 1, 11, 2.0), ("k", 2, 1, 11, 1.0), ("k", 2, 1, 11, 1.0), ("k", 1, 1, 11, 1.5), ("j", 1, 1, 11, 9)]
    assert ch01.logged_rounds("k", runs) == [2.0, 1.5]


# --- the learner's timing held to the checker's clock, round by round ------------------------------------


def _repeats_one_round(kernel, span, rounds):
    return thread_speedups(kernel, span, 1) * rounds


def _fake_timer(kernel, span, rounds):  # runs the work, but makes its numbers up
    # x3.12 from two threads is more than the checker's 1.25x tolerance above any machine's real x2 at best, so
    # the made-up figure is off the checker's clock everywhere (x1.88 matched an idle 2-core machine's truth).
    thread_speedups(kernel, span, rounds)
    return [3.1234567] * rounds


@pytest.mark.timeout(120)
@pytest.mark.parametrize("timer, hint", [
    (_repeats_one_round, r"(?s)ran the kernel on the halves of the span 4 times for 5 rounds.*time every round"),
    (_fake_timer, r"(?s)round \d: your thread_speedups says x3.12, but the kernel's calls in that round give"),
])
def test_ch01_timing_that_skips_rounds_or_makes_up_numbers_is_refused_on_the_checkers_clock(timer, hint):
    measured = ch01.measure(collatz_steps, timer)
    rejects_with_hint(ch01.judge, collatz_steps, measured.speedup + 1e-9, measured, hint=hint)


@pytest.mark.measures
@pytest.mark.timeout(120)
def test_ch01_the_reference_timing_agrees_with_the_checkers_clock_round_by_round():
    speedup = statistics.median(thread_speedups(collatz_steps, 200_000, 3))  # the learner's cell
    measured = ch01.measure(collatz_steps, thread_speedups, rounds=3)
    assert measured.problem == "" and len(measured.clocked) == 3
    ch01.judge(collatz_steps, speedup, measured)


def _two_threads_only(kernel, span, rounds):  # two runs a round, both in two threads: no one-thread time
    for _ in range(rounds):
        ch01.two_threads(kernel, 1, 1 + span)
        ch01.two_threads(kernel, 1, 1 + span)
    return [1.0000001] * rounds


@pytest.mark.timeout(120)
def test_ch01_rounds_that_never_run_one_thread_are_refused():
    measured = ch01.measure(collatz_steps, _two_threads_only, rounds=2)
    assert measured.clocked == []
    rejects_with_hint(ch01.judge, collatz_steps, 1.0000001, measured,
                      hint="(?s)did not each run the halves once in one thread.*time every round")


# --- rounds judged by the wrong rule, of another kernel, from threads of one's own, or a generator -----------

SPREAD = [0.85, 0.9, 1.0, 1.05, 1.2]  # a busy machine's rounds: suffix medians 1.05, 1.025, 1.0


@pytest.mark.parametrize("rule, hint", [(max, "is the max of your rounds"), (min, "is the min of your rounds"),
                                        (lambda r: r[3] * 1.4, "the median of its rounds")])
def test_ch01_the_right_rounds_judged_by_the_wrong_rule_are_refused(rule, hint):
    rejects_with_hint(ch01.judge, collatz_steps, rule(SPREAD) + 1e-7, ch01_measured(1.0, yours=SPREAD), hint=hint)


def test_ch01_the_max_of_rounds_near_the_inverse_of_their_median_is_named_as_the_max():
    rounds = [0.85, 0.88, 0.9, 1.12]  # 1 / 1.12 is within 1.05x of the median 0.89: not "the other way round"
    rejects_with_hint(ch01.judge, collatz_steps, max(rounds) + 1e-7, ch01_measured(0.89, yours=rounds),
                      hint="(?s)is the max of your rounds.*statistics.median")


def _same_order_every_round(kernel, span, rounds):
    kernel(1, 10)
    ratios = []
    for _ in range(rounds):
        start = time.perf_counter()
        ch01.one_thread(kernel, 1, 1 + span)
        middle = time.perf_counter()
        ch01.two_threads(kernel, 1, 1 + span)
        ratios.append((middle - start) / (time.perf_counter() - middle))
    return ratios


def _no_warm_up(kernel, span, rounds):
    ratios = []
    for r in range(rounds):
        took = {}
        for run in (ch01.one_thread, ch01.two_threads)[::1 if r % 2 == 0 else -1]:
            start = time.perf_counter()
            run(kernel, 1, 1 + span)
            took[run] = time.perf_counter() - start
        ratios.append(took[ch01.one_thread] / took[ch01.two_threads])
    return ratios


def _swaps_and_warms_up_another_way(kernel, span, rounds):  # right: the order drawn at random, warm-up on a span
    import random

    kernel(1, 1 + span)
    order, ratios = random.Random(1), []
    firsts = [0, 1] + [order.randrange(2) for _ in range(rounds - 2)]
    for first in firsts[:rounds]:
        took = {}
        for helper in (ch01.one_thread, ch01.two_threads)[::1 if first == 0 else -1]:
            start = time.perf_counter()
            helper(kernel, 1, 1 + span)
            took[helper] = time.perf_counter() - start
        ratios.append(took[ch01.one_thread] / took[ch01.two_threads])
    return ratios


@pytest.mark.timeout(120)
@pytest.mark.parametrize("timer, hint", [
    (_same_order_every_round, r"every round ran one thread first: swap which goes first"),
    (_no_warm_up, r"timed the kernel's first call: call it once before anything is timed"),
])
def test_ch01_timing_that_never_swaps_the_order_or_never_warms_up_is_refused(timer, hint):
    measured = ch01.measure(collatz_steps, timer, rounds=2)
    rejects_with_hint(ch01.judge, collatz_steps, measured.speedup + 1e-9, measured, hint=hint)


@pytest.mark.timeout(120)
def test_ch01_another_way_to_swap_and_warm_up_is_accepted():
    measured = ch01.measure(collatz_steps, _swaps_and_warms_up_another_way, rounds=3)
    assert measured.problem == ""


def test_ch01_rounds_of_another_kernel_are_not_the_learners():
    """The plain-Python demo's rounds (x1), or a stand-in's, are logged under that kernel, not the learner's."""
    ratios = thread_speedups(ch01.collatz_steps_python, 2_000, 3)
    assert ch01.logged_rounds(ch01.collatz_steps_python)[-3:] and not ch01.logged_rounds(lambda a, b: 0)
    rejects_with_hint(ch01.judge, collatz_steps, statistics.median(ratios), ch01_measured(1.6, yours=[]),
                      hint="one_thread and two_threads never ran your kernel|set speedup")


def _own_threads(kernel, span, rounds):  # times the rounds right, but with threads of its own
    ratios = []
    for _ in range(rounds):
        start = time.perf_counter()
        kernel(1, 1 + span // 2)
        kernel(1 + span // 2, 1 + span)
        one = time.perf_counter() - start
        threads = [threading.Thread(target=kernel, args=(1, 1 + span // 2)),
                   threading.Thread(target=kernel, args=(1 + span // 2, 1 + span))]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ratios.append(one / (time.perf_counter() - start))
    return ratios


@pytest.mark.timeout(120)
def test_ch01_a_speedup_from_rounds_no_helper_clocked_is_refused():
    kernel = numba.njit(nogil=True)(collatz_steps.py_func)  # a kernel no helper has run
    speedup = statistics.median(_own_threads(kernel, 200_000, 3))
    measured = ch01.measure(kernel, _own_threads, rounds=3)
    assert measured.yours == []
    rejects_with_hint(ch01.judge, kernel, speedup, measured, hint="never ran your kernel|time one_thread")


def test_ch01_a_generator_of_rounds_is_refused_on_the_stand_ins():
    rejects_with_hint(ch01.check_nogil, collatz_steps, lambda k, s, r: (x for x in thread_speedups(k, s, r)),
                      MEASURED_1_5, measure=lambda k, f: pytest.fail("measured"), hint="return the list")
