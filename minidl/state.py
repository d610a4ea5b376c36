"""Resuming mid-epoch: ``DataLoader(stateful=True)``'s ``state_dict()`` and ``load_state_dict()``.

PyTorch's DataLoader has no ``state_dict``. torchdata's ``StatefulDataLoader`` adds one, and this layer
follows its contracts (``snapshot_every_n_steps``, a JSON-safe state). It plugs in as tracing does.
``DataLoader._get_iterator`` puts this module's iterator subclasses on top of the loader's own, and each
worker gets its side in ``_WorkerOptions.layers``. With ``stateful=False`` none of this runs.

What it promises. A loader built like the one that saved the state, given ``load_state_dict(state)``,
hands out exactly the batches the uninterrupted loader would have handed out after the save, in the same
order, with each worker's random streams where they stood. That holds mid-epoch and between epochs, after
a second or third resume, after errors the training loop caught and went on from (a caught error is
never fetched again), and when the resumed ``iter()`` itself fails: the loader keeps the state until an
iterator has started from it, so ``iter()`` can simply be tried again. With ``in_order=False`` the
batches come in whatever order the workers finish them, but across the save each batch comes exactly
once. Persistent workers keep one ``base_seed`` for all their epochs, and a resumed persistent loader
keeps it too; a state saved by a persistent loader also loads into a non-persistent one. An
``IterableDataset`` without ``state_dict()``/``load_state_dict()`` (both, as torchdata's ``Stateful``)
can't be put back where it stood: its epoch starts again with the same seeds and the batches already had
are fetched and dropped, with a warning that says so (out of order, each worker drops the batches the
consumer had from it). The state is a dict of plain JSON-safe values, checked against the loader on load.
"""

from __future__ import annotations

import base64
import copy
import ctypes
import dataclasses
import functools
import itertools
import pickle
import random
import sys
import warnings
from collections import deque, namedtuple
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from minidl import _random
from minidl._utils import ExceptionWrapper
from minidl.fetch import _DatasetKind
from minidl.worker import (
    _is_iter_datapipe,
    _IterableDatasetStopIteration,
    _ResumeIteration,
    get_worker_info,
    ship,
    unship,
)

# NOTE [ Resuming mid-epoch ]
#
# Three things decide the rest of an epoch. A LoaderState saves each of them:
#   1. The random draws made as the epoch starts: base_seed and the sampler's permutation.
#      The state keeps the generators as they were just before those draws.
#      On resume, the same draws are made again from there (`replaying`).
#   2. How far the consumer got: tasks_done, the number of index batches it has had.
#      The resumed sampler skips that many index batches without fetching them.
#      Round-robin dispatch goes on with next_worker, the worker the next batch was sent to.
#      Out of order (in_order=False), the consumer may also have had batches past tasks_done.
#      done_ahead lists them, and the resumed loader skips them too: no batch comes twice, none is lost.
#   3. Each worker's WorkerState: its random streams, its dataset's own state_dict(), and whether its
#      IterableDataset replica ran out. It is the state just after the last of its batches the consumer had.
#
# Workers prefetch, so a worker's state right now is ahead of the consumer.
# So a worker's state rides with its batches, as tracing's events do.
# The main process files it when the consumer takes that batch:
#
#   worker i (_StatefulResultQueue.put)                 main process (_StatefulMultiIter)
#   -----------------------------------                 ---------------------------------
#   (idx, batch, {"state": WorkerState after it}) ----> _get_data: queued in _pending[i], in i's order
#   (idx, end, {"state": its last WorkerState})  -----> _ends[i]: counts once the consumer passes idx
#   ack of a new epoch (persistent), with its state --> _worker_states[i]
#                                                       _process_data(batch, i): _worker_states[i] = the
#                                                       state that came with the batch handed out
#
# Often a worker's state has not changed since it last sent one (a dataset that draws no random numbers).
# Then the worker ships only its id, and the main process reuses the state it last got from it (_last_sent).
# That costs a few bytes a batch instead of three streams' full states.
# The worker checks every batch whether its streams moved, so the check must be cheap.
# It compares each stream's fingerprint (_Fingerprints), not its JSON-safe state.
#
# state_dict() reads _worker_states. It never talks to a worker.
# With snapshot_every_n_steps=1 (torchdata's name and default), a worker ships its state with every task.
# With n > 1, it ships it only with the tasks just before every n-th one. The loader keeps a snapshot there.
# Between snapshots, some workers' known states are behind (`stale`).
# state_dict() then saves the last snapshot and how many tasks were handed out since it.
# Those tasks are batches and the errors the consumer caught.
# The resumed loader fetches them again and drops them (`replay`), errors included, as torchdata does.
# With n = 1 and in order, a worker's state is behind only after a batch that came without one (its dataset's
# state_dict() raised). So the snapshot is taken only while such a batch waits to be handed out (`_stateless`),
# and once as it arrives: the same snapshot as at every batch, without its cost at every batch.
# Out of order, which batches a replay would drop depends on timing.
# So out of order, every batch carries its worker's state (n = 1).
# A stateless IterableDataset has no state to carry. Out of order it is replayed per worker instead
# (`replay_in_workers`): each worker drops the batches the consumer had from it.
#
# What load_state_dict() sets up for the next iterator:
#   * it replays the opening draws (1);
#   * at its first _try_put_index, it skips what was had and dispatches on (2);
#   * worker i gets its saved WorkerState (3). The worker restores it when it makes its first fetcher,
#     after worker_init_fn, which may reseed. A worker whose replica had run out gets a fetcher that has ended.
# With num_workers=0, the main process's own streams and dataset are the one WorkerState (LoaderState.main).
# There tasks_done counts the index batches drawn, so a batch whose fetch raised is not fetched again.

STATE_VERSION = 5


# --- random streams, as JSON-safe values (the one place they are converted) --------------------------


def _global_generator():
    """What a sampler without a generator draws from: torch's default generator, or NumPy's global one."""
    if _random.HAS_TORCH:
        import torch

        return torch.default_generator
    return np.random.mtrand._rand


