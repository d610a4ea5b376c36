"""minidl.bench: measured numbers for the notebooks, and ``python -m minidl.bench`` to make them.

Usage::

    python -m minidl.bench                   # every suite in SUITES, into results/<machine-tag>/
    python -m minidl.bench kernels --quick   # one suite, small sizes (or set MINIDL_QUICK=1)
    python -m minidl.bench --out /tmp/b      # somewhere else
    python -m minidl.bench --list            # what suites exist

Adding a suite (``loaders``, ``overhead``, ``gpu``, ``threads``, ...) takes two steps:

1. Write ``minidl/bench/<name>.py`` with a docstring (its first line is shown by ``--list``),
   ``REQUIRES = ("torch",)`` naming any optional package it cannot run without, and
   ``def run(session: Session) -> None``. Inside ``run``, call ``session.plan(n)`` with the number of
   measurements, ``session.measure(task, method, fn, ...)`` for each (it warms up, times repeats and
   records a CSV row), and ``session.savefig(fig, "<name>_<what>.png")`` for each plot made with
   ``minidl.bench.plot``. ``session.quick`` says whether to shrink sizes. A suite that times loaders
   first checks their batches against a reference loader's with ``minidl.bench.batches.check_first_batches``.
2. Add one line to ``SUITES`` below. Suites are imported only when run, so a suite that needs torch
   or Numba never breaks the others, and ``import minidl`` imports none of this package.
"""

from __future__ import annotations

import os

from minidl.bench.harness import Session, Timing, format_seconds, time_it
from minidl.bench.machine import describe, machine_info, machine_tag
from minidl.bench.timing import expect

# Suite name -> module that defines run(session). Run in this order when none is named.
SUITES: dict[str, str] = {
    "kernels": "minidl.bench.kernels",
    "loaders": "minidl.bench.loaders",
    "overhead": "minidl.bench.overhead",
    "gpu": "minidl.bench.gpu",
    "threads": "minidl.bench.threads",
    "pipeline": "minidl.bench.pipeline",
}


def is_quick() -> bool:
    """True when ``MINIDL_QUICK`` is set (and not ``0``): tests, CI and nbval use small sizes."""
    return os.environ.get("MINIDL_QUICK", "") not in ("", "0")


__all__ = ["SUITES", "Session", "Timing", "describe", "expect", "format_seconds", "is_quick", "machine_info",
           "machine_tag", "time_it"]
