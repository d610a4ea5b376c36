"""A pytest plugin for `make nbval` (``-p tests.nbval_leaks``): a cell that leaves a process running fails, and each
notebook's kernel is asked to shut down before nbval kills it.

scripts/cell_leaks.py does the check: the process's command line is reported; it and the kernel are killed, so the
run goes on. Only nbval's cells are watched; the unit tests have their own check (tests/conftest.py's ``no_leaks``).

nbval ends a kernel with SIGKILL to its process group, which takes multiprocessing's resource tracker with it: under
forkserver and spawn a queue's semaphores have names in /dev/shm that only the tracker removes, so every notebook
that made a queue left files behind. After a notebook's last cell the kernel is asked to shut down first, as
JupyterLab does; its exit runs the tracker's clean-up.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def cell_kernel(item):
    """The kernel running ``item`` if it is a notebook cell of nbval's, else None."""
    if type(item).__name__ != "IPyNbCell":
        return None
    return getattr(getattr(item, "parent", None), "kernel", None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    kernel = cell_kernel(item)
    last = nextitem is None or getattr(nextitem, "parent", None) is not item.parent
    if kernel is not None and last and kernel.is_alive():
        kernel.km.shutdown_kernel(now=False)  # a shutdown request, then a wait for the kernel to exit
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    kernel = cell_kernel(item)
    if kernel is None or item.options.get("skip"):
        return (yield)
    from cell_leaks import children, describe, kill, outlived

    pid = kernel.km.provisioner.pid
    before = children(pid)
    try:
        return (yield)
    finally:
        left = outlived(pid, before)
        if left:
            kill(left, pid)
            kernel.km.provisioner.process.wait(10)  # so the next cell finds it dead, and does not wait on a reply
            where = f"{item.path.name} cell {item.cell_num} (code cells counted)"
            pytest.fail("\n".join(describe(where, left)), pytrace=False)
