"""Fail early, and say why, when a worker under ``spawn``/``forkserver`` couldn't receive its work.

Those start methods pickle the dataset, ``collate_fn`` and ``worker_init_fn`` into each new
process. Two things go wrong: the object can't be pickled at all (a lambda, a local function), or
it pickles by reference to an interactive ``__main__`` (a notebook cell) that the child can't
import, and the worker dies on start. torch reports the second as a dead worker; minidl names the
object before any worker starts.
"""

from __future__ import annotations

import pickle
import sys
import types
from typing import Any


def check_picklable(context, objects: dict[str, Any]) -> None:
    """Raise, naming the culprit, if any of ``objects`` can't reach a worker of ``context``."""
    method = context.get_start_method()
    if method == "fork":
        return  # fork copies the parent's memory: nothing is pickled
    main = sys.modules.get("__main__")
    interactive_main = main is None or not hasattr(main, "__file__")
    for what, obj in objects.items():
        hint = (
            f"DataLoader's {what} {obj!r} can't be sent to workers started with '{method}': move its "
            "definition into an importable module (a .py file) and import it from there"
        )
        pickler = _MainModuleSpotter(interactive_main)
        try:
            pickler.dump(obj)
        except (pickle.PicklingError, AttributeError, TypeError) as e:  # what pickle raises
            raise type(e)(f"{hint} ({e})") from e
        if pickler.found is not None:
            raise pickle.PicklingError(f"{hint}: it refers to {pickler.found!r}, defined in an interactive session")


class _MainModuleSpotter(pickle.Pickler):
    """Pickles into nothing, noting any function or class that lives in an interactive __main__."""

    def __init__(self, interactive_main: bool) -> None:
        super().__init__(_NullWriter(), protocol=pickle.HIGHEST_PROTOCOL)
        self.interactive_main = interactive_main
        self.found = None

    def persistent_id(self, obj):
        if self.interactive_main and self.found is None:
            owner = obj if isinstance(obj, type | types.FunctionType) else type(obj)
            if getattr(owner, "__module__", None) == "__main__":
                self.found = owner
        return None  # never replace anything: this pass only looks


class _NullWriter:
    def write(self, b) -> int:
        # Any bytes-like object: Python 3.14's pickler hands large buffers over as a PickleBuffer, uncopied.
        with memoryview(b) as view:
            return view.nbytes
