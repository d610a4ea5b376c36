"""Reading a trace: where the time went (``Diagnosis``), what to change (its advice), and a timeline plot.

``Trace.diagnose()`` and ``Trace.plot()`` call this module. minidl/trace.py records the events it reads.
It reads only ``Trace.rows()``, so it never imports the recording side.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from minidl._utils import process_cpu_count


@dataclass
class Diagnosis:
    """Numbers worked out from a trace, and a verdict in words (``print(diagnosis)``).

    Times are in seconds; shares are fractions of ``wall``.
    """

    wall: float  # from the consumer's first wait for a batch to the last hand-over, start-up left out
    wait_share: float  # the share of wall the consumer spent waiting inside next()
    consumer_step: float  # the mean time the consumer spent between batches
    batch_time: float  # the mean time to fetch and collate one batch (in a worker, or in the main process)
    worker_utilisation: dict[str, float]  # for each lane, the share of wall it spent fetching and collating
    reorder_lost: float  # the time the consumer waited while a later batch sat ready in the reorder buffer
    transport: float  # the mean time from a worker's put to the main process's receive
    pin: float  # the mean time to pin one batch
    workers_needed: int  # how many workers would keep up with the measured consumer step
    io_bound: bool  # loading spent under half its time on the CPU, so it mostly waits
    bottleneck: str  # "loader" or "consumer"
    advice: list[str]
    startup: float = 0.0  # the consumer's wait for workers to start (see _startup); the numbers above leave it out

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


def diagnose(trace, cores: int | None = None) -> Diagnosis:
    """Compute a Diagnosis from the events of ``trace`` (a ``minidl.trace.Trace``)."""
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
    # Loading that mostly waits (on storage, the network, a sleep) rather than computes is I/O-bound.
    # Then more workers than cores still help, and threads are the cheapest workers.
    io_bound = cpu < 0.5 * sum(busy.values())
    batch_time = _mean(list(per_batch.values()))
    # A slow batch: one that took over twice as long as the median batch to load.
    slow_batch = bool(per_batch) and max(per_batch.values()) > 2 * statistics.median(per_batch.values())
    utilisation = {lane: t / wall if wall > 0 else 0.0 for lane, t in sorted(busy.items())}

    # Transport counts only the part of the time from a worker's put to the receipt that the main process
    # spent waiting. A batch that sat in the queue while the consumer trained costs nothing.
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
    """Seconds the consumer waited for workers to start: in each epoch's first wait, the part before any fetch.

    An epoch starts where task 0 is sent. A forked worker starts almost at once. A worker started with
    ``spawn`` or ``forkserver`` imports its modules afresh, which is slow when torch is among them.
    This one-off cost is left out of the waits, so the diagnosis reads the same under every start method.
    (With ``persistent_workers=True`` it is paid only in the first epoch.)
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
    """The advice a Diagnosis prints: one line for each change this trace points to."""
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
    """Draw ``rows`` as horizontal bars, one lane per worker or thread, and return the matplotlib Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.5))
    t0 = min(r["start"] for r in rows)
    lane_order = sorted({r["lane"] for r in rows}, key=lambda lane: (lane.startswith("worker"), lane), reverse=True)
    y = {lane: i for i, lane in enumerate(lane_order)}
    for event, colour in COLOURS.items():
        bars_by_lane = defaultdict(list)  # lane's y -> (start ms, width ms, batch) of each bar
        for r in rows:
            if r["event"] == event:
                bar = ((r["start"] - t0) * 1e3, (r["end"] - r["start"]) * 1e3, r.get("batch"))
                bars_by_lane[y[r["lane"]]].append(bar)
        inner = event in ("getitem", "reorder_block")  # drawn thinner, on top of the fetch or wait they sit in
        height = 0.35 if inner else 0.7
        for lane_y, bars in bars_by_lane.items():
            ax.broken_barh([(x, w) for x, w, _ in bars], (lane_y - height / 2, height), color=colour, label=event,
                           zorder=3 if inner else 2)
            if event in ("fetch", "wait"):  # each bar carries its batch number, written on it
                for x, w, batch in bars:
                    if w > 0:
                        ax.text(x + w / 2, lane_y, str(batch), ha="center", va="center", fontsize=7, color="white")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_yticks(range(len(lane_order)), lane_order)
    ax.set_xlabel("time since the first event (ms)")
    ax.set_title(title if caption is None else f"{title}\n{caption}", fontsize=9)
    return ax
