"""Checker for ch05_worker_loop: the loop each worker process runs; ``run_worker_processes``: the main side."""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from minidl._utils import join_worker
from minidl.collate import default_collate
from minidl.worker import ExceptionWrapper, _worker_loop
from minidl_course import toy
from minidl_course.exercises._common import YourTurn, _Checks, _short, _torch, first_difference, yours
from minidl_course.exercises.ch03_collate import expected_collate, make_token_samples

Task = tuple[int, list[int]]  # (task_idx, indices): one batch's worth of work, as the main process sends it
STUCK_AFTER = 3.0  # seconds a worker loop may take to leave after its sentinel before the checker gives up
BUSY_MAIN = 0.3  # seconds one case's main process leaves the index queue empty, as a slow training step does
EMPTIES = 25  # and how many timed-out gets it answers with queue.Empty before it sends the next task
DELEGATED = "{0} is the library's worker loop: write the loop yourself (get, fetch, collate, put, until None)."
AT_NONE = "None means 'no more work': when index_queue.get() returns None, return from the function right away."
MODULE_FILE = "write it into a module file (the %%writefile cell) and import it from there: a fresh process imports it."


def expected_answers(dataset: Any, collate_fn: Callable, tasks: Sequence[Task]) -> list[tuple[int, Any]]:
    """The spec, task by task: ``(task_idx, batch)``, or ``(task_idx, ExceptionWrapper)`` where it raises."""
    answers = []
    for task_idx, indices in tasks:
        try:
            answers.append((task_idx, collate_fn([dataset[i] for i in indices])))
        except Exception:
            answers.append((task_idx, ExceptionWrapper(where="in the checker")))
    return answers


def _cases() -> Iterator[tuple[str, Any, Callable, list[Task], float]]:
    """(description, dataset, collate_fn, tasks, seconds the main process is busy after the first task)."""
    ten, r10, collate = "RangeDataset(10), default_collate", toy.RangeDataset(10), default_collate
    yield ten, r10, collate, [(0, [0, 1, 2]), (1, [3, 4])], 0
    yield f"{ten}, task numbers that don't start at 0", r10, collate, [(7, [3, 4, 5]), (8, [9]), (3, [0])], 0
    yield f"{ten}, no tasks at all", r10, collate, [], 0
    yield ("FailingDataset(10, bad_index=5) (sample 5 raises KeyError), default_collate",
           toy.FailingDataset(10, bad_index=5), collate, [(0, [4, 5]), (1, [6, 7]), (2, [8])], 0)
    yield f"{ten}, index 10 is out of range (IndexError)", r10, collate, [(0, [8, 9]), (1, [10]), (2, [0])], 0
    yield ("make_token_samples(4, seed=1), a padding collate, an empty task (the collate raises)",
           make_token_samples(4, seed=1), expected_collate, [(0, [0, 1]), (1, []), (2, [2, 3])], 0)
    rng = random.Random(0)
    for seed in range(30):
        n, bad = rng.randint(1, 20), rng.randrange(20)
        made = ((f"RangeDataset({n}), default_collate", toy.RangeDataset(n), collate),
                (f"FailingDataset({n}, bad_index={bad % n}), default_collate", toy.FailingDataset(n, bad % n), collate),
                (f"make_token_samples({n}, seed={seed}), a padding collate", make_token_samples(n, seed=seed),
                 expected_collate))[seed % 3]
        labels = rng.sample(range(100), rng.randint(0, 6))  # task numbers: unique, in no particular order
        yield *made, [(label, [rng.randrange(n + (rng.random() < 0.1)) for _ in range(rng.randint(1, 4))])
                      for label in labels], 0  # now and then an index one past the end: an IndexError
    yield (f"{ten}, the main process busy for {BUSY_MAIN:g} s after the first task", r10, collate,
           [(0, [0, 1]), (1, [2, 3])], BUSY_MAIN)


