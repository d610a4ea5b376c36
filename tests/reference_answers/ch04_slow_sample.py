"""Reference answer to ch04_slow_sample."""

from __future__ import annotations


def find_slow_sample(loader) -> int:
    """Run one epoch of a traced loader; the sample whose ``__getitem__`` took longest, by its index."""
    for _ in loader:
        pass
    getitems = [row for row in loader.trace.rows() if row["event"] == "getitem"]
    slowest = max(getitems, key=lambda row: row["end"] - row["start"])
    return int(slowest["index"])
