"""Tracing: ``DataLoader(..., trace=True)`` records an event for every step of every batch's life.

The steps are: the indices sent to a worker, each ``__getitem__``, the collate, the pickling (process workers
only), the put on the result queue, the receipt in the main process, the time held in the reorder buffer,
pinning, the hand-over to the consumer, and the consumer's own time between batches. ``Trace`` turns the
events into rows, a timeline (Gantt) plot, a Chrome trace (open it in Perfetto or chrome://tracing) and a
diagnosis of where the time went. PyTorch has no counterpart. The names follow the loader's own.

Every event is stamped with ``time.perf_counter()``. On Linux and macOS that clock is the same in every
process, so events from the workers and from the main process share one time axis.

Tracing changes one thing in how batches move: a traced process worker pickles each batch itself, before its put
(see ``_Pickled``), where an untraced one leaves that to the queue's feeder thread, which overlaps it with the next
fetch. So with process workers a traced epoch can take longer by that pickling, and each batch's bytes are copied
once more. Time a loader untraced; trace it to see where the time goes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pickle
import sys
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler

from minidl._utils import ExceptionWrapper, now
from minidl.fetch import _DatasetKind, _IterableDatasetFetcher, _MapDatasetFetcher
from minidl.worker import _IterableDatasetStopIteration, ship, unship

# The steps of a batch's life, in the order they happen. Spans have a duration. The others are
# instants, with start == end.
# "reorder_block" is a span of the consumer's wait during which a later batch was already ready.
SPANS = ("getitem", "fetch", "collate", "pickle", "reorder", "reorder_block", "pin", "wait", "consumer")
STEPS = ("send", "fetch", "getitem", "collate", "pickle", "put", "receive", "reorder", "reorder_block", "pin",
         "wait", "yield", "consumer")


# An event is recorded as a flat tuple of numbers and strings, in the order of FIELDS.
# A tuple is cheap to build and to pickle.
# Unlike a dict, it is not tracked by the garbage collector, so thousands of them don't slow every collection.
# Trace.rows() turns them into dicts for reading.
# A batch's samples are one record, "getitems". Its ``index`` holds the batch's indices.
# Its ``stamps`` hold the clock read before the first sample and after each one.
# Trace.events expands the record into one "getitem" span per sample.
# One record per batch keeps tracing cheap with process workers, which pickle the events with every batch.
# The record's two lists are the only objects in it that the collector tracks.
FIELDS = ("event", "lane", "batch", "start", "end", "pid", "tid", "index", "cpu", "worker", "waited_since",
          "stamps")


class Recorder:
    """Collects events in one place (a worker, the pin thread, the main process) for one lane."""

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self.batch = None  # the batch being fetched: set by _TracedTaskQueue in a worker, by the iterator in main
        self.fetched = None  # when the fetcher last handed back a batch: a pin span starts there
        self.events: list[tuple] = []
        self._where = None  # (pid, thread id), read once, by the thread that records

    def add(self, event: str, batch: int, start: float, end: float | None = None, index=None, cpu=None,
            worker=None, waited_since=None) -> None:
        pid, tid = self._where or self._find_where()
        self.events.append((event, self.lane, batch, start, start if end is None else end, pid, tid, index, cpu,
                            worker, waited_since, None))

    def add_getitems(self, batch: int, indices: list, stamps: list[float]) -> None:
        """A batch's samples as one "getitems" record: ``indices[i]`` ran from ``stamps[i]`` to ``stamps[i + 1]``."""
        pid, tid = self._where or self._find_where()
        self.events.append(("getitems", self.lane, batch, stamps[0], stamps[-1], pid, tid, indices, None, None, None,
                            stamps))

    def _find_where(self) -> tuple[int, int]:
        self._where = (os.getpid(), threading.get_native_id())
        return self._where

    def instant(self, event: str, batch: int, **args) -> None:
        self.add(event, batch, now(), **args)

    def span(self, event: str, batch: int, **args) -> _Span:
        """``with recorder.span(...)``: record the enclosed block; ``cpu`` is the CPU time this thread spent in it."""
        return _Span(self, event, batch, args)

    def take(self) -> list[tuple]:
        """Hand over what was recorded so far (to ship it with a batch) and start afresh."""
        events, self.events = self.events, []
        return events


