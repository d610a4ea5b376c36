"""The ``kernels`` suite: one per-sample transform, run every way Python offers, plus Pool's crossover.

The transform is what an image Dataset does in ``__getitem__``: a uint8 HxWxC image becomes a float32
CxHxW tensor, scaled to [0, 1], gamma-corrected, standardised per channel and clipped. Tasks (the CSV's
``task`` column, with what its ``size`` counts):

* ``cpu-normalise`` (images): a pure-Python loop, threads, a ``multiprocessing.Pool``, NumPy, and
  Numba serial and ``parallel=True``; the pure-Python loop is the very source Numba compiles.
* ``io-fetch`` (samples): ``time.sleep`` stands in for disk or network latency; threads shine here.
* ``pool-crossover`` (loop iterations per task): a Monte-Carlo loop of growing size, sent to a Pool
  one task per message, shows how much work a task needs before a Pool beats a plain loop.
* ``startup`` (workers): what starting and stopping a pool costs.

Everything a Pool runs is defined at module top level so it pickles under every start method,
``spawn`` included; notebook 01 imports these functions instead of redefining them.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.pool
import random
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from minidl_bench.harness import Session, Timing, missing
from minidl_bench.machine import core_count

try:  # numba.prange is plain range in Python; under Numba's parallel=True its iterations go to threads
    from numba import prange
except ImportError:  # without Numba everything but the Numba rows still runs
    prange = range

IMAGE_SHAPE = (32, 32, 3)  # a CIFAR-sized RGB image, height x width x channels
MEAN = (0.485, 0.456, 0.406)  # ImageNet's channel statistics, as in torchvision's Normalize
STD = (0.229, 0.224, 0.225)
GAMMA = 2.2
CLIP = 2.0  # in standard deviations
LATENCY_S = 0.002  # the simulated I/O wait per sample in the full run


# --- the per-sample transform, four ways ----------------------------------------------------------

def make_images(n: int, seed: int = 0) -> np.ndarray:
    """``n`` random uint8 images, shape (n, H, W, C), the same for the same seed."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, *IMAGE_SHAPE), dtype=np.uint8)


def normalise_into(images: np.ndarray, out: np.ndarray) -> None:
    """Pure-Python loops: images (N, H, W, C) uint8 -> out (N, C, H, W) float32. Numba compiles this too."""
    n, height, width, channels = images.shape
    for i in prange(n):
        for c in range(channels):
            mean, std = MEAN[c], STD[c]
            for y in range(height):
                for x in range(width):
                    v = (images[i, y, x, c] / 255.0) ** GAMMA
                    v = (v - mean) / std
                    out[i, c, y, x] = min(max(v, -CLIP), CLIP)


def normalise_image(image: np.ndarray) -> np.ndarray:
    """One (H, W, C) image through ``normalise_into``, returned as (C, H, W): what threads and Pool map."""
    out = np.empty((image.shape[2], image.shape[0], image.shape[1]), dtype=np.float32)
    normalise_into(image[np.newaxis], out[np.newaxis])
    return out


_MEAN = np.array(MEAN, dtype=np.float32)
_STD = np.array(STD, dtype=np.float32)


def normalise_numpy(images: np.ndarray) -> np.ndarray:
    """The same transform vectorised: whole arrays at a time, for one (H, W, C) image or a batch."""
    x = (images.astype(np.float32) / np.float32(255.0)) ** np.float32(GAMMA)
    x = (x - _MEAN) / _STD  # broadcasts over the trailing channel axis
    np.clip(x, -CLIP, CLIP, out=x)
    return np.ascontiguousarray(np.moveaxis(x, -1, -3))  # HWC -> CHW, as torchvision's ToTensor


