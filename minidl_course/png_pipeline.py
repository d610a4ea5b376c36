"""One realistic per-sample pipeline, written four ways, for notebook 11 and ``python -m minidl_bench pipeline``.

A sample is a small RGB image stored the way PNG stores one: each byte is the difference from its left
neighbour (PNG's "Sub" filter), then zlib-compressed. Loading it is *decode* (decompress, undo the filter)
plus *augment* (a random crop, a random horizontal flip, a brightness gain, then normalise to a
channels-first float32 array). The same transform comes as (a) a pure-Python loop, (b) NumPy per sample,
(c) NumPy on the whole batch after collate, (d) Numba kernels compiled from the loop in (a).

Every sample's augmentation is drawn once from the seed, per index, so every variant, loader, worker and
worker method gives the very same batch; every variant computes in float64 in the same order and rounds
to float32 at the end, so the outputs are identical, not merely close. The datasets live here, at module
top level, so process workers (``spawn`` included) and thread workers can load them.
"""

from __future__ import annotations

import multiprocessing
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from minidl.collate import numpy_collate

MEAN = (0.485, 0.456, 0.406)  # ImageNet's channel statistics, as in torchvision's Normalize
STD = (0.229, 0.224, 0.225)
NUM_CLASSES = 10
_MEAN = np.array(MEAN)  # float64, like the Python floats the loop uses
_STD = np.array(STD)

Sample = tuple[np.ndarray, int]  # (3 x size x size float32 image, label)


# --- the stored images --------------------------------------------------------------------------------

def make_images(n: int, side: int, seed: int = 0) -> np.ndarray:
    """``n`` uint8 images (n, side, side, 3): a smooth colour gradient plus noise, the same for the same seed."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, side)
    slopes = rng.uniform(-120, 120, size=(n, 1, 1, 3, 2))  # per image and channel: how the colour drifts in y, x
    base = rng.uniform(60, 200, size=(n, 1, 1, 3)) + slopes[..., 0] * ramp[:, None, None] \
        + slopes[..., 1] * ramp[None, :, None]
    noise = rng.integers(-12, 13, size=(n, side, side, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def encode(image: np.ndarray) -> bytes:
    """PNG's Sub filter (each byte minus its left neighbour, mod 256) along every row, then zlib."""
    diff = np.diff(image, axis=1, prepend=np.zeros_like(image[:, :1]))  # uint8 arithmetic wraps mod 256
    return zlib.compress(diff.tobytes(), 1)


class EncodedImages:
    """``n`` zlib-compressed, Sub-filtered images of ``side + pad`` pixels a side, and each one's augmentation.

    The crop offsets, flips and gains are drawn once from ``seed``: sample ``i`` is augmented the same way in
    every process and thread (a training run would draw afresh each epoch, seeded by epoch and index).
    """

    def __init__(self, n: int, side: int = 32, pad: int = 8, seed: int = 0) -> None:
        self.n, self.side, self.pad = n, side, pad
        self.blobs = [encode(image) for image in make_images(n, side + pad, seed)]
        rng = np.random.default_rng([seed, 1])
        self.offsets = rng.integers(0, pad + 1, size=(n, 2))  # (y0, x0) of each crop
        self.flips = rng.random(n) < 0.5
        self.gains = rng.uniform(0.8, 1.2, size=n)  # brightness jitter

    def __len__(self) -> int:
        return self.n

    def raw(self, index: int) -> np.ndarray:
        """Sample ``index`` decompressed: its filtered bytes, (side+pad, side+pad, 3) uint8. zlib runs in C."""
        full = self.side + self.pad
        return np.frombuffer(zlib.decompress(self.blobs[index]), dtype=np.uint8).reshape(full, full, 3)

    def params(self, index: int) -> tuple[int, int, bool, float]:
        """Sample ``index``'s augmentation: crop offsets y0 and x0, whether to flip, the gain."""
        y0, x0 = self.offsets[index]
        return int(y0), int(x0), bool(self.flips[index]), float(self.gains[index])

    def label(self, index: int) -> int:
        return index % NUM_CLASSES


# --- (a) the pure-Python loop: also the source Numba compiles --------------------------------------------

