"""Checker for ch05_reorder: the reorder buffer that ``in_order=True`` needs (notebook 05).

Workers answer tasks in whatever order they finish; ``_MultiProcessingDataLoaderIter`` holds early answers in
``_task_info`` and hands them out at ``_rcvd_idx``. The expected timing comes from the spec: batch k is due once
every task up to k has arrived, that is after ``max(arrival position of 0..k) + 1`` arrivals.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from minidl_course.exercises._common import (
    Tripwire,
    _Checks,
    _short,
    _torch,
    refuse_reference,
    run_watched,
    watch,
    yours,
)


class Arrivals:
    """The answers ``(task_idx, batch)`` in arrival order, counting how many have been read (``taken``).

    >>> arrivals = Arrivals([1, 0])
    >>> next(arrivals), arrivals.taken
    ((1, 'batch 1'), 1)
    """

    def __init__(self, order: list[int]) -> None:
        self.order = list(order)
        self.taken = 0  # arrivals read so far
        self.passes = 0

    def __iter__(self) -> Iterator[tuple[int, str]]:
        self.passes += 1
        return self

    def __next__(self) -> tuple[int, str]:
        if self.taken >= len(self.order):
            raise StopIteration
        task_idx = self.order[self.taken]
        self.taken += 1
        return task_idx, f"batch {task_idx}"


def due_after(order: list[int]) -> list[int]:
    """For each task k, how many arrivals must have been read before batch k can be handed out.

    >>> due_after([2, 0, 1, 3])  # 0 arrives second; 1 third, and 2 is already there; 3 fourth
    [2, 3, 3, 4]
    """
    position = {task: p for p, task in enumerate(order)}
    due, latest = [], -1
    for k in range(len(order)):
        latest = max(latest, position[k])
        due.append(latest + 1)
    return due


def _reorder_cases() -> Iterator[list[int]]:
    """Arrival orders: small readable ones, then seeded random ones, disordered the way workers disorder them."""
    yield [0, 1, 2]
    yield [1, 0, 2]
    yield [2, 0, 1, 3]
    yield [1, 2, 3, 0, 4]  # task 0 is slow: three early arrivals wait for it
    yield [4, 3, 2, 1, 0]
    yield [0]
    yield []
    rng = random.Random(0)
    for _ in range(30):
        n, window = rng.randint(1, 16), rng.randint(1, 5)
        keys = [k + rng.uniform(0, window) for k in range(n)]  # each task finishes up to `window` tasks late
        yield sorted(range(n), key=keys.__getitem__)


DELEGATED = ("the reorder buffer is what _MultiProcessingDataLoaderIter keeps in _task_info and _rcvd_idx: write "
             "it yourself, with a dict of early batches and the index of the next one due; don't run {0}.")


def _library_loaders() -> dict:
    from minidl.dataloader import DataLoader, _BaseDataLoaderIter

    torch_data = _torch().utils.data
    return watch({"minidl's DataLoader": (DataLoader.__iter__, _BaseDataLoaderIter.__next__),
                  "torch's DataLoader": (torch_data.DataLoader.__iter__,)})


def check_reorder(reorder: Callable[[Iterable[tuple[int, Any]]], Iterable[Any]]) -> None:
    """Check ch05_reorder: ``reorder(arrivals)`` yields the batches in task order, each as soon as it is due.

    Raises AssertionError explaining the first mismatch; prints ``All N checks passed``.
    """
    refuse_reference(reorder)
    checks = _Checks()
    for order in _reorder_cases():
        case = f"arrival order {order}" if order else "no arrivals at all"
        arrivals = Arrivals(order)
        got: list[Any] = []
        run_watched(Tripwire(_library_loaders()),
                    lambda a=arrivals, o=order, g=got, c=case: _run_reorder(reorder, a, o, g, c, checks),
                    lambda what, c=case: checks.fail(c, f"your reorder ran {what}", DELEGATED.format(what)))
        _check_reorder_result(arrivals, order, got, case, checks)
        checks.passed += 1
    _check_with_dataloader(reorder, checks)
    checks.passed += 1
    checks.done()


def _run_reorder(reorder, arrivals: Arrivals, order, got, case, checks: _Checks) -> None:
    due = due_after(order)
    with yours("reorder", case):
        for k, batch in enumerate(reorder(arrivals)):
            got.append(batch)
            if k >= len(order):
                break
            if batch != f"batch {k}":
                _wrong_batch(k, batch, arrivals, order, got, case, checks)
            if arrivals.taken > due[k]:
                checks.fail(case, f"batch {k} was due after {due[k]} arrivals, but you had read {arrivals.taken} "
                                  "when you handed it out",
                            "you read every arrival before handing anything out: yield a batch as soon as it is due; "
                            "holding them all costs memory and makes the training loop wait."
                            if k == 0 and arrivals.taken == len(order) and due[k] < len(order) else
                            "before reading another arrival, hand out the batch due next if it is already held: after "
                            "each arrival, yield in a while loop for as long as the next index is in the buffer.")


def _wrong_batch(k, batch, arrivals: Arrivals, order, got, case, checks: _Checks) -> None:
    if isinstance(batch, tuple) and len(batch) == 2 and batch[1] == f"batch {k}":
        checks.fail(case, f"output {k} should be 'batch {k}', but it is {batch!r}",
                    "yield the batch alone; the task number only tells you where it goes.")
    if batch == f"batch {order[k]}" and order[k] != k:
        checks.fail(case, f"output {k} should be 'batch {k}', but it is {batch!r}, arrival number {k + 1}",
                    "hand batches out by task number, not in arrival order: hold an early one in a dict keyed by "
                    "task_idx until every batch before it has gone out.")
    checks.fail(case, f"output {k} should be 'batch {k}', but it is {_short(batch)}",
                "the next batch to hand out is the one with the lowest task number not handed out yet, starting at 0.")


def _check_reorder_result(arrivals: Arrivals, order, got, case, checks: _Checks) -> None:
    if arrivals.passes > 1:
        checks.fail(case, f"you iterated the arrivals {arrivals.passes} times",
                    "answers from workers can be read only once: loop over the arrivals once.")
    if len(got) < len(order):
        missing = [f"batch {k}" for k in range(len(got), len(order))]
        checks.fail(case, f"{len(order)} batches arrived, but you handed out {len(got)}: {missing} never came out",
                    "when an arrival makes the next batch due, keep handing out the held batches that follow it, "
                    "with a while loop, not an if.")
    if len(got) > len(order):
        checks.fail(case, f"{len(order)} batches arrived, but you handed out more: {got}",
                    "each batch goes out exactly once: remove it from the buffer when you yield it.")


def _check_with_dataloader(reorder, checks: _Checks) -> None:
    """Out-of-order answers from a real minidl.DataLoader(in_order=False), put back in order."""
    from minidl.dataloader import DataLoader
    from minidl_course import toy

    case = ("minidl.DataLoader(toy.SlowDataset(16, slow=(2,)), batch_size=2, num_workers=2, in_order=False), "
            "each batch numbered by its first index // 2")
    loader = DataLoader(toy.SlowDataset(16, slow=(2,), slow_delay=0.05), batch_size=2, num_workers=2, in_order=False)
    arrivals = [(int(batch[0]) // 2, batch) for batch in loader]
    got = [batch.tolist() for batch in reorder(iter(arrivals))]
    want = [[2 * k, 2 * k + 1] for k in range(8)]
    if got != want:
        checks.fail(case, f"arrived as {[k for k, _ in arrivals]}; you handed out {got}, not {want}")
