"""Checker for ch05_keep_up: make ``DataLoader(records, batch_size=16)`` keep up with a step, on the checker's clock."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from minidl.dataloader import DataLoader
from minidl.dataset import Dataset
from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, _short, _torch, call, first_difference, first_hint

N, BATCH = 384, 16  # 24 batches an epoch
REQUEST_S, RECORD_S = 0.003, 0.0001  # what one read costs, however many records it asks for; and each record
STEP_S = 0.030  # the training step
MAX_WAIT = 0.25  # the most of a typical batch's loop (wait + step) the step may spend waiting for data
BATCHES, PER_BATCH = N // BATCH, BATCH * (REQUEST_S + RECORD_S)  # PER_BATCH: a batch read a record at a time


class Records(Dataset):
    """``n`` records ``(image, label)``, a ``(3, 8, 8)`` uint8 array and an int, in slow storage. ``reads`` counts
    this process's requests: ``records[i]`` is one, so is ``records[[i, j, ...]]``, the batch ``(images, labels)``."""
    def __init__(self, n: int = N, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self._images = rng.integers(0, 256, size=(n, 3, 8, 8), dtype=np.uint8)  # "on disk": read by __getitem__
        self._labels = rng.integers(0, 10, size=n).astype(np.int64)
        self.reads = 0

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, index: Any) -> Any:
        many = isinstance(index, list | tuple | np.ndarray)
        rows = [int(i) for i in (index if many else [index])]
        self.reads += 1
        time.sleep(REQUEST_S + RECORD_S * len(rows))
        images, labels = self._images[rows], self._labels[rows]
        return (images, labels) if many else (images[0], int(labels[0]))


def train_step(batch: Any, seconds: float = STEP_S) -> None:
    """The stand-in training step: ``seconds`` with the CPU free, as while an accelerator computes."""
    time.sleep(seconds)


def given_loader(records: Records) -> DataLoader:
    """The loader that falls behind: one record per request, in the main process."""
    return DataLoader(records, batch_size=BATCH)


class Run(NamedTuple):
    """One epoch on the checker's clock: each batch's wait and step, and how the loader reads."""
    waits: list[float]
    steps: list[float]
    workers: int
    batched: bool  # a whole batch per request (a sampler of index lists, or a dataset with __getitems__)

    @property
    def skipped(self) -> int:
        return min(max(1, self.workers), len(self.waits))

    @property
    def wait_share(self) -> float:  # a median (one stall isn't the pace), each worker's first batch (its start) skipped
        shares = [w / (w + s) for w, s in zip(self.waits[self.skipped:], self.steps[self.skipped:]) if w + s > 0]
        return statistics.median(shares) if shares else 0.0

    def __str__(self) -> str:
        counted, how = len(self.waits) - self.skipped, f"{self.workers} worker{'s' * (self.workers != 1)}"
        return (f"{how if self.workers else 'no workers'}, a {'batch' if self.batched else 'record'} per request: the "
                f"step waited {self.wait_share:.0%} of the time for a typical batch (median; a mean "
                f"{sum(self.waits[self.skipped:]) / max(counted, 1) * 1e3:.1f} ms a batch beside a {STEP_S * 1e3:.0f} "
                f"ms step), over the {counted} batches after the first {self.skipped} (start-up: "
                f"{sum(self.waits[:self.skipped]):.2f} s)")


def run_epoch(loader: Any) -> tuple[Run, list[Any]]:
    """``loader``'s batches, ``train_step`` after each, timed; one batch past an epoch shows a loader that runs on."""
    waits, steps, batches = [], [], []
    start, iterator = time.perf_counter(), iter(loader)
    for batch in itertools.islice(iterator, BATCHES + 1):
        got = time.perf_counter()
        waits.append(got - start)
        batches.append(batch)
        train_step(batch)
        start = time.perf_counter()
        steps.append(start - got)
    del iterator  # its workers end here, not at the next collection
    batched = hasattr(getattr(loader, "dataset", None), "__getitems__") or (  # a sampler= of index lists, fetched
        getattr(loader, "batch_sampler", 1) is None and getattr(loader, "batch_size", 1) is None)  # in one request
    return Run(waits, steps, int(getattr(loader, "num_workers", 0) or 0), batched), batches


def wait_share(make_loader: Callable[[Records], Any], seed: int = 0) -> Run:
    """Try a ``make_loader``: one epoch of its loader feeding ``train_step``, the measurement printed and returned."""
    run, _ = run_epoch(make_loader(Records(seed=seed)))
    print(run)
    return run


def check_keep_up(make_loader: Callable[[Records], Any], seed: int = 7) -> None:
    """Check ch05_keep_up: ``DataLoader(records, batch_size=16)``'s batches, the step waiting at most ``MAX_WAIT``."""
    case = f"make_loader(Records(seed={seed})), {N} records in batches of {BATCH}, a {STEP_S * 1e3:.0f} ms step"
    checks = _Checks(make_loader)

    def explain(e: Exception) -> None:  # a ValueError from the loader's arguments, named
        hint = first_hint(
            "", ("prefetch_factor" in str(e) or "persistent_workers" in str(e), "prefetch_factor and "
                 "persistent_workers need workers: with num_workers=0 there are none. Start workers, or drop them."),
            ("batch_size" in str(e) and "sampler" in str(e), "a BatchSampler goes in as sampler= with batch_size=None "
             "(as batch_sampler= it makes the loader ask for one record at a time)."))
        if isinstance(e, ValueError) and hint:
            checks.fail(case, f"the loader raised ValueError: {e}", hint)
    def measure() -> Run:
        checks.passed = 0  # a second measurement counts its checks afresh
        records = Records(seed=seed)
        loader = call(make_loader, records, what="make_loader", case=case, explain=explain)
        check_loader(loader, records, checks, case)
        run, batches = call(run_epoch, loader, what="loader", case=case, explain=explain)
        check_batches(batches, records, checks, case)
        return run
    run = harness.twice(measure, lambda r: r.wait_share <= MAX_WAIT)
    print(f"Measured on my clock, {run}")
    judge(run, checks, case)
    checks.done()


