"""The exercise checkers, ch05 (the worker loop, and putting batches back in order): each passes a learner's copy of
the reference answer and rejects typical wrong answers with the hint that names the mistake.
"""

import functools
import multiprocessing
import re
import sys
import threading
import types

import pytest
from exercise_support import (
    learner_copy,
    rejects,
)

import minidl
from minidl.worker import ExceptionWrapper
from minidl_course import toy
from minidl_course.exercises import (
    Arrivals,
    check_reorder,
    check_worker_loop,
    run_worker_processes,
)
from minidl_course.exercises.ch05_reorder import due_after

reorder = learner_copy("ch05_reorder").reorder
simple_worker_loop = learner_copy("ch05_worker_loop").worker_loop


# --- check_worker_loop (ch05) ----------------------------------------------------------------------
# The wrong loops live at module level, so worker processes (under any start method) could import them.


def test_check_worker_loop_accepts_the_reference(capsys):
    check_worker_loop(simple_worker_loop)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def test_check_worker_loop_accepts_the_reference_under_spawn(capsys):
    check_worker_loop(simple_worker_loop, start_method="spawn")
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def unpacks_the_sentinel(dataset, index_queue, result_queue, collate_fn):
    while True:
        task_idx, indices = index_queue.get()
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((task_idx, batch))


