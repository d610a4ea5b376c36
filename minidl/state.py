"""Resuming mid-epoch: ``DataLoader(stateful=True)``'s ``state_dict()`` and ``load_state_dict()``.

PyTorch's DataLoader has no ``state_dict``; torchdata's ``StatefulDataLoader`` adds one. Here it is a
layer, as tracing is: ``DataLoader._get_iterator`` puts this module's iterator subclasses on top of the
loader's own when ``stateful=True``, and hands each worker its side through ``_WorkerOptions``. With
``stateful=False`` none of this runs. See NOTE [ Resuming mid-epoch ] below.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import queue
import random
import sys
import weakref
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from minidl import _random
from minidl.fetch import _DatasetKind
from minidl.worker import _IterableDatasetStopIteration, _ResumeIteration, get_worker_info

# NOTE [ Resuming mid-epoch ]
#
# Three things decide the rest of an epoch, and a LoaderState saves each:
#   1. the random draws made as the epoch starts (base_seed, the sampler's permutation): the generators'
#      states from just before them are kept, and on resume the same draws are made again (`replaying`);
#   2. how far the consumer got, tasks_done: the resumed sampler skips that many index batches unfetched,
#      and round-robin dispatch goes on with next_worker, the worker the next batch was sent to;
#   3. each worker's WorkerState (its random streams, its IterableDataset replica's own state_dict(),
#      whether that replica ran out) just before the first batch the consumer has not had.
#
# Workers prefetch, so by the time state_dict() asks they are past that batch. Each keeps the state it had
# before each of its recent tasks, and answers for the one asked:
#
#   main process (_StatefulMultiIter)                   worker i (_worker_loop, with _StatefulWorker's wrappers)
#   ---------------------------------                   ------------------------------------------------------
#   state_dict(): k = _rcvd_idx                          _StatefulTaskQueue.get(): before each task (idx, indices),
#     _StateRequest(k) ------> index_queues[i] ------>     record (idx, WorkerState); answer a _StateRequest(k) with
#                                                          the state before its first task >= k (now, if none)
#     _receive() files batches arriving meanwhile  <---- (request, (i, WorkerState)) on worker_result_queue
#     a worker whose end (_EndWithStates) arrived  <---- _StatefulResultQueue.put(): an exhausted replica's end
#     at or after k: its state from those it sent          carries the states it recorded
#
#   load_state_dict() -> the next iterator: replays the draws (1), skips and dispatches on (2) at its first
#   _try_put_index, and gives worker i its saved WorkerState, restored after worker_init_fn (which may reseed)
#   when the worker makes its first fetcher. A worker whose replica had run out gets a fetcher that has ended:
#   its first task answers with _IterableDatasetStopIteration, and the loader stops it as torch always does.
#   With num_workers=0 the main process's own streams and dataset are the one WorkerState (LoaderState.main).
#
# Tracing composes: when both are on, tracing's worker side is applied first, so the fetcher this layer's
# factory wraps is the traced one, and the traced queues pass a request and its answer through untouched.

STATE_VERSION = 3


@dataclass
class WorkerState:
    """One worker's state just before a task (or the main process's, with no workers): restored, it runs it again."""

    ended: bool = False  # its IterableDataset replica had run out this epoch
    thread: bool = False  # the streams are a thread worker's own (its _RNG), not the process's global ones
    random: Any = None  # Python's random state
    numpy: Any = None  # NumPy's: the legacy global state, or a thread worker's Generator state
    torch: bytes | None = None  # torch's generator state, as bytes (a tensor would travel through shared memory)
    dataset: Any = None  # the dataset's own state_dict(), if it has one


def capture_worker_state(rng, dataset: Any, ended: bool = False) -> WorkerState:
    """The random streams a worker's dataset may draw from, and the dataset's own state if it has one.

    ``rng`` is a thread worker's ``_RNG``; ``None`` (a process worker, or the main process with no
    workers) saves the process's global streams.
    """
    dataset_state = dataset.state_dict() if hasattr(dataset, "state_dict") else None
    if rng is not None:  # a thread worker must not touch the global streams: its own three instead
        torch_state = None if rng.torch_generator is None else _get(rng.torch_generator)
        return WorkerState(ended, True, rng.random_generator.getstate(), rng.numpy_generator.bit_generator.state,
                           torch_state, dataset_state)
    torch_state = sys.modules["torch"].get_rng_state().numpy().tobytes() if "torch" in sys.modules else None
    return WorkerState(ended, False, random.getstate(), np.random.get_state(), torch_state, dataset_state)


def restore_worker_state(state: WorkerState, rng, dataset: Any) -> None:
    """Put back what ``capture_worker_state`` saved (``dataset=None``: leave the dataset as it is)."""
    if state.thread:
        rng.random_generator.setstate(state.random)
        rng.numpy_generator.bit_generator.state = state.numpy
        if rng.torch_generator is not None and state.torch is not None:
            _set(rng.torch_generator, state.torch)
    elif state.random is not None:
        random.setstate(state.random)
        np.random.set_state(state.numpy)
        if state.torch is not None:
            import torch

            torch.set_rng_state(torch.frombuffer(bytearray(state.torch), dtype=torch.uint8))
    if dataset is not None and state.dataset is not None:
        dataset.load_state_dict(state.dataset)


def _state_before(states, task_idx: int) -> WorkerState | None:
    """Of ``(task idx, state before it)`` pairs in task order, the state before the first task >= ``task_idx``."""
    return next((state for idx, state in states if idx >= task_idx), None)


@dataclass
class LoaderState:
    """Everything ``DataLoader.state_dict()`` saves; it returns this as a plain dict (``to_dict``)."""

    num_workers: int
    worker_method: str
    dataset_len: int | None  # len(dataset), where it has one: a state belongs to its dataset
    batch_size: int | None
    sampler: str  # the sampler's class: RandomSampler (shuffle=True), SequentialSampler, ...
    tasks_done: int  # index batches the consumer got (or skipped past): the resumed sampler skips them
    num_yielded: int
    generators: list  # the loader's generators just before the epoch's first draws (see replaying)
    base_seed: int | None  # None: draw it again from the replayed generators
    draws_base_seed: bool
    next_worker: int | None = None  # where round-robin dispatch continues
    workers: list[WorkerState | None] | None = None  # each worker's state just before its next batch
    main: WorkerState | None = None  # num_workers=0: the main process's streams and dataset
    generator_kinds: list | None = None  # generator_kinds(): which generators `generators` holds the states of
    version: int = STATE_VERSION

    def to_dict(self) -> dict:
        return asdict(self)  # WorkerStates become dicts too

    @classmethod
    def from_dict(cls, state: dict, loader) -> LoaderState:
        """Check ``state`` against ``loader`` and return it as a LoaderState; ValueError naming what is wrong."""
        if not isinstance(state, dict):
            raise ValueError(f"load_state_dict expects the dict state_dict() returned, but got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state_dict version {state.get('version')!r} is not {STATE_VERSION}")
        names = [f.name for f in fields(cls)]
        for f in fields(cls):
            if f.name not in state and f.default is not None:
                raise ValueError(f"state_dict is missing the key {f.name!r}: pass what DataLoader.state_dict() "
                                 "returned")
        unknown = sorted(set(state) - set(names))
        if unknown:
            raise ValueError(f"state_dict has unknown key(s) {unknown}: was it saved by DataLoader.state_dict()?")
        new = cls(**state)
        new.workers = None if new.workers is None else [_worker_state(w, "workers") for w in new.workers]
        new.main = _worker_state(new.main, "main")
        for key, have in (("num_workers", loader.num_workers), ("worker_method", loader.worker_method),
                          ("dataset_len", _len_or_none(loader.dataset)), ("batch_size", loader.batch_size),
                          ("sampler", type(loader.sampler).__name__)):
            if getattr(new, key) != have:
                raise ValueError(
                    f"this state_dict was saved with {key}={getattr(new, key)!r} but this DataLoader has "
                    f"{key}={have!r}: a state resumes only the loader it came from, so resume with "
                    f"{key}={getattr(new, key)!r}"
                )
        kinds = generator_kinds(generators_of(loader))
        if new.generator_kinds is not None and new.generator_kinds != kinds:
            raise ValueError(
                f"this state_dict was saved by a loader drawing from {_describe_kinds(new.generator_kinds)}, but this "
                f"DataLoader draws from {_describe_kinds(kinds)}: its batches would follow another permutation. Resume "
                "with the same generator= (and sampler generators) as the loader that saved it"
            )
        iterable = loader._dataset_kind == _DatasetKind.Iterable
        if iterable and new.tasks_done > 0 and not hasattr(loader.dataset, "load_state_dict"):
            raise ValueError(
                f"can't resume {type(loader.dataset).__name__} mid-epoch: an IterableDataset resumes only if it "
                "has state_dict() and load_state_dict() (without them the epoch would start again from its first "
                "item and repeat what was already consumed)"
            )
        length = None if iterable else _len_or_none(loader._index_sampler)
        if not 0 <= new.num_yielded <= new.tasks_done or (length is not None and new.tasks_done > length):
            raise ValueError(f"state_dict counters out of range: tasks_done={new.tasks_done}, num_yielded="
                             f"{new.num_yielded}, for an epoch of {length} batches")
        if new.workers is not None and len(new.workers) != new.num_workers:
            raise ValueError(f"state_dict key 'workers' has {len(new.workers)} entries for {new.num_workers} workers")
        if new.next_worker is not None and not 0 <= new.next_worker < max(new.num_workers, 1):
            raise ValueError(f"state_dict key 'next_worker' is {new.next_worker}, out of range for "
                             f"{new.num_workers} workers")
        return new


def _worker_state(saved: dict | WorkerState | None, key: str) -> WorkerState | None:
    if saved is None or isinstance(saved, WorkerState):
        return saved
    try:
        return WorkerState(**saved)
    except TypeError:
        raise ValueError(f"state_dict key {key!r} holds {saved!r}, not a worker state DataLoader.state_dict() "
                         "saved") from None


def _len_or_none(obj) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


# --- the worker side: handed to each worker in _WorkerOptions.layers -------------------------------------


@dataclass(frozen=True)
class _StateRequest:
    """Asks a worker for its state just before its first task numbered ``task_idx`` or later."""

    task_idx: int


@dataclass(frozen=True)
class _EndWithStates(_IterableDatasetStopIteration):
    """An exhausted replica's end, carrying the worker's recent states: it gets no more requests, yet
    ``state_dict()`` may still need its state before a batch it sent that the consumer has not taken."""

    states: tuple = ()  # (task idx, WorkerState before it), in task order


@dataclass(frozen=True)
class _StatefulWorker:
    """The worker side of resume: called in the worker, it wraps the queues and the fetcher factory."""

    depth: int  # states kept: one per task that can be in flight, and one more
    resume: WorkerState | None = None  # restored when the worker makes its first fetcher

    def __call__(self, worker_id: int, index_queue, data_queue, create_fetcher):
        keeper = _StateKeeper(worker_id, self, data_queue, create_fetcher)
        return _StatefulTaskQueue(index_queue, keeper), _StatefulResultQueue(data_queue, keeper), keeper.create_fetcher


class _StateKeeper:
    """In a worker: its state before each recent task, and the fetcher it reads ``ended`` from."""

    def __init__(self, worker_id: int, layer: _StatefulWorker, data_queue, create_fetcher) -> None:
        self.worker_id, self.data_queue, self._create_fetcher = worker_id, data_queue, create_fetcher
        self.resume = layer.resume
        self.before: deque[tuple[int, WorkerState]] = deque(maxlen=layer.depth)
        self.fetcher = None
        self.ended = False  # this epoch's replica has run out (the loop's iteration_end)

    def create_fetcher(self, kind, dataset, auto_collation, collate_fn, drop_last):
        if self.resume is not None:  # the first fetcher, after worker_init_fn (which may reseed): the saved state wins
            restore_worker_state(self.resume, get_worker_info().rng, dataset)
        self.fetcher = self._create_fetcher(kind, dataset, auto_collation, collate_fn, drop_last)
        if self.resume is not None and self.resume.ended:  # its replica had run out: its first task says so
            self.fetcher.ended = True
        self.resume = None
        return self.fetcher

    def snapshot(self) -> WorkerState:
        info = get_worker_info()
        return capture_worker_state(info.rng, info.dataset, self.ended or getattr(self.fetcher, "ended", False))

    def new_epoch(self) -> None:
        self.before.clear()  # task numbers start again at 0: old states would mislead
        self.ended = False


class _StatefulTaskQueue:
    """A worker's index queue that records the state before each task and answers ``_StateRequest``s."""

    def __init__(self, queue, keeper: _StateKeeper) -> None:
        self.queue, self.keeper = queue, keeper

    def get(self, timeout=None):
        r = self.queue.get(timeout=timeout)
        if isinstance(r, _StateRequest):
            state = _state_before(self.keeper.before, r.task_idx) or self.keeper.snapshot()
            self.keeper.data_queue.put((r, (self.keeper.worker_id, state)))
            raise queue.Empty  # nothing for the loop: it checks on its parent and asks again
        if isinstance(r, _ResumeIteration):
            self.keeper.new_epoch()
        elif isinstance(r, tuple):  # a task (idx, indices)
            self.keeper.before.append((r[0], self.keeper.snapshot()))
        return r


