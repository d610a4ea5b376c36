"""Checker for ch06_sharding: a ``worker_init_fn`` that narrows each worker's copy of a stream to its own part."""

from __future__ import annotations

import random
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np

from minidl_course import toy
from minidl_course.exercises._common import _Checks, _loaders, yours

DELEGATED = "your worker_init_fn {0}: set this worker's start and end on get_worker_info().dataset yourself."
NONE_INFO = ("call torch.utils.data.get_worker_info() (minidl's workers set it too); minidl.get_worker_info() "
             "is set only by minidl's own workers, so under torch's DataLoader it returns None.")


def range_stream(start: int, end: int):
    """A ``RangeStream(start, end)``: a torch IterableDataset of ``start .. end-1`` that doesn't shard itself."""
    from minidl_course.exercises.ch06_streams import RangeStream
    return RangeStream(start, end)


class SeenInfo(SimpleNamespace):
    """A stand-in for the WorkerInfo a worker sees, noting in ``read`` which of its attributes were read."""

    def __init__(self, worker_id: int, num_workers: int, seed: int, dataset: Any, rng: Any = None) -> None:
        super().__init__(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset, rng=rng, read=[],
                         worker_method="multiprocessing")

    def __getattribute__(self, name: str) -> Any:
        if name not in ("read", "__dict__", "__class__"):
            super().__getattribute__("read").append(name)
        return super().__getattribute__(name)


@contextmanager
def as_worker(info: Any) -> Iterator[None]:
    """Be worker ``info.id`` as its ``worker_init_fn`` sees it (its info, its RNG seeds), all put back after."""
    import torch
    import torch.utils.data._utils.worker as torch_worker

    from minidl.worker import _InProcess
    saved = torch_worker._worker_info, random.getstate(), np.random.get_state(), torch.get_rng_state()
    threads, torch_worker._worker_info = torch.get_num_threads(), info
    try:
        _InProcess.seed(info.seed - info.id, info.id)  # from the base seed, as torch does
        yield
    finally:
        torch_worker._worker_info, *states = saved
        for restore, state in zip((random.setstate, np.random.set_state, torch.set_rng_state), states):
            restore(state)
        torch.set_num_threads(threads)


def call_as_worker(worker_init_fn: Callable[[int], None], dataset: Any, worker_id: int = 0, num_workers: int = 1,
                   seed: int = 0) -> Any:
    """``worker_init_fn(worker_id)`` called here as that worker's, ``dataset`` its copy (``as_worker``); ``dataset``."""
    with as_worker(SeenInfo(worker_id, num_workers, seed, dataset)):
        worker_init_fn(worker_id)
    return dataset


def none_info(checks: _Checks, case: str) -> Callable[[Exception], None]:
    """An ``explain`` for ``yours``: an error about None is get_worker_info() returning None."""
    return lambda e: checks.first(case, ("NoneType" in str(e), f"your worker_init_fn raised {type(e).__name__}: "
                                         f"{''.join(str(e).splitlines()[-1:])}", NONE_INFO))


@contextmanager
def in_loader(case: str, checks: _Checks) -> Iterator[None]:
    """Run loaders that call the learner's worker_init_fn: an error is noted as its own."""
    with yours("worker_init_fn, in the loader", case, none_info(checks, case)), warnings.catch_warnings():
        # 3 workers on a 2-core machine: the loaders warn, and the check knows
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        yield


def check_worker_init_fn(worker_init_fn: Callable[[int], None]) -> None:
    """Check ch06_sharding: ``worker_init_fn(worker_id)`` shards a ``RangeStream`` so each sample comes once."""
    from torch.utils.data import graph_settings

    checks = _Checks(worker_init_fn)
    library = {"ran minidl's self-sharding toy.ShardedRange": (toy.ShardedRange,),
               "called torch's apply_sharding": (graph_settings.apply_sharding,)}
    # 10 items on 3 workers: shards of 4, 4 and 2 (3, 3, 4 is refused); not from 0; more workers than items; empty
    rng = random.Random(0)
    for start, end, num_workers in [(0, 10, 1), (0, 10, 2), (0, 10, 3), (5, 12, 3), (0, 2, 3), (4, 4, 2)] + [
            (s := rng.randint(0, 20), s + rng.randint(0, 30), rng.randint(1, 6)) for _ in range(20)]:
        _check_shards(worker_init_fn, start, end, num_workers, library, checks)
        checks.passed += 1
    checks.refuse_cell_function(worker_init_fn, "import it from a module file (as in ch05_worker_loop).")
    for (name, loader_cls), num_workers in ((loader, k) for loader in _loaders() for k in (1, 2, 3)):
        case = f"{name}(RangeStream(3, 20), batch_size=2, num_workers={num_workers}, worker_init_fn=yours)"
        with in_loader(case, checks):
            got = [int(x) for batch in loader_cls(range_stream(3, 20), batch_size=2, num_workers=num_workers,
                                                  worker_init_fn=worker_init_fn, collate_fn=list) for x in batch]
        counts = Counter(got)  # a sample outside 3 .. 19, twice, or missing
        if wrong := sorted(i for i in counts if counts[i] > 1 or not 3 <= i < 20) or sorted({*range(3, 20)} - {*got}):
            what = f"came {counts[wrong[0]]} times" if counts[wrong[0]] else "never came"
            checks.fail(case, f"sample {wrong[0]} {what} (all: {sorted(got)})",
                        "each of 3 .. 19 must come exactly once.")
        checks.passed += 1
    checks.done()


