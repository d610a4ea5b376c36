"""A notebook reads as a lesson, not a test suite (STYLE.md, lesson 17): short prose cells, chapters a learner reads
in a sitting, code cells read in one look, and nothing on screen that is there for a linter or a test runner.

Words are counted as the before-stop hook counts them: runs of word characters, each inline code span one word.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "notebooks"
CHAPTERS = sorted(ROOT.glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))

MARKDOWN_CELL_WORDS = 150
CHAPTER_PROSE_WORDS = 2000
CODE_CELL_LINES = 40
# On a learner's screen these are notes to a tool, not to the reader: linters, nbval, the course's own tests.
TOOL_MARKS = re.compile(r"\bnoqa\b|NBVAL_|\(ignored:|#\s*type:\s*ignore|#\s*pragma\b")
HEDGE = re.compile(r"the cell says whether", re.IGNORECASE)


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell.get("source", ""))


def words(markdown: str) -> int:
    return len(re.findall(r"\w+", re.sub(r"`[^`]*`", "x", markdown)))


def test_there_are_chapters_and_exercises():
    assert len(CHAPTERS) >= 12 and len(EXERCISES) >= 2


@pytest.mark.parametrize("path", CHAPTERS + EXERCISES, ids=lambda p: p.name)
def test_no_markdown_cell_is_over_150_words(path):
    long = {i: words(source(c)) for i, c in enumerate(cells(path)) if c["cell_type"] == "markdown"}
    assert {i: n for i, n in long.items() if n > MARKDOWN_CELL_WORDS} == {}, f"{path.name}: cell index -> words"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_a_chapter_holds_at_most_2000_words_of_prose(path):
    total = sum(words(source(c)) for c in cells(path) if c["cell_type"] == "markdown")
    assert total <= CHAPTER_PROSE_WORDS, f"{path.name}: {total} words of prose"


@pytest.mark.parametrize("path", CHAPTERS + EXERCISES, ids=lambda p: p.name)
def test_no_code_cell_is_over_40_lines(path):
    long = {i: len(source(c).splitlines()) for i, c in enumerate(cells(path)) if c["cell_type"] == "code"}
    assert {i: n for i, n in long.items() if n > CODE_CELL_LINES} == {}, f"{path.name}: cell index -> lines"


@pytest.mark.parametrize("path", CHAPTERS + EXERCISES, ids=lambda p: p.name)
def test_no_linter_or_test_marks_in_code_a_learner_reads(path):
    marked = [i for i, c in enumerate(cells(path)) if c["cell_type"] == "code" and TOOL_MARKS.search(source(c))]
    assert marked == [], f"{path.name}: cells {marked} carry a tool's mark (use cell tags or restructure)"


@pytest.mark.parametrize("path", CHAPTERS + EXERCISES, ids=lambda p: p.name)
def test_the_cell_says_whether_hedge_comes_at_most_once(path):
    count = sum(len(HEDGE.findall(source(c))) for c in cells(path) if c["cell_type"] == "markdown")
    assert count <= 1, f"{path.name}: 'the cell says whether' {count} times"


def test_the_counting_rules():
    assert words("Two `inline code spans` count as `one` word each.") == 7
    assert TOOL_MARKS.search("x = 1  # noqa: E702") and TOOL_MARKS.search("# NBVAL_IGNORE_OUTPUT")
    assert TOOL_MARKS.search("# ruff: noqa: F401")
    assert not TOOL_MARKS.search("print('no marks here')")