class _Span:
    """The context manager ``Recorder.span`` returns.

    It is a class rather than a ``@contextmanager`` generator because a class costs less per batch.
    """

    __slots__ = ("recorder", "event", "batch", "args", "start", "cpu")

    def __init__(self, recorder: Recorder, event: str, batch: int, args: dict) -> None:
        self.recorder, self.event, self.batch, self.args = recorder, event, batch, args

    def __enter__(self) -> None:
        self.start, self.cpu = now(), time.thread_time()

    def __exit__(self, *exc_info) -> None:  # on an exception too: the span ends where it was cut short
        self.recorder.add(self.event, self.batch, self.start, now(), cpu=time.thread_time() - self.cpu, **self.args)


class _StampedDataset:
    """A map dataset as a traced fetcher sees it: each ``__getitem__`` notes its index and the clock after it."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset
        self.indices: list = []
        self.stamps: list[float] = []  # the clock before the first sample, then after each one

    def __getitem__(self, idx):
        item = self.dataset[idx]
        self.indices.append(idx)
        self.stamps.append(now())
        return item

    def __getattr__(self, name):  # __getitems__ and the rest: the dataset's own
        return getattr(self.dataset, name)


class _TracedMapDatasetFetcher(_MapDatasetFetcher):
    """``_MapDatasetFetcher`` with each ``__getitem__``, the fetch and the collate recorded.

    Its ``fetch`` is the base one, run on the dataset seen through ``_StampedDataset``. The collate it calls
    first closes the "fetch" span, then records its own.
    """

    def __init__(self, dataset, auto_collation, collate_fn, drop_last, recorder: Recorder) -> None:
        super().__init__(_StampedDataset(dataset), auto_collation, self._collate, drop_last)
        self.user_collate_fn, self.recorder = collate_fn, recorder
        self._fetch_span = None  # open while the batch's samples are fetched

    def fetch(self, possibly_batched_index):
        samples, rec = self.dataset, self.recorder
        if self.auto_collation:  # a batch gets a "fetch" span; a single sample, only converted, gets none
            self._fetch_span = rec.span("fetch", rec.batch)
            self._fetch_span.__enter__()
        samples.indices, samples.stamps = [], [now()]
        try:
            data = super().fetch(possibly_batched_index)
        finally:
            self._end_fetch()  # a sample raised: the span ends where it was cut short
        rec.fetched = now()
        return data

    def _end_fetch(self) -> None:
        if self._fetch_span is not None:
            self._fetch_span.__exit__()
            self._fetch_span = None

    def _collate(self, data):
        if self._fetch_span is None:
            return self.user_collate_fn(data)
        rec, samples = self.recorder, self.dataset
        if not getattr(samples, "__getitems__", None):  # a batch fetched at once has no per-sample times
            rec.add_getitems(rec.batch, samples.indices, samples.stamps)
        self._end_fetch()
        with rec.span("collate", rec.batch):
            return self.user_collate_fn(data)


class _TracedIterableDatasetFetcher(_IterableDatasetFetcher):
    """``_IterableDatasetFetcher.fetch`` recorded as one "fetch" span (pulling and collating)."""

    def __init__(self, dataset, auto_collation, collate_fn, drop_last, recorder: Recorder) -> None:
        super().__init__(dataset, auto_collation, collate_fn, drop_last)
        self.recorder = recorder

    def fetch(self, possibly_batched_index):
        with self.recorder.span("fetch", self.recorder.batch):
            data = super().fetch(possibly_batched_index)
        self.recorder.fetched = now()
        return data


def traced_fetcher(kind, dataset, auto_collation, collate_fn, drop_last, recorder: Recorder):
    """The fetcher a traced iterator (or a traced worker) uses: the same fetcher, each step recorded."""
    cls = _TracedMapDatasetFetcher if kind == _DatasetKind.Map else _TracedIterableDatasetFetcher
    return cls(dataset, auto_collation, collate_fn, drop_last, recorder)


class _TracedTaskQueue:
    """A worker's index queue that tells the recorder which task the worker takes next."""

    def __init__(self, queue, recorder: Recorder) -> None:
        self.queue, self.recorder = queue, recorder

    def get(self, timeout=None):
        r = self.queue.get(timeout=timeout)
        if isinstance(r, tuple):  # a task (idx, indices); the rest are control messages
            self.recorder.batch = r[0]
        return r


