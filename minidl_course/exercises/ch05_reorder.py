"""Checker for ch05_reorder: the reorder buffer ``in_order=True`` needs; batch k is due once tasks 0..k have arrived."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate
from typing import Any

from minidl.dataloader import DataLoader, _BaseDataLoaderIter
from minidl_course import toy
from minidl_course.exercises._common import _Checks, _short, _torch, call, first_hint, yours

DELEGATED = ("write the reorder buffer (what _MultiProcessingDataLoaderIter keeps in _task_info and _rcvd_idx) "
             "yourself: a dict of early batches and the index of the next one due; don't run {0}.")
WHILE = "after each arrival, hand out held batches in a while loop (not an if) for as long as the next one is held."


class Arrivals:
    """The answers ``(task_idx, f"batch {task_idx}")`` in arrival ``order``, counting those ``taken`` and ``passes``."""
    def __init__(self, order: list[int]) -> None:
        self.order, self.taken, self.passes = list(order), 0, 0

    def __iter__(self) -> Iterator[tuple[int, str]]:
        self.passes += 1
        return self

    def __next__(self) -> tuple[int, str]:
        if self.taken >= len(self.order):
            raise StopIteration
        self.taken += 1
        return self.order[self.taken - 1], f"batch {self.order[self.taken - 1]}"


def due_after(order: list[int], one_each: bool = False) -> list[int]:
    """For each task k, how many arrivals must have been read before batch k can go out: the running maximum of the
    positions, e.g. ``[2, 0, 1, 3]`` gives ``[2, 3, 3, 4]``; ``one_each``: when a loop handing out at most one batch
    per arrival (an ``if``, not a ``while``) hands each out, as far as it gets (``[2, 3, 4]``)."""
    if one_each:
        held, out = set(), []
        for p, task in enumerate(order):
            held.add(task)
            out += [p + 1] if len(out) in held else []
        return out
    position = {task: p for p, task in enumerate(order)}
    return list(accumulate((position[k] + 1 for k in range(len(order))), max))


def _orders() -> Iterator[list[int]]:
    """Small readable arrival orders (the 4th: task 0 slow), then seeded ones, each task up to `window` tasks late."""
    yield from ([0, 1, 2], [1, 0, 2], [2, 0, 1, 3], [1, 2, 3, 0, 4], [4, 3, 2, 1, 0], [0], [])
    rng = random.Random(0)
    for _ in range(30):
        n, window = rng.randint(1, 16), rng.randint(1, 5)
        keys = [k + rng.uniform(0, window) for k in range(n)]
        yield sorted(range(n), key=keys.__getitem__)


def check_reorder(reorder: Callable[[Iterable[tuple[int, Any]]], Iterable[Any]]) -> None:
    """Check ch05_reorder: ``reorder(arrivals)`` yields the batches in task order, each as soon as it is due."""
    checks = _Checks(reorder)
    library = {"minidl's DataLoader": (DataLoader.__iter__, _BaseDataLoaderIter.__next__),
               "torch's DataLoader": (_torch().utils.data.DataLoader.__iter__,)}
    for order in _orders():
        case = f"arrival order {order}" if order else "no arrivals at all"
        arrivals, got, due, if_due = Arrivals(order), [], due_after(order), due_after(order, one_each=True)
        with checks.watching(library, case, "your reorder ran {0}", DELEGATED), yours("reorder", case):
            for k, batch in enumerate(reorder(arrivals)):
                got.append(batch)
                if k >= len(order):
                    break
                want, wrong = f"batch {k}", f"output {k} should be 'batch {k}', but it is "
                checks.first(
                    case, (isinstance(batch, tuple) and len(batch) == 2 and batch[1] == want, f"{wrong}{batch!r}",
                           "yield the batch alone; the task number only tells you where it goes."),
                    (batch == f"batch {order[k]}" != want, f"{wrong}{batch!r}, arrival number {k + 1}",
                     "hand batches out by task number, not in arrival order: hold early ones in a dict by task_idx."),
                    (batch != want, wrong + _short(batch), "hand out the lowest task number not out yet, from 0."),
                    (arrivals.taken > due[k], f"batch {k} was due after {due[k]} arrivals, but you had read "
                     f"{arrivals.taken} when you handed it out", first_hint(
                         "yield each batch as soon as the arrival that makes it due is read, before reading another.",
                         (k == 0 and arrivals.taken == len(order), "you read every arrival before handing anything "
                          "out: yield each batch as soon as it is due."),
                         (if_due[k:k + 1] == [arrivals.taken], WHILE),
                         (arrivals.taken == due[k] + 1, "you read one arrival more than you needed (a peek at the "
                          "next one?): hand out what is due first, then read on."))))
        checks.first(
            case, (arrivals.passes > 1, f"you iterated the arrivals {arrivals.passes} times",
                   "answers from workers can be read only once: loop over the arrivals once."),
            (len(got) < len(order), f"{len(order)} batches arrived, but you handed out {len(got)}: "
             f"{[f'batch {k}' for k in range(len(got), len(order))]} never came out", WHILE),
            (len(got) > len(order), f"{len(order)} batches arrived, but you handed out more: {got}",
             "each batch goes out exactly once: remove it from the buffer when you yield it."))
        checks.passed += 1
    case = ("minidl.DataLoader(toy.SlowDataset(16, slow=(2,)), batch_size=2, num_workers=2, in_order=False), "
            "each batch numbered by its first index // 2")  # out-of-order answers from a real loader
    arrivals = [(int(batch[0]) // 2, batch) for batch in DataLoader(toy.SlowDataset(16, slow=(2,), slow_delay=0.05),
                                                                     batch_size=2, num_workers=2, in_order=False)]
    got = [batch.tolist() for batch in call(reorder, iter(arrivals), what="reorder", case=case)]
    want = [[2 * k, 2 * k + 1] for k in range(8)]
    checks.first(case, (got != want, f"arrived as {[k for k, _ in arrivals]}; you handed out {got}, not {want}", ""))
    checks.passed += 1
    checks.done()
