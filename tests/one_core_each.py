"""A pytest plugin for `make nbval` (``-p tests.one_core_each``): on the fake other machine, one core to each notebook.

scripts/other_machine.sh runs nbval on one core, so that every kernel, and every worker it starts, counts one core.
Under pytest-xdist each pytest worker, with the kernels it starts, then takes a core of its own from the cores the
machine had (MINIDL_MACHINE_CORES, which the script sets): each notebook still sees one core, and the run uses them
all. Outside that script, or without xdist, it does nothing.
"""

from __future__ import annotations

import os


def cores(listed: str) -> list[int]:
    """The CPUs of a Linux CPU list such as ``0-3,6``.

    >>> cores("0-2,5")
    [0, 1, 2, 5]
    """
    found = []
    for part in filter(None, listed.split(",")):
        first, _, last = part.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    return found


def pytest_configure(config) -> None:
    worker, machine = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("MINIDL_MACHINE_CORES")
    if worker is None or not machine:
        return
    every = cores(machine)
    os.sched_setaffinity(0, {every[int(worker.removeprefix("gw")) % len(every)]})
