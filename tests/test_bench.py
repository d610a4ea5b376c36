"""Tests for minidl_bench: the harness, the kernels suite in quick mode, and import hygiene.

No test here asserts a speed: timings depend on the machine and on whatever else it is running.
"""

from __future__ import annotations

import importlib
import io
import math
import os
import re
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from benchtools import check_rows, read_csv, run_bench
from hypothesis import given
from hypothesis import strategies as st

from minidl_bench import SUITES, Timing, is_quick, machine, machine_info, machine_tag, time_it
from minidl_bench.harness import Row, fill_speedups, format_table, main, missing
from minidl_bench.kernels import (
    compile_numba,
    fetch_sample,
    make_images,
    make_pool,
    map_pool,
    map_serial,
    map_threads,
    monte_carlo_hits,
    normalise_image,
    normalise_numpy,
)
from minidl_bench.machine import MACHINE_FIELDS

ROOT = Path(__file__).resolve().parents[1]
HAS_NUMBA = not missing("numba")
HAS_MATPLOTLIB = not missing("matplotlib")


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter from the repository root."""
    full_env = {k: v for k, v in os.environ.items() if k != "MINIDL_QUICK"} | (env or {})
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=100)


# --- import hygiene ------------------------------------------------------------------------------

@pytest.mark.parametrize("module", ["minidl", "minidl_bench"])
def test_import_does_not_pull_in_heavy_packages(module):
    heavy = ("numba", "matplotlib", "tqdm")
    if module == "minidl":
        heavy += ("minidl_bench",)
    code = f"import sys, {module}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- the harness ---------------------------------------------------------------------------------

def test_time_it_keeps_median_min_max_and_first_call():
    calls = []
    timing = time_it(lambda: calls.append(1), repeats=4)
    assert len(calls) == 5  # one warm-up, four timed
    assert timing.repeats == 4
    assert 0 <= timing.min <= timing.median <= timing.max
    assert timing.first >= 0


def test_time_it_refuses_fewer_than_three_repeats():
    with pytest.raises(ValueError):
        time_it(lambda: None, repeats=2)


def test_speedups_are_relative_to_the_baseline_of_the_same_task_and_size():
    def row(task, size, method, median, baseline=False):
        return Row("s", task, size, method, 1, Timing(median, median, median, 3, median), baseline)

    rows = [row("a", 1, "serial", 2.0, True), row("a", 1, "fast", 0.5), row("a", 2, "fast", 1.0),
            row("b", 1, "other", 1.0)]
    fill_speedups(rows)
    assert [r.speedup for r in rows] == [1.0, 4.0, None, None]
    table = format_table(rows)
    assert "x4.00" in table and table.splitlines()[0].split()[0] == "task"


def test_machine_info_and_tag():
    info = machine_info()
    assert set(info) == set(MACHINE_FIELDS)
    assert info["python_build"] in ("gil", "free-threaded", "free-threaded, GIL re-enabled")
    assert int(info["cores"]) >= 1
    assert re.fullmatch(r"[\w.]+-\d+c-py\d+\.\d+t?-(gil|nogil)", machine_tag())


def test_is_quick_reads_the_environment(monkeypatch):
    monkeypatch.setenv("MINIDL_QUICK", "1")
    assert is_quick()
    monkeypatch.setenv("MINIDL_QUICK", "0")
    assert not is_quick()
    monkeypatch.delenv("MINIDL_QUICK")
    assert not is_quick()


def test_every_registered_suite_has_a_run_function_and_is_listed(capsys):
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out
    for name, module in SUITES.items():
        assert callable(importlib.import_module(module).run)
        assert name in listed


def test_unknown_suite_is_an_error():
    with pytest.raises(SystemExit) as excinfo:
        main(["no-such-suite"])
    assert excinfo.value.code == 2


# --- the kernels agree before anything is timed --------------------------------------------------

def test_every_way_of_normalising_agrees():
    images = make_images(4, seed=1)
    reference = np.stack(map_serial(normalise_image, images))
    assert reference.shape == (4, 3, 32, 32) and reference.dtype == np.float32
    np.testing.assert_allclose(normalise_numpy(images), reference, atol=1e-5)
    np.testing.assert_allclose(np.stack(map_serial(normalise_numpy, images)), reference, atol=1e-5)
    with ThreadPoolExecutor(2) as ex:
        np.testing.assert_array_equal(np.stack(map_threads(normalise_image, images, ex)), reference)
    with make_pool(2) as pool:
        np.testing.assert_array_equal(np.stack(map_pool(normalise_image, images, pool)), reference)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_NUMBA, reason="numba not installed")
@pytest.mark.parametrize("parallel", [False, True])
def test_numba_agrees_with_the_python_loop(parallel):
    images = make_images(3, seed=2)
    reference = np.stack(map_serial(normalise_image, images))
    np.testing.assert_allclose(compile_numba(parallel)(images), reference, atol=1e-6)


def test_io_and_monte_carlo_tasks_are_deterministic():
    assert np.array_equal(fetch_sample(5, latency=0.0), fetch_sample(5, latency=0.0))
    with make_pool(2) as pool:
        tasks = [(200, seed) for seed in range(4)]
        assert map_pool(monte_carlo_hits, tasks, pool, 1) == map_serial(monte_carlo_hits, tasks)


# --- the whole suite, as `python -m minidl_bench kernels --quick` --------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_runs_the_kernels_suite_in_quick_mode(tmp_path):
    result = run_bench("kernels", "--quick", "--out", str(tmp_path), timeout=280)  # a hang guard, loaded machines too
    assert result.returncode == 0, result.stderr
    assert "mode: quick" in result.stdout
    rows = read_csv(tmp_path / "kernels.csv")
    check_rows(rows, first_calls=True)
    methods = {(r["task"], r["method"]) for r in rows}
    expected = {("cpu-normalise", m) for m in ("python serial", "threads", "pool", "numpy per sample",
                                               "numpy batch")}
    expected |= {("io-fetch", m) for m in ("serial", "threads", "pool")}
    expected |= {("pool-crossover", m) for m in ("serial", "pool", "threads")}
    expected |= {("startup", m) for m in ("pool", "threads")}
    if HAS_NUMBA:
        expected |= {("cpu-normalise", m) for m in ("numba", "numba first call", "numba parallel",
                                                    "numba parallel first call")}
    assert expected <= methods
    baselines = [r for r in rows if r["speedup"] == "1"]
    assert {r["task"] for r in baselines} == {"cpu-normalise", "io-fetch", "pool-crossover"}
    if HAS_MATPLOTLIB:
        for name in ("kernels_cpu.png", "kernels_io.png", "kernels_crossover.png"):
            png = tmp_path / name
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


@pytest.mark.slow
def test_kernels_suite_runs_without_numba_matplotlib_or_torch(tmp_path):
    # sys.modules[name] = None makes `import name` fail, as if the package were not installed.
    code = ("import sys\n"
            "for name in ('numba', 'matplotlib', 'torch'):\n"
            "    sys.modules[name] = None\n"
            "from minidl_bench.harness import main\n"
            f"raise SystemExit(main(['kernels', '--out', {str(tmp_path)!r}]))\n")
    result = run_python(code, env={"MINIDL_QUICK": "1"})
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "mode: quick" in output
    assert "skipped numba rows: numba not installed" in output
    assert "skipped plots: matplotlib not installed" in output
    rows = read_csv(tmp_path / "kernels.csv")
    check_rows(rows, first_calls=True)
    assert all(r["numba"] == "none" and r["torch"] == "none" for r in rows)
    assert not any("numba" in r["method"] for r in rows)
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.slow
def test_everything_a_pool_runs_pickles_under_spawn():
    # spawn starts fresh interpreters that import each function by name: nothing defined locally works.
    images = make_images(2, seed=3)
    with make_pool(2, start_method="spawn") as pool:
        np.testing.assert_array_equal(np.stack(map_pool(normalise_image, images, pool)),
                                      np.stack(map_serial(normalise_image, images)))
        fetch = partial(fetch_sample, latency=0.0)
        assert all(np.array_equal(a, b) for a, b in zip(map_pool(fetch, range(3), pool), map_serial(fetch, range(3))))
        assert map_pool(monte_carlo_hits, [(50, 1)], pool) == [monte_carlo_hits((50, 1))]



@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40, unique=True), st.sampled_from([0.9, 0.95, 0.99]))
def test_median_ci_brackets_the_median_with_the_coverage_it_claims(values, level):
    from minidl_bench.harness import median_ci

    low, high, coverage = median_ci(values, level)
    ordered, n = sorted(values), len(values)
    k = ordered.index(low) + 1  # low is the k-th smallest, high the k-th largest
    assert high == ordered[n - k] and low <= statistics.median(values) <= high

    def binomial_coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    assert coverage == pytest.approx(binomial_coverage(k))
    if coverage < level:  # too few values for that level: the whole range, worth what it says
        assert k == 1
    elif k + 1 <= (n + 1) // 2:  # the widest k that reaches the level: one narrower falls short
        assert binomial_coverage(k + 1) < level


def test_session_progress_counts_measurements_a_suite_takes_itself(tmp_path):
    from tqdm import tqdm

    from minidl_bench.harness import Session
    from minidl_bench.loaders import run_rounds

    with tqdm(total=0, file=io.StringIO()) as bar:  # not disabled: a disabled bar counts nothing
        session = Session("demo", quick=True, out=tmp_path, bar=bar)
        session.plan(2 * 4)  # two kinds, a warm-up round and three timed ones
        results = run_rounds({"a": lambda: [1], "b": lambda: [2, 3]}, 3, len, session.progress("demo:"))
        assert results == {"a": [1, 1, 1, 1], "b": [2, 2, 2, 2]}
        assert (bar.n, bar.total) == (8, 8)
        session.advance("one more")
        assert bar.n == 9


@pytest.mark.parametrize("cores, knee_passed_at", [(1, 2), (2, 3), (8, 12), (16, 24)])
def test_worker_sweep_reaches_past_the_core_count(cores, knee_passed_at):
    sweep = machine.worker_sweep(cores)
    assert sweep[0] == 0 and list(sweep) == sorted(set(sweep))
    assert cores in sweep and 1 in sweep
    assert max(sweep) >= knee_passed_at > cores  # at least one point beyond the knee
    assert len(sweep) <= 8  # each point starts that many workers per round: keep the sweep short


def test_core_count_follows_the_affinity_mask():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity masks on this platform")
    code = "import os; os.sched_setaffinity(0, {0}); from minidl_bench import machine; print(machine.core_count())"
    assert run_python(code).stdout.strip() == "1"


def test_cpu_model_on_a_mac_is_its_marketing_name(monkeypatch):
    # A Mac has no /proc/cpuinfo and platform.processor() there says only "arm": sysctl has the name.
    def no_proc(path, *args, **kwargs):
        raise FileNotFoundError(path)

    asked = []

    def sysctl(argv, **kwargs):
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="Apple M2 Pro\n", stderr="")

    monkeypatch.setattr("builtins.open", no_proc)
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(machine.subprocess, "run", sysctl)
    assert machine.cpu_model() == "Apple M2 Pro"
    assert asked == [["sysctl", "-n", "machdep.cpu.brand_string"]]
    monkeypatch.setattr(machine.subprocess, "run", no_proc)  # no sysctl either
    monkeypatch.setattr(machine.platform, "processor", lambda: "arm")
    assert machine.cpu_model() == "arm"  # no sysctl: what platform says
