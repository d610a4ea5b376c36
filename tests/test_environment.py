"""The project's setup files agree: environment.yml pins exactly what pyproject.toml pins."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pins(requirements) -> dict[str, str]:
    pins = {}
    for req in requirements:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;]+)\s*", req)
        assert m, f"not an exact pin: {req!r}"
        pins[m.group(1).lower()] = m.group(2)
    return pins


def pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for name, extra in project["optional-dependencies"].items():
        # `ft` pins the free-threaded venv's packages (.venv-ft, made by `make ft` with a CPython 3.13t):
        # conda users don't get that build, so environment.yml leaves them out; and two of its pins
        # differ from the other groups' on purpose (pillow, hypothesis: see the comment on `ft`).
        if name != "ft":
            reqs += extra
    return _pins(reqs)


def environment_pins() -> dict[str, str]:
    # environment.yml's pip section is a flat list of "- name==version" lines under "- pip:".
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    reqs = [line.strip()[2:] for line in lines[start + 1:] if line.strip().startswith("- ")]
    return _pins(reqs)


def test_environment_yml_and_pyproject_name_the_same_packages_and_pins():
    assert environment_pins() == pyproject_pins()


def test_torch_is_pinned_to_2_13_0():
    assert pyproject_pins()["torch"] == "2.13.0"


def test_environment_yml_python_matches_requires_python():
    text = (ROOT / "environment.yml").read_text()
    version = re.search(r"-\s*python=(\d+\.\d+)", text).group(1)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={version}"


def test_make_picks_the_newest_python_that_runs(tmp_path):
    # pyenv-style shims: python3.14 is on PATH but fails when run; python3.13 is too new for nothing; 3.12 works.
    import subprocess
    import sys
    from pathlib import Path

    for name, works in (("python3.14", False), ("python3.12", True), ("python3.11", True), ("python3.15", True)):
        shim = tmp_path / name
        shim.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n" if works else "#!/bin/sh\nexit 127\n")
        shim.chmod(0o755)
    script = Path(__file__).resolve().parents[1] / "scripts" / "find_python.sh"
    env = {"PATH": str(tmp_path)}  # nothing else: the script needs only shell builtins
    found = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert found == "python3.12"  # 3.15 is past what the pins support, 3.14 doesn't run
    (tmp_path / "python3.12").unlink()
    (tmp_path / "python3.11").unlink()
    none = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True)
    assert none.returncode == 1 and "Python 3.11 to 3.14" in none.stderr


def test_the_nbval_sanitize_file_makes_two_machines_print_the_same_line():
    # nbval is in .venv, where the notebooks run; the free-threaded venv (make test-ft) runs no notebook.
    get_sanitize_patterns = pytest.importorskip("nbval.plugin").get_sanitize_patterns

    from minidl_bench.machine import describe

    patterns = get_sanitize_patterns((ROOT / "tests" / "nbval_sanitize.cfg").read_text())

    def sanitized(text: str) -> str:
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    base = {"python": "3.11.7", "python_build": "gil", "torch": "2.13.0", "numpy": "2.4.6", "numba": "0.68.1"}
    intel = describe({**base, "cores": 2, "cpu_model": "Intel(R) Xeon(R) CPU E5-2690 v4 @ 2.60GHz"})
    amd = describe({**base, "cores": 64, "cpu_model": "AMD EPYC 7763 64-Core Processor"})
    assert intel != amd
    assert sanitized(intel) == sanitized(amd)
    assert sanitized(intel).endswith("Python 3.11.7 (GIL) · torch 2.13.0 · NumPy 2.4.6 · Numba 0.68.1")


def test_the_wheel_ships_license_and_notice_and_its_metadata_names_them(tmp_path):
    # Built from a copy (setuptools writes build/ and *.egg-info next to pyproject.toml), without build
    # isolation: the venv's setuptools builds it, no package index is needed.
    import shutil
    import subprocess
    import sys
    import zipfile

    # The free-threaded .venv-ft (make test-ft) may have no setuptools; .venv has (84 here).
    pytest.importorskip("setuptools", minversion="77", reason="building the wheel needs setuptools >= 77")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "minidl", src / "minidl", ignore=shutil.ignore_patterns("__pycache__"))
    code = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=src, capture_output=True,
                            text=True, timeout=100)
    assert result.returncode == 0, result.stderr
    wheel = tmp_path / "dist" / result.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as zf:
        info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(f"{info}/METADATA").decode()
        shipped = {name: zf.read(f"{info}/licenses/{name}").decode() for name in ("LICENSE", "NOTICE")}
    headers = metadata.split("\n\n")[0].splitlines()
    assert "License-Expression: MIT" in headers
    assert [h for h in headers if h.startswith("License-File:")] == ["License-File: LICENSE", "License-File: NOTICE"]
    assert shipped == {name: (ROOT / name).read_text() for name in ("LICENSE", "NOTICE")}
    assert shipped["LICENSE"].startswith("MIT License") and "the minidl authors" in shipped["LICENSE"]
    for followed in ("PyTorch", "BSD-3-Clause", "torchdata", "StatefulDataLoader", "SeedSequence"):
        assert followed in shipped["NOTICE"], followed
