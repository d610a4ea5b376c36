"""Notebook 05's harnesses: the timeline with a legend in words, the num_workers sweep, loading under the step, photos.

Each measures and decides here, so that the notebook's cell makes one call and prints what comes back.
Verdicts are returned as ``(holds, claim, measured)`` for ``minidl_bench.expect`` to print: a notebook says
whether a run shows a claim, it never asserts a timing. The transforms come in as arguments (they live in
``minidl_bench.kernels``, which this package does not import).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

import minidl
from minidl_course.cores import core_count

Verdict = tuple[bool, str, str]

# What each event of minidl's trace is, in words, for a legend (minidl/trace.py names them for code).
LEGEND = {"getitem": "one sample (__getitem__)", "fetch": "a worker fetching a batch", "collate": "collating",
          "pickle": "pickling the batch for the trip", "reorder": "batch sat in the reorder buffer",
          "reorder_block": "waiting while a later batch was ready", "pin": "pinning",
          "wait": "main process waiting in next()", "consumer": "training step"}


def plot_trace(trace: Any, ax: Any, title: str, caption: str | None = None) -> Any:
    """``trace.plot`` with the legend in words and the reorder-buffer spans drawn thin, on top of the waits.

    A batch sits in the reorder buffer while the main process waits for an earlier one, so both spans share
    the main lane; drawn as tall as the wait bars and under them, the buffer spans could not be seen.
    """
    trace.plot(ax=ax, title=title, caption=caption)
    # Without workers the main process fetches and collates inside its own wait in next(): those bars lie
    # under the wait's, so they go, and with them their legend entries (nothing listed that cannot be seen).
    waits = [p.get_extents() for c in ax.collections if c.get_label() == "wait" for p in c.get_paths()]
    for collection in list(ax.collections):
        if collection.get_label() in ("fetch", "collate") and all(
                any(w.y0 == b.y0 and w.x0 <= b.x0 + 1e-6 and b.x1 <= w.x1 + 1e-6 for w in waits)
                for b in (p.get_extents() for p in collection.get_paths())):
            collection.remove()
    for collection in list(ax.collections):
        if collection.get_label() == "reorder":
            spans = [(p.get_extents().x0, p.get_extents().width, p.get_extents().y0, p.get_extents().height)
                     for p in collection.get_paths()]
            colour = collection.get_facecolor()[0]
            collection.remove()
            for x, width, y, height in spans:  # a thin strip along the top of the lane
                ax.broken_barh([(x, width)], (y + 0.78 * height, 0.22 * height), color=colour, label="reorder",
                               zorder=4)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), [LEGEND.get(label, label) for label in unique], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return ax


def workers_needed_uncapped(diagnosis: Any) -> int:
    """A batch's load time over the training step, rounded up: the diagnosis's figure before its cap.

    The diagnosis caps ``workers_needed`` at the epoch's batch count: an epoch of n batches keeps at most n
    workers busy.
    """
    if diagnosis.consumer_step <= 0:
        return diagnosis.workers_needed
    return max(1, math.ceil(diagnosis.batch_time / diagnosis.consumer_step))


def matching_lines(ours: Callable, theirs: Callable, steps: dict[str, tuple[str, str]]) -> str:
    """Side by side, for each step, the first line of ``ours``'s source and of ``theirs``'s holding its marker.

    ``steps``: a step in words -> (a marker in minidl's source, a marker in torch's). A marker found nowhere
    prints as "(none)", so a renamed line shows rather than vanishing.
    """
    import inspect

    def first(fn: Callable, marker: str) -> str:
        found = next((line for line in inspect.getsource(fn).splitlines() if marker in line), "(none)")
        return found.split("  # ")[0].strip()  # the code, not its comment

    width = max(len(step) for step in steps)
    lines = []
    for step, (mine, torch_marker) in steps.items():
        lines.append(f"{step:{width}}  minidl: {first(ours, mine)}")
        lines.append(f"{'':{width}}  torch:  {first(theirs, torch_marker)}")
    return "\n".join(lines)


# --- section 7: throughput against num_workers ------------------------------------------------------------


@dataclass
class Sweep:
    """Epoch times for every (task, num_workers, worker_method), and what they add up to."""

    workers: tuple[int, ...]
    n_samples: int
    cores: int
    seconds: dict = field(default_factory=dict)  # key -> seconds of each timed round
    speedup: dict = field(default_factory=dict)  # "task, processes|threads" -> speed-up per workers count
    pool_speedup: float = 0.0  # the CPU-bound work in a plain Pool of one process per core, over a plain loop
    verdicts: list[Verdict] = field(default_factory=list)

    def table(self) -> str:
        """Samples per second: the fastest round, and in brackets the median."""
        lines = [f"num_workers swept on this machine's {self.cores} core(s): {self.workers}"]
        for key in self.speedup:
            task, label = key.split(", ")
            method = "multiprocessing" if label == "processes" else "thread"
            row = [(task, 0, "multiprocessing")] + [(task, w, method) for w in self.workers[1:]]
            lines.append(f"{task} {label:9s} " + "  ".join(
                f"{k[1]} workers: {self.n_samples / min(self.seconds[k]):4.0f}/s "
                f"({self.n_samples / np.median(self.seconds[k]):4.0f})" for k in row))
        lines.append(f"CPU-bound work in a plain Pool of {self.cores} processes: x{self.pool_speedup:.2f} over a "
                     "plain loop")
        return "\n".join(lines)

    def findings(self) -> list[str]:
        """What the threads did, in this run's numbers (no judgement: the notebook's text says what to expect)."""
        most = self.workers[-1]
        return [f"CPU-bound, threads: best x{max(self.speedup['CPU-bound, threads']):.2f} over the main process",
                f"I/O-bound, {most} threads: x{self.speedup['I/O-bound, threads'][-1]:.2f} over the main process, "
                f"on {self.cores} core{'s' * (self.cores > 1)}"]

    def beyond_cores(self) -> str:
        """CPU-bound processes: one per core against the most swept, in this machine's numbers."""
        line = self.speedup["CPU-bound, processes"]
        per_core = line[self.workers.index(self.cores)] if self.cores in self.workers else float("nan")
        most = line[-1]
        return (f"CPU-bound, processes: {self.cores} workers x{per_core:.2f}, {self.workers[-1]} workers x{most:.2f} "
                f"(a plain Pool of {self.cores}: x{self.pool_speedup:.2f}); {self.workers[-1]} processes were "
                + (f"faster than {self.cores}, by x{most / per_core:.2f}: they filled gaps a worker per core left"
                   if most > 1.05 * per_core else f"no faster than {self.cores}: the cores were already as busy as "
                   "this machine let them be"))


