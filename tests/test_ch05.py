"""minidl_course/ch05.py: notebook 05's harnesses measure what the notebook says, and draw what it describes."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import matplotlib.pyplot as plt
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


@pytest.mark.timeout(120)
def test_plot_trace_lists_no_bar_hidden_under_the_main_process_wait():
    loader = minidl.DataLoader(LabelledImages(6, delay=0.005), batch_size=2, num_workers=0, trace=True)
    for _ in loader:
        pass
    fig, ax = plt.subplots()
    ch05.plot_trace(loader.trace, ax, title="t")
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    # In the main process the fetch and the collate run inside the wait in next(), drawn over them.
    assert "main process waiting in next()" in labels and "one sample (__getitem__)" in labels
    assert "a worker fetching a batch" not in labels and "collating" not in labels
    plt.close(fig)
    two = traced_epoch(in_order=True)  # with workers, their fetches stay
    fig, ax = plt.subplots()
    ch05.plot_trace(two, ax, title="t")
    assert "a worker fetching a batch" in [text.get_text() for text in ax.get_legend().get_texts()]
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


@pytest.mark.timeout(120)
def test_overlap_study_times_every_setting_and_keeps_the_stepped_traces():
    study = ch05.overlap_study(workers=(0, 1), samples=8, batch_size=2, delay=0.002, step_s=0.01, repeats=1)
    assert set(study.seconds) == {(0, False), (0, True), (1, False), (1, True)}
    assert study.batches == 4 and study.load_s == pytest.approx(0.004)
    # Sleeps cannot be skipped: no epoch is shorter than what it sleeps in the main process.
    assert study.seconds[0, True] >= 4 * (0.004 + 0.01) and study.seconds[1, True] >= 4 * 0.01
    assert study.ideal(0, True) == pytest.approx(4 * 0.014)
    # With a worker the first load has nothing to hide under: 4 ms, then 4 steps of 10 ms.
    assert study.ideal(1, True) == pytest.approx(0.004 + 4 * 0.01) and study.ideal(1, False) == pytest.approx(4 * 0.004)
    for workers, trace in study.traces.items():  # each kept trace holds one epoch with the step: 4 steps
        consumer = [r for r in trace.rows() if r["event"] == "consumer"]
        assert len(consumer) == 4 and all(r["end"] - r["start"] >= 0.01 for r in consumer)
        assert trace.num_workers == workers
    assert "1 worker took" in study.verdict() and "with the step" in study.table()
    assert len(study.plot().axes) == 2


def test_overlap_ideal_leaves_the_first_load_and_the_last_step_unhidden():
    # 8 batches, 20 ms to load one, a 20 ms step: the notebook's full-mode settings.
    study = ch05.Overlap(step_s=0.02, load_s=0.02, batches=8)
    assert study.ideal(0, True) == pytest.approx(8 * 0.04) and study.ideal(0, False) == pytest.approx(8 * 0.02)
    assert study.ideal(1, True) == pytest.approx(0.02 + 8 * 0.02)  # the steps set the pace, after the first load
    assert study.ideal(2, True) == pytest.approx(0.02 + 8 * 0.02)  # a second worker cannot shorten the steps
    assert study.ideal(1, False) == pytest.approx(8 * 0.02) and study.ideal(2, False) == pytest.approx(4 * 0.02)
    slow_load = ch05.Overlap(step_s=0.01, load_s=0.04, batches=8)  # loading is slower: it sets the pace
    assert slow_load.ideal(1, True) == pytest.approx(8 * 0.04 + 0.01)
    assert slow_load.ideal(2, True) == pytest.approx(4 * 0.04 + 0.01)


def test_overlap_study_refuses_a_sweep_without_its_baselines():
    with pytest.raises(ValueError, match="workers"):
        ch05.overlap_study(workers=(2, 4))


@pytest.mark.timeout(300)
def test_photo_study_times_a_fresh_start_per_count_and_keeps_a_batch_of_real_pixels(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a small photo set of its own
    study = ch05.photo_study((0, 1), per_class=1, size=32, batch_size=4, seed=0)
    assert study.files == 9 and set(study.costs) == {0, 1}
    assert study.costs[0].start_method == "main process" and study.costs[1].batches == 3
    images, labels = study.batch
    assert images.shape == (4, 3, 32, 32) and str(images.dtype) == "torch.uint8" and len(labels) == 4
    assert int(images.max()) > int(images.min())  # decoded pictures, not a blank
    assert "JPEGs" in study.report() and "1 workers (" in study.verdict()
    with pytest.raises(ValueError, match="workers"):
        ch05.photo_study((1, 2), per_class=1, size=32, batch_size=4)


def test_matching_lines_sets_each_steps_line_side_by_side_and_shows_a_missing_one():
    def ours(queue):
        item = queue.get()  # wait
        return item

    def theirs(queue):
        got = queue.get(timeout=1)
        return got

    text = ch05.matching_lines(ours, theirs, {"wait": ("queue.get(", "queue.get("), "gone": ("nowhere", "return")})
    assert text.splitlines() == ["wait  minidl: item = queue.get()", "      torch:  got = queue.get(timeout=1)",
                                 "gone  minidl: (none)", "      torch:  return got"]


def test_core_share_finding_says_what_workers_did_at_each_thread_count():
    share = ch05.CoreShare(cores=2, batches=4, load_s=0.01, step_s={1: 0.02, 2: 0.012},
                           seconds={(0, 1): 1.0, (2, 1): 0.5, (0, 2): 1.0, (2, 2): 1.3})
    finding = share.finding().splitlines()
    assert finding[0] == "fastest: 2 workers with the step on 1 thread, 500 ms"
    assert "x2.00 over none: loading ran under the step" in finding[1]
    assert "x0.77 over none: slower with workers" in finding[2]
    share.seconds[2, 2] = 1.02
    assert "no clear gain" in share.finding().splitlines()[2]
    assert "step on 2 threads:  0 workers  1000 ms  2 workers  1020 ms" in share.table()


@pytest.mark.timeout(300)
def test_core_share_study_times_every_setting_and_restores_the_thread_count(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a small photo set of its own
    before = torch.get_num_threads()
    share = ch05.core_share_study(workers=(0, 1), threads=(1, 2), per_class=1, limit=8, size=32, batch_size=4,
                                  repeats=1)
    assert torch.get_num_threads() == before
    assert set(share.seconds) == {(w, t) for w in (0, 1) for t in (1, 2)} and set(share.step_s) == {1, 2}
    assert share.batches == 2 and all(s > 0 for s in share.seconds.values())
    with pytest.raises(ValueError, match="workers"):
        ch05.core_share_study(workers=(1,), threads=(1,), per_class=1, limit=8, size=32, batch_size=4)