def rng_state(g) -> Any:
    """The state of a random.Random, NumPy RandomState or Generator, or torch.Generator, as plain JSON values."""
    if isinstance(g, random.Random):
        version, internal, gauss = g.getstate()
        return [version, list(internal), gauss]
    if isinstance(g, np.random.RandomState | np.random.Generator):
        state = g.get_state(legacy=False) if isinstance(g, np.random.RandomState) else g.bit_generator.state
        return _plain(state)
    return base64.b64encode(g.get_state().numpy().tobytes()).decode("ascii")  # a torch.Generator


def _plain(x):  # NumPy values (MT19937's key array) become Python ones
    return {k: _plain(v) for k, v in x.items()} if isinstance(x, dict) else np.asarray(x).tolist()


def set_rng_state(g, state) -> None:
    """Put back what ``rng_state(g)`` returned."""
    if isinstance(g, random.Random):
        g.setstate((state[0], tuple(state[1]), state[2]))
    elif isinstance(g, np.random.RandomState):
        g.set_state(state)
    elif isinstance(g, np.random.Generator):
        g.bit_generator.state = state
    else:
        import torch

        g.set_state(torch.frombuffer(bytearray(base64.b64decode(state)), dtype=torch.uint8))


def _streams(rng) -> list:
    """A worker's random, NumPy and torch streams: a thread worker's own ``_RNG``, or the process's global ones."""
    if rng is not None:
        return [rng.random_generator, rng.numpy_generator, rng.torch_generator]
    torch = sys.modules.get("torch")
    return [random._inst, np.random.mtrand._rand, None if torch is None else torch.default_generator]


@dataclass
class WorkerState:
    """One worker's state just after a batch (with no workers, the main process's).

    A worker restored to it goes on exactly from there.
    """

    ended: bool = False  # its IterableDataset replica had run out this epoch
    streams: list | None = None  # rng_state() of each of _streams(): random, NumPy, torch (None: not imported)
    dataset: Any = None  # a copy of the dataset's own state_dict(), if it has one
    iterator: Any = None  # a copy of iter(dataset)'s, if it has one (an IterableDataset may be its own iterator)


def capture_worker_state(rng, dataset: Any, ended: bool = False, fetcher=None) -> WorkerState:
    """Save the random streams a worker's dataset may draw from, and the state of the dataset and of its iterator.

    A dataset or iterator's state is saved only if it has one. It is copied, because a dataset may hand out
    its live dict.
    """
    it = getattr(fetcher, "dataset_iter", None)
    states = [copy.deepcopy(x.state_dict()) if _has_state(x) else None for x in (dataset, it)]
    if it is dataset:  # its own iterator: its state goes back after iter(dataset), which may reset it
        states[0] = None
    return WorkerState(ended, [None if g is None else rng_state(g) for g in _streams(rng)], *states)


def _has_state(x) -> bool:
    """Whether ``x`` has both ``state_dict`` and ``load_state_dict`` (torchdata's ``Stateful``).

    Only then is its state saved and restored. Otherwise it is resumed as stateless.
    """
    return hasattr(x, "state_dict") and hasattr(x, "load_state_dict")


def resumed_fetcher(state: WorkerState | None, dataset, create_fetcher):
    """Make the fetcher with ``create_fetcher()``, after putting the dataset's saved state back.

    The dataset's state goes back before ``iter(dataset)`` reads it.
    A replica that had run out gets a fetcher that has ended, so its first task says so.
    """
    if state is not None and state.dataset is not None:
        dataset.load_state_dict(state.dataset)
    fetcher = create_fetcher()
    if state is not None and state.iterator is not None:
        fetcher.dataset_iter.load_state_dict(state.iterator)
    if state is not None and state.ended:
        fetcher.ended = True
    return fetcher


class _Fingerprints:
    """A cheap, exact summary of a worker's streams: equal fingerprints mean the streams have not moved.

    It is read after every batch, so each stream is read the cheapest exact way (see ``_fingerprint_reader``), by
    readers made once. New ones are made when a stream is another object (torch imported since, say).
    """

    def __init__(self) -> None:
        self.streams: list | None = None  # the streams the readers read; held, so their addresses stay theirs
        self.readers: list = []

    def __call__(self, rng) -> list:
        streams = _streams(rng)
        if streams != self.streams:  # the same objects compare equal at once: a list compares items by identity first
            self.streams, self.readers = streams, [_fingerprint_reader(g) for g in streams]
        return [read() for read in self.readers]


def _fingerprint(g) -> Any:
    """One stream's fingerprint."""
    return _fingerprint_reader(g)()


def _fingerprint_reader(g) -> Callable[[], Any]:
    """A function that reads ``g``'s fingerprint now: the bytes of its words and position where they can be read
    in one go (Python's and NumPy's MT19937), else its state."""
    if g is None:
        return type(None)  # None() is None
    if isinstance(g, random.Random):  # its words and position, then the normal gauss() may keep
        offset = _python_random_offset()
        if offset is None:
            return g.getstate
        at = id(g) + offset  # the object is held by _Fingerprints.streams, so it stays at this address
        return lambda: (ctypes.string_at(at, _MT19937_BYTES), g.gauss_next)
    if isinstance(g, (np.random.RandomState, np.random.Generator)):
        # NumPy's global generator is a RandomState (the normal it may cache: see _caches_normal)
        bg = g._bit_generator if isinstance(g, np.random.RandomState) else g.bit_generator
        if isinstance(bg, np.random.MT19937) and _mt19937_readable():
            # MT19937's `state` property copies its 624 words out one at a time, which is slow.
            # The C struct behind its ctypes interface holds the same words, then the position.
            # Reading those bytes in one go is much cheaper, and just as exact.
            # g, held by _Fingerprints.streams, holds bg: the struct stays at this address
            return functools.partial(ctypes.string_at, bg.ctypes.state_address, _MT19937_BYTES)
        return lambda: pickle.dumps(bg.state)  # exact for any bit generator's state, arrays included
    return functools.partial(_torch_state_bytes, g.get_state, g.get_state().numel())  # a torch.Generator