def epoch(task: dict, num_workers: int, worker_method: str = "multiprocessing", batch_size: int = 4) -> list:
    """One epoch of ``minidl.DataLoader(**task)``: the batches, in order."""
    with warnings.catch_warnings():  # more workers than cores is deliberate here
        warnings.simplefilter("ignore", UserWarning)
        return list(minidl.DataLoader(**task, batch_size=batch_size, num_workers=num_workers,
                                      worker_method=worker_method if num_workers else "multiprocessing"))


def sweep(tasks: dict[str, dict], workers: tuple[int, ...], plain: tuple[Callable, list], repeats: int,
          warm_up: bool, cores: int, batch_size: int = 4, gil: bool = True) -> Sweep:
    """Time an epoch of each task for each num_workers, with processes and threads, in interleaved rounds.

    ``tasks``: name ("CPU-bound", "I/O-bound") -> DataLoader keyword arguments. ``plain``: the CPU-bound
    transform and its inputs, also timed in a plain loop and in a plain Pool of ``cores`` processes: how much
    of its cores this machine gives right now. Interleaving the rounds makes a burst of load from elsewhere
    hit every setting alike; each speed-up takes the fastest round (other jobs only ever slow a run down).
    """
    transform, items = plain
    runs = {(task, 0, "multiprocessing"): partial(epoch, tasks[task], 0, batch_size=batch_size) for task in tasks}
    runs.update({(task, w, method): partial(epoch, tasks[task], w, method, batch_size)
                 for task in tasks for method in ("multiprocessing", "thread") for w in workers[1:]})
    with multiprocessing.Pool(cores) as pool:  # started once, outside the timing
        runs["plain loop"] = lambda: [transform(item) for item in items]
        runs["plain Pool"] = lambda: pool.map(transform, items, chunksize=batch_size)
        if warm_up:  # one-off costs (imports, caches) are not what we measure
            for run in runs.values():
                run()
        seconds = {name: [] for name in runs}
        for _ in range(repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - start)
    result = Sweep(tuple(workers), len(items), cores, seconds)
    for task in tasks:
        base = min(seconds[task, 0, "multiprocessing"])
        for method, label in (("multiprocessing", "processes"), ("thread", "threads")):
            row = [(task, 0, "multiprocessing")] + [(task, w, method) for w in workers[1:]]
            result.speedup[f"{task}, {label}"] = [base / min(seconds[k]) for k in row]
    result.pool_speedup = min(seconds["plain loop"]) / min(seconds["plain Pool"])
    if gil:  # threads of pure Python: one core's worth at most
        best = max(result.speedup["CPU-bound, threads"])
        result.verdicts.append((best < 1.8, "threads of pure Python give one core's worth at most",
                                f"best x{best:.2f}"))
    most = result.speedup["I/O-bound, threads"][-1]
    result.verdicts.append((most > 0.75 * workers[-1], f"{workers[-1]} sleeping threads come within three quarters "
                            f"of x{workers[-1]}, past the {cores} core(s)", f"x{most:.2f}"))
    return result


