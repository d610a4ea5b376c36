"""Resuming mid-epoch: ``DataLoader(stateful=True)``'s ``state_dict()`` and ``load_state_dict()``.

PyTorch's DataLoader has no ``state_dict``. torchdata's ``StatefulDataLoader`` adds one, and this layer follows
its contracts (``snapshot_every_n_steps``, a JSON-safe state) with one mechanism: snapshot and replay (the NOTE
below). It plugs in as tracing does. ``DataLoader._get_iterator`` puts this module's iterator classes on top of
the loader's own, and each worker gets its side in ``_WorkerOptions.layers``. With ``stateful=False`` none of
this runs.
"""

from __future__ import annotations

import base64
import copy
import functools
import itertools
import random
import sys
import warnings
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np

from minidl import _random
from minidl._utils import ExceptionWrapper
from minidl.fetch import _DatasetKind
from minidl.worker import _IterableDatasetStopIteration, _ResumeIteration, get_worker_info, ship, unship

# NOTE [ Resume: snapshot and replay ]
#
# What it promises. A loader built like the one that saved a state, given load_state_dict(state), hands out
# exactly the batches the uninterrupted loader would have handed out after the save, in the same order, with
# every worker's random streams where they stood: mid-epoch or between epochs, after a second resume, with
# process or thread workers, persistent or not, and after errors the loop caught (they come at the same
# places). If the resumed iter() fails, the loader still holds the state, so iter() can simply be tried again.
# With in_order=False, each batch comes exactly once across the save. The state is plain JSON values.
#
# The state has three parts.
#   1. The epoch start: the loader's generators (and its samplers' own state_dict()) just before the epoch's
#      draws (a shuffle's permutation, base_seed), and base_seed. Making those draws again gives the same epoch.
#   2. A snapshot: k (tasks_done), the index batches the consumer had, and each worker's state after its last
#      batch among those k: its random streams, its dataset's and its iterator's state_dict(), whether it ran
#      out. The epoch start is the snapshot with k = 0, so a state saved between epochs is one too.
#   3. m (replay): the batches handed out since the snapshot, the errors the consumer had among them included
#      (their places are in `errors`).
# Resume = replay the draws, skip k index batches, give each worker its saved state, fetch and drop m.
# An error met while dropping is raised, unless the consumer had an error at that place too.
#
# Workers prefetch, so a worker's state now is ahead of the consumer. The snapshot is asked for with the tasks:
# with snapshot_every_n_steps=n, each worker's last task before every n-th goes out as _SnapshotRequest(index),
# and the worker ships its state with that batch alone (its end, a new epoch's ack and the epoch end's answer
# always carry it). The main process files a state as the consumer takes its batch; once every worker's state
# after its last batch is known at a multiple of n, that is the snapshot. A snapshot costs each worker the
# getstate() of its three random streams and its dataset's state_dict(), then pickling them (~11 KB) onto the
# result queue: about 0.1 ms, and 0.2-0.3 ms a batch on a trivial dataset at n=1 (`python -m minidl_bench
# overhead` measures it beside stateful=False); a batch between snapshots costs nothing.
#   * num_workers=0: the main process is the only worker, and state_dict() reads it as it stands (m = 0).
#   * in_order=False: every task asks for a snapshot, and done_ahead lists the tasks past k already had.
#   * an IterableDataset without state_dict()/load_state_dict() (nor its iterator) can't be put back where it
#     stood: its snapshot stays at the epoch start, and the resume fetches and drops every batch had.
#   * persistent workers: at the end of an epoch, each worker is asked for its state, which starts the next.

STATE_VERSION = 6
SHAPE = ("num_workers", "worker_method", "dataset_len", "batch_size", "sampler", "generator_kinds")
START = ("generators", "samplers", "base_seed", "draws_base_seed")
SNAPSHOT = ("tasks_done", "num_yielded", "workers", "main", "next_worker", "done_ahead")
KEYS = ("version", *SHAPE, *START, *SNAPSHOT, "replay", "errors", "stateless")
_END = object()  # marks an exhausted iterator without catching StopIteration
_STALE = object()  # a worker's known state is behind: its last batch handed out came without its state