def compile_numba(parallel: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """A fresh Numba build of ``normalise_into`` (its first call compiles), wrapped to return its output."""
    import numba  # lazily: the rest of the suite runs without Numba

    kernel = numba.njit(parallel=parallel)(normalise_into)

    def normalise(images: np.ndarray) -> np.ndarray:
        n, height, width, channels = images.shape
        out = np.empty((n, channels, height, width), dtype=np.float32)
        kernel(images, out)
        return out

    return normalise


def all_close(results: Mapping[str, np.ndarray], reference: np.ndarray) -> dict[str, bool]:
    """For each method's output, whether it matches ``reference`` (float32 rounding allowed)."""
    return {k: v.shape == reference.shape and bool(np.allclose(v, reference, rtol=0, atol=1e-5))
            for k, v in results.items()}


# --- an I/O-bound task and a CPU loop of adjustable size ---------------------------------------------

def fetch_sample(index: int, latency: float = LATENCY_S) -> np.ndarray:
    """Wait ``latency`` seconds (a disk read or network round trip), then return sample ``index``."""
    time.sleep(latency)  # a blocking wait releases the GIL, so other threads run meanwhile
    return make_images(1, seed=index)[0]


def monte_carlo_hits(task: tuple[int, int]) -> int:
    """Of ``n`` random points in the unit square (seeded by ``seed``), how many fall in the quarter circle."""
    n, seed = task
    rng = random.Random(seed)
    hits = 0
    for _ in range(n):
        x, y = rng.random(), rng.random()
        if x * x + y * y <= 1.0:
            hits += 1
    return hits


def pool_round_trip(workers: int) -> None:
    """Start a Pool of ``workers`` processes, give each a trivial task, and wait for them all to exit."""
    pool = make_pool(workers)
    pool.map(abs, range(workers), chunksize=1)
    pool.close()
    pool.join()


def threads_round_trip(workers: int) -> None:
    """The same for a ThreadPoolExecutor, whose threads start on the first tasks."""
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(abs, range(workers)))


# --- three ways to map a function over items --------------------------------------------------------

def map_serial(fn: Callable, items: Iterable) -> list:
    """One item after another, in this thread."""
    return [fn(item) for item in items]


def map_threads(fn: Callable, items: Iterable, executor: ThreadPoolExecutor) -> list:
    """Items spread over the executor's threads: one process, one GIL (on a GIL build)."""
    return list(executor.map(fn, items))


def map_pool(fn: Callable, items: Iterable, pool: multiprocessing.pool.Pool, chunksize: int | None = None) -> list:
    """Items pickled to the pool's worker processes and results pickled back."""
    return pool.map(fn, items, chunksize)


def make_pool(workers: int, start_method: str | None = None) -> multiprocessing.pool.Pool:
    """A ``multiprocessing.Pool``; ``start_method=None`` takes the platform's default, as DataLoader does."""
    return multiprocessing.get_context(start_method).Pool(workers)


# --- the suite ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sizes:
    """How big each task is; ``QUICK`` keeps ``--quick`` to seconds, ``FULL`` to about a minute."""

    images: int
    samples: int
    latency: float
    crossover_iterations: tuple[int, ...]
    crossover_tasks: int = 32


FULL = Sizes(images=128, samples=64, latency=LATENCY_S,
             crossover_iterations=(10, 30, 100, 300, 1_000, 3_000, 10_000, 30_000, 100_000))
QUICK = Sizes(images=8, samples=16, latency=0.001, crossover_iterations=(10, 1_000, 30_000), crossover_tasks=8)
# One process per core (at least two, so a one-core machine shows there is nothing to share), then twice as many:
# oversubscription. The reference run (Intel Xeon, 2 cores) has 2 and 4.
CPU_WORKERS = (max(2, core_count()), 2 * max(2, core_count()))
IO_THREADS = (2, 4, 16)  # waiting needs no core, so I/O threads scale past the core count
REQUIRES: tuple[str, ...] = ()  # NumPy only; Numba and matplotlib rows are skipped when missing


