"""minidl_course/ch05.py: notebook 05's harnesses measure what the notebook says, and draw what it describes."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pytest

import minidl
from minidl_bench import kernels as K
from minidl_course import ch05, toy
from minidl_course.labelled import LabelledImages

pytestmark = pytest.mark.usefixtures("no_leaks")


def traced_epoch(in_order: bool):
    loader = minidl.DataLoader(LabelledImages(8, delay=0.01, slow=(0,), slow_delay=0.2), batch_size=2,
                               num_workers=2, in_order=in_order, trace=True)
    for _ in loader:
        pass
    return loader.trace


@pytest.mark.timeout(120)
def test_plot_trace_names_events_in_words_and_draws_the_reorder_buffer_above_the_waits():
    trace = traced_epoch(in_order=True)  # sample 0 is slow: batch 1 waits in the reorder buffer
    fig, ax = plt.subplots()
    ch05.plot_trace(trace, ax, title="t")
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "batch sat in the reorder buffer" in labels and "main process waiting in next()" in labels
    assert not set(labels) & set(ch05.LEGEND)  # no event's code name is left
    by_label = {}
    for collection in ax.collections:
        by_label.setdefault(collection.get_label(), []).append(collection)
    assert by_label["reorder"] and by_label["wait"]
    assert min(c.get_zorder() for c in by_label["reorder"]) > max(c.get_zorder() for c in by_label["wait"])
    # the strips keep each span's start and length: as many as the trace has reorder events
    spans = [p.get_extents() for c in by_label["reorder"] for p in c.get_paths()]
    assert len(spans) == sum(1 for row in trace.rows() if row["event"] == "reorder")
    plt.close(fig)


def test_workers_needed_uncapped_is_batch_time_over_step_rounded_up():
    d = SimpleNamespace(batch_time=0.064, consumer_step=0.0013, workers_needed=12)
    assert ch05.workers_needed_uncapped(d) == 50
    assert ch05.workers_needed_uncapped(SimpleNamespace(batch_time=1.0, consumer_step=0.0, workers_needed=3)) == 3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sweep_times_every_setting_and_derives_speedups_from_its_own_rounds():
    images = K.make_images(8, seed=0)
    tasks = {"CPU-bound": dict(dataset=images, collate_fn=partial(K.map_serial, K.normalise_image)),
             "I/O-bound": dict(dataset=toy.SlowDataset(8, delay=0.002))}
    result = ch05.sweep(tasks, (0, 1, 2), plain=(K.normalise_image, images), repeats=2, warm_up=False, cores=2)
    assert set(result.speedup) == {"CPU-bound, processes", "CPU-bound, threads", "I/O-bound, processes",
                                   "I/O-bound, threads"}
    for task_label, line in result.speedup.items():
        assert len(line) == 3 and line[0] == 1.0  # num_workers=0 is the baseline
        task = task_label.split(", ")[0]
        base = min(result.seconds[task, 0, "multiprocessing"])
        method = "multiprocessing" if task_label.endswith("processes") else "thread"
        assert line[2] == pytest.approx(base / min(result.seconds[task, 2, method]))
    assert all(len(times) == 2 for times in result.seconds.values())
    assert result.pool_speedup == pytest.approx(min(result.seconds["plain loop"]) / min(result.seconds["plain Pool"]))
    assert [v[1][:7] for v in result.verdicts] == ["threads", "2 sleep"]
    assert "num_workers swept" in result.table() and "2 workers" in result.beyond_cores()


def test_epoch_loads_what_the_main_process_loads():
    task = dict(dataset=toy.RangeDataset(10))
    assert [b.tolist() for b in ch05.epoch(task, 2, "thread")] == [b.tolist() for b in ch05.epoch(task, 0)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bottleneck_study_diagnoses_three_epochs_and_reports_each():
    study = ch05.bottleneck_study(python=K.normalise_image, vectorised=K.normalise_numpy, workers=1,
                                  vectorised_images=64)
    assert list(study.diagnoses) == ["pure Python", "pure Python, in_order=False", "NumPy"]
    assert study.images == {"pure Python": 128, "pure Python, in_order=False": 128, "NumPy": 64}
    assert study.step_alone > 0 and len(study.verdicts) == 2
    report = study.report()
    assert report.count("bottleneck: the") == 3 and "in order the epoch took" in report
    assert np.isfinite(study.diagnoses["NumPy"].batch_time)
