"""Say why, naming the object, when a worker under ``spawn``/``forkserver`` can't receive its work.

Those start methods pickle the dataset, ``collate_fn`` and ``worker_init_fn`` into each new process,
inside ``Process.start()``, with multiprocessing's own pickler. minidl never pickles them a second
time to find out: it lets the real start judge, and only when that start fails does it pickle each
object again, the way the start does, to name the one at fault. One failure no pickler sees: an
object that pickles by reference to an interactive ``__main__`` (a notebook cell), which the worker
can't import. torch reports it as a dead worker; minidl looks for it once per loader, and only when
``__main__`` is interactive.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import sys
import types
import weakref
from multiprocessing import context as mp_context
from multiprocessing.reduction import ForkingPickler
from typing import Any

_checked_main: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loader -> (method, *objects) looked at


def _start_method(context) -> str:
    return context.get_start_method() if hasattr(context, "get_start_method") else "thread"


def _objects(loader) -> dict[str, Any]:
    return {"dataset": loader.dataset, "collate_fn": loader.collate_fn, "worker_init_fn": loader.worker_init_fn}


def check_main_module(context, loader) -> None:
    """Before any worker starts: refuse what the start would send but the worker couldn't rebuild."""
    method = _start_method(context)
    if method not in ("spawn", "forkserver"):
        return  # fork copies the parent's memory (and threads share it): nothing is pickled
    main = sys.modules.get("__main__")
    main_path = getattr(main, "__file__", None)
    if main_path is not None:
        # The worker imports the main module by name (`python -m`), or re-runs it from its path
        # (multiprocessing.spawn.get_preparation_data): that path must be a file it can read.
        if getattr(main.__spec__, "name", None) is None and not os.path.isfile(main_path):
            raise RuntimeError(
                f"DataLoader workers started with '{method}' re-run the main script, and {main_path!r} is not a "
                "file they can read (a script piped into `python -`?): save the script to a .py file and run "
                "that, or use multiprocessing_context='fork' where the platform has it"
            )
        return
    # Interactive: a notebook, the REPL, `python -c`. One look per loader, not per epoch.
    objects = _objects(loader)
    key = (method, *objects.values())
    with contextlib.suppress(TypeError):  # a loader class without weak references: look every time
        seen = _checked_main.get(loader)
        if seen is not None and len(seen) == len(key) and all(a is b for a, b in zip(seen, key, strict=True)):
            return
    for what, obj in objects.items():
        spotter = _MainModuleSpotter(_NullWriter())
        try:
            with _spawning(method):
                spotter.dump(obj)
        except Exception:  # noqa: BLE001 -- can't be pickled at all: the real start will say so, and be explained
            continue
        if spotter.found is not None:
            raise pickle.PicklingError(
                f"DataLoader's {what} {obj!r} can't be sent to workers started with '{method}': it refers to "
                f"{spotter.found!r}, defined in an interactive session (a notebook cell), which a worker can't "
                "import: move that definition into a .py file and import it from there"
            )
    with contextlib.suppress(TypeError):
        _checked_main[loader] = key


@contextlib.contextmanager
def pickling_errors_named(context, loader):
    """Around ``Process.start()``: if pickling the worker's arguments fails, name the object and say what to do."""
    try:
        yield
    except Exception as e:
        method = _start_method(context)
        if method not in ("spawn", "forkserver"):
            raise
        for what, obj in _objects(loader).items():
            try:
                with _spawning(method):
                    ForkingPickler(_NullWriter(), pickle.HIGHEST_PROTOCOL).dump(obj)
            except Exception as culprit:  # noqa: BLE001 -- any error pickle raises is the answer we look for
                message = f"DataLoader's {what} {obj!r} can't be sent to workers started with '{method}'"
                try:
                    named = type(e)(f"{message}: {_hint(culprit)} ({type(culprit).__name__}: {culprit})")
                except Exception:  # noqa: BLE001 -- an exception type built differently: keep the original
                    raise e from None
                raise named from e
        raise  # none of them fails alone: not a pickling problem of ours


def _hint(error: Exception) -> str:
    text = str(error)
    if isinstance(error, pickle.PicklingError | AttributeError) and ("local object" in text or "lookup" in text):
        return ("a lambda, a function defined inside another, or anything not reachable by name from an importable "
                "module, can't be pickled: define it at the top level of a .py file and import it from there")
    if "fork context" in text:
        return ("it holds a lock or semaphore made in a 'fork' context: create it from the loader's context, "
                "e.g. multiprocessing.get_context('spawn').Lock()")
    if isinstance(error, TypeError) and "pickle" in text:
        return ("it holds an object that can't be pickled at all (a thread lock, an open file, a generator...): "
                "create that object in the worker (in worker_init_fn, or on first use), or leave it out in "
                "__getstate__")
    if isinstance(error, RecursionError):
        return "it is nested too deeply to pickle: flatten it, or raise sys.setrecursionlimit"
    return "pickling it raised an error"


@contextlib.contextmanager
def _spawning(method: str):
    """Pickle as ``Process.start()`` does: with a Popen of ``method`` set as the spawning one.

    Lock, Queue, Value and the like refuse to pickle outside a start ("should only be shared between
    processes through inheritance"); inside one, they hand the child a duplicate of their handle. The
    stand-in Popen only records the file descriptors a child would get: nothing is started or duplicated.
    """
    spawn = "popen_spawn_win32" if sys.platform == "win32" else "popen_spawn_posix"
    module = {"forkserver": "popen_forkserver", "spawn": spawn}
    popen_class = importlib.import_module(f"multiprocessing.{module[method]}").Popen
    popen = popen_class.__new__(popen_class)  # not launched
    popen._fds = []
    mp_context.set_spawning_popen(popen)
    try:
        yield
    finally:
        mp_context.set_spawning_popen(None)


class _MainModuleSpotter(ForkingPickler):
    """Pickles as the start does into nothing, noting any function or class that lives in ``__main__``."""

    found = None

    def persistent_id(self, obj):
        # A class or function is pickled by name; an instance only through what its __reduce__ returns, which
        # names its class unless it pickles by value (then the worker never imports it, and torch accepts it).
        if self.found is None and isinstance(obj, type | types.FunctionType) and obj.__module__ == "__main__":
            self.found = obj
        return None  # never replace anything: this pass only looks


class _NullWriter:
    def write(self, b) -> int:
        # Any bytes-like object: Python 3.14's pickler hands large buffers over as a PickleBuffer, uncopied.
        with memoryview(b) as view:
            return view.nbytes
