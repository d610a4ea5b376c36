"""The ``pipeline`` suite: four ways to make one real loading pipeline faster, measured inside the loader.

The pipeline is ``minidl_course.png_pipeline``: decompress a small PNG-filtered image, undo the filter, then a
random crop, flip and gain and normalise (notebook 11 explains it). Every group of loaders runs in rotating
rounds, one epoch each (``loaders.run_rounds``: a warm-up round, then the timed ones), after its batches are
checked against the pure-Python loop's. An epoch is ``iter()`` until StopIteration, worker start and shutdown
included. Tasks (the CSV's ``task``; ``size`` is samples per epoch unless said otherwise):

* ``pool, <variant>``: ``multiprocessing.Pool(n).imap`` over batches of indices against minidl's process
  workers at n = 1 and 2, and the serial loop (the baseline), for the ``loop`` and ``numpy`` variants;
* ``vectorise``: the ``loop``, ``numpy`` (per sample), ``batch`` (after collate) and ``numba`` variants with
  0, 1 and 2 process workers; baseline: the loop with none;
* ``numba in workers``: 2 process workers whose Numba kernel compiles in each worker (no cache), loads from
  the disk cache in each (``cache=True``), or was compiled in the parent before the fork; NumPy per sample
  beside them is the baseline;
* ``numba per process`` (size 1): a fresh interpreter's ``import`` of Numba and the pipeline, its first call
  without and with ``cache=True``, and a warm call (``first_s`` is meaningless there: each is one figure);
* ``threads, nogil`` and ``threads, gil`` (``size`` = image side): the ``nogil=True`` kernel and the same
  kernel holding the GIL, serial against 2 thread workers.

Each epoch row's time is the median of the rounds; ``<task> first batch`` rows hold the time to the first
batch. Every round's raw figures go to ``pipeline_rounds.csv`` (rounds that ran side by side share a round
number), so notebook 11 can pair them again.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import minidl
from minidl_bench import batches
from minidl_bench.batches import check_first_batches
from minidl_bench.harness import Session, Timing, missing
from minidl_bench.loaders import CI, Epoch, paired_ratio, run_epoch, run_rounds, text_table, timing, write_rows
from minidl_bench.machine import core_count, describe
from minidl_course import png_pipeline as pipeline

REQUIRES = ("numba",)
BATCH_SIZE = 32
SEED = 0
WORKERS = (0, 1, 2)
NUMBA_METHODS = ("numpy per sample", "numba, compile in each worker", "numba cache=True, load in each worker",
                 "numba, compiled in the parent")
PROCESS_STEPS = ("import numba + pipeline", "first call, compile", "first call, cache=True", "warm call")


@dataclass(frozen=True)
class Sizes:
    """Samples per epoch for each group; FULL takes about three minutes on 2 cores, QUICK about 20 seconds."""

    side: int  # crop side of the images every group but the threads one loads
    loop: int  # samples in an epoch of the pure-Python loop (the slow one)
    numpy: int  # samples in the pool group's numpy epoch
    vectorise: int  # samples in the vectorise group's epochs, every variant
    numba: int
    threads: Mapping[int, int]  # image side -> samples, for the thread workers
    repeats: int  # timed rounds after the warm-up round
    thread_repeats: int  # the same for the threads group, whose short epochs swing most on a busy machine
    process_repeats: int  # fresh interpreters per step of "numba per process"
    workers: tuple[int, ...] = WORKERS  # the numbers of workers the pool and vectorise groups compare
    # Check each process-worker loader's batches before timing it. Off only for notebook 11's quick live run,
    # where every check is one more worker start; the suite's own runs (and its tests) check every loader.
    check: bool = True


FULL = Sizes(side=32, loop=192, numpy=2048, vectorise=256, numba=1024, threads={32: 2048, 64: 768, 128: 384},
             repeats=5, thread_repeats=11, process_repeats=3)
QUICK = Sizes(side=16, loop=64, numpy=128, vectorise=64, numba=64, threads={16: 128, 48: 64}, repeats=3,
              thread_repeats=3, process_repeats=3)
# Notebook 11's live runs (``measure``): every group in a minute or two on 2 cores, or a few seconds.
LIVE = Sizes(side=32, loop=128, numpy=1024, vectorise=192, numba=512, threads={32: 1024, 64: 384, 128: 192},
             repeats=5, thread_repeats=7, process_repeats=2)
LIVE_QUICK = Sizes(side=16, loop=16, numpy=64, vectorise=16, numba=32, threads={16: 64, 48: 32}, repeats=1,
                   thread_repeats=1, process_repeats=1, workers=(0, 2), check=False)  # few worker starts

Key = tuple[str, str, int]  # (task, method, workers)


# --- loaders --------------------------------------------------------------------------------------

def epoch_order(n: int, seed: int = SEED) -> list[int]:
    """One shuffled epoch's indices, the same for every loader compared."""
    return np.random.default_rng(seed).permutation(n).tolist()


