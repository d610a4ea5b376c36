"""The ``loaders`` suite: minidl's DataLoader against ``torch.utils.data.DataLoader`` at equal settings.

Three backends (torch; minidl with process workers; minidl with thread workers) load the four workloads
of ``minidl_bench.workloads`` (``python``, ``numpy``, ``images``, ``io``) with ``num_workers`` 0, 1, 2
and 4, batch size 32, shuffled by the same seeded generator. Before anything is timed, each workload's
first batches from every backend are checked to equal torch's. One *epoch* (``iter()`` until
StopIteration, worker start and shutdown included, as a loop without ``persistent_workers`` pays them)
gives:

* samples/s over the epoch, and the time to the first batch;
* CPU utilisation: process + children CPU time / wall time / cores;
* peak memory of the main process plus its workers, sampled by a background thread every 0.2 s: USS
  summed (pages each process alone maps) and PSS summed (shared pages split between the processes that
  map them). USS misses what forked workers share with the main process copy-on-write, which is most of
  it, so PSS is the one that compares processes with threads.

Compared backends run in *rounds*, one epoch each, in rotating order: a round to warm up, then the
timed ones, so a neighbour's load on a shared machine hits them alike. CSV rows (the harness's columns):
task ``<workload>`` is the epoch (``size`` samples; speedup against torch with no workers) and
``<workload> first batch`` the time to the first batch; memory and CPU go in ``note``, and each metric's
median, min and max in the extra file ``loaders_metrics.csv``, and every round's raw figures in
``loaders_rounds.csv`` (so the per-round ratios can be paired again from the files alone).
"""

from __future__ import annotations

import contextlib
import csv
import math
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from minidl_bench import workloads
from minidl_bench.batches import check_first_batches, first_batches, same_batch  # noqa: F401 (notebook 10 uses them)
from minidl_bench.harness import Session, Timing, median_ci, missing
from minidl_bench.machine import core_count, machine_info, worker_sweep
from minidl_course import photos
from minidl_course.rounds import rotating

REQUIRES = ("torch", "psutil", "PIL", "skimage")  # skimage: its installed files are the photographs
BACKENDS = ("torch", "minidl process", "minidl thread")
BATCH_SIZE = 32
CHECK_BATCHES = 2  # batches compared across backends before timing
SEED = 0
MIB = 2**20
T = TypeVar("T")


@dataclass(frozen=True)
class Sizes:
    """Samples per epoch for each workload, and their knobs; FULL takes about ten minutes on 2 cores.

    FULL times 11 rounds: enough for an interval of at least 95% (98.8%) around the median per-round ratio
    (``median_ci``).
    """

    python: int
    python_side: int  # pixels per side: ~2 ms of pure Python per sample at 32
    numpy: int
    numpy_images: int  # distinct images held in memory (samples reuse them round-robin)
    images: int
    image_files_per_class: int  # JPEGs cut from each of photos.SOURCES's photographs (see photos.photo_folder)
    io: int
    io_latency: float
    repeats: int
    # 0, then up to past this machine's core count (worker_sweep: 0-4 on 2 cores, 0-12 on 8): oversubscription shows
    workers: tuple[int, ...] = field(default_factory=worker_sweep)
    # Reading a process's USS walks its page tables under its mmap lock (~1 ms each), which stalls
    # process workers mapping shared memory: every 0.05 s slowed them ~10% here, every 0.2 s 1-2%.
    memory_interval: float = 0.2


FULL = Sizes(python=640, python_side=32, numpy=8192, numpy_images=4096, images=576, image_files_per_class=64,
             io=384, io_latency=0.004, repeats=11)
QUICK = Sizes(python=64, python_side=12, numpy=256, numpy_images=256, images=64, image_files_per_class=8,
              io=64, io_latency=0.001, repeats=3,
              workers=(0, 2), memory_interval=0.02)  # epochs of ~0.1 s: sample often, speed matters not


def make_workloads(sizes: Sizes) -> dict[str, Any]:
    """The four datasets, by name (the photo folder is cut on first use and cached)."""
    root = photos.photo_folder(sizes.image_files_per_class)
    return {
        "python": workloads.PythonWorkload(sizes.python, side=sizes.python_side),
        "numpy": workloads.NumpyWorkload(sizes.numpy, pool=sizes.numpy_images),
        "images": workloads.ImageFolderWorkload(root, limit=sizes.images),
        "io": workloads.IoWorkload(sizes.io, latency=sizes.io_latency),
    }


# --- one loader, one epoch ------------------------------------------------------------------------

