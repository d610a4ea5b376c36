"""What the operating system lets the course see, asked in one place: each fact says whether it is there, and why not.

Some lessons look inside processes: the files a worker holds open (``/proc/<pid>/fd``), what it maps
(``/proc/<pid>/maps``), its page tables and locked pages (``/proc/<pid>/status``), its proportional set size
(PSS: ``/proc/<pid>/smaps_rollup``, or psutil), the files in ``/dev/shm``, the sharing strategies torch offers,
a private mount namespace (``unshare``). Linux has all of them; a Mac has no ``/proc`` and no readable
``/dev/shm``, psutil gives it USS but no PSS, and torch offers it only ``file_system``. Windows has fewer still.

Every fact is *probed*, not guessed from ``sys.platform``: ``open_files()`` tries to list this process's
``/proc/self/fd``, ``sharing_strategy("file_descriptor")`` asks torch. A :class:`Fact` is true when the platform
has it; when not, ``fact.line()`` is the one line a notebook prints before showing the committed Linux result.
The readers (``status_kib``, ``pss_bytes``, ``shm_files``, ...) return ``None`` where their fact is missing and
never raise for it.

>>> fact = Fact("PSS", False, "psutil gives this platform USS, not PSS")
>>> bool(fact), fact.line()
(False, "This platform can't show PSS: psutil gives this platform USS, not PSS.")
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass

SHM = "/dev/shm"  # where Linux keeps POSIX shared memory, as files
LINUX_ONLY = "Linux only"  # how a lesson that only Linux can show begins its first line
RECORDED = "committed Linux result"  # the label on a result this platform couldn't measure


@dataclass(frozen=True)
class Fact:
    """Whether this platform can show ``what``; if not, ``why_not`` says why in a few words."""

    what: str
    available: bool
    why_not: str = ""

    def __bool__(self) -> bool:
        return self.available

    def line(self) -> str:
        """One line for a notebook: what this platform shows, or what it can't and why."""
        if self.available:
            return f"This platform shows {self.what}."
        return f"This platform can't show {self.what}: {self.why_not}."


def _probe_list(folder: str) -> str:
    """Why ``folder`` can't be listed ("" if it can)."""
    try:
        os.listdir(folder)
    except OSError as e:
        return f"{folder} can't be listed ({e.strerror or type(e).__name__}; no /proc on macOS or Windows)"
    return ""


def _probe_read(path: str) -> str:
    """Why ``path`` can't be read ("" if it can)."""
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        return f"{path} can't be read ({e.strerror or type(e).__name__}; no /proc on macOS or Windows)"
    return ""


# --- the facts ----------------------------------------------------------------------------------------


def open_files() -> Fact:
    """Can the course list a process's open file descriptors and what they point at (``/proc/<pid>/fd``)?"""
    why = _probe_list("/proc/self/fd")
    return Fact("the files a process holds open (/proc/<pid>/fd)", not why, why)


def memory_maps() -> Fact:
    """Can the course read what a process has mapped into its address space (``/proc/<pid>/maps``)?"""
    why = _probe_read("/proc/self/maps")
    return Fact("the files a process has mapped (/proc/<pid>/maps)", not why, why)


def status_field(field: str) -> Fact:
    """Does ``/proc/<pid>/status`` have ``field`` (``VmPTE``: page tables, ``VmLck``: locked pages, ``VmRSS``)?"""
    what = f"{field} from /proc/<pid>/status"
    why = _probe_read("/proc/self/status")
    if not why and _status_kib_of("self", field) is None:
        why = f"this kernel's /proc/<pid>/status has no {field} line"
    return Fact(what, not why, why)


def locked_pages() -> Fact:
    """Can the course count a process's locked (``mlock``-ed) memory? (``VmLck``)"""
    fact = status_field("VmLck")
    return Fact("how much memory a process has locked (VmLck)", fact.available, fact.why_not)


def pss() -> Fact:
    """Can the course measure a process's proportional set size (``smaps_rollup``, or psutil's ``pss``)?"""
    what = "a process's proportional set size (PSS)"
    if not _probe_read("/proc/self/smaps_rollup"):
        return Fact(what, True)
    try:
        import psutil
    except ImportError:
        return Fact(what, False, "no /proc/<pid>/smaps_rollup and psutil is not installed")
    try:
        info = psutil.Process().memory_full_info()
    except (psutil.Error, OSError) as e:
        return Fact(what, False, f"psutil can't read this process's memory ({e})")
    if hasattr(info, "pss"):
        return Fact(what, True)
    return Fact(what, False, f"psutil gives this platform {', '.join(info._fields)}, no pss (PSS is Linux only)")


