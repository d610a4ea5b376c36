"""Checker for ch07, without a GPU: a new buffer locked (``mlock``) per batch, timed against a reused one."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from minidl_course import pinning_demo
from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, call, first_difference

BATCH_BYTES = 2 << 20  # 2 MiB: `ulimit -l` is often 8 MiB, and lock_pages must fit under it
ROUNDS, CALLS_PER_ROUND = 15, 10
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


class Measured(NamedTuple):
    """Seconds per batch for each way, per round; ``ratio`` is the median of the per-round ratios."""
    pinned: list[float]
    reused: list[float]

    @property
    def ratio(self) -> float:
        return harness.median_ratio(self._asdict(), "pinned", "reused")


def measure(pin_copy: Callable[..., np.ndarray], rounds: int = ROUNDS) -> Measured:
    """Rounds of ``CALLS_PER_ROUND`` calls of ``pin_copy(batch, lock_pages)`` and of ``copy_into(reused, batch)``."""
    batch = make_batch()
    reused = np.empty_like(batch)

    def pinned() -> None:
        for _ in range(CALLS_PER_ROUND):  # each result dropped, as a loader drops a batch: glibc reuses its pages
            pin_copy(batch, pinning_demo.lock_pages)

    def copied() -> None:
        for _ in range(CALLS_PER_ROUND):
            copy_into(reused, batch)

    times = harness.interleaved({"pinned": pinned, "reused": copied}, rounds=rounds)
    return Measured(*([t / CALLS_PER_ROUND for t in times[way]] for way in ("pinned", "reused")))


def check_pin_copy(pin_copy: Callable[..., np.ndarray], ratio: Any, reuse_pays: Any,
                   measure: Callable[[Callable], Measured] = measure) -> Measured:
    """Check ch07: ``pin_copy`` copies into a fresh, locked buffer; ``ratio`` and ``reuse_pays`` match a measurement."""
    return harness.measure_then_judge(
        [pin_copy], lambda checks: check_copies(pin_copy, checks),
        lambda: harness.twice(lambda: measure(pin_copy),
                              lambda m: harness.close(harness.as_number(ratio) or 0, m.ratio, RATIO_FACTOR)),
        lambda m: (f"Measured: pin_copy {np.median(m.pinned) * 1e3:.3f} ms per {BATCH_BYTES >> 20} MiB batch, a copy "
                   f"into a reused buffer {np.median(m.reused) * 1e3:.3f} ms; ratio {m.ratio:.2f} (median of "
                   f"{len(m.pinned)} rounds)"),
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
    """The verdict on the reported ``ratio`` and ``reuse_pays``, from the checker's measurement alone."""
    checks = checks or _Checks()
    harness.judge_figure(
        checks, f"your ratio, {ratio!r}, against the {measured.ratio:.2f} measured", "ratio", ratio,
        [measured.ratio], RATIO_FACTOR,
        "report pin_copy's time per batch divided by the reused copy's time, a float such as 4.2.",
        f"that is more than {RATIO_FACTOR}x away from the median of the checker's rounds (measured twice if "
        "the first disagreed)",
        "time both in interleaved rounds of several calls, dropping each result (buffers kept alive cost more: the "
        "allocator can't reuse their memory), and report the median per-round ratio pin_copy / reused copy.",
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
