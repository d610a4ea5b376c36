"""What every exercise checker shares: comparing two batches leaf by leaf, and counting checks.

A checker stops at the first case where the learner's answer and the expected one disagree, and raises
AssertionError saying which case, what was expected, what came back and the likely cause. Expected values
come from torch or from the spec, never from a reference answer (those live in the repository's
``tests/reference_answers/``, outside the installed package, and no checker imports them); ``refuse_reference``
turns away an answer imported from there, and ``Tripwire`` one that hands the work to the library's own version.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType
from typing import Any

import numpy as np

from minidl.dataloader import DataLoader


def _torch():
    import torch  # imported when a check runs: `import minidl_course.exercises` itself needs only NumPy

    return torch


# --- comparing two batches ------------------------------------------------------------------------


def first_difference(expected: Any, got: Any, where: str = "batch") -> str | None:
    """Where ``got`` first differs from ``expected`` (type, keys, length, dtype, shape, value), in words.

    Returns None when they are equal, leaf by leaf. Tensors and arrays must agree in dtype and shape;
    dicts must have the same keys, in any order.

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
    """Counts the checks that passed; ``fail`` raises the first mismatch with its case and a hint."""

    def __init__(self) -> None:
        self.passed = 0

    def fail(self, case: str, problem: str, hint: str = "") -> None:
        message = f"check {self.passed + 1} failed, for {case}:\n  {problem}"
        if hint:
            message += f"\n  Hint: {hint}"
        raise AssertionError(message)

    def done(self) -> None:
        print(f"All {self.passed} checks passed")


# --- calling the learner's code ---------------------------------------------------------------------


@contextmanager
def yours(what: str, case: str, explain: Callable[[Exception], None] | None = None) -> Iterator[None]:
    """The one way a checker runs learner code: an exception it raises goes on, noted with what raised it and
    for which case; ``explain(e)``, if given, may first turn a known mistake into a hint (``checks.fail``).

    >>> with yours("collate function", "an empty batch"):
    ...     pass
    """
    try:
        yield
    except Exception as e:
        if explain is not None:
            explain(e)
        e.add_note(f"(raised by your {what}, for {case})")
        raise


