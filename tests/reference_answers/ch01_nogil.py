"""Reference answer to exercise ch01 (a GIL-releasing Numba kernel, and its speedup on two threads). Checkers refuse
it imported."""

from __future__ import annotations

import time

import numba

from minidl_course.exercises.ch01_nogil import one_thread, two_threads


@numba.njit(nogil=True, cache=False)
def collatz_steps(start: int, stop: int) -> int:
    total = 0
    for n in range(start, stop):
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            total += 1
    return total


def thread_speedups(kernel, span, rounds):
    kernel(1, 10)  # compile (if it must) before anything is timed
    ratios = []
    for r in range(rounds):
        took = {}
        for name in (("one", "two") if r % 2 == 0 else ("two", "one")):
            run = one_thread if name == "one" else two_threads
            start = time.perf_counter()
            run(kernel, 1, 1 + span)
            took[name] = time.perf_counter() - start
        ratios.append(took["one"] / took["two"])
    return ratios