# --- random streams, and a worker's state ----------------------------------------------------------------


def _global_generator():
    """What a part given no generator draws from: torch's global stream, or NumPy's where torch is absent."""
    return _random._torch() if _random.HAS_TORCH else np.random


def _worker_streams(rng) -> list:
    """A worker's random, NumPy and torch streams: a thread worker's own ``_RNG``, else the process's global ones."""
    return [rng.random_generator, rng.numpy_generator, rng.torch_generator] if rng is not None else \
        [random, np.random, sys.modules.get("torch")]  # torch's only where it is imported


def get_rng_state(g):
    """A stream's state through its public getter (the ``random`` and ``np.random`` modules and ``torch`` too)."""
    if g is None or hasattr(g, "getstate"):  # random.Random, or the random module
        return g and g.getstate()
    if isinstance(g, np.random.Generator):
        return g.bit_generator.state
    if g is np.random:
        return g.get_state(legacy=False)
    return (g.get_rng_state() if hasattr(g, "get_rng_state") else g.get_state()).numpy().tobytes()  # torch's


def set_rng_state(g, state) -> None:
    """Put back a state ``get_rng_state(g)`` took, as it was or as ``_plain`` wrote it."""
    if g is None or state is None:
        return
    if hasattr(g, "setstate"):
        g.setstate((state[0], tuple(state[1]), state[2]))
    elif isinstance(g, np.random.Generator):
        g.bit_generator.state = state
    elif g is np.random:
        g.set_state(state)
    else:  # torch's: a uint8 tensor
        raw, torch = bytearray(base64.b64decode(state) if isinstance(state, str) else state), _random._torch()
        (g.set_rng_state if hasattr(g, "set_rng_state") else g.set_state)(torch.frombuffer(raw, dtype=torch.uint8))


def _plain(x):
    """Streams' states as JSON values: tuples and arrays become lists, bytes base64 text. JSON is left as it is."""
    if isinstance(x, dict | list | tuple):
        return {k: _plain(v) for k, v in x.items()} if isinstance(x, dict) else [_plain(v) for v in x]
    return base64.b64encode(x).decode() if isinstance(x, bytes) else getattr(x, "tolist", lambda: x)()


def _has_state(x) -> bool:
    """Whether ``x`` has ``state_dict`` and ``load_state_dict`` (torchdata's ``Stateful``): only then is it saved."""
    return hasattr(x, "state_dict") and hasattr(x, "load_state_dict")


def capture(rng, dataset, fetcher=None, ended: bool = False) -> dict:
    """A worker's state now (with no workers, the main process's). The dataset's and iterator's are copied: a
    dataset may hand out its live dict."""
    it = getattr(fetcher, "dataset_iter", None)  # its own iterator: its state goes back after iter(dataset)
    own = [copy.deepcopy(x.state_dict()) if _has_state(x) else None for x in (None if it is dataset else dataset, it)]
    streams = [get_rng_state(g) for g in _worker_streams(rng)]
    return {"streams": streams, "dataset": own[0], "iterator": own[1], "ended": ended}


def restore_streams(state: dict | None, rng) -> None:
    for g, saved in zip(_worker_streams(rng), state and state["streams"] or (), strict=False):
        set_rng_state(g, saved)


def load_dataset_state(state: dict | None, dataset) -> None:
    """Put a dataset's saved state back: before ``iter(dataset)`` reads it, and before the replayed draws."""
    if state and state["dataset"] is not None:
        dataset.load_state_dict(state["dataset"])


def load_iterator_state(state: dict | None, fetcher):
    """Put the saved state of ``iter(dataset)`` back; a replica that had run out gets a fetcher that has ended."""
    if state and state["iterator"] is not None:
        fetcher.dataset_iter.load_state_dict(state["iterator"])
    fetcher.ended = getattr(fetcher, "ended", False) or bool(state and state["ended"])
    return fetcher


# --- the worker side: handed to each worker in _WorkerOptions.layers ---------------------------------------


@dataclass(frozen=True)
class _SnapshotRequest:
    """In a task's index slot: ship the worker's state with this batch. Alone on the queue: ship it now."""

    index: object = None


