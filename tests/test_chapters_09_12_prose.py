"""What notebooks 09 and 10 say about the committed benchmark runs, checked against those runs' CSV files.

The chapters print their figures from the CSVs and narrate them; the sentences that state a trend ("with the
GIL the thread lines stay at or below 1", "two process workers are slower than none on numpy") are checked
here, so a learner's screen holds the figures and the narration, and a re-run benchmark that no longer shows a
trend fails a test instead of leaving a false sentence. The project's own goals for minidl against torch
(throughput, the loader's cost per batch, worker start, tracing) are checked here too. Nothing is measured:
only committed files are read.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from minidl_bench.timing import median_ci

ROOT = Path(__file__).resolve().parents[1]
LOADERS = ROOT / "results" / "x86_64-2c-py3.11-gil"  # notebook 10's reference run
THREADS = ROOT / "results" / "threads"  # notebook 09's merged GIL and free-threaded run


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --- notebook 10: the loaders and overhead suites ---------------------------------------------------------


@pytest.fixture(scope="module")
def loaders():
    return {"metrics": read(LOADERS / "loaders_metrics.csv"), "rounds": read(LOADERS / "loaders_rounds.csv"),
            "runs": read(LOADERS / "loaders.csv")}


@pytest.fixture(scope="module")
def overhead():
    return {"costs": read(LOADERS / "overhead.csv"), "rounds": read(LOADERS / "overhead_rounds.csv")}


def metric(data, workload: str, backend: str, workers: int, name: str) -> float:
    method = "minidl" if workers == 0 and backend != "torch" else backend
    row = next(r for r in data["metrics"]
               if (r["workload"], r["method"], int(r["workers"])) == (workload, method, workers))
    return float(row[f"{name}_median"])


def paired_rates(data, workload: str, backend: str, workers: int) -> list[float]:
    """minidl's samples/s over torch's, round by round (the two epochs of a round ran side by side)."""
    def per_round(method):
        method = "minidl" if workers == 0 and method != "torch" else method
        return {int(r["round"]): float(r["samples"]) / float(r["seconds"]) for r in data["rounds"]
                if r["round"] != "0" and (r["workload"], r["method"], int(r["workers"])) == (workload, method, workers)}
    ours, theirs = per_round(backend), per_round("torch")
    assert ours and sorted(ours) == sorted(theirs)
    return [ours[i] / theirs[i] for i in sorted(ours)]


def workloads(data) -> list[str]:
    return list(dict.fromkeys(r["workload"] for r in data["metrics"]))


def counts(data) -> list[int]:
    return sorted({int(r["workers"]) for r in data["metrics"]})


def test_minidl_process_workers_keep_torchs_throughput_on_every_workload(loaders):
    """The project's goal: no setting where even the interval's top lies below 0.95 of torch's throughput."""
    for name in workloads(loaders):
        for w in counts(loaders):
            low, high, _ = median_ci(paired_rates(loaders, name, "minidl process", w))
            assert high >= 0.95, (name, w, low, high)


def test_thread_workers_tell_the_gils_story_as_chapter_10_says(loaders):
    rate = {(n, w): statistics.median(paired_rates(loaders, n, "minidl thread", w))
            for n in workloads(loaders) for w in counts(loaders)[1:]}
    # "on python two are no faster than one"
    assert metric(loaders, "python", "minidl thread", 2, "samples_per_s") <= 1.05 * metric(
        loaders, "python", "minidl thread", 1, "samples_per_s")
    # "on io (sleeping) they keep up with processes", "one thread worker on numpy beats torch's single process"
    assert all(rate["io", w] >= 0.98 for w in counts(loaders)[1:]) and rate["numpy", 1] > 1
    # "on images (Pillow releases the GIL) they beat them"
    assert all(rate["images", w] > 1 for w in counts(loaders)[1:])


def test_first_batch_ratios_are_largest_where_a_batch_is_cheap(loaders):
    ratio = {(n, w): metric(loaders, n, "minidl process", w, "first_batch_s") / metric(loaders, n, "minidl thread", w,
                                                                                          "first_batch_s")
             for n in workloads(loaders) for w in counts(loaders)[1:]}
    assert max(workloads(loaders), key=lambda n: ratio[n, 1]) == "numpy"
    assert ratio["python", max(counts(loaders))] < 1  # more threads than cores lose the lead on pure Python


