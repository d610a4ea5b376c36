"""Tracing and resume are layers: delete them and the loader's own tests still pass.

A copy of the package loses minidl/trace.py, minidl/trace_analysis.py, minidl/state.py and every line between
``# >>> layer: NAME`` and ``# <<< layer: NAME``. The copy then runs with no trace of them (no parameter, no
attribute, no import), ``trace=True`` and ``stateful=True`` are refused by name, and the loader's tests pass on it.
The subprocess runs without ``site`` (``-S``), so the editable install's finder, which would find the deleted
modules in the real package, is never installed; site-packages is put back on the path by hand.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYER_FILES = ("trace.py", "trace_analysis.py", "state.py")
BLOCK = re.compile(r"^[ \t]*# >>> layer: (\w+).*?^[ \t]*# <<< layer: \1[^\n]*\n", re.MULTILINE | re.DOTALL)
# Names that belong to the layers alone: none may be left in the stripped package's code.
LAYER_NAMES = {"trace", "stateful", "snapshot_every_n_steps", "_last_iterator", "_resume_state", "state_dict",
               "load_state_dict", "traced_iterators", "stateful_iterators", "ship", "unship", "layers",
               # the methods a layer's iterator mixin extends, and what the resume layer sets before the base's
               "_layer_create_fetcher", "_layer_workers", "_traced_pin_queues", "_resumed_base_seed", "_resumed",
               # the hooks these replaced: torch's own code does each inline
               "_draw_base_seed", "_create_fetcher", "_worker_options", "_start_pin_memory_thread"}
# The loader's own tests; the few that use a layer are left out by name.
LOADER_TESTS = ["test_fetch.py", "test_dataloader.py", "test_worker.py", "test_shutdown.py", "test_pin_memory.py",
                "test_torch_parity_loader.py"]
USES_A_LAYER = "not test_a_traced_loader and not test_dataloader_signature_is_torchs_plus_four"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def strip_layers(source: str) -> str:
    return BLOCK.sub("", source)


def test_strip_layers_removes_whole_blocks_and_nothing_else():
    source = textwrap.dedent("""\
        a = 1
            # >>> layer: tracing (minidl/trace.py)
            b = 2
            # <<< layer: tracing
        c = 3
        # >>> layer: resume
        d = 4
        # <<< layer: resume
        """)
    assert strip_layers(source) == "a = 1\nc = 3\n"


def names_used(tree: ast.AST) -> set[str]:
    """Every name, attribute, argument, function and import a module's code uses."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


@pytest.fixture(scope="module")
def stripped(tmp_path_factory) -> Path:
    """A copy of the project (packages, tests, pytest settings) with the layers deleted."""
    root = tmp_path_factory.mktemp("without_layers")
    for package in ("minidl", "minidl_course", "minidl_bench", "tests"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    for name in LAYER_FILES:
        (root / "minidl" / name).unlink()
    blocks = 0
    for path in (root / "minidl").glob("*.py"):
        source = path.read_text()
        blocks += len(BLOCK.findall(source))
        path.write_text(strip_layers(source))
    assert blocks >= 4  # tracing and resume each have marked blocks in dataloader.py
    return root


def test_the_stripped_package_has_no_layer_left(stripped):
    for path in sorted((stripped / "minidl").glob("*.py")):
        source = path.read_text()
        assert not re.search(r"^[ \t]*# (>>>|<<<) layer", source, re.MULTILINE), path.name  # no half-deleted block
        left = names_used(ast.parse(source)) & (LAYER_NAMES | {"minidl.trace", "minidl.state"})
        assert not left, f"{path.name} still uses {sorted(left)}"


def run_in(root: Path, code: str, timeout: float) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter without site (no editable finder), the stripped copy first on the path."""
    site_packages = sysconfig.get_paths()["purelib"]
    prelude = (f"import sys\nsys.path[:0] = [{str(root)!r}, {str(root / 'tests')!r}]\n"
               f"sys.path.append({site_packages!r})\n")
    return subprocess.run([sys.executable, "-S", "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=root)


def test_without_the_layers_their_options_are_refused_by_name(stripped):
    out = run_in(stripped, """
        import importlib
        import minidl
        assert minidl.__file__.startswith(sys.path[0]), minidl.__file__
        for name in ("minidl.trace", "minidl.trace_analysis", "minidl.state"):
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                print("no", name)
        for option in ("trace", "stateful", "snapshot_every_n_steps"):
            try:
                minidl.DataLoader(range(4), **{option: True})
            except TypeError as e:
                print(option, "refused:", option in str(e))
        print(hasattr(minidl.DataLoader, "state_dict"), [b.tolist() for b in minidl.DataLoader(range(4), batch_size=2)])
    """, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "no minidl.trace", "no minidl.trace_analysis", "no minidl.state",
        "trace refused: True", "stateful refused: True", "snapshot_every_n_steps refused: True",
        "False [[0, 1], [2, 3]]",
    ]


def test_the_loader_s_own_tests_pass_without_the_layers(stripped):
    out = run_in(stripped, f"""
        import pytest
        sys.exit(pytest.main(["-p", "no:cacheprovider", "-q", "-k", {USES_A_LAYER!r},
                              *[str(p) for p in {[f"tests/{name}" for name in LOADER_TESTS]!r}]]))
    """, timeout=2300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert re.search(r"\d+ passed", out.stdout), out.stdout[-2000:]
