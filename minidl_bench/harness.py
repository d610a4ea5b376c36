"""The harness behind ``python -m minidl_bench``: time a callable, keep rows, print a table, save CSV.

Every figure is the median of at least three timed repeats after a warm-up call, with the fastest
and slowest repeat kept beside it; the warm-up's own time is kept too (it is where a JIT compiles).
How to add a suite is in the docstring of ``minidl_bench/__init__.py``.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minidl_bench.machine import MACHINE_FIELDS, describe, machine_info, machine_tag
from minidl_bench.timing import MIN_REPEATS, Timing, format_seconds, median_ci, time_it  # noqa: F401 (re-exported)

COLUMNS = ("suite", "task", "size", "method", "workers", "median_s", "min_s", "max_s", "repeats",
           "first_s", "speedup", "note") + MACHINE_FIELDS


# Suite name -> module that defines run(session). Run in this order when none is named.
SUITES: dict[str, str] = {
    "kernels": "minidl_bench.kernels",
    "loaders": "minidl_bench.loaders",
    "overhead": "minidl_bench.overhead",
    "gpu": "minidl_bench.gpu",
    "threads": "minidl_bench.threads",
    "pipeline": "minidl_bench.pipeline",
}


def is_quick() -> bool:
    """True when ``MINIDL_QUICK`` is set (and not ``0``): tests, CI and nbval use small sizes."""
    return os.environ.get("MINIDL_QUICK", "") not in ("", "0")


def missing(*modules: str) -> list[str]:
    """The optional packages among ``modules`` that are not installed (none of them is imported)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


@dataclass
class Row:
    """One measurement: a CSV row once the machine's fields are added."""

    suite: str
    task: str  # what was computed, e.g. "cpu-normalise"; rows of one task and size are compared
    size: int  # the task's size knob (its meaning is in the suite's docstring)
    method: str  # how it was computed, e.g. "serial", "threads", "pool", "numba"
    workers: int
    timing: Timing
    baseline: bool = False  # speedups in this (task, size) group are relative to this row
    note: str = ""
    speedup: float | None = None  # baseline median / this median, filled in after the suite runs


class Session:
    """What a suite's ``run()`` receives: whether to go quick, where to save, and ``measure()``."""

    def __init__(self, suite: str, quick: bool, out: Path, bar: Any) -> None:
        self.suite = suite
        self.quick = quick
        self.out = out
        self.repeats = MIN_REPEATS if quick else 5
        self.rows: list[Row] = []
        self.figures: list[Path] = []
        self._bar = bar  # a tqdm bar shared by all suites of one run

    def plan(self, n: int) -> None:
        """Announce ``n`` more calls to ``measure()``, so the progress bar knows its length."""
        self._bar.total = (self._bar.total or 0) + n
        self._bar.refresh()

    def advance(self, what: str = "") -> None:
        """Count one measurement a suite took by itself (an epoch, say) on the progress bar; ``what`` names it."""
        if what:
            self._bar.set_postfix_str(what)
        self._bar.update()

    def progress(self, where: str) -> Callable[[str], None]:
        """A callback that advances the bar by one, naming ``where`` and what it is given (``run_rounds`` takes it)."""
        return lambda what: self.advance(f"{where} {what}")

    def measure(self, task: str, method: str, fn: Callable[[], Any], *, size: int, workers: int = 1,
                baseline: bool = False, note: str = "", repeats: int | None = None) -> Timing:
        """Time ``fn`` with ``time_it`` and record it as a row; returns the Timing."""
        self._bar.set_postfix_str(f"{task} {method} x{workers}")
        timing = time_it(fn, repeats=repeats or self.repeats)
        self.record(task, method, timing, size=size, workers=workers, baseline=baseline, note=note)
        self._bar.update()
        return timing

    def record(self, task: str, method: str, timing: Timing, *, size: int, workers: int = 1,
               baseline: bool = False, note: str = "") -> None:
        """Record a Timing measured some other way (a JIT's compile time, say)."""
        self.rows.append(Row(self.suite, task, size, method, workers, timing, baseline, note))

    def log(self, message: str) -> None:
        """Print a line without breaking the progress bar."""
        self._bar.write(message)

    def skip(self, what: str, reason: str) -> None:
        """Say what was left out and why (a missing optional package, usually)."""
        self.log(f"[{self.suite}] skipped {what}: {reason}")

    def savefig(self, fig: Any, name: str) -> Path:
        """Save a figure made with ``minidl_bench.plot`` as ``<out>/<name>`` and close it."""
        from minidl_bench import plot

        path = plot.save(fig, self.out / name, close=True)
        self.figures.append(path)
        return path


