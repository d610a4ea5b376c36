"""scripts/repeat_cells.py: a notebook run several times, and the cell that ran long in one run is named."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import repeat_cells  # noqa: E402  (scripts/ is not a package)


def test_ran_long_doctest():
    assert doctest.testmod(repeat_cells).failed == 0


@pytest.mark.timeout(240)
def test_a_cell_slow_in_one_run_only_is_reported_with_its_index(tmp_path):
    marker = tmp_path / "first-run-done"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# two code cells"),
                nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell(  # 4 s in the first run only
                    f"import pathlib, time\nm = pathlib.Path({str(marker)!r})\n"
                    "if not m.exists():\n    time.sleep(4)\n    m.touch()")]
    path = tmp_path / "slow_once.ipynb"
    nbformat.write(nb, path)
    csv = tmp_path / "cells.csv"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "repeat_cells.py"), str(path), "--runs", "3",
                           "--methods", "spawn", "--csv", str(csv)], capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stderr
    assert "cell 2: median" in done.stdout and "ran long 1 of 3" in done.stdout, done.stdout
    assert "cell 1:" not in done.stdout
    assert len(csv.read_text().splitlines()) == 1 + 3 * 2  # header, then 3 runs x 2 code cells