def _torch_state_bytes(get_state: Callable[[], Any], size: int) -> bytes:
    state = get_state()  # a new uint8 tensor: its bytes are read in one go (through NumPy is a copy more)
    return ctypes.string_at(state.data_ptr(), size)


_MT19937_BYTES = 624 * 4 + 4  # uint32_t key[624]; int pos


@functools.cache
def _mt19937_readable() -> bool:
    """Whether the struct at ``MT19937.ctypes.state_address`` is laid out as ``_fingerprint_reader`` expects.

    NumPy does not promise that layout, so it is checked once against the ``state`` property.
    """
    bg = np.random.MT19937(1234)
    bg.random_raw(700)  # a position other than 0 or 624
    state = bg.state["state"]
    expected = np.asarray(state["key"], np.uint32).tobytes() + int(state["pos"]).to_bytes(4, sys.byteorder)
    return ctypes.string_at(bg.ctypes.state_address, _MT19937_BYTES) == expected


@functools.cache
def _python_random_offset() -> int | None:
    """Where a ``random.Random``'s words and position lie, in bytes from the object's address; None if not found.

    ``getstate()`` builds a tuple of 625 ints on each call, and comparing two of them costs as much again: over
    half of what the fingerprints cost a batch. CPython keeps the same values in the object itself (an int
    position, then 624 uint32 words), so they are read in one go, as MT19937's are. CPython does not promise
    that layout (nor that ``id()`` is an address), so the values ``getstate()`` gives are looked for once in a
    probe's bytes, and a second probe must read back its own.
    """
    probes = [random.Random(seed) for seed in (1234, 5678)]
    for g, draws in zip(probes, (700, 3)):
        for _ in range(draws):  # a position other than 0 or 624
            g.random()
    expected = [_python_random_bytes(g) for g in probes]
    size = type(probes[0]).__basicsize__
    found = ctypes.string_at(id(probes[0]), size).find(expected[0])
    if found < 0 or ctypes.string_at(id(probes[1]) + found, _MT19937_BYTES) != expected[1]:
        return None
    return found


def _python_random_bytes(g: random.Random) -> bytes:
    """A ``random.Random``'s position and words as CPython's struct holds them (see ``_python_random_offset``)."""
    *words, position = g.getstate()[1]
    return position.to_bytes(4, sys.byteorder) + np.asarray(words, np.uint32).tobytes()


def _caches_normal(state: WorkerState) -> bool:
    """Whether NumPy's legacy generator held a cached normal in ``state``.

    That generator draws normals in pairs and keeps the second one beside its words. Drawing the cached one
    changes nothing the fingerprint reads, so the fingerprint cannot tell. While a normal is cached, the worker
    therefore sends its whole state. One case stays unseen: a dataset's ``set_state()`` that leaves the words
    as they were and only adds a cached normal.
    """
    saved = state.streams[1] if state.streams else None
    return isinstance(saved, dict) and bool(saved.get("has_gauss"))


def restore_streams(state: WorkerState | None, rng) -> None:
    """Put a worker's random streams back as ``state`` saved them; a stream missing on either side is left alone."""
    for g, saved in zip(_streams(rng), state and state.streams or (), strict=False):
        if g is not None and saved is not None:
            set_rng_state(g, saved)


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
    generators: list  # the loader's generators just before the epoch's first draws (None: draw as they stand)
    base_seed: int | None  # None: draw it again from the replayed generators
    draws_base_seed: bool
    next_worker: int | None = None  # where round-robin dispatch continues
    workers: list[WorkerState | None] | None = None  # each worker's state after its last batch handed out
    main: WorkerState | None = None  # num_workers=0: the main process's streams and dataset
    generator_kinds: list | None = None  # generator_kinds(): which generators `generators` holds the states of
    replay: int = 0  # batches to fetch again and drop after resuming (saved between snapshots)
    done_ahead: list[int] = dataclasses.field(default_factory=list)  # in_order=False: batches past tasks_done had
    exhausted: bool = False  # the epoch had ended: after the replay, start the next one
    worker_batches: list[int] | None = None  # IterableDataset with workers: tasks had from each, at the snapshot
    replay_in_workers: list[int] | None = None  # stateless, out of order: batches each worker fetches and drops
    # IterableDataset with workers: each worker's state as the epoch began (None: freshly seeded).
    # A stateless dataset's epoch starts again from these states.
    # (Persistent workers begin a later epoch with the streams the last epoch left.)
    epoch_workers: list[WorkerState | None] | None = None
    version: int = STATE_VERSION

    @property
    def mid_epoch(self) -> bool:
        """Saved after the epoch's first batch: tasks were done, or batches follow its snapshot."""
        return self.tasks_done > 0 or self.replay > 0

    def to_dict(self) -> dict:
        return asdict(self)  # WorkerStates become dicts too

    @classmethod
    def from_dict(cls, state: dict, loader) -> LoaderState:
        """Check ``state`` against ``loader`` and return it as a LoaderState; ValueError naming what is wrong."""
        if not isinstance(state, dict):
            raise ValueError(f"load_state_dict expects the dict state_dict() returned, but got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state_dict version {state.get('version')!r} is not {STATE_VERSION}")
        missing = [f.name for f in fields(cls) if f.name not in state and f.default is not None]
        if missing:
            raise ValueError(f"state_dict is missing the key {missing[0]!r}: pass what state_dict() returned")
        unknown = sorted(set(state) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"state_dict has unknown key(s) {unknown}: was it saved by DataLoader.state_dict()?")
        new = cls(**state)
        try:
            for key in ("workers", "epoch_workers"):
                saved = getattr(new, key)
                setattr(new, key, None if saved is None else [w and WorkerState(**w) for w in saved])
            new.main = new.main and WorkerState(**new.main)
        except TypeError:
            raise ValueError("state_dict keys 'workers' and 'main' hold what DataLoader.state_dict() saved") from None
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
                f"this state_dict was saved by a loader drawing from {' and '.join(new.generator_kinds) or 'nothing'}, "
                f"but this DataLoader draws from {' and '.join(kinds) or 'nothing'}: its batches would follow another "
                "permutation. Resume "
                "with the same generator= (and sampler generators) as the loader that saved it"
            )
        iterable = loader._dataset_kind == _DatasetKind.Iterable
        length = None if iterable else _len_or_none(loader._index_sampler)
        ahead = new.done_ahead
        if not isinstance(ahead, list) or not all(isinstance(i, int) for i in ahead) or ahead != sorted(set(ahead)) \
                or any(i <= new.tasks_done or (length is not None and i >= length) for i in ahead):
            raise ValueError(f"state_dict key 'done_ahead' should list, in increasing order, task numbers past "
                             f"tasks_done={new.tasks_done} within the epoch, but it is {ahead!r}")
        # (An IterableDataset's tasks name no sample: out of order, more than tasks_done may have been had.)
        if new.num_yielded < 0 or (not iterable and new.num_yielded > new.tasks_done + len(ahead)) or new.replay < 0 \
                or (length is not None and new.tasks_done > length):
            raise ValueError(f"state_dict counters out of range: tasks_done={new.tasks_done}, num_yielded="
                             f"{new.num_yielded}, replay={new.replay}, for an epoch of {length} batches")
        if new.workers is not None and len(new.workers) != new.num_workers:
            raise ValueError(f"state_dict key 'workers' has {len(new.workers)} entries for {new.num_workers} workers")
        for key in ("worker_batches", "replay_in_workers"):
            counts = getattr(new, key)
            if counts is not None and (not isinstance(counts, list) or len(counts) != new.num_workers
                                       or not all(isinstance(c, int) and c >= 0 for c in counts)):
                raise ValueError(f"state_dict key {key!r} should hold a count for each of the {new.num_workers} "
                                 f"workers, but it is {counts!r}")
        if new.next_worker is not None and not 0 <= new.next_worker < max(new.num_workers, 1):
            raise ValueError(f"state_dict key 'next_worker' is {new.next_worker}, out of range for "
                             f"{new.num_workers} workers")
        iterators_saved = any(w is not None and w.iterator is not None for w in [*(new.workers or ()), new.main])
        had = new.mid_epoch or new.num_yielded > 0  # out of order, tasks_done may be 0 after batches were had
        if iterable and had and not _has_state(loader.dataset) and not iterators_saved:
            return _from_the_start(new, loader)
        return new