def fill_speedups(rows: Sequence[Row]) -> None:
    """Set each row's speedup against the baseline row of its (task, size) group, where there is one."""
    baselines = {(r.task, r.size): r.timing.median for r in rows if r.baseline}
    for r in rows:
        base = baselines.get((r.task, r.size))
        r.speedup = base / r.timing.median if base is not None and r.timing.median > 0 else None


def format_table(rows: Sequence[Row]) -> str:
    """The rows as an aligned text table, speedup last (``x2.00`` = twice as fast as the baseline)."""
    header = ("task", "size", "method", "workers", "median", "min", "max", "speedup")
    lines = [header]
    for r in rows:
        t = r.timing
        speedup = "" if r.speedup is None else f"x{r.speedup:.2f}"
        lines.append((r.task, str(r.size), r.method, str(r.workers), format_seconds(t.median),
                      format_seconds(t.min), format_seconds(t.max), speedup))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def write_csv(rows: Sequence[Row], path: Path) -> Path:
    """Write ``rows`` with the columns in ``COLUMNS``: every row names the machine it ran on."""
    machine = machine_info()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for r in rows:
            t = r.timing
            writer.writerow({
                "suite": r.suite, "task": r.task, "size": r.size, "method": r.method, "workers": r.workers,
                "median_s": f"{t.median:.6g}", "min_s": f"{t.min:.6g}", "max_s": f"{t.max:.6g}",
                "repeats": t.repeats, "first_s": f"{t.first:.6g}",
                "speedup": "" if r.speedup is None else f"{r.speedup:.4g}", "note": r.note, **machine,
            })
    return path


class PlainBar:
    """Stands in for tqdm's bar where tqdm is not installed (a bare GPU machine): no bar, the lines still print."""

    def __init__(self) -> None:
        self.total = 0

    def __enter__(self) -> PlainBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def refresh(self) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def write(self, s: str) -> None:
        print(s, flush=True)


def run_suites(names: Sequence[str], quick: bool, out: Path) -> list[Row]:
    """Run the named suites in order; each writes ``<out>/<suite>.csv`` and its PNGs."""

    out.mkdir(parents=True, exist_ok=True)
    all_rows: list[Row] = []
    if missing("tqdm"):
        progress = PlainBar()
    else:
        from tqdm import tqdm

        progress = tqdm(total=0, unit="measurement", file=sys.stderr, dynamic_ncols=True, delay=0.2)
    with progress as bar:
        for name in names:
            module = importlib.import_module(SUITES[name])
            absent = missing(*getattr(module, "REQUIRES", ()))
            if absent:
                bar.write(f"[{name}] skipped the whole suite: {', '.join(absent)} not installed")
                continue
            session = Session(name, quick, out, bar)
            module.run(session)
            fill_speedups(session.rows)
            if not session.rows:  # every measurement skipped (no CUDA, say): no header-only CSV to mislead
                bar.write(f"[{name}] measured nothing: no CSV written")
                continue
            bar.write(f"\n== {name} ==\n{format_table(session.rows)}")
            bar.write(f"wrote {write_csv(session.rows, out / f'{name}.csv')}")
            for path in session.figures:
                bar.write(f"wrote {path}")
            all_rows += session.rows
    return all_rows


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``python -m minidl_bench [suite ...] [--quick] [--out DIR] [--list]``."""

    parser = argparse.ArgumentParser(
        prog="python -m minidl_bench",
        description="Time minidl's benchmark suites; write a CSV and PNG plots per suite.")
    parser.add_argument("suites", nargs="*", metavar="suite",
                        help=f"suites to run, in order (default: every suite: {', '.join(SUITES)})")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, for tests and CI (also on when MINIDL_QUICK=1)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="output folder (default: results/<machine-tag>/)")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    args = parser.parse_args(argv)

    if args.list:
        for name, module in SUITES.items():
            doc = (importlib.import_module(module).__doc__ or "").strip().splitlines()
            print(f"{name:10s} {doc[0] if doc else ''}")
        return 0
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}")

    os.environ["MPLBACKEND"] = "Agg"  # save PNGs without a display; set before matplotlib is imported
    quick = args.quick or is_quick()
    out = args.out or Path("results") / machine_tag()
    print(f"machine: {describe()}\nmode: {'quick' if quick else 'full'}, writing to {out}/")
    run_suites(args.suites or list(SUITES), quick, out)
    return 0