def decode_augment_into(raw: np.ndarray, y0: int, x0: int, flip: bool, gain: float, out: np.ndarray) -> None:
    """raw (H, W, 3) filtered uint8 -> out (3, S, S) float32: undo the filter, crop, flip, gain, normalise."""
    height, width, channels = raw.shape
    size = out.shape[1]
    image = np.empty((height, width, channels), dtype=np.uint8)
    for y in range(height):  # decode: a running sum along each row, mod 256
        for c in range(channels):
            left = 0
            for x in range(width):
                left = (left + int(raw[y, x, c])) & 255
                image[y, x, c] = left
    for c in range(channels):  # augment: every output pixel, one Python float at a time
        mean, std = MEAN[c], STD[c]
        for y in range(size):
            for x in range(size):
                source = x0 + size - 1 - x if flip else x0 + x
                v = min(int(image[y0 + y, source, c]) * gain, 255.0) / 255.0
                out[c, y, x] = (v - mean) / std


# --- (b) NumPy, one sample at a time ---------------------------------------------------------------------

def decode_augment_numpy(raw: np.ndarray, y0: int, x0: int, flip: bool, gain: float, size: int) -> np.ndarray:
    """The same transform with whole-array operations on one sample; returns (3, size, size) float32."""
    image = np.add.accumulate(raw, axis=1, dtype=np.uint8)  # undo the filter: uint8 sums wrap mod 256
    crop = image[y0:y0 + size, x0:x0 + size]
    if flip:
        crop = crop[:, ::-1]
    v = np.minimum(crop * gain, 255.0) / 255.0  # uint8 * Python float -> float64, as in the loop
    return np.ascontiguousarray(((v - _MEAN) / _STD).astype(np.float32).transpose(2, 0, 1))


# --- (c) NumPy, the whole batch at once, after collate ---------------------------------------------------

def decode_augment_batch(raw: np.ndarray, y0: np.ndarray, x0: np.ndarray, flip: np.ndarray, gain: np.ndarray,
                         size: int) -> np.ndarray:
    """The same transform on a stacked batch: raw (B, H, W, 3) -> (B, 3, size, size) float32, no Python loop."""
    images = np.add.accumulate(raw, axis=2, dtype=np.uint8)
    windows = sliding_window_view(images, (size, size), axis=(1, 2))  # (B, H-size+1, W-size+1, 3, size, size)
    crops = windows[np.arange(len(raw)), y0, x0]  # each sample's own crop, already channels-first
    crops = np.where(flip[:, None, None, None], crops[..., ::-1], crops)
    # In place: a batch's float64 temporaries are large, and every new one costs a fresh allocation.
    v = crops * gain[:, None, None, None]
    np.minimum(v, 255.0, out=v)
    v /= 255.0
    v -= _MEAN[:, None, None]
    v /= _STD[:, None, None]
    return v.astype(np.float32)


