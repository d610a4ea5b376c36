"""What every exercise checker shares: the one-line "your turn" and reference-answer messages, comparing batches, the
delegation tripwire, the measuring rhythm, and that the answers stay out of reach.
"""

import importlib
import inspect
import json
import multiprocessing
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from exercise_support import (
    IMAGENET,
    ROOT,
    ScriptedClock,
    learner_copy,
    rejects,
)

from minidl.prefetch import PrefetchLoader
from minidl.sampler import BatchSampler
from minidl_course.exercises import (
    ReferenceAnswer,
    YourTurn,
    check_collate,
    check_prefetcher,
    check_reorder,
    check_sampler,
    check_slow_sample,
    check_worker_init_fn,
    check_worker_loop,
    check_worker_seeding,
    first_difference,
    make_image_batches,
)
from minidl_course.exercises import ch01_nogil as ch01
from minidl_course.exercises import ch07_pinning_cost as ch07
from minidl_course.exercises import ch09_threads_or_processes as ch09
from minidl_course.exercises import ch10_overhead_ratio as ch10
from minidl_course.exercises import ch11_vectorise_or_workers as ch11
from minidl_course.exercises import ch12_pitfalls_debug as ch12
from minidl_course.exercises._common import Tripwire, refuse_reference
from minidl_course.exercises._measure import (
    as_number,
    close,
    interleaved,
    latest_medians,
    measure_then_judge,
    off_the_clock,
    positive_numbers,
    typed,
)

SortedBatchSampler = learner_copy("ch02_sampler").SortedBatchSampler
pad_mask_collate = learner_copy("ch03_collate").pad_mask_collate
reorder = learner_copy("ch05_reorder").reorder
simple_worker_loop = learner_copy("ch05_worker_loop").worker_loop
prefetch_one_ahead = learner_copy("ch08_prefetcher").prefetch


# --- what the learner can import -------------------------------------------------------------------


def test_no_reference_answer_is_importable_from_the_checkers():
    code = ("import sys, minidl_course.exercises as e\n"
            "from minidl_course.exercises import ch02_sampler, ch03_collate, ch04_slow_sample, ch05_reorder, "
            "ch05_worker_loop, ch06_seeding, ch06_sharding, ch08_prefetcher\n"
            "e.check_worker_init_fn.__module__, e.range_stream(0, 1)\n"
            "print(sorted(m for m in sys.modules if 'solutions' in m or 'reference_answers' in m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    import minidl_course.exercises as exercises

    for name in ("SortedBatchSampler", "pad_mask_collate", "simple_worker_loop", "prefetch_one_ahead", "reorder"):
        assert not hasattr(exercises, name)


def test_importing_the_checkers_needs_no_torch():
    code = "import sys, minidl_course.exercises; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_your_turn_shows_as_one_line_in_a_notebook():
    assert YourTurn()._render_traceback_() == [f"YourTurn: {YourTurn.MESSAGE}"]


def test_first_difference_names_the_place():
    assert first_difference([1, {"a": 2}], [1, {"a": 2}]) is None
    assert first_difference([1, {"a": 2}], [1, {"a": 3}]) == "batch[1]['a'] should be 2, but it is 3"
    assert first_difference(torch.zeros(2), torch.zeros(3)) == "batch should have shape (2,), but it has shape (3,)"
    assert "dtype torch.float32" in first_difference(torch.zeros(2), torch.zeros(2, dtype=torch.int64))
    assert first_difference(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 2], [3, 5]])) == (
        "batch[1, 1] should be 4, but it is 5"
    )
    assert first_difference(np.zeros(2), torch.zeros(2)) == "batch should be a numpy.ndarray, but it is a torch.Tensor"
    assert first_difference({"a": 1}, {"b": 1}) == "batch should have the keys ['a'], but it has ['b']"


# --- the cheats: an answer that only wraps the library's own implementation is refused --------------


class WrapsMinidlsBatchSampler(SortedBatchSampler):
    def __iter__(self):
        order = sorted(range(len(self.lengths)), key=self.lengths.__getitem__)
        batches = list(BatchSampler(order, self.batch_size, self.drop_last))
        perm = torch.randperm(len(batches), generator=self.generator).tolist() if self.shuffle else range(len(batches))
        return iter([batches[i] for i in perm])


class WrapsTorchsBatchSampler(SortedBatchSampler):
    def __len__(self):
        return len(torch.utils.data.BatchSampler(range(len(self.lengths)), self.batch_size, self.drop_last))


def pads_with_torch(batch):
    seqs = [torch.as_tensor(s["tokens"]) for s in batch]
    mask = [torch.ones(len(s), dtype=torch.bool) for s in seqs]
    pad = torch.nn.utils.rnn.pad_sequence
    return {"tokens": pad(seqs, batch_first=True), "mask": pad(mask, batch_first=True),
            "label": torch.tensor([s["label"] for s in batch])}


