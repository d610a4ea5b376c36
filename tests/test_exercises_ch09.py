"""The exercise checkers, ch09 (threads or processes): each passes a learner's copy of the reference answer and
rejects typical wrong answers with the hint that names the mistake.
"""


import statistics
import time

import pytest
from exercise_support import (
    learner_copy,
    rejects_with_hint,
)

from minidl_course.exercises import ch09_threads_or_processes as ch09

time_methods = learner_copy("ch09_threads_or_processes").time_methods

# --- ch09: threads or processes ----------------------------------------------------------------------


def ch09_measured(loop=(1.0, 0.5), sleep=(0.2, 0.1)):
    """loop / sleep: (multiprocessing seconds, thread seconds)."""
    return ch09.Measured({"python_loop": dict(zip(ch09.METHODS, ([loop[0]] * 3, [loop[1]] * 3))),
                          "sleep_numpy": dict(zip(ch09.METHODS, ([sleep[0]] * 3, [sleep[1]] * 3)))})


@pytest.mark.measures
@pytest.mark.timeout(90)
def test_ch09_correct_answer_end_to_end(capsys):
    measured = ch09.measure(time_methods, rounds=2)
    answer = {name: measured.verdict(name)[0] for name in ch09.WORKLOADS}
    ch09.check_choice(time_methods, answer, measure=lambda f: measured)
    assert "All 4 checks passed" in capsys.readouterr().out


def _sleeping(seconds):
    """A stand-in run_epoch: sleeps ``seconds[method]`` (known epoch times, the same on a busy machine)."""
    return lambda method: time.sleep(seconds[method])


# threads twice as fast on both workloads, as on a one-core machine where processes can't run side by side
THREADS_WIN = {"python_loop": _sleeping({"multiprocessing": 0.08, "thread": 0.04}),
               "sleep_numpy": _sleeping({"multiprocessing": 0.06, "thread": 0.03})}


@pytest.mark.timeout(60)
def test_ch09_a_guessed_answer_is_refused_and_the_measured_one_accepted(capsys):
    """The checker runs the learner's own time_methods: the textbook answer, typed in where the learner's code
    measured threads faster on both workloads, is refused; the answer read off that code's own timings passes."""
    def measure(f):
        return ch09.measure(f, runs=THREADS_WIN)

    seconds = {name: time_methods(run, 3) for name, run in THREADS_WIN.items()}
    answer = {name: min(s, key=lambda m: statistics.median(s[m])) for name, s in seconds.items()}
    assert answer == {"python_loop": "thread", "sleep_numpy": "thread"}
    ch09.check_choice(time_methods, answer, measure=measure)
    assert "All 4 checks passed" in capsys.readouterr().out
    rejects_with_hint(ch09.check_choice, time_methods, {"python_loop": "multiprocessing", "sleep_numpy": "thread"},
                      measure=measure, hint="answer what this machine measured")


def _keyed_wrong(run_epoch, rounds):
    seconds = time_methods(run_epoch, rounds)
    return {"multiprocessing": seconds["thread"], "thread": seconds["multiprocessing"]}


@pytest.mark.parametrize("timer, hint", [
    (lambda run_epoch, rounds: {"multiprocessing": [0.25] * rounds, "thread": [0.4] * rounds}, "just before"),
    (_keyed_wrong, "under the wrong method"),
    (lambda run_epoch, rounds: {m: statistics.median(s) for m, s in time_methods(run_epoch, rounds).items()},
     "one epoch time per round"),
])
def test_ch09_wrong_timing_functions_are_rejected_on_the_stand_in(timer, hint):
    rejects_with_hint(ch09.check_choice, timer, {"python_loop": "multiprocessing", "sleep_numpy": "thread"},
                      measure=lambda f: pytest.fail("measured"), hint=hint)


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
    rejects_with_hint(ch09.check_choice, time_methods, answer, measure=lambda f: ch09_measured(loop=(0.5, 1.0)),
                      hint=hint)


def test_ch09_multiprocessing_for_the_sleep_workload_is_rejected():
    rejects_with_hint(ch09.judge, {"python_loop": "multiprocessing", "sleep_numpy": "multiprocessing"},
                      ch09_measured(loop=(0.5, 1.0), sleep=(0.2, 0.1)), hint="release the GIL")