def uss() -> Fact:
    """Can the course measure a process's unique set size (its private pages; psutil's ``uss``)?"""
    what = "a process's private memory (USS)"
    try:
        import psutil

        info = psutil.Process().memory_full_info()
    except ImportError:
        return Fact(what, False, "psutil is not installed")
    except (psutil.Error, OSError) as e:
        return Fact(what, False, f"psutil can't read this process's memory ({e})")
    if hasattr(info, "uss"):
        return Fact(what, True)
    return Fact(what, False, f"psutil gives this platform {', '.join(info._fields)}, no uss")


def sharing_strategy(name: str = "file_descriptor") -> Fact:
    """Does torch offer sharing strategy ``name`` here? (A Mac gets only ``file_system``.)"""
    what = f"torch's {name!r} sharing strategy"
    offered = sharing_strategies()
    if name in offered:
        return Fact(what, True)
    if not offered:
        return Fact(what, False, "torch is not installed")
    return Fact(what, False, f"torch offers only {sorted(offered)} on this platform")


def dev_shm() -> Fact:
    """Can the course list ``/dev/shm``, where Linux keeps shared memory as files?"""
    try:
        os.listdir(SHM)
        shutil.disk_usage(SHM)
    except OSError as e:
        return Fact("the files in /dev/shm", False,
                    f"{SHM} can't be listed ({e.strerror or type(e).__name__}; macOS keeps shared memory "
                    f"out of the file system)")
    return Fact("the files in /dev/shm", True)


def namespaces() -> Fact:
    """Can a child get private mount and pid namespaces (Linux's ``unshare``), to fill a /dev/shm of its own?

    This says only that the pieces exist; whether the kernel lets this user make one is known by trying
    (``pitfalls.run_in_namespace`` tries, and says so when refused).
    """
    what = "a private mount and pid namespace (unshare)"
    if not os.path.exists("/proc/self/ns/mnt"):
        return Fact(what, False, "no /proc/self/ns: namespaces are a Linux feature")
    if shutil.which("unshare") is None:
        return Fact(what, False, "no `unshare` command on PATH (util-linux)")
    return Fact(what, True)


def cpu_affinity() -> Fact:
    """Does the OS say which cores this process may run on (``os.sched_getaffinity``)?"""
    if hasattr(os, "sched_getaffinity"):
        return Fact("which cores this process may use (sched_getaffinity)", True)
    return Fact("which cores this process may use (sched_getaffinity)", False,
                "os.sched_getaffinity is Linux only; the core count falls back to os.cpu_count()")


def all_facts() -> list[Fact]:
    """Every fact the course asks about, probed now."""
    return [open_files(), memory_maps(), status_field("VmPTE"), locked_pages(), pss(), uss(),
            sharing_strategy("file_descriptor"), sharing_strategy("file_system"), dev_shm(), namespaces(),
            cpu_affinity()]


# --- the readers: a value, or None where the fact is missing -------------------------------------------


def sharing_strategies() -> set[str]:
    """The sharing strategies torch offers here (empty without torch): Linux both, macOS ``{'file_system'}``."""
    try:
        import torch.multiprocessing
    except ImportError:
        return set()
    return set(torch.multiprocessing.get_all_sharing_strategies())


def _status_kib_of(pid: int | str, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def status_kib(pid: int, field: str) -> int | None:
    """One ``kB`` field of ``/proc/<pid>/status`` (``VmPTE``, ``VmRSS``, ``VmLck``, ...); None where there is none."""
    return _status_kib_of(pid, field)


def locked_bytes() -> int | None:
    """Bytes of this process's memory locked in RAM (``VmLck``); None where the platform can't say."""
    kib = _status_kib_of("self", "VmLck")
    return None if kib is None else kib * 1024


def is_shared_memory(target: str) -> bool:
    """Whether a descriptor or mapping points at a torch storage in /dev/shm (named, or unlinked: "... (deleted)")
    or an anonymous memfd."""
    return target.startswith((SHM + "/torch_", "/memfd:"))


def open_shm_files(pid: int) -> list[str] | None:
    """What ``pid``'s open descriptors that are shared-memory files point at; None without ``/proc/<pid>/fd``."""
    folder, found = f"/proc/{pid}/fd", []
    try:
        fds = os.listdir(folder)
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"{folder}/{fd}")
        except OSError:  # closed between listdir and readlink
            continue
        if is_shared_memory(target):
            found.append(target)
    return sorted(found)


