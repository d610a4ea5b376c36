"""What the benchmark tests share: run suites in a fresh interpreter, read their CSVs, check harness rows.

Imported by name (``from benchtools import ...``): pytest puts this folder on ``sys.path`` for the tests in it.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from minidl.bench.harness import COLUMNS
from minidl.bench.machine import MACHINE_FIELDS, machine_tag

ROOT = Path(__file__).resolve().parents[1]


def run_bench(*args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m minidl.bench *args`` in a fresh interpreter from the repository root, without MINIDL_QUICK."""
    full_env = {k: v for k, v in os.environ.items() if k != "MINIDL_QUICK"} | (env or {})
    return subprocess.run([sys.executable, "-m", "minidl.bench", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def read_csv(path: Path, columns: tuple[str, ...] | None = COLUMNS) -> list[dict[str, str]]:
    """A CSV's rows (at least one), checking its header is ``columns`` unless that is None."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if columns is not None:
            assert tuple(reader.fieldnames) == columns
        rows = list(reader)
    assert rows
    return rows


def check_rows(rows: list[dict[str, str]], *, first_calls: bool = False) -> None:
    """The harness's schema: machine fields on every row, and 0 < min <= median <= max over >= 3 repeats.

    ``first_calls``: rows whose method ends in "first call" (a compile, timed once) may have fewer repeats.
    """
    assert rows
    for row in rows:
        for field in MACHINE_FIELDS:
            assert row[field], f"{field} empty in {row}"
        assert row["machine_tag"] == machine_tag()
        median, low, high = float(row["median_s"]), float(row["min_s"]), float(row["max_s"])
        assert 0 < low <= median <= high, row
        assert int(row["repeats"]) >= 3 or first_calls and row["method"].endswith("first call"), row
        assert float(row["first_s"]) > 0, row
