"""Which machine a benchmark ran on: CPU, cores, Python build, library versions, and a short tag.

Every CSV row and every plot carries these facts, so numbers from two machines never get mixed up.
Versions come from package metadata, so recording torch's or Numba's version never imports them
(and a missing package is recorded as "none").
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import platform
import subprocess
import sys
import sysconfig

from minidl_course.cores import core_count, worker_sweep  # noqa: F401 (re-exported: the suites sweep with them)

MachineInfo = dict[str, str]  # field name -> value, the same fields on every CSV row

MACHINE_FIELDS = ("machine_tag", "cpu_model", "cores", "platform", "python", "python_build",
                  "numpy", "numba", "torch")


def cpu_model() -> str:
    """The CPU's marketing name, e.g. ``Intel(R) Xeon(R) Processor`` or ``Apple M2 Pro``.

    Linux lists it in ``/proc/cpuinfo``, macOS gives it through ``sysctl`` and Windows keeps it in the registry;
    elsewhere (or if those can't be read) ``platform`` says what it can, such as ``arm``.
    """
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _os_cpu_name() or platform.processor() or platform.machine()


def _os_cpu_name() -> str:
    """The CPU's name as macOS or Windows gives it; "" where neither does."""
    try:
        if sys.platform == "darwin":
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip()
        if sys.platform == "win32":
            import winreg

            key = winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, r"HARDWARE\DESCRIPTION\System\CentralProcessor\0")
            return str(winreg.QueryValueEx(key, "ProcessorNameString")[0]).strip()
    except (OSError, ImportError, ValueError, subprocess.SubprocessError):
        pass
    return ""


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
