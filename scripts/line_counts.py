"""The loader's code lines in reading order, each beside torch's file: the table in README.md.

A code line holds a token that is not a comment and not part of a docstring; blank lines don't count.
A row counts parts of minidl's and torch's files: a whole file (less what other rows take from it), one
top-level definition (``"dataloader.py::_MultiProcessingDataLoaderIter"``), or every block marked
``# >>> layer: NAME`` ... ``# <<< layer: NAME`` in minidl's files. torch's files are the installed torch
package's (found with importlib; torch is not imported). When a file, a definition or a block marker moves,
edit ROWS and rerun with ``--write``; tests/test_readme.py fails while README.md's table is stale.

    python scripts/line_counts.py              # print the table
    python scripts/line_counts.py --write      # and put it into README.md, between its two markers
    python scripts/line_counts.py --rev REV    # minidl's files as they were at a git revision (print only)
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import io
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BEGIN = "<!-- begin: python scripts/line_counts.py --write -->"
END = "<!-- end: python scripts/line_counts.py --write -->"


@dataclass(frozen=True)
class Row:
    """One line of the table: what to read, minidl's parts and torch's (paths under minidl/ and torch/utils/data/).

    A part is ``"FILE"``, ``"FILE::NAME"`` (a top-level class or function) or ``"layer: NAME"`` (marked blocks).
    ``label`` names minidl's parts in the table where listing them would make the row long.
    """

    what: str
    minidl: tuple[str, ...]
    torch: tuple[str, ...] = ()
    label: str | None = None


MP_ITER = "dataloader.py::_MultiProcessingDataLoaderIter"
SIGNALS = tuple(f"_utils.py::{name}" for name in ("_set_worker_pids", "_remove_worker_pids", "describe_exit",
                                                  "worker_failure_message", "_exit_code", "_error_if_any_worker_fails",
                                                  "_set_SIGCHLD_handler"))

LOADER = (  # the loader, in the order to read it; the hooks the layers extend (their marked blocks) count here
    Row("fetch: indices in, one batch out", ("fetch.py",), ("_utils/fetch.py",)),
    Row("`DataLoader` and the single-process iterator", ("dataloader.py",), ("dataloader.py",)),
    Row("the worker loop", ("worker.py",), ("_utils/worker.py",)),
    Row("the multi-process iterator, in `dataloader.py`", (MP_ITER,), (MP_ITER,)),
    Row("a dead worker reported at once (SIGCHLD)", SIGNALS, ("_utils/signal_handling.py",),
        label="`_utils.py`: `_set_SIGCHLD_handler` and the functions it calls"),
    Row("the pin-memory thread", ("pin_memory.py",), ("_utils/pin_memory.py",)),
)
LAYERS = (  # then minidl's layers: torch has no file for them
    Row("layer: tracing", ("trace.py", "trace_analysis.py")),
    Row("layer: resume", ("state.py",)),
    Row("layer: thread workers", ("_thread_workers.py",)),
    Row("layer: the CUDA-stream prefetcher", ("prefetch.py",)),
)
CALLED = (  # and what the loader calls, read beside chapters 02 and 03
    Row("datasets", ("dataset.py",), ("dataset.py",)),
    Row("samplers", ("sampler.py",), ("sampler.py",)),
    Row("the distributed sampler", ("distributed.py",), ("distributed.py",)),
    Row("collate", ("collate.py",), ("_utils/collate.py",)),
    Row("what several files share", ("_utils.py",), ("_utils/__init__.py",)),
    Row("random draws, torch's or NumPy's", ("_random.py",)),
    Row("what spawned workers can't receive", ("_picklable.py",)),
)
ROWS = LOADER + LAYERS + CALLED


def code_line_numbers(source: str) -> set[int]:
    """The numbers of the lines with a token that is neither a comment nor inside a docstring.

    A docstring is any string standing alone as a statement, on both sides: torch documents some module
    constants with one below them (``_utils/__init__.py``'s ``MP_STATUS_CHECK_INTERVAL``).
    """
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):  # a string alone as a statement documents: a docstring, or torch's
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            docstrings.update(range(node.lineno, node.end_lineno + 1))  # r"""...""" below a module constant
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines - docstrings


def code_lines(source: str) -> int:
    """How many code lines ``source`` has (see ``code_line_numbers``)."""
    return len(code_line_numbers(source))


def definition_lines(source: str, name: str, where: str) -> set[int]:
    """The line numbers of the top-level class or function ``name``, its decorators included."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return set(range(first, node.end_lineno + 1))
    raise SystemExit(f"line_counts.py: {where} defines no top-level {name!r}: edit ROWS")


def block_lines(source: str, label: str) -> set[int]:
    """The line numbers of every block from ``# >>> LABEL`` to ``# <<< LABEL``, the markers included."""
    found: set[int] = set()
    start = None
    for number, line in enumerate(source.splitlines(), 1):
        text = line.strip()
        if re.match(rf"# >>> {re.escape(label)}\b", text):
            start = number
        elif start is not None and re.match(rf"# <<< {re.escape(label)}\b", text):
            found.update(range(start, number + 1))
            start = None
    return found


def torch_data_dir() -> Path:
    """torch/utils/data of the installed torch, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("line_counts.py: torch is not installed here, and the table sets minidl beside it")
    return Path(next(iter(spec.submodule_search_locations))) / "utils" / "data"


def torch_version() -> str:
    """The installed torch's version, without a local tag: ``2.13.0``."""
    return importlib.metadata.version("torch").split("+")[0]


class Files:
    """Reads one side's files, from a folder or (minidl, with ``rev``) from a git revision."""

    def __init__(self, folder: Path, rev: str | None = None) -> None:
        self.folder, self.rev, self._read = folder, rev, {}

    def __call__(self, name: str) -> str:
        if name not in self._read:
            self._read[name] = self._load(name)
        return self._read[name]

    def _load(self, name: str) -> str:
        if self.rev is None:
            path = self.folder / name
            if not path.exists():
                raise SystemExit(f"line_counts.py: {path} is gone: edit ROWS")
            return path.read_text()
        spec = f"{self.rev}:{self.folder.relative_to(ROOT).as_posix()}/{name}"
        shown = subprocess.run(["git", "-C", str(ROOT), "show", spec], capture_output=True, text=True)
        if shown.returncode != 0:
            raise SystemExit(f"line_counts.py: no {spec}: {shown.stderr.strip()}")
        return shown.stdout

    def python_files(self) -> list[str]:
        """The .py files directly in the folder, where marked blocks are looked for."""
        if self.rev is None:
            return sorted(p.name for p in self.folder.glob("*.py"))
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", self.rev,
                                 f"{self.folder.relative_to(ROOT).as_posix()}/"], capture_output=True, text=True,
                                check=True)
        return sorted(Path(p).name for p in listed.stdout.split() if p.endswith(".py"))


