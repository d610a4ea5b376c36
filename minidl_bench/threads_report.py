"""The ``threads`` suite's report: the GIL build and the free-threaded build side by side.

The suite runs once per interpreter (``make bench-ft``), each into its own ``results/<machine-tag>/``;
the free-threaded venv has no matplotlib, so this step, run with the GIL venv, merges the two runs into
``results/threads/`` (``threads.csv`` and ``threads_metrics.csv``, an ``interpreter`` column on every
row) and draws the plots::

    python -m minidl_bench.threads_report                     # finds both builds' runs under results/
    python -m minidl_bench.threads_report --runs A B --out D  # or names the two run folders
"""

from __future__ import annotations

import argparse
import csv
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from minidl_bench.harness import Timing

Row = dict[str, str]  # one CSV row, as csv.DictReader gives it
BACKENDS = ("thread", "process")
LABELS = {"thread": "threads", "process": "processes"}


def interpreter(row: Mapping[str, str]) -> str:
    """``GIL``, ``free-threaded`` or ``free-threaded, GIL re-enabled``: the row's ``python_build``, for people."""
    return {"gil": "GIL"}.get(row["python_build"], row["python_build"])


def read_rows(path: str | Path) -> list[Row]:
    """The rows of one CSV, as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def find_runs(results: Path) -> list[Path]:
    """The run folders under ``results`` holding a ``threads_metrics.csv``, one per interpreter build (newest wins)."""
    runs: dict[str, Path] = {}
    for metrics in sorted(results.glob("*/threads_metrics.csv"), key=lambda p: p.stat().st_mtime):
        rows = read_rows(metrics)
        if rows and metrics.parent.name != "threads":
            runs[interpreter(rows[0])] = metrics.parent
    return [runs[b] for b in sorted(runs, key=lambda b: b != "GIL")]  # the GIL build first, as a reference


def merge(runs: Sequence[Path], out: Path) -> dict[str, list[Row]]:
    """Concatenate each run's ``threads.csv`` and ``threads_metrics.csv`` into ``out``, adding ``interpreter``."""
    out.mkdir(parents=True, exist_ok=True)
    merged: dict[str, list[Row]] = {}
    for name in ("threads.csv", "threads_metrics.csv"):
        rows = [{"interpreter": interpreter(r), **r} for run in runs for r in read_rows(run / name)]
        with open(out / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        merged[name] = rows
    return merged


# --- the numbers ----------------------------------------------------------------------------------

Key = tuple[str, str, str, int]  # (interpreter, workload, method, workers)


def by_key(rows: Sequence[Row]) -> dict[Key, Row]:
    """Metrics rows keyed by (interpreter, workload, method, workers)."""
    return {(interpreter(r), r["workload"], r["method"], int(r["workers"])): r for r in rows}


def speedups(rows: Sequence[Row]) -> dict[Key, float]:
    """Median samples/s over the same build's serial median samples/s, for every row with workers."""
    keyed = by_key(rows)
    return {k: float(r["samples_per_s_median"]) / float(keyed[k[0], k[1], "serial", 0]["samples_per_s_median"])
            for k, r in keyed.items() if k[3] > 0}


def summary(rows: Sequence[Row]) -> str:
    """The headline table: per build and workload, serial samples/s, speedups, first batch and PSS at 2 workers."""
    from minidl_bench.loaders import text_table

    keyed, up = by_key(rows), speedups(rows)
    builds = list(dict.fromkeys(k[0] for k in keyed))
    names = list(dict.fromkeys(k[1] for k in keyed))
    counts = sorted({k[3] for k in keyed if k[3] > 0})
    header = ["build", "workload", "serial/s", *(f"{LABELS[b][0]}{w}" for b in BACKENDS for w in counts),
              "1st batch t2/p2", "PSS MiB t2/p2", "CPU use t2/p2"]
    out = []
    for build in builds:
        for n in names:
            t, p = keyed[build, n, "thread", 2], keyed[build, n, "process", 2]
            out.append([build, n, f"{float(keyed[build, n, 'serial', 0]['samples_per_s_median']):.0f}",
                        *(f"x{up[build, n, b, w]:.2f}" for b in BACKENDS for w in counts),
                        f"{1e3 * float(t['first_batch_s_median']):.0f}/{1e3 * float(p['first_batch_s_median']):.0f} ms",
                        f"{float(t['peak_pss_mib_median']):.0f}/{float(p['peak_pss_mib_median']):.0f}",
                        f"{float(t['cpu_util_median']):.0%}/{float(p['cpu_util_median']):.0%}"])
    return text_table("speedup over the same build's serial loader (tN: N thread workers, pN: N process workers); "
                      "CPU use: CPU time / wall time / cores",
                      header, out)


# --- the plots ------------------------------------------------------------------------------------

def caption(rows: Sequence[Row]) -> str:
    """One line naming the machine and every interpreter whose rows are plotted."""
    first = {interpreter(r): r for r in rows}
    r0 = next(iter(first.values()))
    pythons = " vs ".join(f"Python {r['python']} ({b}, NumPy {r['numpy']})" for b, r in first.items())
    return f"{r0['cores']} cores ({r0['cpu_model']}) · {pythons} · minidl, NumPy batches, no torch"


def _timing(row: Row, metric: str) -> Timing:
    return Timing(float(row[f"{metric}_median"]), float(row[f"{metric}_min"]), float(row[f"{metric}_max"]),
                  int(row["repeats"]), float(row[f"{metric}_median"]))


def figures(rows: Sequence[Row]) -> dict[str, Any]:
    """Filename -> figure: speedup over serial per workload, time to first batch, and peak PSS, per build."""
    from minidl_bench import plot

    keyed, up = by_key(rows), speedups(rows)
    builds = list(dict.fromkeys(k[0] for k in keyed))
    names = list(dict.fromkeys(k[1] for k in keyed))
    counts = sorted({k[3] for k in keyed})
    cores = int(rows[0]["cores"])
    text = caption(rows)
    figs: dict[str, Any] = {}
    for n in names:
        series = {f"{build} · {LABELS[b]}": [1.0 if w == 0 else up[build, n, b, w] for w in counts]
                  for build in builds for b in BACKENDS}
        hlines = {"serial (each build's own)": 1.0}
        if n != "io":  # waiting needs no core: only the CPU-bound workloads hit the core limit
            hlines[f"{cores} cores: the limit"] = float(cores)
        samples = keyed[builds[0], n, "serial", 0]["samples"]
        fig = plot.line_plot(counts, series, hlines=hlines, xlabel="num_workers",
                             ylabel="speedup over serial (median samples/s)", caption=text,
                             title=f"{n} workload ({samples} samples per epoch): threads vs processes, per build")
        fig.axes[0].set_xticks(counts)
        figs[f"threads_speedup_{n}.png"] = fig

    w = max(c for c in counts if 0 < c <= max(cores, 1))  # as many workers as cores, where measured
    firsts = {f"{n} · {build} · {LABELS[b]}": _timing(keyed[build, n, b, w], "first_batch_s")
              for n in names for build in builds for b in BACKENDS}
    figs["threads_first_batch.png"] = plot.bar_times(
        firsts, what="time to first batch", caption=text, groups={k: k.split(" · ", 1)[1] for k in firsts},
        title=f"Time to the first batch with {w} workers (worker start + one batch)")

    # PSS, not USS: forked workers share the main process's pages, which USS then counts nowhere.
    # line_plot starts the y-axis at zero: the memory of threads and processes compares as sizes.
    series = {f"{n} · {build} · {LABELS[b]}": [float(keyed[build, n, "serial" if c == 0 else b, c]
                                                    ["peak_pss_mib_median"]) for c in counts]
              for n in ("numpy", "images") if n in names for build in builds for b in BACKENDS}
    fig = plot.line_plot(counts, series, xlabel="num_workers", ylabel="peak PSS, main + workers (MiB)", caption=text,
                         title="Peak memory of the loading processes (PSS summed; USS in threads_metrics.csv)")
    fig.axes[0].set_xticks(counts)
    figs["threads_memory.png"] = fig
    return figs


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: merge the two builds' runs, print the headline table, save CSVs and PNGs."""
    parser = argparse.ArgumentParser(prog="python -m minidl_bench.threads_report", description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), metavar="DIR",
                        help="where to look for the runs (default: results/)")
    parser.add_argument("--runs", type=Path, nargs="+", metavar="DIR",
                        help="run folders holding threads.csv and threads_metrics.csv (default: found)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="output folder (default: <results>/threads/)")
    args = parser.parse_args(argv)
    runs = args.runs or find_runs(args.results)
    if not runs:
        parser.error(f"no threads_metrics.csv under {args.results}/*/: run python -m minidl_bench threads first")
    out = args.out or args.results / "threads"
    os.environ.setdefault("MPLBACKEND", "Agg")  # before matplotlib is first imported
    from minidl_bench import plot

    merged = merge(runs, out)
    metrics = merged["threads_metrics.csv"]
    print(f"runs: {', '.join(str(r) for r in runs)}")
    print(summary(metrics))
    builds = {interpreter(r) for r in metrics}
    if len(builds) < 2:
        print(f"only one build measured ({', '.join(builds)}): run the suite under the other interpreter too")
    for filename, fig in figures(metrics).items():
        print(f"wrote {plot.save(fig, out / filename, close=True)}")
    print(f"wrote {out / 'threads.csv'} and {out / 'threads_metrics.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