def make_loader(backend: str, dataset: Any, num_workers: int, *, batch_size: int = BATCH_SIZE, seed: int = SEED,
                **kwargs: Any) -> Iterable:
    """A shuffling DataLoader of ``backend`` ("torch", "minidl process" or "minidl thread"), seeded alike."""
    import torch
    import torch.utils.data

    import minidl

    generator = torch.Generator().manual_seed(seed)  # the same shuffle for every backend
    common = {"batch_size": batch_size, "shuffle": True, "num_workers": num_workers, "generator": generator}
    if backend == "torch":
        return torch.utils.data.DataLoader(dataset, **common, **kwargs)
    method = "thread" if backend == "minidl thread" else "multiprocessing"
    return minidl.DataLoader(dataset, **common, worker_method=method, **kwargs)


class PeakMemory:
    """Peak memory of this process and its children, sampled every ``interval`` s by a background thread.

    Sums USS (pages a process alone owns: what it would give back by exiting) and PSS (each shared page
    split between the processes that map it, so the sum is the group's share of physical memory).
    """

    def __init__(self, interval: float = FULL.memory_interval) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self.interval = interval
        self.uss = self.pss = 0  # peaks, in bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench_memory_sampler", daemon=True)

    def sample(self) -> None:
        """Add up USS and PSS over this process and its live children; keep the peaks."""
        uss = pss = 0
        for p in [self._me, *self._me.children(recursive=True)]:
            try:
                info = p.memory_full_info()
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                continue  # a worker that exited between listing and reading
            # psutil gives PSS on Linux only: elsewhere (a Mac) the peak PSS is NaN, "not measured", never 0
            uss, pss = uss + info.uss, pss + getattr(info, "pss", math.nan)
        self.uss = max(self.uss, uss)
        self.pss = math.nan if math.isnan(pss) else max(self.pss, pss)  # max(nan, x) keeps the nan

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> PeakMemory:
        self.sample()  # the first sample before the caller starts its clock, so it can't delay the start
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()  # the state at the end counts too (a short epoch may fit between two samples)


@dataclass(frozen=True)
class Epoch:
    """What one pass over a loader measured."""

    seconds: float  # iter() until StopIteration: worker start and shutdown included
    first_batch: float  # iter() until the first batch is in hand
    samples: int
    uss: int  # peak summed USS, bytes
    pss: int  # peak summed PSS, bytes
    cpu: float  # CPU seconds of this process and its (exited) workers


def _cpu_seconds() -> float:
    """CPU time of this process and its children, in µs steps (os.times() counts 10 ms clock ticks)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    # Children count once joined (waited for), which every loader does to its workers at the end of an epoch.
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def run_epoch(loader: Iterable, memory: float | None = FULL.memory_interval) -> Epoch:
    """Consume one epoch of ``loader``, timing it, and sampling its peak memory every ``memory`` s (None: not)."""
    sampler = PeakMemory(memory) if memory else None
    with sampler or contextlib.nullcontext():
        cpu = _cpu_seconds()
        start = time.perf_counter()
        it = iter(loader)
        batch = next(it)
        first = time.perf_counter() - start
        samples = len(batch[-1])
        for batch in it:
            samples += len(batch[-1])  # every workload's sample ends with its label
        seconds = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu
    uss, pss = (sampler.uss, sampler.pss) if sampler else (0, 0)
    return Epoch(seconds, first, samples, uss, pss, cpu)


def run_rounds(loaders: Mapping[str, Callable[[], Iterable]], repeats: int,
               measure: Callable[[Iterable], T] = run_epoch,
               progress: Callable[[Any], None] | None = None) -> dict[str, list[T]]:
    """One warm-up round, then ``repeats`` timed rounds; a round runs ``measure`` on a fresh loader of each kind.

    The kinds take turns in rotating order, so compared loaders run side by side in time. Each list
    starts with the warm-up. ``progress``, if given, is called with each kind's key after each measurement
    (``Session.progress`` makes one that moves the progress bar).
    """
    results: dict[str, list[T]] = {name: [] for name in loaders}
    for _round, name in rotating(list(loaders), repeats):
        results[name].append(measure(loaders[name]()))
        if progress is not None:
            progress(name)
    return results


def timing(values: Sequence[float]) -> Timing:
    """A Timing from a warm-up value followed by the timed ones, as ``harness.time_it`` makes it."""
    first, timed = values[0], values[1:]
    return Timing(statistics.median(timed), min(timed), max(timed), len(timed), first)


# --- checking the batches ---------------------------------------------------------------------------

def check_backends(name: str, dataset: Any, num_workers: int = 2, **kwargs: Any) -> None:
    """Raise unless every backend's first batches equal torch's (``num_workers`` workers, ``kwargs`` as given)."""
    loaders = {b: partial(make_loader, b, dataset, num_workers, **kwargs) for b in BACKENDS[1:]}
    check_first_batches(name, partial(make_loader, "torch", dataset, num_workers, **kwargs), loaders, CHECK_BATCHES,
                        "torch")


# --- the suite ------------------------------------------------------------------------------------

Key = tuple[str, str, int]  # (workload, backend, num_workers); minidl with 0 workers is backend "minidl"


def backends_for(num_workers: int) -> tuple[str, ...]:
    """With no workers, minidl's worker_method plays no part: one "minidl" row stands for both."""
    return ("torch", "minidl") if num_workers == 0 else BACKENDS


