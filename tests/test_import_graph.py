"""The import graph of minidl, minidl_course and minidl_bench: one direction, no circle.

Every import statement counts, the ones inside functions included, since a function-level import still
ties two modules together. The graph is read from the source with ``ast``, so nothing here imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("minidl", "minidl_course", "minidl_bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that ``name`` (a module, or a name inside one) lives in; None if it is not ours."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that ``module`` imports, anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import: from the package, up level - 1 packages
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from a import b` imports the module a.b when there is one, else the name b from a.
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {target for name in names if (target := resolve(name, modules)) is not None}
    found.discard(module)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def find_cycle(graph: dict[str, set[str]], nodes: set[str]) -> list[str] | None:
    """One import circle among ``nodes``, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node] & nodes):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(nodes):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_is_read_from_every_module(graph):
    # A sanity check on the reader: the edges everyone knows are there.
    assert {"minidl.dataloader", "minidl.trace", "minidl.state", "minidl.worker"} <= set(graph)
    assert {"minidl.worker", "minidl.fetch", "minidl.sampler"} <= graph["minidl.dataloader"]
    assert {"minidl.trace", "minidl.state"} <= graph["minidl.dataloader"]  # function-level imports count
    assert "minidl" in graph["minidl_course.toy"] or "minidl.dataset" in graph["minidl_course.toy"]


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph, set(graph)) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}, {"a", "b"}) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_inside_a_package(graph, package):
    nodes = {m for m in graph if m == package or m.startswith(package + ".")}
    assert find_cycle(graph, nodes) is None


def test_no_import_circle_across_the_packages(graph):
    assert find_cycle(graph, set(graph)) is None


def test_minidl_imports_neither_the_course_nor_the_benchmarks(graph):
    for module, targets in graph.items():
        if module.split(".")[0] == "minidl":
            assert not {t for t in targets if t.split(".")[0] != "minidl"}, module


def test_the_course_never_imports_the_benchmarks(graph):
    for module, targets in graph.items():
        if module.split(".")[0] == "minidl_course":
            assert not {t for t in targets if t.split(".")[0] == "minidl_bench"}, module


def test_the_layers_do_not_import_the_loader_back(graph):
    # dataloader.py chooses the layers and hands them its iterator classes; they never import it.
    for layer in ("minidl.trace", "minidl.trace_analysis", "minidl.state"):
        assert "minidl.dataloader" not in graph[layer], layer