def make_loader(method: str, dataset: Any, workers: int, order: Sequence[int]) -> Iterable:
    """"serial", "pool imap", "minidl process" or "minidl thread" over ``order`` in batches of BATCH_SIZE."""
    collate_fn = pipeline.collate_fn_for(dataset)
    if method == "serial":
        return pipeline.serial_loader(dataset, pipeline.batches_of(order, BATCH_SIZE))
    if method == "pool imap":
        return pipeline.pool_loader(dataset, pipeline.batches_of(order, BATCH_SIZE), workers)
    worker_method = "thread" if method == "minidl thread" else "multiprocessing"
    return minidl.DataLoader(dataset, batch_size=BATCH_SIZE, sampler=order, num_workers=workers,
                             collate_fn=collate_fn, worker_method=worker_method if workers else "multiprocessing")


CHECK_BATCHES = 3  # batches compared with the pure-Python loop's before a loader is timed


def same_batches(a: Sequence, b: Sequence) -> bool:
    """Whether two lists of (images, labels) batches are equal: shapes, dtypes and every value (list or tuple)."""
    return batches.same_batches(a, b, exact_containers=False)


def check(loaders: Mapping[Any, Callable[[], Iterable]], reference: Iterable, what: str) -> None:
    """Raise unless every loader's first batches equal ``reference``'s: a wrong answer is never timed.

    The reference is the pure-Python loop (NumPy per sample for the big images of the threads group, whose
    equality with the loop ``tests/test_png_pipeline.py`` checks).
    """
    check_first_batches(f"[pipeline] {what}", lambda: reference, loaders, CHECK_BATCHES, exact_containers=False)


# --- the suite ------------------------------------------------------------------------------------

def run(session: Session) -> None:
    """Check and time each group; print the ratios; save the CSVs and the plots."""
    sizes = QUICK if session.quick else FULL
    rounds = sizes.repeats + 1  # a warm-up round, then the timed ones
    session.plan(rounds * (2 * (1 + 2 * 2) + 4 * len(WORKERS) + len(NUMBA_METHODS))
                 + (sizes.thread_repeats + 1) * 4 * len(sizes.threads) + (sizes.process_repeats + 1) * 2)
    session.log(f"[pipeline] {describe()}; load average before: {os.getloadavg()[0]:.2f}")
    results: dict[Key, list[Epoch]] = {}
    with warnings.catch_warnings():  # Python 3.12+ warns about forking while the progress bar's thread runs
        warnings.filterwarnings("ignore", message=r"This process \(pid=\d+\) is multi-threaded")
        _pool_group(session, sizes, results)
        _vectorise_group(session, sizes, results)
        _numba_group(session, sizes, results)
        process = _numba_per_process(session, sizes)
        _threads_group(session, sizes, results)
    session.log(f"[pipeline] load average after: {os.getloadavg()[0]:.2f}")
    write_rows(session.out / "pipeline_rounds.csv", [
        {"task": task, "method": method, "workers": workers, "round": r, "seconds": e.seconds,
         "first_batch_s": e.first_batch, "samples": e.samples, "cpu_s": e.cpu}
        for (task, method, workers), epochs in results.items() for r, e in enumerate(epochs)])
    session.log(ratio_tables(results))
    if missing("matplotlib"):
        session.skip("plots", "matplotlib not installed")
        return
    _plots(session, results, process)