def check_worker_loop(worker_loop: Callable[..., None], start_method: str | None = None) -> None:
    """Check ch05_worker_loop: ``worker_loop`` in a thread (a hang can be explained), then in two processes."""
    checks = _Checks(worker_loop)
    checks.refuse_cell_function(worker_loop, MODULE_FILE, start_method)
    for case in _cases():
        _check_in_thread(worker_loop, checks, *case)
        checks.passed += 1
    dataset, tasks = toy.FailingDataset(24, bad_index=13), [(k, [2 * k, 2 * k + 1]) for k in range(12)]
    case = (f"two worker processes ({start_method or multiprocessing.get_start_method()}), FailingDataset(24, "
            "bad_index=13), default_collate, tasks (k, [2k, 2k + 1]) for k in 0..11 dealt round-robin")
    try:
        got = run_worker_processes(worker_loop, dataset, tasks, default_collate, start_method=start_method)
    except (TypeError, AttributeError, pickle.PicklingError) as e:  # what pickling a function can raise
        checks.fail(case, f"the worker processes could not be given your function: {type(e).__name__}: {e}",
                    MODULE_FILE)
    except RuntimeError as e:
        checks.fail(case, str(e).splitlines()[0], AT_NONE)
    for k, (idx, want) in enumerate(expected_answers(dataset, default_collate, tasks)):
        _compare(k, (idx, want), (idx, got.get(idx)), tasks, dataset, case, checks)
    checks.passed += 1
    checks.done()


class BusyMainQueue(queue.Queue):
    """An index queue whose main process is ``busy``: a ``get`` with a timeout (or none to wait) finds it empty at
    once, as if the timeout had run out (``empties`` counts them); ``waiting``: a ``get`` that waits."""
    busy, empties, waiting = False, 0, False

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if self.busy and self.empty() and (not block or timeout is not None):
            self.empties += 1
            time.sleep(0.002)
            raise queue.Empty
        self.waiting = block and timeout is None
        return super().get(block, timeout)