def dies_on_a_bad_sample(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        task_idx, indices = task
        result_queue.put((task_idx, collate_fn([dataset[i] for i in indices])))


def numbers_tasks_itself(dataset, index_queue, result_queue, collate_fn):
    count = 0
    while (task := index_queue.get()) is not None:
        try:
            batch = collate_fn([dataset[i] for i in task[1]])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((count, batch))
        count += 1


def forgets_to_collate(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        task_idx, indices = task
        try:
            batch = [dataset[i] for i in indices]
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((task_idx, batch))


def skips_the_sentinel(dataset, index_queue, result_queue, collate_fn):
    while True:
        task = index_queue.get()
        if task is None:
            continue  # should leave
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((task_idx, batch))


def puts_the_exception(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception as e:
            batch = e
        result_queue.put((task_idx, batch))


def stops_at_the_first_error(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            result_queue.put((task_idx, ExceptionWrapper(where="in a worker")))
            return
        result_queue.put((task_idx, batch))


def answers_without_the_number(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        try:
            batch = collate_fn([dataset[i] for i in task[1]])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put(batch)


lambda_loop = lambda *args: simple_worker_loop(*args)  # noqa: E731 -- a lambda can't be pickled for spawn


@pytest.mark.parametrize(
    "wrong, message",
    [
        (unpacks_the_sentinel, r"answered every task, then raised TypeError.*check `if task is None` before"),
        (dies_on_a_bad_sample, r"died with KeyError.*on task 0 \(indices \[4, 5\]\).*survive a bad sample"),
        (numbers_tasks_itself, r"should be for task 7, but it says task 0.*not your own count"),
        (forgets_to_collate, r"should be a torch.Tensor, but it is a list.*pass it through collate_fn"),
        (skips_the_sentinel, r"read past the sentinel.*return from the function right away"),
        (puts_the_exception, r"should be an ExceptionWrapper holding the KeyError.*not the exception itself"),
        (stops_at_the_first_error, r"returned after 1 of 3 answers.*only the sentinel ends the loop"),
        (answers_without_the_number, r"answer 0 should be the pair \(0, '<batch>'\), but it is a torch.Tensor"),
    ],
)
def test_check_worker_loop_rejects_a_wrong_loop_and_says_why(wrong, message):
    with pytest.raises(AssertionError, match=r"check \d+ failed, for ") as info:
        check_worker_loop(wrong)
    assert re.search(message, str(info.value), re.DOTALL), str(info.value)


def test_check_worker_loop_refuses_a_function_from_a_notebook_cell_only_where_workers_import_it(monkeypatch,
                                                                                                capsys):
    def in_a_cell(dataset, index_queue, result_queue, collate_fn):
        simple_worker_loop(dataset, index_queue, result_queue, collate_fn)

    in_a_cell.__module__ = "__main__"
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # a kernel's: no __file__
    with pytest.raises(AssertionError, match=r"(?s)started with spawn can't import a function defined in a notebook "
                                             r"cell.*%%writefile"):
        check_worker_loop(in_a_cell, start_method="spawn")
    if "fork" in multiprocessing.get_all_start_methods():  # a forked worker has the kernel's function already
        check_worker_loop(in_a_cell, start_method="fork")
        assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def test_check_worker_loop_under_spawn_rejects_what_a_worker_cannot_import():
    with pytest.raises(AssertionError, match=r"(?s)two worker processes \(spawn\).*could not be given your function"):
        check_worker_loop(lambda_loop, start_method="spawn")


def unfinished_loop(dataset, index_queue, result_queue, collate_fn):
    raise NotImplementedError("write worker_loop")


def test_check_worker_loop_names_the_case_when_the_loop_raises():
    with pytest.raises(NotImplementedError, match="write worker_loop") as info:
        check_worker_loop(unfinished_loop)
    assert "after 0 answers, for RangeDataset(10), default_collate, tasks [(0, [0, 1, 2])" in info.value.__notes__[0]


def test_run_worker_processes_gathers_every_answer_and_raises_a_crash_of_the_loop():
    answers = run_worker_processes(simple_worker_loop, toy.FailingDataset(10, bad_index=3),
                                   [(k, [2 * k, 2 * k + 1]) for k in range(5)])
    assert sorted(answers) == [0, 1, 2, 3, 4]
    assert [answers[k].tolist() for k in (0, 2, 3, 4)] == [[0, 1], [4, 5], [6, 7], [8, 9]]
    assert answers[1].exc_type is KeyError
    with pytest.raises(NotImplementedError, match=r"(?s)in worker process \d.*write worker_loop"):
        run_worker_processes(unfinished_loop, toy.RangeDataset(4), [(0, [0]), (1, [1])])


def hangs_at_the_sentinel(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        result_queue.put((task[0], collate_fn([dataset[i] for i in task[1]])))
    index_queue.get()  # waits for more instead of returning: reads the task after None, then the poison


def waits_at_the_sentinel(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        result_queue.put((task[0], collate_fn([dataset[i] for i in task[1]])))
    threading.Event().wait(10)  # neither reads on nor returns


@pytest.mark.parametrize("wrong, message", [
    (hangs_at_the_sentinel, r"read past the sentinel: it took the task put after None"),
    (waits_at_the_sentinel, r"answered every task but was still running 3 s after the sentinel None"),
])
def test_check_worker_loop_tells_reading_past_the_sentinel_from_not_leaving(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_worker_loop(wrong)


# --- check_reorder (ch05) ---------------------------------------------------------------------------



def quits_on_an_empty_queue(dataset, index_queue, result_queue, collate_fn, patience=0.05):
    import queue

    while True:
        try:
            task = index_queue.get(timeout=patience)
        except queue.Empty:
            return  # a real loader's next task comes late whenever a training step takes longer than patience
        if task is None:
            return
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((task_idx, batch))


def waits_on_after_an_empty_queue(dataset, index_queue, result_queue, collate_fn):  # right: a timeout, then on
    import queue

    while True:
        try:
            task = index_queue.get(timeout=0.05)
        except queue.Empty:
            continue
        if task is None:
            return
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((task_idx, batch))


def wraps_after_the_except_block(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        task_idx, indices = task
        failed = False
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            failed = True
        if failed:
            batch = ExceptionWrapper(where="in a worker")  # sys.exc_info() is empty here
        result_queue.put((task_idx, batch))


def says_done_with_none(dataset, index_queue, result_queue, collate_fn):
    while (task := index_queue.get()) is not None:
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((task_idx, batch))
    result_queue.put(None)


def polls_then_gives_up(dataset, index_queue, result_queue, collate_fn):
    import queue
    import time

    for _ in range(20):  # 20 polls 20 ms apart: 0.4 s of an empty queue, then it leaves
        try:
            task = index_queue.get_nowait()
        except queue.Empty:
            time.sleep(0.02)
            continue
        if task is None:
            return
        try:
            batch = collate_fn([dataset[i] for i in task[1]])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")
        result_queue.put((task[0], batch))


@pytest.mark.parametrize("wrong, message", [
    *[(functools.partial(quits_on_an_empty_queue, patience=patience), r"main process busy.*returned after 1 of 2 "
       r"answers, while the main process was busy.*however long it stays empty") for patience in (0.05, 1.0, 30.0)],
    (polls_then_gives_up, r"returned after 1 of 2 answers, while the main process was busy"),
    (wraps_after_the_except_block, r"ExceptionWrapper that holds no exception.*inside the except block"),
    (says_done_with_none, r"put None on result_queue after its answers.*put only answers"),
])
def test_check_worker_loop_names_each_mistake(wrong, message):
    rejects(check_worker_loop, wrong, message)


def test_check_worker_loop_accepts_a_loop_that_waits_on_after_a_timeout(capsys):
    check_worker_loop(waits_on_after_an_empty_queue)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def test_check_reorder_accepts_the_reference(capsys):
    check_reorder(reorder)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def test_due_after_is_the_running_maximum_of_arrival_positions():
    assert due_after([0, 1, 2]) == [1, 2, 3]
    assert due_after([3, 2, 1, 0]) == [4, 4, 4, 4]
    assert due_after([]) == []


def test_reorder_hands_each_batch_out_right_after_the_arrival_that_makes_it_due():
    arrivals = Arrivals([1, 2, 0, 4, 3])
    seen = [(batch, arrivals.taken) for batch in reorder(arrivals)]
    assert seen == [("batch 0", 3), ("batch 1", 3), ("batch 2", 3), ("batch 3", 5), ("batch 4", 5)]


def sorts_everything_first(arrivals):
    for _, batch in sorted(arrivals):
        yield batch


def in_arrival_order(arrivals):
    for _, batch in arrivals:
        yield batch


def if_instead_of_while(arrivals):
    held, due = {}, 0
    for task_idx, batch in arrivals:
        held[task_idx] = batch
        if due in held:
            yield held.pop(due)
            due += 1


def peeks_at_the_next_arrival(arrivals):
    held, due, pending = {}, 0, iter(arrivals)
    for task_idx, batch in pending:
        held[task_idx] = batch
        upcoming = next(pending, None)  # a look at what comes next, before handing out what is due
        while due in held:
            yield held.pop(due)
            due += 1
        if upcoming is not None:
            held[upcoming[0]] = upcoming[1]
            while due in held:
                yield held.pop(due)
                due += 1


def yields_pairs(arrivals):
    for batch in reorder(arrivals):
        yield int(batch.split()[1]), batch


def through_a_dataloader(arrivals):
    held = dict(arrivals)
    yield from minidl.DataLoader([held[k] for k in range(len(held))], batch_size=None)


@pytest.mark.parametrize("wrong, message", [
    (through_a_dataloader, r"your reorder ran minidl's DataLoader.*_task_info and _rcvd_idx"),
    (sorts_everything_first, r"arrival order \[0, 1, 2\].*batch 0 was due after 1 arrivals, but you had read 3.*read "
                             r"every arrival before handing anything out"),
    (in_arrival_order, r"arrival order \[1, 0, 2\].*output 0 should be 'batch 0', but it is 'batch 1'.*by task "
                       r"number, not in arrival order"),
    (if_instead_of_while, r"batch 1 was due after 2 arrivals, but you had read 3.*while loop"),
    (peeks_at_the_next_arrival, r"batch 0 was due after 1 arrivals, but you had read 2.*a peek at the next one"),
    (yields_pairs, r"output 0 should be 'batch 0', but it is \(0, 'batch 0'\).*yield the batch alone"),
])
def test_check_reorder_rejects_a_wrong_reorder_and_says_why(wrong, message):
    rejects(check_reorder, wrong, message)
