"""How many cores this process may use, and the ``num_workers`` values worth trying on them.

The course's lessons, its exercise checkers and the benchmarks all size their sweeps with these two.
"""

from __future__ import annotations

from minidl._utils import process_cpu_count as core_count


def worker_sweep(cores: int | None = None) -> tuple[int, ...]:
    """``num_workers`` values to try on a machine with ``cores`` cores (this one's by default), past the knee.

    0, the powers of two below ``cores``, ``cores`` itself, then half as many again (twice as many on 1 or 2
    cores), so a CPU-bound loader's speed-up is seen climbing to the core count and then flattening.

    >>> [worker_sweep(c) for c in (1, 2, 8)]
    [(0, 1, 2), (0, 1, 2, 3, 4), (0, 1, 2, 4, 8, 12)]
    """
    cores = max(1, cores or core_count())
    counts = {0, cores, cores + max(1, cores // 2)}
    counts |= {2**k for k in range(cores.bit_length()) if 2**k < cores}
    if cores <= 2:
        counts.add(2 * cores)
    return tuple(sorted(counts))
