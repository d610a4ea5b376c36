"""minidl_bench: measured numbers for the notebooks, and ``python -m minidl_bench`` to make them.

The suites live here, with what reads or draws their numbers in a notebook (``plot``, ``live``, ``headline``,
``threads_figures``, ``gil_split``). What they measure with, datasets and harnesses a notebook or a checker also
runs, lives in ``minidl_course``, which this package imports and which never imports it.

Usage::

    python -m minidl_bench                   # every suite in SUITES, into results/<machine-tag>/
    python -m minidl_bench kernels --quick   # one suite, small sizes (or set MINIDL_QUICK=1)
    python -m minidl_bench --out /tmp/b      # somewhere else
    python -m minidl_bench --list            # what suites exist

Adding a suite (``loaders``, ``overhead``, ``gpu``, ``threads``, ...) takes two steps:

1. Write ``minidl_bench/<name>.py`` with a docstring (its first line is shown by ``--list``),
   ``REQUIRES = ("torch",)`` naming any optional package it cannot run without, and
   ``def run(session: Session) -> None``. Inside ``run``, call ``session.plan(n)`` with the number of
   measurements, ``session.measure(task, method, fn, ...)`` for each (it warms up, times repeats and
   records a CSV row), and ``session.savefig(fig, "<name>_<what>.png")`` for each plot made with
   ``minidl_bench.plot``. ``session.quick`` says whether to shrink sizes. A suite that times loaders
   first checks their batches against a reference loader's with ``minidl_bench.batches.check_first_batches``.
2. Add one line to ``SUITES`` (in harness.py). Suites are imported only when run, so a suite that needs torch
   or Numba never breaks the others, and ``import minidl`` imports none of this package.
"""

from __future__ import annotations

from minidl_bench.harness import SUITES, Session, Timing, format_seconds, is_quick, time_it
from minidl_bench.machine import describe, machine_info, machine_tag
from minidl_bench.timing import expect

__all__ = ["SUITES", "Session", "Timing", "describe", "expect", "format_seconds", "is_quick", "machine_info",
           "machine_tag", "time_it"]
