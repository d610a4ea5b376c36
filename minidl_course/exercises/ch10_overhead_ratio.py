"""Checker for exercise ch10: minidl's DataLoader's cost per batch next to torch's, held to the checker's stamps."""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from minidl.dataloader import DataLoader
from minidl_course import toy
from minidl_course.exercises import _measure as harness
from minidl_course.exercises._common import _Checks, _torch, call, first_hint

BATCHES = 3000
RATIO_FACTOR = 1.1  # your ratio within this factor of the median of your notebook's latest rounds (3 or more)
CLOCK_FACTOR = 1.25  # each figure of your per_batch_seconds must be within this factor of the checker's clock
CLOCK_HINT = ("stamp time.perf_counter() as each batch arrives, from the first to the last, and divide by the batches "
              "after the first: the checker stamps the same batches, and a number typed in or reused won't match.")
EPOCHS: deque[tuple[str, float]] = deque(maxlen=4096)  # (loader, seconds per batch) of each epoch of make_loaders()'


def make_loaders(batches: int = BATCHES) -> dict[str, Any]:
    """minidl's and torch's DataLoader over ``toy.RangeDataset(batches)``, batch_size=1, each epoch noted in EPOCHS."""
    dataset = toy.RangeDataset(batches)
    return {"minidl": Clocked(DataLoader(dataset, batch_size=1), "minidl"),
            "torch": Clocked(_torch().utils.data.DataLoader(dataset, batch_size=1), "torch")}


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
    """``loader``, each batch's arrival stamped on the checker's clock; with a ``name``, each whole epoch in EPOCHS."""

    def __init__(self, loader: Iterable, name: str = "") -> None:
        self.loader, self.name, self.arrivals = loader, name, []

    def __iter__(self) -> Iterator[Any]:
        self.arrivals = a = []
        for batch in self.loader:
            a.append(time.perf_counter())
            yield batch
        if self.name and len(a) > 1:
            EPOCHS.append((self.name, (a[-1] - a[0]) / (len(a) - 1)))

    def __len__(self) -> int:
        return len(self.loader)


def logged(epochs: Iterable[tuple[str, float]] = EPOCHS) -> harness.Rounds:
    """The rounds your notebook ran on ``make_loaders()``' loaders: an epoch of each, one right after the other."""
    epochs, rounds, k = list(epochs), harness.Rounds({"minidl": [], "torch": []}), 0
    while k + 1 < len(epochs):
        (a, x), (b, y) = epochs[k], epochs[k + 1]
        if paired := a != b:
            rounds[a].append(x)
            rounds[b].append(y)
        k += 2 if paired else 1
    return rounds


def check_overhead(per_batch_seconds: Callable[[Iterable], float], ratio: Any,
                   measure: Callable[[], harness.Rounds] = logged) -> harness.Rounds:
    """Check ch10: ``per_batch_seconds`` on two paced loaders; ``ratio``, the median of your notebook's rounds."""
    def report(m: harness.Rounds) -> str:
        r = m.ratios("minidl", "torch")
        return (f"Your notebook's rounds, on the checker's clock: minidl {statistics.median(m['minidl']) * 1e6:.1f} µs "
                f"per batch, torch {statistics.median(m['torch']) * 1e6:.1f} µs; ratio minidl / torch per round: "
                + ", ".join(f"{x:.2f}" for x in r[-12:]) + f" (median {statistics.median(r):.2f})" if r else
                "Your notebook ran no epoch of make_loaders()' minidl loader and its torch loader one after the other")
    return harness.measure_then_judge([per_batch_seconds], lambda checks: check_timer(per_batch_seconds, checks),
                                      measure, report, lambda measured, checks: judge(ratio, measured, checks))


def check_timer(per_batch_seconds: Callable[[Iterable], float], checks: _Checks) -> None:
    for batches, start, every in ((11, 0.2, 0.01), (3, 0.0, 0.05)):
        case = f"a loader of {batches} batches: the first after {start} s, then one every {every} s"
        clocked = Clocked(PacedLoader(batches, start, every))  # the checker's stamps of the batches you time
        got, a = call(per_batch_seconds, clocked, what="per_batch_seconds", case="the paced loader"), clocked.arrivals
        ours = (a[-1] - a[0]) / (len(a) - 1) if len(a) > 1 else 0.0  # seconds per batch (0.0: no epoch ran)
        if (number := harness.as_number(got)) is None:
            checks.fail(case, f"per_batch_seconds should return a number of seconds, but it returned {got!r}")
        every = ours or every  # the pace the checker clocked (a busy machine's sleeps overrun), or the loader's own
        high = number > every * 1.6  # else low: the hints for each side apply to it alone
        if high or number < every * 0.9:
            checks.fail(case, f"should be about {every:.3g} s per batch, but it is {number!r}", first_hint(
                "stamp each arrival; divide by the batches after the first" + ("." if high else ": n - 1 for n."),
                (high and abs(number * every - 1) < 0.4, "that is batches per second: return seconds per batch."),
                (high and abs(number / 1000 / every - 1) < 0.4, harness.MILLISECONDS),
                (high and start and harness.close(number, start, 1.3), "you timed iter() and the first next(): "
                 "the wait for the first batch alone. Time every batch, from the first arrival to the last."),
                (high and start and number * batches >= (start + batches * every) * 0.8, "you included the wait for "
                 "the first batch (worker start): start the clock when the first batch arrives."),
                (not high and number < every * 0.1, "time the whole loop over the loader, not one next() or iter()."),
                (not high and 0.9 < number * batches / (batches - 1) / every < 1.3, "you divided by n, not n - 1.")))
        if harness.off_the_clock([number], [ours], CLOCK_FACTOR, 1e-6) is not None:
            checks.fail(case, f"your per_batch_seconds returned {number!r}, but the batches arrived {ours!r} s "
                        "apart on the checker's clock" if ours else f"your per_batch_seconds returned {number!r} "
                        "without running an epoch of the paced loader", CLOCK_HINT)
        checks.passed += 1


def judge(ratio: Any, measured: harness.Rounds, checks: _Checks | None = None) -> None:
    """``ratio`` unrounded, within ``RATIO_FACTOR`` of the median of your notebook's latest 3 or more rounds."""
    checks, r = checks or _Checks(), measured.ratios("minidl", "torch")
    if not r:
        checks.fail("your rounds", "no epoch of make_loaders()' loaders ran to its end in your notebook", "time "
                    "rounds of both loaders make_loaders() gave you, per_batch_seconds on each, then set ratio.")
    medians = harness.latest_medians(r)
    harness.judge_figure(
        checks, f"your ratio, {ratio!r}, against your rounds", "ratio", ratio, medians, RATIO_FACTOR,
        "report minidl's per-batch time divided by torch's, the median over rounds, e.g. 1.4.", "your rounds, as the "
        "checker stamped them, gave " + ", ".join(f"{x:.2f}" for x in r[-8:]) + f": {ratio} is more than "
        f"{RATIO_FACTOR}x from the median of the latest 3 or more", "set ratio from your own rounds, not a figure "
        "from the README or another machine; if you ran rounds since, run your ratio cell again.", "you divided the "
        "other way round: minidl's per-batch time / torch's.",
        {1.0: "1.0 says the two cost the same: report your ratio, not a guess."})