class _StatefulWorker:
    """The worker side of resume, handed to a worker in ``_WorkerOptions.layers``; called there, it stands for the
    worker's two queues. ``get`` takes a task and notes whether it asks for a snapshot, ``put`` ships the worker's
    state with that task's batch (and with an end, and a new epoch's ack). ``resume``: where the first fetcher
    starts (None: as seeded)."""

    results = None  # the result queue, once called in the worker (found here before that: no __getattr__ loop)

    def __init__(self, resume: dict | None) -> None:
        self.resume, self.fetcher, self.flagged = resume, None, None

    def __call__(self, worker_id: int, index_queue, data_queue, create_fetcher):
        self.worker_id, self.tasks, self.results, self._create = worker_id, index_queue, data_queue, create_fetcher
        return self, self, self.create_fetcher

    def create_fetcher(self, kind, dataset, *args):
        restore_streams(self.resume, get_worker_info().rng)  # after worker_init_fn, which may reseed: the saved wins
        load_dataset_state(self.resume, dataset)
        self.fetcher, self.resume = load_iterator_state(self.resume, self._create(kind, dataset, *args)), None
        return self.fetcher

    def get(self, timeout=None):
        r = self.tasks.get(timeout=timeout)
        while isinstance(r, _SnapshotRequest):  # an epoch's end: the state that starts the next one
            self.results.put(self._ship((r, None), None))
            r = self.tasks.get(timeout=timeout)
        self.flagged = isinstance(r, tuple) and isinstance(r[1], _SnapshotRequest)  # (idx, indices) asking for one
        return (r[0], r[1].index) if self.flagged else r

    def put(self, r) -> None:
        end = isinstance(r[1], _IterableDatasetStopIteration)  # a replica's end always carries its state
        if isinstance(r[0], _ResumeIteration) or self.flagged or end:  # an ack: the epoch's fresh iter(dataset)
            r = self._ship(r, None if isinstance(r[0], _ResumeIteration) else self.fetcher, end)
        self.results.put(r)

    def _ship(self, r: tuple, fetcher, end: bool = False) -> tuple:
        info, ended = get_worker_info(), end or getattr(fetcher, "ended", False)  # a short last batch may end it
        try:
            return ship(r, "state", (self.worker_id, capture(info.rng, info.dataset, fetcher, ended)))
        except Exception:  # the dataset's state_dict() failed: the main process raises it in this batch's place
            where = f"in DataLoader worker {self.worker_id}'s dataset.state_dict()"  # (an end stays one)
            return (r[0], ExceptionWrapper(where=where)) if isinstance(r[0], int) and not end else r

    def __getattr__(self, name):  # cancel_join_thread, close: the result queue's own
        return getattr(self.results, name)


# --- the epoch start: the generators and samplers the epoch draws from -------------------------------------


def generators_of(loader) -> list:
    """The generators the loader and its samplers draw from; ``None`` stands for the global one, included only
    when a part has no generator (so a loader driven by a NumPy generator never imports torch)."""
    used = [part.generator for part in _parts(loader) if hasattr(part, "generator")]
    found = list({id(g): g for g in used if g is not None}.values())
    return [None, *found] if any(g is None for g in used) else found


def _parts(loader) -> tuple:
    """The loader and its samplers: what may draw random numbers, or keep a state of its own."""
    return loader, loader.sampler, loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)


def generator_kinds(generators: list) -> list[str]:
    return ["the global random state" if g is None else "a numpy.random.Generator" if isinstance(g, np.random.Generator)
            else "a torch.Generator" for g in generators]


def _samplers(loader) -> list:
    """The loader's samplers with a state of their own (``state_dict()`` and ``load_state_dict()``)."""
    return list({id(s): s for s in _parts(loader)[1:] if _has_state(s)}.values())


def epoch_start(loader, base_seed: int | None = None) -> dict:
    """The generators' and samplers' states now, before an epoch's draws; ``base_seed`` None: drawn anew."""
    generators = [get_rng_state(_global_generator() if g is None else g) for g in generators_of(loader)]
    samplers = [copy.deepcopy(s.state_dict()) for s in _samplers(loader)]
    return dict(generators=generators, samplers=samplers, base_seed=base_seed, draws_base_seed=base_seed is None)


