"""Checker for exercise ch10: what minidl's DataLoader costs per batch next to torch's, as a median of ratios, each
figure of the learner's ``per_batch_seconds(loader)`` held to the checker's stamps of the same batches."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from minidl.dataloader import DataLoader
from minidl_course import toy
from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, _torch, call, first_hint

BATCHES = 3000
ROUNDS = 7
RATIO_FACTOR = 1.5  # a reported ratio within this factor of the median of the checker's rounds is accepted
CLOCK_FACTOR = 1.25  # each figure of your per_batch_seconds must be within this factor of the checker's clock
CLOCK_HINT = ("stamp time.perf_counter() as each batch arrives, from the first to the last, and divide by the batches "
              "after the first: the checker stamps the same batches, and a number typed in or reused won't match.")


def make_loaders(batches: int = BATCHES) -> dict[str, Any]:
    """minidl's and torch's DataLoader over ``toy.RangeDataset(batches)``, batch_size=1: all an epoch does is load."""
    dataset = toy.RangeDataset(batches)
    return {"minidl": DataLoader(dataset, batch_size=1), "torch": _torch().utils.data.DataLoader(dataset, batch_size=1)}


class PacedLoader:
    """A loader whose timing is known: the first batch after ``start`` seconds, each later one ``every`` seconds on."""

    def __init__(self, batches: int, start: float, every: float) -> None:
        self.batches, self.start, self.every = batches, start, every

    def __iter__(self) -> Iterator[int]:
        time.sleep(self.start)
        for k in range(self.batches):
            time.sleep(self.every if k else 0)
            yield k

    def __len__(self) -> int:
        return self.batches


class Clocked:
    """``loader`` as your ``per_batch_seconds`` gets it: each batch's arrival stamped on the checker's clock."""

    def __init__(self, loader: Iterable) -> None:
        self.loader, self.arrivals = loader, []

    def __iter__(self) -> Iterator[Any]:
        self.arrivals = []
        for batch in self.loader:
            self.arrivals.append(time.perf_counter())
            yield batch

    def __len__(self) -> int:
        return len(self.loader)


def timed(per_batch_seconds: Callable[[Iterable], Any], loader: Iterable, name: str) -> tuple[Any, float]:
    """Your ``per_batch_seconds`` on ``loader``, and the checker's seconds per batch for the same epoch (0.0: none)."""
    clocked = Clocked(loader)
    got, a = call(per_batch_seconds, clocked, what="per_batch_seconds", case=f"the {name} loader"), clocked.arrivals
    return got, (a[-1] - a[0]) / (len(a) - 1) if len(a) > 1 else 0.0


def _off(name: str, got: float, ours: float) -> str:
    return (f"for the {name} loader your per_batch_seconds returned {got * 1e6:.2f} µs, but that epoch's batches "
            f"arrived {ours * 1e6:.2f} µs apart on the checker's clock" if ours else
            f"your per_batch_seconds returned {got!r} without running an epoch of the {name} loader")


def measure(per_batch_seconds: Callable[[Iterable], Any], rounds: int = ROUNDS,
            loaders: dict[str, Iterable] | None = None) -> harness.Rounds:
    """Your ``per_batch_seconds`` on minidl's and torch's loader (``make_loaders()`` by default), a warm-up each,
    then in rotating rounds, each figure held to the checker's clock."""
    loaders = loaders or make_loaders()
    def run(name: str) -> tuple[float, float]:
        got, ours = timed(per_batch_seconds, loaders[name], name)
        if not harness.positive_numbers([got]):
            raise AssertionError(f"your per_batch_seconds returned {got!r} for the {name} loader: it should "
                                 "return seconds per batch, a positive number, as it did for PacedLoader")
        return float(got), ours
    return harness.held_rounds(("minidl", "torch"), rounds, run, _off, CLOCK_FACTOR, 1e-6, warmup=True)


