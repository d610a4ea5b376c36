"""Run the notebooks top to bottom in the Mac stand-in (tests/mac_standin) and report every error cell.

    python scripts/mac_run.py [--jobs N] [--out DIR] [--all] [NOTEBOOK ...]     (what `make mac` runs)

Each notebook runs in a fresh kernel, in quick mode (MINIDL_QUICK=1), with tests/mac_standin on PYTHONPATH, so the
kernel and every process it starts (spawned workers, ``python -m`` children) see what a Mac shows Python code:
``spawn``, torch's ``file_system`` sharing strategy only, no ``/proc``, no ``/dev/shm``, psutil without ``pss``, no
``os.sched_getaffinity`` (the stand-in's docstring says exactly what is changed and what is not). Outputs are not
compared with the committed ones (a Mac prints other numbers); a notebook fails, as in ``make browser``
(scripts/browser_run.py's ``judge``), on an error in a cell not tagged ``raises-exception`` (an unfilled exercise's
``YourTurn`` is so tagged), on cells left unrun, on a committed plot the run did not draw, and on a process a cell
started that is still running after it (scripts/cell_leaks.py: its command line is reported; it and the kernel are
killed so the run goes on).

Left out unless ``--all`` or named: notebooks that start no process worker and ask the platform nothing
(``SKIPPED``): the start method cannot change them, and ``make nbval`` runs them. And an unfilled exercise whose
solution runs here, when it runs nothing under spawn that its solution does not (``repeats_its_solution``): each
of its code cells ran without an error in the committed run and is one of the solution's cells or starts no process
and asks nothing, or is a learner's cell (tagged ``raises-exception``) that stopped at ``YourTurn`` in the kernel
itself, not in a worker. ``make nbval`` (forkserver, outputs compared) and the browser run (fork) run those too.
``make test`` runs this script: it is CI's spawn run of the notebooks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "mac_standin"
sys.path.insert(0, str(ROOT / "scripts"))
from browser_run import judge, recap, report, timed_alone  # noqa: E402  (the browser run's verdict and report)
from cell_leaks import children, describe, kill, outlived  # noqa: E402  (no worker outlives its cell)

# No process worker, no multiprocessing, no /proc, /dev/shm, psutil, sharing strategy or core count in these:
# threads, samplers, collate and CUDA streams (checked with `grep`, see tests/test_mac_standin.py).
SKIPPED = (
    "02_datasets_and_samplers.ipynb",
    "03_collate.ipynb",
    "exercises/ch02_sampler.ipynb",
    "exercises/ch02_sampler_solution.ipynb",
    "exercises/ch03_collate.ipynb",
    "exercises/ch03_collate_solution.ipynb",
)
# What in a cell can start a process or ask the platform (checked against SKIPPED by tests/test_mac_standin.py).
PLATFORM_OR_PROCESS = re.compile(r"num_workers\s*=\s*[1-9a-zA-Z_]|multiprocessing|Pool\(|Process\(|psutil|/proc|"
                                 r"/dev/shm|sharing_strateg|cpu_count|sched_|core_count|worker_sweep|osfacts|subprocess|"
                                 r"fork(?!_rng)|spawn|describe|machine_info")  # the last two: the machine's name
CELL_TIMEOUT = int(os.environ.get("MAC_CELL_TIMEOUT", "600"))


def code_cells(rel: str) -> list[dict]:
    return [c for c in json.loads((ROOT / "notebooks" / rel).read_text())["cells"] if c["cell_type"] == "code"]


def stopped_at_your_turn_in_the_kernel(cell: dict) -> bool:
    """A learner's cell whose committed run raised YourTurn in the kernel (a worker's would read "Caught ...")."""
    errors = [out for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    return ("raises-exception" in cell.get("metadata", {}).get("tags", []) and len(errors) == 1
            and errors[0]["ename"] == "YourTurn" and errors[0]["evalue"].startswith("your turn:"))


def repeats_its_solution(rel: str, rels: list[str]) -> bool:
    """Whether unfilled exercise ``rel`` runs nothing under spawn that its solution, also in ``rels``, does not."""
    solution = rel.removesuffix(".ipynb") + "_solution.ipynb"
    if not rel.startswith("exercises/") or rel.endswith("_solution.ipynb") or solution not in rels:
        return False
    shared = {"".join(c["source"]) for c in code_cells(solution)}

    def ran_as_in_the_solution(cell: dict) -> bool:  # an error would be the learner's unfilled code, run differently
        source = "".join(cell["source"])
        return (not any(out.get("output_type") == "error" for out in cell.get("outputs", []))
                and (source in shared or not PLATFORM_OR_PROCESS.search(source)))

    return all(ran_as_in_the_solution(c) or stopped_at_your_turn_in_the_kernel(c) for c in code_cells(rel))


def run_one(rel: str, out: Path | None) -> tuple[str, list[str], float]:
    """Execute notebooks/<rel> in the stand-in; the problems found and the seconds it took."""
    import nbformat
    from nbclient import NotebookClient

    path = ROOT / "notebooks" / rel
    committed = nbformat.read(path, as_version=4)
    ran = nbformat.read(path, as_version=4)
    leaks, before = [], {}

    def snapshot(cell, cell_index):  # before each cell: the kernel's processes
        before.update(children(client.km.provisioner.pid))

    def check(cell, cell_index, execute_reply):  # after it: what it started and left running
        left = outlived(client.km.provisioner.pid, before)
        if left:
            leaks.extend(describe(f"cell {cell_index}", left))
            kill(left, client.km.provisioner.pid)
        before.clear()

    client = NotebookClient(ran, timeout=CELL_TIMEOUT, kernel_name="python3", allow_errors=True,
                            extra_arguments=["--Application.log_level=ERROR"],  # not its TCP warning
                            resources={"metadata": {"path": str(path.parent)}},
                            on_cell_execute=snapshot, on_cell_executed=check)
    start = time.monotonic()
    try:
        client.execute()
        problems = judge(json.loads(nbformat.writes(committed)), json.loads(nbformat.writes(ran)))
    except Exception as error:  # noqa: BLE001 -- a dead kernel or a time-out: this notebook fails, the run goes on
        problems = [f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"]
    problems += leaks
    if out is not None:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(ran, target)
    return rel, problems, time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", help="paths under notebooks/ (default: all but SKIPPED)")
    parser.add_argument("--all", action="store_true", help="run the SKIPPED notebooks and every unfilled exercise too")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks run at once (default 2)")
    parser.add_argument("--out", type=Path, help="save the executed notebooks under this folder")
    args = parser.parse_args()
    every = sorted(str(p.relative_to(ROOT / "notebooks")) for p in (ROOT / "notebooks").rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in str(p))
    rels = [r.removeprefix("notebooks/") for r in args.notebooks] or [
        r for r in every if args.all or r not in SKIPPED]
    repeats = [] if args.notebooks or args.all else [r for r in rels if repeats_its_solution(r, rels)]
    rels = [r for r in rels if r not in repeats]
    # Set here, inherited by each kernel and everything it starts.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(STANDIN)])
    os.environ["MINIDL_QUICK"] = "1"
    os.environ.pop("MINIDL_START_METHOD", None)  # the stand-in sets spawn itself
    start, failures = time.monotonic(), {}
    # An exercise whose checker times the learner's code against its own clock runs alone, after the rest: beside
    # another notebook on 2 cores, its two measurements, seconds apart, see different machines.
    alone = timed_alone(rels)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for rel, problems, seconds in pool.map(lambda r: run_one(r, args.out), [r for r in rels if r not in alone]):
            report(rel, problems, seconds, failures)
    for rel in alone:
        report(*run_one(rel, args.out), failures)
    recap(failures)
    left_out = ", ".join(r for r in SKIPPED if r not in rels) or "none"
    why = ("only the notebooks named ran" if args.notebooks
           else f"left out as starting no process and asking nothing: {left_out}; as repeating their solutions "
                f"under spawn: {', '.join(repeats) or 'none'}")
    print(f"Mac stand-in: {len(rels) - len(failures)} passed, {len(failures)} failed, {len(every) - len(rels)} not "
          f"run ({why}), {time.monotonic() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
