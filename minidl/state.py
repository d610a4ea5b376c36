"""Resuming mid-epoch: what a DataLoader must remember to hand out exactly the batches it would have.

PyTorch's DataLoader has no ``state_dict``; torchdata's ``StatefulDataLoader`` adds one, and
``DataLoader.state_dict()`` / ``load_state_dict()`` here do the same job in three parts:

1. The random draws made as an epoch starts (``base_seed``, the sampler's permutation). We keep
   the generators' states from just before them and, on resume, replay the same draws.
2. How far the consumer got. The resumed iterator skips that many index batches without fetching.
3. Each worker's random streams (and an IterableDataset replica's own position) just after its
   last batch the consumer received. Workers snapshot them before each task, since by the time
   we ask they may have prefetched further, and answer a ``_StateRequest`` with the right one.
"""

from __future__ import annotations

import random
import sys
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from minidl import _random
from minidl.fetch import _DatasetKind

STATE_VERSION = 2


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
    workers: list | None = None  # each worker's state just before its next batch (capture_worker_state)
    workers_ended: list | None = None  # True for a worker whose IterableDataset replica ran out
    main: dict | None = None  # num_workers=0: the main process's streams and dataset
    generator_kinds: list | None = None  # generator_kinds(): which generators `generators` holds the states of
    version: int = STATE_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    def worker_state(self, worker_id: int) -> dict | None:
        """What worker ``worker_id`` restores before its first task (None: nothing saved)."""
        if self.workers is None:
            return None
        if self.workers[worker_id] is None and self.workers_ended and self.workers_ended[worker_id]:
            return {"ended": True}  # its replica had run out, so it was not asked for its state
        return self.workers[worker_id]

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
        for key in ("workers", "workers_ended"):
            value = getattr(new, key)
            if value is not None and len(value) != new.num_workers:
                raise ValueError(f"state_dict key {key!r} has {len(value)} entries for {new.num_workers} workers")
        if new.next_worker is not None and not 0 <= new.next_worker < max(new.num_workers, 1):
            raise ValueError(f"state_dict key 'next_worker' is {new.next_worker}, out of range for "
                             f"{new.num_workers} workers")
        return new


def _len_or_none(obj) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


@dataclass(frozen=True)
class _StateRequest:
    """Asks a worker for its state just before its first task numbered ``task_idx`` or later."""

    task_idx: int


# --- a worker's state -------------------------------------------------------------------------


def capture_worker_state(rng, dataset: Any) -> dict:
    """The random streams a worker's dataset may draw from, and the dataset's own state if it has one.

    ``rng`` is a thread worker's ``_RNG``; ``None`` (a process worker, or the main process with no
    workers) saves the process's global streams.
    """
    state: dict[str, Any] = {}
    if rng is not None:  # a thread worker must not touch the global streams: its own three instead
        state["rng"] = {"random": rng.random_generator.getstate(),
                        "numpy": rng.numpy_generator.bit_generator.state,
                        "torch": None if rng.torch_generator is None else _get(rng.torch_generator)}
    else:
        state["random"] = random.getstate()
        state["numpy"] = np.random.get_state()
        if "torch" in sys.modules:  # as bytes: a tensor would travel through shared memory
            state["torch"] = sys.modules["torch"].get_rng_state().numpy().tobytes()
    if hasattr(dataset, "state_dict"):
        state["dataset"] = dataset.state_dict()
    return state


def restore_worker_state(state: dict, rng, dataset: Any) -> None:
    """Put back what ``capture_worker_state`` saved."""
    if "rng" in state:
        rng.random_generator.setstate(state["rng"]["random"])
        rng.numpy_generator.bit_generator.state = state["rng"]["numpy"]
        if rng.torch_generator is not None and state["rng"]["torch"] is not None:
            _set(rng.torch_generator, state["rng"]["torch"])
    if "random" in state:
        random.setstate(state["random"])
        np.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
    if "dataset" in state:
        dataset.load_state_dict(state["dataset"])


class WorkerSnapshots:
    """A worker's recent states, keyed by the task they preceded (a bounded window)."""

    def __init__(self, depth: int) -> None:
        self._before: deque[tuple[int, dict]] = deque(maxlen=depth)

    def record(self, task_idx: int, state: dict) -> None:
        self._before.append((task_idx, state))

    def answer(self, request: _StateRequest, current: dict) -> dict:
        """The state before this worker's first task >= request.task_idx; ``current`` if none ran yet."""
        for task_idx, state in self._before:
            if task_idx >= request.task_idx:
                return state
        return current


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
