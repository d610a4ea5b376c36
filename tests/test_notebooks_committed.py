"""The committed notebooks are what a learner opens first: each must be one clean top-to-bottom run.

nbval re-runs them and compares outputs, but it skips the comparison for cells tagged ``nbval-ignore-output``;
a committed traceback in such a cell (a checker that failed on the recording run) would pass unseen. These
checks read the files themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").rglob("*.ipynb"))
NOTEBOOKS = [p for p in NOTEBOOKS if ".ipynb_checkpoints" not in p.parts]


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 12


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_come_from_one_run_top_to_bottom(path):
    counts = [c["execution_count"] for c in code_cells(path)]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: execution counts {counts}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_erred_unless_it_is_meant_to(path):
    erred = [(i, o["ename"]) for i, c in enumerate(code_cells(path)) for o in c.get("outputs", [])
             if o["output_type"] == "error" and "raises-exception" not in c["metadata"].get("tags", [])]
    assert not erred, f"{path.name}: code cells (index, exception) that raised in the committed run: {erred}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_markers_are_tags_not_comments(path):
    marked = [i for i, c in enumerate(code_cells(path)) if "# NBVAL" in "".join(c["source"]).upper()]
    assert not marked, f"{path.name}: code cells carrying an nbval comment instead of a tag: {marked}"
