"""Code lines of the loader core, per file, beside torch's for the same files.

A code line holds at least one token that is not a comment, and is not part of a docstring
(module, class or function); blank lines don't count. ``--rev`` counts minidl's files as they
were at a git revision instead of the working tree.

    python scripts/line_counts.py [--rev 92044f8]
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ["dataset", "sampler", "distributed", "collate", "fetch", "worker", "dataloader", "pin_memory", "prefetch",
        "_utils"]
SEPARATE = ["trace", "state"]  # minidl's additions, counted apart from the core
TORCH = {  # minidl file -> torch's file under torch/utils/data
    "dataset": "dataset.py", "sampler": "sampler.py", "distributed": "distributed.py",
    "collate": "_utils/collate.py", "fetch": "_utils/fetch.py", "worker": "_utils/worker.py",
    "dataloader": "dataloader.py", "pin_memory": "_utils/pin_memory.py", "_utils": "_utils/__init__.py",
}


def code_lines(source: str) -> int:
    """Lines with a token that is neither a comment nor inside a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docstrings)
    return len(lines)


def minidl_source(name: str, rev: str | None) -> str | None:
    path = f"minidl/{name}.py"
    if rev is None:
        file = ROOT / path
        return file.read_text() if file.exists() else None
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="count minidl's files at this git revision")
    args = parser.parse_args()
    import torch.utils.data

    torch_dir = Path(torch.utils.data.__file__).parent
    where = f"at {args.rev}" if args.rev else "working tree"
    print(f"{'file':<14}{'minidl (' + where + ')':>30}{'torch ' + torch.__version__.split('+')[0]:>14}")
    totals = [0, 0]
    for name in CORE:
        source = minidl_source(name, args.rev)
        ours = code_lines(source) if source is not None else 0
        theirs = code_lines((torch_dir / TORCH[name]).read_text()) if name in TORCH else 0
        totals[0] += ours
        totals[1] += theirs
        print(f"{name:<14}{ours if source is not None else '-':>30}{theirs if name in TORCH else '-':>14}")
    print(f"{'core total':<14}{totals[0]:>30}{totals[1]:>14}")
    for name in SEPARATE:
        source = minidl_source(name, args.rev)
        print(f"{name:<14}{code_lines(source) if source is not None else '-':>30}{'-':>14}")


if __name__ == "__main__":
    main()
