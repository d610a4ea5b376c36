"""The measuring and debugging exercises (ch01, ch07, ch09, ch10, ch11, ch12): their checkers pass a correct
answer, and reject a cheat and typical wrong answers with the hint that names the mistake.

Verdicts are tested on injected measurements (``measure=`` / ``run=`` hooks and the pure ``judge`` functions), so
no test depends on how fast this machine is today; one end-to-end run per checker measures for real and feeds the
checker that same measurement as the learner's answer, so the real measuring and checking code runs.
"""

import os
import re
import statistics

import numba
import numpy as np
import psutil
import pytest

from minidl.course import pinning_demo
from minidl.course.exercises import ch01_nogil as ch01
from minidl.course.exercises import ch07_pinning_cost as ch07
from minidl.course.exercises import ch09_threads_or_processes as ch09
from minidl.course.exercises import ch10_overhead_ratio as ch10
from minidl.course.exercises import ch11_vectorise_or_workers as ch11
from minidl.course.exercises import ch12_pitfalls_debug as ch12
from minidl.course.exercises._measure import as_number, close, interleaved, median_ratio
from minidl.course.pinning_demo import FakePinnable
from minidl.course.solutions.ch01_nogil import collatz_steps
from minidl.course.solutions.ch07_pinning_cost import pin_copy
from minidl.course.solutions.ch10_overhead_ratio import per_batch_seconds
from minidl.course.solutions.ch11_vectorise_or_workers import transform_batch
from minidl.course.solutions.ch12_pitfalls_debug import LOADER_KWARGS, ArrayDataset
from minidl.course.toy import CpuBoundDataset


def rejects(fn, *args, hint, **kwargs):
    """``fn(*args, **kwargs)`` raises AssertionError whose hint matches ``hint`` (a regex)."""
    with pytest.raises(AssertionError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "Hint:" in message or hint.startswith("(?!hint)"), message
    assert re.search(hint, message), message
    return message


def no_children_left():
    """Live children of this test process, except multiprocessing's own long-lived helpers.

    The first spawn/forkserver start in a process launches a resource tracker (and forkserver, a server)
    that stay for the life of the interpreter by design; they are not a loader's workers.
    """
    helpers = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")

    def is_helper(p):
        try:
            return any(h in " ".join(p.cmdline()) for h in helpers)
        except psutil.Error:
            return False

    return [p for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE and not is_helper(p)]


# --- _measure -------------------------------------------------------------------------------------


def test_interleaved_rotates_the_order_and_median_ratio_is_per_round():
    order = []
    times = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=3, warmup=False)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert [len(v) for v in times.values()] == [3, 3]
    assert median_ratio({"x": [2, 9, 3], "y": [1, 3, 1]}, "x", "y") == 3


def test_as_number_and_close():
    assert [as_number(v) for v in (1, 1.5, np.float32(2), "2", None, True, float("nan"))] == [1, 1.5, 2, None,
                                                                                              None, None, None]
    assert close(1.2, 1.0, 1.3) and close(1.0, 1.2, 1.3) and not close(1.4, 1.0, 1.3) and not close(-1, 1, 2)


# --- ch01: a GIL-releasing Numba kernel ----------------------------------------------------------


def ch01_measured(speedup=1.6, progress=0.8):
    return ch01.Measured([speedup] * 3, progress, 10_000)


@pytest.mark.timeout(60)
def test_ch01_correct_solution_end_to_end(capsys):
    measured = ch01.measure(collatz_steps)
    ch01.check_nogil(collatz_steps, measured.speedup, measure=lambda k: measured)
    out = capsys.readouterr().out
    assert "Measured: a Python thread ran during" in out and "All 12 checks passed" in out


def test_ch01_judge_accepts_a_speedup_within_tolerance():
    ch01.judge(collatz_steps, 1.4, ch01_measured(1.6))
    ch01.judge(collatz_steps, 1.9, ch01_measured(1.6))


def test_ch01_cheat_pure_python_delegating_to_the_library_is_rejected():
    def cheat(start, stop):  # minidl's own Collatz dataset, in plain Python: holds the GIL
        dataset = CpuBoundDataset(stop, work=1)
        return sum(dataset[i][1] for i in range(start - 1, stop - 1))

    ch01.check_output(cheat, ch01._Checks())  # its output is right: only the GIL test can catch it
    rejects(ch01.judge, cheat, 1.6, ch01_measured(progress=0.02), hint="plain Python, which holds the GIL")


