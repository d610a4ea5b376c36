"""Pinning: copy each batch into page-locked host memory, so host-to-device copies can be async.

Mirrors ``torch/utils/data/_utils/pin_memory.py``. ``_pin_memory_loop`` runs in a thread of the
main process, between the workers' result queue and the consumer. It is a thread because pinned memory
belongs to the process that allocates it.
"""

from __future__ import annotations

import collections.abc
import copy
import queue
from typing import Any

from minidl import _random
from minidl._utils import MP_STATUS_CHECK_INTERVAL, ExceptionWrapper


def pin_memory(data: Any, device: str | None = None) -> Any:
    """Return ``data`` with every tensor (or object with a ``pin_memory`` method) pinned."""
    if hasattr(data, "pin_memory"):  # torch.Tensor, or a user type that knows how to pin itself
        return data.pin_memory()
    if isinstance(data, str | bytes):
        return data
    if isinstance(data, collections.abc.Mapping):
        pinned = {k: pin_memory(v, device) for k, v in data.items()}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)  # keeps the mapping's type and any extra attributes
                clone.update(pinned)
                return clone
            return type(data)(pinned)
        except TypeError:  # a mapping type we can't rebuild: a plain dict will do
            return pinned
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # namedtuple: positional rebuild
            return type(data)(*(pin_memory(v, device) for v in data))
        return type(data)(pin_memory(v, device) for v in data)
    if isinstance(data, collections.abc.Sequence):
        pinned = [pin_memory(v, device) for v in data]
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone = copy.copy(data)  # keeps the sequence's type (a deque stays a deque)
                for i, item in enumerate(pinned):
                    clone[i] = item
                return clone
            return type(data)(pinned)
        except TypeError:
            return pinned
    return data


def _pin_memory_loop(in_queue, out_queue, device_id: int | None, done_event, device: str | None) -> None:
    """Move ``(idx, batch)`` pairs from ``in_queue`` to ``out_queue``, pinning each batch.

    One thread and a FIFO queue keep the order. Worker exceptions pass through untouched. A failure to
    pin becomes an ``ExceptionWrapper`` for the consumer. The loop stops when ``done_event`` is set.
    See NOTE [ Worker queues and shutdown ] in dataloader.py.

    First, as torch does, two settings that hold for this thread only: torch's copies run on one core (the
    training step needs the others), on accelerator ``device_id``, the one that was current when the
    iterator started (else pinning on a second GPU would set up a context on the first). ``device_id``
    None: no device to choose (a demonstration on a machine without one).
    """
    if _random.HAS_TORCH:
        torch = _random._torch()
        torch.set_num_threads(1)
        if device_id is not None:
            torch.accelerator.set_device_index(device_id)

    def do_one_step() -> None:
        # One batch per call: its names die when the call returns, so the thread holds no pinned batch while it
        # waits for the next one (the consumer may have dropped it long ago). torch splits its loop the same way.
        try:
            r = in_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)
        except queue.Empty:
            return
        idx, data = r
        if not done_event.is_set() and not isinstance(data, ExceptionWrapper):
            try:
                data = pin_memory(data, device)
            except Exception:
                data = ExceptionWrapper(where=f"in pin memory thread for device {device_id}")
            r = (idx, data)
        while not done_event.is_set():
            try:
                out_queue.put(r, timeout=MP_STATUS_CHECK_INTERVAL)
                break
            except queue.Full:
                continue

    while not done_event.is_set():
        do_one_step()
