"""Notebook 04's harness: four ways to fetch a batch from one ``TensorDataset``, timed and broken down.

Per sample (``dataset[i]`` 64 times, then ``default_collate`` stacks the rows); ``__getitems__`` returning
rows (one index per tensor for the whole batch, split back into rows that the same collate stacks again);
``__getitems__`` returning the made batch, with a pass-through ``collate_fn``; and a ``BatchSampler`` passed
as ``sampler=`` with ``batch_size=None`` (the dataset indexed with the whole list of indices: the batch comes
out made, and ``default_convert`` only turns its tuple into a list). Each is timed untraced, with minidl's and
torch's loaders, then traced to split a batch's time into fetching, collating and the loader's own work;
``batch_size_study`` times torch's loader over a few batch sizes. Timing is done here, not with
``minidl_bench`` (which imports this package, not the other way round).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

import minidl

MODES = ("per sample", "__getitems__ -> rows", "__getitems__ -> batch", "BatchSampler as sampler")
PARTS = ("fetching", "collating", "the loader's own work")


class BatchedTensorDataset(minidl.TensorDataset):
    """A ``TensorDataset`` that fetches a whole batch at once: one indexing per tensor instead of one per sample.

    ``__getitems__`` still returns a list of samples, as the contract says: ``collate_fn`` stacks them as before.

    >>> import torch
    >>> ds = BatchedTensorDataset(torch.arange(6).reshape(3, 2), torch.tensor([7, 8, 9]))
    >>> ds.__getitems__([2, 0])
    [(tensor([4, 5]), tensor(9)), (tensor([0, 1]), tensor(7))]
    """

    def __getitems__(self, indices: list) -> list:
        columns = [tensor[indices].unbind(0) for tensor in self.tensors]  # one gather per tensor, then views
        return list(zip(*columns))


class MadeBatchTensorDataset(minidl.TensorDataset):
    """A ``TensorDataset`` whose ``__getitems__`` returns the batch itself: one indexing per tensor, nothing split.

    The fetcher hands whatever ``__getitems__`` returns to ``collate_fn``, so pair it with ``pass_through``.

    >>> import torch
    >>> ds = MadeBatchTensorDataset(torch.arange(6).reshape(3, 2), torch.tensor([7, 8, 9]))
    >>> ds.__getitems__([2, 0])
    (tensor([[4, 5],
            [0, 1]]), tensor([9, 7]))
    """

    def __getitems__(self, indices: list) -> tuple:
        return tuple(tensor[indices] for tensor in self.tensors)


def pass_through(batch: Any) -> Any:
    """A ``collate_fn`` for a dataset that makes its own batches: hand the batch on as it is.

    >>> pass_through((1, 2))
    (1, 2)
    """
    return batch


def make_loader(lib: Any, mode: str, features: Any, labels: Any, batch_size: int, seed: int,
                trace: bool = False) -> Any:
    """A shuffled loader of ``lib`` (``minidl`` or ``torch.utils.data``) that fetches its batches the ``mode`` way."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    extra = {"trace": True} if trace else {}
    if mode == "per sample":
        return lib.DataLoader(lib.TensorDataset(features, labels), batch_size, shuffle=True, generator=generator,
                              **extra)
    if mode == "__getitems__ -> rows":
        return lib.DataLoader(BatchedTensorDataset(features, labels), batch_size, shuffle=True, generator=generator,
                              **extra)
    if mode == "__getitems__ -> batch":
        return lib.DataLoader(MadeBatchTensorDataset(features, labels), batch_size, shuffle=True,
                              generator=generator, collate_fn=pass_through, **extra)
    if mode == "BatchSampler as sampler":
        dataset = lib.TensorDataset(features, labels)
        batches = lib.BatchSampler(lib.RandomSampler(dataset, generator=generator), batch_size, drop_last=False)
        return lib.DataLoader(dataset, batch_size=None, sampler=batches, **extra)
    raise ValueError(f"mode should be one of {MODES}, got {mode!r}")


def _spans(rows: list[dict], event: str) -> dict[int, float]:
    return {r["batch"]: r["end"] - r["start"] for r in rows if r["event"] == event and r["lane"] == "main"}