def _check_in_thread(worker_loop, checks: _Checks, description, dataset, collate_fn, tasks, pause: float) -> None:
    """Run ``worker_loop`` in a thread on ``tasks``, the sentinel and one task more (the first task alone for
    ``pause`` seconds); judge what it put, what it raised, and whether it stopped at the sentinel."""
    case = f"{description}, {f'tasks {list(tasks)}, then None' if tasks else 'only the sentinel None'}"
    index_queue, result_queue, raised = BusyMainQueue(), queue.Queue(), []
    items = [*tasks, None, (999, [0])]  # after the sentinel, a task: a loop that reads it has not stopped
    for item in items[:1 if pause else len(items)]:
        index_queue.put(item)
    index_queue.busy = bool(pause)
    with checks.watching({"minidl.worker._worker_loop": (_worker_loop,), "torch's _worker_loop": (
            _torch().utils.data._utils.worker._worker_loop,)}, case, "your loop called {0}", DELEGATED):
        thread = threading.Thread(target=_guarded_worker, name="ch05_worker_loop", daemon=True,
                                  args=(worker_loop, 0, dataset, index_queue, result_queue, collate_fn, raised))
        thread.start()
        deadline = time.monotonic() + pause + STUCK_AFTER
        time.sleep(pause)  # then busy on, until the loop waits in get() or found the queue empty EMPTIES times
        while pause and thread.is_alive() and not index_queue.waiting and index_queue.empties < EMPTIES \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        index_queue.busy = False
        for item in items[1:] if pause else []:
            index_queue.put(item)
        thread.join(timeout=STUCK_AFTER)
        unread = index_queue.qsize()  # 1, the task after the sentinel, as it should be
    if still_running := thread.is_alive():
        for _ in range(3):  # so the thread doesn't wait on the queue forever: unpacking an int raises
            index_queue.put(0)
        thread.join(timeout=1.0)
        raised.clear()  # what the 0 made it raise is the checker's doing, not a finding
    results = [result_queue.get_nowait() for _ in range(result_queue.qsize())]
    expected = expected_answers(dataset, collate_fn, tasks)
    n, k = len(expected), len(results)
    if raised:
        what = f"{type(raised[0]).__name__}: {raised[0]}"
        if isinstance(raised[0], TypeError) and "NoneType" in str(raised[0]) and k == n:
            checks.fail(case, f"your loop answered every task, then raised {what}", "the None after the last task "
                        "is the sentinel: check `if task is None` before unpacking, and return.")
        if k < n and isinstance(expected[k][1], ExceptionWrapper):
            checks.fail(case, f"your loop died with {what} on task {tasks[k][0]} (indices {tasks[k][1]}), whose "
                        f"fetch or collate raises {expected[k][1].exc_type.__name__}", "a worker must survive a bad "
                        "sample: wrap fetch + collate in try/except Exception, and put (task_idx, ExceptionWrapper("
                        "where='in a worker')).")
        with yours(f"worker loop after {k} answers", case):
            raise raised[0]
    for i, (want, got) in enumerate(zip(expected, results)):
        _compare(i, want, got, tasks, dataset, case, checks)
    returned = f"your loop returned after {k} of {n} answers"
    checks.first(
        case, (k < n and still_running, f"after {k} of {n} answers your loop stopped answering (it was still running "
               f"{STUCK_AFTER:g} s later)", "read a task, answer it, read the next: one put per task, once it's done."),
        (k < n and pause, f"{returned}, while the main process was busy for {pause:g} s (the index queue empty, "
         "a get with a timeout finding nothing)", "an empty queue is not the end, however long it stays empty: a "
         "busy main process sends the next task late. Wait in index_queue.get() (after a timeout's queue.Empty, "
         "wait again); only None ends the loop."),
        (k < n, returned, "keep reading tasks until you read None; only the sentinel ends the loop."),
        (k == n + 1 and results[-1] is None and unread == 1, "your loop put None on result_queue after its answers",
         "put only answers on result_queue (the main process counts the tasks it sent); at the sentinel, just return."),
        (unread == 0 or k > n, "your loop read past the sentinel: it took the task put after None"
         + (f" and answered it with {results[n]!r}" if k > n else ""), AT_NONE),
        (still_running, f"your loop answered every task but was still running {STUCK_AFTER:g} s after the sentinel "
         "None", AT_NONE))


def _compare(k, want, got, tasks, dataset, case, checks: _Checks) -> None:
    """Answer ``k`` of the learner's loop against the spec's ``want``."""
    (want_idx, want_batch), where = want, f"answer {k}"
    if not isinstance(got, tuple | list) or len(got) != 2:
        checks.fail(case, f"{where} should be the pair {(want_idx, '<batch>')}, but it is {_short(got)}",
                    "put (task_idx, batch) on result_queue: the main process needs the number to reorder batches.")
    got_idx, got_batch = got
    if got_idx != want_idx:
        checks.fail(case, f"{where} should be for task {want_idx}, but it says task {got_idx!r}",
                    "send back the task_idx that came with the task, not your own count: the main process reorders "
                    "by it.")
    if not isinstance(want_batch, ExceptionWrapper):
        problem = first_difference(want_batch, got_batch, where=f"the batch of task {want_idx}")
        if problem:
            checks.fail(case, problem, "you put the list of samples: pass it through collate_fn first."
                        if first_difference([dataset[i] for i in tasks[k][1]], got_batch) is None
                        else f"the batch is collate_fn([dataset[i] for i in {tasks[k][1]}]).")
        return
    exc, wrapped = want_batch.exc_type.__name__, getattr(got_batch, "exc_type", None)
    checks.first(
        case, (not isinstance(got_batch, ExceptionWrapper), f"{where} (task {want_idx}, indices {tasks[k][1]}) "
               f"should be an ExceptionWrapper holding the {exc} raised by the fetch or collate, but it is "
               f"{_short(got_batch)}", "put an ExceptionWrapper, not the exception itself: it holds the traceback as "
               "text, which (unlike a traceback) can be pickled for the main process."
               if isinstance(got_batch, BaseException) else "wrap the error inside the except block: "
               "ExceptionWrapper(where='in a worker') keeps its type and traceback as text, which can travel between "
               "processes."),
        (wrapped is None, f"{where} (task {want_idx}) is an ExceptionWrapper that holds no exception", "make it inside "
         "the except block: it reads the exception being handled (sys.exc_info()); after the block there is none."),
        (wrapped is not want_batch.exc_type, f"{where} (task {want_idx}) should wrap a {exc}, but it wraps a "
         f"{getattr(wrapped, '__name__', wrapped)}", ""))