def check_overhead(per_batch_seconds: Callable[[Iterable], float], ratio: Any,
                   measure: Callable[[Callable], harness.Rounds] = measure) -> harness.Rounds:
    """Check ch10: ``per_batch_seconds`` times a loader right, and ``ratio`` agrees with what it measures here
    (measured twice if the first disagrees). Prints what it measured; raises AssertionError at the first problem."""
    def report(m: harness.Rounds) -> str:
        r = m.ratios("minidl", "torch")
        return (f"Measured with your per_batch_seconds: minidl {statistics.median(m['minidl']) * 1e6:.1f} µs per "
                f"batch, torch {statistics.median(m['torch']) * 1e6:.1f} µs; ratio minidl / torch "
                f"{statistics.median(r):.2f} (median of {len(r)} rounds, which ranged {min(r):.2f} to {max(r):.2f})")
    return harness.measure_then_judge(
        [per_batch_seconds], lambda checks: check_timer(per_batch_seconds, checks),
        lambda: harness.unless_close(lambda: measure(per_batch_seconds), ratio,
                                     lambda m: harness.median_ratio(m, "minidl", "torch"), RATIO_FACTOR),
        report, lambda measured, checks: judge(ratio, measured, checks))


def check_timer(per_batch_seconds: Callable[[Iterable], float], checks: _Checks) -> None:
    for batches, start, every in ((11, 0.2, 0.01), (3, 0.0, 0.05)):
        case = f"a loader of {batches} batches: the first after {start} s, then one every {every} s"
        got, ours = timed(per_batch_seconds, PacedLoader(batches, start, every), "paced")
        if (number := harness.as_number(got)) is None:
            checks.fail(case, f"per_batch_seconds should return a number of seconds, but it returned {got!r}")
        every = ours or every  # the pace the checker clocked (a busy machine's sleeps overrun), or the loader's own
        high = number > every * 1.6  # else low: the hints for each side apply to it alone
        if high or number < every * 0.9:
            checks.fail(case, f"should be about {every:.3g} s per batch, but it is {number!r}", first_hint(
                "stamp each arrival; divide by the batches after the first" + ("." if high else ": n - 1 for n."),
                (high and abs(number * every - 1) < 0.4, "that is batches per second: return seconds per batch."),
                (high and abs(number / 1000 / every - 1) < 0.4, harness.MILLISECONDS),
                (high and start and number * batches >= (start + batches * every) * 0.8, "you included the wait for "
                 "the first batch (worker start): start the clock when the first batch arrives."),
                (not high and number < every * 0.1, "time the whole loop over the loader, not one next() or iter()."),
                (not high and 0.9 < number * batches / (batches - 1) / every < 1.3, "you divided by n, not n - 1.")))
        if harness.off_the_clock([number], [ours], CLOCK_FACTOR, 1e-6) is not None:
            checks.fail(case, _off("paced", number, ours), CLOCK_HINT)
        checks.passed += 1


def judge(ratio: Any, measured: harness.Rounds, checks: _Checks | None = None) -> None:
    """Your timing held to the checker's clock (``measured.problem``); ``ratio`` your code's number, within
    ``RATIO_FACTOR`` of the median of the rounds."""
    checks, median = checks or _Checks(), harness.median_ratio(measured, "minidl", "torch")
    if measured.problem:
        checks.fail("your per_batch_seconds on both loaders, against the checker's clock", measured.problem, CLOCK_HINT)
    harness.judge_figure(
        checks, f"your ratio, {ratio!r}, against what your per_batch_seconds measured just now", "ratio", ratio,
        [median], RATIO_FACTOR, "report minidl's per-batch time divided by torch's, the median over rounds, e.g. 1.4.",
        f"your rounds here gave a median of {median:.2f} (measured twice if the first disagreed): {ratio} is more than "
        f"{RATIO_FACTOR}x away", "set ratio from your own rounds here, not a figure from the README or another "
        "machine; if the load changed since, run your cell and this one again.", "you divided the other way round: "
        "minidl's per-batch time / torch's.", {1.0: "1.0 says the two cost the same: report your ratio, not a guess."})
