"""What the resume tests share: datasets, samplers, and the runs they compare.

Imported by name (``from resumetools import ...``), as loadertools is.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import pickle
import random
import textwrap
import threading
import warnings

import numpy as np
import pytest
from hypothesis import strategies as st

import minidl
from minidl_course import toy

torch = pytest.importorskip("torch")


def seed_everything(s: int) -> None:
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def batches_of(loader_or_iter) -> list:
    return list(loader_or_iter)


def interrupted_equals_uninterrupted(make, cut: int, epochs_before: int = 0) -> tuple[list, list]:
    """Batches of one full epoch, and the same epoch stopped after ``cut`` batches and resumed."""
    seed_everything(0)
    loader = make()
    for _ in range(epochs_before):
        batches_of(loader)
    full = batches_of(loader)

    seed_everything(0)
    loader = make()
    for _ in range(epochs_before):
        batches_of(loader)
    it = iter(loader)
    first = [next(it) for _ in range(cut)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))  # a checkpoint survives a file
    del it

    seed_everything(12345)  # a different process state: the loader must restore what matters
    resumed = make()
    resumed.load_state_dict(state)
    return full, first + batches_of(resumed)


CONFIGS = {
    "main, shuffle with a generator": dict(num_workers=0, shuffle=True, seeded=True),
    "main, shuffle from the global seed": dict(num_workers=0, shuffle=True),
    "processes, shuffle with a generator": dict(num_workers=2, shuffle=True, seeded=True),
    "processes, global seed": dict(num_workers=2, shuffle=True),
    "one process, sequential": dict(num_workers=1),
    "threads": dict(num_workers=2, shuffle=True, seeded=True, worker_method="thread"),
    "processes, prefetch 3": dict(num_workers=2, shuffle=True, prefetch_factor=3),
}


def maker(config: dict, n: int = 23, batch_size: int = 3):
    kw = dict(config)
    seeded = kw.pop("seeded", False)
    dataset_cls = toy.WorkerRandomDataset if kw.get("worker_method") == "thread" else toy.GlobalRandomDataset

    def make():
        return minidl.DataLoader(dataset_cls(n), batch_size=batch_size, stateful=True,
                                 generator=torch.Generator().manual_seed(7) if seeded else None, **kw)

    return make


class NormalDraws(minidl.Dataset):
    """``(index, one normal from NumPy's global stream)``: the legacy generator draws normals in pairs and keeps
    the second, so every other item takes the kept one and leaves the generator's words as they were."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return index, float(np.random.standard_normal())


def saved_state(**kwargs) -> dict:
    loader = minidl.DataLoader(toy.RangeDataset(12), batch_size=2, stateful=True, **kwargs)
    it = iter(loader)
    [next(it) for _ in range(2)]
    state = loader.state_dict()
    del it
    return state


EPOCHS = 2


SWEEP_EXAMPLES = int(os.environ.get("MINIDL_RESUME_EXAMPLES", "12"))


class SweepItems(minidl.Dataset):
    """``(index, a draw from the worker's NumPy stream)``; KeyError at ``bad``; a process worker exits while
    ``gate`` is set (a transient failure)."""

    def __init__(self, n: int, bad: int | None = None, gate=None) -> None:
        self.n, self.bad, self.gate = n, bad, gate

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if self.gate is not None and self.gate.is_set() and multiprocessing.parent_process() is not None:
            os._exit(3)
        if index == self.bad:
            raise KeyError(f"bad sample {index}")
        info = minidl.get_worker_info()
        rng = info.rng.numpy_generator if info is not None and info.rng is not None else np.random
        return index, float(rng.random())


class SweepStream(minidl.IterableDataset):
    """``(item, a draw from NumPy's stream)``, sharded round-robin by worker, with no state_dict(); a process
    worker exits while ``gate`` is set; ``len_raises``: its ``__len__`` raises NotImplementedError."""

    def __init__(self, n: int, gate=None, len_raises: bool = False) -> None:
        self.n, self.gate, self.len_raises = n, gate, len_raises

    def __len__(self) -> int:
        if self.len_raises:
            raise NotImplementedError("a stream of unknown length")
        return self.n

    def __iter__(self):
        info = minidl.get_worker_info()
        workers, worker_id = (1, 0) if info is None else (info.num_workers, info.id)
        for item in range(worker_id, self.n, workers):
            if self.gate is not None and self.gate.is_set() and multiprocessing.parent_process() is not None:
                os._exit(3)
            yield item, float(np.random.rand())


def _plain(batch):
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, list | tuple):
        return [_plain(b) for b in batch]
    return batch