class _Pickled:
    """A batch already pickled in the worker's own thread. Unpickling it gives back the batch itself.

    ``multiprocessing.Queue.put`` only appends the batch to a buffer. The queue's feeder thread pickles it
    later, while the worker's main thread is already fetching the next sample. Pickling moves the batch's
    tensors into shared memory, which takes time and holds the GIL. So that time would land inside the next
    sample's span. A traced worker therefore pickles the batch itself, between its collate and its put, and
    records that time as a "pickle" span.
    """

    __slots__ = ("payload",)

    def __init__(self, obj) -> None:
        self.payload = bytes(ForkingPickler.dumps(obj))

    def __reduce__(self):
        return pickle.loads, (self.payload,)  # the main process gets the batch, not this wrapper


def _start_sharing() -> None:
    """Share one small tensor, so that tensor sharing is set up before the worker's first task.

    With torch's ``file_system`` strategy (the only one on a Mac), the first tensor a process shares starts
    ``torch_shm_manager`` and waits for it. Without this call, the worker's first batch would pay that wait
    in its collate (a worker collates into shared memory) or in its pickling. The batch would look slow
    through no fault of its samples. Paid here, the wait counts as the worker's start, which ``diagnose``
    leaves out.
    """
    torch = sys.modules.get("torch")  # a worker that never imported torch shares no tensor
    if torch is not None:
        torch.empty(1).share_memory_()


class _TracedResultQueue:
    """A worker's result queue that records each put and ships the task's events with its batch.

    In a process worker it also pickles the batch itself, before the put (see ``_Pickled``).
    Then a sample's span holds only that sample's work, whatever the queue's feeder thread does.
    """

    def __init__(self, queue, recorder: Recorder, worker_id: int, pickles: bool = False) -> None:
        self.queue, self.recorder, self.worker_id, self.pickles = queue, recorder, worker_id, pickles

    def put(self, r) -> None:
        idx = r[0][0] if isinstance(r[0], tuple) else r[0]  # a tuple: another layer already shipped something
        if isinstance(idx, int):  # a batch; an epoch's ack travels as it is
            if self.pickles:
                with self.recorder.span("pickle", idx):
                    try:
                        r = (r[0], _Pickled(r[1]))
                    except Exception:  # the main process raises it, as it raises a failing sample's error
                        r = (r[0], ExceptionWrapper(where=f"in DataLoader worker process {self.worker_id}, "
                                                          f"pickling batch {idx} for the main process"))
            self.recorder.instant("put", idx)
            r = ship(r, "trace", self.recorder.take())
        self.queue.put(r)

    def __getattr__(self, name):  # cancel_join_thread, close: the queue's own
        return getattr(self.queue, name)