def test_ch01_cheat_hard_coded_ideal_speedup_is_rejected():
    rejects(ch01.judge, collatz_steps, 2.0, ch01_measured(1.2), hint="2.0 is the ideal")


def test_ch01_njit_without_nogil_is_rejected():
    kernel = numba.njit(collatz_steps.py_func)
    kernel(1, 2)
    rejects(ch01.judge, kernel, 1.0, ch01_measured(1.0, progress=0.03), hint="without nogil, Numba's code keeps")


@pytest.mark.parametrize("wrong, hint", [
    (lambda a, b: sum(ch01.collatz_steps_python(n, n + 1) for n in range(a, b + 1)), "stop is excluded"),
    (lambda a, b: ch01.collatz_steps_python(a, b) + (b - a), "one step too many"),
    (lambda a, b: 111, "count the steps of every n"),
])
def test_ch01_wrong_kernels_are_rejected(wrong, hint):
    rejects(ch01.check_nogil, wrong, 1.5, measure=lambda k: pytest.fail("measured a wrong kernel"), hint=hint)


@pytest.mark.parametrize("speedup, hint", [
    (0.6, "divided the other way round"),
    (3.2, "twice the work of one"),
    ("1.6x", "should be a number"),
    (1.0, "interleaved rounds"),
])
def test_ch01_wrong_speedups_are_rejected(speedup, hint):
    rejects(ch01.judge, collatz_steps, speedup, ch01_measured(1.6), hint=hint)


def test_ch01_measures_a_gil_holding_kernel_as_holding_it():
    kernel = numba.njit(collatz_steps.py_func)
    measured = ch01.measure(kernel, rounds=1)
    released = ch01.measure(collatz_steps, rounds=1)
    assert measured.python_progress < released.python_progress


# --- ch07: what page-locking a fresh buffer costs -------------------------------------------------


def ch07_measured(ratio):
    return ch07.Measured([ratio * 1e-4] * 5, [1e-4] * 5)


@pytest.mark.timeout(60)
def test_ch07_correct_solution_end_to_end(capsys):
    measured = ch07.measure(pin_copy)
    ch07.check_pin_copy(pin_copy, measured.ratio, measured.ratio > 1.3, measure=lambda f: measured)
    assert "All 6 checks passed" in capsys.readouterr().out
    assert pinning_demo.locked_bytes() in (0, None)  # every lock was released


def test_ch07_judge_tolerance_and_band(capsys):
    ch07.judge(4.0, True, ch07_measured(5.5))
    ch07.judge(1.3, False, ch07_measured(1.3))
    ch07.judge(1.3, True, ch07_measured(1.3))
    assert "either answer is accepted" in capsys.readouterr().out


def test_ch07_cheat_delegating_to_fake_pinnable_is_rejected():
    def cheat(batch, lock_pages):
        return FakePinnable(batch).pin_memory().value

    rejects(ch07.check_copies, cheat, ch07._Checks(), hint="Copying alone")


_module_buffer = {}


@pytest.mark.parametrize("wrong, hint", [
    (lambda batch, lock: batch, "pinning copies"),
    (lambda batch, lock: batch.astype(np.int16), "np.empty_like"),
    (lambda batch, lock: _lock_the_batch(batch, lock), "not the batch"),
    (lambda batch, lock: _reuse(batch, lock), "allocate it inside pin_copy"),
])
def test_ch07_wrong_copies_are_rejected(wrong, hint):
    rejects(ch07.check_pin_copy, wrong, 5.0, True, measure=lambda f: pytest.fail("measured"), hint=hint)


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
    (0.18, True, "divided the other way round"),
    (1.0, True, "interleaved rounds"),
    (5.0, False, "reusing pays"),
    (5.0, "yes", "True or False"),
])
def test_ch07_wrong_conclusions_are_rejected(ratio, reuse_pays, hint):
    rejects(ch07.judge, ratio, reuse_pays, ch07_measured(5.5), hint=hint)


def test_ch07_reuse_pays_true_is_rejected_when_fresh_is_as_cheap():
    rejects(ch07.judge, 1.05, True, ch07_measured(1.05), hint="answer False")


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
    rejects(ch09.judge, {"python_loop": "thread", "sleep_numpy": "thread"}, ch09_measured(loop=(0.5, 1.0)),
            hint="holds the GIL")


