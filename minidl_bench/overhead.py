"""The ``overhead`` suite: what the loader itself costs per batch, at start, and with tracing on.

Tasks (the CSV's ``task``, with what its ``size`` counts):

* ``per-batch, <w> workers`` (batch size): a dataset that returns its index, so the time is the loader's
  own: sampler, fetch, collate, and with workers the queues, pickling and reordering. The figure is the
  steady state, from the first batch to the last, divided by the batches between (startup and shutdown
  left out). Batch size 1 and 64, ``num_workers`` 0 and 2; torch, minidl processes, minidl threads,
  and each minidl one again with ``stateful=True`` (method ``<backend> stateful=True``: the resume layer,
  which ``state_dict()`` needs); speedup against torch at the same settings (below 1: minidl costs more).
* ``first batch, <w> workers`` (batch size): ``iter()`` until the first batch of that trivial dataset:
  worker start alone, with almost no work to wait for.
* ``trace numpy, <backend>, <w> workers`` (samples): a minidl epoch of the ``numpy`` workload with
  ``trace=True`` against the same without; speedup against tracing off (below 1: tracing slows it down).
  Each backend's pair runs in a fresh interpreter with glibc's malloc thresholds fixed (``STEADY_MALLOC``):
  see ``traced_epochs`` for why.
* ``resume, <workload>, <backend>, 2 workers`` (samples): an epoch of a realistic workload (``images``: the
  photographs decoded and augmented; ``numpy``: the NumPy augmentation) with ``stateful=True`` (the resume
  layer at its default ``snapshot_every_n_steps``) against the same with ``stateful=False``, 2 process and
  2 thread workers; speedup against ``stateful=False`` (below 1: resume costs that much of the epoch).

As in the ``loaders`` suite, compared loaders run in rotating rounds after a warm-up round, and every
backend's first batches (traced and stateful ones too) are checked against torch's before anything is timed
(``minidl_bench.batches.check_first_batches``).
Every round's per-batch cost and first batch also go to ``overhead_rounds.csv``, every resume epoch to
``overhead_resume_rounds.csv``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from minidl_bench import workloads
from minidl_bench.batches import check_first_batches
from minidl_bench.harness import Session, Timing, format_seconds, missing
from minidl_bench.loaders import (
    BACKENDS,
    CI,
    Epoch,
    backends_for,
    make_loader,
    paired_ratio,
    run_epoch,
    run_rounds,
    text_table,
    timing,
    write_rows,
)

REQUIRES = ("torch", "psutil")
BATCH_SIZES = (1, 64)
WORKERS = (0, 2)
TRACE_BACKENDS = ((0, "minidl"), (2, "minidl process"), (2, "minidl thread"))
RESUME_BACKENDS = ("minidl process", "minidl thread")  # each with RESUME_WORKERS workers
RESUME_WORKERS = 2
STATEFUL = " stateful=True"  # a method name's suffix: the same minidl backend built with stateful=True


def methods_for(num_workers: int) -> tuple[str, ...]:
    """The per-batch loaders compared at ``num_workers``: torch, then each minidl backend and it with stateful=True."""
    torch, *minidl = backends_for(num_workers)
    return (torch, *(m for b in minidl for m in (b, b + STATEFUL)))


def make_method(method: str, dataset: Any, num_workers: int, batch_size: int) -> Iterable:
    """A fresh loader for one of ``methods_for``'s names (only the public ``stateful=`` argument is set)."""
    if method.endswith(STATEFUL):
        return make_loader(method.removesuffix(STATEFUL), dataset, num_workers, batch_size=batch_size, stateful=True)
    return make_loader(method, dataset, num_workers, batch_size=batch_size)


@dataclass(frozen=True)
class Sizes:
    """Batches per epoch for each batch size, and the traced epoch's length; FULL: 2.4 minutes on 2 AMD EPYC cores."""

    batches: Mapping[int, int]
    trace_samples: int
    trace_images: int
    repeats: int
    resume_images: int  # photographs per resume epoch (of a folder cut to resume_files_per_class per class)
    resume_files_per_class: int
    resume_numpy: int  # numpy samples per resume epoch