class _TracedWorker:
    """The worker side of tracing, handed to each worker in ``_WorkerOptions.layers``.

    Called in the worker, it makes a recorder, a traced fetcher, and traced queues.
    The queues note each task and ship its events with the batch (``worker.ship``).
    The traced iterator's ``_get_data`` takes them off again.
    """

    def __init__(self, pickles: bool = False) -> None:
        self.pickles = pickles  # a process worker pickles its batches itself (see _Pickled); a thread doesn't

    def __call__(self, worker_id: int, index_queue, data_queue, create_fetcher):
        recorder = Recorder(f"worker {worker_id}")

        def create_traced_fetcher(kind, dataset, auto_collation, collate_fn, drop_last):
            if self.pickles and not recorder.events and recorder.batch is None:  # after worker_init_fn, before a task
                _start_sharing()
            return traced_fetcher(kind, dataset, auto_collation, collate_fn, drop_last, recorder)

        result_queue = _TracedResultQueue(data_queue, recorder, worker_id, self.pickles)
        return _TracedTaskQueue(index_queue, recorder), result_queue, create_traced_fetcher


class _TracedPinInQueue:
    """The pin thread's input: notes when a traced batch comes in (its events ride on with it, see ``worker.ship``)."""

    def __init__(self, queue, recorder: Recorder) -> None:
        self.queue, self.recorder = queue, recorder

    def get(self, timeout=None):
        r = self.queue.get(timeout=timeout)
        idx = r[0]
        # A batch's events ride in its idx slot (worker.ship), which the pin loop passes on untouched.
        self.recorder.batch = (idx[0], now(), idx[1]) if isinstance(idx, tuple) and "trace" in idx[1] else None
        return r


class _TracedPinOutQueue:
    """The pin thread's output: puts the batch's events back, with its "pin" span added."""

    def __init__(self, queue, recorder: Recorder) -> None:
        self.queue, self.recorder = queue, recorder

    def put(self, r, timeout=None) -> None:
        if self.recorder.batch is not None:  # the out queue is unbounded: each put succeeds at once
            batch, start, extras = self.recorder.batch
            self.recorder.batch = None
            self.recorder.add("pin", batch, start, now())
            extras["trace"].extend(self.recorder.take())
        self.queue.put(r, timeout=timeout)


class _TracedIterMixin:
    """Records, around each ``next()``: the consumer's time since the last batch, the wait, the hand-over."""

    def __init__(self, loader) -> None:
        self._start_tracing(loader)  # before the iterator starts: it may send tasks right away
        super().__init__(loader)

    def _start_tracing(self, loader) -> None:
        self._trace = loader.trace
        self._recorder = Recorder("main")
        self._consumer_recorder = Recorder("consumer")
        self._trace_batch = None  # the batch being handed back
        self._last_yield = None  # when the consumer last got a batch

    @contextlib.contextmanager
    def _hand_overs_unrecorded(self):
        """Record no hand-over while the block runs (resume's replay drops those batches: the consumer never has
        them); the steps inside are recorded as ever."""
        self._recording_hand_overs = False
        try:
            yield
        finally:
            self._recording_hand_overs, self._last_yield = True, None

    _recording_hand_overs = True

    def __next__(self):
        if not self._recording_hand_overs:
            try:
                return super().__next__()
            finally:
                self._trace.extend(self._recorder.take())
        start = now()
        if self._last_yield is not None:
            self._consumer_recorder.add("consumer", self._trace_batch, self._last_yield, start)
            self._trace.extend(self._consumer_recorder.take())
        try:
            data = super().__next__()
        finally:
            self._trace.extend(self._recorder.take())  # what happened inside, even on StopIteration
        self._last_yield = end = now()
        self._recorder.add("wait", self._trace_batch, start, end)
        self._recorder.add("yield", self._trace_batch, end)
        self._trace.extend(self._recorder.take())
        return data