def run(session: Session) -> None:
    """Time every task above; save ``kernels_cpu.png``, ``kernels_io.png`` and ``kernels_crossover.png``."""
    sizes = QUICK if session.quick else FULL
    has_numba = not missing("numba")
    session.plan((1 + 2 * len(CPU_WORKERS) + 2 + 2 * has_numba)  # cpu-normalise
                 + (1 + len(IO_THREADS) + len(CPU_WORKERS))  # io-fetch
                 + 3 * len(sizes.crossover_iterations)  # pool-crossover
                 + (len(CPU_WORKERS) + 1))  # startup
    cpu = _cpu_normalise(session, sizes, has_numba)
    io = _io_fetch(session, sizes)
    per_task_us, speedups = _pool_crossover(session, sizes)
    _startup(session)

    if missing("matplotlib"):
        session.skip("plots", "matplotlib not installed")
        return
    for name, fig in figures(cpu, io, per_task_us, speedups, sizes).items():
        session.savefig(fig, name)


PLOTS = ("kernels_cpu.png", "kernels_io.png", "kernels_crossover.png")


def figures(cpu: Mapping[str, Timing], io: Mapping[str, Timing], per_task_us: list[float],
            speedups: Mapping[str, list[float]], sizes: Sizes, caption: str | None = None) -> dict[str, Any]:
    """Filename -> figure for the measured timings (``minidl_bench.replot`` passes them read from the CSV)."""
    from minidl_bench import plot

    # From 3 ms (NumPy) to 0.7 s (pure Python): decades, so dots on a log axis, not bars.
    title = f"Normalise {sizes.images} images (32x32 RGB) by each method"
    cpu_fig = plot.dot_times(cpu, title=title, what="time per batch", baseline="python serial", caption=caption)
    title = f"Fetch {sizes.samples} samples with {sizes.latency * 1e3:g} ms of simulated I/O wait each"
    io_fig = plot.bar_times(io, title=title, what="time per batch", baseline="serial", log=False, caption=caption)
    title = f"When does a Pool pay? {sizes.crossover_tasks} Monte-Carlo tasks, one per message"
    crossover = plot.line_plot(per_task_us, speedups, logx=True, logy=True, title=title, caption=caption,
                               xlabel="work per task (µs of serial compute, log scale)",
                               ylabel="speedup over a serial loop (log scale)",
                               hlines={"break-even": 1.0, "2 workers": 2.0})
    return dict(zip(PLOTS, (cpu_fig, io_fig, crossover)))


def _cpu_normalise(session: Session, sizes: Sizes, has_numba: bool) -> dict[str, Timing]:
    images = make_images(sizes.images, seed=0)
    reference = np.stack(map_serial(normalise_image, images))
    row = {"size": sizes.images}

    def timed(method: str, fn: Callable[[], np.ndarray], **kw: Any) -> Timing:
        return _checked(session, "cpu-normalise", method, fn, reference, **row, **kw)

    timings = {"python serial": timed("python serial", lambda: np.stack(map_serial(normalise_image, images)),
                                      baseline=True)}
    for k in CPU_WORKERS:
        with ThreadPoolExecutor(k) as ex:
            timings[f"threads x{k}"] = timed(
                "threads", lambda ex=ex: np.stack(map_threads(normalise_image, images, ex)), workers=k)
    for k in CPU_WORKERS:
        with make_pool(k) as pool:
            timings[f"pool x{k}"] = timed("pool", lambda pool=pool: np.stack(map_pool(normalise_image, images, pool)),
                                          workers=k, note=f"start method {multiprocessing.get_start_method()}")
    timings["numpy per sample"] = timed("numpy per sample", lambda: np.stack(map_serial(normalise_numpy, images)))
    timings["numpy batch"] = timed("numpy batch", lambda: normalise_numpy(images))
    if not has_numba:
        session.skip("numba rows", "numba not installed")
        return timings
    import numba

    for parallel, label in ((False, "numba"), (True, "numba parallel")):
        fn = compile_numba(parallel)
        start = time.perf_counter()
        fn(images)  # the first call compiles: timed alone here, and checked with the steady state below
        first = time.perf_counter() - start
        workers = numba.get_num_threads() if parallel else 1
        timings[f"{label} first call"] = Timing(first, first, first, 1, first)
        session.record("cpu-normalise", f"{label} first call", timings[f"{label} first call"], **row,
                       workers=workers, note="compile + one run: once per process, so a single measurement")
        timings[label] = timed(label, lambda fn=fn: fn(images), workers=workers)
    return timings