def _from_the_start(state: LoaderState, loader) -> LoaderState:
    """A stateless IterableDataset saved mid-epoch: start the epoch again with the same seeds, and drop what was had.

    In order, the main process drops the epoch's first batches.
    Out of order, the batches had need not be the first ones. So each worker drops the batches the consumer
    had from it, before its first task.
    """
    # The tasks had: batches and caught errors (an IterableDataset's end is not handed out).
    had = (sum(state.worker_batches) if state.worker_batches is not None else state.tasks_done) + state.replay
    name = type(getattr(loader.dataset, "_datapipe", loader.dataset)).__name__  # a datapipe's, not its wrapper's
    warnings.warn(f"{name} has no state_dict()/load_state_dict() (nor has the iterator iter() returns): the resumed "
                  f"loader starts the epoch again and fetches and drops the {had} batches already had (torchdata's "
                  "fast-forward); give it both to resume without fetching them twice", stacklevel=5)
    in_workers = state.worker_batches if not loader.in_order and state.worker_batches is not None else None
    return dataclasses.replace(state, tasks_done=0, num_yielded=state.num_yielded + state.replay if in_workers else 0,
                               replay=0 if in_workers else had, replay_in_workers=in_workers, next_worker=None,
                               worker_batches=in_workers,  # in order, the replay counts them again
                               done_ahead=[], workers=None if state.workers is None else
                               state.epoch_workers or [None] * state.num_workers,
                               main=state.main and WorkerState(streams=state.main.streams))  # no dataset state


def _after_the_epoch(loader, state: LoaderState) -> LoaderState:
    """Load a state saved between epochs at a snapshot (``exhausted``) into a loader without persistent workers.

    The next epoch's workers start afresh, so only the ended epoch's random draws matter.
    Make those draws again, fetching nothing, and start the next epoch from there.
    """
    generators = generators_of(loader)
    with replaying(generators, state.generators, mid_epoch=True):
        if _is_iter_datapipe(loader.dataset):  # the draws in the order an iterator makes them: the shared seed,
            _random.draw_seed(loader.generator)
        sampler_iter = iter(loader._index_sampler)
        if state.draws_base_seed:  # base_seed,
            _random.draw_seed(loader.generator)
        if loader._dataset_kind == _DatasetKind.Map:  # and the sampler's, to its end
            deque(sampler_iter, maxlen=0)
        after = capture_generators(generators)
    return _loader_state(loader, None, tasks_done=0, generators=after)


def _len_or_none(obj) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


# --- the worker side: handed to each worker in _WorkerOptions.layers -------------------------------------


@dataclass(frozen=True)
class _StatefulWorker:
    """The worker side of resume: called in the worker, it wraps the result queue and the fetcher factory."""

    every: int  # snapshot_every_n_steps (0: ship a state only with an end or an epoch's ack)
    num_workers: int
    epoch_len: int | None  # tasks in an epoch, where the sampler knows: the last ones always ship their state
    resume: WorkerState | None = None  # restored when the worker makes its first fetcher
    replay: int = 0  # batches its first fetcher fetches and drops (a stateless IterableDataset out of order)
    index: Any = None  # what a task of an IterableDataset asks for: batch_size Nones, or None

    def __call__(self, worker_id: int, index_queue, data_queue, create_fetcher):
        result_queue = _StatefulResultQueue(data_queue, worker_id, self, create_fetcher)
        return index_queue, result_queue, result_queue.create_fetcher

    def ships_state(self, idx: int) -> bool:
        """Whether task ``idx`` carries the worker's state.

        With ``every == 1``, every task does. Otherwise the tasks just before each snapshot do (each
        worker's last task before it), and so do the tasks at the end of the epoch.
        """
        n, w = self.every, self.num_workers
        return n == 1 or (n > 0 and (n <= w or idx % n >= n - w)) or \
            (self.epoch_len is not None and idx >= self.epoch_len - w)