def _guarded_worker(worker_loop, worker_id, dataset, index_queue, result_queue, collate_fn, raised=None) -> None:
    """A worker's target: an error ``worker_loop`` raises goes to ``raised`` (a thread's), else to the main process."""
    try:
        worker_loop(dataset, index_queue, result_queue, collate_fn)
    except BaseException as e:  # noqa: B036 -- anything the learner's loop raises is reported
        if raised is not None:
            raised.append(e)
        else:
            result_queue.put(ExceptionWrapper(where=f"in worker process {worker_id}"))


def run_worker_processes(worker_loop: Callable[..., None], dataset: Any, tasks: Sequence[Task],
                         collate_fn: Callable = default_collate, num_workers: int = 2,
                         start_method: str | None = None, timeout: float = 60.0) -> dict[int, Any]:
    """Notebook 05's main process, in small: ``tasks`` dealt round-robin to ``num_workers`` processes running
    ``worker_loop``, a ``None`` each once all answers are in; ``{task_idx: batch}``. The loop's own error is raised."""
    ctx = multiprocessing.get_context(start_method)
    index_queues, result_queue = [ctx.Queue() for _ in range(num_workers)], ctx.Queue()
    workers = [ctx.Process(target=_guarded_worker, args=(worker_loop, i, dataset, q, result_queue, collate_fn),
                           name=f"worker {i}", daemon=True) for i, q in enumerate(index_queues)]
    try:
        for w in workers:
            w.start()  # under spawn/forkserver this pickles worker_loop: it must be importable
        for k, task in enumerate(tasks):
            index_queues[k % num_workers].put(task)
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(answers) < len(tasks):
            try:
                answer = result_queue.get(timeout=0.2)
            except queue.Empty:
                dead = [w for w in workers if not w.is_alive()]
                if dead or time.monotonic() > deadline:
                    why = f"{dead[0].name} exited with code {dead[0].exitcode}" if dead else f"none for {timeout:g} s"
                    raise RuntimeError(f"{len(answers)} of {len(tasks)} answers arrived: {why}") from None
                continue
            if isinstance(answer, ExceptionWrapper):  # not an answer: the loop itself raised
                if answer.exc_type is YourTurn:  # a reminder, not a bug: without the worker's traceback
                    raise YourTurn(f"Caught YourTurn {answer.where}")
                answer.reraise()
            answers[answer[0]] = answer[1]
        for q in index_queues:  # only now: a tensor in shared memory must be received before its worker exits
            q.put(None)
        deadline = time.monotonic() + 30  # a spawned interpreter with torch imported: slow to tear down under load
        for w in workers:  # the loader's join: join() alone waits on a pipe a worker's torch_shm_manager may hold
            join_worker(w, max(0.0, deadline - time.monotonic()))
        if any(w.exitcode != 0 for w in workers):
            raise RuntimeError(f"30 s after the sentinels, exit codes {[w.exitcode for w in workers]} (None: running)")
        return answers
    finally:
        for w in (w for w in workers if w.is_alive()):
            w.terminate()
            w.join(timeout=5)
        for q in [*index_queues, result_queue]:
            q.cancel_join_thread()
            q.close()
