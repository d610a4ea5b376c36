"""A Mac as far as the course's Python code can see it, on Linux: `make mac` puts this folder on PYTHONPATH.

Python imports ``sitecustomize`` at start-up in every process (the notebook kernel, pytest, each spawned worker,
``python -m`` children), so all of them get:

- ``spawn`` as multiprocessing's default start method (macOS's default since Python 3.8);
- torch offering only the ``file_system`` sharing strategy, and defaulting to it (``set_sharing_strategy
  ("file_descriptor")`` raises torch's own ValueError, as on a Mac);
- psutil's ``memory_full_info()`` without ``pss`` (macOS gives rss, vms, pfaults, pageins, uss);
- no ``os.sched_getaffinity`` (Linux only);
- Apple silicon's accelerator: ``torch.backends.mps.is_available()`` and ``torch.mps.is_available()`` answer True
  and ``torch.accelerator`` names ``mps`` as current and available, so torch's ``DataLoader`` and minidl's turn
  ``pin_memory=True`` off with torch's MPS warning, and the course's ``minidl_course.accelerators`` says "MPS".
  Only these Python answers change: a tensor created on, or moved to, ``"mps"`` still raises (no course cell does);
- ``/proc`` and ``/dev/shm`` unreadable (FileNotFoundError) for the course's own code: ``open``, ``os.listdir``,
  ``os.scandir``, ``os.stat``, ``os.readlink``, ``os.statvfs``, ``os.open`` and what is built on them
  (``pathlib``, ``shutil.disk_usage``, ``os.path.exists``) called from ``minidl``, a notebook cell or a script,
  through the standard library or not. Installed libraries keep their own reads (psutil *is* /proc on Linux and
  sysctl on a Mac: its answers stay, less PSS).

What it is not: the C library, the kernel, torch's C++ (its file_system storage still lives in /dev/shm through
``torch_shm_manager``), ``sys.platform`` (still ``linux``: faking it breaks the standard library) and Apple silicon's
speed. See CONTRIBUTING.md, "The Mac stand-in".
"""

import builtins
import importlib.abc
import importlib.machinery
import io
import multiprocessing
import os
import sys
from collections import namedtuple

multiprocessing.set_start_method("spawn", force=True)
# multiprocessing's shared memory (RawValue, Value) lives in a file under /dev/shm on Linux only; a Mac's
# CPython puts it in the temporary directory (multiprocessing.heap.Arena has no candidates there).
import multiprocessing.heap  # noqa: E402

multiprocessing.heap.Arena._dir_candidates = []

_HIDDEN = ("/proc", "/dev/shm")
_STDLIB = tuple({os.path.dirname(os.__file__) + os.sep} - {""})


def _hidden(path) -> bool:
    try:
        path = os.fspath(path)
    except TypeError:  # a file descriptor
        return False
    if isinstance(path, bytes):
        path = path.decode(errors="replace")
    path = path if path.startswith("/") else os.path.join(_cwd(), path)
    return any(path == h or path.startswith(h + "/") for h in _HIDDEN)


def _cwd() -> str:
    try:
        return _real["getcwd"]()
    except OSError:
        return "/"


def _from_course() -> bool:
    """Whether the first caller outside the standard library is the course (minidl, a notebook cell, a script),
    not an installed library (site-packages: psutil, torch, ipykernel keep their own reads)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        stdlib = (name.startswith(_STDLIB) and "site-packages" not in name) or name.startswith("<frozen")
        if not stdlib and name != __file__:
            return "site-packages" not in name
        frame = frame.f_back
    return False


_real = {"getcwd": os.getcwd}


def _guard(module, name):
    real = getattr(module, name)

    def guarded(path=".", *args, **kwargs):
        if _hidden(path) and _from_course():
            raise FileNotFoundError(2, "No such file or directory (Mac stand-in)", os.fspath(path))
        return real(path, *args, **kwargs)

    guarded.__wrapped__ = real
    guarded.__name__ = real.__name__
    setattr(module, name, guarded)


for _name in ("listdir", "scandir", "stat", "lstat", "readlink", "statvfs", "open"):
    _guard(os, _name)
_guard(builtins, "open")
io.open = builtins.open
if hasattr(os, "sched_getaffinity"):
    del os.sched_getaffinity


# --- torch and psutil: patched when (and wherever) they are first imported -------------------------------


def _mac_torch_multiprocessing(module) -> None:
    module._sharing_strategy = "file_system"
    module._all_sharing_strategies = {"file_system"}


_MacFullMem = namedtuple("pfullmem", ["rss", "vms", "pfaults", "pageins", "uss"])


def _mac_psutil(module) -> None:
    real = module.Process.memory_full_info

    def memory_full_info(self):
        info = real(self)
        return _MacFullMem(info.rss, info.vms, 0, 0, info.uss)

    memory_full_info.__doc__ = real.__doc__
    module.Process.memory_full_info = memory_full_info


def _mac_mps_available(module) -> None:  # torch.mps and torch.backends.mps
    module.is_available = lambda: True


def _mac_accelerator(module) -> None:  # torch.accelerator: a Mac's build has MPS compiled in
    def current_accelerator(check_available: bool = False):
        return sys.modules["torch"].device("mps")

    current_accelerator.__doc__ = module.current_accelerator.__doc__
    module.current_accelerator = current_accelerator


_PATCHES = {"torch.multiprocessing": _mac_torch_multiprocessing, "psutil": _mac_psutil,
            "torch.accelerator": _mac_accelerator, "torch.mps": _mac_mps_available,
            "torch.backends.mps": _mac_mps_available}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name):  # get_source, is_package, ... for whoever asks the loader
        return getattr(self.loader, name)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, _PATCHES[fullname])
        return spec


sys.meta_path.insert(0, _PatchingFinder())
for _name, _patch in _PATCHES.items():  # already imported (not at start-up, but say so if it ever is)
    if _name in sys.modules:
        _patch(sys.modules[_name])
os.environ.setdefault("MINIDL_MAC_STANDIN", "1")