def _check_shards(worker_init_fn, start: int, end: int, num_workers: int, library, checks: _Checks) -> None:
    """``worker_init_fn`` called as each of ``num_workers`` workers of ``RangeStream(start, end)``: the spec's split."""
    from minidl_course.exercises.ch06_streams import RangeStream
    case, shards = f"RangeStream({start}, {end}) with num_workers={num_workers}", []
    for worker_id in range(num_workers):
        dataset = RangeStream(start, end)  # each worker has its own copy
        info, where = SeenInfo(worker_id, num_workers, 1000 + worker_id, dataset), f"{case}, worker {worker_id}"
        with as_worker(info):
            checks.watched(library, where, "your worker_init_fn {0}", DELEGATED, worker_init_fn, worker_id,
                           what="worker_init_fn", explain=none_info(checks, where))
        checks.first(where, (isinstance(dataset, toy.ShardedRange), "your worker_init_fn turned the dataset into "
                             "minidl's toy.ShardedRange", DELEGATED.format("swapped in minidl's own sharding dataset")),
                     (type(dataset) is not RangeStream or "__iter__" in vars(dataset), "your worker_init_fn replaced "
                      f"the dataset's iteration (it is now a {type(dataset).__name__})", "keep the dataset's class "
                      "and __iter__; set only its start and end for this worker."))
        if num_workers > 1 and "dataset" not in info.read and (dataset.start, dataset.end) == (start, end):
            checks.fail(where, "your worker_init_fn never read get_worker_info().dataset, and the worker's dataset "
                        f"still streams all of {start} .. {end - 1}", "change each worker's own copy, "
                        "get_worker_info().dataset: changing a dataset from the notebook does not reach the workers.")
        shards.append((worker_id, dataset.start, dataset.end))
    counts = Counter(i for _, lo, hi in shards for i in range(lo, hi))
    described = ", ".join(f"worker {w}: [{lo}, {hi})" for w, lo, hi in shards)
    outside, twice = sorted(i for i in counts if not start <= i < end), sorted(i for i, c in counts.items() if c > 1)
    if outside:
        checks.fail(case, f"your shards are {described}; sample {outside[0]} is not in the stream",
                    f"the shards must split [start, end) = [{start}, {end}) and stay inside it.")
    checks.first(case, (twice and num_workers > 1 and all((lo, hi) == (start, end) for _, lo, hi in shards), "every "
                        f"worker kept the whole range: {described}", "set info.dataset.start and info.dataset.end to "
                        "this worker's part, from info.id and info.num_workers."))
    if twice:
        who = [f"worker {w}" for w, lo, hi in shards if lo <= twice[0] < hi]
        checks.fail(case, f"your shards are {described}; sample {twice[0]} is in {' and '.join(who)}",
                    "set the end of each worker's part as well as its start: only the last part runs to the end."
                    if any(hi == end for _, _, hi in shards[:-1])
                    else "the shards must not overlap: worker k's part ends where worker k + 1's begins.")
    if missing := [i for i in range(start, end) if i not in counts]:
        checks.fail(case, f"your shards are {described}; sample {missing[0]} is in none of them",
                    f"the last samples belong to no worker: round the shard size up (-(-{end - start} // {num_workers})"
                    ") and cap each end at end." if missing[-1] == end - 1 else "every sample must belong to a worker.")
    per = -(-(end - start) // num_workers)
    for w, lo, hi in shards:
        want = (min(start + w * per, end), min(start + (w + 1) * per, end))
        if (lo, hi) != want and not (want[0] == want[1] and lo >= hi):
            checks.fail(case, f"your shards are {described}; each sample comes once, but worker {w}'s part should be "
                        f"[{want[0]}, {want[1]})", f"contiguous parts of ceil({end - start} / {num_workers}) = {per} "
                        "samples in worker order, the last one shorter (or empty).")
