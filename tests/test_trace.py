"""Tracing: an event for every step of every batch, a Chrome trace, a timeline and a diagnosis."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import time
from collections import Counter

import pytest

import minidl
from minidl.trace import FIELDS, SPANS, Trace
from minidl_course import toy

pytestmark = pytest.mark.usefixtures("no_leaks")

SETTINGS = [dict(num_workers=0), dict(num_workers=2), dict(num_workers=2, worker_method="thread")]


def traced(dataset, consumer_delay=0.0, **kwargs) -> Trace:
    loader = minidl.DataLoader(dataset, trace=True, collate_fn=list, **kwargs)
    for _ in loader:
        time.sleep(consumer_delay)
    return loader.trace


@pytest.mark.parametrize("kwargs", SETTINGS, ids=["main", "processes", "threads"])
def test_every_batch_has_each_step_once_in_order(kwargs):
    tr = traced(toy.RangeDataset(10), batch_size=3, **kwargs)
    by_batch: dict[int, dict[str, list]] = {}
    for e in tr.events:
        by_batch.setdefault(e["batch"], {}).setdefault(e["event"], []).append(e)
    assert sorted(by_batch) == [0, 1, 2, 3]
    workers = kwargs["num_workers"] > 0
    processes = workers and kwargs.get("worker_method") != "thread"  # a process worker pickles its batches
    for batch, steps in by_batch.items():
        size = 1 if batch == 3 else 3
        counts = Counter({k: len(v) for k, v in steps.items()})
        # "consumer": the consumer's time after this batch until it asks for the next (or the end)
        expected = Counter(fetch=1, getitem=size, collate=1, wait=1, consumer=1, **{"yield": 1})
        if workers:
            expected.update(send=1, put=1, receive=1)
        if processes:
            expected.update(pickle=1)
        counts.pop("reorder", None)  # only when a batch arrived early: timing-dependent
        counts.pop("reorder_block", None)
        assert counts == expected, (batch, counts)
        # one time axis across processes: each step starts no earlier than the one before it
        chain = (["send"] if workers else []) + ["fetch", "collate"] + (["pickle"] if processes else [])
        chain += ["put", "receive"] if workers else []
        chain += ["yield"]
        starts = [steps[name][0]["start"] for name in chain]
        assert starts == sorted(starts), (batch, dict(zip(chain, starts)))
        assert [g["index"] for g in steps["getitem"]] == list(range(3 * batch, 3 * batch + size))
        lanes = {e["lane"] for e in steps["fetch"] + steps["collate"] + steps["getitem"]}
        assert lanes == ({f"worker {batch % 2}"} if workers else {"main"})  # round-robin dispatch
    for e in tr.events:
        assert e["end"] >= e["start"] and (e["event"] in SPANS or e["end"] == e["start"])


@pytest.mark.parametrize("kwargs", SETTINGS, ids=["main", "processes", "threads"])
def test_a_batchs_samples_are_one_record_read_back_as_a_getitem_span_each(kwargs):
    # One record per batch keeps tracing cheap: process workers pickle the events with every batch.
    tr = traced(toy.RangeDataset(10), batch_size=4, **kwargs)
    assert [e[0] for e in tr.raw if e[0].startswith("getitem")] == ["getitems"] * 3
    fetches = {e["batch"]: e for e in tr.events if e["event"] == "fetch"}
    for batch in range(3):
        spans = [e for e in tr.events if e["event"] == "getitem" and e["batch"] == batch]
        assert [e["index"] for e in spans] == list(range(4 * batch, min(4 * batch + 4, 10)))
        assert all(a["end"] == b["start"] for a, b in zip(spans, spans[1:]))  # one clock read per sample
        assert fetches[batch]["start"] <= spans[0]["start"] <= spans[-1]["end"] <= fetches[batch]["end"]
        assert {e["lane"] for e in spans} == {fetches[batch]["lane"]}
        assert set(spans[0]) == {"event", "lane", "batch", "start", "end", "pid", "tid", "index"}


class Batched(toy.RangeDataset):
    def __getitems__(self, indices):
        return list(indices)


def test_getitems_datasets_record_the_batch_fetch_without_per_sample_events():
    tr = traced(Batched(6), batch_size=3, num_workers=1)
    names = Counter(e["event"] for e in tr.events)
    assert names["fetch"] == 2 and names["getitem"] == 0


def test_untraced_loader_records_nothing():
    loader = minidl.DataLoader(toy.RangeDataset(4), num_workers=1)
    it = iter(loader)
    assert loader.trace is None and type(it).__name__ == "_MultiProcessingDataLoaderIter"
    assert [int(b) for b in it] == [0, 1, 2, 3]


def test_chrome_trace_export_is_valid_trace_event_json(tmp_path):
    tr = traced(toy.RangeDataset(8), batch_size=2, num_workers=2)
    path = tmp_path / "trace.json"
    tr.to_chrome(str(path))
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "i"}
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"main", "consumer", "worker 0", "worker 1"} <= lanes
    for e in events:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["name"]
        if e["ph"] != "M":
            assert e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
    # every worker event is drawn on its worker's own named thread
    named = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M"}
    for e in events:
        if e["name"] == "getitem":
            assert named[(e["pid"], e["tid"])].startswith("worker")


@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
def test_diagnosis_blames_the_loader_for_a_slow_dataset(worker_method):
    tr = traced(toy.SlowDataset(12, delay=0.02), batch_size=2, num_workers=1, worker_method=worker_method)
    d = tr.diagnose()
    assert d.bottleneck == "loader" and d.wait_share > 0.5
    assert d.workers_needed > 1 and d.io_bound  # it sleeps: waiting, not computing
    assert any("num_workers" in a for a in d.advice)
    assert "bottleneck: the loader" in str(d)


def scripted_trace(consumer_step: float, load: float, batches: int = 6) -> Trace:
    """A trace written by hand, so the judgement is tested without a clock: one worker loads each batch in
    ``load`` s while the consumer trains on the previous one for ``consumer_step`` s; ``next()`` waits for
    whatever of the load the step did not cover."""
    tr, t = Trace(num_workers=1), 0.0

    def event(name, lane, batch, start, end, **extra):
        row = dict(event=name, lane=lane, batch=batch, start=start, end=end, pid=1, tid=1, **extra)
        tr.extend([tuple(row.get(f) for f in FIELDS)])

    for b in range(batches):
        wait = load if b == 0 else max(0.0, load - consumer_step)
        event("fetch", "worker 0", b, t + wait - load, t + wait, cpu=load)
        event("wait", "main", b, t, t + wait)
        event("yield", "main", b, t + wait, t + wait)
        event("consumer", "main", b, t + wait, t + wait + consumer_step)
        t += wait + consumer_step
    return tr


def test_diagnosis_blames_the_consumer_for_a_slow_training_step():
    d = scripted_trace(consumer_step=0.03, load=0.001).diagnose()
    assert d.bottleneck == "consumer" and d.wait_share < 0.25
    assert d.consumer_step == pytest.approx(0.03) and d.workers_needed == 1
    assert "bottleneck: the consumer" in str(d)
    # The same judge, the other way round (times exact in binary, so the ratio is exactly 16).
    slow = scripted_trace(consumer_step=0.125, load=2.0, batches=40).diagnose()
    assert slow.bottleneck == "loader" and slow.workers_needed == 16
    short = scripted_trace(consumer_step=0.125, load=2.0, batches=6).diagnose()
    assert short.workers_needed == 6  # an epoch of 6 batches keeps at most 6 workers busy


def test_a_recorded_slow_training_step_is_measured_as_such():
    tr = traced(toy.RangeDataset(12), consumer_delay=0.03, batch_size=2, num_workers=1)
    d = tr.diagnose()  # which side is the bottleneck depends on the machine's load; the step's length does not
    assert d.consumer_step >= 0.03
    assert d.bottleneck in ("consumer", "loader") and f"bottleneck: the {d.bottleneck}" in str(d)


def test_diagnosis_spots_reordering_behind_a_slow_sample():
    tr = traced(toy.SlowDataset(16, slow=(0,), slow_delay=0.5), batch_size=2, num_workers=2)
    d = tr.diagnose()
    assert d.reorder_lost > 0.2
    assert any(a.startswith("in_order=False") for a in d.advice)


@pytest.mark.parametrize("first_load, why", [(0.02, "the workers finished out of turn"),
                                              (0.2, "a slow sample held it back")])
def test_the_reorder_advice_names_a_slow_batch_only_when_there_is_one(first_load, why):
    # Written by hand: batch 0 (worker 0) arrives after batch 1 (worker 1), and the consumer waits for it
    # meanwhile. Equal loads: the workers only finished out of turn; a batch 0 ten times slower held it back.
    tr = Trace(num_workers=2)

    def event(name, lane, batch, start, end, **extra):
        row = dict(event=name, lane=lane, batch=batch, start=start, end=end, pid=1, tid=1, **extra)
        tr.extend([tuple(row.get(f) for f in FIELDS)])

    loads = [first_load, 0.02, 0.02, 0.02]
    arrive = {0: first_load, 1: first_load / 2, 2: first_load + 0.02, 3: first_load + 0.02}
    t = 0.0
    for b, load in enumerate(loads):
        event("fetch", f"worker {b % 2}", b, arrive[b] - load, arrive[b], cpu=load)
        event("put", f"worker {b % 2}", b, arrive[b], arrive[b])
        event("receive", "main", b, arrive[b], arrive[b], waited_since=t)
        event("wait", "main", b, t, max(t, arrive[b]))
        t = max(t, arrive[b])
        event("yield", "main", b, t, t)
        event("consumer", "main", b, t, t + 0.001)
        t += 0.001
    d = tr.diagnose()
    assert d.reorder_lost == pytest.approx(first_load / 2)
    [advice] = [a for a in d.advice if a.startswith("in_order=False")]
    assert why in advice


def test_empty_trace_cannot_be_diagnosed():
    with pytest.raises(ValueError, match="empty"):
        Trace().diagnose()


def test_timeline_plot_has_a_lane_per_worker():
    import matplotlib

    matplotlib.use("Agg")
    tr = traced(toy.RangeDataset(8), batch_size=2, num_workers=2)
    ax = tr.plot(caption="2 cores")
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert set(lanes) == {"worker 0", "worker 1", "main", "consumer"}
    assert "time" in ax.get_xlabel() and "cores" in ax.get_title()


def test_every_timeline_bar_is_labelled_with_its_own_batch():
    import matplotlib

    matplotlib.use("Agg")
    from minidl.trace_analysis import plot_timeline

    rows = [  # two workers start their batches at the same instant; the consumer then waits for batch 1
        {"event": "fetch", "lane": "worker 0", "start": 1.0, "end": 1.01, "batch": 0},
        {"event": "fetch", "lane": "worker 1", "start": 1.0, "end": 1.02, "batch": 1},
        {"event": "wait", "lane": "consumer", "start": 1.005, "end": 1.02, "batch": 1},
    ]
    ax = plot_timeline(rows)
    lanes = {round(tick): label.get_text() for tick, label in zip(ax.get_yticks(), ax.get_yticklabels())}
    labels = sorted((lanes[round(t.get_position()[1])], t.get_text()) for t in ax.texts)
    assert labels == [("consumer", "1"), ("worker 0", "0"), ("worker 1", "1")]


class StampedBatch:
    """A collate_fn whose batch notes, when pickled, where and when its pickling ran (made to take 20 ms, as
    moving a batch's tensors into shared memory can). Unpickled, it is that note."""

    def __init__(self, samples) -> None:
        self.samples = samples

    def __reduce__(self):
        start = time.perf_counter()
        time.sleep(0.02)
        return pickled_note, (self.samples, os.getpid(), start, time.perf_counter())


def pickled_note(samples, pid, start, end) -> dict:
    return {"samples": samples, "pid": pid, "start": start, "end": end}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_batchs_pickling_lies_outside_every_samples_span(method):
    # multiprocessing.Queue.put leaves the pickling to a feeder thread, which would run it while the worker's
    # main thread fetches the next batch: the next sample's span would hold it (with the file_system sharing
    # strategy, the first batch's pickling waits for torch_shm_manager to start, holding the GIL). A traced
    # worker pickles its batch itself: a "pickle" span of its own, between the collate and the put.
    loader = minidl.DataLoader(toy.SlowDataset(16, delay=0.005), batch_size=2, num_workers=2, trace=True,
                               collate_fn=StampedBatch, multiprocessing_context=method)
    notes = list(loader)
    events = loader.trace.events
    samples = [e for e in events if e["event"] == "getitem"]
    pickles = {e["batch"]: e for e in events if e["event"] == "pickle"}
    assert [note["samples"] for note in notes] == [[2 * b, 2 * b + 1] for b in range(8)]
    for batch, note in enumerate(notes):
        inside = [e["index"] for e in samples if e["pid"] == note["pid"] and e["start"] < note["end"]
                  and note["start"] < e["end"]]
        assert inside == [], f"batch {batch} was pickled during the spans of samples {inside}"
        assert pickles[batch]["start"] <= note["start"] <= note["end"] <= pickles[batch]["end"]
        assert pickles[batch]["pid"] == note["pid"]


def wait_for_each_other(barrier, worker_id: int) -> None:
    barrier.wait(timeout=60)


@pytest.mark.measures
@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_diagnosis_leaves_out_the_workers_start_and_reads_the_same_under_spawn(method):
    # A spawned worker imports its modules anew (a second or more with torch) before its first fetch: the first
    # next() waits for that. Counted as waiting, it would drown the reordering cost (the in_order advice needs it
    # to be a fifth of the waiting) under spawn only. The workers start fetching together (a barrier in
    # worker_init_fn): on a busy machine one spawned worker can be up a second after the other, and batch 1 would
    # then not be ready while the slow batch 0 is waited for.
    barrier = multiprocessing.get_context(method).Barrier(2)
    loader = minidl.DataLoader(toy.SlowDataset(16, slow=(0,), slow_delay=0.5), batch_size=2, num_workers=2,
                               trace=True, collate_fn=list, multiprocessing_context=method,
                               worker_init_fn=functools.partial(wait_for_each_other, barrier))
    for _ in loader:
        pass
    d = loader.trace.diagnose()
    events = loader.trace.events
    first_wait = min((e for e in events if e["event"] == "wait"), key=lambda e: e["start"])
    first_fetch = min(e["start"] for e in events if e["event"] == "fetch")
    assert d.startup == pytest.approx(max(0.0, first_fetch - first_wait["start"]))  # a fork can beat next()
    if d.startup >= 0.1:
        assert f"not counting {d.startup:.2f} s for the workers to start" in str(d)
    assert d.reorder_lost > 0.2 and any(a.startswith("in_order=False") for a in d.advice), str(d)



def unpicklable_batch(samples):
    import threading

    return threading.Lock()


def test_a_batch_that_cannot_be_pickled_raises_in_the_main_process():
    # A traced process worker pickles its batch itself: a failure is sent back as the worker's error, as a failing
    # sample's is, and raised by next() with the worker named (the worker does not die on it).
    loader = minidl.DataLoader(toy.RangeDataset(4), batch_size=2, num_workers=1, trace=True,
                               collate_fn=unpicklable_batch)
    with pytest.raises(TypeError, match=r"(?s)in DataLoader worker process 0, pickling batch 0.*pickle"):
        next(iter(loader))


def test_a_pickling_error_names_the_worker_it_was_given_whatever_its_lane_is_called():
    import queue

    from minidl.trace import Recorder, _TracedResultQueue

    results = queue.Queue()
    traced = _TracedResultQueue(results, Recorder("a lane named otherwise"), worker_id=12, pickles=True)
    traced.put((0, unpicklable_batch([])))
    _, wrapper = results.get_nowait()
    with pytest.raises(TypeError, match=r"^Caught TypeError in DataLoader worker process 12, pickling batch 0 "):
        wrapper.reraise()

@pytest.mark.measures
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_time_between_two_epochs_is_no_consumer_span(num_workers):
    # The consumer's span measures the training step between two batches of one epoch. A pause between epochs
    # (evaluation, a checkpoint) is not one: the next epoch's first batch starts without a consumer span.
    loader = minidl.DataLoader(toy.RangeDataset(8), batch_size=2, num_workers=num_workers, trace=True,
                               persistent_workers=num_workers > 0)
    for epoch in range(2):
        for _ in loader:
            pass
        if epoch == 0:
            time.sleep(0.3)
    if num_workers:
        loader._iterator._shutdown_workers()
    consumer = [e for e in loader.trace.events if e["event"] == "consumer"]
    assert len(consumer) == 2 * 4  # after each of the 4 batches of each epoch, until the next call to next()
    assert max(e["end"] - e["start"] for e in consumer) < 0.3