FULL = Sizes(batches={1: 4000, 64: 1500}, trace_samples=8192, trace_images=4096, repeats=11, resume_images=384,
             resume_files_per_class=64, resume_numpy=8192)
QUICK = Sizes(batches={1: 200, 64: 50}, trace_samples=512, trace_images=256, repeats=3, resume_images=32,
              resume_files_per_class=8, resume_numpy=256)


@dataclass(frozen=True)
class BatchTimes:
    """One epoch of a trivial dataset: when its first batch came, and the steady cost of the rest."""

    first_batch: float  # iter() until the first batch: worker start
    per_batch: float  # (last batch's arrival - first batch's) / batches between them


def batch_times(loader: Iterable) -> BatchTimes:
    """Consume one epoch, stamping when the first and the last batch arrive."""
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first = last = time.perf_counter()
    n = 0
    for _ in it:  # a clock read per batch is ~0.1 µs: noise next to the loader's own cost
        last = time.perf_counter()
        n += 1
    return BatchTimes(first - start, (last - first) / max(n, 1))


def run(session: Session) -> None:
    """Time the per-batch cost, the start, tracing and resume; print the ratios; save the plots."""
    from minidl_course.toy import RangeDataset

    sizes = QUICK if session.quick else FULL
    per_batch: dict[tuple[int, int, str], list[BatchTimes]] = {}
    per_round = (len(BATCH_SIZES) * sum(len(methods_for(w)) for w in WORKERS) + 2 * len(TRACE_BACKENDS)
                 + 2 * 2 * len(RESUME_BACKENDS))  # resume: 2 workloads, stateful False and True
    session.plan(per_round * (sizes.repeats + 1))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        for bs in BATCH_SIZES:
            dataset = RangeDataset(bs * sizes.batches[bs])
            for w in WORKERS:
                loaders = {m: partial(make_method, m, dataset, w, bs) for m in methods_for(w)}
                check_first_batches(f"trivial, batch size {bs}, {w} workers", loaders["torch"],
                                    {m: make for m, make in loaders.items() if m != "torch"}, reference_name="torch")
                progress = session.progress(f"per-batch, batch size {bs}, {w} workers:")
                for backend, epochs in run_rounds(loaders, sizes.repeats, batch_times, progress).items():
                    per_batch[bs, w, backend] = epochs
                    note = f"{sizes.batches[bs]} batches; steady state, first batch to last"
                    session.record(f"per-batch, {w} workers", backend, timing([e.per_batch for e in epochs]),
                                   size=bs, workers=w, baseline=backend == "torch", note=note)
                    session.record(f"first batch, {w} workers", backend, timing([e.first_batch for e in epochs]),
                                   size=bs, workers=w, baseline=backend == "torch", note="iter() to the first batch")
                cells = ", ".join(f"{m} {format_seconds(_med(per_batch[bs, w, m]))}" for m in methods_for(w))
                session.log(f"[overhead] batch size {bs}, {w} workers, per batch: {cells}")

        numpy = workloads.NumpyWorkload(sizes.trace_samples, pool=sizes.trace_images)
        check_first_batches("[overhead] numpy, trace=True", partial(make_loader, "torch", numpy, 0),
                            {f"{b}, {w} workers": partial(make_loader, b, numpy, w, trace=True)
                             for w, b in TRACE_BACKENDS}, reference_name="torch")
        traced: dict[tuple[int, str, bool], list[Epoch]] = {}
        for w, backend in TRACE_BACKENDS:
            progress = session.progress(f"trace numpy, {backend}, {w} workers: trace=")
            faults: dict[bool, list[int]] = {}
            for on, epochs, epoch_faults in traced_epochs(backend, w, sizes, progress):
                traced[w, backend, on], faults[on] = epochs, epoch_faults
                session.record(f"trace numpy, {backend}, {w} workers", "trace=True" if on else "trace off",
                               timing([e.seconds for e in epochs]), size=sizes.trace_samples, workers=w,
                               baseline=not on, note="one epoch, worker start and shutdown included")
            session.log(f"[overhead] trace numpy, {backend}, {w} workers: throughput with / without "
                        f"{_trace_ratio(traced, w, backend):.3f}; page faults per epoch, median, without / with: "
                        f"{statistics.median(faults[False][1:]):.0f} / {statistics.median(faults[True][1:]):.0f}")
        resumed = resume_epochs(session, sizes)
    write_rows(session.out / "overhead_rounds.csv", [
        {"batch_size": bs, "workers": w, "method": b, "round": r, "per_batch_s": e.per_batch,
         "first_batch_s": e.first_batch}
        for (bs, w, b), epochs in per_batch.items() for r, e in enumerate(epochs)])
    write_rows(session.out / "overhead_resume_rounds.csv", [
        {"workload": name, "workers": RESUME_WORKERS, "method": backend, "stateful": on, "round": r,
         "seconds": e.seconds} for (name, backend, on), epochs in resumed.items() for r, e in enumerate(epochs)])
    session.log(ratio_tables(per_batch, traced, resumed))
    if missing("matplotlib"):
        session.skip("plots", "matplotlib not installed")
        return
    _plots(session, per_batch, traced, sizes)


