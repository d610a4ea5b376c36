"""Run every chapter and exercise notebook in full mode while other processes keep every core busy.

    python scripts/under_load.py [NOTEBOOK ...]         (default: every notebook under notebooks/)
    python scripts/under_load.py [--times N] --command CMD [ARG ...]   (any command, N times, beside the same load)

This is a learner's busy laptop: no notebook may fail because timings moved. Each notebook runs top to bottom
in a fresh kernel (nbclient), on a temporary copy (the committed notebooks are never written), while one
busy-loop process per core spins at normal priority. Reported: every cell that raised, except one tagged
``raises-exception`` (an unfilled exercise's ``YourTurn`` line, or a lesson showing an error on purpose).
Exit status 1 if any did. The busy processes are stopped at the end, whatever happened.

With ``--command`` the busy loops spin beside that command instead (CONTRIBUTING.md, "A busy machine"), and its
exit status is this script's: a test that measures must hold there as on a quiet machine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def spin(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


class BusyCores:
    """One busy-loop process per core, at normal priority, from ``with`` until its end."""

    def __enter__(self) -> BusyCores:
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.spinners = [context.Process(target=spin, args=(self.stop,), daemon=True)
                         for _ in range(os.cpu_count() or 1)]
        for p in self.spinners:
            p.start()
        print(f"{len(self.spinners)} busy-loop processes keep the cores busy", flush=True)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for p in self.spinners:
            p.join(5)
            if p.is_alive():
                p.kill()


def run(path: Path, timeout: int) -> list[str]:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": path.parent}},
                            allow_errors=True)
    try:
        client.execute()
    except CellExecutionError as error:  # allow_errors keeps going; this is a time-out or a dead kernel
        return [f"run stopped: {str(error).splitlines()[0][:300]}"]
    except Exception as error:  # noqa: BLE001 -- a time-out or a dead kernel fails this notebook, not the run
        return [f"run stopped: {type(error).__name__}: {str(error)[:300]}"]
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"cell {i}: {out['ename']}: {out['evalue'][:300]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", help="paths under notebooks/ (default: all)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--times", type=int, default=1, help="with --command: run it this many times")
    parser.add_argument("--command", nargs=argparse.REMAINDER, help="run this command beside the load instead")
    args = parser.parse_args()
    if args.command:
        codes = []
        with BusyCores():
            for attempt in range(1, args.times + 1):
                start = time.monotonic()
                codes.append(subprocess.call(args.command))
                took = time.monotonic() - start
                print(f"run {attempt} of {args.times}: exit status {codes[-1]}, {took:.0f} s under load", flush=True)
        print(f"{' '.join(args.command)}: {codes.count(0)} of {args.times} runs passed", flush=True)
        return next((code for code in codes if code), 0)  # the first failure's status, else 0
    every = (ROOT / "notebooks").rglob("*.ipynb")
    rels = args.notebooks or sorted(str(p.relative_to(ROOT / "notebooks")) for p in every
                                    if ".ipynb_checkpoints" not in str(p))
    rels = [r.removeprefix("notebooks/") for r in rels]
    os.environ.pop("MINIDL_QUICK", None)  # full mode: the sizes a learner runs
    os.environ["PYTHONPATH"] = str(ROOT)
    failures = {}
    with BusyCores(), tempfile.TemporaryDirectory(prefix="minidl-load-") as tmp:
        folder = Path(tmp) / "notebooks"
        shutil.copytree(ROOT / "notebooks", folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        for name in ("pyproject.toml", "results"):  # notebooks find the committed results from the project's root
            (folder.parent / name).symlink_to(ROOT / name)
        for rel in rels:
            start = time.monotonic()
            problems = run(folder / rel, args.timeout)
            verdict = "ok" if not problems else "FAILED"
            print(f"{rel:60s} {verdict:8s} {time.monotonic() - start:7.1f} s", flush=True)
            for problem in problems:
                print(f"    {problem}", flush=True)
            if problems:
                failures[rel] = problems
    print(f"{len(rels) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
