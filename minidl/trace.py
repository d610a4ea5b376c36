"""See inside the loader: an event for every step of a batch's life, and what they add up to.

``DataLoader(..., trace=True)`` records, per batch: the indices sent to a worker, each
``__getitem__``, the collate, the pickling (in a process worker), the put on the result queue, the
receipt in the main process, time held in the reorder buffer, pinning, the hand-over to the
consumer, and the consumer's own time between batches. This module turns those events into rows,
a timeline (Gantt) plot, a Chrome trace (open it in Perfetto or chrome://tracing) and a diagnosis
of where the time goes.
PyTorch has no counterpart; the names follow the loader's own (``_send_idx``, the reorder buffer).

Clocks: ``time.perf_counter()`` is the system-wide monotonic clock on Linux and macOS, so events
recorded in worker processes and in the main process share one time axis.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import statistics
import sys
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler

from minidl._utils import ExceptionWrapper, now, process_cpu_count
from minidl.dataloader import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter
from minidl.fetch import _DatasetKind, _IterableDatasetFetcher, _MapDatasetFetcher
from minidl.worker import _IterableDatasetStopIteration, ship, unship

# The steps of a batch's life, in the order they happen. Spans have a duration; the others are
# instants (start == end).
# "reorder_block" is a span of the consumer's wait during which a later batch was already ready.
SPANS = ("getitem", "fetch", "collate", "pickle", "reorder", "reorder_block", "pin", "wait", "consumer")
STEPS = ("send", "fetch", "getitem", "collate", "pickle", "put", "receive", "reorder", "reorder_block", "pin",
         "wait", "yield", "consumer")


# An event is recorded as a flat tuple of numbers and strings, in the order of FIELDS: cheap to
# build and to pickle, and, unlike a dict, not tracked by the garbage collector, so thousands of
# them don't make every collection slower. Trace.rows() turns them into dicts for reading.
# A batch's samples are one record, "getitems": ``index`` holds the batch's indices and ``stamps`` the
# clock read before the first sample and after each one; Trace.events expands it into a "getitem" span
# per sample. One record instead of one per sample is what keeps tracing cheap with process workers,
# which pickle the events with every batch (its two lists are the only objects the collector tracks).
FIELDS = ("event", "lane", "batch", "start", "end", "pid", "tid", "index", "cpu", "worker", "waited_since",
          "stamps")


class Recorder:
    """Collects events in one place (a worker, the pin thread, the main process) for one lane."""

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self.batch = None  # in a worker: the task being worked on (set by _TracedTaskQueue)
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
    """The context manager ``Recorder.span`` returns (a class, not ``@contextmanager``: a few µs less per batch)."""

    __slots__ = ("recorder", "event", "batch", "args", "start", "cpu")

    def __init__(self, recorder: Recorder, event: str, batch: int, args: dict) -> None:
        self.recorder, self.event, self.batch, self.args = recorder, event, batch, args

    def __enter__(self) -> None:
        self.start, self.cpu = now(), time.thread_time()

    def __exit__(self, *exc_info) -> None:  # on an exception too: the span ends where it was cut short
        self.recorder.add(self.event, self.batch, self.start, now(), cpu=time.thread_time() - self.cpu, **self.args)


class _TracedMapDatasetFetcher(_MapDatasetFetcher):
    """``_MapDatasetFetcher.fetch`` with each ``__getitem__``, the fetch and the collate recorded."""

    def __init__(self, dataset, auto_collation, collate_fn, drop_last, recorder: Recorder) -> None:
        super().__init__(dataset, auto_collation, collate_fn, drop_last)
        self.recorder = recorder

    def fetch(self, possibly_batched_index, batch: int | None = None):
        if not self.auto_collation:
            return super().fetch(possibly_batched_index)
        rec = self.recorder
        batch = rec.batch if batch is None else batch
        with rec.span("fetch", batch):
            if getattr(self.dataset, "__getitems__", None):
                data = self.dataset.__getitems__(possibly_batched_index)
            else:
                data, indices, stamps = [], [], [now()]
                for idx in possibly_batched_index:  # one clock read per sample: each starts where the last ended
                    data.append(self.dataset[idx])
                    indices.append(idx)
                    stamps.append(now())
                rec.add_getitems(batch, indices, stamps)
        with rec.span("collate", batch):
            return self.collate_fn(data)


class _TracedIterableDatasetFetcher(_IterableDatasetFetcher):
    """``_IterableDatasetFetcher.fetch`` recorded as one "fetch" span (pulling and collating)."""

    def __init__(self, dataset, auto_collation, collate_fn, drop_last, recorder: Recorder) -> None:
        super().__init__(dataset, auto_collation, collate_fn, drop_last)
        self.recorder = recorder

    def fetch(self, possibly_batched_index, batch: int | None = None):
        with self.recorder.span("fetch", self.recorder.batch if batch is None else batch):
            return super().fetch(possibly_batched_index)


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
    """A batch pickled already, in the worker's own thread; unpickling it gives back the batch itself.

    ``multiprocessing.Queue.put`` only appends to a buffer: its feeder thread pickles the batch later, while
    the worker's main thread runs the next sample. That pickling moves the batch's tensors into shared memory
    (with the ``file_system`` strategy, the first share starts ``torch_shm_manager`` and waits for it holding
    the GIL), so the next sample's traced span would hold this batch's work. A traced worker pickles here
    instead, between its collate and its put, and records the time as a "pickle" span.
    """

    __slots__ = ("payload",)

    def __init__(self, obj) -> None:
        self.payload = bytes(ForkingPickler.dumps(obj))

    def __reduce__(self):
        return pickle.loads, (self.payload,)  # the main process gets the batch, not this wrapper


def _start_sharing() -> None:
    """Share one small tensor, so that what sharing needs in this process is started before the worker's first task.

    With torch's ``file_system`` strategy (a Mac's only one) the first tensor a process shares starts
    ``torch_shm_manager`` and waits for it: a fraction of a second, seconds on a busy machine. A worker's first
    batch would pay it inside its collate (a worker collates into shared memory) or its pickling, and look slow
    for no fault of its samples. Paid here, it is part of the worker's start, which ``diagnose`` leaves out.
    """
    torch = sys.modules.get("torch")  # a worker that never imported torch shares no tensor
    if torch is not None:
        torch.empty(1).share_memory_()


class _TracedResultQueue:
    """A worker's result queue that records each put and ships the task's events with its batch.

    In a process worker it pickles the batch itself, before the put (see ``_Pickled``): a sample's span then
    holds only that sample's work, whatever the queue's feeder thread does.
    """

    def __init__(self, queue, recorder: Recorder, pickles: bool = False) -> None:
        self.queue, self.recorder, self.pickles = queue, recorder, pickles

    def put(self, r) -> None:
        idx = r[0][0] if isinstance(r[0], tuple) else r[0]  # another layer may have shipped its own with it
        if isinstance(idx, int):  # a batch: acks travel as they are
            if self.pickles:
                with self.recorder.span("pickle", idx):
                    try:
                        r = (r[0], _Pickled(r[1]))
                    except Exception:  # raised in the main process, as a failing sample's error is
                        r = (r[0], ExceptionWrapper(where=f"in DataLoader worker process {self.recorder.lane[7:]}, "
                                                          f"pickling batch {idx} for the main process"))
            self.recorder.instant("put", idx)
            r = ship(r, "trace", self.recorder.take())
        self.queue.put(r)

    def __getattr__(self, name):  # cancel_join_thread, close: the queue's own
        return getattr(self.queue, name)


class _TracedWorker:
    """The worker side of tracing, handed to each worker in ``_WorkerOptions.layers``.

    In the worker it makes a recorder, traced queues that note each task and ship its events with
    the batch (``worker.ship``; the traced iterator's ``_get_data`` takes them off), and a traced fetcher.
    """

    def __init__(self, pickles: bool = False) -> None:
        self.pickles = pickles  # a process worker pickles its batches itself (see _Pickled); a thread doesn't

    def __call__(self, worker_id: int, index_queue, data_queue, create_fetcher):
        recorder = Recorder(f"worker {worker_id}")

        def create_traced_fetcher(kind, dataset, auto_collation, collate_fn, drop_last):
            if self.pickles and not recorder.events and recorder.batch is None:  # after worker_init_fn, before a task
                _start_sharing()
            return traced_fetcher(kind, dataset, auto_collation, collate_fn, drop_last, recorder)

        return (_TracedTaskQueue(index_queue, recorder), _TracedResultQueue(data_queue, recorder, self.pickles),
                create_traced_fetcher)


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

    def __next__(self):
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


class _TracedSingleProcessDataLoaderIter(_TracedIterMixin, _SingleProcessDataLoaderIter):
    def _create_fetcher(self):
        return traced_fetcher(self._dataset_kind, self._dataset, self._auto_collation, self._collate_fn,
                              self._drop_last, self._recorder)

    def _next_data(self):
        index = self._next_index()  # may raise StopIteration
        self._trace_batch = batch = self._num_yielded
        data = self._dataset_fetcher.fetch(index, batch)  # may raise StopIteration
        if self._pin_memory:
            from minidl.pin_memory import pin_memory

            with self._recorder.span("pin", batch):
                data = pin_memory(data, self._pin_memory_device)
        return data


class _TracedMultiProcessingDataLoaderIter(_TracedIterMixin, _MultiProcessingDataLoaderIter):
    """Records each send and receive; workers record their own steps and ship them with each batch."""

    def _worker_options(self, worker_id: int):
        options = super()._worker_options(worker_id)
        worker = _TracedWorker(pickles=options.worker_method != "thread")
        return dataclasses.replace(options, layers=(*options.layers, worker))

    def _start_pin_memory_thread(self, in_queue, out_queue):
        recorder = Recorder("pin")  # a "pin" span: from taking a batch off in_queue to putting it on out_queue
        return super()._start_pin_memory_thread(_TracedPinInQueue(in_queue, recorder),
                                                _TracedPinOutQueue(out_queue, recorder))

    def _try_put_index(self) -> None:
        sent, start = self._send_idx, now()
        super()._try_put_index()
        if self._send_idx > sent:
            self._recorder.add("send", sent, start, worker=self._task_info[sent][0])

    def _reset(self, loader, first_iter: bool = False) -> None:
        self._received = [deque() for _ in range(self._num_workers)]  # per worker: batches received, not handed out
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


def _reorder_events(events: list[dict]) -> list[dict]:
    """Reorder spans, derived from each batch's receive and the consumer's wait for it (in order only).

    "reorder": a batch that arrived while an earlier one was still to be handed out sat in the
    reorder buffer from its receive to its hand-over. "reorder_block": the consumer waited for a
    batch while a later one had already arrived.
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
        return plot_timeline(self.rows(), ax=ax, title=title, caption=caption)

    def diagnose(self) -> Diagnosis:
        """Where the time went, and the one change most likely to help."""
        return diagnose(self)


@dataclass
class Diagnosis:
    """Numbers derived from a trace, and a plain-language verdict (``print(diagnosis)``)."""

    wall: float  # s, from the first request for a batch to the last hand-over
    wait_share: float  # share of wall the consumer spent waiting inside next()
    consumer_step: float  # s, mean time the consumer spent between batches
    batch_time: float  # s, mean time to fetch and collate one batch (in a worker, or in main)
    worker_utilisation: dict[str, float]  # lane -> share of wall spent fetching and collating
    reorder_lost: float  # s the consumer waited while a later batch sat ready in the reorder buffer
    transport: float  # s, mean time from a worker's put to the main process's receive
    pin: float  # s, mean time to pin one batch
    workers_needed: int  # workers that would keep up with the measured consumer step
    io_bound: bool  # loading spent under half its time on the CPU: it mostly waits
    bottleneck: str  # "loader" or "consumer"
    advice: list[str]
    startup: float = 0.0  # s of the consumer's first wait, each epoch, before any worker began to fetch (left out)

    def __str__(self) -> str:
        ms = 1e3
        lines = [
            f"bottleneck: the {self.bottleneck}",
            f"  consumer waited {self.wait_share:.0%} of {self.wall:.2f} s"
            + (f" (not counting {_seconds(self.startup)} for the workers to start)" if self.startup >= 5e-4 else "")
            + f"; its step takes "
            f"{self.consumer_step * ms:.1f} ms, a batch takes {self.batch_time * ms:.1f} ms to load",
            "  worker utilisation: " + ", ".join(f"{k} {v:.0%}" for k, v in self.worker_utilisation.items()),
            f"  transport {self.transport * ms:.2f} ms/batch, reordering cost {self.reorder_lost * ms:.0f} ms, "
            f"pinning {self.pin * ms:.2f} ms/batch",
            f"  workers needed to keep up: about {self.workers_needed}"
            + (" (loading is I/O-bound: it mostly waits)" if self.io_bound else ""),
        ]
        return "\n".join(lines + [f"try: {a}" for a in self.advice])


def _seconds(t: float) -> str:
    return f"{t:.2f} s" if t >= 0.1 else f"{t * 1e3:.0f} ms"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def diagnose(trace: Trace, cores: int | None = None) -> Diagnosis:
    """Compute a Diagnosis from the events of ``trace``."""
    ev = trace.rows()
    if not ev:
        raise ValueError("the trace is empty: iterate over the traced DataLoader first")
    by = defaultdict(list)
    for e in ev:
        by[e["event"]].append(e)
    waits, yields = by["wait"], by["yield"]
    startup = _startup(by["send"], waits, by["fetch"])
    wall = max(e["end"] for e in yields) - min(e["start"] for e in waits) - startup if yields else 0.0
    waited = sum(e["end"] - e["start"] for e in waits) - startup
    wait_share = waited / wall if wall > 0 else 0.0
    consumer_step = _mean([e["end"] - e["start"] for e in by["consumer"]])

    busy: dict[str, float] = defaultdict(float)  # fetching plus collating, per lane
    per_batch: dict[tuple, float] = defaultdict(float)
    cpu = 0.0
    for e in by["fetch"] + by["collate"]:
        busy[e["lane"]] += e["end"] - e["start"]
        per_batch[(e["lane"], e["batch"])] += e["end"] - e["start"]
        cpu += e.get("cpu", 0.0)
    # Loading that mostly waits (storage, network, sleep) rather than computes is I/O-bound:
    # then more workers than cores still help, and threads are the cheapest workers.
    io_bound = cpu < 0.5 * sum(busy.values())
    batch_time = _mean(list(per_batch.values()))
    # A slow batch: one that took over twice as long as the median batch to load.
    slow_batch = bool(per_batch) and max(per_batch.values()) > 2 * statistics.median(per_batch.values())
    utilisation = {lane: t / wall if wall > 0 else 0.0 for lane, t in sorted(busy.items())}

    # Transport: of the time between a worker's put and the main process's receipt, only the part
    # the main process spent waiting for it (a batch queued while the consumer trained costs nothing).
    puts = {e["batch"]: e["start"] for e in by["put"]}
    transport = _mean([e["start"] - max(puts[e["batch"]], e["waited_since"]) for e in by["receive"]
                       if e["batch"] in puts])
    reorder_lost = sum(e["end"] - e["start"] for e in by["reorder_block"])
    pin = _mean([e["end"] - e["start"] for e in by["pin"]])
    workers_needed = max(1, math.ceil(batch_time / consumer_step)) if consumer_step > 0 else max(1, trace.num_workers)
    workers_needed = min(workers_needed, max(1, len(yields)))  # an epoch of n batches keeps at most n workers busy

    if cores is None:
        cores = process_cpu_count()
    bottleneck = "loader" if wait_share > 0.25 else "consumer"
    advice = _advise(trace, bottleneck, wait_share, waited, batch_time, utilisation, reorder_lost, transport,
                     pin, workers_needed, cores, io_bound, slow_batch)
    return Diagnosis(wall, wait_share, consumer_step, batch_time, utilisation, reorder_lost, transport, pin,
                     workers_needed, io_bound, bottleneck, advice, startup)


def _startup(sends: list[dict], waits: list[dict], fetches: list[dict]) -> float:
    """Seconds the consumer waited for workers to start: of each epoch's first wait, the part before any fetch began.

    An epoch starts where task 0 is sent. A forked worker starts in milliseconds; one started with ``spawn`` or
    ``forkserver`` imports its modules anew (a second or more with torch). That one-off cost is left out of the
    waits, so the diagnosis reads the same whatever the start method (``persistent_workers=True`` pays it once).
    """
    total = 0.0
    for send in (e for e in sends if e["batch"] == 0):
        wait = min((w for w in waits if w["start"] >= send["start"]), key=lambda w: w["start"], default=None)
        fetch = min((f["start"] for f in fetches if f["start"] >= send["start"]), default=None)
        if wait is not None and fetch is not None:
            total += min(max(fetch - wait["start"], 0.0), wait["end"] - wait["start"])
    return total


def _advise(trace, bottleneck, wait_share, waited, batch_time, utilisation, reorder_lost, transport, pin,
            workers_needed, cores, io_bound, slow_batch) -> list[str]:
    n = trace.num_workers
    if bottleneck == "consumer":
        return [f"nothing in the loader: the consumer waited only {wait_share:.0%} of the time; "
                f"about {workers_needed} worker(s) keep up with this step"]
    advice = []
    if reorder_lost > 0.2 * waited and trace.in_order and n > 0:
        why = ("a slow sample held it back" if slow_batch else
               "no batch took twice the median batch's time to load: the workers finished out of turn")
        advice.append(f"in_order=False: {reorder_lost:.2f} s of waiting happened while a later batch was "
                      f"already ready ({why})")
    if n > 0 and trace.worker_method == "multiprocessing" and transport > 0.5 * batch_time:
        advice.append(f"worker_method='thread': moving a batch between processes ({transport * 1e3:.1f} ms) "
                      f"costs as much as making it ({batch_time * 1e3:.1f} ms)")
    if n > 1 and trace.worker_method == "thread" and not io_bound and sum(utilisation.values()) < 1.2:
        advice.append("worker_method='multiprocessing': thread workers together used about one core, the "
                      "GIL serialises their Python code (or run on free-threaded Python)")
    if n < workers_needed and io_bound:
        advice.append(f"num_workers={workers_needed}, as threads (worker_method='thread'): loading mostly waits "
                      f"rather than computes, so more workers than the {cores} core(s) still help")
    elif n < workers_needed:
        more = f"num_workers={min(workers_needed, cores)}" if n < cores else "a cheaper per-sample transform"
        advice.append(f"{more}: a batch takes {batch_time * 1e3:.1f} ms to load, so about {workers_needed} "
                      f"worker(s) are needed to keep up, and this machine has {cores} core(s)")
    elif n > 0 and max(utilisation.values(), default=0) < 0.7:
        advice.append("a larger prefetch_factor: workers sat idle while the consumer waited")
    if pin > 0.5 * batch_time:
        advice.append(f"pin_memory=False, or pin fewer bytes: pinning takes {pin * 1e3:.1f} ms per batch")
    return advice or ["more workers, or a cheaper per-sample transform"]


COLOURS = {"getitem": "#9ecae1", "fetch": "#3182bd", "collate": "#31a354", "pickle": "#a1d99b",
           "reorder": "#fdae6b", "reorder_block": "#e6550d", "pin": "#756bb1", "wait": "#de2d26", "consumer": "#636363"}


def plot_timeline(rows: list[dict], ax=None, title: str = "DataLoader timeline", caption: str | None = None):
    """Draw ``rows`` as horizontal bars on one lane per worker/thread; returns the matplotlib Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.5))
    t0 = min(r["start"] for r in rows)
    lane_order = sorted({r["lane"] for r in rows}, key=lambda lane: (lane.startswith("worker"), lane), reverse=True)
    y = {lane: i for i, lane in enumerate(lane_order)}
    for event, colour in COLOURS.items():
        bars = [((r["start"] - t0) * 1e3, (r["end"] - r["start"]) * 1e3, y[r["lane"]])
                for r in rows if r["event"] == event]
        for lane_y in {b[2] for b in bars}:
            spans = [(x, w) for x, w, ly in bars if ly == lane_y]
            inner = event in ("getitem", "reorder_block")  # drawn inside a fetch / a wait: keep them on top
            height = 0.35 if inner else 0.7
            ax.broken_barh(spans, (lane_y - height / 2, height), color=colour, label=event, zorder=3 if inner else 2)
        for x, w, lane_y in bars:
            if event in ("fetch", "wait") and w > 0:
                batch = next(r["batch"] for r in rows if r["event"] == event and (r["start"] - t0) * 1e3 == x)
                ax.text(x + w / 2, lane_y, str(batch), ha="center", va="center", fontsize=7, color="white")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_yticks(range(len(lane_order)), lane_order)
    ax.set_xlabel("time since the first event (ms)")
    ax.set_title(title if caption is None else f"{title}\n{caption}", fontsize=9)
    return ax