@pytest.mark.parametrize("answer, hint", [
    ({"python_loop": "thread", "sleep_numpy": "multiprocessing"}, "holds the GIL"),
    ({"python_loop": "processes", "sleep_numpy": "thread"}, "worker_method='multiprocessing'"),
    ({"loop": "multiprocessing", "sleep": "thread"}, "one answer per workload"),
    ("multiprocessing", "write a dict"),
])
def test_ch09_wrong_answers_are_rejected(answer, hint):
    rejects(ch09.check_choice, answer, measure=lambda: ch09_measured(loop=(0.5, 1.0)), hint=hint)


def test_ch09_multiprocessing_for_the_sleep_workload_is_rejected():
    rejects(ch09.judge, {"python_loop": "multiprocessing", "sleep_numpy": "multiprocessing"},
            ch09_measured(loop=(0.5, 1.0), sleep=(0.2, 0.1)), hint="release the GIL")


# --- ch10: minidl's per-batch cost next to torch's -----------------------------------------------------


def ch10_measured(ratio):
    return ch10.Measured([ratio * 1e-5] * 5, [1e-5] * 5)


@pytest.mark.timeout(60)
def test_ch10_correct_solution_end_to_end(capsys):
    measured = ch10.measure(rounds=3)
    ch10.check_overhead(per_batch_seconds, measured.ratio, measure=lambda: measured)
    assert "All 3 checks passed" in capsys.readouterr().out


def test_ch10_cheat_hard_coded_timer_and_ratio_are_rejected():
    rejects(ch10.check_timer, lambda loader: 3.6e-6, ch10._Checks(), hint="not one next")
    rejects(ch10.judge, 1.0, ch10_measured(0.4), hint="not a guess")


def _with_startup(loader):
    import time

    start = time.perf_counter()
    n = sum(1 for _ in loader)
    return (time.perf_counter() - start) / n


def _divided_by_all(loader):
    return per_batch_seconds(loader) * (len(loader) - 1) / len(loader)


@pytest.mark.parametrize("wrong, hint", [
    (_with_startup, "included the wait for the first batch"),
    (_divided_by_all, "n - 1"),
    (lambda loader: 1 / per_batch_seconds(loader), "batches per second"),
])
def test_ch10_wrong_timers_are_rejected(wrong, hint):
    rejects(ch10.check_overhead, wrong, 0.4, measure=lambda: pytest.fail("measured"), hint=hint)


@pytest.mark.parametrize("ratio, hint", [(2.5, "other way round"), (0.9, "interleaved rounds"), ("0.4", "positive")])
def test_ch10_wrong_ratios_are_rejected(ratio, hint):
    rejects(ch10.judge, ratio, ch10_measured(0.4), hint=hint)


# --- ch11: vectorise or add workers ----------------------------------------------------------------------


def ch11_measured(workers=0.25, vectorised=0.01, batch_speedup=30.0):
    return ch11.Measured([workers] * 3, [vectorised] * 3, batch_speedup)


@pytest.mark.timeout(60)
def test_ch11_correct_solution_end_to_end(capsys):
    measured = ch11.measure(transform_batch, rounds=2)
    seconds = {"workers": statistics.median(measured.workers), "vectorised": statistics.median(measured.vectorised)}
    choice = "vectorise" if measured.speedup > 1 else "workers"
    ch11.check_decision(transform_batch, seconds, choice, measure=lambda f: measured)
    assert "All 7 checks passed" in capsys.readouterr().out


def test_ch11_cheat_loop_over_the_per_sample_transform_is_rejected():
    def cheat(images):
        return np.stack([ch11.per_sample_transform(image) for image in images])

    ch11.check_transform(cheat, ch11._Checks())  # right values: only its speed gives it away
    assert ch11.batch_speedup(cheat) < ch11.MIN_VECTOR_SPEEDUP * 2  # what measure() would see: no real gain
    rejects(ch11.judge, {"workers": 0.25, "vectorised": 0.2}, "vectorise", ch11_measured(0.25, 0.2, 1.1),
            hint="not vectorised")


