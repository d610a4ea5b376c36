"""The ``threads`` suite: thread workers against process workers, run once per interpreter, torch-free.

Serial loading (``num_workers=0``), ``worker_method="thread"`` and process workers load the four workloads
of ``minidl_bench.workloads`` with 1, 2 and 4 workers, batched by ``minidl.numpy_collate`` and shuffled by
a NumPy generator, so a GIL CPython and a free-threaded one (``.venv-ft``, no torch) run the very same
code. ``make bench-ft`` runs it under both, then ``python -m minidl_bench.threads_report`` puts the two
builds side by side. One epoch (worker start and shutdown included) gives samples/s, time to the first
batch, peak PSS/USS of the main process plus its workers, and CPU use, measured as the ``loaders`` suite
does (``run_rounds``: one warm-up round, then rounds in rotating order). CSV rows: task ``<workload>``
is the epoch (``size`` samples; speedup over serial), ``<workload> first batch`` the time to the first
batch; every metric's median, min and max also go to ``threads_metrics.csv``. Each row's
``python_build`` names the interpreter: ``gil``, ``free-threaded`` or ``free-threaded, GIL re-enabled``.
"""

from __future__ import annotations

import os
import statistics
import warnings
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import numpy as np

import minidl
from minidl_bench import workloads
from minidl_bench.batches import check_first_batches
from minidl_bench.harness import Session, missing
from minidl_bench.loaders import (
    Epoch,
    Sizes,
    make_workloads,
    record_epochs,
    run_epoch,
    run_rounds,
    text_table,
    write_metrics,
)
from minidl_bench.machine import core_count, machine_info

# What .venv (GIL) and .venv-ft (free-threaded) both have; skimage's installed files are the photographs.
REQUIRES = ("numpy", "psutil", "PIL", "tqdm", "skimage")
BACKENDS = ("thread", "process")  # worker_method "thread" and "multiprocessing"; "serial" has no workers
BATCH_SIZE = 32
SEED = 0

# FULL takes about 2.5 minutes per interpreter on 2 cores; QUICK about 15 seconds.
FULL = Sizes(python=384, python_side=32, numpy=4096, numpy_images=2048, images=288, image_files_per_class=32,
             io=192, io_latency=0.004, repeats=7)
QUICK = Sizes(python=64, python_side=12, numpy=256, numpy_images=256, images=64, image_files_per_class=8,
              io=64, io_latency=0.001, repeats=3,
              workers=(0, 1, 2, 4), memory_interval=0.02)

Key = tuple[str, str, int]  # (workload, backend, num_workers); num_workers 0 is backend "serial"


def make_loader(backend: str, dataset: Any, num_workers: int, *, batch_size: int = BATCH_SIZE,
                seed: int = SEED) -> Iterable:
    """A shuffling minidl DataLoader with NumPy batches: "serial" (no workers), "thread" or "process" workers."""
    method = "thread" if backend == "thread" else "multiprocessing"
    # A NumPy generator: the same shuffle and worker seeds with or without torch installed.
    return minidl.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                             generator=np.random.default_rng(seed), collate_fn=minidl.numpy_collate,
                             worker_method=method)


def with_shared_constants(datasets: Mapping[str, Any], sizes: Sizes) -> dict[str, Any]:
    """``datasets`` plus ``python-shared``, right after ``python``: the same pixel loop reading shared constants.

    It returns the very same samples as ``python``; only which thread owns the floats its loop reads
    differs (see ``workloads.PythonWorkload``). Under the GIL the two run alike; on a free-threaded build
    the pair shows what objects shared between thread workers cost.
    """
    out: dict[str, Any] = {}
    for name, dataset in datasets.items():
        out[name] = dataset
        if name == "python":
            out["python-shared"] = workloads.PythonWorkload(sizes.python, side=sizes.python_side,
                                                            shared_constants=True)
    return out


def backends_for(num_workers: int) -> tuple[str, ...]:
    """With no workers there is nothing to run them as: one "serial" row."""
    return ("serial",) if num_workers == 0 else BACKENDS


def check_backends(name: str, dataset: Any, num_workers: int = 2) -> None:
    """Raise unless thread and process workers give the serial loader's first batches."""
    check_first_batches(name, partial(make_loader, "serial", dataset, 0),
                        {f"{b} workers": partial(make_loader, b, dataset, num_workers) for b in BACKENDS},
                        reference_name="the serial loader")


def run(session: Session) -> None:
    """Check, then time every workload x backend x num_workers; print the ratios; save CSVs (and plots)."""
    sizes = QUICK if session.quick else FULL
    info = machine_info()
    session.log(f"[threads] Python {info['python']}, build: {info['python_build']}; "
                f"load average before: {os.getloadavg()[0]:.2f} on {core_count()} cores")
    datasets = with_shared_constants(make_workloads(sizes), sizes)
    results: dict[Key, list[Epoch]] = {}
    session.plan(len(datasets) * sum(len(backends_for(w)) for w in sizes.workers) * (sizes.repeats + 1))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers on 2 cores
        # Python 3.12+ warns when forking a process that runs threads (here: the memory sampler).
        warnings.filterwarnings("ignore", message=r"This process \(pid=\d+\) is multi-threaded",
                                category=DeprecationWarning)
        for name, dataset in datasets.items():
            check_backends(name, dataset)
            session.log(f"[threads] {name}: thread and process workers give the serial loader's batches")
            # Every backend and worker count of a workload in one rotation: a neighbour's load hits them alike.
            loaders = {(b, w): partial(make_loader, b, dataset, w) for w in sizes.workers for b in backends_for(w)}
            epoch = partial(run_epoch, memory=sizes.memory_interval)
            def progress(key: tuple[str, int], name: str = name) -> None:
                session.advance(f"{name}: {key[0]} x{key[1]}")

            for (backend, w), epochs in run_rounds(loaders, sizes.repeats, epoch, progress).items():
                results[name, backend, w] = epochs
                record_epochs(session, name, backend, w, epochs, baseline=backend == "serial",
                              extra=f"; load {os.getloadavg()[0]:.2f}")
            session.log(f"[threads] {name}: timed {sizes.repeats} rounds of {len(loaders)} loaders")
    session.log(f"[threads] load average after: {os.getloadavg()[0]:.2f}")
    metrics = write_metrics(results, session.out / "threads_metrics.csv")
    session.log(ratio_table(results))
    if missing("matplotlib"):  # .venv-ft has none: threads_report draws both builds from the GIL venv
        session.skip("plots", "matplotlib not installed (python -m minidl_bench.threads_report draws both builds)")
        return
    from minidl_bench import threads_report

    for filename, fig in threads_report.figures(threads_report.read_rows(metrics)).items():
        session.savefig(fig, filename)


def ratio_table(results: Mapping[Key, list[Epoch]]) -> str:
    """Speedup over serial (median samples/s over median serial samples/s) per workload, backend and workers."""
    names = list(dict.fromkeys(k[0] for k in results))
    counts = sorted({k[2] for k in results if k[2] > 0})

    def rate(key: Key) -> float:
        return statistics.median(e.samples / e.seconds for e in results[key][1:])

    rows = [[n, b, *(f"x{rate((n, b, w)) / rate((n, 'serial', 0)):.2f}" for w in counts)]
            for n in names for b in BACKENDS]
    build = machine_info()["python_build"]
    return text_table(f"speedup over serial, {build} build, {core_count()} cores",
                      ["workload", "workers", *(f"{w}" for w in counts)], rows)
