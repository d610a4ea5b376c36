"""Checker for ch07, without a GPU: a new buffer locked (``mlock``) per batch, timed against a reused one.

The ``lock_pages`` and ``copy_into`` a learner imports from here clock each call into ``CALLS``: the learner's
``ratio`` is held to what those calls took, by their medians or, as a round's total counts a burst of load, their means.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from minidl_course import pinning_demo
from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, call, first_difference

BATCH_BYTES = 2 << 20  # 2 MiB: `ulimit -l` is often 8 MiB, and lock_pages must fit under it
RATIO_FACTOR = 1.5  # a ratio within this factor of the clocked calls' medians' or means' ratio, or between, passes
LOGGED, MIN_LOGGED = 150, 20  # the latest calls of each kind the answers are held to; at least MIN_LOGGED of each
CALLS: deque[tuple[str, float]] = deque(maxlen=4 * LOGGED)  # ("pin" or "copy", seconds) of each learner's call
REUSE_PAYS = 1.5  # measured ratio above this: reusing pays, so reuse_pays must be True
REUSE_DOES_NOT_PAY = 1.15  # below this: it must be False; in between either is accepted


def make_batch(nbytes: int = BATCH_BYTES, seed: int = 0) -> np.ndarray:
    """A uint8 batch of ``nbytes`` random bytes, shaped like 32 small RGB images (32, n / 96, 3) when it divides."""
    data = np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)
    return data.reshape(32, -1, 3) if nbytes % 96 == 0 else data


def copy_into(out: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """The baseline: copy ``batch`` into ``out``, a buffer kept from the previous batch (no allocation, no locking)."""
    start = time.perf_counter()
    np.copyto(out, batch)
    CALLS.append(("copy", time.perf_counter() - start))
    return out


@contextlib.contextmanager
def lock_pages(array: np.ndarray) -> Iterator[np.ndarray]:
    """``pinning_demo.lock_pages``, each use (lock, what the block does, unlock) clocked into ``CALLS``."""
    start = time.perf_counter()
    with pinning_demo.lock_pages(array) as pages:
        yield pages
    CALLS.append(("pin", time.perf_counter() - start))


class Measured(NamedTuple):
    """Seconds of the learner's latest clocked calls, inside ``lock_pages`` and of ``copy_into``."""
    pinned: list[float]
    reused: list[float]

    @property
    def ratio(self) -> float:
        return statistics.median(self.pinned) / statistics.median(self.reused)


def clocked(pin_copy: Any = None, calls: deque[tuple[str, float]] = CALLS) -> Measured:
    """The latest ``LOGGED`` calls of each kind in ``calls``, as the learner ran them (``pin_copy`` is not called)."""
    return Measured(*([s for k, s in calls if k == kind][-LOGGED:] for kind in ("pin", "copy")))


def check_pin_copy(pin_copy: Callable[..., np.ndarray], ratio: Any, reuse_pays: Any,
                   measure: Callable[[Callable], Measured] = clocked) -> Measured:
    """Check ch07: ``pin_copy`` copies into a fresh, locked buffer; ``ratio`` and ``reuse_pays`` follow its timings."""
    return harness.measure_then_judge(
        [pin_copy], lambda checks: check_copies(pin_copy, checks), lambda: measure(pin_copy),
        lambda m: (f"Clocked: {len(m.pinned)} of your latest calls inside lock_pages, {len(m.reused)} of copy_into"
                   + (f"; medians {np.median(m.pinned) * 1e3:.3f} ms and {np.median(m.reused) * 1e3:.3f} ms per "
                      f"{BATCH_BYTES >> 20} MiB batch, ratio {m.ratio:.2f}" if min(map(len, m)) else "")),
        lambda measured, checks: judge(ratio, reuse_pays, measured, checks))