def pads_with_minidl(batch):
    from minidl_course.padding import pad_collate

    out = pad_mask_collate(batch)
    out["tokens"] = pad_collate([s["tokens"] for s in batch])
    return out


def wraps_minidls_worker_loop(dataset, index_queue, result_queue, collate_fn):
    from minidl._thread_workers import _InThread
    from minidl.fetch import _DatasetKind
    from minidl.worker import _worker_loop, _WorkerOptions

    _worker_loop(_DatasetKind.Map, dataset, index_queue, result_queue, threading.Event(), True, collate_fn, False, 0,
                 None, 0, 1, False, None, _WorkerOptions(runs_in=_InThread))


def wraps_prefetch_loader(loader, mean, std):
    yield from PrefetchLoader(loader, device="cpu", mean=mean, std=std, channels=len(mean))


@pytest.mark.parametrize("check, cheat, message", [
    (check_sampler, WrapsMinidlsBatchSampler, r"your sampler called minidl's BatchSampler.*cut the sorted order"),
    (check_sampler, WrapsTorchsBatchSampler, r"your sampler called torch's BatchSampler"),
    (check_collate, pads_with_torch, r"called torch.nn.utils.rnn.pad_sequence.*write it yourself"),
    (check_collate, pads_with_minidl, r"called minidl_course.padding.pad_collate"),
    (check_worker_loop, wraps_minidls_worker_loop, r"called minidl.worker._worker_loop.*write the loop yourself"),
    (check_prefetcher, wraps_prefetch_loader, r"used minidl's PrefetchLoader.*hold-one-back loop yourself"),
])
def test_a_checker_refuses_an_answer_that_wraps_the_library(check, cheat, message):
    rejects(check, cheat, message)


def test_the_prefetch_cheat_would_pass_on_its_outputs_alone():
    """The cheat is refused for delegating, not by accident: its batches are the right ones."""
    batches = make_image_batches(3)
    for (x, y), (want_x, want_y) in zip(wraps_prefetch_loader(batches, *IMAGENET), prefetch_one_ahead(batches,
                                                                                                      *IMAGENET)):
        assert torch.allclose(x, want_x) and torch.equal(y, want_y)


# --- _measure -------------------------------------------------------------------------------------


def test_interleaved_rotates_the_order():
    order = []
    times = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=3, warmup=False)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert [len(v) for v in times.values()] == [3, 3]


def test_as_number_and_close():
    assert [as_number(v) for v in (1, 1.5, np.float32(2), "2", None, True, float("nan"))] == [1, 1.5, 2, None,
                                                                                              None, None, None]
    assert close(1.2, 1.0, 1.3) and close(1.0, 1.2, 1.3) and not close(1.4, 1.0, 1.3) and not close(-1, 1, 2)


def test_positive_numbers_typed_latest_medians_and_off_the_clock():
    assert [positive_numbers(g) for g in ((1, 2.5), [1, -1], 3)] == [[1.0, 2.5], None, None]
    assert positive_numbers([1], count=2) is None
    assert [typed(v) for v in (1.9, 2.0, 1.8834521977, 0.6 / 0.31)] == [True, True, False, False]
    assert latest_medians([5.0, 1.0, 2.0, 3.0]) == [2.0, 2.5] and latest_medians([4.0], 2) == [4.0]
    # the learner's times against the checker's last len(yours): None when all agree, else the first that doesn't
    assert off_the_clock([0.10, 0.21], [0.5, 0.1, 0.2]) is None
    assert off_the_clock([0.1, 0.1], [0.1, 0.3]) == 1 and off_the_clock([1.0], []) == 0


# --- the answers stay out of reach ------------------------------------------------------------------------------

EXERCISE_NOTEBOOKS = sorted(p for p in (ROOT / "notebooks" / "exercises").glob("ch*.ipynb")
                            if not p.stem.endswith("_solution"))
CHECKERS = sorted(p.stem for p in (ROOT / "minidl" / "course" / "exercises").glob("ch*.py")
                  if p.stem != "ch06_streams")  # torch datasets by design, imported only when a ch06 check runs


@pytest.mark.parametrize("path", EXERCISE_NOTEBOOKS, ids=lambda p: p.stem)
def test_exercise_notebooks_never_reach_the_answers(path):
    notebook = json.loads(path.read_text())
    cells = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    code = "\n".join("".join(cell["source"]) for cell in cells)
    assert "solutions" not in code and "reference_answers" not in code
    assert "YourTurn(" in code
    assert any("raises-exception" in cell["metadata"].get("tags", []) for cell in cells)
    assert path.with_name(f"{path.stem}_solution.ipynb").is_file()


