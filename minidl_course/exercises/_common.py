"""What every checker shares: comparing batches, counting checks, calling the learner's code, refusing a
reference answer or one that hands the work to the library.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType
from typing import Any

import numpy as np

from minidl.dataloader import DataLoader


def _torch():
    import torch  # only when a check runs: importing the checkers needs NumPy alone

    return torch


# --- comparing two batches ------------------------------------------------------------------------


def first_difference(expected: Any, got: Any, where: str = "batch") -> str | None:
    """Where ``got`` first differs from ``expected`` (type, keys, length, dtype, shape, value), in words; None if
    they are equal. Dict keys may come in any order.

    >>> first_difference({"x": [1, 2]}, {"x": [1, 3]})
    "batch['x'][1] should be 2, but it is 3"
    >>> first_difference((1, "a"), (1, "a")) is None
    True
    """
    torch = _torch()
    if type(got) is not type(expected):
        return f"{where} should be {_type_name(expected)}, but it is {_type_name(got)}"
    if isinstance(expected, torch.Tensor | np.ndarray):
        if got.dtype != expected.dtype:
            return f"{where} should have dtype {expected.dtype}, but it has dtype {got.dtype}"
        if tuple(got.shape) != tuple(expected.shape):
            return f"{where} should have shape {tuple(expected.shape)}, but it has shape {tuple(got.shape)}"
        differs = (got != expected) if isinstance(got, np.ndarray) else (got != expected).numpy()
        if differs.any():
            pos = tuple(int(i) for i in np.argwhere(differs)[0])
            return (f"{where}[{', '.join(map(str, pos))}] should be {expected[pos].item()!r}, "
                    f"but it is {got[pos].item()!r}")
        return None
    if isinstance(expected, dict):
        if set(got) != set(expected):  # the same keys, in any order
            return f"{where} should have the keys {list(expected)}, but it has {list(got)}"
        for key in expected:
            found = first_difference(expected[key], got[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(expected, list | tuple):
        if len(got) != len(expected):
            return f"{where} should have {len(expected)} elements, but it has {len(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            found = first_difference(e, g, f"{where}[{i}]")
            if found:
                return found
        return None
    if got != expected:
        return f"{where} should be {expected!r}, but it is {got!r}"
    return None


def _type_name(obj: Any) -> str:
    """``obj``'s type with an article: "a list", "an int", "a torch.Tensor"."""
    t = type(obj)
    name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _loaders() -> tuple[tuple[str, type], ...]:
    """minidl's DataLoader and torch's: an answer must work in both."""
    return ("minidl.DataLoader", DataLoader), ("torch.utils.data.DataLoader", _torch().utils.data.DataLoader)


class _Checks:
    """Counts the checks passed; ``fail`` raises the first mismatch with its case and a hint."""

    def __init__(self) -> None:
        self.passed = 0

    def fail(self, case: str, problem: str, hint: str = "") -> None:
        message = f"check {self.passed + 1} failed, for {case}:\n  {problem}"
        if hint:
            message += f"\n  Hint: {hint}"
        raise AssertionError(message)

    def done(self) -> None:
        print(f"All {self.passed} checks passed")


def first_hint(default: str, *cases: tuple[Any, str]) -> str:
    """A hint tree as a table: the hint of the first ``(condition, hint)`` that holds, else ``default``.

    >>> first_hint("count again", (False, "off by one"), (True, "stop is excluded"))
    'stop is excluded'
    """
    return next((hint for holds, hint in cases if holds), default)


def defined_in_cell(fn: Any) -> bool:
    """True when ``fn`` was defined in a notebook cell, which a worker started by spawn or forkserver can't import."""
    return getattr(fn, "__module__", None) == "__main__" and not hasattr(sys.modules.get("__main__"), "__file__")


# --- calling the learner's code ---------------------------------------------------------------------


@contextmanager
def yours(what: str, case: str, explain: Callable[[Exception], None] | None = None) -> Iterator[None]:
    """The one way a checker runs learner code: an exception from it goes on with a note saying what raised it,
    for which case; ``explain(e)`` may first turn a known mistake into a hint."""
    try:
        yield
    except Exception as e:
        if explain is not None:
            explain(e)
        e.add_note(f"(raised by your {what}, for {case})")
        raise