def run(session: Session) -> None:
    """Check, then time every workload x backend x num_workers; print ratios; save CSVs and plots."""
    import warnings

    sizes = QUICK if session.quick else FULL
    session.log(f"[loaders] preparing workloads (the photo folder is cut once, into {photos.cache_dir()})")
    datasets = make_workloads(sizes)
    results: dict[Key, list[Epoch]] = {}
    session.plan(len(datasets) * sum(len(backends_for(w)) for w in sizes.workers) * (sizes.repeats + 1))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers on 2 cores
        for name, dataset in datasets.items():
            check_backends(name, dataset)
            session.log(f"[loaders] {name}: the first {CHECK_BATCHES} batches of every backend equal torch's")
            for w in sizes.workers:
                loaders = {b: partial(make_loader, b, dataset, w) for b in backends_for(w)}
                epoch = partial(run_epoch, memory=sizes.memory_interval)
                progress = session.progress(f"{name}, {w} workers:")
                for backend, epochs in run_rounds(loaders, sizes.repeats, epoch, progress).items():
                    results[name, backend, w] = epochs
                    record_epochs(session, name, backend, w, epochs, baseline=backend == "torch" and w == 0)
                line = ", ".join(f"{b} {_throughput(results[name, b, w]):.0f}/s" for b in backends_for(w))
                session.log(f"[loaders] {name}, {w} workers: {line}")
    write_metrics(results, session.out / "loaders_metrics.csv")
    write_rows(session.out / "loaders_rounds.csv", [
        {"workload": name, "method": backend, "workers": w, "round": r, "seconds": e.seconds, "samples": e.samples,
         "first_batch_s": e.first_batch, "cpu_s": e.cpu}
        for (name, backend, w), epochs in results.items() for r, e in enumerate(epochs)])
    session.log(ratio_tables(results, core_count()))
    if missing("matplotlib"):
        session.skip("plots", "matplotlib not installed")
        return
    for name, fig in figures(read_rows(session.out / "loaders_metrics.csv")).items():
        session.savefig(fig, name)


def _throughput(epochs: Sequence[Epoch]) -> float:
    return statistics.median(e.samples / e.seconds for e in epochs[1:])


def _cpu_util(e: Epoch) -> float:
    return e.cpu / e.seconds / core_count()


def record_epochs(session: Session, name: str, backend: str, w: int, epochs: list[Epoch], *, baseline: bool,
                  extra: str = "") -> None:
    """Two harness rows for one setting's epochs (the first is the warm-up): the epoch, and its first batch.

    The epoch row's note carries samples/s, peak memory and CPU use (plus ``extra``); the ``threads`` suite
    shares this with ``loaders``.
    """
    timed = epochs[1:]
    rate = [e.samples / e.seconds for e in timed]
    note = (f"samples/s {statistics.median(rate):.4g} (min {min(rate):.4g}, max {max(rate):.4g}); "
            f"peak PSS {statistics.median(e.pss for e in timed) / MIB:.0f} MiB, "
            f"USS {statistics.median(e.uss for e in timed) / MIB:.0f} MiB; "
            f"CPU {statistics.median(map(_cpu_util, timed)):.0%} of {core_count()} cores{extra}")
    size = epochs[0].samples
    session.record(name, backend, timing([e.seconds for e in epochs]), size=size, workers=w, baseline=baseline,
                   note=note)
    session.record(f"{name} first batch", backend, timing([e.first_batch for e in epochs]), size=size, workers=w,
                   note=f"batch size {BATCH_SIZE}: worker start plus one batch's work")


METRIC_COLUMNS = ("samples_per_s", "first_batch_s", "peak_uss_mib", "peak_pss_mib", "cpu_util")


