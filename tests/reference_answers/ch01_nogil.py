"""Reference answer to exercise ch01 (a GIL-releasing Numba kernel). Checkers refuse it imported."""

from __future__ import annotations

import numba


@numba.njit(nogil=True, cache=False)
def collatz_steps(start: int, stop: int) -> int:
    total = 0
    for n in range(start, stop):
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            total += 1
    return total
