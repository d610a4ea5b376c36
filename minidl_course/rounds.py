"""Rotating rounds: how every side-by-side measurement in the course and the bench takes turns.

Things compared are timed in rounds, one turn each per round, the order rotating by one each round, so each
runs first, second, ... equally often and all of them meet the same moments of a busy machine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def rotating(names: Sequence[T], rounds: int, warmup: bool = True) -> Iterator[tuple[int, T]]:
    """``(round, name)`` for each turn: round -1 first (the warm-up) when ``warmup``, then rounds 0 to ``rounds - 1``.

    >>> [f"{r}{n}" for r, n in rotating("ab", 2)]
    ['-1b', '-1a', '0a', '0b', '1b', '1a']
    """
    names = list(names)
    for r in range(-1 if warmup else 0, rounds):
        yield from ((r, name) for name in names[r % len(names):] + names[:r % len(names)])