class _StatefulResultQueue:
    """A worker's result queue that sends an exhausted replica's end with the states it recorded."""

    def __init__(self, queue, keeper: _StateKeeper) -> None:
        self.queue, self.keeper = queue, keeper

    def put(self, r) -> None:
        idx, data = r
        if isinstance(data, _IterableDatasetStopIteration):
            self.keeper.ended = True
            r = (idx, _EndWithStates(data.worker_id, tuple(self.keeper.before)))
        self.queue.put(r)

    def __getattr__(self, name):  # cancel_join_thread, close: the queue's own
        return getattr(self.queue, name)


# --- the generators an epoch draws from -----------------------------------------------------------


def generators_of(loader) -> list:
    """The generators the loader and its samplers draw from; ``None`` stands for the global RNG.

    The global one is included only when something draws from it (no generator given), so a
    loader driven by a NumPy generator never imports torch to read torch's global state.
    """
    found: dict[int, Any] = {}
    uses_global = False
    for owner in (loader, loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if not hasattr(owner, "generator"):
            continue
        g = owner.generator
        if g is None:
            uses_global = True
        else:
            found.setdefault(id(g), g)
    return [None, *found.values()] if uses_global else list(found.values())


def _global_rng_state():
    if _random.HAS_TORCH:
        import torch

        return torch.get_rng_state().numpy().tobytes()
    return np.random.get_state()


def _set_global_rng_state(state) -> None:
    if _random.HAS_TORCH:
        import torch

        torch.set_rng_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    else:
        np.random.set_state(state)


def _get(g):
    if g is None:
        return _global_rng_state()
    return g.bit_generator.state if isinstance(g, np.random.Generator) else g.get_state().numpy().tobytes()


def _set(g, state) -> None:
    if g is None:
        _set_global_rng_state(state)
    elif isinstance(g, np.random.Generator):
        g.bit_generator.state = state
    else:
        import torch

        g.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


def generator_kinds(generators: list) -> list[str]:
    """What each generator of ``generators_of`` is: "global" (None), "numpy" or "torch"."""
    return ["global" if g is None else "numpy" if isinstance(g, np.random.Generator) else "torch" for g in generators]


def _describe_kinds(kinds: list[str]) -> str:
    names = {"global": "the global random state", "numpy": "a numpy.random.Generator", "torch": "a torch.Generator"}
    return " and ".join(names[k] for k in kinds) or "no generator"


def capture_generators(generators: list) -> list:
    """The current state of each generator (``None``: the global one)."""
    return [_get(g) for g in generators]


@contextmanager
def replaying(generators: list, states: list):
    """Run the block with ``generators`` set back to ``states``.

    Explicit generators belong to the loader, so they stay where the replayed draws leave them,
    as in the run being resumed. The global generator is shared with the training loop: it is set
    back afterwards, so resuming the loader doesn't disturb an RNG state the caller restored.
    """
    global_now = _global_rng_state() if None in generators else None
    for g, state in zip(generators, states):
        _set(g, state)
    try:
        yield
    finally:
        if None in generators:
            _set_global_rng_state(global_now)


# --- the main side: iterator subclasses chosen by DataLoader._get_iterator ----------------------------

_END = object()  # marks an exhausted iterator without catching StopIteration


@functools.cache
def stateful_iterator(base: type) -> type:
    """``base``, one of the loader's iterator classes (traced or not), with the resume layer on top."""
    from minidl.dataloader import _SingleProcessDataLoaderIter

    layer = _StatefulSingleIter if issubclass(base, _SingleProcessDataLoaderIter) else _StatefulMultiIter
    return type(f"_Stateful{base.__name__.lstrip('_')}", (layer, base), {"__doc__": layer.__doc__})


class _StatefulIterMixin:
    """What both stateful iterators share: the epoch's opening draws recorded or replayed, its end noticed."""

    def _take_resume_state(self, loader) -> LoaderState | None:
        """Before the iterator starts: the state load_state_dict() left (None: a fresh epoch)."""
        self._resumed, loader._resume_state = loader._resume_state, None
        self._generators = generators_of(loader)
        # The generators' states before this epoch's first draw: saved as they are, or the saved ones to replay.
        self._generator_states = capture_generators(self._generators) if self._resumed is None \
            else self._resumed.generators
        self._epoch_draws_base_seed = True  # persistent workers' later epochs reuse the first base_seed
        self._exhausted = False  # state_dict() after the end of an epoch saves the start of the next
        loader._last_iterator = weakref.ref(self)
        return self._resumed

    def _draw_base_seed(self, loader) -> int:
        drawn = super()._draw_base_seed(loader) if self._resumed is None or self._resumed.draws_base_seed else None
        if self._resumed is None or self._resumed.base_seed is None:
            return drawn
        return self._resumed.base_seed  # a persistent loader's later epoch: its workers kept the first one

    def __next__(self):
        try:
            return super().__next__()
        except StopIteration:
            self._exhausted = True
            raise


class _StatefulSingleIter(_StatefulIterMixin):
    """``num_workers=0``, resumable: the main process's streams and dataset are saved with the counters."""

    def __init__(self, loader) -> None:
        resumed = self._take_resume_state(loader)
        if resumed is None:
            super().__init__(loader)
            return
        with replaying(self._generators, self._generator_states):
            super().__init__(loader)  # base_seed drawn again; the fetcher made on the saved dataset state
            for _ in range(resumed.tasks_done):  # the batches the consumer had: drawn, not fetched
                next(self._sampler_iter, None)
            if resumed.tasks_done > 0:  # the next draw too, while replayed (a sampler may draw in chunks)
                first = next(self._sampler_iter, _END)
                self._sampler_iter = iter(()) if first is _END else itertools.chain([first], self._sampler_iter)
        if resumed.main is not None:  # after the replay, which sets the global generator back
            restore_worker_state(resumed.main, None, None)
        self._num_yielded = resumed.num_yielded

    def _create_fetcher(self):
        main = self._resumed.main if self._resumed is not None else None
        if main is not None and main.dataset is not None:  # before iter(dataset) reads it
            self._dataset.load_state_dict(main.dataset)
        fetcher = super()._create_fetcher()
        if main is not None and main.ended:
            fetcher.ended = True
        return fetcher

    def _state_dict(self, loader) -> LoaderState:
        dataset = self._dataset if self._dataset_kind == _DatasetKind.Iterable else None
        main = capture_worker_state(None, dataset, getattr(self._dataset_fetcher, "ended", False))
        return _loader_state(loader, self, tasks_done=self._num_yielded, main=main)


class _StatefulMultiIter(_StatefulIterMixin):
    """``num_workers > 0``, resumable: each worker keeps its recent states; ``state_dict()`` asks for one."""

    def __init__(self, loader) -> None:
        resumed = self._take_resume_state(loader)
        self._continue_from = resumed  # taken by the first _try_put_index
        with replaying(self._generators, self._generator_states) if resumed is not None else nullcontext():
            super().__init__(loader)  # starts the workers and sends the first tasks
        if resumed is not None:
            self._num_yielded = resumed.num_yielded

    def _worker_options(self, worker_id: int):
        options = super()._worker_options(worker_id)
        resume = self._resumed.workers[worker_id] if self._resumed is not None and self._resumed.workers else None
        layer = _StatefulWorker(depth=self._prefetch_factor * self._num_workers + 1, resume=resume)
        return dataclasses.replace(options, layers=(*options.layers, layer))

    def _reset(self, loader, first_iter: bool = False) -> None:
        if not first_iter:  # a new epoch on persistent workers: its draws start from here
            self._generator_states = capture_generators(self._generators)
            self._epoch_draws_base_seed = False
        self._ended_at = {}  # worker id -> (task idx of its end, the states it sent with it), this epoch
        self._exhausted = False
        super()._reset(loader, first_iter)

    def _try_put_index(self) -> None:
        if self._continue_from is not None:  # a resumed epoch's first task: go on where the saved one stood
            state, self._continue_from = self._continue_from, None
            self._send_idx = self._rcvd_idx = state.tasks_done
            for _ in range(state.tasks_done):  # the batches the consumer had: drawn, not fetched
                next(self._sampler_iter, None)
            for _ in range(state.next_worker or 0):  # the next task goes to the worker the saved one sent it to
                next(self._worker_queue_idx_cycle)
        super()._try_put_index()

    def _receive(self):
        idx, data = super()._receive()
        if isinstance(data, _EndWithStates):
            self._ended_at[data.worker_id] = (idx, data.states)
        return idx, data

    def _ask_workers_for_state(self, k: int) -> dict[int, WorkerState]:
        """Each active worker's state just before its first task numbered ``k`` or later."""
        if not self._in_order:
            raise ValueError("state_dict() needs in_order=True: out of order, what comes next is not reproducible")
        if self._shutdown:
            raise RuntimeError("this iterator's workers are shut down (an error or a timeout): nothing to save")
        if self._worker_method == "thread" and self._dataset_kind == _DatasetKind.Iterable:
            raise ValueError("state_dict() can't save an IterableDataset shared by thread workers: their "
                             "replicas are one object; use worker_method='multiprocessing'")
        pending = {i for i, active in enumerate(self._workers_status) if active}
        for i in pending:
            self._index_queues[i].put(_StateRequest(k))
        states = {}
        while pending:
            idx, data = self._receive()  # batches in flight are filed as the loop would file them
            if isinstance(idx, _StateRequest):
                worker_id, state = data
                states[worker_id] = state
                pending.discard(worker_id)
        return states

    def _state_dict(self, loader) -> LoaderState:
        """Where this epoch stands: the workers' states before the first batch not handed out yet."""
        k = self._rcvd_idx
        states = self._ask_workers_for_state(k)
        for worker_id, (end_idx, before) in self._ended_at.items():
            # Its end has arrived but the consumer hasn't reached it: batches it sent before are still to come,
            # so it resumes from its state before the first of them. Only an end before the cut ends it.
            if end_idx >= k:
                states[worker_id] = _state_before(before, k) or WorkerState(ended=True)
        return _loader_state(
            loader, self, tasks_done=k,
            workers=[states.get(i, WorkerState(ended=True)) for i in range(self._num_workers)],  # not asked: ended
            next_worker=self._task_info[k][0] if k in self._task_info else None,
        )


# --- DataLoader.state_dict() and load_state_dict() ----------------------------------------------------


def loader_state_dict(loader) -> dict:
    """``DataLoader.state_dict()``: the newest iterator's state, or the next epoch's start between epochs."""
    if not loader.stateful:
        raise RuntimeError("state_dict() needs DataLoader(..., stateful=True): only then does the loader keep what "
                           "resuming needs (the epoch's opening draws, each worker's random state before each batch)")
    if loader._resume_state is not None:  # loaded and not iterated yet: still the point to resume from
        return loader._resume_state.to_dict()
    it = loader._last_iterator() if loader._last_iterator is not None else None
    if it is None or it._exhausted:  # between epochs: the next one starts from here
        return _loader_state(loader, it, tasks_done=0).to_dict()
    return it._state_dict(loader).to_dict()


def load_loader_state(loader, state: dict) -> None:
    """``DataLoader.load_state_dict()``: check ``state`` and leave it for the next iterator to resume from."""
    if not loader.stateful:
        raise RuntimeError("load_state_dict() needs DataLoader(..., stateful=True): the stateful iterator is the "
                           "one that resumes")
    resume = LoaderState.from_dict(state, loader)  # ValueError, naming the key, if it doesn't fit
    if loader._iterator is not None:  # persistent workers of an older epoch: start afresh
        loader._iterator._shutdown_workers()
        loader._iterator = None
    loader._resume_state = resume


def _loader_state(loader, it, tasks_done: int, **extra) -> LoaderState:
    """The one place a LoaderState is built: from an iterator mid-epoch, or between epochs.

    Between epochs (no iterator, or an exhausted one) the next epoch's draws start from the
    generators as they are now; persistent workers keep their base_seed and their streams.
    """
    between = it is None or it._exhausted
    if between:
        generators, base_seed, draws = capture_generators(generators_of(loader)), None, True
        if it is not None and it is loader._iterator:  # persistent: the workers carry their streams on
            states = it._ask_workers_for_state(it._rcvd_idx)
            extra.update(workers=[states.get(i) for i in range(loader.num_workers)])
            base_seed, draws = it._base_seed, False
    else:
        generators, base_seed, draws = it._generator_states, it._base_seed, it._epoch_draws_base_seed
    return LoaderState(num_workers=loader.num_workers, worker_method=loader.worker_method,
                       dataset_len=_len_or_none(loader.dataset), batch_size=loader.batch_size,
                       sampler=type(loader.sampler).__name__, tasks_done=tasks_done,
                       num_yielded=0 if between else it._num_yielded, generators=generators,
                       generator_kinds=generator_kinds(generators_of(loader)), base_seed=base_seed,
                       draws_base_seed=draws, **extra)