def _metrics(e: Epoch) -> dict[str, float]:
    return {"samples_per_s": e.samples / e.seconds, "first_batch_s": e.first_batch, "peak_uss_mib": e.uss / MIB,
            "peak_pss_mib": e.pss / MIB, "cpu_util": _cpu_util(e)}


def write_metrics(results: Mapping[Key, list[Epoch]], path: Path) -> Path:
    """Every metric's median, min and max over the timed epochs, one row per workload x backend x workers."""
    rows = []
    for (name, backend, w), epochs in results.items():
        timed = [_metrics(e) for e in epochs[1:]]
        row: dict[str, Any] = {"workload": name, "samples": epochs[0].samples, "method": backend, "workers": w,
                               "repeats": len(timed)}
        for m in METRIC_COLUMNS:
            values = [t[m] for t in timed]
            row |= {f"{m}_median": statistics.median(values), f"{m}_min": min(values), f"{m}_max": max(values)}
        rows.append(row)
    return write_rows(path, rows)


def write_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """``rows`` (dicts with the same keys) as a CSV, floats to 6 significant figures, the machine on every row.

    The suites' extra files use it: ``*_metrics.csv`` and the raw per-round figures (``*_rounds.csv``, round
    0 the warm-up), where rounds that ran side by side share a round number, so a reader can pair them
    again, as the ratio tables do (``paired_ratio``), without the suite's run.
    """
    machine = machine_info()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*(rows[0] if rows else ()), *machine])
        writer.writeheader()
        for row in rows:
            writer.writerow({**{k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()}, **machine})
    return path


# --- ratios, the headline -------------------------------------------------------------------------

def _median(results: Mapping[Key, list[Epoch]], key: Key, metric: str) -> float:
    return statistics.median(_metrics(e)[metric] for e in results[key][1:])


def _as_minidl(backend: str, w: int) -> str:
    return "minidl" if w == 0 and backend != "torch" else backend


def ratio_tables(results: Mapping[Key, list[Epoch]], cores: int) -> str:
    """The goals, as ratios of metrics measured side by side in this run, as printable tables.

    minidl against torch is the median of per-round ratios (the two epochs ran one after the other),
    with a confidence interval of at least 95% for that median in brackets (``paired_ratio``): on a shared machine
    one round's ratio swings by 10-20%, so a 5% goal is judged by the interval, not by one figure.
    """
    names = list(dict.fromkeys(k[0] for k in results))
    counts = sorted({k[2] for k in results})  # the num_workers measured, 0 first
    some = counts[1:]

    def med(name: str, backend: str, w: int, metric: str) -> float:
        return _median(results, (name, _as_minidl(backend, w), w), metric)

    def ratio(name: str, top: str, bottom: str, w: int, metric: str) -> float:
        return med(name, top, w, metric) / med(name, bottom, w, metric)

    def paired(name: str, top: str, w: int, per_sample: Callable[[Epoch], float]) -> str:
        pairs = zip(results[name, _as_minidl(top, w), w][1:], results[name, "torch", w][1:])
        return paired_ratio([per_sample(a) / per_sample(b) for a, b in pairs])

    def rate(e: Epoch) -> float:
        return e.samples / e.seconds

    def cpu_cost(e: Epoch) -> float:
        return e.cpu / e.samples

    out = [
        text_table(f"throughput, minidl processes / torch, median of per-round ratios {CI} (goal >= 0.95)",
                   ["workload", *map(_w, counts)], [[n, *(paired(n, "minidl process", w, rate) for w in counts)]
                                                    for n in names]),
        text_table(f"CPU time per sample, minidl processes / torch, median of per-round ratios {CI}",
                   ["workload", *map(_w, counts)], [[n, *(paired(n, "minidl process", w, cpu_cost) for w in counts)]
                                                    for n in names]),
        text_table(f"throughput, minidl threads / torch, median of per-round ratios {CI} (no goal: the GIL decides)",
                   ["workload", *map(_w, some)], [[n, *(paired(n, "minidl thread", w, rate) for w in some)]
                                                  for n in names]),
        text_table("time to first batch, process workers / thread workers (goal: threads >= 5x sooner)",
                   ["workload", *map(_w, some)],
                   [[n, *(f"{ratio(n, 'minidl process', 'minidl thread', w, 'first_batch_s'):.1f}x" for w in some)]
                    for n in names]),
    ]
    for what, metric in (("PSS", "peak_pss_mib"), ("USS", "peak_uss_mib")):
        rows = [[n, *(f"{med(n, 'minidl thread', w, metric):.0f}/{med(n, 'minidl process', w, metric):.0f}"
                      f" = {ratio(n, 'minidl thread', 'minidl process', w, metric):.2f}" for w in some)]
                for n in names]
        out.append(text_table(f"peak {what} of main + workers, threads / processes, MiB (goal < 1 on in-memory data)",
                              ["workload", *map(_w, some)], rows))
    rows = [[n, b, *(f"{med(n, b, w, 'samples_per_s') / med(n, b, 0, 'samples_per_s') / min(w, cores):.2f}"
                     for w in some)] for n in names for b in BACKENDS]
    out.append(text_table(f"efficiency: speedup over 0 workers / min(workers, {cores} cores) (1.00 = the limit)",
                          ["workload", "backend", *map(_w, some)], rows))
    return "\n\n".join(out)