def _group(session: Session, task: str, loaders: Mapping[tuple[str, int], Callable[[], Iterable]], repeats: int,
           results: dict[Key, list[Epoch]], baseline: tuple[str, int], size: int) -> None:
    """Time ``loaders`` in rotating rounds; record an epoch row and a first-batch row for each."""
    epoch = partial(run_epoch, memory=None)
    for (method, workers), epochs in run_rounds(loaders, repeats, epoch, session.progress(task)).items():
        results[task, method, workers] = epochs
        rate = [e.samples / e.seconds for e in epochs[1:]]
        session.record(task, method, timing([e.seconds for e in epochs]), size=size, workers=workers,
                       baseline=(method, workers) == baseline,
                       note=f"samples/s {statistics.median(rate):.4g} (min {min(rate):.4g}, max {max(rate):.4g})")
        session.record(f"{task} first batch", method, timing([e.first_batch for e in epochs]), size=size,
                       workers=workers, note=f"batch size {BATCH_SIZE}: worker start plus one batch")


def _pool_group(session: Session, sizes: Sizes, results: dict[Key, list[Epoch]]) -> None:
    for variant, n in (("loop", sizes.loop), ("numpy", sizes.numpy)):
        dataset = pipeline.make_dataset(variant, n, side=sizes.side)
        order = epoch_order(n)
        loaders = {("serial", 0): partial(make_loader, "serial", dataset, 0, order)}
        for w in (w for w in sizes.workers if w > 0):
            for method in ("pool imap", "minidl process"):
                loaders[method, w] = partial(make_loader, method, dataset, w, order)
        reference = make_loader("serial", pipeline.make_dataset("loop", n, side=sizes.side), 0, order)
        if sizes.check:
            check(loaders, reference, f"pool, {variant}")
        _group(session, f"pool, {variant}", loaders, sizes.repeats, results, ("serial", 0), n)


def _vectorise_group(session: Session, sizes: Sizes, results: dict[Key, list[Epoch]]) -> None:
    n = sizes.vectorise
    order = epoch_order(n)
    datasets = {v: pipeline.make_dataset(v, n, side=sizes.side) for v in ("loop", "numpy", "batch", "numba")}
    datasets["numba"].warm_up()  # compiled (or loaded) here, before the workers fork: their copy is warm
    loaders = {(v, w): partial(make_loader, "serial" if w == 0 else "minidl process", d, w, order)
               for v, d in datasets.items() for w in sizes.workers}
    if sizes.check:
        check(loaders, make_loader("serial", datasets["loop"], 0, order), "vectorise")
    _group(session, "vectorise", loaders, sizes.repeats, results, ("loop", 0), n)


def _numba_group(session: Session, sizes: Sizes, results: dict[Key, list[Epoch]]) -> None:
    n, w = sizes.numba, 2
    order = epoch_order(n)
    datasets = {
        NUMBA_METHODS[0]: pipeline.make_dataset("numpy", n, side=sizes.side),
        NUMBA_METHODS[1]: pipeline.make_dataset("numba", n, side=sizes.side, kernel="compile"),
        NUMBA_METHODS[2]: pipeline.make_dataset("numba", n, side=sizes.side, kernel="cache"),
        NUMBA_METHODS[3]: pipeline.make_dataset("numba", n, side=sizes.side, kernel="cache"),
    }
    datasets[NUMBA_METHODS[3]].warm_up()  # only this one: the others' kernels never run in this process
    loaders = {(m, w): partial(make_loader, "minidl process", d, w, order) for m, d in datasets.items()}
    if sizes.check:
        check(loaders, make_loader("serial", pipeline.make_dataset("loop", n, side=sizes.side), 0, order),
              "numba in workers")
    _group(session, "numba in workers", loaders, sizes.repeats, results, (NUMBA_METHODS[0], w), n)


