"""Reference answer to exercise ch09 (timing thread and process workers in interleaved rounds). Checkers refuse it
imported."""

from __future__ import annotations

import time

METHODS = ("multiprocessing", "thread")


def time_methods(run_epoch, rounds):
    for method in METHODS:
        run_epoch(method)  # warm-up: first-time imports and caches
    seconds = {method: [] for method in METHODS}
    for r in range(rounds):
        for method in (METHODS if r % 2 == 0 else METHODS[::-1]):
            start = time.perf_counter()
            run_epoch(method)
            seconds[method].append(time.perf_counter() - start)
    return seconds
