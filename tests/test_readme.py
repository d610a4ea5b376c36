"""README.md, CONTRIBUTING.md and results/README.md say what is true.

The README's example runs as written; its line-count table is what scripts/line_counts.py prints; every path,
`make` target, module and script the three documents name exists; and every number in results/README.md (and
the README's headline numbers) is recomputed here from the committed files under results/.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "CONTRIBUTING.md", "results/README.md")
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="the example and torch's line counts need torch installed")


def load_line_counts():
    spec = importlib.util.spec_from_file_location("line_counts", ROOT / "scripts" / "line_counts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["line_counts"] = module
    spec.loader.exec_module(module)
    return module


line_counts = load_line_counts()


# --- the README itself ----------------------------------------------------------------------------

def readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_is_at_most_1000_words():
    assert len(readme().split()) <= 1000


def test_the_first_screen_gives_the_two_commands_and_the_example():
    first_screen = "\n".join(readme().splitlines()[:40])
    assert "make lab" in first_screen and "make test" in first_screen
    assert "minidl.DataLoader(" in first_screen and first_screen.count("```") >= 4  # both blocks closed in it


@needs_torch
def test_readme_ten_line_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", readme(), flags=re.S)
    example = next(b for b in blocks if "minidl.DataLoader" in b and "import minidl" in b)
    assert len(example.strip().splitlines()) <= 12
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("torch.Size([32, 3])") and lines[-1].startswith("4 [0, 32, 64, 96]")


# --- the line-count table -------------------------------------------------------------------------

@needs_torch
def test_the_readme_line_count_table_is_what_the_script_prints():
    """Stale after a change under minidl/? Run `python scripts/line_counts.py --write`."""
    assert line_counts.readme_table(readme()) == line_counts.table()


def test_code_lines_leave_out_blank_lines_comments_and_docstrings():
    source = '"""Module docstring,\non two lines."""\n\nimport os  # a comment\n# a comment line\n\n\n' \
             'def f(x):\n    """Docstring."""\n    s = """a string\n    on two lines"""\n    return (x,\n' \
             '            s)\n'
    assert line_counts.code_line_numbers(source) == {4, 8, 10, 11, 12, 13}


def test_blocks_and_definitions_are_found_by_their_markers_and_names():
    source = "import os\n\n\n@staticmethod\ndef f():\n    # >>> layer: demo (here)\n    x = 1\n" \
             "    # <<< layer: demo\n    return 2\n# >>> layer: demo\ny = 3\n# <<< layer: demo\n"
    assert line_counts.definition_lines(source, "f", "demo.py") == set(range(4, 10))
    assert line_counts.block_lines(source, "layer: demo") == {6, 7, 8, 10, 11, 12}
    assert line_counts.block_lines(source, "layer: dem") == set()
    with pytest.raises(SystemExit, match="'g'"):
        line_counts.definition_lines(source, "g", "demo.py")


@needs_torch
@pytest.mark.parametrize("side", ["minidl", "torch"])
def test_each_code_line_of_a_named_file_is_counted_once(side):
    files = line_counts.Files(ROOT / "minidl") if side == "minidl" else line_counts.Files(line_counts.torch_data_dir())
    parts = [p for row in line_counts.ROWS for p in getattr(row, side)]
    whole = {p for p in parts if "::" not in p and not p.startswith("layer: ")}
    assert {p.split("::")[0] for p in parts if "::" in p} <= whole  # a definition lies in a file counted whole
    if side == "minidl":  # and so does every marked block
        blocks = {p for p in parts if p.startswith("layer: ")}
        assert {f for f in files.python_files() for b in blocks if line_counts.block_lines(files(f), b)} <= whole
    counts = line_counts.count(line_counts.ROWS, side, files)
    assert sum(counts) == sum(line_counts.code_lines(files(name)) for name in whole)
    assert all(c > 0 for c, row in zip(counts, line_counts.ROWS, strict=True) if getattr(row, side))


# --- every command and path the documents name -----------------------------------------------------

def code_spans(text: str) -> list[str]:
    """The fenced blocks' lines and the inline code spans, the generated line-count table left out."""
    if line_counts.BEGIN in text:
        text = text.replace(line_counts.readme_table(text), "")
    fences = re.findall(r"```\w*\n(.*?)```", text, flags=re.S)
    text = re.sub(r"```\w*\n.*?```", "", text, flags=re.S)
    return [line for block in fences for line in block.splitlines()] + re.findall(r"`([^`\n]+)`", text)


def spans(doc: str) -> list[str]:
    return code_spans((ROOT / doc).read_text())