def check_copies(pin_copy: Callable[..., np.ndarray], checks: _Checks) -> None:
    returned: list[np.ndarray] = []  # every buffer returned so far, kept alive: a fresh one can't reuse their memory
    locked: list[np.ndarray] = []  # what the spy lock_pages was given, in this call

    @contextlib.contextmanager
    def spy(array: np.ndarray) -> Iterator[np.ndarray]:
        locked.append(array)
        with pinning_demo.lock_pages(array) as pages:
            yield pages

    for seed, nbytes in enumerate((96 * 1024, 4096, BATCH_BYTES, BATCH_BYTES, BATCH_BYTES)):  # 3: two buffers in turn
        batch = make_batch(nbytes, seed)
        before, case = batch.copy(), f"pin_copy(batch of {nbytes:,} bytes, shape {batch.shape}), call {seed + 1}"
        locked.clear()
        out = call(pin_copy, batch, spy, what="pin_copy", case=case)
        differs = first_difference(batch, out, "the copy")
        checks.first(case, (not np.array_equal(batch, before), "pin_copy changed the batch", "copy from the batch into "
                            "the new buffer, never the other way."),
                     (differs, differs, "return a new buffer holding the copy: np.empty_like(batch) makes one of the "
                      "batch's shape and dtype; np.copyto(out, batch) fills it."))
        again = next((k + 1 for k, old in enumerate(returned) if np.shares_memory(out, old)), 0)
        checks.first(case, (np.shares_memory(out, batch), "the returned array is the batch itself (or a view of it), "
                            "not a copy", "the locked buffer is new memory, holding a copy of the batch."),
                     (again, f"the buffer returned is the one call {again} returned", "this exercise measures a fresh "
                      "buffer per batch: allocate it inside pin_copy (buffers kept from earlier calls, one or several, "
                      "are the reuse that ratio is compared with)."),
                     (not locked, "pin_copy never called lock_pages", "lock the new buffer: `with lock_pages(out):` "
                      "around the copy. Copying alone (as FakePinnable.pin_memory does) leaves out the locking timed."),
                     (not any(np.shares_memory(pages, out) for pages in locked), "lock_pages was called, but not on "
                      "the buffer you returned", "lock the new buffer you copy into, not the batch."))
        returned.append(out)
        checks.passed += 1


def judge(ratio: Any, reuse_pays: Any, measured: Measured, checks: _Checks | None = None) -> None:
    """The verdict on ``ratio`` and ``reuse_pays``, from the learner's clocked calls alone."""
    checks = checks or _Checks()
    if min(map(len, measured)) < MIN_LOGGED:
        checks.fail("ratio", f"the checker clocked fewer than {MIN_LOGGED} calls inside lock_pages or of copy_into",
                    "time both with the lock_pages and copy_into imported from this exercise (they clock each call), "
                    "several rounds of several calls, then report your ratio.")
    means = statistics.fmean(measured.pinned) / statistics.fmean(measured.reused)
    harness.judge_figure(
        checks, f"your ratio, {ratio!r}, against {measured.ratio:.2f} (means: {means:.2f}) from your clocked calls",
        "ratio", ratio, [measured.ratio * (means / measured.ratio) ** (k / 4) for k in range(5)], RATIO_FACTOR,
        "report pin_copy's time per batch divided by the reused copy's time, a float such as 4.2.",
        f"that is more than {RATIO_FACTOR}x away from what your latest timed calls took on the checker's clock "
        "(median time inside lock_pages / median copy_into, or the same with means, or between the two)",
        "report the median per-round ratio pin_copy / copy_into of the rounds you timed, unrounded.",
        "you divided the other way round: pin_copy's time / the reused copy's time.")
    case = f"reuse_pays={reuse_pays!r}, with a new locked buffer {measured.ratio:.2f}x a reused copy"
    checks.first(case, (not isinstance(reuse_pays, bool), f"reuse_pays should be True or False, but it is "
                        f"{reuse_pays!r}", "answer with a bool: True if your ratio says reusing is much cheaper."),
                 (measured.ratio >= REUSE_PAYS and not reuse_pays, f"a new locked buffer costs {measured.ratio:.1f}x "
                  "a reused copy, so reusing pays", "every new buffer pays for getting and locking its pages; a "
                  "reused one paid once."),
                 (measured.ratio <= REUSE_DOES_NOT_PAY and reuse_pays, f"a new locked buffer costs only "
                  f"{measured.ratio:.2f}x a reused copy here", "so small a difference: reusing would not pay; answer "
                  "False."))
    if REUSE_DOES_NOT_PAY < measured.ratio < REUSE_PAYS:
        print(f"(the measured ratio {measured.ratio:.2f} is in the band where either answer is accepted)")
    checks.passed += 1