@contextmanager
def replaying(loader, start: dict, mid_epoch: bool):
    """Run the block with the generators and samplers set back to ``start``.

    The loader's own generators stay where the replayed draws leave them, as in the run resumed. So does the
    global one for a state saved before the epoch's first batch. Mid-epoch, the training loop drew from it too:
    it is set back afterwards, so resuming doesn't disturb the RNG state the caller restored.
    """
    generators = generators_of(loader)
    global_now = get_rng_state(_global_generator()) if None in generators and mid_epoch else None
    for g, state in zip(generators, start["generators"], strict=True):
        set_rng_state(_global_generator() if g is None else g, state)
    for sampler, state in zip(_samplers(loader), start["samplers"], strict=True):
        sampler.load_state_dict(state)
    try:
        yield
    finally:
        if global_now is not None:
            set_rng_state(_global_generator(), global_now)


# --- the main side: iterator classes chosen by DataLoader._get_iterator ------------------------------------


@functools.cache
def stateful_iterators(single: type, multi: type) -> tuple[type, type]:
    """The loader's two iterator classes (traced or not) with resume on top; the loader hands them in, so this
    module never imports dataloader.py."""
    return tuple(type(f"_Stateful{base.__name__.lstrip('_')}", (layer, base), {"__doc__": layer.__doc__})
                 for layer, base in ((_StatefulSingleIter, single), (_StatefulMultiIter, multi)))


def _had(state: dict | None) -> bool:
    """Whether ``state`` was saved after the epoch's first batch (or caught error)."""
    return bool(state and (state["tasks_done"] or state["replay"] or state["done_ahead"] or state["num_yielded"]))


class _StatefulIterMixin:
    """What both iterators share: the epoch start, the skip and the replay, and the state they save."""

    def _begin(self, loader) -> dict | None:
        """Take the state load_state_dict() left (None: a fresh epoch). The loader keeps it until ``_started``."""
        self._resumed = resumed = loader._resume_state
        self._start = {k: resumed[k] for k in START} if resumed else epoch_start(loader)
        self._exhausted, self._stateless, self._errors = False, bool(resumed and resumed["stateless"]), []
        return resumed

    def _resumed_base_seed(self, loader) -> int:
        """A resumed epoch's base_seed: drawn again as the saved epoch drew it (a persistent worker's later epoch
        drew none), then the saved one."""
        drawn = _random.draw_seed(loader.generator) if self._resumed["draws_base_seed"] else None
        return drawn if self._resumed["base_seed"] is None else self._resumed["base_seed"]

    def _skip(self, k: int) -> None:
        """Draw, without fetching them, the k index batches the consumer had; the next one is drawn too, because a
        sampler may draw its random numbers in chunks (all while the generators are replayed)."""
        deque(itertools.islice(self._sampler_iter, k), maxlen=0)
        if k:
            first = next(self._sampler_iter, _END)
            self._sampler_iter = iter(()) if first is _END else itertools.chain([first], self._sampler_iter)

    def _resume(self, loader, resumed: dict | None) -> None:
        """Fetch again and drop the m batches had since the snapshot; an error is dropped only where the consumer
        had one, any other is raised. Other layers record none of these hand-overs: the consumer never has them.
        Then the iterator stands where the state said: the loader lets the state go, and asks this iterator."""
        self._num_yielded = resumed["num_yielded"] if resumed else 0
        with self._hand_overs_unrecorded():
            for i in range(resumed["replay"] if resumed else 0):
                errors = len(self._errors)
                try:
                    next(self)
                except StopIteration:
                    break
                except Exception:
                    if len(self._errors) == errors or i not in resumed["errors"]:
                        raise
        loader._resume_state, loader._last_iterator = None, self  # held as torchdata holds it, for state_dict()

    def _state(self, loader, snapshot: dict, replay: int, errors: list) -> dict:
        """The one place a state is built: this epoch's start, a snapshot, and what was had since."""
        return _state(loader, {**self._start, "base_seed": self._base_seed}, replay=replay, errors=errors,
                      stateless=self._stateless, **snapshot)