CI = "[CI of the median, coverage >= 95% (98.8% at 11 rounds); min-max below 6 rounds]"


def paired_ratio(ratios: Sequence[float]) -> str:
    """``median [low-high]``: per-round ratios' median and its confidence interval, >= 95% (``harness.median_ci``)."""
    low, high, _ = median_ci(ratios)
    return f"{statistics.median(ratios):.2f} [{low:.2f}-{high:.2f}]"


def _w(w: int) -> str:
    return f"{w} workers" if w != 1 else "1 worker"


def text_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A titled, aligned text table, for the ratios a suite prints."""
    lines = [list(header), *map(list, rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    body = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    return "\n".join([f"-- {title}", *body])


# --- plots ----------------------------------------------------------------------------------------

def figures(metrics: Sequence[Mapping[str, str]], caption: str | None = None) -> dict[str, Any]:
    """Filename -> figure, from the rows of ``loaders_metrics.csv`` (the run and ``minidl_bench.replot`` alike).

    Throughput per workload against num_workers, time to the first batch, and peak PSS.
    """
    from minidl_bench import plot

    keyed = {(r["workload"], r["method"], int(r["workers"])): r for r in metrics}
    names = list(dict.fromkeys(k[0] for k in keyed))
    counts = sorted({k[2] for k in keyed})
    cores = int(metrics[0]["cores"])

    def med(name: str, backend: str, w: int, metric: str) -> float:
        return float(keyed[name, _as_minidl(backend, w), w][f"{metric}_median"])

    figs: dict[str, Any] = {}
    for name in names:
        series = {b: [med(name, b, w, "samples_per_s") for w in counts] for b in BACKENDS}
        base = series["torch"][0]
        hlines = {"torch, no workers": base}
        if name != "io":  # waiting needs no core: only the CPU-bound workloads hit the core limit
            hlines[f"{cores} cores x torch, no workers: the limit"] = base * cores
        samples = keyed[name, "torch", 0]["samples"]
        fig = plot.line_plot(counts, series, hlines=hlines, xlabel="num_workers", caption=caption,
                             ylabel="samples/s (median of epochs)",
                             title=f"{name} workload: {samples} samples per epoch, batch size {BATCH_SIZE}")
        fig.axes[0].set_xticks(counts)
        figs[f"loaders_throughput_{name}.png"] = fig

    w = max([c for c in counts if 0 < c <= cores] or counts[1:2])  # as many workers as cores, where measured
    firsts = {}
    for name in names:
        for b in BACKENDS:
            r = keyed[name, b, w]
            firsts[f"{name} · {b}"] = Timing(*(float(r[f"first_batch_s_{m}"]) for m in ("median", "min", "max")),
                                            int(r["repeats"]), float(r["first_batch_s_median"]))
    figs["loaders_first_batch.png"] = plot.bar_times(
        firsts, what="time to first batch", caption=caption, groups={k: k.split(" · ")[1] for k in firsts},
        title=f"Time to the first batch with {w} workers (worker start + one batch)")

    # PSS, not USS: a forked worker shares the main process's pages, which USS then counts nowhere.
    series = {f"{name} · {b}": [med(name, b, c, "peak_pss_mib") for c in counts]
              for name in ("numpy", "images") if name in names for b in BACKENDS}
    fig = plot.line_plot(counts, series, xlabel="num_workers", ylabel="peak PSS, main + workers (MiB)", caption=caption,
                         title="Peak memory of the loading processes (PSS summed; USS in loaders_metrics.csv)")
    fig.axes[0].set_xticks(counts)
    figs["loaders_memory.png"] = fig
    return figs


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of one CSV, as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
