"""minidl_bench.live: the words a notebook prints about its own run."""

from __future__ import annotations

import os

import pytest

from minidl_bench import live


@pytest.mark.parametrize(("ratios", "expected"), [
    ([1.2, 1.05, 1.3], "faster in every round"),
    ([0.8, 0.95, 0.99], "slower in every round"),
    ([0.9, 1.1, 1.3], "no difference beyond the rounds' variation (not all rounds fall on one side of 1)"),
    # A tie is no win:
    ([1.0, 1.2, 1.3], "no difference beyond the rounds' variation (not all rounds fall on one side of 1)"),
])
def test_verdict_reads_every_round(ratios, expected):
    assert live.verdict(ratios, "faster", "slower") == expected


def test_spread_gives_median_and_range():
    assert live.spread([1.5, 0.5, 1.0, 2.0, 1.2]) == "x1.20 (rounds x0.50 to x2.00)"


@pytest.mark.parametrize(("model", "cores", "expected"), [
    ("Intel(R) Xeon(R) Processor", "2", "reference run (Intel Xeon, 2 cores)"),
    ("AMD EPYC 7B13 64-Core Processor", 16, "reference run (AMD EPYC, 16 cores)"),
    ("Apple M2 Pro", 1, "reference run (Apple M2, 1 core)"),
    ("", 4, "reference run (unknown CPU, 4 cores)"),
])
def test_run_label_names_the_cpu_and_cores(model, cores, expected):
    assert live.run_label({"cpu_model": model, "cores": cores}, "reference run") == expected


def test_load_line_names_load_and_cores(monkeypatch):
    monkeypatch.setattr(live, "core_count", lambda: 8)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.25, 2.0, 1.0), raising=False)
    assert live.load_line() == "load average 3.25 on 8 cores"


def test_load_line_without_a_load_average_says_so(monkeypatch):
    # Windows has no os.getloadavg; a sandbox may refuse it with OSError
    monkeypatch.setattr(live, "core_count", lambda: 8)
    monkeypatch.delattr(os, "getloadavg", raising=False)
    assert live.load_line() == "load average: not reported on this platform (8 cores)"

    def refuse():
        raise OSError("no load average")
    monkeypatch.setattr(os, "getloadavg", refuse, raising=False)
    assert live.load_line() == "load average: not reported on this platform (8 cores)"
