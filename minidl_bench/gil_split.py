"""Notebook 11's last measurement: how much of a sample holds the GIL, and what that lets two threads gain.

``time_split`` times the serial loader's time per sample and its parts (``zlib.decompress``, which releases the
GIL with either Numba kernel, and the kernel, which releases it only when compiled ``nogil``); ``report`` turns
each share held, h, into two figures for n threads and sets the measured speedup beside them:

    in step   x 1 / (h + (1 - h) / n)   Amdahl: the threads decompress together, then queue for the GIL
    at most   x min(n, 1 / h)           staggered: one decompresses while the other holds the GIL
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from minidl_bench import pipeline as B
from minidl_course import png_pipeline as P


def time_split(side: int, n: int = 128, passes: int = 7) -> dict[str, float]:
    """Seconds per sample, best of ``passes`` passes over ``n`` samples, the four parts timed in turn each pass
    (the order rotating, so a busy moment weighs on none alone): the serial loader, one ``__getitem__``, the
    ``zlib.decompress`` in it and the kernel call in it."""
    ds = P.make_dataset("numba", n, side=side, kernel="cache")
    ds.warm_up()
    raws = [ds.raw(i) for i in range(n)]
    out = np.empty((3, side, side), dtype=np.float32)
    kernel, order = ds.compiled(), B.epoch_order(n)
    parts = {"loader": lambda: [batch for batch in B.make_loader("serial", ds, 0, order)],
             "__getitem__": lambda: [ds[i] for i in range(n)],
             "zlib": lambda: [zlib.decompress(ds.blobs[i]) for i in range(n)],
             "kernel": lambda: [kernel(raws[i], *ds.params(i), out) for i in range(n)]}
    names, best = list(parts), dict.fromkeys(parts, float("inf"))
    for p in range(passes):
        for name in names[p % len(names):] + names[:p % len(names)]:
            start = time.perf_counter()
            parts[name]()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: t / n for name, t in best.items()}


def report(sides: Sequence[int], measured: Callable[[int, str], float], cores: int, threads: int = 2) -> list[str]:
    """Per image side: the split, then each kernel's h, its two figures and ``measured(side, kind)`` (the run's
    speedup of ``threads`` thread workers over serial, kind ``"gil"`` or ``"nogil"``); last, how many fell where."""
    n = min(threads, cores)
    plural = "s" * (cores > 1)
    lines = [f"h: the share of a sample that holds the GIL; n = min({threads} threads, {cores} core{plural}) = {n}. "
             "Two figures:",
             "  in step  x1 / (h + (1 - h) / n)  (Amdahl: the threads decompress together, then queue for the GIL)",
             "  at most  x min(n, 1 / h)        (staggered: one decompresses while the other holds the GIL)"]
    if n == 1:
        lines.append("(one core: the two threads never run at once, so neither figure passes x1)")
    where, capped = [], []
    for side in sides:
        split = time_split(side)
        per_sample, whole, unzip, kernel = (split[part] for part in ("loader", "__getitem__", "zlib", "kernel"))
        lines.append(f"--- {side} px: the serial loader {per_sample * 1e6:.1f} µs a sample (__getitem__ "
                     f"{whole * 1e6:.1f} µs): zlib.decompress {unzip / per_sample:.0%} (GIL released by both "
                     f"kernels), the kernel {kernel / per_sample:.0%} (released only by nogil), the rest "
                     f"{max(0.0, 1 - (unzip + kernel) / per_sample):.0%}")
        if whole > per_sample:  # the loader calls __getitem__ once a sample: it cannot take less time than that
            lines.append("  (the serial loader timed faster than its own __getitem__: the machine was busy during "
                         "these passes, so these shares are rough; run this cell again)")
        for kind, released in (("gil", unzip), ("nogil", unzip + kernel)):
            h = min(1.0, max(0.0, 1 - released / per_sample))
            in_step, at_most = 1 / (h + (1 - h) / n), min(n, 1 / h) if h else n
            got = measured(side, kind)
            where.append("above" if got > at_most * 1.02 else "between" if got >= in_step else "below")
            capped += [f"{kind} at {side} px"] if at_most < n else []
            lines.append(f"{kind:>5} kernel: GIL held h = {h:.0%}: in step x{in_step:.2f}, at most x{at_most:.2f}; "
                         f"measured x{got:.2f}, " + {"above": "above the bound: the split and the run were timed "
                                                              "apart, and disagree",
                                                     "between": "between the two",
                                                     "below": "below both: time lost beyond the split"}[where[-1]])
    lines.append(f"the GIL-held share capped the gain below x{n} for: {', '.join(capped) or 'no kernel at any size'}")
    lines.append(f"measured speedups: {where.count('below')} of {len(where)} below both figures, "
                 f"{where.count('between')} between them, {where.count('above')} above")
    return lines