class _StatefulSingleIter(_StatefulIterMixin):
    """``num_workers=0``, resumable: the main process's streams and dataset are the one worker's state."""

    def __init__(self, loader) -> None:
        resumed = self._begin(loader)
        self._drawn = resumed["tasks_done"] if resumed else 0  # index batches drawn: a caught error is not refetched
        main = resumed and resumed["main"]
        load_dataset_state(main, loader.dataset)  # it may set the global generator, which `replaying` puts back
        with replaying(loader, self._start, _had(resumed)) if resumed else nullcontext():
            super().__init__(loader)  # draws base_seed again, and makes the fetcher on the saved dataset state
            self._skip(self._drawn)
        load_iterator_state(main, self._dataset_fetcher)
        own = (self._dataset, getattr(self._dataset_fetcher, "dataset_iter", None))
        self._stateless = self._dataset_kind == _DatasetKind.Iterable and not any(map(_has_state, own))
        self._epoch_main = main if resumed else capture(None, self._dataset) if self._stateless else None
        restore_streams(main, None)  # after `replaying`, which sets the global generator back
        self._resume(loader, resumed)

    def _next_index(self):
        self._drawn += 1  # counted before the draw: an index batch is drawn, or the epoch ends
        return super()._next_index()

    def __next__(self):
        try:
            return super().__next__()
        except StopIteration:
            self._exhausted = True
            raise
        except Exception:  # the dataset's error, had at this place of the epoch
            self._errors.append(self._drawn - 1)
            raise

    def _state_dict(self, loader) -> dict:
        if self._stateless:  # the epoch's start, and every index batch drawn since
            return self._state(loader, _snapshot(0, 0, main=self._epoch_main), self._drawn, self._errors)
        main = capture(None, self._dataset, self._dataset_fetcher, getattr(self._dataset_fetcher, "ended", False))
        return self._state(loader, _snapshot(self._drawn, self._num_yielded, main=main), 0, [])


def _snapshot(tasks_done: int, num_yielded: int, workers=None, main=None, next_worker=None, done_ahead=()) -> dict:
    return dict(zip(SNAPSHOT, (tasks_done, num_yielded, workers, main, next_worker, list(done_ahead)), strict=True))