@st.composite
def sweep_configs(draw):
    kind = draw(st.sampled_from(["map", "map", "stream", "stateless stream"]))
    workers = draw(st.integers(0, 3))
    method = "multiprocessing" if kind != "map" or workers == 0 else draw(st.sampled_from(["multiprocessing",
                                                                                          "thread"]))
    config = dict(kind=kind, n=draw(st.integers(4, 13)), batch_size=draw(st.sampled_from([None, 1, 2, 3])),
                  num_workers=workers, worker_method=method,
                  persistent_workers=workers > 0 and draw(st.booleans()),
                  in_order=workers == 0 or kind == "stateless stream" or draw(st.booleans()),  # else refused
                  snapshot_every_n_steps=draw(st.sampled_from([None, 0, 1, 1, 2, 3, 5])),
                  shuffle=kind == "map" and draw(st.sampled_from(["no", "generator", "global"])) or "no",
                  bad=None, fail_resume=workers > 0 and method == "multiprocessing" and draw(st.booleans()),
                  # a map dataset's sampler: its own state_dict(), or a batch sampler whose len() under-reports
                  sampler=kind == "map" and draw(st.sampled_from(["default", "default", "stateful", "short len"])),
                  len_raises=kind != "map" and draw(st.booleans()))  # an IterableDataset's __len__ may raise
    config["drop_last"] = config["batch_size"] is not None and draw(st.booleans())
    if kind == "map" and draw(st.booleans()):
        config["bad"] = draw(st.integers(0, config["n"] - 1))
    config["cuts"] = sorted(set(draw(st.lists(st.integers(0, 2 * config["n"] + 2), min_size=1, max_size=2))))
    return config


def _sweep_loader(config: dict, gate):
    kind, n = config["kind"], config["n"]
    gate = gate if config["fail_resume"] else None
    dataset = SweepItems(n, config["bad"], gate) if kind == "map" else \
        (NoLenResumableStream if config["len_raises"] else toy.ResumableStream)(n) if kind == "stream" else \
        SweepStream(n, gate, config["len_raises"])
    shuffle, batching = config["shuffle"], dict(batch_size=config["batch_size"], drop_last=config["drop_last"])
    sampler = config["sampler"] or "default"
    generator = torch.Generator().manual_seed(3) if shuffle == "generator" else None
    if sampler == "stateful":
        batching["sampler"], shuffle = EpochSeededSampler(n, seed=11), "no"
    elif sampler == "short len":
        inner = minidl.RandomSampler(range(n), generator=generator) if shuffle != "no" else range(n)
        batching = dict(batch_sampler=ShortLenBatchSampler(inner, config["batch_size"] or 1, config["drop_last"]))
        shuffle = "no"
    return minidl.DataLoader(dataset, **batching, shuffle=shuffle != "no" or None if kind == "map" else None,
                             generator=generator,
                             num_workers=config["num_workers"], worker_method=config["worker_method"],
                             persistent_workers=config["persistent_workers"], in_order=config["in_order"],
                             snapshot_every_n_steps=config["snapshot_every_n_steps"], stateful=True)


def _sweep_run(config: dict, cuts: list[int], gate) -> list[list]:
    """EPOCHS epochs of (plain) batches, a caught error as "KeyError"; at each position in ``cuts`` (batches had
    so far, over all epochs) the loader is checkpointed, dropped and a fresh one resumes from the checkpoint."""
    seed_everything(0)
    loader, epochs, position, cuts = _sweep_loader(config, gate), [], 0, list(cuts)
    for _ in range(EPOCHS):
        got, it = [], None
        while True:
            if cuts and cuts[0] == position:
                cuts.pop(0)
                state = json.loads(json.dumps(loader.state_dict()))  # a checkpoint survives a file
                rng = random.getstate(), np.random.get_state(), torch.get_rng_state()  # the loop's own checkpoint
                it = loader = None
                seed_everything(1000 + position)  # another process; the loop restores its RNG beside the loader's
                random.setstate(rng[0])
                np.random.set_state(rng[1])
                torch.set_rng_state(rng[2])
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*has no state_dict", category=UserWarning)
                    loader = _sweep_loader(config, gate)
                    loader.load_state_dict(state)
                if config["fail_resume"] and gate is not None:
                    it, got_first = _resume_fails_then_retry(loader, state, gate)
                    if got_first is not None:
                        got.append(got_first)
                        position += 1
                        continue
            if it is None:
                it = iter(loader)
            try:
                got.append(_plain(next(it)))
            except StopIteration:
                break
            except KeyError:
                got.append("KeyError")
            position += 1
        epochs.append(got)
    it = loader = None
    return epochs