def test_checker_modules_import_no_answer_and_no_torch():
    modules = " ".join(f"minidl_course.exercises.{name}" for name in CHECKERS)
    script = (f"import sys, importlib\nfor m in '{modules}'.split(): importlib.import_module(m)\n"
              "print(sorted(k for k in sys.modules if 'solutions' in k or 'reference_answers' in k or k == 'torch'))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_reference_answers_are_not_in_the_installed_package(tmp_path):
    """Away from the repository's tests/ (where a learner's notebook runs), neither the old nor the new home of
    the answers can be imported; and the package's files hold none of them."""
    script = ("import importlib.util as u\n"
              "print(u.find_spec('minidl_course.solutions'), u.find_spec('reference_answers'))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    assert out.stdout.strip() == "None None"
    package = ROOT / "minidl"
    assert not (package / "course" / "solutions").exists()
    answers = ("def reorder(", "def find_slow_sample(", "class SortedBatchSampler", "def pad_mask_collate(",
               "def seed_worker(", "def shard_worker_init_fn(", "def per_batch_seconds(", "def transform_batch(",
               "def pin_copy(", "def collatz_steps(", "def thread_speedups(", "def time_methods(")
    for path in package.rglob("*.py"):
        text = path.read_text()
        assert not [a for a in answers if a in text], path


def _never(*args):
    pytest.fail("measured an answer that should have been refused first")


# (checker, how to call it with the answer, the reference module, the name in it)
REFUSALS = [
    ("ch01_nogil", lambda a: ch01.check_nogil(a, learner_copy("ch01_nogil").thread_speedups, 1.5, measure=_never),
     "collatz_steps"),
    ("ch02_sampler", check_sampler, "SortedBatchSampler"),
    ("ch03_collate", check_collate, "pad_mask_collate"),
    ("ch04_slow_sample", check_slow_sample, "find_slow_sample"),
    ("ch05_reorder", check_reorder, "reorder"),
    ("ch05_worker_loop", check_worker_loop, "worker_loop"),
    ("ch06_seeding", check_worker_seeding, "seed_worker"),
    ("ch06_sharding", check_worker_init_fn, "shard_worker_init_fn"),
    ("ch07_pinning_cost", lambda a: ch07.check_pin_copy(a, 2.0, True, measure=_never), "pin_copy"),
    ("ch08_prefetcher", check_prefetcher, "prefetch"),
    ("ch09_threads_or_processes",
     lambda a: ch09.check_choice(a, {"python_loop": "thread", "sleep_numpy": "thread"}, measure=_never),
     "time_methods"),
    ("ch10_overhead_ratio", lambda a: ch10.check_overhead(a, 0.5, measure=_never), "per_batch_seconds"),
    ("ch11_vectorise_or_workers",
     lambda a: ch11.check_decision(a, a, {"workers": 0.2, "vectorised": 0.02}, "vectorise", measure=_never),
     "transform_batch"),
    ("ch12_pitfalls_debug", lambda a: ch12.check_no_leak(a, measure=_never), "ArrayDataset"),
]


@pytest.mark.parametrize("exercise, check, name", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_an_imported_reference_answer_is_refused_in_one_line(exercise, check, name):
    answer = getattr(importlib.import_module(f"reference_answers.{exercise}"), name)
    with pytest.raises(ReferenceAnswer) as info:
        check(answer)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{name} is the reference answer, imported from "
                                                       f"reference_answers.{exercise}: ")
    assert info.value._render_traceback_() == [f"ReferenceAnswer: {message}"]
    # the same code in a learner's own module is judged on what it does (the chapter tests run it to the end)
    assert getattr(learner_copy(exercise), name).__module__ == f"my_{exercise}"


def test_a_subclass_of_the_reference_class_and_the_old_package_name_are_refused_too():
    from reference_answers.ch02_sampler import SortedBatchSampler as Reference

    class Mine(Reference):
        pass

    with pytest.raises(ReferenceAnswer, match="Mine is the reference answer"):
        check_sampler(Mine)

    def reorder(arrivals):
        yield from arrivals

    reorder.__module__ = "minidl_course.solutions.ch05_reorder"  # where an older checkout installed them
    with pytest.raises(ReferenceAnswer, match="imported from minidl_course.solutions.ch05_reorder"):
        check_reorder(reorder)
    reorder.__module__ = "minidl_course_solutions_of_my_own"  # a name that merely looks alike is not refused
    refuse_reference(reorder)


# --- the delegation tripwire ----------------------------------------------------------------------------------


def watched():
    return "called"


def _wire():
    return Tripwire({watched.__code__: "watched"})


def test_tripwire_sees_a_call_and_clears_itself_on_exit():
    before = sys.getprofile(), threading.getprofile()
    with _wire() as wire:
        watched()
    assert wire.hits == ["watched"]
    assert (sys.getprofile(), threading.getprofile()) == before
    watched()  # after exit: not noted
    assert wire.hits == ["watched"]


def test_tripwire_clears_itself_when_the_block_raises():
    before = sys.getprofile(), threading.getprofile()
    with pytest.raises(ValueError), _wire() as wire:
        watched()
        raise ValueError("the answer crashed")
    assert wire.hits == ["watched"] and not wire.active
    assert (sys.getprofile(), threading.getprofile()) == before


@pytest.mark.timeout(30)
def test_tripwire_reaches_a_thread_started_inside_and_leaves_it_when_done():
    go_on, seen = threading.Event(), {}

    def thread_body():
        watched()  # while the wire is active: noted
        go_on.wait(10)
        watched()  # after exit: the thread's next call takes the hook off
        seen["profile after exit"] = sys.getprofile()

    with _wire() as wire:
        thread = threading.Thread(target=thread_body)
        thread.start()
        while not wire.hits:
            threading.Event().wait(0.01)
    go_on.set()
    thread.join(10)
    assert wire.hits == ["watched"]
    assert seen["profile after exit"] is None


@pytest.mark.timeout(30)
def test_tripwire_and_a_thread_that_was_already_running():
    """3.12+: ``threading.setprofile_all_threads`` reaches it. 3.11 has no way to: the documented limitation."""
    started, go_on, done = threading.Event(), threading.Event(), threading.Event()

    def thread_body():
        started.set()
        go_on.wait(10)
        watched()
        done.set()

    thread = threading.Thread(target=thread_body)
    thread.start()
    started.wait(10)
    with _wire() as wire:
        go_on.set()
        done.wait(10)
    thread.join(10)
    reaches_running_threads = hasattr(threading, "setprofile_all_threads")
    assert wire.hits == (["watched"] if reaches_running_threads else [])
    assert "threads already running when it starts, on Python 3.11" in Tripwire.__doc__


def test_tripwire_uses_setprofile_all_threads_where_python_has_it(monkeypatch):
    calls = []
    monkeypatch.setattr(threading, "setprofile_all_threads", calls.append, raising=False)
    before = threading.getprofile()
    with _wire() as wire:
        pass
    assert calls == [wire._profile, before]  # every running thread on entry; put back on exit


@pytest.mark.timeout(60)
def test_tripwire_cannot_see_a_worker_process_or_a_pasted_copy():
    """Both are in its docstring: a child process has no hook, and a copy of the code is other code."""
    namespace = {}
    exec(compile(inspect.getsource(watched), "<a notebook cell>", "exec"), namespace)  # the source, pasted
    context = multiprocessing.get_context("fork")
    with _wire() as wire:
        namespace["watched"]()
        child = context.Process(target=watched)
        child.start()
        child.join(30)
    assert child.exitcode == 0 and wire.hits == []
    assert "other processes" in Tripwire.__doc__ and "a copy of the library's code" in Tripwire.__doc__


# --- the measuring rhythm -----------------------------------------------------------------------------------------


def test_measure_then_judge_checks_first_then_measures_reports_and_judges(capsys):
    steps = []

    def check_first(checks):
        steps.append("check")
        checks.passed += 2

    def judge(measured, checks):
        steps.append(f"judge {measured}")
        checks.passed += 1

    got = measure_then_judge([watched], check_first, lambda: steps.append("measure") or 7,
                             lambda measured: f"measured {measured}", judge)
    assert got == 7 and steps == ["check", "measure", "judge 7"]
    assert capsys.readouterr().out == "measured 7\nAll 3 checks passed\n"


def test_measure_then_judge_never_measures_a_wrong_or_a_reference_answer():
    def wrong(checks):
        checks.fail("a case", "it is wrong")

    with pytest.raises(AssertionError, match="check 1 failed, for a case"):
        measure_then_judge([watched], wrong, _never, str, _never)
    reference = importlib.import_module("reference_answers.ch05_reorder").reorder
    with pytest.raises(ReferenceAnswer):
        measure_then_judge([reference], _never, _never, str, _never)


def test_interleaved_times_each_call_with_the_clock_it_is_given():
    order = []
    clock = ScriptedClock([1.0, 3.0, 6.0, 2.0])  # a: 1, b: 3, then b: 6, a: 2
    times = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=2, warmup=False,
                        clock=clock)
    assert order == ["a", "b", "b", "a"]
    assert times == {"a": [1.0, 2.0], "b": [3.0, 6.0]}


@pytest.mark.parametrize("check, answer", [(check_sampler, SortedBatchSampler), (check_collate, pad_mask_collate)])
def test_checks_leave_the_global_rng_alone(check, answer):
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    check(answer)
    assert torch.equal(torch.rand(3), expected)