class _StatefulResultQueue:
    """A worker's result queue that ships the worker's state with its batches, its end, and a new epoch's ack.

    Its ``create_fetcher`` puts the saved state back when the worker makes its first fetcher.
    """

    def __init__(self, queue, worker_id: int, layer: _StatefulWorker, create_fetcher) -> None:
        self.queue, self.worker_id, self.layer, self._create_fetcher = queue, worker_id, layer, create_fetcher
        self.resume, self.fetcher, self.replay = layer.resume, None, layer.replay
        self.last_sent = None  # (ended, fingerprints) of the last state sent; when unchanged, the id goes instead
        self.fingerprints = _Fingerprints()

    def create_fetcher(self, kind, dataset, auto_collation, collate_fn, drop_last):
        if self.resume is not None:  # runs after worker_init_fn, which may reseed: the saved state wins
            restore_streams(self.resume, get_worker_info().rng)
        self.fetcher = resumed_fetcher(self.resume, dataset, lambda: self._create_fetcher(
            kind, dataset, auto_collation, collate_fn, drop_last))
        self.resume = None
        for _ in range(self.replay):  # the batches the consumer had from this worker, fetched again and dropped
            try:
                self.fetcher.fetch(self.layer.index)
            except StopIteration:
                self.fetcher.ended = True
                break
            except Exception:  # the consumer had this error, and caught it
                pass
        self.replay = 0
        return self.fetcher

    def put(self, r) -> None:
        idx, data = r
        ended = isinstance(data, _IterableDatasetStopIteration) or getattr(self.fetcher, "ended", False)
        info = get_worker_info()
        try:
            if isinstance(idx, _ResumeIteration):  # no fetcher yet
                r = ship(r, "state", (self.worker_id, self._capture(info, (False, self.fingerprints(info.rng)), None)))
            elif ended or self.layer.ships_state(idx):  # a short last batch may have used the replica up too
                r = ship(r, "state", self._state(info, ended))
        except Exception:  # the dataset's state_dict() failed: the main process raises it, in this batch's place
            r = idx, ExceptionWrapper(where=f"in DataLoader worker {self.worker_id}'s dataset.state_dict()")
        self.queue.put(r)

    def _state(self, info, ended: bool):
        """The worker's state now, or just its id if the state equals the last one sent.

        Only the streams and ``ended`` are compared. A dataset or iterator with its own state always sends it.
        """
        if _has_state(info.dataset) or _has_state(getattr(self.fetcher, "dataset_iter", None)):
            return capture_worker_state(info.rng, info.dataset, ended, self.fetcher)
        now = (ended, self.fingerprints(info.rng))
        if now == self.last_sent:
            return self.worker_id  # an int pickles in a few bytes, and costs the main process nothing to look up
        return self._capture(info, now, self.fetcher)

    def _capture(self, info, now: tuple, fetcher) -> WorkerState:
        """The worker's whole state. ``now`` is its fingerprint, which the next batches compare with."""
        state = capture_worker_state(info.rng, info.dataset, now[0], fetcher)
        self.last_sent = None if _caches_normal(state) else now  # None equals no fingerprint: the next state is sent
        return state

    def __getattr__(self, name):  # cancel_join_thread, close: the queue's own
        return getattr(self.queue, name)


# --- the generators an epoch draws from -----------------------------------------------------------


def generators_of(loader) -> list:
    """The generators the loader and its samplers draw from; ``None`` stands for the global one.

    The global one is included only when something draws from it (a part given no generator).
    So a loader driven by a NumPy generator never imports torch just to read torch's global state.
    """
    batch_sampler = loader.batch_sampler
    owners = (loader, loader.sampler, batch_sampler, getattr(batch_sampler, "sampler", None))
    used = [owner.generator for owner in owners if hasattr(owner, "generator")]
    found = list({id(g): g for g in used if g is not None}.values())
    return [None, *found] if any(g is None for g in used) else found


def generator_kinds(generators: list) -> list[str]:
    """What each generator of ``generators_of`` is, in words."""
    return ["the global random state" if g is None else "a numpy.random.Generator" if isinstance(g, np.random.Generator)
            else "a torch.Generator" for g in generators]


def capture_generators(generators: list) -> list:
    """The current state of each generator (``None``: the global one)."""
    return [rng_state(_global_generator() if g is None else g) for g in generators]


@contextmanager
def replaying(generators: list, states: list, mid_epoch: bool):
    """Run the block with ``generators`` set back to ``states``.

    Explicit generators belong to the loader, so they stay where the replayed draws leave them,
    as in the run being resumed. So does the global one when the state was saved before the epoch's
    first batch: only the loader drew from it since. Mid-epoch, the training loop drew from it too: it
    is set back afterwards, so resuming the loader doesn't disturb the RNG state the caller restored.
    """
    global_now = rng_state(_global_generator()) if None in generators and mid_epoch else None
    for g, state in zip(generators, states, strict=True):
        set_rng_state(_global_generator() if g is None else g, state)
    try:
        yield
    finally:
        if global_now is not None:
            set_rng_state(_global_generator(), global_now)


# --- the main side: iterator subclasses chosen by DataLoader._get_iterator ----------------------------

_END = object()  # marks an exhausted iterator without catching StopIteration


@functools.cache
def stateful_iterators(single: type, multi: type) -> tuple[type, type]:
    """The loader's two iterator classes (traced or not) with the resume layer on top.

    ``DataLoader._get_iterator`` hands the classes in, so this module never imports dataloader.py.
    """
    return tuple(type(f"_Stateful{base.__name__.lstrip('_')}", (layer, base), {"__doc__": layer.__doc__})
                 for layer, base in ((_StatefulSingleIter, single), (_StatefulMultiIter, multi)))


