"""Say why, naming the object, when a worker under ``spawn`` or ``forkserver`` can't receive its work.

The error raised is torch's, type and text; minidl adds a note to it (shown under the traceback) with the name.

Those start methods pickle the dataset, ``collate_fn`` and ``worker_init_fn`` into each new process,
inside ``Process.start()``, with multiprocessing's own pickler. minidl does not pickle them a second
time to find out. It lets the real start judge. Only when that start fails does it pickle each
object again, the way the start does, to name the one at fault.
One failure is seen by no pickler: an object that pickles by reference to an interactive ``__main__``,
such as a notebook cell, which the worker can't import. torch reports it as a dead worker. minidl looks
for it once per loader, and only when ``__main__`` is interactive.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import sys
import types
import warnings
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
    """Refuse, before any worker starts, what the start would send but the worker couldn't rebuild."""
    method = _start_method(context)
    if method not in ("spawn", "forkserver"):
        return  # fork copies the parent's memory and threads share it, so nothing is pickled
    main = sys.modules.get("__main__")
    main_path = getattr(main, "__file__", None)
    if main_path is not None:
        # The worker imports the main module by name (`python -m`), or re-runs it from its path.
        # multiprocessing.spawn.get_preparation_data decides which. The path must be a file the worker can read.
        if getattr(main.__spec__, "name", None) is None and not os.path.isfile(main_path):
            raise RuntimeError(
                f"DataLoader workers started with '{method}' re-run the main script, and {main_path!r} is not a "
                "file they can read (a script piped into `python -`?): save the script to a .py file and run "
                "that, or use multiprocessing_context='fork' where the platform has it"
            )
        return
    # Here __main__ is interactive: a notebook, the REPL or `python -c`. We look once per loader, not per epoch.
    objects = _objects(loader)
    key = (method, *objects.values())
    with contextlib.suppress(TypeError):  # a loader class without weak references is looked at every time
        seen = _checked_main.get(loader)
        if seen is not None and len(seen) == len(key) and all(a is b for a, b in zip(seen, key, strict=True)):
            return
    for what, obj in objects.items():
        spotter = _MainModuleSpotter(_NullWriter())
        try:
            with _spawning(method):
                spotter.dump(obj)
        except Exception:  # noqa: BLE001 -- the real start will fail on it, and pickling_errors_named explains
            continue
        if spotter.found is not None:
            raise pickle.PicklingError(
                f"DataLoader's {what} {obj!r} can't be sent to workers started with '{method}': it refers to "
                f"{spotter.found!r}, defined in an interactive session (a notebook cell), which a worker can't "
                "import: move that definition into a .py file and import it from there"
            )
    with contextlib.suppress(TypeError):
        _checked_main[loader] = key


_PICKLE_WARNING = (  # torch 2.13's words
    "Got pickle error when attempting to start a worker Process. "
    "This might be because the worker Process arguments are not picklable. "
    "Python 3.14+ changed the multiprocessing start method in non-Mac POSIX platforms "
    "to 'forkserver', which requires the worker Process arguments to be picklable. "
    "You can also try multiprocessing.set_start_method('fork')."
)


@contextlib.contextmanager
def pickling_errors_named(context, loader):
    """Wrap ``Process.start()``. If pickling the worker's arguments fails, warn as torch does, and raise the error
    torch raises, with its own text, plus a note that names the object and says what to do."""
    try:
        yield
    except (TypeError, AttributeError, pickle.PicklingError):
        warnings.warn(_PICKLE_WARNING, stacklevel=4)
        _name_the_culprit(context, loader)
        raise
    except Exception:
        _name_the_culprit(context, loader)
        raise


def _name_the_culprit(context, loader) -> None:
    """Add a note to the exception being handled: which of the worker's objects fails to pickle, and the fix."""
    method = _start_method(context)
    if method not in ("spawn", "forkserver"):
        return
    error = sys.exception() if hasattr(sys, "exception") else sys.exc_info()[1]
    for what, obj in _objects(loader).items():
        try:
            with _spawning(method):
                ForkingPickler(_NullWriter(), pickle.HIGHEST_PROTOCOL).dump(obj)
        except Exception as culprit:  # noqa: BLE001 -- any error pickle raises is the answer we look for
            error.add_note(f"DataLoader's {what} {obj!r} can't be sent to workers started with '{method}': "
                           f"{_hint(culprit)} ({type(culprit).__name__}: {culprit})")
            return
    # none of them fails alone, so this is not a pickling problem we can name


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
    """Pickle as ``Process.start()`` does, with a Popen of ``method`` set as the spawning one.

    Lock, Queue, Value and the like refuse to pickle outside a start ("should only be shared between
    processes through inheritance"). Inside one, they hand the child a duplicate of their handle. The
    stand-in Popen only records the file descriptors a child would get. Nothing is started or duplicated.
    """
    spawn = "popen_spawn_win32" if sys.platform == "win32" else "popen_spawn_posix"
    module = {"forkserver": "popen_forkserver", "spawn": spawn}
    popen_class = importlib.import_module(f"multiprocessing.{module[method]}").Popen
    popen = popen_class.__new__(popen_class)  # made without __init__, so nothing is launched
    popen._fds = []
    mp_context.set_spawning_popen(popen)
    try:
        yield
    finally:
        mp_context.set_spawning_popen(None)


class _MainModuleSpotter(ForkingPickler):
    """Pickles as the start does, into nothing. It notes the first function or class that lives in ``__main__``."""

    found = None

    def persistent_id(self, obj):
        # A class or function is pickled by name. An instance is pickled through what its __reduce__ returns.
        # That names its class, unless the instance pickles by value. Then the worker never imports the class,
        # and torch accepts it too.
        if self.found is None and isinstance(obj, type | types.FunctionType) and obj.__module__ == "__main__":
            self.found = obj
        return None  # replace nothing, because this pass only looks


class _NullWriter:
    def write(self, b) -> int:
        # b is any bytes-like object. Python 3.14's pickler hands large buffers over uncopied, as a PickleBuffer.
        with memoryview(b) as view:
            return view.nbytes
