"""What several test files share: the check for live children, a dataset written for torch, and datasets read in a
fresh interpreter.

Imported by name (``from loadertools import ...``): pytest puts this folder on ``sys.path`` for the
tests in it. Classes live at module level, so spawned workers can import them. Importing this module
doesn't need torch (conftest imports it on free-threaded interpreters too).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
from pathlib import Path

try:
    import torch.utils.data as tud
except ImportError:  # no torch (a free-threaded interpreter): no torch-written datasets either
    tud = None

# multiprocessing's own helpers (started once by spawn/forkserver, kept for the session) are
# not DataLoader workers.
MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def alive_children() -> list:
    """Live children of this process (zombies included: dead but never reaped), except multiprocessing's helpers."""
    import psutil

    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any(h in " ".join(p.cmdline()) for h in MP_HELPERS):
                continue  # a zombie counts as a leak, whatever it was
        except psutil.NoSuchProcess:
            continue
        alive.append(p)
    return alive


def alive_in_group(pgid: int, wait_s: float = 10.0) -> list[int]:
    """Pids of the live processes (zombies aside) in process group ``pgid``: what a killed child left running.

    SIGKILL lands when the kernel next schedules each process, so on a busy machine a killed group can look alive for
    a moment: this waits up to ``wait_s`` for it to go, and answers whatever is still running then.
    """
    import os
    import time

    import psutil

    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc.pid)
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def worker_threads() -> list[threading.Thread]:
    """minidl's worker and pin-memory threads still running in this process."""
    return [t for t in threading.enumerate() if t.name.startswith(("minidl_worker", "minidl_pin"))]


class TorchShardedRange(tud.IterableDataset if tud is not None else object):
    """``toy.ShardedRange`` written against torch's API: shards ``range(start, end)`` with torch's get_worker_info.

    It shards in torch's workers and in minidl's process workers, which set torch's worker info as torch's do.
    minidl's thread workers leave torch's alone: there it answers None, and every worker yields the whole range.
    """

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self):
        info = tud.get_worker_info()
        if info is None:
            return iter(range(self.start, self.end))
        per_worker = -(-(self.end - self.start) // info.num_workers)
        lo = self.start + info.id * per_worker
        return iter(range(lo, min(lo + per_worker, self.end)))

    def __len__(self) -> int:
        return self.end - self.start


def items_in_a_fresh_interpreter(datasets: dict, index: int) -> dict:
    """``{name: dataset[index]}`` from a new interpreter that unpickles ``datasets``, started in the repository: as
    a spawn or forkserver worker does, it imports each dataset's class by name."""
    code = ("import pickle, sys\n"
            "datasets = pickle.loads(sys.stdin.buffer.read())\n"
            f"sys.stdout.buffer.write(pickle.dumps({{k: d[{index}] for k, d in datasets.items()}}))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                            input=pickle.dumps(datasets), capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    return pickle.loads(result.stdout)