@pytest.mark.parametrize("wrong, hint", [
    (lambda x: (x.astype(np.float32) / np.float32(255) - ch11.MEAN) / ch11.STD, "channels first"),
    (lambda x: (x.transpose(0, 3, 1, 2).astype(np.float32) - ch11.MEAN.reshape(1, 3, 1, 1)) / ch11.STD.reshape(
        1, 3, 1, 1), "divide by 255 first"),
    (lambda x: (x.transpose(0, 3, 1, 2) / 255.0 - ch11.MEAN.astype(np.float64).reshape(1, 3, 1, 1))
     / ch11.STD.astype(np.float64).reshape(1, 3, 1, 1), "should be float32"),
])
def test_ch11_wrong_transforms_are_rejected(wrong, hint):
    rejects(ch11.check_decision, wrong, {"workers": 0.25, "vectorised": 0.01}, "vectorise",
            measure=lambda f: pytest.fail("measured"), hint=hint)


@pytest.mark.parametrize("seconds, choice, hint", [
    ({"workers": 0.25, "vectorised": 0.01}, "workers", "choose 'vectorise'"),
    ({"workers": 0.01, "vectorised": 0.25}, "vectorise", "swapped"),
    ({"workers": 0.25, "vectorised": 0.2}, "vectorise", "interleaved rounds"),
])
def test_ch11_wrong_conclusions_are_rejected(seconds, choice, hint):
    rejects(ch11.judge, seconds, choice, ch11_measured(), hint=hint)


def test_ch11_a_close_call_accepts_either_choice(capsys):
    ch11.judge({"workers": 0.1, "vectorised": 0.105}, "workers", ch11_measured(0.1, 0.105))
    assert "either choice is accepted" in capsys.readouterr().out


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


@pytest.mark.timeout(90)
def test_ch12_leak_correct_solution_end_to_end(capsys):
    measured = ch12.check_no_leak(ArrayDataset)
    assert measured.yours < measured.buggy
    assert "All 4 checks passed" in capsys.readouterr().out
    assert no_children_left() == []


def test_ch12_leak_cheat_the_buggy_dataset_under_another_name_is_rejected():
    cheat = type("ArrayDataset", (ch12.ListDataset,), {})
    rejects(ch12.judge_leak, cheat, ch12.LeakMeasured(12.0, 12.5), hint="Python list or tuple")


@pytest.mark.parametrize("wrong, growth, hint", [
    (TupleDataset, 11.0, "Python list or tuple"),
    (ObjectArrayDataset, 12.0, "dtype object"),
    (IntegerDataset, 0.0, r"item 1 should be 0\.5"),
])
def test_ch12_leak_wrong_datasets_are_rejected(wrong, growth, hint):
    rejects(ch12.check_no_leak, wrong, measure=lambda cls: ch12.LeakMeasured(growth, 12.5), hint=hint)


def test_ch12_leak_judge_accepts_small_growth():
    ch12.judge_leak(ArrayDataset, ch12.LeakMeasured(0.5, 12.5))


# --- ch12 part 2: a hang at fork ----------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_ch12_hang_correct_fix_end_to_end(capsys):
    outcome = ch12.check_no_hang(LOADER_KWARGS)
    assert outcome.status == "ok"
    assert "All 2 checks passed" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_ch12_the_buggy_loader_is_killed_with_its_workers():
    outcome = ch12.run_locked_loader({}, timeout=6)
    assert outcome.status == "hang", outcome
    assert no_children_left() == []
    assert not any("_run_locked_loader" in " ".join(p.info["cmdline"] or [])
                   for p in psutil.process_iter(["cmdline"]) if p.pid != os.getpid())


def test_ch12_hang_cheat_no_workers_is_rejected():
    rejects(ch12.check_no_hang, {"num_workers": 0}, run=lambda kw: pytest.fail("ran"), hint="keep two worker")


@pytest.mark.parametrize("kwargs, outcome, hint", [
    ({"multiprocessing_context": "fork"}, ch12.Outcome("hang", "killed"), "'fork' is the start method"),
    ({"persistent_workers": True}, ch12.Outcome("hang", "killed"), "persistent workers are still forked"),
    ({"timeout": 3}, ch12.Outcome("error", "RuntimeError: DataLoader timed out after 3 seconds"),
     "a timeout turns the hang into an error"),
    ({"pin_memory": True}, ch12.Outcome("hang", "killed"), "multiprocessing_context='spawn'"),
])
def test_ch12_hang_wrong_fixes_are_rejected(kwargs, outcome, hint):
    rejects(ch12.check_no_hang, kwargs, run=lambda kw: outcome, hint=hint)


