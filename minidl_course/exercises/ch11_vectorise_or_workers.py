"""Checker for ch11, vectorise or add workers: ``transform_sample`` and ``transform_batch`` give the row loop's values
in a few whole-array operations; the learner's epoch times and choice are held to their notebook's epochs."""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from minidl.dataloader import DataLoader
from minidl.dataset import TensorDataset
from minidl_course.cores import core_count
from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, call, first_hint

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
IMAGES, SIZE, BATCH = 384, 32, 32
BAND = 1.15  # epochs within this factor of each other: either choice is accepted
TIMES_FACTOR = 1.1  # your times within this factor (and 2 ms) of the median of your latest epochs (2 or more)
WORKERS = core_count()  # option 1's worker processes: one per core, the most that workers can give
EPOCHS: deque[tuple[str, float]] = deque(maxlen=4096)  # (option, seconds) of each epoch run, on the checker's clock
NOT_VECTORISED = ("a loop over the images or rows, a comprehension or a map (even one run in C) is not vectorised: "
                  "write a few operations on the whole array, as many for any size.")


def make_images(n: int = IMAGES, size: int = SIZE, seed: int = 0) -> np.ndarray:
    """``n`` random uint8 RGB images, ``(n, size, size, 3)``."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)


def per_sample_transform(image: np.ndarray) -> np.ndarray:
    """One ``(H, W, 3)`` uint8 image to float32 ``(3, H, W)``: ``(x / 255 - MEAN[c]) / STD[c]``, one row at a time."""
    height, width, channels = image.shape
    out = np.empty((channels, height, width), dtype=np.float32)
    for c in range(channels):
        for y in range(height):
            out[c, y] = (image[y, :, c].astype(np.float32) / np.float32(255) - MEAN[c]) / STD[c]
    return out


class ImageDataset(TensorDataset):
    """``ImageDataset(images)[i]`` is ``per_sample_transform(images[i])``: option 1's dataset."""

    def __getitem__(self, index: int) -> np.ndarray:
        return per_sample_transform(self.tensors[0][index])


@contextmanager
def _logged(option: str) -> Iterator[None]:  # the block's seconds, noted in EPOCHS (if it doesn't raise)
    start = time.perf_counter()
    yield
    EPOCHS.append((option, time.perf_counter() - start))


def workers_epoch(images: np.ndarray, num_workers: int = WORKERS) -> None:
    """Option 1: the per-sample transform inside the dataset, ``num_workers`` worker processes (one per core)."""
    with _logged("workers"), warnings.catch_warnings(action="ignore"):  # more workers than cores, if core_count() says
        for _ in DataLoader(ImageDataset(images), batch_size=BATCH, num_workers=num_workers, collate_fn=np.stack):
            pass


def vectorised_epoch(images: np.ndarray, transform_batch: Callable[[np.ndarray], np.ndarray]) -> None:
    """Option 2: raw images, no workers, ``transform_batch`` on each batch."""
    with _logged("vectorised"):
        for batch in DataLoader(images, batch_size=BATCH, collate_fn=np.stack):
            transform_batch(batch)


def compare_transforms(transform_sample: Callable, transform_batch: Callable, rounds: int = 5) -> dict[str, float]:
    """Seconds for a batch of ``BATCH`` images, printed: the row loop per image, whole-array per image, per batch."""
    batch = make_images(BATCH, seed=1)
    times = {name: statistics.median(t) for name, t in harness.interleaved({
        "the row loop, per image": lambda: np.stack([per_sample_transform(image) for image in batch]),
        "whole-array, per image": lambda: np.stack([transform_sample(image) for image in batch]),
        "whole-array, per batch": lambda: transform_batch(batch)}, rounds).items()}
    (loop, a), (sample, b), (whole, c) = times.items()
    print(f"One batch of {BATCH} images ({SIZE}x{SIZE}), median of {rounds} rounds: {loop} {a * 1e3:.2f} ms; "
          f"{sample} {b * 1e3:.2f} ms (x{a / b:.1f}: the row loop removed); {whole} {c * 1e3:.2f} ms (x{b / c:.2f} "
          "on top: batching)")
    return times


