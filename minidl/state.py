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
from dataclasses import dataclass
from typing import Any

import numpy as np

from minidl import _random

STATE_VERSION = 1


@dataclass(frozen=True)
class _StateRequest:
    """Asks a worker for its state just before its first task numbered ``task_idx`` or later."""

    task_idx: int


# --- a worker's state -------------------------------------------------------------------------


def capture_worker_state(worker_method: str, rng: np.random.Generator | None, dataset: Any) -> dict:
    """The random streams a worker's dataset may draw from, and the dataset's own state if it has one.

    ``worker_method="main"`` (no workers) saves the main process's global streams.
    """
    state: dict[str, Any] = {}
    if rng is not None:
        state["rng"] = rng.bit_generator.state
    if worker_method in ("multiprocessing", "main"):  # a thread worker must not touch the global streams
        state["random"] = random.getstate()
        state["numpy"] = np.random.get_state()
        if "torch" in sys.modules:  # as bytes: a tensor would travel through shared memory
            state["torch"] = sys.modules["torch"].get_rng_state().numpy().tobytes()
    if hasattr(dataset, "state_dict"):
        state["dataset"] = dataset.state_dict()
    return state


def restore_worker_state(state: dict, rng: np.random.Generator | None, dataset: Any) -> None:
    """Put back what ``capture_worker_state`` saved."""
    if "rng" in state:
        rng.bit_generator.state = state["rng"]
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
