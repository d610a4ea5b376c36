"""The exercise checkers, ch12 (three pitfalls to debug): each passes a learner's copy of the reference answer and
rejects typical wrong answers with the hint that names the mistake.
"""

import multiprocessing
import os
import subprocess
import time

import numpy as np
import psutil
import pytest
from exercise_support import (
    learner_copy,
    no_children_left,
    rejects_with_hint,
)

from minidl_bench.machine import worker_sweep
from minidl_course.exercises import ch12_pitfalls_debug as ch12

_ch12 = learner_copy("ch12_pitfalls_debug")
ArrayDataset, LOADER_KWARGS = _ch12.ArrayDataset, _ch12.LOADER_KWARGS


# --- ch12 part 1: copy-on-read -----------------------------------------------------------------------------


class TupleDataset(ch12.ListDataset):
    def __init__(self, n):
        self.items = tuple(ch12.item_value(i) for i in range(n))


class ObjectArrayDataset(ch12.ListDataset):
    def __init__(self, n):
        self.items = np.array([ch12.item_value(i) for i in range(n)], dtype=object)


class IntegerDataset(ArrayDataset):
    def __init__(self, n):
        self.items = np.arange(n, dtype=np.float64)


@pytest.mark.measures
@pytest.mark.timeout(90)
def test_ch12_leak_correct_solution_end_to_end(capsys):
    measured = ch12.check_no_leak(ArrayDataset)
    assert measured.yours < measured.buggy
    assert "All 4 checks passed" in capsys.readouterr().out
    assert no_children_left() == []


def test_ch12_leak_cheat_the_buggy_dataset_under_another_name_is_rejected():
    cheat = type("ArrayDataset", (ch12.ListDataset,), {})
    rejects_with_hint(ch12.judge_leak, cheat, ch12.LeakMeasured(12.0, 12.5), ch12._Checks(),
                      hint="Python list or tuple")


@pytest.mark.parametrize("wrong, growth, hint", [
    (TupleDataset, 11.0, "Python list or tuple"),
    (ObjectArrayDataset, 12.0, "dtype object"),
    (IntegerDataset, 0.0, r"item 1 should be 0\.5"),
])
def test_ch12_leak_wrong_datasets_are_rejected(wrong, growth, hint):
    rejects_with_hint(ch12.check_no_leak, wrong, measure=lambda cls: ch12.LeakMeasured(growth, 12.5), hint=hint)


def test_ch12_leak_judge_accepts_small_growth():
    ch12.judge_leak(ArrayDataset, ch12.LeakMeasured(0.5, 12.5), ch12._Checks())


# --- ch12 part 2: a hang at fork ----------------------------------------------------------------------------


@pytest.mark.measures
@pytest.mark.timeout(90)
def test_ch12_hang_correct_fix_end_to_end(capsys):
    outcome = ch12.check_no_hang(LOADER_KWARGS)
    assert outcome.status == "ok"
    assert "All 2 checks passed" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_ch12_the_buggy_loader_is_killed_with_its_workers(monkeypatch):
    """Its process and every worker it forked (they share its new session) are gone: only this test's are counted,
    since another program on the machine may be running the same exercise."""
    started, popen = [], subprocess.Popen

    def recording(*args, **kwargs):
        process = popen(*args, **kwargs)
        started.append(process.pid)
        return process

    monkeypatch.setattr(subprocess, "Popen", recording)
    outcome = ch12.run_locked_loader({}, timeout=6)
    assert outcome.status == "hang", outcome
    assert len(started) == 1 and no_children_left() == []

    def in_its_session(p):
        try:
            return os.getsid(p.pid) == started[0] and p.status() != psutil.STATUS_ZOMBIE
        except (OSError, psutil.Error):  # gone meanwhile
            return False

    assert psutil.wait_procs([p for p in psutil.process_iter() if in_its_session(p)], timeout=5)[1] == []


def test_ch12_hang_cheat_no_workers_is_rejected():
    rejects_with_hint(ch12.check_no_hang, {"num_workers": 0}, run=lambda kw: pytest.fail("ran"), hint="keep two worker")


@pytest.mark.parametrize("kwargs, outcome, hint", [
    ({"multiprocessing_context": "fork"}, ch12.Outcome("hang", "killed"), "'fork' is the start method"),
    ({"persistent_workers": True}, ch12.Outcome("hang", "killed"), "persistent workers are still forked"),
    ({"timeout": 3}, ch12.Outcome("error", "RuntimeError: DataLoader timed out after 3 seconds"),
     "a timeout turns the hang into an error"),
    ({"pin_memory": True}, ch12.Outcome("hang", "killed"), "multiprocessing_context='spawn'"),
])
def test_ch12_hang_wrong_fixes_are_rejected(kwargs, outcome, hint):
    rejects_with_hint(ch12.check_no_hang, kwargs, run=lambda kw: outcome, hint=hint)


