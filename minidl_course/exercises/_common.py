"""What every checker shares: counting checks, running learner code, the first difference, refusing borrowed work."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType
from typing import Any

import numpy as np

from minidl.dataloader import DataLoader

Library = dict[str, tuple[Any, ...]]  # {label: the functions or classes an answer must not hand its work to}
Explain = Callable[[Exception], None] | None  # may turn an exception from the learner's code into a failed check
REFERENCE_MODULES = ("reference_answers", "minidl_course.solutions")  # tests/reference_answers/; the old package


def _torch():
    import torch  # only when a check runs: importing the checkers needs NumPy alone
    return torch


def _loaders() -> tuple[tuple[str, type], ...]:  # an answer must work in minidl's DataLoader and torch's
    return ("minidl.DataLoader", DataLoader), ("torch.utils.data.DataLoader", _torch().utils.data.DataLoader)


class _Checks:
    """Counts the checks passed; ``fail`` raises the first mismatch with its case and a hint; refuses a reference."""

    def __init__(self, *answers: Any) -> None:
        refuse_reference(*answers)
        self.passed = 0

    def fail(self, case: str, problem: str, hint: str = "") -> None:
        raise AssertionError(f"check {self.passed + 1} failed, for {case}:\n  {problem}"
                             + (f"\n  Hint: {hint}" if hint else ""))

    def first(self, case: str, *rows: tuple[Any, str, str]) -> None:
        """Fail with the first ``(fails, problem, hint)`` whose ``fails`` holds."""
        for fails, problem, hint in rows:
            if fails:
                self.fail(case, problem, hint)

    def done(self) -> None:
        print(f"All {self.passed} checks passed")

    @contextmanager
    def watching(self, library: Library, case: str, problem: str, hint: str) -> Iterator[None]:
        """A call of ``library`` (a class: its methods) in the block fails the check, whatever it raised, as ``{0}``."""
        fns = {getattr(v, "__func__", v): label for label, targets in library.items() for t in targets
               for v in (vars(t).values() if isinstance(t, type) else [t])}
        wire = Tripwire({fn.__code__: label for fn, label in fns.items() if hasattr(fn, "__code__")})
        try:
            with wire:
                yield
        except Exception:
            if not wire.hits:
                raise
        if wire.hits:
            self.fail(case, problem.format(wire.hits[0]), hint.format(wire.hits[0]))

    def watched(self, library: Library, case: str, problem: str, hint: str, fn: Callable[..., Any], *args: Any,
                what: str | None = None, explain: Explain = None) -> Any:
        """``fn(*args)`` under ``watching``; with ``what``, ``fn`` is the learner's, run by ``call``."""
        with self.watching(library, case, problem, hint):
            return call(fn, *args, what=what, case=case, explain=explain) if what else fn(*args)

    def refuse_cell_function(self, fn: Any, hint: str, start_method: str | None = None) -> None:
        """Fail when ``fn`` was defined in a notebook cell and workers start other than by fork: they import it."""
        method = start_method or multiprocessing.get_start_method()
        if (method != "fork" and getattr(fn, "__module__", None) == "__main__"
                and not hasattr(sys.modules.get("__main__"), "__file__")):
            self.fail(f"{getattr(fn, '__name__', fn)!r}, defined in this notebook", f"workers started with {method} "
                      "can't import a function defined in a notebook cell", hint)


def first_hint(default: str, *cases: tuple[Any, str]) -> str:
    """A hint tree as a table: the hint of the first ``(condition, hint)`` that holds, else ``default``."""
    return next((hint for holds, hint in cases if holds), default)


@contextmanager
def yours(what: str, case: str, explain: Explain = None) -> Iterator[None]:
    """How a checker runs learner code: an exception gets a note of what raised it, unless ``explain(e)`` fails it."""
    try:
        yield
    except Exception as e:
        if explain is not None:
            explain(e)
        e.add_note(f"(raised by your {what}, for {case})")
        raise


def call(fn: Callable[..., Any], *args: Any, what: str, case: str, explain: Explain = None, **kwargs: Any) -> Any:
    with yours(what, case, explain):
        return fn(*args, **kwargs)