# glibc's malloc moves its mmap threshold up as a process frees large blocks, and trims the heap's top as
# it shrinks: which loader's batches then come from fresh, page-faulting memory depends on the process's
# history, not on the loader. Fixing both thresholds (which turns that tuning off) keeps the traced and the
# untraced epochs on equal terms. Other C libraries ignore the variable.
STEADY_MALLOC = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456"}


def traced_epochs(backend: str, workers: int, sizes: Sizes,
                  progress: Callable[[Any], None]) -> Iterator[tuple[bool, list[Epoch], list[int]]]:
    """(trace on?, its epochs, each epoch's minor page faults), from rounds run in a fresh interpreter.

    Why not in this process: with the allocator tuning itself, the same pair of loaders (0 workers)
    measured 0.81 in one interpreter and 1.15 in the next (trace=True *faster*), following the page
    faults per epoch, with / without: 28,000 / 350, then 35,000 / 63,000. With ``STEADY_MALLOC``, four
    interpreters in a row measured 0.96 to 0.98: both sides fault alike and the ratio is tracing's.
    """
    command = [sys.executable, "-m", "minidl_bench.overhead", "traced", backend, str(workers),
               str(sizes.trace_samples), str(sizes.trace_images), str(sizes.repeats)]
    epochs: dict[bool, list[Epoch]] = {False: [], True: []}
    faults: dict[bool, list[int]] = {False: [], True: []}
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=os.environ | STEADY_MALLOC) as child:
        for line in child.stdout:  # one JSON line per epoch, as it ends
            row = json.loads(line)
            epochs[row["trace"]].append(Epoch(**row["epoch"]))
            faults[row["trace"]].append(row["faults"])
            progress(row["trace"])
    if child.returncode != 0:
        raise RuntimeError(f"[overhead] the traced epochs' interpreter failed (exit code {child.returncode})")
    for on in (False, True):
        yield on, epochs[on], faults[on]


def _traced_rounds(backend: str, workers: int, samples: int, images: int, repeats: int) -> None:
    """The child's side of ``traced_epochs``: rotating rounds of trace off / on, a JSON line per epoch."""
    numpy = workloads.NumpyWorkload(samples, pool=images)
    loaders = {on: partial(make_loader, backend, numpy, workers, trace=on) for on in (False, True)}

    def measure(loader) -> None:  # prints the epoch as soon as it ends: the parent's progress bar moves
        before = _minor_faults()
        epoch = run_epoch(loader, memory=None)
        faults = _minor_faults() - before
        print(json.dumps({"trace": loader.trace is not None, "epoch": dataclasses.asdict(epoch), "faults": faults}),
              flush=True)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        run_rounds(loaders, repeats, measure)


