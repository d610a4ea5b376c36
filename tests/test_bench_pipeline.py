"""Tests for the ``pipeline`` suite of minidl_bench (notebook 11's measurements).

The suite runs once, in quick mode, into a temporary folder, through ``python -m minidl_bench``. No test here
asserts a speed: only that every measurement is there, well formed and positive, and the files are written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from benchtools import check_rows, read_csv, run_bench

from minidl_bench.harness import missing
from minidl_bench.machine import MACHINE_FIELDS

pytestmark = pytest.mark.skipif(bool(missing("numba")), reason="needs Numba")

PLOTS = ("pipeline_pool.png", "pipeline_vectorise.png", "pipeline_numba_workers.png", "pipeline_numba_process.png",
         "pipeline_threads.png")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("bench")
    result = run_bench("pipeline", "--quick", "--out", str(out), timeout=280)
    assert result.returncode == 0, result.stderr
    return out, result.stdout + result.stderr


def expected_keys() -> set[tuple[str, str, int, int]]:
    from minidl_bench.pipeline import NUMBA_METHODS, PROCESS_STEPS, QUICK, WORKERS

    keys = set()
    for variant, n in (("loop", QUICK.loop), ("numpy", QUICK.numpy)):
        settings = [("serial", 0)] + [(m, w) for w in WORKERS[1:] for m in ("pool imap", "minidl process")]
        keys |= {(f"pool, {variant}{what}", m, w, n) for m, w in settings for what in ("", " first batch")}
    keys |= {(f"vectorise{what}", v, w, QUICK.vectorise) for v in ("loop", "numpy", "batch", "numba")
             for w in WORKERS for what in ("", " first batch")}
    keys |= {(f"numba in workers{what}", m, 2, QUICK.numba) for m in NUMBA_METHODS for what in ("", " first batch")}
    keys |= {("numba per process", step, 1, 1) for step in PROCESS_STEPS}
    keys |= {(f"threads, {kind}", m, w, side) for kind in ("nogil", "gil") for side in QUICK.threads
             for m, w in (("serial", 0), ("2 threads", 2))}
    return keys


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pipeline_suite_measures_every_group(quick_run):
    from minidl_bench.pipeline import QUICK

    out, output = quick_run
    assert "mode: quick" in output
    rows = read_csv(out / "pipeline.csv")
    check_rows(rows)
    keyed = {(r["task"], r["method"], int(r["workers"]), int(r["size"])): r for r in rows}
    assert len(keyed) == len(rows) and set(keyed) == expected_keys()
    baselines = {(r["task"], r["method"], r["workers"]) for r in rows if r["speedup"] == "1"}
    assert baselines >= {("vectorise", "loop", "0"), ("pool, loop", "serial", "0"), ("pool, numpy", "serial", "0"),
                         ("numba in workers", "numpy per sample", "2")}
    assert all(float(r["speedup"]) > 0 for r in rows if r["task"] in ("vectorise", "threads, nogil", "threads, gil"))
    for title in ("pool, loop: speedup over the serial loop", "vectorise: speedup over the pure-Python loop",
                  "numba in 2 process workers", "2 thread workers over serial"):
        assert title in output

    rounds = read_csv(out / "pipeline_rounds.csv", columns=None)
    counted: dict[tuple[str, str, int], list[int]] = {}
    for r in rounds:
        assert all(r[f] for f in MACHINE_FIELDS), r
        assert float(r["seconds"]) >= float(r["first_batch_s"]) > 0 and int(r["samples"]) > 0, r
        counted.setdefault((r["task"], r["method"], int(r["workers"])), []).append(int(r["round"]))
    for key, seen in counted.items():  # the warm-up (round 0) and every timed round
        assert seen == list(range((QUICK.thread_repeats if key[0].startswith("threads") else QUICK.repeats) + 1))
    epoch_tasks = {(t, m, w) for t, m, w, _ in expected_keys() if not re.search("first batch|per process|threads", t)}
    threads = {(f"threads, {kind}, side {side}", m, w) for kind in ("nogil", "gil") for side in QUICK.threads
               for m, w in (("serial", 0), ("2 threads", 2))}
    assert set(counted) == epoch_tasks | threads
    for name in PLOTS:
        if not missing("matplotlib"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_fresh_process_reports_each_step():
    from minidl_bench.pipeline import fresh_process

    steps = fresh_process("cache", 4)
    assert set(steps) == {"import", "first", "warm"} and all(v > 0 for v in steps.values())


@pytest.mark.timeout(240)
def test_measure_runs_one_group_live_with_the_csv_keys():
    # Notebook 11 measures each group on the learner's machine and reads it like the committed CSVs.
    from minidl_bench.pipeline import FULL, LIVE, LIVE_QUICK, QUICK, measure

    rows, rounds = measure("pool", LIVE_QUICK)
    tasks = {r["task"] for r in rows}
    assert tasks == {"pool, loop", "pool, loop first batch", "pool, numpy", "pool, numpy first batch"}
    assert LIVE_QUICK.workers == (0, 2) and not LIVE_QUICK.check  # quick: fewer worker starts (seconds under spawn)
    assert FULL.check and QUICK.check and LIVE.check  # every other run checks each loader's batches first
    assert {(r["method"], r["workers"]) for r in rows if r["task"] == "pool, numpy"} == {
        ("serial", 0), ("pool imap", 2), ("minidl process", 2)}
    assert all(r["median_s"] > 0 for r in rows)
    assert {r["round"] for r in rounds} == set(range(LIVE_QUICK.repeats + 1))  # the warm-up is round 0
    assert all(r["samples"] == LIVE_QUICK.loop for r in rounds if r["task"] == "pool, loop")
    with pytest.raises(ValueError, match="group=.*'pools'"):
        measure("pools", LIVE_QUICK)


def test_a_fresh_interpreter_finds_the_course_in_this_repository_first(monkeypatch):
    """Its PYTHONPATH starts at the folder holding minidl_course/, never that folder's parent (whose stray files,
    a scratch ``struct.py`` say, would shadow the standard library)."""
    import subprocess

    from minidl_bench import pipeline

    seen = {}

    def run(command, env, **kwargs):
        seen["path"] = env["PYTHONPATH"].split(os.pathsep)[0]
        return subprocess.CompletedProcess(command, 0, '{"import": 1, "first": 1, "warm": 1}', "")

    monkeypatch.setattr(pipeline.subprocess, "run", run)
    pipeline.fresh_process("compile", 16)
    assert (Path(seen["path"]) / "minidl_course" / "png_pipeline.py").is_file()
