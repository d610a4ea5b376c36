"""What the exercise tests (tests/test_exercises_*.py) share: a learner's copy of a reference answer, and the
two ways of asserting that a checker refused an answer.

The reference answers live in tests/reference_answers/, and every checker refuses an answer imported from
there. A test hands a checker what a learner who wrote the answer would hand it: the same code in a module of
their own (``my_<exercise>.py``, as the solution notebooks write ``my_worker.py``), in a directory on sys.path
so that worker processes, spawned ones included, import it too.
"""

from __future__ import annotations

import atexit
import importlib
import re
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_ANSWERS = Path(__file__).resolve().parent / "reference_answers"
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])  # mean, std

_COPIES = Path(tempfile.mkdtemp(prefix="minidl_learner_answers_"))
atexit.register(shutil.rmtree, _COPIES, ignore_errors=True)
sys.path.insert(0, str(_COPIES))  # a spawned worker gets this process's sys.path, so it imports them too


def learner_copy(exercise: str) -> ModuleType:
    """The reference answer to ``exercise`` (e.g. "ch05_reorder"), as the module ``my_<exercise>`` a learner
    would have written: same code, another file, so the checkers judge it on what it does."""
    target = _COPIES / f"my_{exercise}.py"
    if not target.exists():
        shutil.copyfile(REFERENCE_ANSWERS / f"{exercise}.py", target)
    return importlib.import_module(f"my_{exercise}")


def rejects(check, answer, message, case=r"check \d+ failed, for "):
    """``check(answer)`` fails at a case, with a message matching ``message``; returns the message."""
    with pytest.raises(AssertionError, match=case) as info:
        check(answer)
    assert re.search(message, str(info.value), re.DOTALL), str(info.value)
    return str(info.value)


def rejects_with_hint(fn, *args, hint, **kwargs):
    """``fn(*args, **kwargs)`` raises AssertionError whose hint matches ``hint`` (a regex)."""
    with pytest.raises(AssertionError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "Hint:" in message or hint.startswith("(?!hint)"), message
    assert re.search(hint, message), message
    return message


def no_children_left():
    """Live children of this test process, except multiprocessing's own long-lived helpers.

    The first spawn/forkserver start in a process launches a resource tracker (and forkserver, a server)
    that stay for the life of the interpreter by design; they are not a loader's workers.
    """
    helpers = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")

    def is_helper(p):
        try:
            return any(h in " ".join(p.cmdline()) for h in helpers)
        except psutil.Error:
            return False

    return [p for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE and not is_helper(p)]


class ScriptedClock:
    """A clock for ``interleaved(..., clock=)`` that reads ``times`` as the seconds each timed call took.

    Each timed call reads the clock twice (start, end): the n-th call is made to last ``times[n]``.
    """

    def __init__(self, times):
        self.durations = list(times)
        self.now = 0.0
        self.started = False

    def __call__(self) -> float:
        if self.started:
            self.now += self.durations.pop(0)
        self.started = not self.started
        return self.now
