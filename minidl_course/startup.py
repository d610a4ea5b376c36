"""What a loader's start costs: the start method its workers come from, the first batch's wait, the steady pace.

A process worker is made by fork (a copy of the parent, Linux's default to Python 3.13), forkserver (a copy
of a small server process, Linux's default from 3.14) or spawn (a fresh interpreter that imports NumPy,
minidl and torch again: macOS's and Windows' default). ``startup_cost`` names the method a loader uses and
times one epoch of a fresh loader: the wait for the first batch beside the time per batch after it, and what
making one batch costs in this process, so that the start is the first batch's wait less one batch's work.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


def start_method(loader: Any) -> str:
    """How ``loader`` (minidl's or torch's) starts its workers: fork, forkserver, spawn, thread, or main process."""
    if getattr(loader, "num_workers", 0) == 0:
        return "main process"
    if getattr(loader, "worker_method", None) == "thread":  # minidl only
        return "thread"
    context = getattr(loader, "multiprocessing_context", None)
    if context is None:
        return multiprocessing.get_start_method()  # the default, fixing it if nothing has yet (as a loader would)
    return context if isinstance(context, str) else context.get_start_method()


@dataclass(frozen=True)
class StartupCost:
    """One epoch of one loader: how its workers start, the wait for batch 1, and the mean time per batch after."""

    start_method: str
    first_batch_s: float  # iter() until the first batch is in hand: starting the workers, then one batch
    per_batch_s: float  # from the first batch to the last, per batch (worker shutdown not included)
    batches: int
    batch_s: float  # making one batch (fetch and collate) in this process: the work behind the first batch

    @property
    def startup_s(self) -> float:
        """What the first batch took beyond making one batch: the start itself.

        Not ``first_batch_s - per_batch_s``: with N workers the steady pace is one batch every 1/N of a worker's
        batch, while the first batch waits for one worker to make a whole one.
        """
        return max(0.0, self.first_batch_s - self.batch_s)

    @property
    def steady_s(self) -> float:
        """The rest of the epoch: every batch after the first, at the steady pace."""
        return self.per_batch_s * (self.batches - 1)

    @property
    def dominant(self) -> str:
        """``"start-up"`` if starting took longer than the rest of the epoch, else ``"the batches"``."""
        return "start-up" if self.startup_s > self.steady_s else "the batches"

    def __str__(self) -> str:
        worth = f"{self.startup_s / self.per_batch_s:.0f}" if self.per_batch_s > 0 else "inf"
        batches = "batch's" if worth == "1" else "batches'"
        return (f"{self.start_method}: first batch {self.first_batch_s:.3f} s, then {self.per_batch_s * 1e3:.1f} ms "
                f"a batch; start-up {self.startup_s:.3f} s (~{worth} {batches} worth) against "
                f"{self.steady_s:.3f} s for the other {self.batches - 1} batches: {self.dominant} dominate"
                f"{'s' if self.dominant == 'start-up' else ''}")


def one_batch_s(loader: Any, tries: int = 2) -> float:
    """Seconds to make one batch in this process, as a worker makes it: ``loader.collate_fn`` over
    ``loader.dataset`` at the first ``batch_size`` indices (the quickest of ``tries``, so a one-off import or
    cold cache in this process is not counted as work). A map-style dataset only: an iterable one has no index."""
    dataset = loader.dataset
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(f"one_batch_s needs a map-style dataset (with __getitem__ and __len__), got "
                        f"{type(dataset).__name__}")
    size = min(loader.batch_size or 1, len(dataset))
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        if loader.batch_size is None:  # automatic batching off: a "batch" is one sample, converted
            loader.collate_fn(dataset[0])
        else:
            loader.collate_fn([dataset[i] for i in range(size)])
        best = min(best, time.perf_counter() - start)
    return best


def startup_cost(make_loader: Callable[[], Iterable]) -> StartupCost:
    """Time one epoch of a fresh ``make_loader()``: its start method, first-batch wait and steady time per batch,
    then, for a loader with workers, one batch made in this process (``one_batch_s``, after the epoch so it warms
    nothing the epoch reads).

    A fresh loader each call, so its workers start as an epoch without ``persistent_workers`` starts them.
    The epoch needs two batches at least (one to wait for, one to pace).
    """
    loader = make_loader()
    method = start_method(loader)
    stamps = []  # when each batch was in hand; the shutdown after the last one is not a batch's cost
    start = time.perf_counter()
    for _ in loader:
        stamps.append(time.perf_counter())
    if len(stamps) < 2:
        raise ValueError(f"make_loader should give a loader of at least 2 batches, got {len(stamps)}")
    per_batch = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    # Without workers every batch is made here, one after another: the epoch's own pace is one batch's work.
    batch = per_batch if method == "main process" else one_batch_s(loader)
    return StartupCost(method, stamps[0] - start, per_batch, len(stamps), batch)


# --- what each start method costs a script that imports torch at the top ---------------------------------------


@dataclass(frozen=True)
class ScriptStart:
    """``start_script.py`` run once as ``train.py`` with one start method, per setting of ``persistent_workers``
    (False, True): each epoch's wait for its first batch and its whole length; which processes ran its top."""

    method: str
    workers: int
    python: str  # the CPython that ran it
    waits: dict  # persistent (bool) -> seconds from iter() to the first batch, one per epoch
    epoch_s: dict  # persistent (bool) -> seconds from iter() to the epoch's end, one per epoch
    import_s: float  # ``import torch`` in the script's own process
    rerun_import_s: tuple[float, ...]  # ``import torch`` in each other process that ran the script's top

    @property
    def top_runs(self) -> int:
        """How many other processes ran the script's top (its ``import torch``)."""
        return len(self.rerun_import_s)


