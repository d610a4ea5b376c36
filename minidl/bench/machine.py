"""Which machine a benchmark ran on: CPU, cores, Python build, library versions, and a short tag.

Every CSV row and every plot carries these facts, so numbers from two machines never get mixed up.
Versions come from package metadata, so recording torch's or Numba's version never imports them
(and a missing package is recorded as "none").
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import platform
import sys
import sysconfig

MachineInfo = dict[str, str]  # field name -> value, the same fields on every CSV row

MACHINE_FIELDS = ("machine_tag", "cpu_model", "cores", "platform", "python", "python_build",
                  "numpy", "numba", "torch")


def cpu_model() -> str:
    """The CPU's marketing name, e.g. ``Intel(R) Xeon(R) Processor``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def core_count() -> int:
    """Logical CPUs this process may use: ``os.process_cpu_count()`` (3.13+), else its affinity mask, else all."""
    if hasattr(os, "process_cpu_count"):
        return os.process_cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):  # Linux; a Mac has neither this nor process_cpu_count before 3.13
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_sweep(cores: int | None = None) -> tuple[int, ...]:
    """``num_workers`` values to try on a machine with ``cores`` cores (this one's by default), past the knee.

    0, the powers of two below ``cores``, ``cores`` itself, then half as many again (twice as many on 1 or 2
    cores), so a CPU-bound loader's speed-up is seen climbing to the core count and then flattening.

    >>> [worker_sweep(c) for c in (1, 2, 8)]
    [(0, 1, 2), (0, 1, 2, 3, 4), (0, 1, 2, 4, 8, 12)]
    """
    cores = max(1, cores or core_count())
    counts = {0, cores, cores + max(1, cores // 2)}
    counts |= {2**k for k in range(cores.bit_length()) if 2**k < cores}
    if cores <= 2:
        counts.add(2 * cores)
    return tuple(sorted(counts))


def python_build() -> str:
    """``gil``, ``free-threaded`` or ``free-threaded, GIL re-enabled`` (a C extension can turn it back on)."""
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "gil"
    gil_enabled = getattr(sys, "_is_gil_enabled", lambda: True)()
    return "free-threaded, GIL re-enabled" if gil_enabled else "free-threaded"


def package_version(name: str) -> str:
    """The version of ``name`` if it can be imported (it is not imported here), else ``"none"``."""
    if importlib.util.find_spec(name) is None:
        return "none"
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:  # importable but not installed as a distribution
        return "unknown"


@functools.cache
def machine_info() -> MachineInfo:
    """The fields in ``MACHINE_FIELDS``, as strings, for this process."""
    info = {
        "cpu_model": cpu_model(),
        "cores": str(core_count()),
        "platform": f"{platform.system()}-{platform.machine()}",
        "python": platform.python_version(),
        "python_build": python_build(),
        "numpy": package_version("numpy"),
        "numba": package_version("numba"),
        "torch": package_version("torch"),
    }
    return {"machine_tag": machine_tag(info), **info}


def machine_tag(info: MachineInfo | None = None) -> str:
    """A folder-friendly name such as ``x86_64-2c-py3.11-gil`` (``py3.13t-nogil`` when free-threaded)."""
    info = info or machine_info()
    major_minor = ".".join(info["python"].split(".")[:2])
    free_threaded = info["python_build"].startswith("free-threaded")
    gil = "gil" if info["python_build"] != "free-threaded" else "nogil"
    return f"{platform.machine()}-{info['cores']}c-py{major_minor}{'t' if free_threaded else ''}-{gil}"


def describe(info: MachineInfo | None = None) -> str:
    """One line naming the machine, for plot captions and printed headers."""
    info = info or machine_info()
    build = {"gil": "GIL"}.get(info["python_build"], info["python_build"])
    return (f"{info['cores']} cores ({info['cpu_model']}) · Python {info['python']} ({build}) · "
            f"torch {info['torch']} · NumPy {info['numpy']} · Numba {info['numba']}")
