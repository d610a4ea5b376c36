"""Chapter 09's photograph race: no workers, thread workers and process workers decoding and augmenting real JPEGs.

Pillow decodes a JPEG and resizes an image in C with the GIL released, so thread workers may keep up with
process workers here where they cannot on a pure-Python loop. ``race`` times fresh loaders in rotating rounds
with ``startup.startup_cost`` (start method, first batch, steady pace); ``verdicts`` turns the medians into
sentences chosen from the numbers. Everything a worker runs lives here or in ``photos``, at module top level.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import minidl
from minidl.prefetch import fast_collate
from minidl_course import photos
from minidl_course.startup import ScriptStart, StartupCost, startup_cost

KINDS = ("no workers", "thread workers", "process workers")


@dataclass(frozen=True)
class Sizes:
    """How much notebook 09 measures: the full sizes, or the course's test run's (``MINIDL_QUICK=1``)."""

    python_batches_per_core: int  # the python workload's epoch, in batches per worker
    python_side: int  # its images' side: 3 x side x side pixels a sample
    python_rounds: int  # rounds of the four loaders, after a warm-up round
    photo_files: int  # photographs per class in the folder
    photo_batches_per_worker: int
    photo_batch: int
    photo_size: int  # the crop's side
    photo_rounds: int
    start_workers: int | None  # workers of the start-method script (None: one per core)
    start_epochs: int


def sizes() -> Sizes:
    """The full sizes, or smaller ones when ``MINIDL_QUICK`` is set (not ``0``), as the course's test run sets it."""
    if os.environ.get("MINIDL_QUICK", "") not in ("", "0"):
        return Sizes(2, 12, 3, 2, 2, 4, 96, 2, start_workers=1, start_epochs=2)
    return Sizes(4, 32, 7, 32, 6, 16, 224, 4, start_workers=None, start_epochs=2)


class PhotoEpoch(minidl.Dataset):
    """``n`` samples cycling over the JPEGs of ``root``: decoded by Pillow, cropped and flipped as timm does, uint8 CHW.

    Cycling lets an epoch hold as many batches as a machine's core count asks for, whatever the folder holds.
    """

    def __init__(self, root: str | Path, n: int, size: int = 224) -> None:
        if n < 1:
            raise ValueError(f"n should be a positive integer, got {n}")
        self.photos = photos.Photos(root, transform=photos.train_transform(size))
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> photos.Sample:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        return self.photos[index % len(self.photos)]


def make_loader(kind: str, dataset: PhotoEpoch, workers: int, batch_size: int) -> minidl.DataLoader:
    """A loader of ``kind`` (one of ``KINDS``), uint8 batches from ``fast_collate`` as timm's loader makes them."""
    if kind not in KINDS:
        raise ValueError(f"kind should be one of {KINDS}, got {kind!r}")
    method = "thread" if kind == "thread workers" else "multiprocessing"
    return minidl.DataLoader(dataset, batch_size=batch_size, num_workers=0 if kind == "no workers" else workers,
                             worker_method=method, collate_fn=fast_collate)


def race(dataset: PhotoEpoch, workers: int, batch_size: int, rounds: int) -> dict[str, list[StartupCost]]:
    """One warm-up round, then ``rounds`` rounds, each kind on a fresh loader in rotating order (warm-up dropped)."""
    makers: Mapping[str, Callable[[], Iterable]] = {
        kind: partial(make_loader, kind, dataset, workers, batch_size) for kind in KINDS}
    results: dict[str, list[StartupCost]] = {kind: [] for kind in KINDS}
    for r in range(rounds + 1):
        for kind in KINDS[r % 3:] + KINDS[:r % 3]:  # rotating: a neighbour's load falls on every kind alike
            cost = startup_cost(makers[kind])
            if r:
                results[kind].append(cost)
    return results


def medians(results: Mapping[str, list[StartupCost]]) -> dict[str, StartupCost]:
    """Each kind's median first batch, steady pace and one-batch time, as one ``StartupCost``."""
    return {kind: StartupCost(costs[0].start_method, statistics.median(c.first_batch_s for c in costs),
                              statistics.median(c.per_batch_s for c in costs), costs[0].batches,
                              statistics.median(c.batch_s for c in costs))
            for kind, costs in results.items()}


def epoch_s(cost: StartupCost) -> float:
    """The epoch, shutdown aside: the first batch, then the rest at the steady pace."""
    return cost.first_batch_s + cost.steady_s


def table(results: Mapping[str, list[StartupCost]]) -> str:
    """One line per kind: how it starts, its first batch, its steady pace and epoch, against no workers."""
    med = medians(results)
    base = med["no workers"]
    lines = []
    for kind, m in med.items():
        lines.append(f"{kind:16s} {m.start_method:12s} first batch {m.first_batch_s * 1e3:6.0f} ms, then "
                     f"{m.per_batch_s * 1e3:5.1f} ms a batch (x{base.per_batch_s / m.per_batch_s:.2f}); "
                     f"epoch {epoch_s(m):.2f} s (x{epoch_s(base) / epoch_s(m):.2f})")
    return "\n".join(lines)