def start_methods() -> list[str]:
    """The start methods to time here: all this platform offers, but ``fork`` on macOS, where CPython calls it
    unsafe (system libraries may have started threads) and some of them crash a forked child."""
    import sys

    offered = [m for m in multiprocessing.get_all_start_methods() if not (m == "fork" and sys.platform == "darwin")]
    return [m for m in ("fork", "forkserver", "spawn") if m in offered]


def start_method_costs(methods: Iterable[str], workers: int = 2, epochs: int = 2, persistent: bool = True,
                       timeout: float = 600) -> list[ScriptStart]:
    """Run ``start_script.py`` as a training script (a copy named ``train.py`` in a folder of its own), once per
    start method in ``methods``, each in a fresh interpreter as ``python train.py`` would be.

    A script, not this process: a spawn or forkserver worker runs the top of the script that started it, and
    whether forkserver's server preloads it (importing torch once for every worker) depends on the CPython
    version. ``persistent=False`` times only loaders without ``persistent_workers``. Raises ``ValueError`` for a
    method this platform lacks, before any run; ``RuntimeError`` with its stderr if a run fails or takes longer
    than ``timeout`` seconds (its whole process group is killed then).
    """
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from minidl_course.pitfalls import run_child

    methods = list(methods)
    unknown = [m for m in methods if m not in multiprocessing.get_all_start_methods()]
    if unknown:
        raise ValueError(f"methods should be start methods of this platform "
                         f"({', '.join(multiprocessing.get_all_start_methods())}), got {unknown}")
    results = []
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "train.py"
        shutil.copyfile(Path(__file__).with_name("start_script.py"), script)
        for method in methods:
            log = Path(folder) / f"{method}.log"
            args = [str(script), method, str(workers), str(epochs)] + ([] if persistent else ["off"])
            run = run_child(args, timeout=timeout, module=None, cwd=folder,
                            env={**os.environ, "MINIDL_START_LOG": str(log)})
            if run["timed_out"]:
                raise RuntimeError(f"train.py under {method} took longer than {timeout:.0f} s")
            if run["returncode"] != 0:
                raise RuntimeError(f"train.py under {method} failed (exit {run['returncode']}):\n"
                                   f"{run['stderr'][-2000:]}")
            out = run["result"]
            imports = dict(line.split() for line in log.read_text().splitlines())
            own = float(imports.pop(str(out["pid"])))
            timed = {key == "persistent=True": value for key, value in out.items() if key.startswith("persistent=")}
            results.append(ScriptStart(method, workers, out["python"],
                                       {k: v["first_batch_s"] for k, v in timed.items()},
                                       {k: v["epoch_s"] for k, v in timed.items()}, own,
                                       tuple(float(t) for t in imports.values())))
    return results


def start_table(results: list[ScriptStart]) -> str:
    """One line per start method and setting: the wait for each epoch's first batch, and where torch was imported."""
    lines = []
    for r in results:
        for persistent, waits in r.waits.items():
            epochs = ", ".join(f"{w:.2f}" for w in waits)
            lines.append(f"  {r.method:10} persistent_workers={str(persistent):5}  first batch of each epoch: "
                         f"{epochs} s")
        lines.append(f"  {'':10} the script's top (import torch) ran {r.top_runs} time{'s' * (r.top_runs != 1)} "
                     "in other processes")
    return "\n".join(lines)
