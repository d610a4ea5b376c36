"""Tests for the ``threads`` suite of minidl_bench and its two-build report, ``minidl_bench.threads_report``.

The suite runs once, in quick mode, under the current interpreter (``make test-ft`` runs this file under
the free-threaded one too), into a temporary folder. The report step needs matplotlib, which .venv-ft lacks:
there its tests skip. No test here asserts a speed: only that every number is there and positive.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from benchtools import read_csv, run_bench

from minidl_bench.harness import COLUMNS, missing
from minidl_bench.machine import MACHINE_FIELDS, machine_info, python_build

pytestmark = pytest.mark.skipif(bool(missing("numpy", "psutil", "PIL", "tqdm")), reason="needs psutil and Pillow")
needs_matplotlib = pytest.mark.skipif(bool(missing("matplotlib")), reason="the report's plots need matplotlib")

WORKLOADS = ("python", "numpy", "images", "io")
PLOTS = [f"threads_speedup_{n}.png" for n in WORKLOADS] + ["threads_first_batch.png", "threads_memory.png"]
SUITE_WORKLOADS = ("python", "python-shared", "numpy", "images", "io")  # what the suite itself measures
SUITE_PLOTS = PLOTS + ["threads_speedup_python-shared.png"]


@pytest.mark.parametrize("side", [1, 4, 32])
def test_python_workload_gives_the_same_samples_with_shared_or_own_constants(side):
    from minidl_bench.workloads import PythonWorkload, _own

    own, shared = PythonWorkload(5, side=side), PythonWorkload(5, side=side, shared_constants=True)
    for i in range(5):
        (a, label_a), (b, label_b) = own[i], shared[i]
        assert a.dtype == b.dtype == np.float32 and a.shape == (3, side, side) and a.tobytes() == b.tobytes()
        assert label_a == label_b == i % 10
    assert -2.0 <= float(own[0][0].min()) and float(own[0][0].max()) <= 2.0
    values = (0.485, 255.0, -2.0)
    copies = _own(*values)
    assert copies == list(values) and all(c is not v for c, v in zip(copies, values))  # equal, but new objects


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[Path, str]:
    """The suite in quick mode, in a fresh interpreter like this one, with a fresh image cache; (out folder, output)."""
    out = tmp_path_factory.mktemp("bench")
    cache = tmp_path_factory.mktemp("cache")
    # A hang guard with room for a loaded 2-core machine: there the suite took 86 s to measure, then began its plots.
    result = run_bench("threads", "--quick", "--out", str(out), timeout=280, env={"XDG_CACHE_HOME": str(cache)})
    assert result.returncode == 0, result.stderr
    return out, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_threads_suite_measures_every_backend_workload_and_worker_count(quick_run):
    from minidl_bench.threads import QUICK, backends_for

    out, output = quick_run
    assert "mode: quick" in output
    epochs = len(SUITE_WORKLOADS) * sum(len(backends_for(w)) for w in QUICK.workers) * (QUICK.repeats + 1)
    assert f"{epochs}/{epochs} [" in output  # the progress bar counted every epoch, warm-ups included
    rows = read_csv(out / "threads.csv")
    assert tuple(rows[0]) == COLUMNS
    for row in rows:
        for field in MACHINE_FIELDS:
            assert row[field], f"{field} empty in {row}"
        assert row["python_build"] == python_build() == machine_info()["python_build"]  # the interpreter
        assert 0 < float(row["min_s"]) <= float(row["median_s"]) <= float(row["max_s"]), row
        assert int(row["repeats"]) >= 3, row
    keyed = {(r["task"], r["method"], int(r["workers"])): r for r in rows}
    expected = {(f"{n}{what}", b, w) for n in SUITE_WORKLOADS for what in ("", " first batch") for w in QUICK.workers
                for b in backends_for(w)}
    assert set(keyed) == expected
    for n in SUITE_WORKLOADS:  # speedups are against serial, which is 1 against itself
        assert float(keyed[n, "serial", 0]["speedup"]) == pytest.approx(1.0)
        assert all(float(keyed[n, b, w]["speedup"]) > 0 for w in QUICK.workers[1:] for b in ("thread", "process"))

    metrics = read_csv(out / "threads_metrics.csv", columns=None)
    assert {(r["workload"], r["method"], int(r["workers"])) for r in metrics} == {
        (n, b, w) for n in SUITE_WORKLOADS for w in QUICK.workers for b in backends_for(w)}
    for r in metrics:
        assert r["python_build"] == python_build()
        for m in ("samples_per_s", "first_batch_s", "peak_uss_mib", "peak_pss_mib"):
            assert 0 < float(r[f"{m}_min"]) <= float(r[f"{m}_median"]) <= float(r[f"{m}_max"]), (m, r)
    if missing("matplotlib"):
        assert "skipped plots: matplotlib not installed" in output
    else:
        assert all((out / name).stat().st_size > 10_000 for name in SUITE_PLOTS)


def synthetic_run(folder: Path, build: str, python: str) -> Path:
    """A run folder with a threads.csv and a threads_metrics.csv, as one interpreter's suite would write."""
    from minidl_bench.harness import COLUMNS as HARNESS

    folder.mkdir()
    machine = {f: "x" for f in MACHINE_FIELDS} | {"python_build": build, "python": python, "cores": "2"}
    metric_names = ("samples_per_s", "first_batch_s", "peak_uss_mib", "peak_pss_mib", "cpu_util")
    runs, metrics = [], []
    for n in WORKLOADS:
        for method, w in [("serial", 0)] + [(b, w) for w in (1, 2, 4) for b in ("thread", "process")]:
            rate = 100.0 * (1 + (w if method == "thread" and build != "gil" else 0))
            runs.append({c: "" for c in HARNESS} | machine | {"suite": "threads", "task": n, "method": method,
                                                             "workers": w, "median_s": 1.0, "min_s": 1.0,
                                                             "max_s": 1.0, "repeats": 3, "first_s": 1.0})
            row = {"workload": n, "samples": 64, "method": method, "workers": w, "repeats": 3}
            for m in metric_names:
                value = rate if m == "samples_per_s" else 0.5
                row |= {f"{m}_median": value, f"{m}_min": value, f"{m}_max": value}
            metrics.append(row | machine)
    for name, rows in (("threads.csv", runs), ("threads_metrics.csv", metrics)):
        with open(folder / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return folder


@needs_matplotlib
@pytest.mark.slow
def test_report_merges_both_builds_and_draws_them_side_by_side(tmp_path, capsys):
    from minidl_bench import threads_report

    synthetic_run(tmp_path / "x86_64-2c-py3.11-gil", "gil", "3.11.7")
    synthetic_run(tmp_path / "x86_64-2c-py3.13t-nogil", "free-threaded", "3.13.5")
    assert threads_report.main(["--results", str(tmp_path)]) == 0
    out = tmp_path / "threads"
    merged = read_csv(out / "threads.csv", columns=None)  # plus the interpreter column
    assert len(merged) == 2 * 4 * 7
    assert {r["interpreter"] for r in merged} == {"GIL", "free-threaded"}
    assert all(r["interpreter"] == threads_report.interpreter(r) for r in merged)
    metrics = read_csv(out / "threads_metrics.csv", columns=None)
    up = threads_report.speedups(metrics)
    assert up["free-threaded", "python", "thread", 2] == pytest.approx(3.0)
    assert up["GIL", "python", "thread", 2] == pytest.approx(1.0)
    assert all((out / name).stat().st_size > 10_000 for name in PLOTS)
    printed = capsys.readouterr().out
    assert "free-threaded  python" in printed and "x3.00" in printed
    # The merged folder is never taken for a run of its own.
    assert set(threads_report.find_runs(tmp_path)) == {tmp_path / "x86_64-2c-py3.11-gil",
                                                       tmp_path / "x86_64-2c-py3.13t-nogil"}
