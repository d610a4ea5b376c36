"""Checker for ch11: vectorise a transform, or add workers? ``transform_batch`` must give ``per_sample_transform``'s
values in a few whole-array operations; the learner's times and choice are held to the checker's own rounds."""

from __future__ import annotations

import statistics
import sys
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from minidl.dataloader import DataLoader
from minidl.dataset import TensorDataset
from minidl_course.cores import core_count
from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, call

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
IMAGES, SIZE, BATCH, ROUNDS = 384, 32, 32, 3
BAND = 1.15  # epochs within this factor of each other: either choice is accepted
SPEEDUP_FACTOR = 2.0  # your times' ratio within this factor of the median of the checker's rounds (short epochs)
SMALL, LARGE = 4, 36  # batch sizes whose Python steps are compared: a vectorised transform's don't grow
WORKERS = core_count()  # option 1's worker processes: one per core, the most that workers can give


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


def workers_epoch(images: np.ndarray, num_workers: int = WORKERS) -> None:
    """Option 1: the per-sample transform inside the dataset, ``num_workers`` worker processes (one per core)."""
    with warnings.catch_warnings(action="ignore"):
        for _ in DataLoader(ImageDataset(images), batch_size=BATCH, num_workers=num_workers, collate_fn=np.stack):
            pass


def vectorised_epoch(images: np.ndarray, transform_batch: Callable[[np.ndarray], np.ndarray]) -> None:
    """Option 2: raw images, no workers, ``transform_batch`` on each batch."""
    for batch in DataLoader(images, batch_size=BATCH, collate_fn=np.stack):
        transform_batch(batch)


class Measured(NamedTuple):
    """Each option's seconds per epoch, a round each, and transform_batch's speed-up over the loop on one batch."""
    workers: list[float]
    vectorised: list[float]
    batch_speedup: float

    @property
    def speedup(self) -> float:
        """The median over rounds of workers' epoch / vectorised epoch (below 1: vectorising is slower)."""
        return harness.median_ratio(self._asdict(), "workers", "vectorised")


def measure(transform_batch: Callable[[np.ndarray], np.ndarray], rounds: int = ROUNDS) -> Measured:
    """Both epochs in interleaved rounds after a warm-up, and both transforms on one batch (medians of 5)."""
    images, batch = make_images(), make_images(BATCH, seed=1)
    one = harness.interleaved({"loop": lambda: np.stack([per_sample_transform(image) for image in batch]),
                               "batch": lambda: transform_batch(batch)}, rounds=5)
    times = harness.interleaved({"workers": lambda: workers_epoch(images),
                                 "vectorised": lambda: vectorised_epoch(images, transform_batch)}, rounds=rounds)
    return Measured(times["workers"], times["vectorised"], harness.median_ratio(one, "loop", "batch"))


def check_decision(transform_batch: Callable[[np.ndarray], np.ndarray], seconds: Any, choice: Any,
                   measure: Callable[[Callable], Measured] = measure) -> Measured:
    """Check ch11: ``transform_batch`` is right and vectorised; ``seconds`` (``{"workers": s, "vectorised": s}``) and
    ``choice`` match the checker's rounds. Prints what it measured; raises AssertionError at the first problem."""
    def check_first(checks: _Checks) -> None:
        check_transform(transform_batch, checks)
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
    return harness.measure_then_judge(
        [transform_batch], check_first,
        lambda: harness.unless_close(lambda: measure(transform_batch), float(seconds["workers"]) / float(
            seconds["vectorised"]), lambda m: m.speedup, SPEEDUP_FACTOR),
        lambda m: (f"Measured: an epoch of {IMAGES} images takes {statistics.median(m.workers) * 1e3:.0f} ms with "
                   f"the per-sample transform in {WORKERS} workers, {statistics.median(m.vectorised) * 1e3:.0f} ms "
                   f"vectorised with no workers ({m.speedup:.1f}x); transform_batch is {m.batch_speedup:.0f}x faster "
                   "than the per-sample loop on one batch"),
        lambda measured, checks: judge(seconds, choice, measured, checks))