def _resume_fails_then_retry(loader, state, gate):
    """The resumed loader's workers die (in iter() or at the first batch): try again, as a training script would:
    iter() again if iter() failed (the loader kept the state), else load the checkpoint again. Returns the
    iterator and the first batch if the retry already took it."""
    gate.set()
    try:
        it = iter(loader)
    except RuntimeError:
        gate.clear()
        return iter(loader), None
    try:
        first = next(it)
    except StopIteration:  # nothing left to fetch this epoch: nothing failed
        gate.clear()
        return it, None
    except RuntimeError:
        it = None
        gate.clear()
        loader.load_state_dict(state)
        return iter(loader), None
    gate.clear()  # a batch came before a worker saw the gate (prefetched before it was set): no failure this time
    return it, _plain(first)


def _without_draws(batch):
    if isinstance(batch, float):
        return None
    return [_without_draws(b) for b in batch] if isinstance(batch, list) else batch


def _same_epochs(resumed: list[list], full: list[list], config: dict) -> None:
    if config["in_order"]:
        assert resumed == full
        return
    # Out of order, the order is down to timing, and so is which worker fetches which sample of a map dataset
    # (and so its draws): each batch comes once. (A stream's items each come from one worker, draws and all.)
    if config["kind"] == "map":
        resumed, full = _without_draws(resumed), _without_draws(full)
    assert [sorted(map(repr, e)) for e in resumed] == [sorted(map(repr, e)) for e in full]


def _event(worker_method: str):
    return threading.Event() if worker_method == "thread" else multiprocessing.get_context().Event()


class HeldSample(minidl.Dataset):
    """``held`` waits for ``gate`` to be set: every other sample overtakes it."""

    def __init__(self, n: int, held: int, gate) -> None:
        self.n, self.held, self.gate = n, held, gate

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.held and not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        return index


class GatedShards(minidl.IterableDataset):
    """Worker w streams its shard of 0..n-1; worker 1's first item waits for ``gate``. Saves its position."""

    def __init__(self, n: int, gate) -> None:
        self.n, self.gate, self.pos, self._resume_at = n, gate, None, None

    def __iter__(self):
        info = minidl.get_worker_info()
        per = math.ceil(self.n / info.num_workers)
        start, stop = info.id * per, min((info.id + 1) * per, self.n)
        first, self._resume_at = (start if self._resume_at is None else self._resume_at), None
        for i in range(first, stop):
            if i == start and info.id == 1 and not self.gate.wait(timeout=60):
                raise TimeoutError("the test never opened the gate")
            self.pos = i + 1
            yield i

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self._resume_at = state["pos"]


class StatelessShards(minidl.IterableDataset):
    """Worker w streams its shard of 0..n-1, with no state_dict(): resuming it means replaying."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = minidl.get_worker_info()
        workers, worker_id = (1, 0) if info is None else (info.num_workers, info.id)
        per = math.ceil(self.n / workers)
        return iter(range(worker_id * per, min((worker_id + 1) * per, self.n)))


def _shuffled_persistent(n: int = 11):
    return minidl.DataLoader(toy.RangeDataset(n), batch_size=2, shuffle=True, num_workers=2, persistent_workers=True,
                             stateful=True, generator=torch.Generator().manual_seed(5))


class GatedStatelessShards(minidl.IterableDataset):
    """Each worker streams its own shard, no state_dict(); worker 0's first item waits for ``gate``."""

    def __init__(self, n: int, gate) -> None:
        self.n, self.gate = n, gate

    def __iter__(self):
        info = minidl.get_worker_info()
        workers, worker_id = (1, 0) if info is None else (info.num_workers, info.id)
        for item in range(worker_id, self.n, workers):
            if item == 0 and not self.gate.wait(timeout=60):
                raise TimeoutError("the test never opened the gate")
            yield item


