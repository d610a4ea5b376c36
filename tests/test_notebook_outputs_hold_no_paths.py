"""A committed output shows what a learner sees, not where the recording machine keeps its files.

A path such as ``/home/<someone>/...`` or a virtual environment's ``site-packages`` in a committed output is the
recording machine's, wrong on every other; outputs name files relative to the repository (or mask them, as the
course's tracebacks do with ``.../worker.py``). The chapters and the exercises are read as files, nothing is run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
CHAPTERS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted((NOTEBOOKS_DIR / "exercises").glob("*.ipynb"))
MACHINE_PATH = re.compile(r"(/work/|/root/|/home/\w|/Users/\w|/tmp/\w|/private/var/|site-packages|[A-Z]:\\Users)")


def output_text(output: dict) -> str:
    data = output.get("data", {})
    return "".join(output.get("text", "")) + "".join(data.get("text/plain", "")) + "".join(data.get("text/html", "")) \
        + "\n".join(output.get("traceback", []))


def test_every_chapter_and_exercise_is_read():
    assert len(CHAPTERS) >= 12 and len(EXERCISES) >= 20


def test_the_pattern_catches_a_machines_paths_and_spares_the_repositorys():
    assert all(MACHINE_PATH.search(s) for s in ("/home/ada/minidl/x.py", "/tmp/tmpab12/train.py",
                                               ".venv/lib/python3.11/site-packages/torch/x.py", "/Users/ada/x"))
    assert not any(MACHINE_PATH.search(s) for s in ("results/x86_64-2c-py3.11-gil", "minidl_course/start_script.py",
                                                   "/dev/shm/torch_1_2_3", "/proc/<pid>/fd"))


@pytest.mark.parametrize("path", CHAPTERS + EXERCISES, ids=lambda p: p.name)
def test_no_committed_output_holds_a_path_of_the_machine_that_ran_it(path):
    cells = json.loads(path.read_text())["cells"]
    found = [(i, m.group()) for i, c in enumerate(cells) for o in c.get("outputs", [])
             for m in MACHINE_PATH.finditer(output_text(o))]
    assert not found, f"{path.name}: (cell, path) in committed outputs: {found[:5]}"
