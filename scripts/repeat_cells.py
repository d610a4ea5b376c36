"""Run one notebook many times in a row under given start methods and say how often each cell ran long.

    python scripts/repeat_cells.py NOTEBOOK [--runs N] [--methods forkserver spawn] [--quick] [--csv FILE]

Each run is a fresh kernel (nbclient), the notebook top to bottom, with tests/start_method on PYTHONPATH and
MINIDL_START_METHOD set, as ``make nbval`` runs it (forkserver). A cell "ran long" in a run when it took more than
``--factor`` times its median over all runs of that method and more than ``--slack`` seconds over it: a cell that
hangs until a guard stops it, or one that waits on a race, shows up there; the load average is printed per run.
An error in a cell is counted apart. Nothing is asserted: this is a report to read, not a test.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def durations(path: Path, method: str, quick: bool, timeout: int) -> tuple[list[float | None], list[int], float]:
    """One run of ``path``: each code cell's seconds (None: not run), the indices of error cells, the wall time."""
    import nbformat
    from nbclient import NotebookClient

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "start_method")])
    os.environ["MINIDL_START_METHOD"] = method
    if quick:
        os.environ["MINIDL_QUICK"] = "1"
    else:
        os.environ.pop("MINIDL_QUICK", None)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            extra_arguments=["--Application.log_level=ERROR"],
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.monotonic()
    try:
        client.execute()
    except Exception as error:  # noqa: BLE001 -- a time-out or a dead kernel: reported as this run's cells left unrun
        print(f"    run stopped: {type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}")
    wall = time.monotonic() - start
    seconds: list[float | None] = []
    errors = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        stamps = cell.metadata.get("execution", {})
        began, ended = stamps.get("iopub.execute_input"), stamps.get("shell.execute_reply")
        seconds.append((datetime.fromisoformat(ended.replace("Z", "+00:00"))
                        - datetime.fromisoformat(began.replace("Z", "+00:00"))).total_seconds()
                       if began and ended else None)
        if any(out.get("output_type") == "error" for out in cell.get("outputs", [])) and \
                "raises-exception" not in cell.metadata.get("tags", []):
            errors.append(index)
    return seconds, errors, wall


def ran_long(times: list[float], factor: float, slack: float) -> list[float]:
    """The times over ``factor`` x the median of ``times`` and more than ``slack`` seconds over it.

    >>> ran_long([1.0, 1.1, 0.9, 5.0], 2.0, 2.0), ran_long([0.1, 0.1, 0.5], 2.0, 2.0)
    ([5.0], [])
    """
    median = statistics.median(times)
    return [t for t in times if t > factor * median and t > median + slack]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--methods", nargs="+", default=["forkserver", "spawn"])
    parser.add_argument("--quick", action="store_true", help="MINIDL_QUICK=1, as CI runs it")
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--slack", type=float, default=2.0)
    parser.add_argument("--timeout", type=int, default=300, help="per cell, as nbval's --timeout")
    parser.add_argument("--csv", type=Path, help="write every cell's seconds per run here")
    args = parser.parse_args()
    path = args.notebook.resolve()
    import nbformat

    code_cells = [i for i, c in enumerate(nbformat.read(path, as_version=4).cells) if c.cell_type == "code"]
    rows = []
    for method in args.methods:
        runs = []
        for r in range(args.runs):
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            seconds, errors, wall = durations(path, method, args.quick, args.timeout)
            runs.append((seconds, errors))
            print(f"{method} run {r + 1}: {wall:.0f} s, load average {load:.1f} at its start"
                  + (f", error in cells {errors}" if errors else ""), flush=True)
            rows += [(method, r + 1, code_cells[k], s, load) for k, s in enumerate(seconds)]
        print(f"{method}: cells that ran long (> {args.factor}x their median and > {args.slack} s over it), "
              f"of {args.runs} runs:")
        long_any = False
        for k, cell in enumerate(code_cells):
            times = [run[0][k] for run in runs if run[0][k] is not None]
            if not times:
                print(f"  cell {cell}: never ran")
                continue
            median, long = statistics.median(times), ran_long(times, args.factor, args.slack)
            unrun = sum(run[0][k] is None for run in runs)
            failed = sum(cell in run[1] for run in runs)
            if long or unrun or failed:
                long_any = True
                print(f"  cell {cell}: median {median:.1f} s, max {max(times):.1f} s; ran long {len(long)} of "
                      f"{len(times)}" + (f"; not run {unrun}" if unrun else "")
                      + (f"; errors {failed}" if failed else ""))
        if not long_any:
            most = [max(run[0][k] or 0 for run in runs) for k in range(len(code_cells))]  # per code cell
            k = most.index(max(most))
            print(f"  none; slowest cell {code_cells[k]}: max {most[k]:.1f} s")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["method", "run", "cell", "seconds", "load_at_run_start"])
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