def call(fn: Callable[..., Any], *args: Any, what: str, case: str,
         explain: Callable[[Exception], None] | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` run as ``yours(what, case, explain)`` runs it."""
    with yours(what, case, explain):
        return fn(*args, **kwargs)


# --- an exercise cell not filled in yet -------------------------------------------------------------


class YourTurn(Exception):
    """Raised by an exercise cell that is still to be written. Every exercise raises the same one line;
    the ``# YOUR CODE HERE`` comment in the cell says what to write.

    In a notebook it shows as that line, not a traceback: IPython calls ``_render_traceback_``. Raised in a
    DataLoader worker, it comes back wrapped with the worker's traceback; the line shown is still the message.
    The notebooks tag these cells ``raises-exception``, so Run All goes on past them.

    >>> YourTurn()._render_traceback_()
    ['YourTurn: your turn: write the code marked YOUR CODE HERE, then run this cell again']
    """

    MESSAGE = "your turn: write the code marked YOUR CODE HERE, then run this cell again"

    def __init__(self, worker_report: str | None = None) -> None:
        # A DataLoader re-raises a worker's exception as ``YourTurn(report)``, the report holding its traceback.
        super().__init__(worker_report or self.MESSAGE)

    def _render_traceback_(self) -> list[str]:
        where = " (raised in a worker)" if str(self).startswith("Caught YourTurn") else ""
        return [f"YourTurn: {self.MESSAGE}{where}"]


# --- refusing an imported reference answer ----------------------------------------------------------

# Where the reference answers live: tests/reference_answers/ in the repository (never installed), and the
# package they were in before (an old checkout may still have it).
REFERENCE_MODULES = ("reference_answers", "minidl_course.solutions")


class ReferenceAnswer(AssertionError):
    """An answer imported from the reference answers: shown as one line in a notebook, not a traceback.

    >>> ReferenceAnswer("reorder comes from reference_answers.ch05_reorder")._render_traceback_()
    ['ReferenceAnswer: reorder comes from reference_answers.ch05_reorder']
    """

    def _render_traceback_(self) -> list[str]:
        return [f"ReferenceAnswer: {self}"]


def _reference_module(answer: Any) -> str | None:
    """The reference-answer module ``answer`` (or, for a class, one of its bases) was defined in, if any."""
    for obj in getattr(answer, "__mro__", (answer,)):
        module = getattr(obj, "__module__", None)
        if isinstance(module, str) and any(module == ref or module.startswith(ref + ".") for ref in REFERENCE_MODULES):
            return module
    return None


def refuse_reference(*answers: Any) -> None:
    """Raise ReferenceAnswer, in one line, when an answer was imported from the reference answers.

    It goes by the module a function or class says it was defined in: an answer typed (or pasted) into a
    notebook cell, or into a file of the learner's own, is judged on what it does. A function of one's own that
    only calls the imported answer is not caught here (nor is a dict of settings, ch12's ``LOADER_KWARGS``).
    """
    for answer in answers:
        module = _reference_module(answer)
        if module is not None:
            name = getattr(answer, "__qualname__", None) or type(answer).__name__
            raise ReferenceAnswer(f"{name} is the reference answer, imported from {module}: the checker judges "
                                  "your own code, so write it in the cell above (the solution notebook explains one)")


# --- catching an answer that delegates to the library --------------------------------------------


def codes_of(*targets: Any) -> list[CodeType]:
    """The code objects of functions, and of every method a class defines itself."""
    codes = []
    for target in targets:
        if isinstance(target, type):
            for value in vars(target).values():
                fn = getattr(value, "__func__", value)  # staticmethod/classmethod hold the function
                if hasattr(fn, "__code__"):
                    codes.append(fn.__code__)
        else:
            codes.append(target.__code__)
    return codes


class Tripwire:
    """Notes, while active, every call of the given code objects: catches an answer that wraps the library.

    A profile hook sees each call whatever name the learner imported the function or class under, so a
    solution that only wraps the library's own implementation is caught however it reached it.

    What it sees: calls of the watched Python code in this process while it is active, in this thread, in
    threads started while it is active and, on Python 3.12+ (``threading.setprofile_all_threads``), in threads
    that were already running. What it cannot see:

    - threads already running when it starts, on Python 3.11 (no way to reach them there);
    - other processes: a forked or spawned worker does not inherit the hook (the checkers run the learner's
      code in this process, or in threads, for that reason);
    - a copy of the library's code (its source pasted into a cell, then run): only the library's own code
      objects are watched; and work done in C or compiled code (NumPy, torch's C++ kernels, Numba).

    It clears itself on exit, also when the block raised: the hooks it replaced are put back, and a thread it
    reached that is still running takes the hook off itself at its next call.

    >>> from minidl.sampler import BatchSampler
    >>> with Tripwire({code: "BatchSampler" for code in codes_of(BatchSampler)}) as wire:
    ...     _ = list(BatchSampler(range(4), 2, False))
    >>> wire.hits, sys.getprofile() is None
    (['BatchSampler'], True)
    """

    def __init__(self, watched: dict[CodeType, str]) -> None:
        self.watched = watched
        self.hits: list[str] = []
        self.active = False

    def _profile(self, frame, event: str, arg: Any) -> None:
        if not self.active:  # a thread still running after __exit__: put back what threads had before
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
    """``{"minidl's BatchSampler": (BatchSampler,), ...}`` as the ``{code: label}`` a Tripwire watches."""
    return {code: label for label, targets in label_targets.items() for code in codes_of(*targets)}


def run_watched(wire: Tripwire, run: Callable[[], Any], on_hit: Callable[[str], None]) -> Any:
    """``run()`` with ``wire`` active; if it hit the wire, ``on_hit(what)`` decides, whatever ``run`` raised.

    Delegation is reported first: a wrapped library call that also gets something wrong is still a wrapper.
    """
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
