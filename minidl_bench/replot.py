"""Redraw a run's figures from its committed CSVs, without running a benchmark again.

A suite draws its figures from the numbers it measured; this reads the same numbers back from the
CSVs the run wrote and hands them to the same ``figures()`` function, so a change to the plots
reaches every committed PNG without a new (and, on a shared machine, different) measurement. The
caption names the machine of the CSV's rows, not the one replotting::

    python -m minidl_bench.replot results/x86_64-2c-py3.11-gil            # every suite with a CSV there
    python -m minidl_bench.replot results/x86_64-2c-py3.11-gil kernels    # or just the ones named
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from minidl_bench.loaders import read_rows
from minidl_bench.machine import describe
from minidl_bench.timing import Timing

Row = Mapping[str, str]


def timing(row: Row) -> Timing:
    """The Timing of one harness CSV row."""
    return Timing(float(row["median_s"]), float(row["min_s"]), float(row["max_s"]), int(row["repeats"]),
                  float(row["first_s"]))


def label(row: Row) -> str:
    """The kernels suite's label for a row: ``threads x2`` for a pool or threads row, else the method."""
    return f"{row['method']} x{row['workers']}" if row["method"] in ("threads", "pool") else row["method"]


def kernels(folder: Path) -> dict[str, Any]:
    """The kernels figures from ``kernels.csv``; FULL or QUICK sizes are told apart by the sizes measured."""
    from minidl_bench import kernels as suite

    rows = read_rows(folder / "kernels.csv")
    task = {name: [r for r in rows if r["task"] == name] for name in ("cpu-normalise", "io-fetch", "pool-crossover")}
    measured = (int(task["cpu-normalise"][0]["size"]), int(task["io-fetch"][0]["size"]),
                tuple(dict.fromkeys(int(r["size"]) for r in task["pool-crossover"])))
    sizes = next((s for s in (suite.FULL, suite.QUICK) if (s.images, s.samples, s.crossover_iterations) == measured),
                 None)
    if sizes is None:
        raise ValueError(f"{folder / 'kernels.csv'}: sizes {measured} are neither the suite's FULL nor QUICK sizes")
    cpu = {label(r): timing(r) for r in task["cpu-normalise"]}
    io = {label(r): timing(r) for r in task["io-fetch"]}
    per_task_us: list[float] = []
    speedups: dict[str, list[float]] = {"pool x2": [], "threads x2": []}
    for size in sizes.crossover_iterations:
        median = {label(r): float(r["median_s"]) for r in task["pool-crossover"] if int(r["size"]) == size}
        base = median["serial"]
        per_task_us.append(base / sizes.crossover_tasks * 1e6)
        for name in speedups:
            speedups[name].append(base / median[name])
    return suite.figures(cpu, io, per_task_us, speedups, sizes, caption=describe(rows[0]))


def loaders(folder: Path) -> dict[str, Any]:
    """The loaders figures from ``loaders_metrics.csv``, the file the run draws them from too."""
    from minidl_bench import loaders as suite

    rows = read_rows(folder / "loaders_metrics.csv")
    return suite.figures(rows, caption=describe(rows[0]))


def overhead(folder: Path) -> dict[str, Any]:
    """The overhead figures from ``overhead.csv``: the per-batch rows and the traced epochs."""
    from minidl_bench import overhead as suite

    rows = read_rows(folder / "overhead.csv")
    costs = {(int(r["size"]), int(r["workers"]), r["method"]): timing(r) for r in rows
             if r["task"].startswith("per-batch, ")}
    epochs = {}
    for r in rows:
        if r["task"].startswith("trace numpy, "):
            backend = r["task"].split(", ")[1]
            epochs[int(r["workers"]), backend, r["method"] == "trace=True"] = timing(r)
    samples = int(next(r["size"] for r in rows if r["task"].startswith("trace numpy, ")))
    return suite.figures(costs, epochs, samples, caption=describe(rows[0]))


def threads(folder: Path) -> dict[str, Any]:
    """One build's threads figures from ``threads_metrics.csv`` (``threads_report`` draws both builds')."""
    from minidl_bench import threads_report

    return threads_report.figures(threads_report.read_rows(folder / "threads_metrics.csv"))


# Suite -> (the CSV its figures are drawn from, the function that draws them).
SUITES: dict[str, tuple[str, Callable[[Path], dict[str, Any]]]] = {
    "kernels": ("kernels.csv", kernels),
    "loaders": ("loaders_metrics.csv", loaders),
    "overhead": ("overhead.csv", overhead),
    "threads": ("threads_metrics.csv", threads),
}


def replot(folder: Path, suites: Sequence[str] | None = None) -> list[Path]:
    """Redraw the named suites' PNGs (default: every suite whose CSV is in ``folder``); returns their paths."""
    from minidl_bench import plot

    names = suites or [name for name, (csv_name, _) in SUITES.items() if (folder / csv_name).exists()]
    written = []
    for name in names:
        for filename, fig in SUITES[name][1](folder).items():
            written.append(plot.save(fig, folder / filename, close=True))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``python -m minidl_bench.replot FOLDER [suite ...]``."""
    parser = argparse.ArgumentParser(prog="python -m minidl_bench.replot", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a run folder, e.g. results/x86_64-2c-py3.11-gil")
    parser.add_argument("suites", nargs="*", metavar="suite", help=f"suites to redraw (default: every one "
                        f"whose CSV is there; from {', '.join(SUITES)})")
    args = parser.parse_args(argv)
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    absent = [s for s in args.suites if not (args.folder / SUITES[s][0]).exists()]
    if absent:
        parser.error(f"no {', '.join(SUITES[s][0] for s in absent)} in {args.folder}")
    os.environ.setdefault("MPLBACKEND", "Agg")  # before matplotlib is first imported
    paths = replot(args.folder, args.suites)
    if not paths:
        parser.error(f"no suite's CSV in {args.folder}: nothing to redraw")
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