def test_ch12_hang_a_context_object_is_rejected():
    import multiprocessing

    rejects(ch12.check_kwargs, {"multiprocessing_context": multiprocessing.get_context("spawn")}, ch12._Checks(),
            hint="as a string")


# --- ch12 part 3: how many workers ------------------------------------------------------------------------------

SWEEP_TIMES = {0: 0.48, 1: 0.50, 2: 0.30, 3: 0.26, 4: 0.22, 6: 0.31}


@pytest.mark.timeout(90)
def test_ch12_num_workers_correct_choice_end_to_end(capsys):
    measured = ch12.measure_sweep(rounds=1)
    best = min(measured, key=measured.get)
    ch12.check_num_workers(best, measured, measure=lambda: measured)
    assert "All 2 checks passed" in capsys.readouterr().out


def test_ch12_num_workers_accepts_any_choice_within_tolerance():
    for w in (3, 4):
        ch12.judge_num_workers(w, SWEEP_TIMES, SWEEP_TIMES)


def test_ch12_num_workers_cheat_rule_of_thumb_is_rejected():
    rejects(ch12.check_num_workers, os.cpu_count() * 4, SWEEP_TIMES, measure=lambda: pytest.fail("measured"),
            hint="not from a rule of thumb")


@pytest.mark.parametrize("choice, sweep, hint", [
    (6, {**SWEEP_TIMES, 6: 0.20}, "more workers than cores"),
    (0, {**SWEEP_TIMES, 0: 0.20}, "never overlap"),
    (2, SWEEP_TIMES, "your own sweep says 4 workers"),
    (1, {**SWEEP_TIMES, 1: 0.2}, "lowest point of your sweep"),
])
def test_ch12_num_workers_wrong_choices_are_rejected(choice, sweep, hint):
    rejects(ch12.judge_num_workers, choice, sweep, SWEEP_TIMES, hint=hint)


def test_ch12_num_workers_sweep_must_cover_the_values():
    rejects(ch12.check_sweep_answer, 4, {4: 0.2}, ch12._Checks(), hint="the sweep you ran")


# --- the answers stay out of reach ------------------------------------------------------------------------------

EXERCISES = ("ch01_nogil_threads", "ch07_pinning_cost", "ch09_threads_or_processes", "ch10_overhead_ratio",
             "ch11_vectorise_or_workers", "ch12_pitfalls_debug")
ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", EXERCISES)
def test_exercise_notebooks_never_reach_the_solutions(name):
    import json

    notebook = json.loads((ROOT / "notebooks" / "exercises" / f"{name}.ipynb").read_text())
    cells = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    code = "\n".join("".join(cell["source"]) for cell in cells)
    assert "solutions" not in code
    assert "YourTurn(" in code
    assert any("raises-exception" in cell["metadata"].get("tags", []) for cell in cells)
    assert (ROOT / "notebooks" / "exercises" / f"{name}_solution.ipynb").is_file()


def test_checker_modules_import_no_solution_and_no_torch():
    import subprocess
    import sys

    modules = ", ".join(m.__name__ for m in (ch01, ch07, ch09, ch10, ch11, ch12))
    script = (f"import sys, importlib\nfor m in '{modules}'.split(', '): importlib.import_module(m)\n"
              "print(sorted(k for k in sys.modules if k.startswith('minidl.course.solutions') or k == 'torch'))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_figure_within_the_spread_of_the_checkers_own_rounds_is_accepted(capsys):
    # A busy machine: the checker's rounds went from 0.95x to 1.4x; the learner's 1.3x, from other rounds, fits.
    busy = ch01.Measured([0.95, 1.05, 1.4], 0.8, 10_000)
    ch01.judge(collatz_steps, 1.3, busy)
    quiet = ch01.Measured([0.95, 0.96, 0.97], 0.8, 10_000)  # on a quiet one the same figure is too far off
    rejects(ch01.judge, collatz_steps, 1.3, quiet, hint="interleaved rounds")


def test_ch11_speedup_is_the_median_of_per_round_ratios():
    measured = ch11.Measured([1.0, 4.0, 2.0], [1.0, 1.0, 2.0], 30.0)
    assert measured.speedups == [1.0, 4.0, 1.0] and measured.speedup == 1.0  # the ratio of medians would say 2.0