def is_repo_path(word: str) -> bool:
    """A word naming a file or folder of this repository: it has a slash or a file extension, and no placeholder
    (NAME, <machine>), home, variable, absolute path, or what setup makes (.venv) or torch's own files."""
    if not re.fullmatch(r"[\w.<>/-]+", word) or word.startswith(("/", ".venv", "torch/", "browser-out")):
        return False
    if "<" in word or any(re.fullmatch(r"[A-Z_]+", part) for part in re.split(r"[/.]", word)):
        return False
    return "/" in word or bool(re.search(r"\.(py|sh|md|ipynb|toml|yml|cfg|csv|txt|png)$", word))


def named_paths(doc: str) -> set[str]:
    words = {w.strip("'\",;:()") for span in spans(doc) for w in span.split()}
    links = re.findall(r"\]\(([^)#\s]+)\)", (ROOT / doc).read_text())
    return {w for w in words if is_repo_path(w)} | {w for w in links if "://" not in w}


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_named_exists(doc):
    here = (ROOT / doc).parent
    missing = sorted(p for p in named_paths(doc) if not (here / p).exists() and not (ROOT / p).exists())
    assert not missing, f"{doc} names paths that are not in the repository: {missing}"


def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        head = re.match(r"^([\w.%-][\w.% -]*):(?!=)", line)
        if head and not line.startswith("\t"):
            targets.update(head.group(1).split())
    return targets


@pytest.mark.parametrize("doc", DOCS)
def test_every_make_target_named_exists(doc):
    named = {m for span in spans(doc) for m in re.findall(r"\bmake ([a-z][\w-]*)", span)}
    assert named, f"{doc} names no make target"  # the pattern still finds them
    assert named <= make_targets(), f"{doc}: no such make target: {sorted(named - make_targets())}"


def test_make_targets_are_read_from_the_makefile():
    assert {"lab", "test", "unit-spawn", "nbval-fork", "check", "bench-ft", "mac", "browser"} <= make_targets()
    assert "PYTHON" not in make_targets() and "STAMP" not in make_targets()


@pytest.mark.parametrize("doc", DOCS)
def test_every_module_and_script_named_exists(doc):
    from minidl_bench import SUITES

    for span in spans(doc):
        for module, rest in re.findall(r"python\S*\s+-m\s+([\w.]+)([^`|]*)", span):
            assert importlib.util.find_spec(module) is not None, f"{doc}: no module {module}"
            if module == "minidl_bench":
                suites = [w for w in rest.split() if re.fullmatch(r"[a-z]+", w)]
                assert set(suites) <= set(SUITES), f"{doc}: no benchmark suite {set(suites) - set(SUITES)}"
        for script in re.findall(r"(?:python\S*|bash|sh)\s+(\S+\.(?:py|sh))\b", span):
            assert (ROOT / script).is_file(), f"{doc}: no script {script}"


def test_the_chapter_table_names_every_exercise_and_only_those():
    named = {w for span in spans("README.md") for w in re.findall(r"\bch\d\d_\w+", span)}
    exercises = ROOT / "notebooks" / "exercises"
    present = {p.stem for p in exercises.glob("ch*.ipynb") if not p.stem.endswith("_solution")}
    assert named == present
    assert all((exercises / f"{name}_solution.ipynb").is_file() for name in named)


def test_the_command_checks_see_the_documents_commands():
    """The patterns above find what they check: a regex that matched nothing would pass every document."""
    named = {doc: named_paths(doc) for doc in DOCS}
    assert {"examples/ddp_train.py", "LICENSE", "CONTRIBUTING.md", "results/README.md"} <= named["README.md"]
    assert {"scripts/mac_run.py", "tests/mac_standin/sitecustomize.py", ".ci/run"} <= named["CONTRIBUTING.md"]
    assert "x86_64-2c-py3.11-gil/loaders_rounds.csv" in named["results/README.md"]
    assert any("python -m minidl_bench loaders" in s for s in spans("results/README.md"))
    assert any("python scripts/line_counts.py" in s for s in spans("README.md"))


# --- the numbers, from the committed results ------------------------------------------------------

RESULTS = ROOT / "results"
GIL_RUN = "x86_64-2c-py3.11-gil"
WORKLOADS = ("python", "numpy", "images", "io")


def read(path: str) -> list[dict[str, str]]:
    with (RESULTS / path).open(newline="") as f:
        return list(csv.DictReader(f))


def by_round(rows, key, value) -> dict:
    """key(row) -> {round: value(row)}, the warm-up round 0 left out."""
    out = defaultdict(dict)
    for r in rows:
        if int(r["round"]) > 0:
            out[key(r)][int(r["round"])] = value(r)
    return out


def median_ratio(top: dict, bottom: dict) -> float:
    """The median of the per-round ratios top / bottom."""
    assert top.keys() == bottom.keys() and len(top) >= 5
    return statistics.median(top[k] / bottom[k] for k in top)