def open_shm_sizes(pids: Iterable[int]) -> dict[tuple[int, int], int] | None:
    """The shared-memory files (``/dev/shm`` or memfd) the processes ``pids`` hold open: ``{(device, inode): bytes}``.

    One entry per file however many descriptors point at it. None without ``/proc``; a process that is gone is
    skipped.
    """
    if not open_files():
        return None
    seen: dict[tuple[int, int], int] = {}
    for pid in pids:
        folder = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(folder)
        except OSError:
            continue
        for fd in fds:
            path = os.path.join(folder, fd)
            try:
                if not os.readlink(path).startswith((SHM + "/", "/memfd:")):
                    continue
                st = os.stat(path)
            except OSError:
                continue
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return seen


def mapped_shm_files(pid: int) -> list[str] | None:
    """The shared-memory files mapped into ``pid``'s address space (one name per file); None without its maps."""
    names = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and is_shared_memory(fields[5].strip()):
                    names.add(fields[5].strip())
    except OSError:
        return None
    return sorted(names)


def shm_files(pids: Iterable[int] | None = None) -> list[str] | None:
    """torch's files in ``/dev/shm`` (``file_system`` leaves them there); only those ``pids`` made, if given.

    torch names each ``torch_<pid of the process that made it>_<random>_<count>``, and /dev/shm is the whole
    machine's: another program's torch files are listed too unless ``pids`` narrows it. None without /dev/shm.
    """
    prefixes = ("torch_",) if pids is None else tuple(f"torch_{pid}_" for pid in pids)
    try:
        names = os.listdir(SHM)
    except OSError:
        return None
    return sorted(name for name in names if name.startswith(prefixes))


def shm_size_bytes() -> int | None:
    """How big ``/dev/shm`` is (a tmpfs: Docker's default is 64 MiB); None where there is none to read."""
    try:
        return shutil.disk_usage(SHM).total
    except OSError:
        return None


def pss_bytes(pid: int | None = None) -> int | None:
    """Process ``pid``'s (default: this one's) proportional set size: private pages plus its share of shared ones.

    Read from ``/proc/<pid>/smaps_rollup`` (one short read), else from psutil; None where neither gives PSS.
    """
    try:
        with open(f"/proc/{'self' if pid is None else pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return getattr(_memory_full_info(pid), "pss", None)


def uss_bytes(pid: int | None = None) -> int | None:
    """Process ``pid``'s (default: this one's) unique set size, its private pages (psutil); None where unavailable."""
    return getattr(_memory_full_info(pid), "uss", None)


def _memory_full_info(pid: int | None):
    """psutil's ``memory_full_info()`` of process ``pid`` (default: this one), or None (no psutil, no such process)."""
    try:
        import psutil

        return psutil.Process(pid).memory_full_info()
    except (ImportError, OSError):
        return None
    except psutil.Error:
        return None


def pids_named(prefix: str) -> list[int] | None:
    """pids of the processes whose command name (``/proc/<pid>/comm``) starts with ``prefix``; None without /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    found = []
    for pid in filter(str.isdigit, entries):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip().startswith(prefix):
                    found.append(int(pid))
        except OSError:  # gone since the listing
            continue
    return found


def machine_cpu_seconds() -> tuple[float, float] | None:
    """CPU seconds all cores have spent busy, and in all, since boot (Linux's ``/proc/stat``); None without it.

    Two readings around a measurement say how busy the whole machine was (everyone's programs, not only ours).
    """
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + fields[4]  # idle and iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields[:8]) - idle) / tick, sum(fields[:8]) / tick  # user..steal; guest time is already in user


def linux_only(fact: Fact, lesson: str) -> str:
    """The first line of a lesson only Linux can show: what it is, and whether this platform can show it."""
    if fact:
        return f"{LINUX_ONLY}: {lesson}. This machine can show it (measured below)."
    return f"{LINUX_ONLY}: {lesson}. {fact.line()} Below: the {RECORDED}."


if __name__ == "__main__":  # python -m minidl_course.osfacts: what this platform shows
    print(f"{sys.platform}:")
    for fact in all_facts():
        print(" ", "yes" if fact else "no ", fact.what, "" if fact else f"({fact.why_not})")