# --- section 8: loading under the training step -------------------------------------------------------------


def stand_in_step(seconds: float) -> None:
    """A training step as the CPU sees one on an accelerator: it waits, holding no GIL (``time.sleep``)."""
    time.sleep(seconds)


@dataclass
class Overlap:
    """The fastest epoch for each (num_workers, step or none), and the traces of the epochs with the step."""

    step_s: float  # the stand-in step, per batch
    load_s: float  # what loading one batch sleeps (batch size x the per-sample delay)
    batches: int
    seconds: dict = field(default_factory=dict)  # (num_workers, with_step) -> fastest epoch, s
    traces: dict = field(default_factory=dict)  # num_workers -> minidl Trace of the fastest epoch with the step

    def ideal(self, workers: int, with_step: bool) -> float:
        """The epoch if nothing but loading and the step cost anything: in turn without workers, overlapped with.

        With workers, the first batch's load has no step to hide under, and the last step no load: whichever of
        loading and stepping is the slower sets the pace in between.
        """
        step = self.step_s if with_step else 0.0
        if workers == 0:
            return self.batches * (self.load_s + step)
        loading = math.ceil(self.batches / workers) * self.load_s  # every worker loads its share, one batch at a time
        return max(self.load_s + self.batches * step, loading + step)

    def table(self) -> str:
        lines = [f"{self.batches} batches; loading a batch sleeps {self.load_s * 1e3:.0f} ms, the step "
                 f"{self.step_s * 1e3:.0f} ms (fastest epoch, workers already started; ideal in brackets)"]
        for with_step in (False, True):
            lines.append(f"  {'with the step' if with_step else 'no step':14}" + "".join(
                f"  {w} worker{'s' if w != 1 else ' '}: {self.seconds[w, with_step] * 1e3:4.0f} ms "
                f"({self.ideal(w, with_step) * 1e3:4.0f})" for w in sorted({w for w, _ in self.seconds})))
        return "\n".join(lines)

    def verdict(self) -> str:
        """What one worker did with the step and without it, in this run's numbers."""
        def ratio(with_step: bool) -> float:
            return self.seconds[0, with_step] / self.seconds[1, with_step]

        on, off = ratio(True), ratio(False)
        with_words = ("loading ran under the step" if on > 1.15 else "no overlap showed (a busy machine can hide it)")
        without = ("nothing to hide under, so a worker only adds a round trip per batch" if off < 1.1 else
                   "faster even so")
        return (f"With the step, 1 worker took x{1 / on:.2f} the time of none: {with_words}. Without it, "
                f"x{1 / off:.2f}: {without}.")

    def plot(self, caption: str | None = None) -> Any:
        """One timeline per num_workers, all with the step, on one time axis."""
        import matplotlib.pyplot as plt

        counts = sorted(self.traces)
        fig, axes = plt.subplots(len(counts), 1, figsize=(11, 2.3 * len(counts)), sharex=True)
        for ax, workers in zip(axes, counts):
            plot_trace(self.traces[workers], ax, title=f"num_workers={workers}, with a {self.step_s * 1e3:.0f} ms step",
                       caption=caption if workers == counts[0] else None)
        fig.tight_layout()
        plt.close(fig)
        return fig