def loader_ratios() -> dict[tuple[str, int], float]:
    """Throughput, minidl / torch, per (workload, workers)."""
    rounds = by_round(read(f"{GIL_RUN}/loaders_rounds.csv"), lambda r: (r["workload"], r["method"], int(r["workers"])),
                      lambda r: float(r["samples"]) / float(r["seconds"]))
    workers = sorted({w for _, _, w in rounds})
    return {(n, w): median_ratio(rounds[n, "minidl" if w == 0 else "minidl process", w], rounds[n, "torch", w])
            for n in WORKLOADS for w in workers}


def overhead() -> dict:
    rows = read(f"{GIL_RUN}/overhead_rounds.csv")
    key = lambda r: (int(r["batch_size"]), int(r["workers"]), r["method"])  # noqa: E731
    return {"per_batch": by_round(rows, key, lambda r: float(r["per_batch_s"])),
            "first_batch": by_round(rows, key, lambda r: float(r["first_batch_s"]))}


def median_of(rounds: dict) -> float:
    return statistics.median(rounds.values())


def threads_speedup(build: str, workload: str, method: str, csv_file: str = "threads/threads_metrics.csv") -> float:
    """Samples/s with 2 workers of ``method`` over the same build's serial loader."""
    rate = {(r["interpreter"], r["workload"], r["method"], int(r["workers"])): float(r["samples_per_s_median"])
            for r in read(csv_file)}
    return rate[build, workload, method, 2] / rate[build, workload, "serial", 0]


def expected_rows() -> list[tuple[str, str, str]]:
    """(result, a phrase of what it compares, the file) for each row of results/README.md's table, in order."""
    out = []
    ratios = loader_ratios()
    out.append((" / ".join(f"{ratios[n, 2]:.2f}" for n in WORKLOADS), "2 process workers", "loaders_rounds.csv"))
    out.append((f"{min(ratios.values()):.2f}", f"({len(ratios)} settings)", "loaders_rounds.csv"))

    o = overhead()
    pb, fb = o["per_batch"], o["first_batch"]
    m, t = median_of(pb[1, 0, "minidl"]), median_of(pb[1, 0, "torch"])
    out.append((f"{median_ratio(pb[1, 0, 'minidl'], pb[1, 0, 'torch']):.2f}", f"({m * 1e6:.1f} µs / {t * 1e6:.1f} µs)",
                "overhead_rounds.csv"))
    out.append((" / ".join(f"{median_ratio(pb[bs, 2, 'minidl process'], pb[bs, 2, 'torch']):.2f}" for bs in (1, 64)),
                "batch size 1 / 64", "overhead_rounds.csv"))
    out.append((" / ".join(f"{median_of(fb[bs, 2, 'minidl process']) / median_of(fb[bs, 2, 'minidl thread']):.1f}x"
                           for bs in (1, 64)), "process / thread workers", "overhead_rounds.csv"))
    epochs = {(r["task"], r["method"]): float(r["median_s"]) for r in read(f"{GIL_RUN}/overhead.csv")}
    trace = [f"trace numpy, {b}, {w} workers" for b, w in (("minidl", 0), ("minidl process", 2), ("minidl thread", 2))]
    out.append((" / ".join(f"{epochs[t, 'trace off'] / epochs[t, 'trace=True']:.2f}" for t in trace),
                "no workers / 2 processes / 2 threads", "overhead.csv"))
    resume = (("minidl", 0, "no workers, batch size 1 / 64"), ("minidl process", 2, "2 process workers"),
              ("minidl thread", 2, "2 thread workers"))
    for backend, w, phrase in resume:  # resume's cost: stateful=True over stateful=False
        ratios = (median_ratio(pb[bs, w, f"{backend} stateful=True"], pb[bs, w, backend]) for bs in (1, 64))
        out.append((" / ".join(f"{r:.2f}" for r in ratios), phrase, "overhead_rounds.csv"))
    realistic = by_round(read(f"{GIL_RUN}/overhead_resume_rounds.csv"),
                         lambda r: (r["workload"], r["method"], r["stateful"] == "True"), lambda r: float(r["seconds"]))
    out.append((" / ".join(f"{median_ratio(realistic[n, b, False], realistic[n, b, True]):.2f}"
                           for n in ("images", "numpy") for b in ("minidl process", "minidl thread")),
                "photographs / NumPy augmentation", "overhead_resume_rounds.csv"))

    kernels = {(r["task"], r["size"], r["method"], r["workers"]): float(r["median_s"])
               for r in read(f"{GIL_RUN}/kernels.csv")}
    serial = kernels["cpu-normalise", "128", "python serial", "1"]
    pool, numba, batch = (serial / kernels["cpu-normalise", "128", m, w]
                          for m, w in (("pool", "2"), ("numba", "1"), ("numpy batch", "1")))
    out.append((f"x{pool:.2f} / x{numba:.0f} / x{batch:.0f}", "`Pool(2)` / Numba / NumPy", "kernels.csv"))

    p = by_round(read(f"{GIL_RUN}/pipeline_rounds.csv"), lambda r: (r["task"], r["method"], int(r["workers"])),
                 lambda r: float(r["seconds"]))

    def speedup(task, method, workers, base_method, base_workers):  # epoch-time ratio: > 1 is faster
        return median_ratio(p[task, base_method, base_workers], p[task, method, workers])

    numpy0, numba0 = speedup("vectorise", "numpy", 0, "loop", 0), speedup("vectorise", "numba", 0, "loop", 0)
    out.append((f"x{numpy0:.1f} / x{numba0:.1f}", "NumPy per sample / warm Numba", "pipeline_rounds.csv"))
    loop2, numpy2 = speedup("vectorise", "loop", 2, "loop", 0), speedup("vectorise", "numpy", 2, "loop", 0)
    out.append((f"x{loop2:.2f} / x{numpy2:.1f}", "2 process workers", "pipeline_rounds.csv"))
    out.append((" / ".join(f"x{speedup(f'threads, {k}, side 128', '2 threads', 2, 'serial', 0):.2f}"
                           for k in ("nogil", "gil")), "128 px", "pipeline_rounds.csv"))

    def over_serial(workload, method):
        return " / ".join(f"x{threads_speedup(b, workload, method):.2f}" for b in ("GIL", "free-threaded"))

    out.append((over_serial("python", "thread"), "`python` workload: GIL / free-threaded", "threads_metrics.csv"))
    out.append((over_serial("python", "process"), "2 process workers", "threads_metrics.csv"))
    out.append((over_serial("python-shared", "thread"), "(`python-shared`)", "threads_metrics.csv"))

    share = dict(re.findall(r"^share (\w+) ([\d.]+) of", (RESULTS / "threads/perf_decref.txt").read_text(), re.M))
    out.append((f"{float(share['shared']):.1f}% / {float(share['own']):.2f}%", "`_Py_DecRefShared`",
                "perf_decref.txt"))
    xeon = "threads/xeon/threads_metrics.csv"
    out.append((" / ".join(f"x{threads_speedup('free-threaded', name, 'thread', xeon):.2f}"
                           for name in ("python-shared", "python")),
                "the earlier run (another CPU)", "xeon/threads_metrics.csv"))
    share = dict(re.findall(r"^share (\w+) ([\d.]+) of", (RESULTS / "threads/xeon/perf_decref.txt").read_text(), re.M))
    out.append((f"{float(share['shared']):.1f}% / {float(share['own']):.2f}%", "the earlier run's `perf` samples",
                "xeon/perf_decref.txt"))
    return out