def check_transform(transform_batch: Callable[[np.ndarray], np.ndarray], checks: _Checks) -> None:
    """``transform_batch`` against the per-sample loop on three batches, then its Python steps on two batch sizes."""
    for n, size, seed in ((1, 4, 0), (3, 5, 1), (BATCH, SIZE, 2)):
        images = make_images(n, size, seed)
        case = f"transform_batch(make_images({n}, size={size}, seed={seed})), a ({n}, {size}, {size}, 3) uint8 batch"
        want = np.stack([per_sample_transform(image) for image in images])
        got = call(transform_batch, images, what="transform_batch", case=case)
        if not np.array_equal(images, make_images(n, size, seed)):
            checks.fail(case, "transform_batch changed its input", "make new arrays; don't write into the batch.")
        if not isinstance(got, np.ndarray):
            checks.fail(case, f"should return a numpy.ndarray, but it returned {type(got).__name__}")
        if got.shape != want.shape:
            checks.fail(case, f"the result should have shape {want.shape}, but it has {got.shape}", "channels first: "
                        "x.transpose(0, 3, 1, 2) turns (B, H, W, 3) to (B, 3, H, W)." if got.shape == images.shape else
                        "the same values as per_sample_transform, stacked: one (3, H, W) per image.")
        if got.dtype != np.float32:
            checks.fail(case, f"the result should be float32, but it is {got.dtype}", "keep every constant float32 "
                        "(astype(np.float32)): a float64 array, or 255.0 with NumPy < 2, upcasts it all.")
        if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            at = tuple(int(i) for i in np.argwhere(~np.isclose(got, want, rtol=1e-5, atol=1e-5))[0])
            unscaled = (images.transpose(0, 3, 1, 2) - MEAN.reshape(1, 3, 1, 1)) / STD.reshape(1, 3, 1, 1)
            checks.fail(case, f"result{list(at)} should be {float(want[at]):.5f}, but it is {float(got[at]):.5f}",
                        "divide by 255 first: MEAN and STD are for values in [0, 1]." if np.allclose(
                            got, unscaled, rtol=1e-4, atol=1e-3) else "(x / 255 - MEAN[c]) / STD[c] per channel c: "
                        "MEAN.reshape(1, 3, 1, 1) broadcasts over (B, 3, H, W).")
        checks.passed += 1
    small, large = (python_steps(transform_batch, make_images(b, 8, seed=3)) for b in (SMALL, LARGE))
    if large - small >= (LARGE - SMALL) / 2:
        checks.fail(f"transform_batch on batches of {SMALL} and of {LARGE} images", f"it ran {small} steps of Python "
                    f"for {SMALL} images and {large} for {LARGE}: Python work for every image", "a loop over the "
                    "images or rows, a comprehension or a map is not vectorised: write a few operations on the whole "
                    "(B, H, W, 3) array, as many for any B.")
    checks.passed += 1


def python_steps(fn: Callable[[np.ndarray], Any], batch: np.ndarray) -> int:
    """Lines and calls run in Python by ``fn(batch)``, NumPy's own Python one call each: a loop grows with the batch."""
    count = [0]
    def trace(frame, event, arg):
        count[0] += 1
        return None if frame.f_globals.get("__name__", "").startswith("numpy") else trace
    saved = sys.gettrace()
    sys.settrace(trace)
    try:
        call(fn, batch, what="transform_batch", case=f"a batch of {len(batch)} images")
    finally:
        sys.settrace(saved)
    return count[0]


def judge(seconds: dict[str, Any], choice: str, measured: Measured, checks: _Checks | None = None) -> None:
    """The verdict on the reported times and the choice, from the checker's measurement alone."""
    checks, reported = checks or _Checks(), float(seconds["workers"]) / float(seconds["vectorised"])
    case = (f"your times, workers {seconds['workers']} s and vectorised {seconds['vectorised']} s ({reported:.2f}x), "
            f"against the {measured.speedup:.2f}x measured")
    if any(harness.typed(float(s)) for s in seconds.values()):
        checks.fail(case, "a time with at most three decimals", harness.TYPED.replace(
            "speedup = statistics.median(rounds)", "statistics.median(times['workers'])"))
    for key in ("workers", "vectorised"):
        if float(seconds[key]) > 100 * (ours := statistics.median(getattr(measured, key))):
            checks.fail(case, f"seconds[{key!r}] is {seconds[key]}, but the checker's epochs took {ours:.3f} s",
                        harness.MILLISECONDS)
    harness.judge_figure(
        checks, case, "the ratio of your times", reported, [measured.speedup], SPEEDUP_FACTOR, "",
        f"it is more than {SPEEDUP_FACTOR}x from the median of the checker's rounds (measured twice if the first "
        "disagreed)", "time whole epochs of both options in interleaved rounds, workers started inside the timed part, "
        "and report each option's median.",
        f"your two times are swapped: 'workers' is the per-sample transform in {WORKERS} workers.")
    best, gap = ("vectorise", measured.speedup) if measured.speedup > 1 else ("workers", 1 / measured.speedup)
    if gap < BAND:
        print(f"the two options are within {BAND}x of each other here ({gap:.2f}x), so either choice is accepted")
    elif choice != best:
        checks.fail(f"choice={choice!r}; the checker measured {best!r} faster by {gap:.2f}x", f"{choice!r} is "
                    f"{gap:.2f}x slower than {best!r}", "your times show the vectorised epoch faster: choose "
                    "'vectorise'." if choice == "workers" and reported > 1 else "choose the faster option, as your "
                    f"times say: vectorising removes Python work on every core; workers spread it over {WORKERS}.")
    checks.passed += 1