def _io_fetch(session: Session, sizes: Sizes) -> dict[str, Timing]:
    fetch = functools.partial(fetch_sample, latency=sizes.latency)
    indices = range(sizes.samples)
    reference = map_serial(fetch, indices)
    row = {"size": sizes.samples}
    timings = {"serial": _checked(session, "io-fetch", "serial", functools.partial(map_serial, fetch, indices),
                                  reference, **row, baseline=True)}
    for k in IO_THREADS:
        with ThreadPoolExecutor(k) as ex:
            timings[f"threads x{k}"] = _checked(session, "io-fetch", "threads",
                                                functools.partial(map_threads, fetch, indices, ex), reference,
                                                **row, workers=k)
    for k in CPU_WORKERS:
        with make_pool(k) as pool:
            timings[f"pool x{k}"] = _checked(session, "io-fetch", "pool",
                                             functools.partial(map_pool, fetch, indices, pool), reference,
                                             **row, workers=k)
    return timings


def _pool_crossover(session: Session, sizes: Sizes) -> tuple[list[float], dict[str, list[float]]]:
    """Speedup over a plain loop against work per task, one task per message (``chunksize=1``)."""
    per_task_us: list[float] = []
    speedups: dict[str, list[float]] = {"pool x2": [], "threads x2": []}
    with make_pool(2) as pool, ThreadPoolExecutor(2) as ex:
        for iterations in sizes.crossover_iterations:
            tasks = [(iterations, seed) for seed in range(sizes.crossover_tasks)]
            reference = map_serial(monte_carlo_hits, tasks)
            row = {"size": iterations}
            base = _checked(session, "pool-crossover", "serial", functools.partial(map_serial, monte_carlo_hits, tasks),
                            reference, **row, baseline=True).median
            pooled = _checked(session, "pool-crossover", "pool",
                              functools.partial(map_pool, monte_carlo_hits, tasks, pool, 1), reference, **row,
                              workers=2, note="chunksize=1")
            threaded = _checked(session, "pool-crossover", "threads",
                                functools.partial(map_threads, monte_carlo_hits, tasks, ex), reference, **row,
                                workers=2)
            per_task_us.append(base / len(tasks) * 1e6)
            speedups["pool x2"].append(base / pooled.median)
            speedups["threads x2"].append(base / threaded.median)
    return per_task_us, speedups


def _startup(session: Session) -> None:
    method = multiprocessing.get_start_method()
    for k in CPU_WORKERS:
        session.measure("startup", "pool", functools.partial(pool_round_trip, k), size=k, workers=k,
                        note=f"start, one trivial task per worker, stop; start method {method}")
    session.measure("startup", "threads", functools.partial(threads_round_trip, 2), size=2, workers=2,
                    note="the same for a ThreadPoolExecutor")


def _checked(session: Session, task: str, method: str, fn: Callable[[], Any], reference: Any,
             **row: Any) -> Timing:
    """Check ``fn``'s answer against ``reference``, then time it: a wrong answer is never timed."""
    if not all_close({method: np.asarray(fn())}, np.asarray(reference))[method]:
        raise AssertionError(f"[{session.suite}] {task}: {method} disagrees with the serial result")
    return session.measure(task, method, fn, **row)