FRESH_PROCESS = """
import json, sys, time
start = time.perf_counter()
import numpy as np, numba
from minidl_course import png_pipeline as pipeline
imported = time.perf_counter() - start
dataset = pipeline.NumbaPipeline(2, side={side}, kernel={kind!r})
raw, params = dataset.raw(0), dataset.params(0)
out = np.empty((3, {side}, {side}), dtype=np.float32)
kernel = dataset.compiled()
start = time.perf_counter()
kernel(raw, *params, out)
first = time.perf_counter() - start
warm = []
for _ in range(50):
    start = time.perf_counter()
    kernel(raw, *params, out)
    warm.append(time.perf_counter() - start)
print(json.dumps({{"import": imported, "first": first, "warm": sorted(warm)[len(warm) // 2]}}))
"""


def fresh_process(kind: str, side: int) -> dict[str, float]:
    """In a new interpreter: seconds to import Numba and the pipeline, the kernel's first call, a warm call."""
    root = Path(pipeline.__file__).resolve().parents[1]  # the repository: minidl_course/ sits in it
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS.format(side=side, kind=kind)], env=env,
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:  # what the child said, not only that it failed
        raise RuntimeError(f"a fresh interpreter timing the {kind!r} kernel exited with {result.returncode}:\n"
                           f"{result.stderr[-3000:]}")
    return json.loads(result.stdout)


def _numba_per_process(session: Session, sizes: Sizes) -> dict[str, Timing]:
    """Fresh interpreters, alternating: "compile" (no cache) and "cache" (cache=True); a warm-up round first."""
    runs = run_rounds({k: partial(fresh_process, k, sizes.side) for k in ("compile", "cache")},
                      sizes.process_repeats, measure=lambda r: r, progress=session.progress("numba per process"))
    runs = {k: v[1:] for k, v in runs.items()}  # the warm-up round wrote the cache; it isn't timed

    def one(values: list[float]) -> Timing:
        return Timing(statistics.median(values), min(values), max(values), len(values), values[0])

    steps = {
        PROCESS_STEPS[0]: one([r["import"] for r in runs["compile"] + runs["cache"]]),
        PROCESS_STEPS[1]: one([r["first"] for r in runs["compile"]]),
        PROCESS_STEPS[2]: one([r["first"] for r in runs["cache"]]),
        PROCESS_STEPS[3]: one([r["warm"] for r in runs["compile"] + runs["cache"]]),
    }
    for step, t in steps.items():
        session.record("numba per process", step, t, size=1,
                       note="median over fresh interpreters; the warm call is the median of 50 in each")
    return steps


def _threads_group(session: Session, sizes: Sizes, results: dict[Key, list[Epoch]]) -> None:
    for side, n in sizes.threads.items():
        order = epoch_order(n)
        loaders = {}
        datasets = {kind: pipeline.make_dataset("numba", n, side=side, kernel=kind) for kind in ("nogil", "cache")}
        for kind, dataset in datasets.items():
            dataset.warm_up()  # thread workers share this process's dispatcher: compile it before timing
            for w in (0, 2):
                loaders[kind, w] = partial(make_loader, "minidl thread", dataset, w, order)
        check(loaders, make_loader("serial", pipeline.make_dataset("numpy", n, side=side), 0, order),
              f"threads, side {side}")
        epoch = partial(run_epoch, memory=None)
        progress = session.progress(f"threads {side}")
        for (kind, w), epochs in run_rounds(loaders, sizes.thread_repeats, epoch, progress).items():
            task = "threads, nogil" if kind == "nogil" else "threads, gil"
            method = "serial" if w == 0 else "2 threads"
            results[f"{task}, side {side}", method, w] = epochs
            rate = [e.samples / e.seconds for e in epochs[1:]]
            session.record(task, method, timing([e.seconds for e in epochs]), size=side, workers=w, baseline=w == 0,
                           note=f"{n} samples; samples/s {statistics.median(rate):.4g}")