def overlap_study(workers: tuple[int, ...] = (0, 1, 2), samples: int = 32, batch_size: int = 4,
                  delay: float = 0.005, step_s: float = 0.02, repeats: int = 3) -> Overlap:
    """Epochs over ``toy.SlowDataset`` (``delay`` s a sample) with and without a ``step_s`` stand-in step.

    Workers are persistent and started by one untimed epoch, so what is timed is the steady epoch, not the
    start (section 9 times that). Rounds alternate step and no step, so load from elsewhere hits both alike.
    """
    from minidl_course.toy import SlowDataset

    if 0 not in workers or 1 not in workers:
        raise ValueError(f"workers should include 0 and 1 (the verdict compares them), got {workers}")
    result = Overlap(step_s, batch_size * delay, -(-samples // batch_size))
    for count in workers:
        loader = minidl.DataLoader(SlowDataset(samples, delay=delay), batch_size=batch_size, num_workers=count,
                                   persistent_workers=count > 0, trace=True)
        for _ in loader:  # the untimed epoch: starts the workers, warms everything up
            pass
        best: dict = {}
        for _ in range(repeats):
            for with_step in (False, True):
                loader.trace.clear()
                start = time.perf_counter()
                for _batch in loader:
                    if with_step:
                        stand_in_step(step_s)
                took = time.perf_counter() - start
                if took < best.get(with_step, (math.inf,))[0]:
                    # Persistent workers keep one iterator, whose first "consumer" span of an epoch reaches back to
                    # the last batch of the epoch before: only what started in this epoch is kept.
                    best[with_step] = (took, [e for e in loader.trace.raw if e[3] >= start])
        for with_step, (took, _events) in best.items():
            result.seconds[count, with_step] = took
        result.traces[count] = dataclasses.replace(loader.trace, raw=best[True][1])
        del loader  # persistent workers stop with their loader
    return result


# --- section 9: real photographs, and what starting workers costs -------------------------------------------


@dataclass
class PhotoStudy:
    """One epoch of decoded, augmented photographs per num_workers, each timed from a fresh start."""

    files: int
    size: int
    costs: dict = field(default_factory=dict)  # num_workers -> minidl_course.startup.StartupCost
    batch: Any = None  # (uint8 images, labels): the first batch of the last loader

    def report(self) -> str:
        lines = [f"{self.files} JPEGs decoded with Pillow, cropped to {self.size}x{self.size} and flipped at random, "
                 "per num_workers:"]
        lines += [f"  {w} worker{'s' if w != 1 else ' '}: {cost}" for w, cost in self.costs.items()]
        return "\n".join(lines)

    def verdict(self) -> str:
        """Whether workers paid over the whole epoch, and whether start-up or the batches took the time."""
        base = self.costs[0]
        most = max(self.costs)
        cost = self.costs[most]
        steady = base.per_batch_s / cost.per_batch_s
        epoch_base = base.first_batch_s + base.steady_s
        epoch_most = cost.first_batch_s + cost.steady_s
        blame = ("start-up took longer than all the batches after it, so starting the workers is what cost the time"
                 if cost.dominant == "start-up" else "the batches took longer than the start")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # not on Windows
        busy = (f" (load average {load:.1f} on {core_count()} cores: other jobs held the cores the workers needed)"
                if steady < 1.15 and load is not None and load >= core_count() else "")
        return (f"{most} workers ({cost.start_method}) made each steady batch x{steady:.2f} as fast as none{busy}, "
                f"and the epoch {epoch_base:.2f} s -> {epoch_most:.2f} s; {blame}.")


def photo_study(workers: tuple[int, ...], per_class: int, size: int, batch_size: int, seed: int = 0) -> PhotoStudy:
    """Time one epoch of ``photos.Photos`` through ``train_transform`` for each ``workers`` count, from a fresh start.

    Samples are collated by ``minidl.prefetch.fast_collate`` (uint8, as timm does); normalising comes later.
    """
    import torch

    from minidl.prefetch import fast_collate
    from minidl_course import photos
    from minidl_course.startup import startup_cost

    if 0 not in workers:
        raise ValueError(f"workers should include 0 (the baseline), got {workers}")
    dataset = photos.Photos(photos.photo_folder(per_class=per_class, seed=seed),
                            transform=photos.train_transform(size))

    def make(count: int) -> Any:
        return minidl.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=count,
                                 collate_fn=fast_collate, generator=torch.Generator().manual_seed(seed))

    study = PhotoStudy(len(dataset), size)
    for count in workers:
        study.costs[count] = startup_cost(partial(make, count))
    study.batch = next(iter(make(0)))
    return study


# --- section 10: a CPU training step and the workers share the cores ------------------------------------------


@dataclass
class CoreShare:
    """Epochs of photos decoded by torch's DataLoader under a real CPU step, per (num_workers, step threads)."""

    cores: int
    batches: int
    load_s: float  # making one batch in the main process, no step
    step_s: dict = field(default_factory=dict)  # step threads -> seconds per step on a batch already made
    seconds: dict = field(default_factory=dict)  # (num_workers, step threads) -> fastest epoch, s

    def table(self) -> str:
        workers = sorted({w for w, _ in self.seconds})
        lines = [f"{self.batches} batches; one batch takes {self.load_s * 1e3:.0f} ms to load in the main process; "
                 "a step takes " + ", ".join(f"{s * 1e3:.0f} ms on {t} thread{'s' * (t > 1)}"
                                             for t, s in self.step_s.items()) + " (fastest epoch, workers started)"]
        for threads in self.step_s:
            lines.append(f"  step on {threads} thread{'s' * (threads > 1)}:" + "".join(
                f"  {w} worker{'s' if w != 1 else ' '} {self.seconds[w, threads] * 1e3:5.0f} ms" for w in workers))
        return "\n".join(lines)

    def finding(self) -> str:
        """Which setting was fastest, and what workers did at each step-thread count, in words."""
        best = min(self.seconds, key=self.seconds.get)
        most = max(w for w, _ in self.seconds)
        lines = [f"fastest: {best[0]} workers with the step on {best[1]} thread{'s' * (best[1] > 1)}, "
                 f"{self.seconds[best] * 1e3:.0f} ms"]
        for threads in self.step_s:
            gain = self.seconds[0, threads] / self.seconds[most, threads]
            what = ("loading ran under the step" if gain >= 1.1 else
                    "no clear gain (within 10%): the workers and the step wanted the same cores" if gain > 1 / 1.1 else
                    "slower with workers: they and the step fought for the cores, or other jobs slowed those epochs")
            lines.append(f"step on {threads} thread{'s' * (threads > 1)}: {most} workers x{gain:.2f} over none: {what}")
        return "\n".join(lines)


def core_share_study(workers: tuple[int, ...], threads: tuple[int, ...], per_class: int, limit: int, size: int,
                     batch_size: int, repeats: int = 3, seed: int = 0) -> CoreShare:
    """Epochs of ``photos.Photos`` (Pillow decode and timm-style augmentation, ``size`` pixels) through torch's
    DataLoader, each batch fed to ``train.Trainer.step`` on ``torch.set_num_threads(t)`` threads, for every
    ``num_workers`` in ``workers`` and ``t`` in ``threads``. Workers are persistent and started by an untimed
    epoch (section 9 times starting them); torch runs each worker's own ops on one thread. The main process's
    thread count is restored afterwards.
    """
    import torch
    import torch.utils.data as tud

    from minidl.prefetch import fast_collate
    from minidl_course import photos
    from minidl_course.train import Trainer

    if 0 not in workers:
        raise ValueError(f"workers should include 0 (the baseline), got {workers}")
    dataset = photos.Photos(photos.photo_folder(per_class=per_class, seed=seed),
                            transform=photos.train_transform(size), limit=limit)
    before = torch.get_num_threads()
    trainer = Trainer(channels=3, classes=len(dataset.classes), seed=seed)
    made = fast_collate([dataset[i] for i in range(batch_size)])
    start = time.perf_counter()
    fast_collate([dataset[i] for i in range(batch_size)])
    result = CoreShare(core_count(), -(-len(dataset) // batch_size), time.perf_counter() - start)
    try:
        for t in threads:
            torch.set_num_threads(t)
            trainer.step(made)  # warm-up
            result.step_s[t] = min(_timed(trainer.step, made) for _ in range(3))
        for count in workers:
            loader = tud.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=count,
                                    collate_fn=fast_collate, persistent_workers=count > 0,
                                    generator=torch.Generator().manual_seed(seed))
            for _ in loader:  # the untimed epoch: starts the workers
                pass
            for _ in range(repeats):  # rounds alternate the thread counts, so load elsewhere hits them alike
                for t in threads:
                    torch.set_num_threads(t)
                    start = time.perf_counter()
                    for batch in loader:
                        trainer.step(batch)
                    took = time.perf_counter() - start
                    result.seconds[count, t] = min(took, result.seconds.get((count, t), math.inf))
            del loader  # persistent workers stop with their loader
    finally:
        torch.set_num_threads(before)
    return result


def _timed(fn: Callable, *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start