def test_ch12_hang_a_context_object_is_rejected():
    rejects_with_hint(ch12.check_kwargs, {"multiprocessing_context": multiprocessing.get_context("spawn")},
                      ch12._Checks(), hint="as a string")


# --- ch12 part 3: how many workers ------------------------------------------------------------------------------

SWEEP = (0, 1, 2, 3, 4, 6)  # the checker's SWEEP follows the core count: the tests fix it
SWEEP_TIMES = {w: s + 1.2345e-6 for w, s in {0: 0.48, 1: 0.50, 2: 0.30, 3: 0.26, 4: 0.22, 6: 0.31}.items()}
LOGGED = [(w, s * f) for f in (1.2, 0.95, 1.0, 1.05) for w, s in SWEEP_TIMES.items()]  # a warm-up, then 3 rounds


@pytest.fixture
def real_sweep(monkeypatch):
    monkeypatch.setattr(ch12, "SWEEP", SWEEP)


class PacedLoader:
    """Stands in for the DataLoader inside sweep_epoch: an epoch of w workers sleeps SWEEP_TIMES[w] / 20."""

    def __init__(self, dataset, batch_size, num_workers, multiprocessing_context):
        self.num_workers = num_workers

    def __iter__(self):
        time.sleep(SWEEP_TIMES[self.num_workers] / 20)
        return iter(())


@pytest.fixture
def sweep(monkeypatch):
    """The paced stand-in loader, and a notebook whose epochs were LOGGED: SWEEP_TIMES are their medians."""
    monkeypatch.setattr(ch12, "SWEEP", SWEEP)
    monkeypatch.setattr(ch12, "DataLoader", PacedLoader)
    monkeypatch.setattr(ch12, "EPOCHS", list(LOGGED))


def paced_timer(clock=time.perf_counter):
    """An honest time_epoch: it runs sweep_epoch (a paced stand-in loader) and returns what the clock saw."""
    def time_epoch(w):
        start = clock()
        ch12.sweep_epoch(w)
        return clock() - start
    return time_epoch


def judge(choice, sweep_times, measured=None):
    ch12.judge_num_workers(choice, sweep_times, measured or ch12.harness.Rounds(), ch12._Checks(),
                           ch12.logged(LOGGED))


@pytest.mark.parametrize("cores, expected", [(1, (0, 1, 2)), (2, (0, 1, 2, 3, 4)), (8, (0, 1, 2, 4, 8, 12))])
def test_ch12_sweep_follows_the_core_count(cores, expected):
    assert worker_sweep(cores) == expected and ch12.SWEEP == worker_sweep()


@pytest.mark.timeout(300)
def test_ch12_measure_sweep_runs_the_learners_timer_once_over_the_sweep(real_sweep):
    """The real sweep_epoch, on a short dataset (it starts workers: spawned ones under spawn), timed honestly."""
    small, calls = ch12.DecodeDataset(n=8, wait=0.001, work=100), []

    def time_epoch(w):
        calls.append(w)
        start = time.perf_counter()
        ch12.sweep_epoch(w, small)
        return time.perf_counter() - start

    measured = ch12.measure_sweep(time_epoch)
    assert sorted(measured) == sorted(SWEEP) and all(len(t) == 1 and min(t) > 0 for t in measured.values())
    assert calls == list(SWEEP) and measured.problem == "" and ch12.EPOCHS[-len(SWEEP):][0][0] == 0


_HALF_READ = []


def _leaves_a_half_read_iterator(w):
    start = time.perf_counter()
    ch12.sweep_epoch(w, ch12.DecodeDataset(n=8, wait=0.001, work=100))
    took = time.perf_counter() - start
    if w == 2:  # a second look at the two-worker loader, never finished: its workers keep running
        _HALF_READ.append(iter(ch12.DataLoader(ch12.DecodeDataset(n=64), batch_size=4, num_workers=2)))
        next(_HALF_READ[-1])
    return took


@pytest.mark.timeout(120)
def test_ch12_a_time_epoch_that_leaves_workers_running_is_refused_and_they_are_ended(real_sweep):
    measured = ch12.measure_sweep(_leaves_a_half_read_iterator, sweep=[0, 2])
    assert "time_epoch(2) left 2 worker process(es) running after it returned" in measured.problem
    _HALF_READ.clear()  # the learner's iterator, deleted: its workers exit
    assert not multiprocessing.active_children() and not no_children_left()


@pytest.mark.measures
def test_ch12_num_workers_correct_choice_end_to_end(sweep, capsys):
    ch12.check_num_workers(4, SWEEP_TIMES, paced_timer())
    out = capsys.readouterr().out
    assert "Your notebook's epochs, on the checker's clock" in out and "All 3 checks passed" in out


def test_ch12_num_workers_the_learners_timer_is_what_the_checker_runs(sweep):
    seen = []
    timer = paced_timer()
    measured = ch12.check_num_workers(4, SWEEP_TIMES, lambda w: seen.append(w) or timer(w))
    assert seen == list(SWEEP) and all(len(t) == 1 for t in measured.values())


