"""Tests for the ``loaders`` and ``overhead`` suites of minidl_bench and the workloads they load.

Both suites run once, in quick mode, into a temporary folder, through the same command-line path as
``python -m minidl_bench``. No test here asserts a speed: only that every number is there and positive.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from benchtools import check_rows, read_csv, run_bench
from loadertools import items_in_a_fresh_interpreter

from minidl_bench.harness import missing
from minidl_bench.machine import MACHINE_FIELDS

# scikit-image is not in the list: it is a pinned dependency, and without it the photo folder fails, saying so.
pytestmark = pytest.mark.skipif(bool(missing("torch", "psutil", "PIL")), reason="needs torch, psutil and Pillow")

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("python", "numpy", "images", "io")


def by_key(rows: list[dict[str, str]]) -> dict[tuple[str, str, int, int], dict[str, str]]:
    return {(r["task"], r["method"], int(r["workers"]), int(r["size"])): r for r in rows}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[Path, str]:
    """Both suites in quick mode, in a fresh interpreter, with a fresh photo cache; (out folder, output)."""
    from minidl_bench.loaders import QUICK
    from minidl_course import photos

    out = tmp_path_factory.mktemp("bench")
    cache = tmp_path_factory.mktemp("cache")
    result = run_bench("loaders", "overhead", "--quick", "--out", str(out), timeout=280,
                       env={"XDG_CACHE_HOME": str(cache)})
    assert result.returncode == 0, result.stderr
    made = photos.photo_folder(QUICK.image_files_per_class, cache=cache / "minidl")  # already there: found, not made
    assert (made / photos.MARKER).is_file() and made.parent == cache / "minidl"
    assert len(list(made.glob("*/*.jpg"))) == QUICK.image_files_per_class * len(photos.CLASSES) >= QUICK.images
    return out, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_loaders_suite_measures_every_backend_workload_and_worker_count(quick_run):
    from minidl_bench.loaders import QUICK, backends_for

    out, output = quick_run
    assert "mode: quick" in output
    for name in WORKLOADS:
        assert f"[loaders] {name}: the first 2 batches of every backend equal torch's" in output
    assert "minidl processes / torch, median of per-round ratios [CI of the median, coverage >= 95%" in output
    loader_epochs = len(WORKLOADS) * sum(len(backends_for(w)) for w in QUICK.workers) * (QUICK.repeats + 1)
    assert re.search(rf"\b{loader_epochs}/{loader_epochs} \[", output)  # the bar counted every epoch (loaders)
    rows = read_csv(out / "loaders.csv")
    check_rows(rows)
    keys = {(r["task"], r["method"], int(r["workers"])) for r in rows}
    expected = {(task, backend, w) for name in WORKLOADS for task in (name, f"{name} first batch")
                for w in QUICK.workers for backend in backends_for(w)}
    assert expected == keys
    assert {r["speedup"] for r in rows if r["method"] == "torch" and r["workers"] == "0" and r["task"] in WORKLOADS
            } == {"1"}

    metrics = read_csv(out / "loaders_metrics.csv", columns=None)
    assert {(r["workload"], r["method"], int(r["workers"])) for r in metrics} == {
        (name, backend, w) for name in WORKLOADS for w in QUICK.workers for backend in backends_for(w)}
    for row in metrics:
        for metric in ("samples_per_s", "first_batch_s", "peak_uss_mib", "peak_pss_mib", "cpu_util"):
            low, median, high = (float(row[f"{metric}_{s}"]) for s in ("min", "median", "max"))
            assert 0 < low <= median <= high, (metric, row)
        assert int(row["samples"]) == {"python": QUICK.python, "numpy": QUICK.numpy, "images": QUICK.images,
                                       "io": QUICK.io}[row["workload"]]
    rounds = read_csv(out / "loaders_rounds.csv", columns=None)
    counted = {}
    for row in rounds:
        assert all(row[field] for field in MACHINE_FIELDS), row
        assert float(row["seconds"]) >= float(row["first_batch_s"]) > 0 and float(row["cpu_s"]) >= 0, row
        key = (row["workload"], row["method"], int(row["workers"]))
        counted[key] = counted.get(key, []) + [int(row["round"])]
    assert counted == {(r["workload"], r["method"], int(r["workers"])): list(range(QUICK.repeats + 1))
                       for r in metrics}  # the warm-up, round 0, and every timed round
    if not missing("matplotlib"):
        names = [f"loaders_throughput_{n}.png" for n in WORKLOADS] + ["loaders_first_batch.png", "loaders_memory.png"]
        for name in names:
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_overhead_suite_measures_every_backend_batch_size_and_worker_count(quick_run):
    from minidl_bench.overhead import (
        BATCH_SIZES,
        QUICK,
        RESUME_BACKENDS,
        RESUME_WORKERS,
        STATEFUL,
        TRACE_BACKENDS,
        WORKERS,
        methods_for,
    )

    out, output = quick_run
    assert "loader's own cost per batch" in output and "tracing: with trace=True / without" in output
    assert "resume layer's cost per batch, µs: stateful=True beside stateful=False" in output
    assert {m for w in WORKERS for m in methods_for(w) if m.endswith(STATEFUL)} == {
        "minidl stateful=True", "minidl process stateful=True", "minidl thread stateful=True"}
    rows = read_csv(out / "overhead.csv")
    check_rows(rows)
    keys = set(by_key(rows))
    expected = {(f"{what}, {w} workers", method, w, bs) for what in ("per-batch", "first batch")
                for bs in BATCH_SIZES for w in WORKERS for method in methods_for(w)}
    expected |= {(f"trace numpy, {backend}, {w} workers", method, w, QUICK.trace_samples)
                 for w, backend in TRACE_BACKENDS for method in ("trace off", "trace=True")}
    resumed = {"images": QUICK.resume_images, "numpy": QUICK.resume_numpy}
    expected |= {(f"resume, {name}, {backend}, {RESUME_WORKERS} workers", f"stateful={on}", RESUME_WORKERS, size)
                 for name, size in resumed.items() for backend in RESUME_BACKENDS for on in (False, True)}
    assert expected == keys
    assert "resume, realistic workloads: epoch throughput, stateful=True / False" in output
    rounds = read_csv(out / "overhead_rounds.csv", columns=None)
    assert {(int(r["batch_size"]), int(r["workers"]), r["method"], int(r["round"])) for r in rounds} == {
        (bs, w, m, i) for bs in BATCH_SIZES for w in WORKERS for m in methods_for(w) for i in range(QUICK.repeats + 1)}
    resume_rounds = read_csv(out / "overhead_resume_rounds.csv", columns=None)
    assert {(r["workload"], r["method"], r["stateful"], int(r["round"])) for r in resume_rounds} == {
        (name, backend, str(on), i) for name in resumed for backend in RESUME_BACKENDS for on in (False, True)
        for i in range(QUICK.repeats + 1)}
    assert all(float(r["per_batch_s"]) > 0 and float(r["first_batch_s"]) > 0 for r in rounds)
    baselines = {(r["task"], r["method"]) for r in rows if r["speedup"] == "1"}
    assert {t for t, _ in baselines} == {task for task, *_ in expected}  # every group has its baseline
    if not missing("matplotlib"):
        for name in ("overhead_per_batch.png", "overhead_trace.png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        from minidl_bench import replot

        figure = replot.overhead(out)["overhead_per_batch.png"]  # redrawn from the CSV: every method has its dot
        labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
        assert labels == [f"batch {bs}, {w} workers · {m}" for bs in BATCH_SIZES for w in WORKERS
                          for m in methods_for(w)]


# --- the workloads, without running a suite -------------------------------------------------------

@pytest.fixture(scope="module")
def small_workloads(tmp_path_factory):
    from minidl_bench import workloads
    from minidl_course import photos

    root = photos.photo_folder(1, cache=tmp_path_factory.mktemp("photos"))  # one JPEG per photograph: 9
    return {"python": workloads.PythonWorkload(6, side=4), "numpy": workloads.NumpyWorkload(6, pool=4),
            "images": workloads.ImageFolderWorkload(root, limit=6), "io": workloads.IoWorkload(6, latency=0.0)}


def test_workloads_are_deterministic_and_collate_the_same_in_minidl_and_torch(small_workloads):
    import torch.utils.data

    import minidl

    for name, dataset in small_workloads.items():
        assert len(dataset) == 6
        first, again = dataset[3], dataset[3]
        assert np.array_equal(first[0], again[0]) and first[1] == again[1], name
        ours = minidl.default_collate([dataset[i] for i in range(4)])
        theirs = torch.utils.data.default_collate([dataset[i] for i in range(4)])
        assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(ours, theirs)), name
    images = small_workloads["images"]
    assert images.classes[:2] == ["astronaut", "cat"] and images[0][0].shape == (3, 224, 224)
    assert [label for _, label in images.samples] == [0, 1, 2, 3, 4, 5]  # round-robin


def test_workloads_load_by_reference_in_a_fresh_interpreter(small_workloads):
    # spawn and forkserver workers unpickle the dataset in a new interpreter, importing its class by name.
    for name, (sample, label) in items_in_a_fresh_interpreter(small_workloads, 2).items():
        assert np.array_equal(sample, small_workloads[name][2][0]) and label == small_workloads[name][2][1]


def test_peak_memory_sees_this_process():
    from minidl_bench.loaders import PeakMemory

    with PeakMemory(interval=0.01) as memory:
        block = np.ones(32 * 2**20 // 8)  # 32 MiB, touched: private to this process
    assert memory.uss >= block.nbytes and memory.pss >= memory.uss


def test_peak_memory_without_pss_records_nan_not_zero(monkeypatch):
    # A Mac: psutil's memory_full_info() has uss but no pss. The sampler must not raise, nor record 0 MiB.
    psutil = pytest.importorskip("psutil")
    import collections
    import math

    from minidl_bench.loaders import PeakMemory

    no_pss = collections.namedtuple("pfullmem", "rss vms uss")
    monkeypatch.setattr(psutil.Process, "memory_full_info", lambda self: no_pss(1, 2, 3 * 2**20))
    sampler = PeakMemory(interval=1.0)
    sampler.sample()
    assert sampler.uss >= 3 * 2**20 and math.isnan(sampler.pss)
