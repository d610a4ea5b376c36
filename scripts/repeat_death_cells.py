"""Run notebook 06's killed-worker cells many times under each start method and count what each loader did.

    python scripts/repeat_death_cells.py [--runs 30] [--methods fork forkserver spawn] [--load] [--minutes M]
                                         [--jsonl FILE]
    taskset -c 0 python scripts/repeat_death_cells.py ...        (on one core)

One kernel per start method (``MINIDL_START_METHOD``, tests/start_method on ``PYTHONPATH``, quick mode: as
``make nbval`` runs a notebook). In each, the code cells before the first cell that kills a worker run once;
then the cells from it to the last one that kills a worker run ``--runs`` times, the methods taking turns, so
that a run cut short by ``--minutes`` has as many repetitions of each. After each repetition are noted:

- the cells that raised (none may);
- every process that the kernel, or anything it started, started and left running after a grace period, long-lived
  helpers aside (multiprocessing's resource tracker and fork server, torch's shm manager). Processes are found by
  an environment variable that everything the kernel starts inherits, so one that outlived its parent counts too;
- each loader's outcome (``ch06.Outcome.kind``), read from the kernel's ``torch_deaths`` and ``minidl_deaths``.

``--load``: beside one busy loop per core (scripts/under_load.py's ``BusyCores``). Every repetition is a JSON line
in ``--jsonl``; the counts are printed at the end. Nothing is asserted: a report to read.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "06_seeding_errors_shutdown.ipynb"
KILLS = ("ch06.torch_after_death(", "ch06.minidl_after_death(")  # the cells that kill a worker call one of these
MARK = "MINIDL_DEATH_CELLS_RUN"
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "torch_shm_manager")
GRACE_S = 10.0
PROBE = ("import json as _json\n"
         "print(_json.dumps({'torch': {h: o.kind for h, o in torch_deaths.items()},\n"
         "                   'minidl': {h: o.kind for h, o in minidl_deaths.items()},\n"
         "                   'killed': sum(o.killed for o in [*torch_deaths.values(), *minidl_deaths.values()])}))")

sys.path.insert(0, str(ROOT / "scripts"))


def left_running(token: str, kernel_pid: int) -> list[str]:
    """The live processes carrying ``token`` in ``MARK`` (the kernel and its long-lived helpers aside)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid == kernel_pid or proc.environ().get(MARK) != token or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.cmdline())
            parent = proc.parent()
            forked_by_helper = parent is not None and " ".join(parent.cmdline()) == cmdline  # a fork server's worker
            if any(helper in cmdline for helper in HELPERS) and not forked_by_helper:
                continue
            found.append(f"{proc.pid}: {cmdline[:200]}")
        except psutil.Error:
            continue
    return found


class Kernel:
    """A kernel for one start method, its setup cells run, ready to run the killed-worker cells again."""

    def __init__(self, method: str, timeout: int) -> None:
        import nbformat
        from nbclient import NotebookClient

        self.method, self.token = method, uuid.uuid4().hex
        os.environ.update({"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "start_method")]),
                           "MINIDL_START_METHOD": method, "MINIDL_QUICK": "1", MARK: self.token})
        self.nb = nbformat.read(NOTEBOOK, as_version=4)
        code = [i for i, cell in enumerate(self.nb.cells) if cell.cell_type == "code"]
        killing = [i for i in code if any(call in cell_source(self.nb.cells[i]) for call in KILLS)]
        self.setup = [i for i in code if i < killing[0]]
        self.block = [i for i in code if killing[0] <= i <= killing[-1]]
        self.client = NotebookClient(self.nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                     extra_arguments=["--Application.log_level=ERROR"],
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self.client.setup_kernel())
        self.pid = self.client.km.provisioner.pid
        errors = self._run(self.setup)
        if errors:
            raise RuntimeError(f"{method}: the setup cells raised: {errors}")

    def _run(self, indices: list[int]) -> list[str]:
        errors = []
        for i in indices:
            cell = copy.deepcopy(self.nb.cells[i])
            self.client.execute_cell(cell, i)
            errors += [f"cell {i}: {out['ename']}: {out['evalue'][:200]}" for out in cell.outputs
                       if out.get("output_type") == "error"]
        return errors

    def repeat(self) -> dict:
        import nbformat

        start = time.monotonic()
        errors = self._run(self.block)
        probe = nbformat.v4.new_code_cell(PROBE)
        self.nb.cells.append(probe)  # nbclient keeps each executed cell at its index
        self.client.execute_cell(probe, len(self.nb.cells) - 1)
        self.nb.cells.pop()
        text = "".join(out.get("text", "") for out in probe.outputs if out.get("output_type") == "stream")
        outcomes = json.loads(text) if text.startswith("{") else {"probe": text or str(probe.outputs)[:300]}
        deadline = time.monotonic() + GRACE_S
        while (left := left_running(self.token, self.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return {"method": self.method, "seconds": round(time.monotonic() - start, 1),
                "load_average": round(os.getloadavg()[0], 1), "errors": errors,
                "left": left, **outcomes}

    def close(self) -> None:
        self._stack.close()
        deadline = time.monotonic() + GRACE_S
        while (left := left_running(self.token, -1)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for line in left:  # the kernel is gone: whatever still carries its mark is killed, and said
            print(f"  {self.method}: still running after the kernel closed, killed: {line}", flush=True)
            with contextlib.suppress(psutil.Error):
                psutil.Process(int(line.split(":")[0])).kill()


def cell_source(cell) -> str:
    return cell.source if isinstance(cell.source, str) else "".join(cell.source)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--methods", nargs="+", default=["fork", "forkserver", "spawn"])
    parser.add_argument("--load", action="store_true", help="beside one busy loop per core")
    parser.add_argument("--minutes", type=float, default=float("inf"), help="start no repetition after this")
    parser.add_argument("--timeout", type=int, default=300, help="per cell, as nbval's --timeout")
    parser.add_argument("--jsonl", type=Path, help="append each repetition here as a JSON line")
    args = parser.parse_args()
    from under_load import BusyCores

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    condition = f"{'beside one busy loop per core' if args.load else 'no load added'}, {cores} core(s) allowed"
    print(f"{condition}; {args.runs} runs under each of {', '.join(args.methods)}", flush=True)
    began, records = time.monotonic(), []
    with BusyCores() if args.load else contextlib.nullcontext(), contextlib.ExitStack() as stack:
        kernels = []
        for method in args.methods:
            kernels.append(Kernel(method, args.timeout))
            stack.callback(kernels[-1].close)
        for run in range(1, args.runs + 1):
            if (time.monotonic() - began) / 60 > args.minutes:
                print(f"stopped after {run - 1} runs each: --minutes {args.minutes:g} spent", flush=True)
                break
            for kernel in kernels:
                record = {"run": run, "condition": condition, **kernel.repeat()}
                records.append(record)
                print(json.dumps(record), flush=True)
                if args.jsonl:
                    with args.jsonl.open("a") as f:
                        f.write(json.dumps(record) + "\n")
    print(f"\n{condition}: outcomes per start method (runs, then count of each outcome)")
    for method in args.methods:
        mine = [r for r in records if r["method"] == method]
        print(f"{method}: {len(mine)} runs, {sum(bool(r['errors']) for r in mine)} with a cell error, "
              f"{sum(bool(r['left']) for r in mine)} with a process left")
        for library in ("torch", "minidl"):
            for how in ("sigkill", "exit"):
                counts = Counter(r.get(library, {}).get(how, "no outcome read") for r in mine)
                print(f"  {library} {how}: " + "; ".join(f"{n}x {kind}" for kind, n in counts.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
