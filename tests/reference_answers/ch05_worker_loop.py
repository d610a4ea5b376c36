"""Reference answer to ch05_worker_loop (a module, so worker processes started with spawn can import it)."""

from __future__ import annotations

from minidl.worker import ExceptionWrapper


def worker_loop(dataset, index_queue, result_queue, collate_fn) -> None:
    """Answer each task ``(task_idx, indices)`` with ``(task_idx, batch)``; return at the ``None`` sentinel."""
    while True:
        task = index_queue.get()
        if task is None:  # the sentinel: no more work
            return
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")  # the error travels back as data; the loop goes on
        result_queue.put((task_idx, batch))