def verdicts(results: Mapping[str, list[StartupCost]], workers: int, load: float | None = None,
             cores: int | None = None) -> list[str]:
    """Sentences chosen from the medians: do threads keep pace with processes, and what the processes' start costs.

    ``load`` and ``cores`` (the load average and the core count, if given) are named only when no kind of
    worker beat no workers and the load left no core free.
    """
    med = medians(results)
    base, threads, procs = med["no workers"], med["thread workers"], med["process workers"]
    pace = {k: base.per_batch_s / med[k].per_batch_s for k in KINDS}  # steady speedup over no workers
    whole = {k: epoch_s(base) / epoch_s(med[k]) for k in KINDS}
    t, p, w = pace["thread workers"], pace["process workers"], whole["process workers"]
    out = []
    if t <= 1.1 and p <= 1.1:  # within a tenth of no workers: a busy machine's noise, not a gain
        busy = load is not None and cores is not None and load >= cores
        why = f"; the load average ({load:.1f} on {cores} cores) left no core free." if busy else "."
        out.append(f"Once running, neither {workers} thread nor {workers} process workers beat no workers by a tenth "
                   f"(x{t:.2f} and x{p:.2f}): this run cannot tell whether decoding frees the GIL" + why)
    elif t >= 0.9 * p:
        out.append(f"Once running, {workers} thread workers keep pace with {workers} process workers (x{t:.2f} "
                   f"against x{p:.2f}): while one thread is inside Pillow's decoder or resize, "
                   "the GIL is free for the others.")
    else:
        out.append(f"Once running, {workers} thread workers fall behind {workers} process workers (x{t:.2f} "
                   f"against x{p:.2f}): the Python around Pillow's calls holds the GIL, and the "
                   "threads take turns on it there.")
    startup = procs.startup_s
    if procs.dominant == "start-up" or p > 1 >= w or w < p * 0.9:  # the start took the epoch below its pace
        out.append(f"Start-up ({procs.start_method}): the process workers' first batch came after "
                   f"{procs.first_batch_s:.2f} s, {startup:.2f} s more than making one batch takes here, against "
                   f"{procs.steady_s:.2f} s for the other {procs.batches - 1} batches; over the epoch they make "
                   f"x{w:.2f}, not the x{p:.2f} of their steady pace.")
    else:
        out.append(f"Start-up ({procs.start_method}) cost the process workers {startup:.2f} s, under the "
                   f"{procs.steady_s:.2f} s of their other batches: the epoch (x{w:.2f}) "
                   f"stays near their steady pace (x{p:.2f}).")
    out.append(f"The threads' first batch: {threads.first_batch_s * 1e3:.0f} ms, the processes' "
               f"{procs.first_batch_s * 1e3:.0f} ms.")
    beyond = [f"{k} x{pace[k]:.2f}" for k in ("thread workers", "process workers") if pace[k] > workers]
    if beyond:  # more than the workers can multiply: not a gain to credit to either kind
        out.append(f"{' and '.join(beyond)}: above x{workers}, more than {workers} workers can multiply the work. "
                   f"The part above x{workers} is the rounds' noise or the baseline's own cost (without workers the "
                   "main process also does the loop's per-batch bookkeeping, which workers overlap), not a "
                   "win of one kind of worker over the other.")
    return out


def sample_split(dataset: PhotoEpoch, samples: int = 16) -> dict[str, float]:
    """Seconds per sample, in this thread, for each step: read and decode, crop and resize, flip, to a uint8 array."""
    crop, flip, to_array = dataset.photos.transform.transforms
    spent = dict.fromkeys(("decode", "crop + resize", "flip", "to array"), 0.0)
    rng = random.Random(0)
    dataset.photos[0]  # warm-up: the first call pays for imports and Pillow's first-use set-up
    for i in range(samples):
        t0 = time.perf_counter()
        image, _ = dataset.photos.load(i % len(dataset.photos))
        t1 = time.perf_counter()
        image = crop(image, rng)
        t2 = time.perf_counter()
        image = flip(image, rng)
        t3 = time.perf_counter()
        to_array(image)
        t4 = time.perf_counter()
        for step, s in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            spent[step] += s
    return {step: s / samples for step, s in spent.items()}


# --- What each start method costs, from a script that imports torch at the top -------------------------


def rerun_finding(run: ScriptStart, epochs: int) -> str:
    """Who ran the script's top level again under ``run.method`` (``persistent=False``, ``epochs`` epochs), in words."""
    if run.top_runs == 0:
        return "no other process ran the script's imports: each worker is a copy of the script's process"
    per = f"{statistics.median(run.rerun_import_s):.2f} s of `import torch` each"
    if run.top_runs == run.workers * epochs:
        return f"every worker of every epoch ran the script's imports again ({run.top_runs} processes, {per})"
    if run.top_runs == 1:
        return (f"one process ran the script's imports ({per}): the server, once; "
                "its workers are copies of it")
    return f"{run.top_runs} other processes ran the script's imports ({per})"
