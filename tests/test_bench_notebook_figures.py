"""The figure-and-verdict functions notebooks 09, 10 and 11 call (minidl_bench.threads_figures, headline,
gil_split): each draws on the Agg backend and returns the lines its chapter prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def close_figures():
    plt.close("all")
    yield
    plt.close("all")


def test_threads_figures_reads_the_committed_run_and_returns_its_figures_in_words():
    from minidl_bench import threads_figures, threads_report

    rows = threads_report.read_rows(ROOT / "results" / "threads" / "threads_metrics.csv")
    lines = threads_figures.startup_and_memory(rows, "reference run")
    assert len(plt.get_fignums()) == 2  # start-up, then memory
    memory = plt.figure(plt.get_fignums()[1])
    assert [ax.get_title() for ax in memory.axes] == ["numpy workload", "images workload"]
    assert all(len(ax.get_lines()) == 4 for ax in memory.axes)  # two builds x threads, processes
    pss = [line for line in lines if "PSS MiB at" in line]
    assert len(pss) == 4 and all(re.search(r"\((up|not up) at every step\)", line) for line in pss)
    figures = lines[len(pss):]  # findings in words; tests/test_chapters_09_12_prose.py checks the prose against them
    assert [f.split(",")[0] for f in figures] == ["numpy", "python", "numpy", "images"], figures
    assert not any(f.endswith(("True", "False")) for f in figures)


def test_headline_verdicts_follow_the_rounds():
    from minidl_bench import headline

    here = {"numpy, 0 workers": [1.2, 1.3, 1.1], "numpy, 2 workers": [0.9, 1.1, 1.0],
            "batch size 1": [0.3, 0.4, 0.5], "batch size 64": [1.1, 1.2, 1.3], "2 workers": [9.0, 12.0, 10.0]}
    ref = {k: [1.0, 1.0, 1.0] for k in here}
    lines = headline.show({"this run": here, "reference run": ref}, "caption")
    assert len(plt.get_fignums()) == 1 and len(plt.gcf().axes) == 3
    mine = [line for line in lines if "this run" in line]
    assert [line.split(": ", 1)[1] for line in mine] == [
        "minidl faster in every round",
        "no difference beyond the rounds' variation (not all rounds fall on one side of 1)",
        "minidl cheaper in every round", "minidl dearer in every round", "threads sooner in every round"]
    assert sum("reference run" in line for line in lines) == len(here)


@pytest.mark.timeout(300)
def test_gil_split_sets_each_measured_speedup_beside_its_two_figures():
    pytest.importorskip("numba")
    from minidl_bench import gil_split

    split = gil_split.time_split(16, n=16, passes=2)
    assert set(split) == {"loader", "__getitem__", "zlib", "kernel"} and all(t > 0 for t in split.values())
    lines = gil_split.report([16], lambda side, kind: 0.5, cores=2)  # below x1: below both figures
    assert lines[0].startswith("h: the share of a sample that holds the GIL; n = min(2 threads, 2 cores) = 2.")
    assert sum("below both: time lost beyond the split" in line for line in lines) == 2
    assert lines[-1] == "measured speedups: 2 of 2 below both figures, 0 between them, 0 above"
    one_core = gil_split.report([16], lambda side, kind: 1.0, cores=1)
    assert "(one core: the two threads never run at once, so neither figure passes x1)" in one_core