class _StatefulMultiIter(_StatefulIterMixin):
    """``num_workers > 0``, resumable: snapshots asked for with the tasks (see NOTE [ Resume: snapshot and replay ])."""

    def __init__(self, loader) -> None:
        resumed = self._continue_from = self._begin(loader)  # _continue_from: taken by the first _try_put_index
        self._every = (loader.snapshot_every_n_steps or 0) if loader.in_order else 1
        with replaying(loader, self._start, _had(resumed)) if resumed else nullcontext():
            super().__init__(loader)  # starts the workers and sends the first tasks
        try:
            self._resume(loader, resumed)
        except BaseException:  # the loader still holds the loaded state, so iter() can be tried again
            self._shutdown_workers()
            raise

    def _layer_workers(self, worker_id: int) -> tuple:
        resumed = self._resumed and self._resumed["workers"]
        return (*super()._layer_workers(worker_id), _StatefulWorker(resumed[worker_id] if resumed else None))

    def _reset(self, loader, first_iter: bool = False) -> None:
        n, resumed = self._num_workers, self._resumed if first_iter else None
        if first_iter:  # each worker's state after its last batch the consumer had (None: as seeded)
            self._known = list(resumed and resumed["workers"] or [None] * n)
        else:  # a new epoch on persistent workers: its draws start here, and each ack brings a worker's state
            self._start, self._exhausted, self._errors = epoch_start(loader, self._base_seed), False, []
        # Per worker, the states of its batches not handed out yet; the tasks handed out since the epoch's snapshot.
        self._pending, self._handed, self._ahead = [deque() for _ in range(n)], 0, set()
        super()._reset(loader, first_iter)
        self._snap = {**(resumed or _snapshot(0, 0)), "workers": list(self._known), "handed": 0}
        self._next_snap = (self._snap["tasks_done"] // self._every + 1) * self._every if self._every else float("inf")

    def _next_index(self):
        index = super()._next_index()
        n, t = self._every, self._send_idx  # each worker's last task before every n-th asks for a snapshot
        return _SnapshotRequest(index) if n and t % n >= n - self._num_workers else index

    def _try_put_index(self) -> None:
        resumed, self._continue_from = self._continue_from, None
        if resumed is not None:  # a resumed epoch's first task: go on where the saved one stood
            self._send_idx = self._rcvd_idx = resumed["tasks_done"]
            self._skip(resumed["tasks_done"])
            self._ahead = set(resumed["done_ahead"])  # the next task goes to the worker it went to then:
            deque(itertools.islice(self._worker_queue_idx_cycle, resumed["next_worker"] or 0), maxlen=0)
        while self._send_idx in self._ahead:  # had out of order before the save: drawn, never sent
            self._ahead.discard(self._send_idx)
            if next(self._sampler_iter, _END) is _END:
                return
            self._send_idx += 1  # no _task_info entry: _next_data's skip loop steps over it
        super()._try_put_index()

    def _get_data(self):
        r, idx, shipped = unship(super()._get_data(), "state")
        worker, state = shipped or (None, _STALE)  # a batch that came without its state leaves the worker's behind
        if isinstance(idx, _ResumeIteration | _SnapshotRequest):  # a worker's state between epochs
            self._known[worker] = state
        elif idx in self._task_info:  # not a stale result of an earlier epoch; a replica's end: its last state,
            self._pending[self._task_info[idx][0]].append((isinstance(r[1], _IterableDatasetStopIteration), state))
            self._process_ends(self._task_info[idx][0])  # once its batches are had
        return r

    def _process_ends(self, worker_id: int) -> None:
        if self._pending[worker_id] and self._pending[worker_id][0][0]:
            self._known[worker_id] = self._pending[worker_id].popleft()[1]

    def _process_data(self, data, worker_id: int):
        state = self._known[worker_id] = self._pending[worker_id].popleft()[1]  # its batches go out in its order
        self._process_ends(worker_id)
        if self._dataset_kind == _DatasetKind.Iterable and isinstance(state, dict):
            self._stateless |= state["dataset"] is None and state["iterator"] is None
        if isinstance(data, ExceptionWrapper):
            self._errors.append(self._handed)
        self._handed += 1
        return super()._process_data(data, worker_id)

    def __next__(self):
        try:
            return super().__next__()
        except StopIteration:  # persistent workers' states start the next epoch: ask each for its own, once
            if self._persistent_workers and not self._exhausted:
                for index_queue in self._index_queues:
                    index_queue.put(_SnapshotRequest())
                for _ in self._index_queues:  # nothing else is in flight at an epoch's end: each answers once
                    self._get_data()
            self._exhausted = True
            raise
        finally:
            if (self._rcvd_idx >= self._next_snap or not self._in_order) and not self._stateless:
                self._take_snapshot()

    def _take_snapshot(self) -> None:
        """The consumer's point as the snapshot, if every worker's state after its last batch there is known."""
        k = self._rcvd_idx  # it may point at a task already had out of order, or skipped: step past those
        while (k < self._send_idx and k not in self._task_info) or k in self._ahead:
            k += 1
        if any(w is _STALE for w in self._known):
            return  # try again at the next batch
        map_style = self._dataset_kind == _DatasetKind.Map  # (an iterable dataset's tasks name no sample)
        ahead = [t for t in range(k + 1, self._send_idx) if map_style and t not in self._task_info]  # had already
        snapshot = _snapshot(k, self._num_yielded, list(self._known), None, self._task_info.get(k, (None,))[0], ahead)
        self._snap = {**snapshot, "handed": self._handed}
        self._next_snap = (self._rcvd_idx // self._every + 1) * self._every

    def _state_dict(self, loader) -> dict:
        """Where this epoch stands: the last snapshot, and the tasks handed out since."""
        if self._worker_method == "thread" and self._dataset_kind == _DatasetKind.Iterable:
            raise ValueError("state_dict() can't save an IterableDataset shared by thread workers: their replicas "
                             "are one object; use worker_method='multiprocessing'")
        if self._stateless and not self._in_order:
            raise ValueError("state_dict() can't save in_order=False over an IterableDataset without state_dict() and "
                             "load_state_dict(): give the dataset (or its iterator) both, or use in_order=True")
        snap = self._snap  # read once: state_dict() may run in another thread
        since = snap["handed"]
        return self._state(loader, {k: snap[k] for k in SNAPSHOT}, self._handed - since,
                           [e - since for e in self._errors if e >= since])


# --- DataLoader.state_dict() and load_state_dict() ----------------------------------------------------------


def _shape(loader) -> dict:
    """What a state must match: it resumes only a loader built like the one that saved it."""
    return dict(num_workers=loader.num_workers, worker_method=loader.worker_method, dataset_len=_len_or_none(
        loader.dataset), batch_size=loader.batch_size, sampler=type(loader.sampler).__name__, generator_kinds=
                generator_kinds(generators_of(loader)))


def _state(loader, start: dict, **rest) -> dict:
    """A state as plain JSON values: the streams' states are converted here, off the workers' path."""
    def plain(w):
        return w and {**w, "streams": _plain(w["streams"])}

    rest["workers"] = rest["workers"] and [plain(w) for w in rest["workers"]]
    return {"version": STATE_VERSION, **_shape(loader), **start, "generators": _plain(start["generators"]),
            **rest, "main": plain(rest["main"])}


def _len_or_none(obj) -> int | None:
    try:
        return len(obj)
    except (TypeError, NotImplementedError):  # no __len__, or an IterableDataset's that raises
        return None


def loader_state_dict(loader) -> dict:
    """``DataLoader.state_dict()``: the current iterator's state, or the next epoch's start between epochs."""
    if not loader.stateful:
        raise RuntimeError("state_dict() needs DataLoader(..., stateful=True): only then is what resuming needs kept")
    if loader._resume_state is not None:  # loaded and not iterated yet: still the point to resume from
        return copy.deepcopy(loader._resume_state)
    it = loader._last_iterator
    if it is not None and not it._exhausted:
        return it._state_dict(loader)
    # Between epochs: the next epoch's start, the snapshot with k = 0. Its draws come from the generators now.
    # Persistent workers carry on with their base_seed and their streams; with no workers, the dataset's state.
    persistent = it is not None and it is loader._iterator
    start = epoch_start(loader, it._base_seed if persistent else None)
    main = {**capture(None, loader.dataset), "streams": None} if loader.num_workers == 0 else None
    return _state(loader, start, **_snapshot(0, 0, it._known if persistent else None, main), replay=0, errors=[],
                  stateless=it is not None and it._stateless)


def load_loader_state(loader, state: dict) -> None:
    """``DataLoader.load_state_dict()``: check ``state`` and leave it for the next iterator to resume from."""
    if not loader.stateful:
        raise RuntimeError("load_state_dict() needs DataLoader(..., stateful=True): only its iterator resumes")
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"load_state_dict expects what state_dict() returned (version {STATE_VERSION}), but got "
                         f"{state.get('version') if isinstance(state, dict) else type(state).__name__!r}")
    if set(state) != set(KEYS):
        raise ValueError(f"state_dict lacks the keys {sorted(set(KEYS) - set(state))} and has unknown ones "
                         f"{sorted(set(state) - set(KEYS))}: pass what DataLoader.state_dict() returned")
    for key, have in _shape(loader).items():
        if state[key] != have:
            raise ValueError(f"this state_dict was saved with {key}={state[key]!r} but this DataLoader has {key}="
                             f"{have!r}: a state resumes only the loader it came from, so resume with the same {key}")
    if state["stateless"] and state["replay"]:
        name = type(getattr(loader.dataset, "_datapipe", loader.dataset)).__name__  # a datapipe's, not its wrapper's
        warnings.warn(f"{name} has no state_dict()/load_state_dict() (nor has its iterator): the epoch starts again "
                      f"and the {state['replay']} batches had are fetched and dropped; give it both", stacklevel=3)
    if loader._iterator is not None:  # persistent workers of an older epoch: start afresh
        loader._iterator._shutdown_workers()
    loader._iterator, loader._last_iterator, loader._resume_state = None, None, copy.deepcopy(state)