# --- one group, live ---------------------------------------------------------------------------

class _NoBar:
    """Stands in for the progress bar when a group runs inside a notebook."""

    total = 0

    def refresh(self) -> None: ...
    def set_postfix_str(self, what: str) -> None: ...
    def update(self) -> None: ...
    def write(self, message: str) -> None: ...


GROUPS = ("pool", "vectorise", "numba", "numba per process", "threads")


def measure(group: str, sizes: Sizes = LIVE) -> tuple[list[dict], list[dict]]:
    """Run one group of the suite here and now; returns (rows, rounds), keyed as ``pipeline.csv`` and
    ``pipeline_rounds.csv`` are, so notebook 11 reads this machine's figures as it reads the committed ones.
    """
    if group not in GROUPS:
        raise ValueError(f"group should be one of {GROUPS}, but got group={group!r}")
    session = Session("pipeline", quick=False, out=Path("."), bar=_NoBar())
    results: dict[Key, list[Epoch]] = {}
    if group == "pool":
        _pool_group(session, sizes, results)
    elif group == "vectorise":
        _vectorise_group(session, sizes, results)
    elif group == "numba":
        _numba_group(session, sizes, results)
    elif group == "numba per process":
        _numba_per_process(session, sizes)
    else:
        _threads_group(session, sizes, results)
    rows = [{"task": r.task, "method": r.method, "workers": r.workers, "size": r.size, "median_s": r.timing.median,
             "min_s": r.timing.min, "max_s": r.timing.max} for r in session.rows]
    rounds = [{"task": task, "method": method, "workers": workers, "round": r, "seconds": e.seconds,
               "first_batch_s": e.first_batch, "samples": e.samples, "cpu_s": e.cpu}
              for (task, method, workers), epochs in results.items() for r, e in enumerate(epochs)]
    return rows, rounds


# --- ratios ---------------------------------------------------------------------------------------

def per_round_ratio(results: Mapping[Key, list[Epoch]], top: Key, bottom: Key) -> list[float]:
    """``bottom``'s epoch time over ``top``'s, round by round (the warm-up left out): >1 means ``top`` is faster."""
    return [b.seconds / t.seconds for t, b in zip(results[top][1:], results[bottom][1:])]


def ratio_tables(results: Mapping[Key, list[Epoch]]) -> str:
    """The headline ratios, each the median of per-round ratios with its interval (>= 95%)."""
    out = []
    for variant in ("loop", "numpy"):
        task = f"pool, {variant}"
        rows = [[m, *(paired_ratio(per_round_ratio(results, (task, m, w), (task, "serial", 0))) for w in WORKERS[1:])]
                for m in ("pool imap", "minidl process")]
        rows.append(["minidl / pool", *(paired_ratio(per_round_ratio(results, (task, "minidl process", w),
                                                                     (task, "pool imap", w))) for w in WORKERS[1:])])
        out.append(text_table(f"{task}: speedup over the serial loop {CI}", ["method", "1 worker", "2 workers"], rows))
    rows = [[v, *(paired_ratio(per_round_ratio(results, ("vectorise", v, w), ("vectorise", "loop", 0)))
                  for w in WORKERS)] for v in ("loop", "numpy", "batch", "numba")]
    out.append(text_table(f"vectorise: speedup over the pure-Python loop with no workers {CI}",
                          ["variant", "0 workers", "1 worker", "2 workers"], rows))
    task = "numba in workers"
    rows = [[m, paired_ratio(per_round_ratio(results, (task, m, 2), (task, NUMBA_METHODS[0], 2)))]
            for m in NUMBA_METHODS[1:]]
    out.append(text_table(f"numba in 2 process workers: epoch speedup over NumPy per sample {CI}",
                          ["kernel", "speedup"], rows))
    sides = sorted({int(k[0].rsplit(" ", 1)[1]) for k in results if k[0].startswith("threads")})
    rows = [[kind, *(paired_ratio(per_round_ratio(results, (f"threads, {kind}, side {s}", "2 threads", 2),
                                                  (f"threads, {kind}, side {s}", "serial", 0))) for s in sides)]
            for kind in ("nogil", "gil")]
    out.append(text_table(f"2 thread workers over serial, Numba kernel, {core_count()} cores {CI}",
                          ["kernel", *(f"side {s}" for s in sides)], rows))
    return "\n\n".join(out)