class Measured(NamedTuple):
    """Each option's epochs your notebook ran, in seconds, on the checker's clock."""
    workers: list[float]
    vectorised: list[float]


def measure() -> Measured:
    return Measured(*([s for o, s in EPOCHS if o == option] for option in ("workers", "vectorised")))


def check_decision(transform_sample: Callable[[np.ndarray], np.ndarray],
                   transform_batch: Callable[[np.ndarray], np.ndarray], seconds: Any, choice: Any,
                   measure: Callable[[], Measured] = measure) -> Measured:
    """Check ch11: both transforms right and vectorised; ``seconds`` your median epochs, ``choice`` the faster."""
    def check_first(checks: _Checks) -> None:
        check_transforms(transform_sample, transform_batch, checks)
        case = f"seconds = {seconds!r}, choice = {choice!r}"
        if not isinstance(seconds, dict) or set(seconds) != {"workers", "vectorised"}:
            checks.fail(case, "seconds should be a dict with the keys 'workers' and 'vectorised'",
                        "put your two median epoch times in seconds under those keys.")
        for key, value in seconds.items():
            if not harness.positive_numbers([value]):
                checks.fail(case, f"seconds[{key!r}] should be a positive number of seconds, but it is {value!r}")
        if choice not in ("vectorise", "workers"):
            checks.fail(case, f"choice should be one of ('vectorise', 'workers'), but it is {choice!r}")
        checks.passed += 1
    def report(m: Measured) -> str:
        return "Your notebook's epochs, on the checker's clock: " + "; ".join(
            f"{key} " + (", ".join(f"{s * 1e3:.0f}" for s in getattr(m, key)[-8:]) or "none") + " ms"
            for key in ("workers", "vectorised"))
    return harness.measure_then_judge([transform_sample, transform_batch], check_first, measure, report,
                                      lambda measured, checks: judge(seconds, choice, measured, checks))


def check_transforms(transform_sample: Callable, transform_batch: Callable, checks: _Checks) -> None:
    """Both transforms against the row loop on a few images, then their Python steps on two sizes."""
    for n, size, seed in ((1, 4, 0), (3, 5, 1), (BATCH, SIZE, 2)):
        images = make_images(n, size, seed)
        want = np.stack([per_sample_transform(image) for image in images])
        _check_values(transform_batch, "transform_batch", images, want, f"make_images({n}, size={size}, seed={seed})"
                      f", a ({n}, {size}, {size}, 3) uint8 batch", checks)
        _check_values(transform_sample, "transform_sample", images[0], want[0], f"make_images({n}, size={size}, "
                      f"seed={seed})[0], a ({size}, {size}, 3) uint8 image", checks)
    for fn, name, small, large, what in ((transform_sample, "transform_sample", make_images(1, 4)[0],
                                          make_images(1, 36)[0], "rows"),
                                         (transform_batch, "transform_batch", make_images(4, 8), make_images(36, 8),
                                          "images")):
        few, many = (python_steps(fn, name, x) for x in (small, large))
        if many - few >= 16:
            checks.fail(f"{name} on {4} and on {36} {what}", f"it ran {few} steps of Python (lines, calls, arrays "
                        f"made) for 4 {what} and {many} for 36: work for every one of the {what}", NOT_VECTORISED)
        checks.passed += 1


