"""Checker for exercise ch07: what page-locking a fresh buffer for every batch costs, measured without a GPU.

The learner's ``pin_copy(batch, lock_pages)`` copies a batch into a fresh buffer locked with ``lock_pages``
(``mlock``); the checker checks the copy is right and locked, re-measures it against a copy into a reused buffer,
and holds the reported ratio and ``reuse_pays`` to that.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from minidl_course import pinning_demo
from minidl_course.exercises._common import _Checks, call
from minidl_course.exercises._measure import interleaved, judge_figure, measure_then_judge, median_ratio, unless_close

BATCH_BYTES = 2 << 20  # 2 MiB: `ulimit -l` is often 8 MiB, and lock_pages must fit under it
ROUNDS = 15
CALLS_PER_ROUND = 10
RATIO_FACTOR = 1.5  # a reported ratio within this factor of the median of the checker's rounds is accepted
REUSE_PAYS = 1.5  # measured ratio above this: reusing pays, so reuse_pays must be True
REUSE_DOES_NOT_PAY = 1.15  # below this: it must be False; in between either is accepted


def make_batch(nbytes: int = BATCH_BYTES, seed: int = 0) -> np.ndarray:
    """A uint8 batch of ``nbytes`` random bytes, shaped like 32 small RGB images (32, n / 96, 3) when it divides."""
    data = np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)
    return data.reshape(32, -1, 3) if nbytes % 96 == 0 else data


def copy_into(out: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """The baseline: copy ``batch`` into ``out``, a buffer kept from the previous batch (no allocation, no locking)."""
    np.copyto(out, batch)
    return out


class LockSpy:
    """Wraps ``lock_pages``: remembers every array it locked, so the checker can see what your code locked."""

    def __init__(self) -> None:
        self.locked: list[np.ndarray] = []

    @contextlib.contextmanager
    def __call__(self, array: np.ndarray) -> Iterator[np.ndarray]:
        self.locked.append(array)
        with pinning_demo.lock_pages(array) as locked:
            yield locked


@dataclass(frozen=True)
class Measured:
    """Seconds per batch for each way, per round, and the median of the per-round ratios."""

    pinned: list[float]
    reused: list[float]

    @property
    def ratio(self) -> float:
        return median_ratio({"pinned": self.pinned, "reused": self.reused}, "pinned", "reused")


def measure(pin_copy: Callable[..., np.ndarray], rounds: int = ROUNDS) -> Measured:
    """Time ``pin_copy(batch, lock_pages)`` against ``copy_into(reused, batch)``, interleaved rounds."""
    batch = make_batch()
    reused = np.empty_like(batch)

    def pinned_calls() -> None:
        for _ in range(CALLS_PER_ROUND):
            pin_copy(batch, pinning_demo.lock_pages)

    def reused_calls() -> None:
        for _ in range(CALLS_PER_ROUND):
            copy_into(reused, batch)

    times = interleaved({"pinned": pinned_calls, "reused": reused_calls}, rounds=rounds)
    return Measured([t / CALLS_PER_ROUND for t in times["pinned"]], [t / CALLS_PER_ROUND for t in times["reused"]])


def check_pin_copy(pin_copy: Callable[..., np.ndarray], ratio: Any, reuse_pays: Any,
                   measure: Callable[[Callable], Measured] = measure) -> Measured:
    """Check ch07: ``pin_copy`` copies into a fresh, locked buffer; ``ratio`` and ``reuse_pays`` match a measurement.

    Prints what it measured. Raises AssertionError at the first problem, with a hint.
    """
    return measure_then_judge(
        [pin_copy], lambda checks: check_copies(pin_copy, checks),
        lambda: unless_close(lambda: measure(pin_copy), ratio, lambda m: m.ratio, RATIO_FACTOR),
        lambda measured: (f"Measured: pin_copy {np.median(measured.pinned) * 1e3:.3f} ms per {BATCH_BYTES >> 20} MiB "
                          f"batch, a copy into a reused buffer {np.median(measured.reused) * 1e3:.3f} ms; ratio "
                          f"{measured.ratio:.2f} (median of {len(measured.pinned)} rounds)"),
        lambda measured, checks: judge(ratio, reuse_pays, measured, checks))


def check_copies(pin_copy: Callable[..., np.ndarray], checks: _Checks) -> None:
    returned: list[np.ndarray] = []  # every buffer returned so far, kept alive: a fresh one can't reuse their memory
    for seed, nbytes in enumerate((96 * 1024, 4096, BATCH_BYTES, BATCH_BYTES, BATCH_BYTES)):  # 3: two buffers in turn
        batch = make_batch(nbytes, seed)
        before = batch.copy()
        case = f"pin_copy(batch of {nbytes:,} bytes, shape {batch.shape}), call {seed + 1}"
        spy = LockSpy()
        out = call(pin_copy, batch, spy, what="pin_copy", case=case)
        if not isinstance(out, np.ndarray):
            checks.fail(case, f"pin_copy should return a numpy.ndarray, but it returned {type(out).__name__}",
                        "return the new buffer (a NumPy array) holding the copy.")
        if not np.array_equal(batch, before):
            checks.fail(case, "pin_copy changed the batch",
                        "copy from the batch into the new buffer, never the other way.")
        if out.shape != batch.shape or out.dtype != batch.dtype or not np.array_equal(out, batch):
            checks.fail(case, f"the copy should equal the batch (shape {batch.shape}, {batch.dtype}), but it has shape "
                              f"{out.shape}, {out.dtype}" + (" and other values" if out.shape == batch.shape else ""),
                        "np.empty_like(batch) makes a buffer of the right shape and dtype; np.copyto(out, batch) "
                        "fills it.")
        if np.shares_memory(out, batch):
            checks.fail(case, "the returned array is the batch itself (or a view of it), not a copy",
                        "pinning copies: the page-locked buffer is new memory, which the batch is copied into.")
        again = next((k for k, old in enumerate(returned) if np.shares_memory(out, old)), None)
        if again is not None:
            checks.fail(case, f"the buffer returned is the one call {again + 1} returned",
                        "this exercise measures a fresh buffer per batch: allocate it inside pin_copy (buffers kept "
                        "from earlier calls, one or several, are the reuse that ratio is compared with).")
        if not spy.locked:
            checks.fail(case, "pin_copy never called lock_pages",
                        "lock the new buffer: `with lock_pages(out):` around the copy. Copying alone (as "
                        "FakePinnable.pin_memory does) is only half of pinning.")
        if not any(np.shares_memory(locked, out) for locked in spy.locked):
            checks.fail(case, "lock_pages was called, but not on the buffer you returned",
                        "lock the new buffer you copy into, not the batch.")
        returned.append(out)
        checks.passed += 1


def judge(ratio: Any, reuse_pays: Any, measured: Measured, checks: _Checks | None = None) -> None:
    """The verdict on the reported ``ratio`` and ``reuse_pays``, from the checker's measurement alone."""
    checks = checks or _Checks()
    case = f"your ratio, {ratio!r}, against the {measured.ratio:.2f} measured"
    judge_figure(checks, case, "ratio", ratio, [measured.ratio], RATIO_FACTOR,
                 "report pin_copy's time per batch divided by the reused copy's time, a float such as 4.2.",
                 f"that is more than {RATIO_FACTOR}x away from the median of the checker's rounds (measured twice if "
                 "the first disagreed)",
                 "time both in interleaved rounds (several calls per round), and report the median of the per-round "
                 "ratios pin_copy time / reused copy time.",
                 "you divided the other way round: pin_copy's time / the reused copy's time.")
    case = f"reuse_pays={reuse_pays!r}, with pinning a fresh buffer {measured.ratio:.2f}x a reused copy"
    if not isinstance(reuse_pays, bool):
        checks.fail(case, f"reuse_pays should be True or False, but it is {reuse_pays!r}",
                    "answer with a bool: True if your ratio says a reused buffer is much cheaper.")
    if measured.ratio >= REUSE_PAYS and not reuse_pays:
        checks.fail(case, f"a fresh locked buffer costs {measured.ratio:.1f}x a reused copy, so reusing pays",
                    "your own ratio says it: every fresh buffer pays for locking its pages; a reused one paid once.")
    if measured.ratio <= REUSE_DOES_NOT_PAY and reuse_pays:
        checks.fail(case, f"a fresh locked buffer costs only {measured.ratio:.2f}x a reused copy here",
                    "with so small a difference, reusing buffers would not pay: answer False.")
    if REUSE_DOES_NOT_PAY < measured.ratio < REUSE_PAYS:
        print(f"(the measured ratio {measured.ratio:.2f} is in the band where either answer is accepted)")
    checks.passed += 1
