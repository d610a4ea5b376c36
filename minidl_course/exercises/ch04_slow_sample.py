"""Checker for ch04_slow_sample: name, from a traced loader, the sample that slows an epoch, as the checker times it."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from minidl.dataloader import DataLoader
from minidl.dataset import Dataset
from minidl_course.exercises._common import _Checks, _short, _torch, call, first_hint

# What would give the slow sample away, and the namespace that holds it (vars() and dir() read it through it too)
PEEKED_THROUGH = ("slow_index", "slow_delay", "delay", "__dict__")
DIRECT_CALLS: list[int] = []  # samples fetched in this process by code other than a loader's (yours, timing them)
# (n, slow index, batch size, workers, shuffle): workers or not, shuffled or not
CASES = ((24, 17, 4, 0, False), (32, 5, 4, 2, False), (32, 22, 3, 2, True), (20, 0, 5, 1, True))


def _fields(dataset: SlowSampleDataset) -> tuple:
    """Its ``n, slow_index, delay, slow_delay``, read without noting a peek."""
    return tuple(object.__getattribute__(dataset, name) for name in ("n", "slow_index", "delay", "slow_delay"))


class SlowSampleDataset(Dataset):
    """Items ``0 .. n-1``, each taking ``delay`` seconds, ``slow_index`` taking ``slow_delay``. Reading those from
    outside is noted in ``peeks``: an answer must measure. A tripwire, not a sandbox (``gc`` gets past it)."""

    def __init__(self, n: int, slow_index: int, delay: float = 0.002, slow_delay: float = 0.08) -> None:
        self.n, self.slow_index, self.delay, self.slow_delay = n, slow_index, delay, slow_delay
        self.peeks: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name in PEEKED_THROUGH:
            object.__getattribute__(self, "peeks").append(name)
        return object.__getattribute__(self, name)

    def __reduce__(self) -> tuple:
        return type(self), _fields(self)  # a worker's copy (pickled under spawn) is not a peek

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        n, slow_index, delay, slow_delay = _fields(self)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not (caller.startswith("minidl.") or caller == __name__):  # not a loader's fetch, nor the checker
            DIRECT_CALLS.append(index)
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n}")
        time.sleep(slow_delay if index == slow_index else delay)
        return index


def slow_loader(n: int = 48, slow_index: int = 29, batch_size: int = 4, num_workers: int = 2,
                shuffle: bool = False, seed: int = 0) -> DataLoader:
    """A traced DataLoader over ``SlowSampleDataset(n, slow_index)``: an epoch held up by one sample."""
    generator = _torch().Generator().manual_seed(seed) if shuffle else None
    return DataLoader(SlowSampleDataset(n, slow_index), batch_size=batch_size, num_workers=num_workers,
                      shuffle=shuffle, generator=generator, trace=True)


def check_slow_sample(find_slow_sample: Callable[[DataLoader], int]) -> None:
    """Check ch04_slow_sample: ``find_slow_sample(loader)`` names the slow sample the checker times, in each loader."""
    checks, report = _Checks(find_slow_sample), []
    for n, slow, batch_size, workers, shuffle in CASES:
        loader = slow_loader(n, slow, batch_size, workers, shuffle, seed=n)
        case = (f"a traced DataLoader over {n} samples, batch_size={batch_size}, num_workers={workers}, "
                f"shuffle={shuffle}")
        DIRECT_CALLS.clear()
        answer = call(find_slow_sample, loader, what="find_slow_sample", case=case,
                      explain=lambda e, case=case, rows=loader.trace.rows: checks.first(case, (
                          isinstance(e, ValueError) and ("trace is empty" in str(e) or not rows()),
                          f"your function raised ValueError: {e}, with the trace still empty", "the trace fills as "
                          "the loader runs: iterate over the loader (one epoch) first, then read loader.trace.")))
        checks.first(case, (DIRECT_CALLS, f"your function fetched {len(DIRECT_CALLS)} samples itself (dataset[i]), "
                            "outside the loader", "the loader's trace has already timed every getitem of its epoch: "
                            "read it there, not in a second epoch one sample at a time."),
                     (loader.dataset.peeks, f"your function read the dataset's {(loader.dataset.peeks or [''])[0]!r}",
                      "a dataset doesn't know its slow sample; the loader's trace does: find it there, by measuring."))
        times = []  # the checker's own measurement: each dataset[i] timed in this process, one at a time
        for i in range(n):
            start = time.perf_counter()
            loader.dataset[i]
            times.append(time.perf_counter() - start)
        slowest = max(range(n), key=times.__getitem__)
        took_ms, median_ms = f"{times[slowest] * 1e3:.0f} ms", f"{statistics.median(times) * 1e3:.1f} ms"
        checks.first(case, (type(answer) is not int, f"your function returned {_short(answer)}",
                            "return the sample's index as a plain int, e.g. int(row['index'])."),
                     (answer != slowest, f"your function said sample {answer}, but I timed each of the {n} samples "
                      f"myself: sample {slowest} took {took_ms}, the median {median_ms}", answer != slowest
                      and _wrong_answer_hint(loader, answer, slowest, batch_size, shuffle)))
        report.append(f"  {case}: sample {slowest}, {took_ms} (median {median_ms})")
        checks.passed += 1
    print("\n".join(["What I measured, timing every sample myself; your function named the slow one each time:",
                     *report]))
    checks.done()


def _wrong_answer_hint(loader: DataLoader, answer, slowest: int, batch_size: int, shuffle: bool) -> str:
    """The mistake that names ``answer`` instead of ``slowest``, read from the loader's trace."""
    rows = [r for r in (loader.trace.rows() if loader.trace is not None else []) if r["event"] == "getitem"]
    slow = next((r for r in rows if r.get("index") == slowest), None)
    fastest = bool(rows) and answer == min(rows, key=lambda r: r["end"] - r["start"]).get("index")
    fastest_hint = "that is the fastest sample: take the getitem row with the longest end - start (max, not min)."
    started_last = "that sample started last, it wasn't the slowest: take the row with the longest end - start."
    near = [hint for holds, hint in ((answer in (slowest - 1, slowest + 1), "off by one: return row['index'] as the "
                                      "trace has it (0-based)."), (fastest, fastest_hint)) if holds]
    return first_hint(
        " Or: ".join(near) or "the getitem row of loader.trace.rows() with the longest end - start is the slow "
        "sample; row['index'] is its index.",
        (slow is not None and answer == slow["batch"], f"{answer} is the number of the batch that held the slow "
         "sample; its own index is row['index']."),
        (slow is not None and answer == next(r["index"] for r in rows if r["batch"] == slow["batch"]),
         f"sample {answer} opens the batch that held the slow sample: a fetch (or wait) row times the whole batch; "
         "the getitem rows time each sample: take the one with the longest end - start."),
        (rows and answer == max(rows, key=lambda r: r["start"]).get("index"),  # the last can be the fastest
         f"{fastest_hint} Or: {started_last}" if fastest else started_last),
        (shuffle and slow is not None
         and answer == slow["batch"] * batch_size + [r for r in rows if r["batch"] == slow["batch"]].index(slow),
         "this loader shuffles: a sample's place in the epoch is not its index; read row['index']."))