# --- plots ----------------------------------------------------------------------------------------

def _median_rate(results: Mapping[Key, list[Epoch]], key: Key) -> float:
    return statistics.median(e.samples / e.seconds for e in results[key][1:])


def _plots(session: Session, results: Mapping[Key, list[Epoch]], process: Mapping[str, Timing]) -> None:
    from minidl_bench import plot

    series = {}
    for variant in ("loop", "numpy"):
        task = f"pool, {variant}"
        base = _median_rate(results, (task, "serial", 0))
        for method in ("pool imap", "minidl process"):
            series[f"{variant} · {method}"] = [1.0] + [_median_rate(results, (task, method, w)) / base
                                                       for w in WORKERS[1:]]
    ceiling = min(WORKERS[-1], core_count())  # the most the workers can gain on this machine's cores
    lines = {"serial": 1.0, f"x{ceiling}: {ceiling} busy core{'s' * (ceiling > 1)}": ceiling}
    fig = plot.line_plot(list(WORKERS), series, hlines=lines,
                         title="Pool.imap as a loader vs minidl's process workers (speedup over a serial loop)",
                         xlabel="workers (0: the serial loop)", ylabel="speedup (median epoch, start included)")
    fig.axes[0].set_xticks(list(WORKERS))
    fig.axes[0].set_ylim(bottom=0)
    session.savefig(fig, "pipeline_pool.png")

    variants = ("loop", "numpy", "batch", "numba")
    series = {v: [_median_rate(results, ("vectorise", v, w)) for w in WORKERS] for v in variants}
    fig = plot.line_plot(list(WORKERS), series, logy=True, xlabel="num_workers (process workers)",
                         ylabel="samples/s (median epoch, log scale)",
                         title="Vectorise or add workers? The same transform four ways, 0-2 workers")
    fig.axes[0].set_xticks(list(WORKERS))
    session.savefig(fig, "pipeline_vectorise.png")

    firsts = {m: timing([e.first_batch for e in results["numba in workers", m, 2]]) for m in NUMBA_METHODS}
    session.savefig(plot.bar_times(firsts, log=False, what="time to the first batch",
                                   title="Numba in 2 process workers: who pays the compile?"),
                    "pipeline_numba_workers.png")
    session.savefig(plot.bar_times(dict(process), log=False, what="time in a fresh interpreter",
                                   title="Numba per process: import, compile, load from cache, run"),
                    "pipeline_numba_process.png")

    sides = sorted({int(k[0].rsplit(" ", 1)[1]) for k in results if k[0].startswith("threads")})
    series = {f"{kind}": [statistics.median(per_round_ratio(results, (f"threads, {kind}, side {s}", "2 threads", 2),
                                                             (f"threads, {kind}, side {s}", "serial", 0)))
                          for s in sides] for kind in ("nogil", "gil")}
    series = {"@njit(nogil=True): GIL released": series["nogil"], "@njit: GIL held": series["gil"]}
    ceiling = min(2, core_count())  # 2 threads gain at most x2, and no more than the cores allow
    lines = {"serial": 1.0, f"x{ceiling}: 2 threads, {core_count()} core{'s' * (core_count() > 1)}": ceiling}
    fig = plot.line_plot(sides, series, hlines=lines,
                         title="2 thread workers over serial, Numba kernel, GIL build",
                         xlabel="image side (pixels): more work per sample in the kernel",
                         ylabel="speedup (median of per-round ratios)")
    fig.axes[0].set_xticks(sides)
    fig.axes[0].set_ylim(0, max(2.3, 1.1 * max(max(v) for v in series.values())))
    session.savefig(fig, "pipeline_threads.png")