def resume_epochs(session: Session, sizes: Sizes) -> dict[tuple[str, str, bool], list[Epoch]]:
    """Epochs of the realistic workloads with ``stateful`` False and True side by side: ``{(workload, backend,
    stateful): epochs}``, each list starting with the warm-up round's."""
    from minidl_course import photos

    data = {"images": workloads.ImageFolderWorkload(photos.photo_folder(sizes.resume_files_per_class),
                                                    limit=sizes.resume_images),
            "numpy": workloads.NumpyWorkload(sizes.resume_numpy, pool=min(sizes.resume_numpy, 4096))}
    out: dict[tuple[str, str, bool], list[Epoch]] = {}
    for name, dataset in data.items():
        for backend in RESUME_BACKENDS:
            task = f"resume, {name}, {backend}, {RESUME_WORKERS} workers"
            loaders = {on: partial(make_loader, backend, dataset, RESUME_WORKERS, stateful=on) for on in (False, True)}
            check_first_batches(f"[overhead] {task}", partial(make_loader, "torch", dataset, RESUME_WORKERS),
                                {f"stateful={on}": make for on, make in loaders.items()}, reference_name="torch")
            for on, epochs in run_rounds(loaders, sizes.repeats, partial(run_epoch, memory=None),
                                         session.progress(f"{task}: stateful=")).items():
                out[name, backend, on] = epochs
                session.record(task, f"stateful={on}", timing([e.seconds for e in epochs]), size=len(dataset),
                               workers=RESUME_WORKERS, baseline=not on,
                               note="one epoch, worker start and shutdown included; snapshot_every_n_steps default")
            session.log(f"[overhead] {task}: throughput with / without stateful {_resume_ratio(out, name, backend)}")
    return out


def _resume_ratio(resumed: Mapping[tuple[str, str, bool], list[Epoch]], name: str, backend: str) -> str:
    """Throughput with ``stateful=True`` / without, per round: the median and its interval."""
    pairs = zip(resumed[name, backend, False][1:], resumed[name, backend, True][1:])
    return paired_ratio([off.seconds / on.seconds for off, on in pairs])