def first_difference(expected: Any, got: Any, where: str = "batch") -> str | None:
    """Where ``got`` first differs from ``expected`` (type, keys, length, dtype, shape, value), in words, e.g.
    "batch['x'][1] should be 2, but it is 3"; None if they are equal. Dict keys may come in any order."""
    torch = _torch()
    if type(got) is not type(expected):
        return f"{where} should be {_type_name(expected)}, but it is {_type_name(got)}"
    if isinstance(expected, torch.Tensor | np.ndarray):
        if got.dtype != expected.dtype:
            return f"{where} should have dtype {expected.dtype}, but it has dtype {got.dtype}"
        if tuple(got.shape) != tuple(expected.shape):
            return f"{where} should have shape {tuple(expected.shape)}, but it has shape {tuple(got.shape)}"
        differs = (got != expected) if isinstance(got, np.ndarray) else (got != expected).numpy()
        if not differs.any():
            return None
        pos = tuple(int(i) for i in np.argwhere(differs)[0])
        return f"{where}[{', '.join(map(str, pos))}] should be {expected[pos].item()!r}, but it is {got[pos].item()!r}"
    if isinstance(expected, dict) and set(got) != set(expected):
        return f"{where} should have the keys {list(expected)}, but it has {list(got)}"
    if isinstance(expected, list | tuple) and len(got) != len(expected):
        return f"{where} should have {len(expected)} elements, but it has {len(got)}"
    if isinstance(expected, dict | list | tuple):
        keys = expected if isinstance(expected, dict) else range(len(expected))
        return next(filter(None, (first_difference(expected[k], got[k], f"{where}[{k!r}]") for k in keys)), None)
    return f"{where} should be {expected!r}, but it is {got!r}" if got != expected else None


def _type_name(obj: Any) -> str:  # "a list", "an int", "a torch.Tensor"
    t = type(obj)
    name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _short(obj: Any) -> str:  # type and repr, cut to fit on a line
    return f"{_type_name(obj)}: {text if len(text := repr(obj)) < 80 else text[:77] + '...'}"


class YourTurn(Exception):
    """Raised by an exercise cell not written yet, shown by IPython as one line (cells tagged ``raises-exception``)."""

    MESSAGE = "your turn: write the code marked YOUR CODE HERE, then run this cell again"

    def __init__(self, worker_report: str | None = None) -> None:
        super().__init__(worker_report or self.MESSAGE)

    def _render_traceback_(self) -> list[str]:
        # IPython keeps the last exception, and its frames would keep a half-read DataLoader iterator (and its
        # workers) alive after the cell: clear them, now that IPython is done with them.
        traceback.clear_frames(self.__traceback__)
        where = " (raised in a worker)" if str(self).startswith("Caught YourTurn") else ""
        return [f"YourTurn: {self.MESSAGE}{where}"]


class ReferenceAnswer(AssertionError):
    """An answer imported from the reference answers, shown as one line."""

    def _render_traceback_(self) -> list[str]:
        return [f"ReferenceAnswer: {self}"]


def refuse_reference(*answers: Any) -> None:
    """Raise ReferenceAnswer when an answer (or a base class) was defined in the reference answers."""
    for answer in answers:
        for obj in getattr(answer, "__mro__", (answer,)):
            module = getattr(obj, "__module__", None)
            if isinstance(module, str) and any(module == r or module.startswith(r + ".") for r in REFERENCE_MODULES):
                name = getattr(answer, "__qualname__", None) or type(answer).__name__
                raise ReferenceAnswer(f"{name} is the reference answer, imported from {module}: the checker judges "
                                      "your own code: write it in the cell above (the solution notebook explains one)")


class Tripwire:
    """While active, notes every call of the watched code objects, however reached: an answer that wraps the library.
    Blind to other processes, a copy of the library's code pasted into a cell, compiled code,
    and threads already running when it starts, on Python 3.11."""

    def __init__(self, watched: dict[CodeType, str]) -> None:
        self.watched, self.hits, self.active = watched, [], False

    def _profile(self, frame, event: str, arg: Any) -> None:
        if not self.active:  # a thread still running after __exit__
            sys.setprofile(self._saved[1])
        elif event == "call":
            name = self.watched.get(frame.f_code)
            if name is not None and name not in self.hits:
                self.hits.append(name)

    @staticmethod
    def _every_thread(profile: Any) -> None:
        # Python 3.12+ reaches running threads and those started from now on; 3.11 only those started from now on
        getattr(threading, "setprofile_all_threads", threading.setprofile)(profile)

    def __enter__(self) -> Tripwire:
        self._saved = sys.getprofile(), threading.getprofile()
        self.active = True
        self._every_thread(self._profile)  # __exit__ puts back the hooks it replaced
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.active = False
        self._every_thread(self._saved[1])
        sys.setprofile(self._saved[0])