def breakdown(trace: Any) -> dict[str, float]:
    """Mean seconds per batch spent fetching, collating, and in the loader's own work, from a traced epoch.

    ``next()`` is the "wait" span; fetching and collating are spans inside it; the rest of it is the loader's
    (the sampler, the bookkeeping, and the trace's own recording). With ``batch_size=None`` the trace records
    no span inside ``next()``: its whole time is then counted as fetching (indexing and ``default_convert``).
    """
    rows = trace.rows()
    waits, fetches, collates = _spans(rows, "wait"), _spans(rows, "fetch"), _spans(rows, "collate")
    batches = [b for b in waits if b is not None]
    if not batches:
        raise ValueError("the trace holds no batch: iterate a traced loader (trace=True) first")
    if not fetches:
        return {"fetching": float(np.mean([waits[b] for b in batches])), "collating": 0.0,
                "the loader's own work": 0.0}
    fetch = [fetches.get(b, 0.0) for b in batches]
    collate = [collates.get(b, 0.0) for b in batches]
    own = [waits[b] - f - c for b, f, c in zip(batches, fetch, collate)]
    return {"fetching": float(np.mean(fetch)), "collating": float(np.mean(collate)),
            "the loader's own work": float(np.mean(own))}


@dataclass
class FetchStudy:
    """Epoch times per (mode, library), a traced breakdown per mode, and the batch count of an epoch."""

    epochs: dict[tuple[str, str], list[float]]  # (mode, "minidl" | "torch") -> seconds of each timed epoch
    parts: dict[str, dict[str, float]]  # mode -> part -> mean seconds per batch (traced)
    batches: int
    samples: int

    def per_batch(self, mode: str, lib: str = "minidl") -> float:
        """The fastest untraced epoch over its batches: other jobs can only slow a repeat down."""
        return min(self.epochs[(mode, lib)]) / self.batches

    def table(self) -> str:
        lines = [f"one epoch of {self.samples:,} samples in {self.batches} batches (fastest of the repeats):"]
        for mode in MODES:
            ours, theirs = min(self.epochs[(mode, "minidl")]), min(self.epochs[(mode, "torch")])
            lines.append(f"  {mode:24} minidl {ours * 1e3:7.1f} ms   torch {theirs * 1e3:7.1f} ms   "
                         f"x{min(self.epochs[(MODES[0], 'minidl')]) / ours:.1f} over per-sample fetching")
        lines.append("per batch, traced (microseconds): " + ", ".join(PARTS))
        for mode in MODES:
            parts = self.parts[mode]
            traced = sum(parts.values())
            lines.append(f"  {mode:24} " + "  ".join(f"{parts[p] * 1e6:6.0f}" for p in PARTS)
                         + f"   traced {traced * 1e6:4.0f} against {self.per_batch(mode) * 1e6:4.0f} untraced")
        return "\n".join(lines)

    def speedup(self, mode: str, lib: str = "minidl") -> float:
        """How many times faster than per-sample fetching ``mode``'s fastest epoch was, with ``lib``'s loader."""
        return min(self.epochs[(MODES[0], lib)]) / min(self.epochs[(mode, lib)])

    def finding(self) -> str:
        """What the run shows, in words: each way's gain with torch's loader, and where a per-sample batch goes."""
        gains = ", ".join(f"{mode} x{self.speedup(mode, 'torch'):.1f}" for mode in MODES[1:])
        parts = self.parts[MODES[0]]
        biggest = max(PARTS, key=parts.get)
        rows, made = self.parts[MODES[1]], self.parts[MODES[2]]
        return (f"With torch's DataLoader, over per-sample fetching: {gains}. Fetched per sample, a traced batch "
                f"spent {parts[biggest] / sum(parts.values()):.0%} of its time {biggest}; __getitems__ returning "
                f"rows still spent {rows['collating'] * 1e6:.0f} µs a batch collating them, returning the made "
                f"batch {made['collating'] * 1e6:.0f} µs.")

    def plot(self, title: str, caption: str | None = None) -> Any:
        """One stacked bar per mode: microseconds per batch in each part, from the traces (a zero-based axis)."""
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 3.2))
        left = np.zeros(len(MODES))
        for part, colour in zip(PARTS, ("#4c72b0", "#dd8452", "#8c8c8c")):
            widths = np.array([self.parts[mode][part] * 1e6 for mode in MODES])
            ax.barh(list(MODES), widths, left=left, color=colour, label=part)
            left += widths
        ax.set_xlim(0, left.max() * 1.05)
        ax.invert_yaxis()
        ax.set_xlabel("microseconds per batch (traced, mean over the epoch)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        ax.set_title(title + (f"\n{caption}" if caption else ""), fontsize=10)
        fig.tight_layout()
        plt.close(fig)
        return fig


def fetch_study(features: Any, labels: Any, batch_size: int = 64, seed: int = 0, repeats: int = 5,
                traced_epochs: int = 3) -> FetchStudy:
    """Time ``repeats`` epochs of each mode with minidl and torch (untraced, after one warm-up epoch each), then
    trace ``traced_epochs`` minidl epochs of each and keep the quickest one's breakdown."""
    import torch.utils.data as tud

    runs = {(mode, name): partial(make_loader, lib, mode, features, labels, batch_size, seed)
            for mode in MODES for name, lib in (("minidl", minidl), ("torch", tud))}
    for make in runs.values():  # the warm-up: first calls, caches
        _drain(make())
    epochs: dict = {key: [] for key in runs}
    for _ in range(repeats):  # rounds interleave the settings, so a burst of load elsewhere hits them alike
        for key, make in runs.items():
            start = time.perf_counter()
            _drain(make())
            epochs[key].append(time.perf_counter() - start)
    parts = {}
    for mode in MODES:  # the quickest of a few traced epochs: the first pays for warming up, others for load
        traced = []
        for _ in range(traced_epochs):
            loader = make_loader(minidl, mode, features, labels, batch_size, seed, trace=True)
            _drain(loader)
            traced.append(breakdown(loader.trace))
        parts[mode] = min(traced, key=lambda p: sum(p.values()))
    batches = -(-len(features) // batch_size)
    return FetchStudy(epochs, parts, batches, len(features))


def batch_size_study(features: Any, labels: Any, sizes: tuple[int, ...] = (16, 64, 256),
                     modes: tuple[str, ...] = (MODES[0], MODES[2]), seed: int = 0,
                     repeats: int = 3) -> dict[tuple[str, int], float]:
    """The fastest epoch (seconds) of torch's loader for each ``(mode, batch_size)``, after one warm-up epoch each;
    rounds interleave the settings so a burst of load elsewhere hits them alike."""
    import torch.utils.data as tud

    runs = {(mode, size): partial(make_loader, tud, mode, features, labels, size, seed)
            for mode in modes for size in sizes}
    for make in runs.values():
        _drain(make())
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for key, make in runs.items():
            start = time.perf_counter()
            _drain(make())
            best[key] = min(best[key], time.perf_counter() - start)
    return best


def batch_size_table(best: dict[tuple[str, int], float], samples: int) -> str:
    """``batch_size_study``'s result as one row per mode: microseconds per sample at each batch size."""
    modes = list(dict.fromkeys(mode for mode, _ in best))
    sizes = sorted({size for _, size in best})
    lines = [f"torch's DataLoader, one epoch of {samples:,} samples, µs per sample (fastest of the repeats):",
             f"  {'batch_size':24}" + "".join(f"{size:>9}" for size in sizes)]
    for mode in modes:
        lines.append(f"  {mode:24}" + "".join(f"{best[(mode, size)] / samples * 1e6:9.2f}" for size in sizes))
    return "\n".join(lines)


def _drain(loader: Any) -> int:
    count = 0
    for _ in loader:
        count += 1
    return count


def batch_size_finding(best: dict[tuple[str, int], float], samples: int) -> str:
    """Per mode, the time per sample at the smallest and the largest batch size, and which was faster, in words."""
    sizes = sorted({size for _, size in best})
    small, large = sizes[0], sizes[-1]
    lines = []
    for mode in dict.fromkeys(mode for mode, _ in best):
        ratio = best[(mode, small)] / best[(mode, large)]
        if ratio >= 1.1:
            how = f"x{ratio:.1f} faster per sample at batch {large}"
        elif ratio > 1 / 1.1:
            how = "about the same (within 10%)"
        else:
            how = (f"x{1 / ratio:.1f} slower per sample at batch {large}: a cost that grows with the batch (torch "
                   "runs a large gather on several threads, which wait on each other when other jobs hold the "
                   "cores), or other jobs slowing those epochs: re-run to tell")
        lines.append(f"{mode}: {best[(mode, small)] / samples * 1e6:.1f} µs a sample at batch {small}, "
                     f"{best[(mode, large)] / samples * 1e6:.1f} at batch {large}: {how}")
    return "\n".join(lines)