def results_table() -> list[list[str]]:
    lines = [line for line in (RESULTS / "README.md").read_text().splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[1:]]  # the header left out


def test_results_readme_rows_are_the_committed_numbers():
    rows, expected = results_table(), expected_rows()
    assert [r[0] for r in rows] == [e[0] for e in expected]
    for (result, what, command, source), (_, phrase, file) in zip(rows, expected, strict=True):
        assert phrase in what, (result, what)
        assert source.strip("`").endswith(file), (result, source)
        assert command.startswith("`") and command.endswith("`"), command


def test_readme_headline_numbers_are_the_committed_ones():
    measured = readme().split("## Measured here")[1].split("\n## ")[0]
    assert "(results/README.md)" in measured
    two = [ratio for (_, workers), ratio in loader_ratios().items() if workers == 2]
    assert f"{min(two):.2f} to {max(two):.2f} across four workloads" in measured
    pb = overhead()["per_batch"]
    cost = median_ratio(pb[1, 0, "minidl"], pb[1, 0, "torch"])
    minidl, torch = median_of(pb[1, 0, "minidl"]) * 1e6, median_of(pb[1, 0, "torch"]) * 1e6
    assert f"{cost:.2f} ({minidl:.1f} µs against {torch:.1f} µs)" in measured
    assert f"x{threads_speedup('free-threaded', 'python', 'thread'):.2f} on free-threaded" in measured
    assert f"x{threads_speedup('GIL', 'python', 'thread'):.2f} with the GIL" in measured
    epochs = [r for r in read("threads/threads_metrics.csv") if (r["interpreter"], r["workload"], r["workers"]) in
              {("GIL", "python", "2"), ("GIL", "python", "0")}]
    serial = next(float(r["samples_per_s_median"]) for r in epochs if r["method"] == "serial")
    thread = next(r for r in epochs if r["method"] == "thread")
    low, high = (float(thread[f"samples_per_s_{s}"]) / serial for s in ("min", "max"))
    assert f"(epochs x{low:.2f}-{high:.2f}: no gain)" in measured and high < 1
