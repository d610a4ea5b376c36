"""Reference answer to ch05_reorder."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def reorder(arrivals: Iterable[tuple[int, Any]]) -> Iterator[Any]:
    """Yield the batches of ``(task_idx, batch)`` arrivals in task order, each as soon as it is due.

    >>> list(reorder([(1, "b"), (0, "a"), (2, "c")]))
    ['a', 'b', 'c']
    """
    held: dict[int, Any] = {}  # early arrivals, by task number (torch's _task_info)
    rcvd_idx = 0  # the task due next (torch's _rcvd_idx)
    for task_idx, batch in arrivals:
        held[task_idx] = batch
        while rcvd_idx in held:  # this arrival may free a run of held batches
            yield held.pop(rcvd_idx)
            rcvd_idx += 1