def test_two_process_workers_are_slower_than_none_on_numpy(loaders):
    for backend in ("torch", "minidl process"):
        assert metric(loaders, "numpy", backend, 2, "samples_per_s") < metric(loaders, "numpy", backend, 0,
                                                                               "samples_per_s")


def test_thread_workers_take_less_memory_than_process_workers_by_pss(loaders):
    for name in workloads(loaders):
        for w in counts(loaders)[1:]:
            assert metric(loaders, name, "minidl thread", w, "peak_pss_mib") < metric(
                loaders, name, "minidl process", w, "peak_pss_mib"), (name, w)


def cost(data, task: str, size: int, method: str) -> float:
    return float(next(r for r in data["costs"] if (r["task"], r["size"], r["method"]) == (task, str(size), method))
                 ["median_s"])


def per_batch_rounds(data, bs: int, w: int, method: str) -> dict[int, float]:
    return {int(r["round"]): float(r["per_batch_s"]) for r in data["rounds"] if r["round"] != "0"
            and (int(r["batch_size"]), int(r["workers"]), r["method"]) == (bs, w, method)}


def test_the_loaders_own_cost_per_batch_is_within_a_tenth_of_torchs(overhead):
    """The project's goal: minidl / torch <= 1.1, per round's median, at every batch size and worker count."""
    checked = 0
    for bs in (1, 64):
        for w, methods in ((0, ("minidl",)), (2, ("minidl process", "minidl thread"))):
            theirs = per_batch_rounds(overhead, bs, w, "torch")
            for method in methods:
                ours = per_batch_rounds(overhead, bs, w, method)
                assert ours and sorted(ours) == sorted(theirs)
                assert statistics.median(ours[i] / theirs[i] for i in ours) <= 1.1, (bs, w, method)
                checked += 1
    assert checked == 6


def test_only_process_workers_cost_hundreds_of_microseconds_a_batch(overhead):
    """Chapter 10: microseconds to tens without workers or with threads, hundreds with process workers."""
    for bs in (1, 64):
        for w, method in ((0, "torch"), (0, "minidl"), (2, "minidl thread")):
            assert cost(overhead, f"per-batch, {w} workers", bs, method) < 1e-4, (bs, w, method)
        for method in ("torch", "minidl process"):
            assert cost(overhead, "per-batch, 2 workers", bs, method) >= 1e-4, (bs, method)


def test_two_threads_start_at_least_five_times_sooner_than_two_processes(overhead):
    """The project's goal for thread workers' start (chapter 10's worker-start table)."""
    for bs in (1, 64):
        assert cost(overhead, "first batch, 2 workers", bs, "minidl process") >= 5 * cost(
            overhead, "first batch, 2 workers", bs, "minidl thread"), bs


def test_tracing_keeps_at_least_95_percent_of_the_throughput(overhead):
    """The project's goal for ``trace=True`` (chapter 10's tracing table)."""
    traced = [r for r in overhead["costs"] if r["task"].startswith("trace numpy")]
    tasks = {r["task"] for r in traced}
    assert len(tasks) == 3
    for task in tasks:
        off = next(float(r["median_s"]) for r in traced if r["task"] == task and r["method"] == "trace off")
        on = next(float(r["median_s"]) for r in traced if r["task"] == task and r["method"] == "trace=True")
        assert off / on >= 0.95, task


# --- notebook 09: the threads suite under both builds, merged ---------------------------------------------


@pytest.fixture(scope="module")
def threads():
    from minidl_bench import threads_report

    rows = read(THREADS / "threads_metrics.csv")
    return {"rows": rows, "up": threads_report.speedups(rows), "keyed": threads_report.by_key(rows)}


def serial_rate(threads, build: str, name: str) -> float:
    return float(threads["keyed"][build, name, "serial", 0]["samples_per_s_median"])


def test_the_reference_run_holds_both_builds_and_every_workload(threads):
    builds = {k[0] for k in threads["up"]}
    names = {k[1] for k in threads["up"]}
    assert builds == {"GIL", "free-threaded"}
    assert names == {"python", "python-shared", "numpy", "images", "io"}