def _catching(it, n: int | None = None) -> list:
    """Up to ``n`` next()s (all, with None), each batch or the type of the error it raised, as a training loop that
    catches errors and goes on."""
    out = []
    while n is None or len(out) < n:
        try:
            out.append(next(it).tolist())
        except StopIteration:
            break
        except KeyError as e:
            out.append(type(e).__name__)
    return out


class DiesWhenAsked(toy.RangeDataset):
    """The worker fetching ``bad_index`` exits while ``gate`` is set: a transient failure."""

    def __init__(self, n: int, bad_index: int, gate) -> None:
        super().__init__(n)
        self.bad_index, self.gate = bad_index, gate

    def __getitem__(self, index: int) -> int:
        if index == self.bad_index and self.gate.is_set() and minidl.get_worker_info() is not None:
            os._exit(3)
        return super().__getitem__(index)


class HalfStateful(toy.RangeDataset):
    """Has ``state_dict()`` but no ``load_state_dict()``: not stateful, as torchdata's ``Stateful`` protocol says."""

    def state_dict(self) -> dict:
        return {"n": self.n}


class HalfStatefulStream(toy.ShardedRange):
    def state_dict(self) -> dict:
        return {"end": self.end}


class StatelessStream(minidl.IterableDataset):
    """``0 .. n-1``, sharded round-robin by worker, with no state_dict()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = minidl.get_worker_info()
        workers, worker_id = (1, 0) if info is None else (info.num_workers, info.id)
        return iter(range(worker_id, self.n, workers))


class NoLenSampler(minidl.Sampler):
    """``0 .. n-1`` in order, without ``__len__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Under another start method (make unit-spawn, unit-forkserver) every worker process starts a fresh interpreter
# that imports torch. There the file runs the cases that start worker processes (num_workers=0 and thread workers
# run the same under every start method), and the sweeps take fewer points: two of the six snapshot settings
# (one ships states every 3 batches without persistent workers, one never ships them, with), two of the eight save
# points (one just after a snapshot, one between snapshots), two of the three cuts around a shard's end, and the
# state taken before iterating with persistent workers only.
OTHER_START_METHOD = bool(os.environ.get("MINIDL_START_METHOD"))


SNAPSHOT_SETTINGS = ([(False, 3), (True, 0)] if OTHER_START_METHOD
                     else [(persistent, every) for persistent in (False, True) for every in (3, 0, None)])


CUTS = (1, 4) if OTHER_START_METHOD else tuple(range(8))


SHARD_END_CUTS = (5, 7) if OTHER_START_METHOD else (5, 6, 7)


WORKER_METHODS = ("multiprocessing",) if OTHER_START_METHOD else ("multiprocessing", "thread")


def worker_counts(*counts: int) -> list[int]:
    """The ``num_workers`` values to test: under another start method, only those that start worker processes."""
    return [n for n in counts if n or not OTHER_START_METHOD]


def flat(batches) -> list:
    return [x for b in batches for x in (b.tolist() if hasattr(b, "tolist") else b)]


def resume_from(make, state) -> minidl.DataLoader:
    loader = make()
    loader.load_state_dict(pickle.loads(pickle.dumps(state)))
    return loader


class EpochCounter(minidl.IterableDataset):
    """Yields (epoch, i) for i < 4; counts its epochs in its own state."""

    def __init__(self) -> None:
        self.epoch, self.position = 0, 0

    def __iter__(self):
        while self.position < 4:
            self.position += 1
            yield self.epoch, self.position - 1
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


class LiveState(minidl.IterableDataset):
    """Counts 0..7 and returns its live state dict (mutated as it goes), as a careless dataset may."""

    def __init__(self) -> None:
        self.state = {"next": 0}

    def __iter__(self):
        while self.state["next"] < 8:
            self.state["next"] += 1
            yield self.state["next"] - 1

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


class OwnShuffleBatchSampler:
    """A batch sampler that owns its generator: pairs of a fresh permutation of 0..7 each epoch."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(5)

    def __iter__(self):
        order = torch.randperm(8, generator=self.generator).tolist()
        return iter([order[i:i + 2] for i in range(0, 8, 2)])

    def __len__(self) -> int:
        return 4


class UnevenStream(minidl.IterableDataset):
    """Worker 0 streams 0..5, worker 1 streams 6..7, each item with a draw from NumPy's global stream."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        info = minidl.get_worker_info()
        shard = range(0, 6) if info.id == 0 else range(6, 8)
        while self.position < len(shard):
            self.position += 1
            yield shard[self.position - 1], float(np.random.rand())
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


