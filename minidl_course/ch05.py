"""Notebook 05's harnesses: the timeline drawn with a legend in words, the num_workers sweep, the bottleneck study.

Each measures and decides here, so that the notebook's cell makes one call and prints what comes back.
Verdicts are returned as ``(holds, claim, measured)`` for ``minidl_bench.expect`` to print: a notebook says
whether a run shows a claim, it never asserts a timing. The transforms come in as arguments (they live in
``minidl_bench.kernels``, which this package does not import).
"""

from __future__ import annotations

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
from minidl_course.labelled import LabelledImages, transform_collate
from minidl_course.train import Trainer

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


# --- section 8: is the loader the bottleneck? ---------------------------------------------------------------


@dataclass
class Study:
    """One traced epoch per transform (and the Python one again out of order), and the step timed alone."""

    step_alone: float
    diagnoses: dict = field(default_factory=dict)  # run name -> minidl's Diagnosis
    images: dict = field(default_factory=dict)  # run name -> images in the epoch
    notes: list[str] = field(default_factory=list)  # what the runs add up to, in sentences
    verdicts: list[Verdict] = field(default_factory=list)

    def report(self) -> str:
        lines = [f"the training step alone, no loader running: {self.step_alone * 1e3:.1f} ms (median of 20)"]
        for name, d in self.diagnoses.items():
            lines += ["", f"--- {self.images[name]} images, transform in {name}", str(d)]
        return "\n".join(lines + [""] + self.notes)


def _time_step(seed: int, transform: Callable) -> float:
    """The training step on one batch of 32, median of 20, with no worker running beside it."""
    trainer = Trainer(channels=3, classes=10, seed=seed)
    images = LabelledImages(32, seed=seed)
    batch = transform_collate([images[i] for i in range(32)], transform=transform)
    trainer.step(batch)  # the warm-up step
    times = []
    for _ in range(20):
        start = time.perf_counter()
        trainer.step(batch)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def bottleneck_study(python: Callable, vectorised: Callable, workers: int, vectorised_images: int,
                     seed: int = 0) -> Study:
    """Train one epoch with ``workers`` worker processes, the transform in the worker, and diagnose each.

    Runs: ``python`` (a pure-Python transform) over four batches of 32 per worker, the same out of order, and
    ``vectorised`` (its NumPy twin) over ``vectorised_images``. The notes say whether following the
    diagnosis's advice about the reorder buffer paid, and why, from the trace.
    """
    study = Study(_time_step(seed, vectorised))
    runs = {"pure Python": (python, 32 * 4 * workers, True),
            "pure Python, in_order=False": (python, 32 * 4 * workers, False),
            "NumPy": (vectorised, vectorised_images, True)}
    traces = {}
    for name, (transform, n_images, in_order) in runs.items():
        dataset = LabelledImages(n_images, seed=seed)
        collate_fn = partial(transform_collate, transform=transform)
        loader = minidl.DataLoader(dataset, batch_size=32, num_workers=workers, in_order=in_order, trace=True,
                                   collate_fn=collate_fn)
        trainer = Trainer(channels=3, classes=10, seed=seed)
        trainer.step(collate_fn([dataset[i] for i in range(32)]))  # the warm-up step, before the traced epoch
        for batch in loader:
            trainer.step(batch)
        traces[name], study.diagnoses[name], study.images[name] = loader.trace, loader.trace.diagnose(), n_images
    py, unordered, vec = (study.diagnoses[k] for k in runs)
    alone = study.step_alone
    study.notes.append(f"the step inside the epochs: {py.consumer_step * 1e3:.1f} ms beside the pure-Python workers, "
                       f"{vec.consumer_step * 1e3:.1f} ms beside the NumPy ones, {alone * 1e3:.1f} ms alone")
    study.verdicts.append((py.batch_time > alone > vec.batch_time,
                           "the Python transform loads a batch slower than a step, the NumPy one faster",
                           f"{py.batch_time / alone:.1f} and {vec.batch_time / alone:.1f} steps per batch"))
    study.verdicts.append((vec.wait_share < py.wait_share / 2, "with NumPy the training loop waits far less",
                           f"{vec.wait_share:.0%} vs {py.wait_share:.0%} of the time waiting"))
    study.notes.append(_reorder_note(py, unordered, traces["pure Python"]))
    if hasattr(os, "getloadavg"):  # not on Windows
        load = os.getloadavg()[0]
        study.notes.append(f"load average over the last minute: {load:.1f} on {workers} worker(s)' cores"
                           + (": other jobs were competing for the cores" if load > workers else ""))
    return study


def _reorder_note(ordered: Any, unordered: Any, trace: Any) -> str:
    """Whether the advice ``in_order=False`` paid: it can win at most the time lost to the reorder buffer."""
    lost, gained = ordered.reorder_lost, ordered.wall - unordered.wall
    head = (f"in order the epoch took {ordered.wall:.2f} s, {lost * 1e3:.0f} ms of it waiting while a later batch "
            f"was ready; out of order {unordered.wall:.2f} s: ")
    if not any(a.startswith("in_order=False") for a in ordered.advice):
        return head + "in_order=False was not advised (the reordering cost was under a fifth of the waiting)"
    loads: dict = {}  # batch -> seconds its worker spent fetching and collating it
    for row in trace.rows():
        if row["event"] in ("fetch", "collate"):
            loads[row["batch"]] = loads.get(row["batch"], 0.0) + row["end"] - row["start"]
    slowest, typical = max(loads.values()), float(np.median(list(loads.values())))
    paid = (f"the advice paid ({gained * 1e3:.0f} ms sooner)" if gained > lost / 2 else
            f"the advice did not pay ({abs(gained) * 1e3:.0f} ms {'sooner' if gained >= 0 else 'later'})")
    why = ("one batch held the others back" if slowest > 2 * typical else
           "the batches cost about the same, so out of order the loop waits as long, for another batch")
    return head + f"{paid}; the slowest batch took x{slowest / typical:.1f} the median one: {why}"