def test_with_the_gil_thread_lines_stay_at_or_below_one_and_processes_climb(threads):
    up = threads["up"]
    assert all(up["GIL", n, "thread", w] <= 1.0 for n in ("python", "python-shared") for w in (1, 2, 4))
    assert up["GIL", "python", "process", 2] > 1.5
    assert up["free-threaded", "python", "thread", 2] > 1.7  # "the thread line climbs with the process line"
    # "can match processes on pure Python, if the hot loop touches only objects its own thread owns"
    assert up["free-threaded", "python", "thread", 2] >= 0.9 * up["free-threaded", "python", "process", 2]


def test_the_free_threaded_build_runs_the_loop_slower_on_one_thread(threads):
    assert serial_rate(threads, "free-threaded", "python") < serial_rate(threads, "GIL", "python")


def test_waiting_and_cheap_workloads_go_as_chapter_09_says(threads):
    up = threads["up"]
    for build in ("GIL", "free-threaded"):
        assert up[build, "io", "thread", 2] > 1.5  # sleeping releases the GIL: threads help on both builds
        assert up[build, "numpy", "process", 2] < 1  # so cheap that process workers lose to pickling


def shares(folder: Path) -> dict[str, float]:
    """A perf_decref.txt's shares of the samples in _Py_DecRefShared: shared constants, own copies."""
    profile = (folder / "perf_decref.txt").read_text()
    return {line.split()[1]: float(line.split()[2]) for line in profile.splitlines() if line.startswith("share ")}


def thread_ranges(rows: list[dict[str, str]], build: str, name: str) -> tuple[float, float]:
    from minidl_bench import threads_report

    keyed = threads_report.by_key(rows)
    row, serial = keyed[build, name, "thread", 2], float(keyed[build, name, "serial", 0]["samples_per_s_median"])
    return float(row["samples_per_s_min"]) / serial, float(row["samples_per_s_max"]) / serial


def apart(rows: list[dict[str, str]], build: str) -> bool:
    (lo_s, hi_s), (lo_o, hi_o) = thread_ranges(rows, build, "python-shared"), thread_ranges(rows, build, "python")
    return hi_s < lo_o or hi_o < lo_s


def test_shared_constants_cost_threads_more_on_one_machine_than_the_other(threads):
    xeon = read(THREADS / "xeon" / "threads_metrics.csv")
    assert {r["workload"] for r in xeon} == {"python", "python-shared"}  # "its two files are kept"
    assert {r["cpu_model"] for r in xeon} != {r["cpu_model"] for r in threads["rows"]}  # "another machine"
    # "_Py_DecRefShared all but leaves both profiles"; the earlier machine's share of it is larger
    here, there = shares(THREADS), shares(THREADS / "xeon")
    assert here["shared"] > 10 * max(here["own"], 0.01) and there["shared"] > 10 * max(there["own"], 0.01)
    assert there["shared"] > 2 * here["shared"]
    from minidl_bench import threads_report

    up_there = threads_report.speedups(xeon)
    shared, own = (up_there["free-threaded", name, "thread", 2] for name in ("python-shared", "python"))
    assert shared < 0.8 * own
    # "Under the GIL ... their ranges overlap"; "the earlier machine's ranges are apart; the reference run's overlap"
    assert not apart(threads["rows"], "GIL")
    assert apart(xeon, "free-threaded")
    assert not apart(threads["rows"], "free-threaded")


def test_start_up_and_memory_go_as_the_last_figures_say(threads):
    keyed = threads["keyed"]
    cores = int(threads["rows"][0]["cores"])

    def first(build, name, backend):
        return float(keyed[build, name, backend, cores]["first_batch_s_median"])

    def pss(build, name, backend, workers):
        return float(keyed[build, name, "serial" if workers == 0 else backend, workers]["peak_pss_mib_median"])

    for build in ("GIL", "free-threaded"):
        assert first(build, "numpy", "process") > 2.5 * first(build, "numpy", "thread")  # "several times sooner"
        for name in ("numpy", "images"):
            assert pss(build, name, "process", 4) > pss(build, name, "process", 0)  # "grows from none to four"
            assert pss(build, name, "process", 4) > pss(build, name, "process", 1)
            assert (pss(build, name, "thread", 4) - pss(build, name, "thread", 0)
                    < pss(build, name, "process", 4) - pss(build, name, "process", 0))  # "threads add little"
    # "two threads sharing a GIL take longer over their first two batches than a process over one"
    assert first("GIL", "python", "thread") > first("GIL", "python", "process")
