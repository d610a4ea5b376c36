"""What the benchmark tests share: run suites in a fresh interpreter, read their CSVs, check harness rows.

Imported by name (``from benchtools import ...``): pytest puts this folder on ``sys.path`` for the tests in it.
"""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minidl_bench.harness import COLUMNS
from minidl_bench.machine import MACHINE_FIELDS, machine_tag

ROOT = Path(__file__).resolve().parents[1]


def run_bench(*args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m minidl_bench *args`` in a fresh interpreter from the repository root, without MINIDL_QUICK.

    If it outlives ``timeout``, every process of its tree prints its Python stacks (faulthandler, on
    SIGABRT) before the test fails, with the end of what the suite printed: the step that hung.
    """
    full_env = {k: v for k, v in os.environ.items() if k != "MINIDL_QUICK"} | (env or {}) | {"PYTHONFAULTHANDLER": "1"}
    with subprocess.Popen([sys.executable, "-m", "minidl_bench", *args], cwd=ROOT, env=full_env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stdout, stderr = _dump_and_kill(proc)
            pytest.fail(f"python -m minidl_bench {' '.join(args)} still running after {timeout} s; the end of its "
                        f"output, then each process's stacks:\n{stdout[-2000:]}\n{stderr[-12000:]}", pytrace=False)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _dump_and_kill(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGABRT the children (faulthandler prints their stacks to the shared stderr), then the suite; collect output."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for p in [*children, psutil.Process(proc.pid)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGABRT)
            time.sleep(0.5)
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        for p in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        proc.kill()
        return proc.communicate()


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