def test_ch09_rounds_that_disagree_accept_either_answer(capsys):
    # The browser run's busy machine: threads faster in the median on the Python loop, processes in one round.
    busy = ch09.Measured({"python_loop": {"multiprocessing": [0.50, 0.60, 0.62], "thread": [0.52, 0.40, 0.41]},
                          "sleep_numpy": {"multiprocessing": [0.2] * 3, "thread": [0.1] * 3}})
    best, gap, _ = busy.verdict("python_loop")
    assert best == "thread" and gap > ch09.BAND
    ch09.judge({"python_loop": "multiprocessing", "sleep_numpy": "thread"}, busy)
    assert "rounds here range from 0.96x" in capsys.readouterr().out
    # The same median with every round agreeing still refuses the answer the rounds contradict.
    steady = ch09.Measured({"python_loop": {"multiprocessing": [0.60] * 3, "thread": [0.40] * 3},
                            "sleep_numpy": {"multiprocessing": [0.2] * 3, "thread": [0.1] * 3}})
    rejects_with_hint(ch09.judge, {"python_loop": "multiprocessing", "sleep_numpy": "thread"}, steady,
                      hint="answer what this machine measured")


# --- the learner's timer held to the checker's clock --------------------------------------------------------


def _runs_nothing(run_epoch, rounds):  # the stand-in's own times, returned without running anything
    return {"multiprocessing": [0.0812345] * rounds, "thread": [0.0412345] * rounds}


_CALLS = []


def _times_the_stand_in_then_makes_up(run_epoch, rounds):
    _CALLS.append(run_epoch)
    seconds = time_methods(run_epoch, rounds)
    if len(_CALLS) == 1:  # the stand-in, timed first: honest
        return seconds
    return {"multiprocessing": [0.5123] * rounds, "thread": [1.0123] * rounds}  # the workloads: the textbook


def _times_one_round(run_epoch, rounds):
    one = time_methods(run_epoch, 1)
    return {m: s * rounds for m, s in one.items()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timer, hint", [
    (_runs_nothing, r"the run_epoch\('multiprocessing'\) call behind it was made 0 times for 3 rounds"),
    (_times_the_stand_in_then_makes_up, r"python_loop: your time_methods says round 1 of 'multiprocessing' took "
                                        r"0.512 s, but the run_epoch\('multiprocessing'\) call behind it took"),
    (_times_one_round, r"call behind it (was made 2 times for 3 rounds|took)"),
])
def test_ch09_a_timer_that_runs_nothing_or_makes_up_its_numbers_is_refused(timer, hint):
    rejects_with_hint(ch09.check_choice, timer, {"python_loop": "multiprocessing", "sleep_numpy": "thread"},
                      measure=lambda f: ch09.measure(f, runs=THREADS_WIN), hint=hint)


# --- a timer in the wrong unit or never restarted, and a machine that changed between measurements -----------


def _in_milliseconds(run_epoch, rounds):
    return {m: [t * 1000 for t in ts] for m, ts in time_methods(run_epoch, rounds).items()}


def _never_restarts_the_clock(run_epoch, rounds):
    seconds, start = {m: [] for m in ch09.METHODS}, time.perf_counter()
    for _ in range(rounds):
        for method in ch09.METHODS:
            run_epoch(method)
            seconds[method].append(time.perf_counter() - start)
    return seconds


@pytest.mark.parametrize("timer, hint", [
    (_in_milliseconds, "in milliseconds: return seconds"),
    (_never_restarts_the_clock, "includes the rounds before it"),
])
def test_ch09_a_timer_in_the_wrong_unit_or_never_restarted_is_named_on_the_stand_in(timer, hint):
    rejects_with_hint(ch09.check_timer, timer, ch09._Checks(), hint=hint)


def test_ch09_an_answer_measured_before_the_machine_changed_is_judged_on_a_second_measurement(capsys):
    """The learner's cell measured threads faster; by the time the checker measures, another program has taken a
    core and processes come out ahead in every round. The checker measures once more: the right answer passes when
    the second measurement agrees with it, and a wrong one is still refused when both measurements refuse it."""
    answer = {"python_loop": "thread", "sleep_numpy": "thread"}
    changed = iter([ch09_measured(loop=(1.0, 1.3)), ch09_measured(loop=(1.0, 0.5))])
    ch09.check_choice(time_methods, answer, measure=lambda f: next(changed))
    out = capsys.readouterr().out
    assert "measures once more" in out and "All 4 checks passed" in out
    rejects_with_hint(ch09.check_choice, time_methods, answer, measure=lambda f: ch09_measured(loop=(1.0, 1.3)),
                      hint="a pure-Python loop holds the GIL")