@pytest.mark.parametrize("typed", [{w: 1.0 for w in SWEEP}, {w: round(s, 3) for w, s in SWEEP_TIMES.items()},
                                   {w: s * 1.3 + 1.234e-7 for w, s in SWEEP_TIMES.items()}])
def test_ch12_num_workers_a_sweep_typed_in_or_from_another_run_is_rejected(sweep, typed):
    """Times typed in, rounded, or copied from the solution notebook's run: not the medians of this notebook's
    epochs, however many decimals."""
    rejects_with_hint(ch12.check_num_workers, 4, typed, paced_timer(), hint="not numbers typed in")


def test_ch12_num_workers_no_epochs_in_the_notebook_is_rejected(sweep, monkeypatch):
    monkeypatch.setattr(ch12, "EPOCHS", [])
    rejects_with_hint(ch12.check_num_workers, 4, SWEEP_TIMES, paced_timer(), hint="it notes each epoch")


def test_ch12_num_workers_a_timer_that_returns_a_typed_number_is_rejected(sweep):
    rejects_with_hint(ch12.check_num_workers, 4, SWEEP_TIMES, lambda w: SWEEP_TIMES[w],
                      hint="not a number typed in")
    rejects_with_hint(ch12.check_num_workers, 4, SWEEP_TIMES, lambda w: None, hint="return time.perf_counter")


def test_ch12_num_workers_accepts_any_choice_within_tolerance_of_the_learners_sweep(sweep):
    for w in (3, 4):
        judge(w, SWEEP_TIMES)


def test_ch12_num_workers_cheat_rule_of_thumb_is_rejected(sweep):
    rejects_with_hint(ch12.check_num_workers, os.cpu_count() * 4, SWEEP_TIMES, paced_timer(),
                      measure=lambda: pytest.fail("measured"), hint="not from a rule of thumb")


@pytest.mark.parametrize("choice, hint", [(6, "more workers than cores"), (0, "never overlap"),
                                          (2, "your own sweep says 4 workers"), (1, "your own sweep says 4 workers")])
def test_ch12_num_workers_wrong_choices_are_rejected(sweep, choice, hint):
    rejects_with_hint(judge, choice, SWEEP_TIMES, hint=hint)


def test_ch12_num_workers_sweep_must_cover_the_values(sweep):
    rejects_with_hint(ch12.check_answers, 4, {4: 0.2}, paced_timer(), ch12._Checks(), hint="the sweep you ran")


# --- the hang kept in worker processes, and the learner's sweep timer held to the checker's clock -----------


def test_ch12_hang_worker_method_thread_is_refused():
    rejects_with_hint(ch12.check_no_hang, {"worker_method": "thread"}, run=lambda kw: pytest.fail("ran"),
                      hint="keep two worker processes")


def _runs_the_epoch_returns_a_constant(w):
    ch12.sweep_epoch(w)
    return SWEEP_TIMES[w] / 5 + 1.234e-7  # an earlier run's figure (four times this epoch here), typed in


def _times_a_different_epoch(w):
    start = time.perf_counter()
    ch12.sweep_epoch(0)  # not the w it was asked for
    return time.perf_counter() - start


@pytest.mark.parametrize("timer, hint", [
    (_runs_the_epoch_returns_a_constant, r"time_epoch\(\d\) returned .* but the sweep_epoch\(\d, ...\) it ran took"),
    (_times_a_different_epoch, r"time_epoch\([1-6]\) returned .* but it ran no sweep_epoch\([1-6], ...\)"),
])
def test_ch12_num_workers_a_timer_off_the_checkers_clock_is_refused(sweep, timer, hint):
    rejects_with_hint(judge, 4, SWEEP_TIMES, ch12.measure_sweep(timer), hint="(?s)" + hint + ".*time the epoch you run")


def test_ch12_num_workers_an_honest_timer_agrees_with_the_checkers_clock(sweep):
    measured = ch12.measure_sweep(paced_timer(), rounds=2)
    assert measured.problem == ""


def test_ch12_a_time_epoch_in_milliseconds_is_named(sweep):
    def in_ms(w):
        start = time.perf_counter()
        ch12.sweep_epoch(w)
        return (time.perf_counter() - start) * 1000

    rejects_with_hint(ch12.check_num_workers, 0, SWEEP_TIMES, in_ms, hint="milliseconds")


def test_ch12_a_timer_that_returns_no_number_in_a_later_round_is_named(sweep):
    timer = paced_timer()
    measured = ch12.measure_sweep(lambda w: timer(w) if w == 0 else ch12.sweep_epoch(w))  # None after w=0
    rejects_with_hint(judge, 4, SWEEP_TIMES, measured,
                      hint=r"(?s)time_epoch\([1-6]\) returned no number, but the sweep_epoch.*time\.perf_counter")