def count(rows: tuple[Row, ...], side: str, files: Files) -> list[int]:
    """Each row's code lines on one side (``"minidl"`` or ``"torch"``); no line is counted twice.

    A block's lines belong to its row, then a definition's to its row, and what is left of a file to the row that
    names the whole file.
    """
    owner: dict[tuple[str, int], int] = {}  # (file, line) -> row index
    whole, definitions, blocks = [], [], []
    for i, row in enumerate(rows):
        for part in getattr(row, side):
            if part.startswith("layer: "):
                blocks.append((i, part))
            elif "::" in part:
                definitions.append((i, *part.split("::")))
            else:
                whole.append((i, part))
    for i, name in whole:
        owner.update({(name, n): i for n in range(1, len(files(name).splitlines()) + 1)})
    for i, name, definition in definitions:
        owner.update({(name, n): i for n in definition_lines(files(name), definition, f"{side}'s {name}")})
    for i, label in blocks:
        for name in files.python_files():
            owner.update({(name, n): i for n in block_lines(files(name), label)})
    counts = [0] * len(rows)
    for name in {name for name, _ in owner}:
        for n in code_line_numbers(files(name)):
            if (name, n) in owner:
                counts[owner[name, n]] += 1
    return counts


def describe(row: Row, side: str, rows: tuple[Row, ...]) -> str:
    """How the table names a row's parts on one side."""
    parts = getattr(row, side)
    if not parts:
        return "-"
    if side == "minidl" and row.label:
        return row.label
    shared = {p.split("::")[0] for r in rows if r is not row for p in getattr(r, side) if "::" in p}

    def one(part: str) -> str:
        if part.startswith("layer: "):
            return "its marked blocks"
        if "::" in part:
            return f"`{part.split('::')[1]}`"
        return f"`{part}` (the rest)" if part in shared else f"`{part}`"

    return " + ".join(one(p) for p in parts)


def table(rev: str | None = None) -> str:
    """README.md's table, as markdown."""
    minidl = count(ROWS, "minidl", Files(ROOT / "minidl", rev))
    torch = count(ROWS, "torch", Files(torch_data_dir()))
    lines = [f"| read | minidl | code lines | torch {torch_version()} | code lines |", "|---|---|--:|---|--:|"]
    for row, ours, theirs in zip(ROWS, minidl, torch, strict=True):
        lines.append(f"| {row.what} | {describe(row, 'minidl', ROWS)} | {ours} "
                     f"| {describe(row, 'torch', ROWS)} | {theirs if row.torch else '-'} |")
        if row is LOADER[-1]:
            loader = len(LOADER)
            lines.append(f"| **the loader** | | **{sum(minidl[:loader])}** | | **{sum(torch[:loader])}** |")
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """The table between README.md's two markers."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"line_counts.py: README.md needs one {BEGIN!r} and one {END!r}")
    return text.split(BEGIN)[1].split(END)[0].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="count minidl's files at this git revision")
    parser.add_argument("--write", action="store_true", help="replace README.md's table with this one")
    args = parser.parse_args(argv)
    if args.rev and args.write:
        parser.error("--write puts the working tree's counts into README.md: leave out --rev")
    new = table(args.rev)
    print(new)
    if args.write:
        text = README.read_text()
        old = readme_table(text)
        before, rest = text.split(BEGIN)
        README.write_text(f"{before}{BEGIN}\n{new}\n{END}{rest.split(END)[1]}")
        print("README.md: table " + ("unchanged" if old == new else "rewritten"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
