"""Checker for ch05_keep_up: make a loader keep up with the training step (notebook 05's workers, 04's batched fetch).

``Records`` sits in slow storage: every read is one request (``REQUEST_S``) plus a little per record, and
``records[[i, j, ...]]`` reads many in one. ``train_step`` sleeps ``STEP_S``, the CPU free, as while an accelerator
computes. The checker runs the learner's ``make_loader(records)`` itself, a step after every batch, on its own
clock, and accepts it when the batches are those of ``DataLoader(records, batch_size=16)`` and, for the typical
batch (the median), the step waits at most ``MAX_WAIT`` of the loop, each worker's first batch (its start) left out.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from minidl.dataloader import DataLoader
from minidl.dataset import Dataset
from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, _short, _torch, call, first_difference, first_hint

N, BATCH = 384, 16  # 24 batches an epoch
REQUEST_S = 0.003  # what one read costs, however many records it asks for (a request to storage)
RECORD_S = 0.0001  # and each record it returns
STEP_S = 0.030  # the training step
MAX_WAIT = 0.25  # the most of a typical batch's loop (wait + step) the step may spend waiting for data
BATCHES = N // BATCH
PER_BATCH = BATCH * (REQUEST_S + RECORD_S)  # a batch read a record at a time


class Records(Dataset):
    """``n`` records, each ``(image, label)``: a ``(3, 8, 8)`` uint8 array and an int, in slow storage.
    ``records[[i, j, ...]]`` reads them in one request, as the batch ``(images, labels)``; ``reads`` counts the
    requests made in this process (a worker counts its own)."""

    def __init__(self, n: int = N, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self._images = rng.integers(0, 256, size=(n, 3, 8, 8), dtype=np.uint8)  # "on disk": read through read()
        self._labels = rng.integers(0, 10, size=n).astype(np.int64)
        self.reads = 0

    def __len__(self) -> int:
        return len(self._labels)

    def read(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """One request for the records ``indices``: ``(images, labels)``, stacked."""
        rows = [int(i) for i in indices]
        for i in rows:
            if not 0 <= i < len(self):
                raise IndexError(f"index {i} out of range for {len(self)} records")
        self.reads += 1
        time.sleep(REQUEST_S + RECORD_S * len(rows))
        return self._images[rows], self._labels[rows]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, list | tuple | np.ndarray):
            return self.read(index)  # a whole batch in one request
        images, labels = self.read([index])
        return images[0], int(labels[0])


def train_step(batch: Any, seconds: float = STEP_S) -> None:
    """The stand-in training step: ``seconds`` with the CPU free, as while an accelerator computes."""
    time.sleep(seconds)


def given_loader(records: Records) -> DataLoader:
    """The loader that falls behind: one record per request, in the main process."""
    return DataLoader(records, batch_size=BATCH)


@dataclass(frozen=True, repr=False)
class Run:
    """One epoch of a loader feeding ``train_step``, on the checker's clock: the wait for each batch (batch 0's
    includes starting the workers), each step, and how the loader reads."""

    waits: list[float]
    steps: list[float]
    workers: int
    batched: bool  # the loader asks for a whole batch at once (batch_size=None, or a dataset with __getitems__)

    @property
    def skipped(self) -> int:
        """Batches left out: each worker's first (the main process's first with none), which carries its start."""
        return min(max(1, self.workers), len(self.waits))

    @property
    def wait_share(self) -> float:
        """The median over the batches after the skipped ones of the share of the loop (wait + step) spent
        waiting: one stall (another program's burst of work) is not taken for the loader's pace."""
        shares = [w / (w + s) for w, s in zip(self.waits[self.skipped:], self.steps[self.skipped:]) if w + s > 0]
        return statistics.median(shares) if shares else 0.0

    def __repr__(self) -> str:
        return f"Run(workers={self.workers}, batched={self.batched}, wait_share={self.wait_share:.2f})"

    def __str__(self) -> str:
        counted = len(self.waits) - self.skipped
        how = f"{self.workers} worker{'s' if self.workers != 1 else ''}" if self.workers else "no workers"
        how += ", a batch per request" if self.batched else ", a record per request"
        mean_wait = sum(self.waits[self.skipped:]) / counted if counted else 0.0
        return (f"{how}: the step waited {self.wait_share:.0%} of the time for a typical batch (median; a mean "
                f"{mean_wait * 1e3:.1f} ms a batch beside a {STEP_S * 1e3:.0f} ms step), over the {counted} batches "
                f"after the first {self.skipped} (start-up: {sum(self.waits[:self.skipped]):.2f} s)")


def run_epoch(loader: Any, step: Callable[[Any], None] = train_step,
              clock: Callable[[], float] = time.perf_counter) -> tuple[Run, list[Any]]:
    """One epoch of ``loader`` with ``step`` after each batch, timed; the Run and the batches. Stops one batch past
    an epoch, so a loader that never ends is noticed rather than waited on."""
    waits, steps, batches = [], [], []
    start = clock()
    iterator = iter(loader)
    for batch in iterator:
        got = clock()
        waits.append(got - start)
        batches.append(batch)
        if len(batches) > BATCHES:
            break
        step(batch)
        start = clock()
        steps.append(start - got)
    del iterator  # its workers end here, not at the next collection
    batched = getattr(loader, "batch_size", 1) is None or hasattr(getattr(loader, "dataset", None), "__getitems__")
    return Run(waits, steps, int(getattr(loader, "num_workers", 0) or 0), batched), batches


def wait_share(make_loader: Callable[[Records], Any], seed: int = 0) -> Run:
    """Try a ``make_loader``: one epoch of its loader feeding ``train_step``, the measurement printed and returned."""
    run, _ = run_epoch(make_loader(Records(seed=seed)))
    print(run)
    return run


def check_keep_up(make_loader: Callable[[Records], Any], seed: int = 7) -> None:
    """Check ch05_keep_up: ``make_loader(records)`` gives the right batches and the step waits at most MAX_WAIT, as
    the checker measures it (twice, with a fresh loader, if the first run waited too long: a burst of load).
    Prints what it measured; raises AssertionError at the first problem, with a hint."""
    case = f"make_loader(Records(seed={seed})), {N} records in batches of {BATCH}, a {STEP_S * 1e3:.0f} ms step"
    checks = _Checks()

    def measure() -> Run:
        checks.passed = 0  # a second measurement counts its checks afresh
        records = Records(seed=seed)
        loader = call(make_loader, records, what="make_loader", case=case, explain=lambda e: _explain(e, checks, case))
        check_loader(loader, records, checks, case)
        run, batches = call(run_epoch, loader, what="loader", case=case, explain=lambda e: _explain(e, checks, case))
        check_batches(batches, records, checks, case)
        return run

    harness.refuse_reference(make_loader)
    run = harness.twice(measure, lambda r: r.wait_share <= MAX_WAIT)
    print(f"Measured on my clock, {run}")
    judge(run, checks, case)
    checks.done()


def _explain(e: Exception, checks: _Checks, case: str) -> None:
    text = str(e)
    if isinstance(e, ValueError) and ("prefetch_factor" in text or "persistent_workers" in text):
        checks.fail(case, f"the loader raised ValueError: {text}",
                    "prefetch_factor and persistent_workers shape what workers do: with num_workers=0 there are "
                    "none, so they are refused. Start workers (num_workers > 0), or drop them.")
    if isinstance(e, ValueError) and "batch_size" in text and "sampler" in text:
        checks.fail(case, f"the loader raised ValueError: {text}",
                    "a BatchSampler goes in as sampler= with batch_size=None (or as batch_sampler=, where it makes "
                    "the loader ask for one record at a time).")


def check_loader(loader: Any, records: Records, checks: _Checks, case: str) -> None:
    """``loader`` is a DataLoader over ``records`` that has read nothing yet."""
    if not isinstance(loader, DataLoader | _torch().utils.data.DataLoader):
        checks.fail(case, f"make_loader should return a DataLoader (minidl's or torch's), but it returned "
                          f"{_short(loader)}", first_hint(
            "return the loader itself, e.g. return DataLoader(records, batch_size=16, ...): the checker runs it.",
            (isinstance(loader, int | float), "the checker never takes a number from you: it runs your loader and "
             "measures the wait itself. Return the DataLoader."),
            (isinstance(loader, list | tuple), "a list of batches read before the loop starts keeps up by reading "
             "the whole epoch first; return a DataLoader that reads as the loop runs.")))
    if records.reads:
        checks.fail(case, f"make_loader made {records.reads} reads before the loop began",
                    "reading ahead into memory before training isn't keeping up (an epoch of real data doesn't fit): "
                    "build the loader, read nothing yet.")
    dataset = loader.dataset
    if dataset is not records and not any(v is records for v in getattr(dataset, "__dict__", {}).values()):
        checks.fail(case, f"the loader reads from {_short(dataset)}, not the records make_loader was given",
                    "build the loader over make_loader's argument, records.")
    checks.passed += 1


def check_batches(batches: list, records: Records, checks: _Checks, case: str) -> None:
    """The batches are those of ``DataLoader(records, batch_size=16)``, in order: their form first (a batch of the
    wrong size is a hint of its own), then their number, then what they hold."""
    torch = _torch()
    batches = [list(b) if isinstance(b, tuple) else b for b in batches]
    want = [[torch.from_numpy(a[k * BATCH:(k + 1) * BATCH].copy()) for a in (records._images, records._labels)]
            for k in range(len(batches))]
    for k, got in enumerate(batches[:BATCHES]):
        if not _pair(got) or any(g.dtype != w.dtype or g.shape != w.shape for g, w in zip(got, want[k])):
            checks.fail(case, first_difference(want[k], got, f"batch {k}"), _batch_hint(got, want[k], records))
    if len(batches) != BATCHES:
        more = len(batches) > BATCHES
        checks.fail(case, f"the loader gave {'more than ' if more else ''}{BATCHES if more else len(batches)} "
                          f"batches; an epoch of {N} records in batches of {BATCH} is {BATCHES}",
                    "one epoch, every record once: a sampler that repeats or runs on is a different epoch."
                    if more else "every record once, in order: a sampler over part of the records, or drop_last with "
                    "another batch size, skips some.")
    for k, got in enumerate(batches):
        problem = first_difference(want[k], got, f"batch {k}")
        if problem:
            checks.fail(case, problem, _batch_hint(got, want[k], records))
    checks.passed += 1


def _pair(batch: Any) -> bool:
    return isinstance(batch, list) and len(batch) == 2 and all(isinstance(x, _torch().Tensor) for x in batch)


def _batch_hint(got: Any, want: list, records: Records) -> str:
    images = got[0] if _pair(got) else None
    everything = _torch().from_numpy(records._images)
    return first_hint(
        f"each batch is [images, labels]: a ({BATCH}, 3, 8, 8) uint8 tensor and ({BATCH},) int64 labels, as "
        f"DataLoader(records, batch_size={BATCH}) gives; a collate_fn of your own must give the same.",
        (images is not None and images.ndim == 5 and images.shape[1] == BATCH, "the loader batched your batches: "
         "with a BatchSampler as sampler=, pass batch_size=None so each of its batches goes out as it is."),
        (images is not None and images.ndim == 4 and images.shape[0] != BATCH, f"keep batches of {BATCH}: the "
         "training step is tuned for them, and smaller batches are a different training run, not a faster loader."),
        (images is not None and images.shape == want[0].shape and bool((everything == images[0]).all(
            dim=(1, 2, 3)).any()), "those are records, but not the right ones: the batches come in order (no "
         f"shuffle, and in_order left True), records 0-{BATCH - 1}, then {BATCH}-{2 * BATCH - 1}, ..."))


def judge(run: Run, checks: _Checks | None = None, case: str = "your loader") -> None:
    """The verdict on the wait, from the checker's measurement alone."""
    checks = checks or _Checks()
    if run.wait_share > MAX_WAIT:
        checks.fail(case, f"the step waited for data {run.wait_share:.0%} of the time for a typical batch; at most "
                          f"{MAX_WAIT:.0%} keeps up", first_hint(
            "this machine was too busy to keep up even so: run the check again on a quieter moment, or add a worker.",
            (run.workers == 0 and not run.batched, f"with no workers the main process reads each batch ({BATCH} "
             f"requests, about {PER_BATCH * 1e3:.0f} ms) while the step waits: nothing overlaps. Start workers, so "
             "batches are read during the step, or read each batch in one request."),
            (run.workers == 0, "a batch in one request is quick, but with no workers it is still read while the step "
             "waits; one worker would read it during the step."),
            (not run.batched, f"{run.workers} worker{'s' if run.workers > 1 else ''}, each reading a batch in about "
             f"{PER_BATCH * 1e3:.0f} ms, deliver one every ~{PER_BATCH / max(run.workers, 1) * 1e3:.0f} ms; the step "
             f"takes {STEP_S * 1e3:.0f} ms. Add workers until that is shorter than the step, or read each batch in "
             "one request.")))
    checks.passed += 1