class _TracedSingleIter(_TracedIterMixin):
    """``num_workers=0``, traced: the main process records its own fetch, collate and pin."""

    def _layer_create_fetcher(self, create_fetcher):
        """The traced fetcher, which records its own fetch and collate, instead of the base one."""
        recorder = self._recorder
        return lambda kind, dataset, auto_collation, collate_fn, drop_last: traced_fetcher(
            kind, dataset, auto_collation, collate_fn, drop_last, recorder)

    def _next_data(self):
        self._trace_batch = self._recorder.batch = batch = self._num_yielded  # the batch the fetcher records
        data = super()._next_data()  # may raise StopIteration
        if self._pin_memory:  # the base pinned the batch after the fetcher handed it back
            self._recorder.add("pin", batch, self._recorder.fetched, now())
        return data


class _TracedMultiIter(_TracedIterMixin):
    """``num_workers > 0``, traced: the main process records each send and receive.

    The workers record their own steps and ship them with each batch.
    """

    def _layer_workers(self, worker_id: int) -> tuple:
        return (*super()._layer_workers(worker_id), _TracedWorker(pickles=self._worker_method != "thread"))

    def _traced_pin_queues(self, in_queue, out_queue) -> tuple:
        recorder = Recorder("pin")  # a "pin" span: from taking a batch off in_queue to putting it on out_queue
        return _TracedPinInQueue(in_queue, recorder), _TracedPinOutQueue(out_queue, recorder)

    def _try_put_index(self) -> None:
        sent, start = self._send_idx, now()
        super()._try_put_index()
        if self._send_idx > sent:
            self._recorder.add("send", sent, start, worker=self._task_info[sent][0])

    def _reset(self, loader, first_iter: bool = False) -> None:
        self._received = [deque() for _ in range(self._num_workers)]  # per worker: batches received, not handed out
        self._last_yield = None  # a persistent iterator's new epoch: the pause since the last one is not a step
        super()._reset(loader, first_iter)
        for received in self._received:  # a persistent worker's stale results of the last epoch were dropped
            received.clear()

    def _get_data(self):
        waited_since = now()
        r, idx, events = unship(super()._get_data(), "trace")
        data = r[1]
        if events:
            self._trace.extend(events)
        if isinstance(idx, int):
            self._recorder.instant("receive", idx, waited_since=waited_since)
            if idx in self._task_info and not isinstance(data, _IterableDatasetStopIteration):
                self._received[self._task_info[idx][0]].append(idx)
        return r

    def _process_data(self, data, worker_id: int):
        self._trace_batch = self._received[worker_id].popleft()  # a worker's batches go out in the order it sent them
        return super()._process_data(data, worker_id)


@functools.cache
def traced_iterators(single: type, multi: type) -> tuple[type, type]:
    """The loader's two iterator classes with tracing on top.

    ``DataLoader._get_iterator`` hands the classes in, so this module never imports dataloader.py.
    """
    return tuple(type(f"_Traced{base.__name__.lstrip('_')}", (layer, base), {"__doc__": layer.__doc__})
                 for layer, base in ((_TracedSingleIter, single), (_TracedMultiIter, multi)))


def _reorder_events(events: list[dict]) -> list[dict]:
    """The reorder spans, worked out from each batch's receive and the consumer's wait for it (in order only).

    "reorder": a batch arrived while an earlier one was still to be handed out. It sat in the reorder
    buffer from its receive to its hand-over.
    "reorder_block": the consumer waited for a batch while a later one had already arrived.
    """
    received: dict[int, float] = {}
    epochs: list[list[tuple[int, float, dict]]] = [[]]  # (batch, receive, wait) in hand-over order
    for e in events:
        if e["event"] == "receive":
            received[e["batch"]] = e["start"]
        elif e["event"] == "wait" and e["batch"] in received:
            if epochs[-1] and e["batch"] < epochs[-1][-1][0]:
                epochs.append([])  # task numbers start again: a new epoch
            epochs[-1].append((e["batch"], received.pop(e["batch"]), e))
    out = []

    def span(name: str, batch: int, start: float, wait: dict) -> dict:
        return {"event": name, "lane": "main", "batch": batch, "start": start, "end": wait["end"],
                "pid": wait["pid"], "tid": wait["tid"]}

    for epoch in epochs:
        latest_earlier_yield = -math.inf
        for batch, receive, wait in epoch:
            if latest_earlier_yield > receive:
                out.append(span("reorder", batch, receive, wait))
            latest_earlier_yield = max(latest_earlier_yield, wait["end"])
        earliest_later_receive = math.inf
        for batch, receive, wait in reversed(epoch):
            start = max(wait["start"], earliest_later_receive)
            if start < receive:
                out.append(span("reorder_block", batch, start, wait))
            earliest_later_receive = min(earliest_later_receive, receive)
    return out