def check_loader(loader: Any, records: Records, checks: _Checks, case: str) -> None:
    """``loader`` is a DataLoader over ``records`` that has read nothing yet."""
    if not isinstance(loader, DataLoader | _torch().utils.data.DataLoader):
        checks.fail(case, f"make_loader should return a DataLoader (minidl's or torch's), but it returned "
                          f"{_short(loader)}", first_hint(
            "return the loader itself, e.g. return DataLoader(records, batch_size=16, ...): the checker runs it.",
            (isinstance(loader, int | float), "the checker never takes a number from you: return the DataLoader."),
            (isinstance(loader, list | tuple), "a list of batches read before the loop starts reads the whole epoch "
             "first: return a DataLoader, which reads as the loop runs.")))
    dataset = loader.dataset
    checks.first(case, (records.reads, f"make_loader made {records.reads} reads before the loop began", "build the "
                        "loader and read nothing yet: reading ahead isn't keeping up (a real epoch doesn't fit in "
                        "memory)."),
                 (dataset is not records and not any(v is records for v in getattr(dataset, "__dict__", {}).values()),
                  f"the loader reads from {_short(dataset)}, not the records make_loader was given",
                  "build the loader over make_loader's argument, records."))
    checks.passed += 1


def check_batches(batches: list, records: Records, checks: _Checks, case: str) -> None:
    """The batches are ``DataLoader(records, batch_size=16)``'s: their form first, then their number, then values."""
    torch = _torch()
    everything = torch.from_numpy(records._images)
    batches = [list(b) if isinstance(b, tuple) else b for b in batches]
    want = [list(pair) for pair in zip(everything.split(BATCH), torch.from_numpy(records._labels).split(BATCH))]
    images = [b[0] if isinstance(b, list) and len(b) == 2 and all(isinstance(x, torch.Tensor) for x in b) else None
              for b in batches]  # a batch that is [images, labels] at all, else None
    misshapen = [k for k, got in enumerate(batches[:BATCHES]) if images[k] is None
                 or any(g.dtype != w.dtype or g.shape != w.shape for g, w in zip(got, want[k]))]
    more = len(batches) > BATCHES
    checks.first(case, (len(batches) != BATCHES and not misshapen, f"the loader gave {'more than ' if more else ''}"
                        f"{BATCHES if more else len(batches)} batches; an epoch of {N} records in batches of {BATCH} "
                        f"is {BATCHES}", "one epoch, every record once: a sampler that repeats or runs on is a "
                        "different epoch." if more else "every record once, in order: a sampler over part of the "
                        "records, or drop_last with another batch size, skips some."))
    for k in misshapen[:1] or range(len(batches)):
        if problem := first_difference(want[k], batches[k], f"batch {k}"):
            shape = () if images[k] is None else tuple(images[k].shape)
            some_record = shape == (BATCH, 3, 8, 8) and bool((everything == images[k][0]).all(dim=(1, 2, 3)).any())
            checks.fail(case, problem, first_hint(
                f"each batch is [images, labels]: a ({BATCH}, 3, 8, 8) uint8 tensor and ({BATCH},) int64 labels, as "
                f"DataLoader(records, batch_size={BATCH}) gives; a collate_fn of your own must give the same.",
                (len(shape) == 5 and shape[1] == BATCH, "the loader batched your batches: with a BatchSampler as "
                 "sampler=, pass batch_size=None."),
                (len(shape) == 4 and shape[0] != BATCH, f"keep batches of {BATCH}: smaller ones make a different "
                 "training run, not a faster loader."),
                (some_record, "those are records, but not the right ones: the batches come in order (no shuffle, "
                 f"in_order left True), records 0-{BATCH - 1}, then {BATCH}-{2 * BATCH - 1}, ...")))
    checks.passed += 1


def judge(run: Run, checks: _Checks, case: str = "your loader") -> None:
    """The verdict on the wait, from the checker's measurement alone."""
    if run.wait_share > MAX_WAIT:
        checks.fail(case, f"the step waited for data {run.wait_share:.0%} of the time for a typical batch; at most "
                          f"{MAX_WAIT:.0%} keeps up", first_hint(
            "this machine was too busy to keep up even so: run the check again on a quieter moment, or add a worker.",
            (run.workers == 0 and not run.batched, f"with no workers the main process reads each batch ({BATCH} "
             f"requests, about {PER_BATCH * 1e3:.0f} ms) while the step waits: nothing overlaps. Start workers, or "
             "read each batch in one request."),
            (run.workers == 0, "a batch in one request is quick, but with no workers it is still read while the step "
             "waits; one worker would read it during the step."),
            (not run.batched, f"{run.workers} worker{'s' * (run.workers > 1)}, each reading a batch in about "
             f"{PER_BATCH * 1e3:.0f} ms, deliver one every ~{PER_BATCH / max(run.workers, 1) * 1e3:.0f} ms; the step "
             f"takes {STEP_S * 1e3:.0f} ms. Add workers until that is shorter than the step, or read each "
             "batch in one request.")))
    checks.passed += 1