def call(fn: Callable[..., Any], *args: Any, what: str, case: str,
         explain: Callable[[Exception], None] | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` inside ``yours(what, case, explain)``."""
    with yours(what, case, explain):
        return fn(*args, **kwargs)


# --- an exercise cell not filled in yet -------------------------------------------------------------


class YourTurn(Exception):
    """Raised by an exercise cell not written yet. IPython shows it as one line (``_render_traceback_``); cells
    that raise it are tagged ``raises-exception`` so Run All goes on.

    >>> YourTurn()._render_traceback_()
    ['YourTurn: your turn: write the code marked YOUR CODE HERE, then run this cell again']
    """

    MESSAGE = "your turn: write the code marked YOUR CODE HERE, then run this cell again"

    def __init__(self, worker_report: str | None = None) -> None:
        super().__init__(worker_report or self.MESSAGE)

    def _render_traceback_(self) -> list[str]:
        # IPython keeps the last exception, and its frames would keep a half-read DataLoader iterator (and its
        # workers) alive after the cell: clear them, now that IPython is done with them.
        traceback.clear_frames(self.__traceback__)
        where = " (raised in a worker)" if str(self).startswith("Caught YourTurn") else ""
        return [f"YourTurn: {self.MESSAGE}{where}"]


# --- refusing an imported reference answer ----------------------------------------------------------

REFERENCE_MODULES = ("reference_answers", "minidl_course.solutions")  # tests/reference_answers/; the old package


class ReferenceAnswer(AssertionError):
    """An answer imported from the reference answers, shown as one line.

    >>> ReferenceAnswer("reorder comes from reference_answers.ch05_reorder")._render_traceback_()
    ['ReferenceAnswer: reorder comes from reference_answers.ch05_reorder']
    """

    def _render_traceback_(self) -> list[str]:
        return [f"ReferenceAnswer: {self}"]


def _reference_module(answer: Any) -> str | None:
    """The reference-answer module ``answer`` (or a base class) was defined in, if any."""
    for obj in getattr(answer, "__mro__", (answer,)):
        module = getattr(obj, "__module__", None)
        if isinstance(module, str) and any(module == ref or module.startswith(ref + ".") for ref in REFERENCE_MODULES):
            return module
    return None


def refuse_reference(*answers: Any) -> None:
    """Raise ReferenceAnswer when an answer was defined in the reference answers. An answer typed into a cell is
    judged on what it does."""
    for answer in answers:
        module = _reference_module(answer)
        if module is not None:
            name = getattr(answer, "__qualname__", None) or type(answer).__name__
            raise ReferenceAnswer(f"{name} is the reference answer, imported from {module}: the checker judges "
                                  "your own code, so write it in the cell above (the solution notebook explains one)")


# --- catching an answer that delegates to the library --------------------------------------------


def codes_of(*targets: Any) -> list[CodeType]:
    """The code objects of functions, and of every method a class defines itself."""
    fns = [getattr(v, "__func__", v) for t in targets for v in (vars(t).values() if isinstance(t, type) else [t])]
    return [fn.__code__ for fn in fns if hasattr(fn, "__code__")]


class Tripwire:
    """While active, notes every call of the watched code objects, whatever name the learner reached them by: it
    catches an answer that only wraps the library. It cannot see other processes (the checkers run the learner's
    code here or in threads), a copy of the library's code pasted into a cell, compiled code, nor
    threads already running when it starts, on Python 3.11. On exit it puts back the hooks it replaced.

    >>> from minidl.sampler import BatchSampler
    >>> with Tripwire(watch({"BatchSampler": (BatchSampler,)})) as wire:
    ...     _ = list(BatchSampler(range(4), 2, False))
    >>> wire.hits, sys.getprofile() is None
    (['BatchSampler'], True)
    """

    def __init__(self, watched: dict[CodeType, str]) -> None:
        self.watched = watched
        self.hits: list[str] = []
        self.active = False

    def _profile(self, frame, event: str, arg: Any) -> None:
        if not self.active:  # a thread still running after __exit__
            sys.setprofile(self._saved[1])
            return
        if event == "call":
            name = self.watched.get(frame.f_code)
            if name is not None and name not in self.hits:
                self.hits.append(name)

    def __enter__(self) -> Tripwire:
        self._saved = sys.getprofile(), threading.getprofile()
        self.active = True
        every_thread = getattr(threading, "setprofile_all_threads", None)  # Python 3.12+
        if every_thread is not None:
            every_thread(self._profile)  # running threads, and those started from now on
        else:
            threading.setprofile(self._profile)  # 3.11: only threads started from now on
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.active = False
        every_thread = getattr(threading, "setprofile_all_threads", None)
        if every_thread is not None:
            every_thread(self._saved[1])
        else:
            threading.setprofile(self._saved[1])
        sys.setprofile(self._saved[0])


def watch(label_targets: dict[str, tuple[Any, ...]]) -> dict[CodeType, str]:
    """``{label: (functions or classes)}`` as the ``{code: label}`` a Tripwire watches."""
    return {code: label for label, targets in label_targets.items() for code in codes_of(*targets)}


def run_watched(wire: Tripwire, run: Callable[[], Any], on_hit: Callable[[str], None]) -> Any:
    """``run()`` with ``wire`` active; a hit goes to ``on_hit`` first, whatever ``run`` raised."""
    try:
        with wire:
            result = run()
    except Exception:
        if not wire.hits:
            raise
        result = None
    if wire.hits:
        on_hit(wire.hits[0])
    return result


def _short(obj: Any) -> str:
    """``obj``'s type and repr, cut to fit on a line."""
    text = repr(obj)
    return f"{_type_name(obj)}: {text if len(text) < 80 else text[:77] + '...'}"
