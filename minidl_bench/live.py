"""Words for a measurement made in a notebook's own run: how busy the machine was, and what a ratio says.

Notebooks 09 and 10 time their headline comparisons on the learner's machine, beside the committed
reference run, and print each verdict from this run's rounds instead of from the reference's numbers.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Mapping, Sequence

from minidl_bench.machine import core_count


def load_line() -> str:
    """The 1-minute load average beside the core count, or why this platform gives none (Windows)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average
        return f"load average: not reported on this platform ({core_count()} cores)"
    # Each process that wants a core adds about 1: near the core count or above, other programs held the cores.
    return f"load average {load:.2f} on {core_count()} cores"


def spread(ratios: Sequence[float]) -> str:
    """``x1.23 (rounds x1.10 to x1.31)``: the median of per-round ratios and their range."""
    return f"x{statistics.median(ratios):.2f} (rounds x{min(ratios):.2f} to x{max(ratios):.2f})"


def verdict(ratios: Sequence[float], more: str, less: str) -> str:
    """What per-round ratios (a over b) say: ``more`` on every round, ``less`` on every round, or neither.

    >>> verdict([1.2, 1.3, 1.1], "faster", "slower")
    'faster in every round'
    >>> print(verdict([0.9, 1.1, 1.0], "faster", "slower"))
    no difference beyond the rounds' variation (not all rounds fall on one side of 1)
    """
    if min(ratios) > 1:
        return f"{more} in every round"
    if max(ratios) < 1:
        return f"{less} in every round"
    return "no difference beyond the rounds' variation (not all rounds fall on one side of 1)"


def run_label(info: Mapping[str, str], run: str = "this run") -> str:
    """A run named by its CPU and cores, as the course names runs: ``reference run (Intel Xeon, 2 cores)``.

    >>> run_label({"cpu_model": "Intel(R) Xeon(R) Processor", "cores": "2"}, "reference run")
    'reference run (Intel Xeon, 2 cores)'
    >>> run_label({"cpu_model": "AMD EPYC 7B13 64-Core Processor", "cores": 1})
    'this run (AMD EPYC, 1 core)'
    """
    words = re.sub(r"\((R|TM|tm)\)", "", str(info["cpu_model"])).split()
    cores = int(info["cores"])
    return f"{run} ({' '.join(words[:2]) or 'unknown CPU'}, {cores} core{'s' if cores != 1 else ''})"