def collate_and_augment(samples: Sequence[tuple], size: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``collate_fn`` for ``BatchPipeline`` (bind ``size``): stack the raw samples, then augment the batch at once."""
    raw, y0, x0, flip, gain, labels = numpy_collate(samples)
    return decode_augment_batch(raw, y0, x0, flip, gain, size), labels


# --- (d) Numba: the loop in (a), compiled ----------------------------------------------------------------

# NOTE [one entry point per Numba build]: cache=True writes the compiled code to __pycache__, keyed by the
# function and its argument types but not by options such as nogil, so a nogil and a GIL-holding build of one
# function would share one cache entry. Each cached build therefore compiles its own one-line entry point;
# register_jitable lets both call decode_augment_into, which stays an ordinary Python function.

def _kernel_gil(raw, y0, x0, flip, gain, out):  # compiled by Numba: see the NOTE above
    decode_augment_into(raw, y0, x0, flip, gain, out)


def _kernel_nogil(raw, y0, x0, flip, gain, out):
    decode_augment_into(raw, y0, x0, flip, gain, out)


KERNELS = ("compile", "cache", "nogil")  # what NumbaPipeline(kernel=...) and build_kernel() accept
_registered: list[bool] = []


def build_kernel(kind: str) -> Callable:
    """A new Numba dispatcher for ``decode_augment_into``; it compiles (or loads from the cache) on its first call.

    ``"compile"``: ``@njit``, compiled afresh in every process; ``"cache"``: ``@njit(cache=True)``, loaded from
    disk after the first compile anywhere; ``"nogil"``: ``@njit(nogil=True, cache=True)``, which also lets go of
    the GIL while it runs, so thread workers can run it at once.
    """
    import numba
    from numba.extending import register_jitable

    if kind not in KERNELS:
        raise ValueError(f"kind should be one of {KERNELS}, but got kind={kind!r}")
    if kind == "compile":
        return numba.njit(decode_augment_into)
    if not _registered:  # once per process: a second registration would make two candidates for one call
        register_jitable(decode_augment_into)
        _registered.append(True)
    if kind == "cache":
        return numba.njit(cache=True)(_kernel_gil)
    return numba.njit(nogil=True, cache=True)(_kernel_nogil)


# --- the datasets, one per variant -----------------------------------------------------------------------

class LoopPipeline(EncodedImages):
    """(a) Every sample through the pure-Python loop: the GIL is held the whole time."""

    def __getitem__(self, index: int) -> Sample:
        out = np.empty((3, self.side, self.side), dtype=np.float32)
        decode_augment_into(self.raw(index), *self.params(index), out)
        return out, self.label(index)


class NumpyPipeline(EncodedImages):
    """(b) Every sample through ``decode_augment_numpy``: a dozen array operations per sample."""

    def __getitem__(self, index: int) -> Sample:
        return decode_augment_numpy(self.raw(index), *self.params(index), self.side), self.label(index)


class BatchPipeline(EncodedImages):
    """(c) Samples only decompressed; load with ``collate_fn=dataset.collate_fn``, which augments the batch."""

    def __getitem__(self, index: int) -> tuple:
        return (self.raw(index), *self.params(index), self.label(index))

    @property
    def collate_fn(self) -> Callable:
        """``collate_and_augment`` bound to this dataset's crop size (a partial of a top-level function pickles)."""
        return partial(collate_and_augment, size=self.side)


class NumbaPipeline(EncodedImages):
    """(d) Every sample through a Numba kernel of the loop in (a); ``kernel`` is one of ``KERNELS``.

    Each process builds its own dispatcher on first use, so a worker compiles (or loads the cache) itself,
    unless ``warm_up()`` ran in the parent before the workers were forked: fork copies the compiled code.
    """

    def __init__(self, n: int, side: int = 32, pad: int = 8, seed: int = 0, kernel: str = "cache") -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel should be one of {KERNELS}, but got kernel={kernel!r}")
        super().__init__(n, side, pad, seed)
        self.kernel = kernel
        self._compiled: Callable | None = None  # this process's dispatcher, built on first use

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_compiled": None}  # a dispatcher pickles; compiled code does not travel

    def compiled(self) -> Callable:
        """This process's dispatcher (built, not yet compiled, on the first call)."""
        if self._compiled is None:
            self._compiled = build_kernel(self.kernel)
        return self._compiled

    def warm_up(self) -> None:
        """Compile (or load from the cache) in this process now, by transforming sample 0."""
        self[0]

    def __getitem__(self, index: int) -> Sample:
        out = np.empty((3, self.side, self.side), dtype=np.float32)
        self.compiled()(self.raw(index), *self.params(index), out)
        return out, self.label(index)


VARIANTS: dict[str, type[EncodedImages]] = {"loop": LoopPipeline, "numpy": NumpyPipeline, "batch": BatchPipeline,
                                            "numba": NumbaPipeline}


def make_dataset(variant: str, n: int, side: int = 32, seed: int = 0, **kwargs: Any) -> EncodedImages:
    """The dataset of ``variant`` ("loop", "numpy", "batch" or "numba"); the same images for the same arguments."""
    return VARIANTS[variant](n, side=side, seed=seed, **kwargs)


def collate_fn_for(dataset: Any) -> Callable:
    """What to pass as ``collate_fn``: the batch transform for a ``BatchPipeline``, ``numpy_collate`` otherwise."""
    return getattr(dataset, "collate_fn", numpy_collate)


# --- multiprocessing.Pool as a loader ----------------------------------------------------------------------

_pool_dataset: Any = None  # each Pool worker's copy of the dataset, set once by init_worker


def init_worker(dataset: Any) -> None:
    """A Pool's ``initializer``: keep ``dataset`` in this worker, so that it is sent once, not with every task."""
    global _pool_dataset
    _pool_dataset = dataset


def fetch(indices: Sequence[int], collate_fn: Callable | None = None) -> Any:
    """A Pool's task: one batch of the worker's dataset (set by ``init_worker``), collated as a DataLoader would."""
    collate_fn = collate_fn or collate_fn_for(_pool_dataset)
    return collate_fn([_pool_dataset[i] for i in indices])


def batches_of(order: Sequence[int], batch_size: int) -> list[list[int]]:
    """``order`` cut into lists of ``batch_size`` indices, the last one shorter (``drop_last=False``)."""
    return [list(order[i:i + batch_size]) for i in range(0, len(order), batch_size)]


def pool_loader(dataset: Any, batches: Sequence[Sequence[int]], processes: int,
                collate_fn: Callable | None = None, timeout: float = 120.0) -> Iterator:
    """Batches from a ``multiprocessing.Pool(processes).imap``, in order: the do-it-yourself DataLoader.

    The dataset reaches each worker once, through the Pool's initializer; each task is one batch of indices.
    The Pool starts when iteration does. ``imap`` pulls tasks from its iterable as fast as its feeder
    thread can, so the feed here waits for a free slot: at most two tasks per process are out, as a
    DataLoader's ``prefetch_factor=2``.
    Whether the epoch ends or the loop leaves early, the Pool ends as a DataLoader's workers do: the
    feed stops, the tasks already sent are waited out, then ``close()`` and ``join()`` (see ``wait_out``
    for why not ``terminate()``). A Pool replaces a worker that dies but never re-sends its batch: without
    ``timeout`` (seconds per batch, then ``multiprocessing.TimeoutError``) the loop would wait for it
    forever; then ``terminate()`` (the ``with`` block's exit) is all that is left.
    """
    task = partial(fetch, collate_fn=collate_fn or collate_fn_for(dataset))
    slots = threading.Semaphore(2 * processes)  # tasks handed to the Pool and not yet consumed
    leaving = threading.Event()

    def feed() -> Iterator[Sequence[int]]:  # runs in the Pool's feeder thread
        for indices in batches:
            while not slots.acquire(timeout=0.05):
                if leaving.is_set():
                    return
            if leaving.is_set():
                return
            yield indices

    with multiprocessing.Pool(processes, initializer=init_worker, initargs=(dataset,)) as pool:
        results = pool.imap(task, feed())
        lost_worker = False
        try:
            for _ in range(len(batches)):
                try:
                    batch = results.next(timeout)
                except multiprocessing.TimeoutError:
                    lost_worker = True
                    raise
                slots.release()
                yield batch
        finally:
            leaving.set()  # the feed ends within 0.05 s; imap's iterator then stops after the tasks already sent
            if not lost_worker:
                wait_out(results, timeout)  # left early (or a task raised): at most two per process
                pool.close()  # no task left, so the workers exit on their own
                pool.join()


def wait_out(results: Iterator, timeout: float) -> None:
    """Take and drop what an ``imap`` whose feed has ended still owes: batches, or the errors that made them fail.

    This is why a Pool left early isn't simply ``terminate()``d: that kills each worker wherever it is, and a
    worker killed halfway through sending its batch never releases the result pipe's lock. The Pool's own
    task-handler thread then waits for that lock to send its goodbye, and ``terminate()``, which joins that
    thread, waits forever (seen in one of 25 benchmark runs on a busy machine, and with batches larger
    than the pipe's buffer within ten early exits). A DataLoader ends its workers the same way for the
    same reason: it asks them to stop and joins them, and kills only a worker that outlives its timeout.
    """
    while True:
        try:
            results.next(timeout)
        except StopIteration:
            return
        except multiprocessing.TimeoutError:
            raise
        except Exception:  # noqa: BLE001, S112 - the task's own error: its worker is free again; drop it too
            continue


def serial_loader(dataset: Any, batches: Sequence[Sequence[int]], collate_fn: Callable | None = None) -> Iterator:
    """The same batches in this thread, one after another: the baseline every loader is compared with."""
    collate_fn = collate_fn or collate_fn_for(dataset)
    for indices in batches:
        yield collate_fn([dataset[i] for i in indices])


def _put_first_draw(queue: Any) -> None:
    queue.put(float(np.random.random()))


def pool_first_draws(processes: int) -> list[float]:
    """Each Pool worker's first draw from NumPy's global generator, as it starts.

    Once this process has seeded (or used) that generator, ``fork`` copies its state into every worker, and
    they all draw the same numbers. Python's own ``random`` reseeds itself in a forked child; NumPy's does not.
    """
    queue = multiprocessing.Queue()
    with multiprocessing.Pool(processes, initializer=_put_first_draw, initargs=(queue,)):
        return [queue.get(timeout=30) for _ in range(processes)]