def _minor_faults() -> int:
    """Minor page faults of this process and its exited children (each a page of fresh memory touched)."""
    return sum(resource.getrusage(who).ru_minflt for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def _med(epochs: Sequence[BatchTimes | Epoch], attr: str = "per_batch") -> float:
    return statistics.median(getattr(e, attr) for e in epochs[1:])


def _trace_ratio(traced: Mapping[tuple[int, str, bool], list[Epoch]], w: int, backend: str,
                 cost: str = "seconds") -> float:
    """Throughput with tracing / without: the untraced epoch's median ``cost`` over the traced one's.

    ``cost="cpu"`` compares CPU seconds (main process and workers) instead: the work tracing adds,
    which other programs on a shared machine barely disturb.
    """
    def med(on: bool) -> float:
        return statistics.median(getattr(e, cost) for e in traced[w, backend, on][1:])

    return med(False) / med(True)


def ratio_tables(per_batch: Mapping[tuple[int, int, str], list[BatchTimes]],
                 traced: Mapping[tuple[int, str, bool], list[Epoch]],
                 resumed: Mapping[tuple[str, str, bool], list[Epoch]]) -> str:
    """The goals as ratios of medians measured side by side: per-batch cost, start, tracing, resume."""
    rows = []
    for bs in BATCH_SIZES:
        for w in WORKERS:
            torch_cost = _med(per_batch[bs, w, "torch"])
            for backend in backends_for(w)[1:]:
                cost = _med(per_batch[bs, w, backend])
                pairs = zip(per_batch[bs, w, backend][1:], per_batch[bs, w, "torch"][1:])
                rows.append([str(bs), str(w), backend, f"{cost * 1e6:.1f}", f"{torch_cost * 1e6:.1f}",
                             paired_ratio([a.per_batch / b.per_batch for a, b in pairs])])
    out = [text_table("loader's own cost per batch, µs (goal: minidl / torch <= 1.1)",
                      ["batch size", "workers", "backend", "minidl µs", "torch µs", f"minidl / torch per round {CI}"],
                      rows)]
    rows = []
    for bs in BATCH_SIZES:
        for w in WORKERS:
            for backend in backends_for(w)[1:]:
                on, off = per_batch[bs, w, backend + STATEFUL], per_batch[bs, w, backend]
                rows.append([str(bs), str(w), backend, f"{_med(off) * 1e6:.1f}", f"{_med(on) * 1e6:.1f}",
                             paired_ratio([a.per_batch / b.per_batch for a, b in zip(on[1:], off[1:])])])
    out.append(text_table("resume layer's cost per batch, µs: stateful=True beside stateful=False (1.00 = free)",
                          ["batch size", "workers", "backend", "stateful=False µs", "stateful=True µs",
                           f"True / False per round {CI}"], rows))
    rows = []
    for bs in BATCH_SIZES:
        for w in WORKERS[1:]:
            first = {b: _med(per_batch[bs, w, b], "first_batch") for b in BACKENDS}
            rows.append([str(bs), str(w), *(format_seconds(first[b]) for b in BACKENDS),
                         f"{first['minidl process'] / first['minidl thread']:.1f}x"])
    out.append(text_table("worker start: time to the first batch of a trivial dataset (goal: threads >= 5x sooner)",
                          ["batch size", "workers", *BACKENDS, "processes / threads"], rows))
    rows = [[str(w), b, f"{_trace_ratio(traced, w, b):.3f}", f"{_trace_ratio(traced, w, b, 'cpu'):.3f}"]
            for w, b in TRACE_BACKENDS]
    out.append(text_table("tracing: with trace=True / without, numpy workload (goal: throughput >= 0.95)",
                          ["workers", "backend", "throughput", "1 / CPU time"], rows))
    rows = [[name, backend, str(RESUME_WORKERS), *(f"{_med(resumed[name, backend, on], 'seconds'):.3f}"
                                                   for on in (False, True)),
             _resume_ratio(resumed, name, backend)] for name, backend in dict.fromkeys(k[:2] for k in resumed)]
    out.append(text_table("resume, realistic workloads: epoch throughput, stateful=True / False (goal: >= 0.95)",
                          ["workload", "backend", "workers", "stateful=False s", "stateful=True s",
                           f"True / False throughput per round {CI}"], rows))
    return "\n\n".join(out)


def _plots(session: Session, per_batch: Mapping[tuple[int, int, str], list[BatchTimes]],
           traced: Mapping[tuple[int, str, bool], list[Epoch]], sizes: Sizes) -> None:
    costs = {(bs, w, b): timing([e.per_batch for e in epochs]) for (bs, w, b), epochs in per_batch.items()}
    epochs = {(w, b, on): timing([e.seconds for e in runs]) for (w, b, on), runs in traced.items()}
    for name, fig in figures(costs, epochs, sizes.trace_samples).items():
        session.savefig(fig, name)


PLOTS = ("overhead_per_batch.png", "overhead_trace.png")


def figures(costs: Mapping[tuple[int, int, str], Timing], epochs: Mapping[tuple[int, str, bool], Timing],
            trace_samples: int, caption: str | None = None) -> dict[str, Any]:
    """Filename -> figure: per-batch cost by (batch size, workers, backend), and epochs by (workers, backend, trace).

    The run passes its Timings; ``minidl_bench.replot`` passes the same read back from the CSVs.
    """
    from minidl_bench import plot

    per_batch = {f"batch {bs}, {w} workers · {m}": costs[bs, w, m]
                 for bs in BATCH_SIZES for w in WORKERS for m in methods_for(w) if (bs, w, m) in costs}
    # A few µs with no workers, tens to hundreds with them: decades, so dots on a log axis.
    per_batch_fig = plot.dot_times(per_batch, what="time per batch, steady state",
                                   caption=caption, groups={k: k.split(" · ")[1] for k in per_batch},
                                   title="The loader's own cost per batch (item i is i)")
    traced = {f"{b}, {w} workers{', trace=True' if on else ''}": epochs[w, b, on]
              for w, b in TRACE_BACKENDS for on in (False, True)}
    title = f"Tracing's cost: one epoch of the numpy workload ({trace_samples} samples)"
    trace_fig = plot.bar_times(traced, what="time per epoch", log=False, title=title, caption=caption,
                               groups={k: "trace=True" if k.endswith("trace=True") else "trace off" for k in traced})
    return dict(zip(PLOTS, (per_batch_fig, trace_fig)))


if __name__ == "__main__":  # python -m minidl_bench.overhead traced <backend> <workers> <samples> <images> <repeats>
    if len(sys.argv) != 7 or sys.argv[1] != "traced":
        sys.exit(__doc__)
    _traced_rounds(sys.argv[2], *map(int, sys.argv[3:]))