class StateDictRaises(toy.RangeDataset):
    def state_dict(self) -> dict:
        raise ZeroDivisionError("the dataset's state_dict() failed")

    def load_state_dict(self, state: dict) -> None:
        pass


class StateDictFailsOnce(toy.RangeDataset):
    """Worker 0's third state_dict() raises: its third batch (task 4) comes without its state."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.calls = 0

    def state_dict(self) -> dict:
        self.calls += 1
        if minidl.get_worker_info().id == 0 and self.calls == 3:
            raise ZeroDivisionError("worker 0's third state_dict()")
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]


REDUCED = textwrap.dedent("""
    import minidl

    class Reduced(minidl.Dataset):  # in __main__, but pickles by value: the worker never imports it
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i

        def __reduce__(self):
            return (list, ([0, 1, 2, 3],))

    loader = {make}(Reduced(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    print([b.tolist() for b in loader])
""")


class GrowingState(minidl.IterableDataset):
    """Its state_dict() grows with every item: a list of what it has yielded, as torchdata's DynamicState test."""

    def __init__(self) -> None:
        self.seen = []

    def __iter__(self):
        while len(self.seen) < 40:
            self.seen.append(len(self.seen))
            yield self.seen[-1]

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = list(state["seen"])


class CountingIterator:
    """An iterator over 0..n-1 that holds the state itself (its dataset has none)."""

    def __init__(self, n: int) -> None:
        self.i, self.n = 0, n

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, state: dict) -> None:
        self.i = state["i"]


class IteratorHoldsState(minidl.IterableDataset):
    def __iter__(self):
        return CountingIterator(10)


class OwnIterator(minidl.IterableDataset, CountingIterator):
    """A dataset that is its own iterator: iter() starts it over, so its state goes back after iter()."""

    def __init__(self) -> None:
        CountingIterator.__init__(self, 10)

    def __iter__(self):
        self.i = 0
        return self


class SavesTheGlobalGenerator(toy.RangeDataset):
    """A map dataset whose state is torch's global generator (as torchdata's DummyMapDataset)."""

    def state_dict(self) -> dict:
        return {"g": torch.get_rng_state().tolist()}

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(torch.tensor(state["g"], dtype=torch.uint8))


class CountsIterCalls(minidl.IterableDataset):
    """Streams 0..19 (sharded by worker); its state counts how often iter() was called on this replica."""

    def __init__(self) -> None:
        self.iter_calls, self.position = 0, 0

    def __iter__(self):
        self.iter_calls += 1
        info = minidl.get_worker_info()
        shard = range(20) if info is None else range(info.id, 20, info.num_workers)
        while self.position < len(shard):
            self.position += 1
            yield shard[self.position - 1]

    def state_dict(self) -> dict:
        return {"iter_calls": self.iter_calls, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.iter_calls, self.position = state["iter_calls"], state["position"]


class EpochSeededSampler(minidl.Sampler):
    """A permutation of ``range(n)`` seeded by ``(seed, epoch)``; each ``iter()`` starts the next epoch. Its epoch is
    its own state (``state_dict()``), as a torchdata-style stateful sampler keeps it."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n).tolist()
        self.epoch += 1
        return iter(order)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]


class ShortLenBatchSampler(minidl.BatchSampler):
    """A batch sampler whose ``__len__`` under-reports by two batches (it iterates them all)."""

    def __len__(self) -> int:
        return max(super().__len__() - 2, 0)


class NoLenResumableStream(toy.ResumableStream):
    """``toy.ResumableStream`` whose ``__len__`` raises NotImplementedError, as a stream of unknown length may."""

    def __len__(self) -> int:
        raise NotImplementedError("a stream of unknown length")


class RaisesOnceShards(minidl.IterableDataset):
    """Worker w streams ``w, w + 2, ...`` with no state_dict(); while ``armed`` is set, the worker reaching item 2
    clears it and raises once (a transient error)."""

    def __init__(self, n: int, armed) -> None:
        self.n, self.armed = n, armed

    def __iter__(self):
        info = minidl.get_worker_info()
        for item in range(info.id, self.n, info.num_workers):
            if item == 2 and self.armed.is_set():
                self.armed.clear()
                raise OSError("a transient read error at item 2")
            yield item