@dataclass
class Trace:
    """Every event a traced DataLoader recorded, across its epochs (``clear()`` to start over)."""

    raw: list[tuple] = field(default_factory=list)  # as recorded; see FIELDS
    num_workers: int = 0
    worker_method: str = "multiprocessing"
    in_order: bool = True

    def extend(self, events: list[tuple]) -> None:
        self.raw.extend(events)

    def clear(self) -> None:
        self.raw.clear()

    @property
    def events(self) -> list[dict]:
        """Every event as a dict (fields that don't apply to it left out), in recording order.

        The reorder spans come last: they are derived from the others (``_reorder_events``).
        """
        events = []
        for e in self.raw:
            if e[0] == "getitems":  # a batch's samples in one record: a "getitem" span each
                _, lane, batch, _, _, pid, tid, indices, *_, stamps = e
                events += [{"event": "getitem", "lane": lane, "batch": batch, "start": start, "end": end, "pid": pid,
                            "tid": tid, "index": index} for index, start, end in zip(indices, stamps, stamps[1:])]
            else:
                events.append({k: v for k, v in zip(FIELDS, e) if v is not None})
        return events + (_reorder_events(events) if self.in_order and self.num_workers > 0 else [])

    def rows(self) -> list[dict]:
        """The events as a list of dicts, sorted by start time."""
        return sorted(self.events, key=lambda e: (e["start"], STEPS.index(e["event"])))

    def per_batch(self) -> dict[int, list[str]]:
        """For each batch, the names of its events in time order (per-sample getitems included)."""
        steps = defaultdict(list)
        for e in self.rows():
            steps[e["batch"]].append(e["event"])
        return dict(steps)

    def to_chrome(self, path: str | None = None) -> dict:
        """The Chrome trace-event JSON object (and write it to ``path`` if given)."""
        rows = self.rows()
        t0 = min((e["start"] for e in rows), default=0.0)
        lanes = sorted({(e["pid"], e["tid"], e["lane"]) for e in rows})
        out = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": lane}}
               for pid, tid, lane in lanes]
        for e in rows:
            args = {k: v for k, v in e.items() if k not in ("event", "lane", "start", "end", "pid", "tid")}
            record = {"name": e["event"], "cat": "minidl", "pid": e["pid"], "tid": e["tid"],
                      "ts": (e["start"] - t0) * 1e6, "args": args}
            if e["event"] in SPANS:
                record.update(ph="X", dur=(e["end"] - e["start"]) * 1e6)
            else:
                record.update(ph="i", s="t")
            out.append(record)
        trace = {"traceEvents": out, "displayTimeUnit": "ms"}
        if path is not None:
            with open(path, "w") as f:
                json.dump(trace, f)
        return trace

    def plot(self, ax=None, title: str = "DataLoader timeline", caption: str | None = None):
        """A Gantt chart: one lane per worker, plus the pin thread, the main process and the consumer.

        ``caption`` goes under the title: name the machine there (``minidl_bench.describe()``).
        """
        from minidl.trace_analysis import plot_timeline

        return plot_timeline(self.rows(), ax=ax, title=title, caption=caption)

    def diagnose(self):
        """Where the time went, and the one change most likely to help: a ``minidl.trace_analysis.Diagnosis``."""
        from minidl.trace_analysis import diagnose

        return diagnose(self)