def _check_values(fn: Callable, name: str, x: np.ndarray, want: np.ndarray, case: str, checks: _Checks) -> None:
    case, before = f"{name}({case})", x.copy()
    got = call(fn, x, what=name, case=case)
    axes = "x.transpose(0, 3, 1, 2) turns (B, H, W, 3)" if x.ndim == 4 else "x.transpose(2, 0, 1) turns (H, W, 3)"
    checks.first(case, (not np.array_equal(x, before), f"{name} changed its input", "make new arrays; don't write "
                        "into the input."),
                 (not isinstance(got, np.ndarray), f"should return a numpy.ndarray, but it returned {type(got)}", ""))
    checks.first(case, (got.shape != want.shape, f"the result should have shape {want.shape}, but it has {got.shape}",
                        f"channels first: {axes} to channels first." if got.shape == x.shape else
                        "the same values as per_sample_transform: one (3, H, W) per image."),
                 (got.dtype != np.float32, f"the result should be float32, but it is {got.dtype}", "keep every "
                  "constant float32 (astype(np.float32)): a float64 array, or 255.0 with NumPy < 2, upcasts it all."))
    if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
        at = tuple(int(i) for i in np.argwhere(~np.isclose(got, want, rtol=1e-5, atol=1e-5))[0])
        shape = (1, 3, 1, 1)[4 - x.ndim:]
        unscaled = (np.moveaxis(x, -1, -3) - MEAN.reshape(shape)) / STD.reshape(shape)
        checks.fail(case, f"result{list(at)} should be {float(want[at]):.5f}, but it is {float(got[at]):.5f}",
                    "divide by 255 first: MEAN and STD are for values in [0, 1]." if np.allclose(
                        got, unscaled, rtol=1e-4, atol=1e-3) else f"(x / 255 - MEAN[c]) / STD[c] per channel c: "
                    f"MEAN.reshape{shape} broadcasts over the channels.")
    checks.passed += 1


class _Counted(np.ndarray):
    """An array that counts the arrays made from it (views, slices, rows), however they are made, C code included."""
    made = 0

    def __array_finalize__(self, obj: Any) -> None:
        _Counted.made += 1


def python_steps(fn: Callable[[np.ndarray], Any], name: str, x: np.ndarray) -> int:
    """Lines and calls ``fn(x)`` runs in Python (NumPy's one call each), and arrays made from ``x``, however made."""
    count, _Counted.made = [0], 0
    def trace(frame, event, arg):
        count[0] += 1
        return None if frame.f_globals.get("__name__", "").startswith("numpy") else trace
    counted = x.view(_Counted)
    saved = sys.gettrace()
    sys.settrace(trace)
    try:
        call(fn, counted, what=name, case=f"an input of shape {x.shape}")
    finally:
        sys.settrace(saved)
    return count[0] + _Counted.made


def judge(seconds: dict[str, Any], choice: str, measured: Measured, checks: _Checks | None = None) -> None:
    """Your times held to the epochs your notebook ran, on the checker's clock; your choice to your times."""
    checks = checks or _Checks()
    for key in ("workers", "vectorised"):
        epochs, value = getattr(measured, key), float(seconds[key])
        case = f"seconds[{key!r}] = {seconds[key]!r}, against the {key} epochs your notebook ran"
        if not epochs:
            checks.fail(case, f"no {key} epoch ran in your notebook", f"time {key}_epoch(...) in your rounds: it "
                        "notes each epoch on the checker's clock.")
        medians = harness.latest_medians(epochs, 2)
        if harness.typed(value) or not any(abs(value - m) <= m * (TIMES_FACTOR - 1) + 2e-3 for m in medians):
            other = [m for o in seconds if o != key for m in medians if harness.close(float(seconds[o]), m, 1.1)]
            checks.fail(case, f"{value} is not the median of your latest epochs (2 or more): they took "
                        + ", ".join(f"{s:.4f}" for s in epochs[-8:]) + " s", first_hint(
                            "set seconds from your own rounds: {name: statistics.median(times[name])}, unrounded; if "
                            "you ran epochs since, run your cell again.",
                            (any(harness.close(value / 1000, m, TIMES_FACTOR) for m in medians), harness.MILLISECONDS),
                            (bool(other), f"your two times are swapped: 'workers' is the row loop in {WORKERS} "
                             "workers.")))
        checks.passed += 1
    best, gap = min(seconds, key=seconds.get), max(seconds.values()) / min(seconds.values())
    best = "vectorise" if best == "vectorised" else "workers"
    if gap < BAND:
        print(f"your two options are within {BAND}x of each other ({gap:.2f}x), so either choice is accepted")
    elif choice != best:
        checks.fail(f"choice={choice!r}", f"your times say {best!r} is faster, by {gap:.2f}x", "choose the faster "
                    "option, as your times say: the row loop's Python runs on every core a worker has; removing it "
                    f"removes that work, workers only share it among {WORKERS}.")
    checks.passed += 1