class _StatefulIterMixin:
    """What both stateful iterators share: they record or replay the epoch's opening draws, and note its end."""

    def _take_resume_state(self, loader) -> LoaderState | None:
        """Take the state load_state_dict() left, before the iterator starts (None: a fresh epoch).

        The loader keeps that state until the iterator has started (``_started``).
        So if this iter() fails, the next one resumes from the same state.
        """
        self._resumed = loader._resume_state
        self._generators = generators_of(loader)
        # The generators' states before this epoch's first draw: read now, or, when resuming, the saved ones.
        self._generator_states = self._resumed.generators if self._resumed else capture_generators(self._generators)
        # Persistent workers' later epochs reuse the first base_seed. So does an epoch resumed from one of them.
        self._epoch_draws_base_seed = self._resumed.draws_base_seed if self._resumed else True
        self._exhausted = False  # once the epoch has ended, state_dict() saves the start of the next one
        return self._resumed

    def _started(self, loader) -> None:
        """Mark the iterator as standing where the loaded state said. From now on, state_dict() asks this iterator."""
        loader._resume_state = None
        loader._last_iterator = self  # a strong reference, as torchdata keeps: state_dict() after a `break` needs it

    def _resumed_base_seed(self, loader) -> int:
        """A resumed epoch's base_seed, drawn again from the replayed generators as the saved epoch drew it."""
        resumed = self._resumed
        drawn = _random.draw_seed(loader.generator) if resumed.draws_base_seed else None
        # A persistent loader's later epoch draws none: its workers kept the first one.
        return drawn if resumed.base_seed is None else resumed.base_seed

    def _skip_consumed(self, tasks_done: int) -> None:
        """Draw, without fetching them, the index batches the consumer had, while the generators are replayed.

        The next index batch is drawn too, because a sampler may draw its random numbers in chunks.
        """
        for _ in range(tasks_done):
            next(self._sampler_iter, None)
        if tasks_done > 0:
            first = next(self._sampler_iter, _END)
            self._sampler_iter = iter(()) if first is _END else itertools.chain([first], self._sampler_iter)

    def _replay(self, resumed: LoaderState) -> None:
        """Fetch again, and drop, the batches had since the snapshot the state was saved from.

        ``replay`` counts tasks, so an error the consumer caught counts too. It is dropped here like a batch.
        A traced loader's records of these hand-overs are dropped as well: the consumer never had these batches.
        """
        self._num_yielded = resumed.num_yielded
        trace = getattr(self, "_trace", None)
        recorded = len(trace.raw) if trace is not None else 0
        self._dropping = True
        try:
            for _ in range(resumed.replay):
                try:
                    next(self)
                except StopIteration:
                    break
                except Exception:  # the dataset's error, which the consumer had and caught (with no workers: any error)
                    if not (self._dropped_an_error or self._num_workers == 0):
                        raise  # a worker died: the iterator can't go on
        finally:
            self._dropping = False
        if trace is not None:
            trace.raw[recorded:] = [e for e in trace.raw[recorded:] if e[0] not in ("wait", "yield", "consumer")]
            self._last_yield = None

    _dropping = False  # True while replaying: the batches handed out are dropped
    _dropped_an_error = False  # with workers, the last task handed out while replaying was the dataset's error

    def __next__(self):
        try:
            return super().__next__()
        except StopIteration:
            self._exhausted = True
            raise


def _load_map_dataset(loader, resumed: LoaderState) -> None:
    """With no workers, put a map dataset's saved state back (an IterableDataset's goes back with its fetcher)."""
    if loader._dataset_kind == _DatasetKind.Map and resumed.main is not None and resumed.main.dataset is not None:
        loader.dataset.load_state_dict(resumed.main.dataset)


class _StatefulSingleIter(_StatefulIterMixin):
    """``num_workers=0``, resumable: the main process's streams and dataset are saved with the counters."""

    def __init__(self, loader) -> None:
        resumed = self._take_resume_state(loader)
        mid_epoch = resumed is not None and resumed.mid_epoch
        with replaying(self._generators, self._generator_states, mid_epoch) if resumed is not None else nullcontext():
            if resumed is not None and not mid_epoch:  # a map dataset's state goes back where it was saved:
                _load_map_dataset(loader, resumed)  # before the epoch's draws (it may set the global generator)...
            super().__init__(loader)  # draws base_seed again, and makes the fetcher on the saved dataset state
            self._skip_consumed(resumed.tasks_done if resumed is not None else 0)
        if resumed is not None:
            restore_streams(resumed.main, None)  # after `replaying`, which sets the global generator back
            if mid_epoch:  # ...or after them
                _load_map_dataset(loader, resumed)
        self._tasks_drawn = resumed.tasks_done if resumed is not None else 0  # index batches drawn, errors too
        if resumed is not None:
            self._replay(resumed)
            if resumed.replay:  # a stateless IterableDataset's replay drew from the streams: put them back again
                restore_streams(resumed.main, None)
        self._started(loader)

    def _next_index(self):
        index = super()._next_index()
        self._tasks_drawn += 1  # counted before the fetch: a caught error is not fetched again on resume
        return index

    def _layer_create_fetcher(self, create_fetcher):  # an iterable dataset's state goes back before iter() reads it
        create_fetcher = super()._layer_create_fetcher(create_fetcher)
        main = self._resumed and self._resumed.main if self._dataset_kind == _DatasetKind.Iterable else None
        return lambda *args: resumed_fetcher(main, self._dataset, lambda: create_fetcher(*args))

    def _state_dict(self, loader) -> LoaderState:
        fetcher = self._dataset_fetcher
        main = capture_worker_state(None, self._dataset, getattr(fetcher, "ended", False), fetcher)
        return _loader_state(loader, self, tasks_done=self._tasks_drawn, main=main)


