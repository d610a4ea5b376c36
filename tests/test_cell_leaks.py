"""scripts/cell_leaks.py: a notebook cell that leaves a worker running after it is reported, in `make mac` and nbval."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from cell_leaks import children  # noqa: E402
from mac_run import run_one  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

OPEN = "from minidl import DataLoader\nloader = DataLoader(list(range(8)), batch_size=2, num_workers=2)"
KEEP = "it = iter(loader)\nprint(next(it))"  # the iterator, half read, stays in the kernel with its two workers
CLOSE = "it = iter(loader)\nprint(next(it))\ndel it"
AFTER = "print('after')"


def notebook(folder: Path, *sources: str) -> Path:
    """A notebook of these code cells, saved in ``folder``."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    path = folder / "tiny.ipynb"
    nbformat.write(nb, path)
    return path


def reported_pids(problems: list[str]) -> list[int]:
    return [int(pid) for p in problems for pid in re.findall(r"process (\d+) outlived its cell", p)]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_mac_run_reports_the_cell_whose_iterator_kept_its_workers_and_kills_them(tmp_path):
    _, problems, _ = run_one(str(notebook(tmp_path, OPEN, KEEP, AFTER)), None)
    leaks = [p for p in problems if "outlived its cell" in p]
    assert len(leaks) == 2 and all(p.startswith("cell 1: ") for p in leaks), problems  # both workers, a line each
    pids = reported_pids(leaks)
    assert all(gone(pid) for pid in pids)
    assert sorted(p for p in problems if p not in leaks) == [  # the kernel ended with them: no wait on it
        "DeadKernelError: Kernel died", "cell 1: killed, and the kernel with it (the cells after it do not run)"]


def test_mac_run_reports_nothing_when_the_cell_deletes_its_iterator(tmp_path):
    _, problems, _ = run_one(str(notebook(tmp_path, OPEN, CLOSE, AFTER)), None)
    assert problems == []


def nbval(path: Path) -> subprocess.CompletedProcess:
    """nbval on ``path`` with the plugin `make nbval` loads."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.nbval_leaks",
                           "--nbval", "--nbval-current-env", "--nbval-lax", "-q", str(path)],
                          capture_output=True, text=True, timeout=200, cwd=path.parent, env=env)


def test_nbval_fails_the_cell_whose_iterator_kept_its_workers(tmp_path):
    run = nbval(notebook(tmp_path, OPEN, KEEP, AFTER))
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(r"tiny.ipynb cell 1 \(code cells counted\): process \d+ outlived its cell", run.stdout), run.stdout
    assert "Kernel dead on test start" in run.stdout, run.stdout  # the kernel went with the workers: no wait


def test_nbval_passes_the_cell_that_deletes_its_iterator(tmp_path):
    run = nbval(notebook(tmp_path, OPEN, CLOSE, AFTER))
    assert run.returncode == 0, run.stdout + run.stderr


def test_long_lived_helpers_are_not_counted_and_a_plain_child_is():
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    procs = [subprocess.Popen(sleep + [tag]) for tag in ("torch_shm_manager", "multiprocessing.resource_tracker", "x")]
    try:
        found = children(os.getpid())
        assert [cmd.split()[-1] for cmd in found.values() if cmd.startswith(sys.executable)] == ["x"], found
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
