"""No worker outlives its cell: the check `make mac` (scripts/mac_run.py) and `make nbval` (tests/nbval_leaks.py) run.

Before each cell the kernel's descendants are listed (psutil, from the kernel's pid); after it, any live one that
was not there before and is not a long-lived helper (multiprocessing's resource tracker and forkserver server,
torch's shm manager) is a process the cell started and left running: a DataLoader iterator still holding its
workers, say. If such a worker dies later (at kernel shutdown, say), the loader's SIGCHLD handler raises in the
kernel's idle loop and kills the kernel. The check reports the process's command line and kills it, then the kernel
too: its loader's handler would raise at the worker's death and leave it dead or stuck; the run must go on.
"""

from __future__ import annotations

import time

import psutil

# Started once and kept for the kernel's life, not a cell's workers: multiprocessing's helpers (spawn/forkserver;
# tests/loadertools.py names them too), and torch's torch_shm_manager, which the file_system sharing strategy starts
# at the first tensor it shares and which serves every later one (make mac's 07, cell 27, under spawn).
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "torch_shm_manager")
GRACE = 10.0  # seconds a process the cell ended is given to exit (a worker told to stop, a pool terminating)

Snapshot = dict[tuple[int, float], str]  # (pid, start time) -> command line: a pid the system reused is new


def children(kernel_pid: int) -> Snapshot:
    """The kernel's live descendants, multiprocessing's helpers aside; {} if the kernel is gone."""
    found = {}
    try:
        procs = psutil.Process(kernel_pid).children(recursive=True)
    except psutil.Error:
        return found
    for proc in procs:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue  # exited, not yet reaped: nothing left running
            cmdline = " ".join(proc.cmdline())
            parent = proc.parent()  # None once the parent has gone
            forked_by_helper = parent is not None and " ".join(parent.cmdline()) == cmdline  # a forkserver's workers
            if any(helper in cmdline for helper in HELPERS) and not forked_by_helper:
                continue
            found[(proc.pid, proc.create_time())] = cmdline
        except psutil.Error:
            continue  # gone while we looked
    return found


def outlived(kernel_pid: int, before: Snapshot, grace: float = GRACE) -> Snapshot:
    """The descendants started since ``before`` that are still running ``grace`` seconds from now (or fewer)."""
    deadline = time.monotonic() + grace
    while True:
        new = {key: cmd for key, cmd in children(kernel_pid).items() if key not in before}
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.1)


def kill(procs: Snapshot, kernel_pid: int) -> None:
    """SIGKILL each process in ``procs`` that is still the one we saw (same pid, same start time), then the kernel."""
    for pid, started in procs:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == started:
                proc.kill()
        except psutil.Error:
            continue
    try:
        psutil.Process(kernel_pid).kill()  # the notebook stops here: its later cells fail at once, not time out
    except psutil.Error:
        pass


def describe(where: str, procs: Snapshot) -> list[str]:
    """One line per process (where it was started, its command line), and one saying what was killed."""
    lines = [f"{where}: process {pid} outlived its cell: {cmd[:300]}" for (pid, _), cmd in procs.items()]
    return [*lines, f"{where}: killed, and the kernel with it (the cells after it do not run)"]