class _StatefulMultiIter(_StatefulIterMixin):
    """``num_workers > 0``, resumable: each worker's state comes with its batches (see NOTE [ Resuming mid-epoch ])."""

    def __init__(self, loader) -> None:
        resumed = self._take_resume_state(loader)
        # Out of order, a replay cannot tell which batches were had (see the NOTE), so every batch carries its state.
        self._every = (loader.snapshot_every_n_steps or 0) if loader.in_order else 1
        self._every_batch = self._every == 1 and loader.in_order  # snapshots only around a batch without its state
        self._continue_from = resumed  # taken by the first _try_put_index
        self._skip_ahead = set()  # out of order: later tasks the consumer had already had before the save
        mid_epoch = resumed is not None and resumed.mid_epoch
        with replaying(self._generators, self._generator_states, mid_epoch) if resumed else nullcontext():
            super().__init__(loader)  # starts the workers and sends the first tasks
        if resumed is not None:
            try:
                self._replay(resumed)
                self._snapshot = self._current() or self._snapshot
                if resumed.exhausted:  # saved between epochs at a snapshot: finish that epoch, then start the next
                    deque(self, maxlen=0)  # runs the iterator to its end
                    self._reset(loader)
            except BaseException:  # the loader still holds the loaded state, so iter() can be tried again
                self._shutdown_workers()
                raise
        self._started(loader)

    def _layer_workers(self, worker_id: int) -> tuple:
        resume = self._resumed.workers[worker_id] if self._resumed is not None and self._resumed.workers else None
        epoch_len = _len_or_none(self._index_sampler) if self._dataset_kind == _DatasetKind.Map else None
        replay = self._resumed and self._resumed.replay_in_workers  # an IterableDataset: a BatchSampler or none
        replay = replay and (replay[worker_id], self._auto_collation and [None] * self._index_sampler.batch_size)
        layer = _StatefulWorker(self._every, self._num_workers, epoch_len, resume, *(replay or ()))
        return (*super()._layer_workers(worker_id), layer)

    def _reset(self, loader, first_iter: bool = False) -> None:
        resumed = self._resumed if first_iter else None
        if first_iter:  # each worker's state after the last batch the consumer had from it (None: freshly seeded)
            self._worker_states = list(resumed and resumed.workers or [None] * self._num_workers)
            self._last_sent = [None] * self._num_workers  # the last WorkerState each worker sent (see the NOTE)
        else:  # a new epoch on persistent workers: its draws start here, and each worker's ack brings its state
            self._generator_states, self._epoch_draws_base_seed = capture_generators(self._generators), False
        self._stale = [False] * self._num_workers  # True: a batch without its state was handed out since
        self._pending = [deque() for _ in range(self._num_workers)]  # states of batches received, not handed out
        self._stateless = 0  # batches among them that came without a state
        self._ends = {}  # worker id -> (task idx of its end, its last state), this epoch
        self._exhausted = False
        # Tasks handed out this epoch (batches and errors), per worker: a replay counts them.
        self._handed = list(resumed and resumed.worker_batches or [0] * self._num_workers)  # at its snapshot
        super()._reset(loader, first_iter)
        if not first_iter:  # the acks brought each persistent worker's state as this epoch begins
            self._epoch_workers = list(self._worker_states)
        elif resumed is not None:  # saved mid-epoch: its own; between epochs: the states it resumes the workers with
            self._epoch_workers = resumed.epoch_workers if resumed.mid_epoch or resumed.num_yielded else resumed.workers
        else:
            self._epoch_workers = None  # freshly seeded
        start = resumed or _Snapshot(0, 0, None, None, [], [])  # where this epoch starts: the first snapshot
        self._snapshot = _Snapshot(start.tasks_done, start.num_yielded, list(self._worker_states), start.next_worker,
                                   list(start.done_ahead), list(self._handed))
        self._next_snapshot = (start.tasks_done // self._every + 1) * self._every if self._every else None

    def _try_put_index(self) -> None:
        if self._continue_from is not None:  # a resumed epoch's first task: go on where the saved one stood
            state, self._continue_from = self._continue_from, None
            self._send_idx = self._rcvd_idx = state.tasks_done
            self._skip_consumed(state.tasks_done)
            self._skip_ahead = set(state.done_ahead)
            for _ in range(state.next_worker or 0):  # the next task goes to the worker the saved one sent it to
                next(self._worker_queue_idx_cycle)
        while self._send_idx in self._skip_ahead:  # had out of order before the save: drawn, never sent
            self._skip_ahead.discard(self._send_idx)
            if next(self._sampler_iter, _END) is _END:
                return
            self._send_idx += 1  # no _task_info entry: _next_data's skip loop steps over it
        super()._try_put_index()

    def _get_data(self):
        r, idx, state = unship(super()._get_data(), "state")
        if isinstance(state, int):  # a worker's id: its state is the last one it sent
            state = self._last_sent[state]
        elif isinstance(state, WorkerState) and isinstance(idx, int) and idx in self._task_info:
            self._last_sent[self._task_info[idx][0]] = state
        if isinstance(idx, _ResumeIteration):
            if state is not None:  # a persistent worker's state as the new epoch starts
                self._worker_states[state[0]] = self._last_sent[state[0]] = state[1]  # (worker id, its state)
        elif idx in self._task_info:  # not a stale result of an earlier epoch
            if isinstance(r[1], _IterableDatasetStopIteration):
                self._ends[r[1].worker_id] = (idx, state)
            else:
                if state is None and not self._stateless and self._every_batch:  # the last point all are known
                    self._snapshot = self._current() or self._snapshot
                self._stateless += state is None
                self._pending[self._task_info[idx][0]].append(state)
        return r

    def _process_data(self, data, worker_id: int):
        self._handed[worker_id] += 1
        self._dropped_an_error = self._dropping and isinstance(data, ExceptionWrapper)
        state = self._pending[worker_id].popleft()  # this worker's batches are handed out in the order it sent them
        self._stale[worker_id] = state is None
        self._stateless -= state is None
        if state is not None:
            self._worker_states[worker_id] = state
        return super()._process_data(data, worker_id)

    def __next__(self):
        data = super().__next__()
        if self._next_snapshot is not None and self._rcvd_idx >= self._next_snapshot and \
                (self._stateless or not self._every_batch):
            snapshot = self._current()
            if snapshot is not None:  # else a worker's state is behind: try again at the next batch
                self._snapshot = snapshot
                self._next_snapshot = (self._rcvd_idx // self._every + 1) * self._every
        return data

    def _current(self) -> _Snapshot | None:
        """Where the consumer stands, if every worker's state after its last batch handed out is known."""
        k = self._rcvd_idx  # it may still point at a task already had out of order, or skipped: step past those
        while (k < self._send_idx and k not in self._task_info) or k in self._skip_ahead:
            k += 1
        workers, stale = list(self._worker_states), list(self._stale)
        for worker_id, (end_idx, state) in list(self._ends.items()):  # list: state_dict() may run in another thread
            # In order, the consumer is past this worker's end; out of order, it had every batch sent before it.
            if end_idx < k or not self._in_order:
                workers[worker_id], stale[worker_id] = state, False
        if any(stale):
            return None
        # Out of order, tasks after k may have been had already (an IterableDataset's tasks name no sample).
        ahead = set() if self._dataset_kind == _DatasetKind.Iterable else {i for i in self._skip_ahead if i > k} | \
            {i for i in range(k + 1, self._send_idx) if i not in self._task_info}
        return _Snapshot(k, self._num_yielded, workers, self._task_info.get(k, (None,))[0], sorted(ahead),
                         list(self._handed))

    def _state_dict(self, loader) -> LoaderState:
        """Where this epoch stands: now, or at the last snapshot and the batches had since."""
        if self._worker_method == "thread" and self._dataset_kind == _DatasetKind.Iterable:
            raise ValueError("state_dict() can't save an IterableDataset shared by thread workers: their "
                             "replicas are one object; use worker_method='multiprocessing'")
        at = self._current() or self._snapshot
        iterable = self._dataset_kind == _DatasetKind.Iterable
        return _loader_state(loader, self, tasks_done=at.tasks_done, num_yielded=at.num_yielded, workers=at.workers,
                             next_worker=at.next_worker, replay=sum(self._handed) - sum(at.handed),
                             done_ahead=at.done_ahead, worker_batches=list(at.handed) if iterable else None,
                             epoch_workers=self._epoch_workers if iterable else None)


# A point of the epoch where every worker's state is known.
_Snapshot = namedtuple("_Snapshot", "tasks_done num_yielded workers next_worker done_ahead handed")


# --- DataLoader.state_dict() and load_state_dict() ----------------------------------------------------


def loader_state_dict(loader) -> dict:
    """``DataLoader.state_dict()``: the current iterator's state, or the next epoch's start between epochs."""
    if not loader.stateful:
        raise RuntimeError("state_dict() needs DataLoader(..., stateful=True): only then does the loader keep what "
                           "resuming needs (the epoch's opening draws, each worker's random state after each batch)")
    if loader._resume_state is not None:  # loaded and not iterated yet: still the point to resume from
        return loader._resume_state.to_dict()
    it = loader._last_iterator  # between epochs (None, or exhausted), the next one starts from here
    return (_between_epochs(loader, it) if it is None or it._exhausted else it._state_dict(loader)).to_dict()


def load_loader_state(loader, state: dict) -> None:
    """``DataLoader.load_state_dict()``: check ``state`` and leave it for the next iterator to resume from."""
    if not loader.stateful:
        raise RuntimeError("load_state_dict() needs DataLoader(..., stateful=True): the stateful iterator is the "
                           "one that resumes")
    resume = LoaderState.from_dict(state, loader)  # ValueError, naming the key, if it doesn't fit
    if resume.exhausted and not loader.persistent_workers:
        resume = _after_the_epoch(loader, resume)
    if loader._iterator is not None:  # persistent workers of an older epoch: start afresh
        loader._iterator._shutdown_workers()
    loader._iterator = loader._last_iterator = None
    loader._resume_state = resume


def _between_epochs(loader, it) -> LoaderState:
    """The state that starts the next epoch. Its draws come from the generators as they are now.

    Persistent workers carry on with their base_seed and their streams.
    With no workers, the state also holds the dataset's own state.
    """
    generators = capture_generators(generators_of(loader))
    extra: dict = {}
    if it is not None and it is loader._iterator:  # persistent workers: they carry their streams on
        at = it._current()
        if at is None:  # a worker's known state is behind: resume at the last snapshot and replay to the end
            return dataclasses.replace(it._state_dict(loader), exhausted=True)
        extra = dict(workers=[s and dataclasses.replace(s, ended=False, iterator=None) for s in at.workers],
                     base_seed=it._base_seed, draws_base_seed=False)  # the next epoch's iter() starts afresh
    elif loader.num_workers == 0:
        main = capture_worker_state(None, loader.dataset)
        extra = dict(main=dataclasses.replace(main, streams=None))  # the global streams are the caller's
    return _loader_state(loader, None, tasks_done=0, generators=generators, **extra)


def _loader_state(loader, it, tasks_done: int, **extra) -> LoaderState:
    """The one place a LoaderState is built: from an iterator mid-epoch (``it``), or between epochs."""
    if it is not None:
        extra = dict(generators=it._generator_states, base_seed=it._base_seed,
                     draws_base_seed=it._epoch_draws_base_seed, num_yielded=it._num_yielded) | extra
    extra = dict(num_yielded=0, base_seed=None, draws_base_seed=True) | extra
    return LoaderState(num_workers=loader.num_workers, worker_method=loader.worker_method,
                       dataset_len=_len_or_none(loader.dataset), batch_size=loader.batch_size,
                       sampler=type(loader.sampler).__name__, tasks_done=tasks_done,
                       generator_kinds=generator_kinds(generators_of(loader)), **extra)
