"""DataLoader: sampler -> indices -> fetch -> collate -> batch, in one process or across workers.

Mirrors ``torch/utils/data/dataloader.py``. The single-process iterator is the whole idea in a
dozen lines; the multi-worker iterator adds queues, a reorder buffer and a shutdown protocol
(see the NOTE below). Workers are processes by default, or threads with ``worker_method="thread"``.
"""

from __future__ import annotations

import atexit
import itertools
import math
import multiprocessing
import os
import queue
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from minidl import _random
from minidl._picklable import check_picklable
from minidl.collate import default_collate, default_convert
from minidl.dataset import Dataset, IterableDataset
from minidl.fetch import _DatasetKind
from minidl.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler
from minidl.state import (
    STATE_VERSION,
    _StateRequest,
    capture_generators,
    capture_worker_state,
    generators_of,
    replaying,
    restore_worker_state,
)
from minidl.trace import Recorder, Trace, now
from minidl.worker import (
    MP_STATUS_CHECK_INTERVAL,
    ExceptionWrapper,
    _IterableDatasetStopIteration,
    _ResumeIteration,
    _ThreadContext,
    _worker_loop,
)

WORKER_METHODS = ("multiprocessing", "thread")
_END = object()  # marks an exhausted iterator without catching StopIteration


class _InfiniteConstantSampler(Sampler):
    """Yields ``None`` forever: an IterableDataset decides for itself what comes next."""

    def __iter__(self):
        while True:
            yield None


def _is_iterable_dataset(dataset) -> bool:
    """minidl's IterableDataset, or torch's: code written for torch.utils.data runs here too."""
    if isinstance(dataset, IterableDataset):
        return True
    torch_data = sys.modules.get("torch.utils.data")
    return torch_data is not None and isinstance(dataset, torch_data.IterableDataset)


def _accelerator_available() -> bool:
    if not _random.HAS_TORCH:
        return False
    import torch

    return torch.accelerator.is_available()


class DataLoader:
    """Combines a dataset and a sampler into an iterable over batches, as ``torch.utils.data.DataLoader``.

    minidl's additions: ``worker_method`` runs the ``num_workers`` workers as processes
    (``"multiprocessing"``, torch's only choice) or as threads (``"thread"``); ``trace=True`` records
    every step of every batch into ``loader.trace`` (a ``minidl.trace.Trace``); ``stateful=True``
    lets workers keep what ``state_dict()`` needs to resume mid-epoch (see minidl/state.py).
    """

    def __init__(
        self,
        dataset: Dataset | IterableDataset | Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | Iterable | None = None,
        batch_sampler: Sampler | Iterable | None = None,
        num_workers: int = 0,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        worker_method: str = "multiprocessing",
        trace: bool | Trace = False,
        stateful: bool = False,
    ) -> None:
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; use num_workers=0 to disable multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing. Let num_workers > 0 "
                "to enable multiprocessing, otherwise set prefetch_factor to None."
            )
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if worker_method not in WORKER_METHODS:
            raise ValueError(
                f"worker_method should be one of {WORKER_METHODS}, but got worker_method={worker_method!r}"
            )

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.worker_method = worker_method
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order

        # Samplers choose keys; an IterableDataset has none, so it accepts no sampler at all.
        if _is_iterable_dataset(dataset):
            self._dataset_kind = _DatasetKind.Iterable
            if shuffle not in {False, None}:
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified sampler option, but got sampler={sampler}"
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified batch_sampler option, "
                    f"but got batch_sampler={batch_sampler}"
                )
        else:
            shuffle = bool(shuffle)
            self._dataset_kind = _DatasetKind.Map

        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive with drop_last"
            )

        if sampler is None:
            if self._dataset_kind == _DatasetKind.Iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        if trace is True:
            trace = Trace()
        self.trace = trace or None
        if self.trace is not None:
            self.trace.num_workers, self.trace.worker_method, self.trace.in_order = num_workers, worker_method, in_order
        self.stateful = stateful
        self._IterableDataset_len_called = None  # len(self) as reported, to warn on overrun
        self._iterator = None  # kept between epochs only with persistent_workers
        self._last_iterator = None  # weak reference to the newest iterator, for state_dict()
        self._resume_state = None  # set by load_state_dict(), used by the next iterator
        self.__initialized = True
        self.check_worker_number_rationality()

    @property
    def multiprocessing_context(self):
        return self.__multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, context) -> None:
        if context is not None:
            if self.num_workers == 0:
                raise ValueError(
                    "multiprocessing_context can only be used with multi-process loading "
                    f"(num_workers > 0), but got num_workers={self.num_workers}"
                )
            if self.worker_method == "thread":
                raise ValueError("multiprocessing_context can't be used with worker_method='thread'")
            if isinstance(context, str):
                valid = multiprocessing.get_all_start_methods()
                if context not in valid:
                    raise ValueError(
                        f"multiprocessing_context option should specify a valid start method in {valid!r}, "
                        f"but got multiprocessing_context={context!r}"
                    )
                context = _mp_module().get_context(context)
            if not isinstance(context, multiprocessing.context.BaseContext):
                raise TypeError(
                    "multiprocessing_context option should be a valid context object or a string "
                    f"specifying the start method, but got multiprocessing_context={context}"
                )
        self.__multiprocessing_context = context

    def __setattr__(self, attr, val) -> None:
        # These define the batches; changing one mid-life would silently desync the samplers.
        frozen = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
        if self.__dict__.get("_DataLoader__initialized") and attr in frozen:
            raise ValueError(f"{attr} attribute should not be set after {self.__class__.__name__} is initialized")
        super().__setattr__(attr, val)

    def __iter__(self):
        # Persistent workers outlive an epoch: reuse the iterator and just reset it.
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is None:
                self._iterator = self._get_iterator()
            else:
                self._iterator._reset(self)
            return self._iterator
        return self._get_iterator()

    def _get_iterator(self):
        if self.num_workers == 0:
            it = _SingleProcessDataLoaderIter(self)
        else:
            self.check_worker_number_rationality()
            it = _MultiProcessingDataLoaderIter(self)
        self._last_iterator = weakref.ref(it)
        return it

    def state_dict(self) -> dict:
        """Where this loader stands mid-epoch; ``load_state_dict`` on a fresh loader resumes right there.

        Resumes the same batches in the same order with the same random streams in every worker,
        for map-style datasets and for IterableDatasets that have ``state_dict``/``load_state_dict``.
        Needs ``stateful=True`` when ``num_workers > 0``, and ``in_order=True``. With
        ``num_workers=0`` the dataset draws from the global random streams, which are saved too.
        """
        it = self._last_iterator() if self._last_iterator is not None else None
        if it is not None and it._exhausted and it is self._iterator:
            # Persistent workers between epochs: they carry their random streams into the next one.
            state = it._state_dict()
            state.update(tasks_done=0, num_yielded=0, generators=capture_generators(it._generators),
                         draws_base_seed=False, next_worker=None, workers_ended=[False] * self.num_workers)
            return state
        if it is None or it._exhausted:  # between epochs: the next one starts from here
            return {"version": STATE_VERSION, "num_workers": self.num_workers, "worker_method": self.worker_method,
                    "tasks_done": 0, "num_yielded": 0, "generators": capture_generators(generators_of(self)),
                    "base_seed": None, "draws_base_seed": True}  # base_seed: drawn again on resume
        return it._state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter(loader)`` continue where ``state`` (from ``state_dict``) stopped."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state_dict version {state.get('version')!r} is not {STATE_VERSION}")
        for key in ("num_workers", "worker_method"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"this state_dict was saved with {key}={state[key]!r} but this DataLoader has "
                    f"{key}={getattr(self, key)!r}: each worker's random streams belong to that setting, "
                    f"so resume with {key}={state[key]!r}"
                )
        if self._iterator is not None:  # persistent workers of an older epoch: start afresh
            self._iterator._shutdown_workers()
            self._iterator = None
        self._resume_state = state

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        # What the fetcher consumes: lists of indices when batching, single indices otherwise.
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._dataset_kind == _DatasetKind.Iterable:
            # The dataset's own claim; with workers it is only right if each replica shards itself.
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last else math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)

    def check_worker_number_rationality(self) -> None:
        """Warn, as torch does, when asking for more workers than this process may use cores."""
        if not self.num_workers:
            return
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        if cores is not None and self.num_workers > cores:
            kind = "threads" if self.worker_method == "thread" else "processes"
            warnings.warn(
                f"This DataLoader will create {self.num_workers} worker {kind} in total. Our suggested "
                f"max number of worker in current system is {cores}, which is smaller than what this "
                "DataLoader is going to create. Please be aware that excessive worker creation might get "
                "DataLoader running slow or even freeze, lower the worker number to avoid potential "
                "slowness/freeze if necessary.",
                stacklevel=2,
            )


def _mp_module():
    """torch.multiprocessing when torch is installed (tensors then travel in shared memory)."""
    if _random.HAS_TORCH:
        import torch.multiprocessing

        return torch.multiprocessing
    return multiprocessing


class _BaseDataLoaderIter:
    def __init__(self, loader: DataLoader) -> None:
        self._dataset = loader.dataset
        self._dataset_kind = loader._dataset_kind
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        self._pin_memory = loader.pin_memory and _accelerator_available()
        self._pin_memory_device = loader.pin_memory_device or None
        if loader.pin_memory and not self._pin_memory:
            warnings.warn(
                "'pin_memory' argument is set as true but no accelerator is found, "
                "then device pinned memory won't be used.",
                stacklevel=3,
            )
        self._timeout = loader.timeout
        self._collate_fn = loader.collate_fn
        self._worker_method = loader.worker_method
        # Order matters for reproducing torch: the sampler iterator is created (lazily, it
        # draws nothing yet) and then base_seed is drawn from the loader's generator.
        self._resumed, loader._resume_state = loader._resume_state, None
        self._generators = generators_of(loader)
        self._epoch_draws_base_seed = True  # persistent workers' later epochs reuse the first base_seed
        if self._resumed is None:
            self._generator_states = capture_generators(self._generators)  # for state_dict()
            self._sampler_iter = iter(self._index_sampler)
            self._base_seed = _random.draw_seed(loader.generator)
        else:
            self._resume_sampler(loader, self._resumed)
        self._persistent_workers = loader.persistent_workers
        self._num_yielded = self._resumed["num_yielded"] if self._resumed else 0
        self._exhausted = False
        # Tracing (minidl/trace.py); all None when off, so the untraced path pays one `is None`.
        self._trace = loader.trace
        self._recorder = Recorder("main") if self._trace is not None else None
        self._consumer_recorder = Recorder("consumer") if self._trace is not None else None
        self._trace_batch = None  # task idx of the batch being handed back
        self._last_yield = None  # when the consumer last got a batch

    def __iter__(self):
        return self

    def _resume_sampler(self, loader: DataLoader, state: dict) -> None:
        """Replay the epoch's opening draws from the saved generator states, then skip what was consumed."""
        self._generator_states = state["generators"]
        with replaying(self._generators, self._generator_states):
            self._sampler_iter = iter(self._index_sampler)
            drawn = _random.draw_seed(loader.generator) if state["draws_base_seed"] else None
            self._base_seed = drawn if state["base_seed"] is None else state["base_seed"]
            if self._num_workers > 0:  # the multi-worker _reset makes it again, as torch does
                self._sampler_iter = iter(self._index_sampler)
            for _ in range(state["tasks_done"]):
                next(self._sampler_iter, None)
            # If the saved iterator had already drawn its permutation (workers prefetch at once;
            # one process draws at the first batch), draw it now, while the generators are replayed.
            if self._num_workers > 0 or state["tasks_done"] > 0:
                first = next(self._sampler_iter, _END)
                self._sampler_iter = iter(()) if first is _END else itertools.chain([first], self._sampler_iter)

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        if not (first_iter and self._resumed is not None):  # a resumed iterator's sampler is ready
            if not first_iter:  # a new epoch on persistent workers: its draws start from here
                self._generator_states = capture_generators(self._generators)
                self._epoch_draws_base_seed = False
            self._sampler_iter = iter(self._index_sampler)
            self._num_yielded = 0
        self._exhausted = False
        self._IterableDataset_len_called = loader._IterableDataset_len_called

    def _next_index(self):
        return next(self._sampler_iter)  # may raise StopIteration

    def _next_data(self):
        raise NotImplementedError

    def __next__(self):
        try:
            data = self._next_data() if self._trace is None else self._traced_next_data()
        except StopIteration:
            self._exhausted = True
            raise
        self._num_yielded += 1
        reported = self._IterableDataset_len_called
        if self._dataset_kind == _DatasetKind.Iterable and reported is not None and self._num_yielded > reported:
            msg = (
                f"Length of IterableDataset {self._dataset} was reported to be {reported} (when accessing "
                f"len(dataloader)), but {self._num_yielded} samples have been fetched. "
            )
            if self._num_workers > 0:
                msg += "With workers, each replica of the IterableDataset must shard itself (get_worker_info)."
            warnings.warn(msg, stacklevel=2)
        return data

    def _traced_next_data(self):
        """``_next_data``, recording the consumer's time since the last batch and the wait for this one."""
        start = now()
        if self._last_yield is not None:
            self._consumer_recorder.add("consumer", self._trace_batch, self._last_yield, start)
            self._trace.extend(self._consumer_recorder.take())
        try:
            data = self._next_data()
        finally:
            self._trace.extend(self._recorder.take())  # what happened inside, even on StopIteration
        self._last_yield = end = now()
        self._recorder.add("wait", self._trace_batch, start, end)
        self._recorder.add("yield", self._trace_batch, end)
        self._trace.extend(self._recorder.take())
        return data

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self):
        raise NotImplementedError(f"{self.__class__.__name__} cannot be pickled")


class _SingleProcessDataLoaderIter(_BaseDataLoaderIter):
    """``num_workers=0``: the main process samples, fetches, collates (and pins) each batch itself."""

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        main_state = self._resumed.get("main") if self._resumed is not None else None
        if main_state is not None:  # the global streams and the dataset as they were when saved
            restore_worker_state(main_state, None, self._dataset)
        self._dataset_fetcher = _DatasetKind.create_fetcher(
            self._dataset_kind, self._dataset, self._auto_collation, self._collate_fn, self._drop_last
        )
        if main_state is not None and main_state["ended"]:
            self._dataset_fetcher.ended = True

    def _next_data(self):
        index = self._next_index()  # may raise StopIteration
        if self._recorder is not None:
            self._trace_batch = self._dataset_fetcher.batch = self._num_yielded
            self._dataset_fetcher.recorder = self._recorder
        data = self._dataset_fetcher.fetch(index)  # may raise StopIteration
        if self._pin_memory:
            from minidl.pin_memory import pin_memory

            start = now()
            data = pin_memory(data, self._pin_memory_device)
            if self._recorder is not None:
                self._recorder.add("pin", self._trace_batch, start, now())
        return data

    def _state_dict(self) -> dict:
        state = _base_state(self, tasks_done=self._num_yielded)
        dataset = self._dataset if self._dataset_kind == _DatasetKind.Iterable else None
        state["main"] = capture_worker_state("main", None, dataset)
        state["main"]["ended"] = getattr(self._dataset_fetcher, "ended", False)  # see _worker_loop's snapshot
        return state


# Iterators with live workers, shut down at interpreter exit before multiprocessing's own exit
# hook terminates daemonic children underneath them.
_live_iterators: weakref.WeakSet = weakref.WeakSet()
_atexit_registered = False


def _shutdown_live_iterators() -> None:
    for it in list(_live_iterators):
        it._shutdown_workers()


class _MultiProcessingDataLoaderIter(_BaseDataLoaderIter):
    """``num_workers > 0``: workers fetch and collate; the main process hands batches back in order."""

    _shutdown = True  # until workers exist: a half-built iterator has nothing to shut down

    # NOTE [ Worker queues and shutdown ]
    #
    # Data flow (one index_queue per worker, one shared worker_result_queue):
    #
    #   main process                                   worker i (process or thread)
    #   ------------                                   ----------------------------
    #   _try_put_index():
    #     (send_idx, indices) ---> index_queues[i] ---> _worker_loop: fetch + collate
    #                                                        |
    #   _next_data():                                        v
    #     _task_info reorder buffer <--- worker_result_queue <--- (send_idx, batch)
    #     [pin_memory_thread: worker_result_queue -> pin -> data_queue, when pinning]
    #
    # Bookkeeping: task k is sent with _send_idx == k; _task_info[k] is (worker,) while in flight
    # and (worker, batch) once it arrived early; _rcvd_idx is the next task to hand back. At most
    # prefetch_factor * num_workers tasks are in flight; each batch handed back frees one slot.
    #
    # Shutdown protocol (_shutdown_workers), run on exhaustion, error, `del`, GC or exit:
    #   1. Mark the iterator shut down, so it runs once.
    #   2. Stop the pin-memory thread: set its done event, wake it with a dummy, join it.
    #   3. Set workers_done_event: workers stop fetching and only drain their index queue.
    #   4. Put the None sentinel on every index queue: each worker leaves its loop on it.
    #   5. Join each worker for a bounded time; close the index queues without waiting for
    #      their feeder threads (cancel_join_thread), since nobody will read what is left.
    #   6. Terminate any process worker still alive (stuck in user code) and join it, so no
    #      worker outlives the iterator. Thread workers cannot be killed: they are daemons, and
    #      a thread stuck in a slow __getitem__ exits as soon as it returns to the loop.
    #
    # Failures surface in the main process rather than hanging it:
    #   * an exception in a worker travels as an ExceptionWrapper and is re-raised by type;
    #   * while waiting, the main process polls every MP_STATUS_CHECK_INTERVAL seconds and
    #     raises RuntimeError naming the pid and exit code of any worker that died;
    #   * with timeout > 0, a batch that takes longer raises RuntimeError naming the timeout;
    #   * a process worker polls for its parent, and exits if the main process died.
    #
    # Which thread owns what (this matters without the GIL, where threads truly run at once):
    #   * every attribute of this iterator (_task_info, _send_idx, _rcvd_idx, the status lists,
    #     the trace) belongs to the consumer's thread alone: only __next__ and _shutdown_workers
    #     touch them, and both run there (or in __del__/atexit once the consumer is gone);
    #   * workers and the pin-memory thread share nothing with it but queues and events, which
    #     are thread-safe; their events and results travel inside the queued tuples;
    #   * thread workers do share the dataset and collate_fn: those must be safe to call from
    #     several threads (each worker has its own WorkerInfo, in thread-local storage).

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        self._snapshots = loader.stateful
        if self._worker_method == "thread":
            context = _ThreadContext
        else:
            context = loader.multiprocessing_context or _mp_module().get_context()
            check_picklable(context, {"dataset": loader.dataset, "collate_fn": loader.collate_fn,
                                      "worker_init_fn": loader.worker_init_fn})

        self._worker_result_queue = context.Queue()
        self._workers_done_event = context.Event()
        self._index_queues = []
        self._workers = []
        self._shutdown = False  # from here on, __del__ has workers and queues to clean up
        for i in range(self._num_workers):
            index_queue = context.Queue()
            index_queue.cancel_join_thread()  # main puts here; never block exit on its feeder
            w = context.Process(
                target=_worker_loop,
                args=(
                    self._dataset_kind,
                    self._dataset,
                    index_queue,
                    self._worker_result_queue,
                    self._workers_done_event,
                    self._auto_collation,
                    self._collate_fn,
                    self._drop_last,
                    self._base_seed,
                    loader.worker_init_fn,
                    i,
                    self._num_workers,
                    self._persistent_workers,
                    self._worker_method,
                    self._trace is not None,
                    self._prefetch_factor * self._num_workers + 1 if loader.stateful else 0,
                    self._resumed["workers"][i] if self._resumed and "workers" in self._resumed else None,
                ),
                name=f"minidl_worker_{i}",
            )
            w.daemon = True
            w.start()
            # Only started workers are recorded, so shutdown never joins one that never ran.
            self._index_queues.append(index_queue)
            self._workers.append(w)

        if self._pin_memory:
            from minidl.pin_memory import _pin_memory_loop

            self._pin_memory_thread_done_event = threading.Event()
            self._data_queue = queue.Queue()
            self._pin_memory_thread = threading.Thread(
                target=_pin_memory_loop,
                args=(
                    self._worker_result_queue,
                    self._data_queue,
                    self._pin_memory_thread_done_event,
                    self._pin_memory_device,
                    Recorder("pin") if self._trace is not None else None,
                ),
                daemon=True,
                name="minidl_pin_memory",
            )
            self._pin_memory_thread.start()
        else:
            self._data_queue = self._worker_result_queue

        global _atexit_registered
        _live_iterators.add(self)
        if not _atexit_registered:
            atexit.register(_shutdown_live_iterators)
            _atexit_registered = True
        self._reset(loader, first_iter=True)

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        self._send_idx = 0  # idx of the next task to be sent to workers
        self._rcvd_idx = 0  # idx of the next task to be returned in __next__
        self._task_info = {}  # task idx -> (worker_id,) in flight, or (worker_id, data) arrived early
        self._tasks_outstanding = 0  # tasks sent whose answer has not been received yet
        self._workers_status = [True] * self._num_workers  # False once a worker is told to stop
        self._workers_num_tasks = [0] * self._num_workers  # tasks in flight per worker
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        self._received_at = {}  # tracing only: task idx -> when it arrived early
        if first_iter and self._resumed is not None:
            self._resume_dispatch(self._resumed)
        if not first_iter:
            # Persistent workers: tell each one a new epoch begins and wait for every ack, so no
            # stale result from the last epoch can be mistaken for one of this epoch.
            for index_queue in self._index_queues:
                index_queue.put(_ResumeIteration())
            acks = self._num_workers
            while acks > 0:
                if isinstance(self._get_data()[0], _ResumeIteration):
                    acks -= 1  # anything else is a stale result of the last epoch: dropped
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _resume_dispatch(self, state: dict) -> None:
        """Continue task numbering and round-robin exactly where the saved iterator stood."""
        self._send_idx = self._rcvd_idx = state["tasks_done"]
        for worker_id, ended in enumerate(state.get("workers_ended", ())):
            if ended:  # its IterableDataset replica had run out
                self._workers_status[worker_id] = False
                if not self._persistent_workers:
                    self._index_queues[worker_id].put(None)
        for _ in range(state.get("next_worker") or 0):  # the next dispatch goes to next_worker
            next(self._worker_queue_idx_cycle)

    def _state_dict(self) -> dict:
        """Ask each active worker for its state before its first batch not yet handed out."""
        if not self._in_order:
            raise ValueError("state_dict() needs in_order=True: out of order, what comes next is not reproducible")
        if self._shutdown:
            raise RuntimeError("this iterator's workers are shut down (an error or a timeout): nothing to save")
        if not self._snapshots:
            raise RuntimeError("state_dict() with workers needs DataLoader(..., stateful=True), so each worker "
                               "keeps the random state it had before each batch")
        if self._worker_method == "thread" and self._dataset_kind == _DatasetKind.Iterable:
            raise ValueError("state_dict() can't save an IterableDataset shared by thread workers: their "
                             "replicas are one object; use worker_method='multiprocessing'")
        k = self._rcvd_idx
        pending = {i for i, active in enumerate(self._workers_status) if active}
        for i in pending:
            self._index_queues[i].put(_StateRequest(k))
        states = {}
        while pending:
            idx, data, *events = self._get_data()
            if isinstance(idx, _StateRequest):
                worker_id, state = data
                states[worker_id] = state
                pending.discard(worker_id)
                continue
            # A batch that was in flight: keep it, exactly as _next_data would on an early arrival.
            self._tasks_outstanding -= 1
            if self._recorder is not None:
                self._trace.extend(events[0] if events else [])
            if isinstance(data, _IterableDatasetStopIteration):
                self._workers_status[data.worker_id] = False
                if not self._persistent_workers:
                    self._index_queues[data.worker_id].put(None)
            else:
                self._task_info[idx] += (data,)
        state = _base_state(self, tasks_done=k)
        state["workers"] = [states.get(i) for i in range(self._num_workers)]
        state["workers_ended"] = [i not in states or states[i]["ended"] for i in range(self._num_workers)]
        state["next_worker"] = self._task_info[k][0] if k in self._task_info else None
        return state

    def _try_get_data(self, timeout: float = MP_STATUS_CHECK_INTERVAL):
        """One bounded wait on the data queue: (True, data), or (False, None) if nothing came."""
        try:
            return True, self._data_queue.get(timeout=timeout)
        except queue.Empty:
            failed = [
                (i, w) for i, w in enumerate(self._workers) if self._workers_status[i] and not w.is_alive()
            ]
            if failed:
                for i, _ in failed:
                    self._mark_worker_as_unavailable(i)
                self._shutdown_workers()
                raise RuntimeError(
                    "DataLoader worker(s) exited unexpectedly: "
                    + ", ".join(_describe_exit(w) for _, w in failed)
                ) from None
            return False, None

    def _get_data(self):
        if self._timeout > 0:
            deadline_wait = self._timeout
            success, data = self._try_get_data(deadline_wait)
            if success:
                return data
            self._shutdown_workers()
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        while True:
            if self._pin_memory and not self._pin_memory_thread.is_alive():
                raise RuntimeError("Pin memory thread exited unexpectedly")
            success, data = self._try_get_data()
            if success:
                return data

    def _next_data(self):
        # Tracing only: since when has a later batch sat ready while we wait for this one?
        held_since = None
        if self._recorder is not None and any(len(v) == 2 for v in self._task_info.values()):
            held_since = now()
        while True:
            # Skip tasks that will never be answered (their worker stopped: an exhausted
            # IterableDataset replica) until the next task that has data or is still coming.
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info:
                    worker_id = info[0]
                    if len(info) == 2 or self._workers_status[worker_id]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration

            # The next task in order already arrived early: hand it back from the buffer.
            if len(self._task_info[self._rcvd_idx]) == 2:
                worker_id, data = self._task_info.pop(self._rcvd_idx)
                if self._recorder is not None:
                    self._recorder.add("reorder", self._rcvd_idx, self._received_at.pop(self._rcvd_idx), now())
                self._rcvd_idx += 1
                return self._process_data(data, worker_id, self._rcvd_idx - 1)

            waited_since = now() if self._recorder is not None else None
            idx, data, *events = self._get_data()
            self._tasks_outstanding -= 1
            if self._recorder is not None:
                self._trace.extend(events[0] if events else [])
                self._recorder.instant("receive", idx, waited_since=waited_since)
            if isinstance(data, _IterableDatasetStopIteration):
                # This replica is exhausted: stop sending it work (but keep persistent ones).
                if self._persistent_workers:
                    self._workers_status[data.worker_id] = False
                else:
                    self._mark_worker_as_unavailable(data.worker_id)
                self._try_put_index()
                continue

            if idx != self._rcvd_idx:
                if not self._in_order:
                    worker_id = self._task_info.pop(idx)[0]
                    return self._process_data(data, worker_id, idx)
                self._task_info[idx] += (data,)  # early: hold it in the reorder buffer
                if self._recorder is not None:
                    self._received_at[idx] = now()
                    held_since = held_since or now()
            else:
                worker_id = self._task_info.pop(idx)[0]
                self._rcvd_idx += 1
                if held_since is not None:
                    self._recorder.add("reorder_block", idx, held_since, now())
                return self._process_data(data, worker_id, idx)

    def _try_put_index(self) -> None:
        """Send the next batch of indices to the next active worker, round-robin."""
        max_tasks = self._prefetch_factor * self._num_workers
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):
            worker_queue_idx = next(self._worker_queue_idx_cycle)
            if not self._workers_status[worker_queue_idx]:
                continue
            # Out of order, a slow worker must not hog the in-flight slots: cap its share.
            if self._in_order or self._workers_num_tasks[worker_queue_idx] < max_tasks // sum(
                self._workers_status
            ):
                break
        else:
            return  # no active worker can take it

        if self._recorder is not None:
            self._recorder.instant("send", self._send_idx, worker=worker_queue_idx)
        self._index_queues[worker_queue_idx].put((self._send_idx, index))
        self._task_info[self._send_idx] = (worker_queue_idx,)
        self._workers_num_tasks[worker_queue_idx] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _process_data(self, data, worker_id: int, idx: int):
        self._trace_batch = idx
        self._workers_num_tasks[worker_id] -= 1
        self._try_put_index()  # a slot freed: keep the pipeline full
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        return data

    def _mark_worker_as_unavailable(self, worker_id: int, shutdown: bool = False) -> None:
        # Send the sentinel so the worker exits its loop (a dead one just never reads it).
        self._index_queues[worker_id].put(None)
        self._workers_status[worker_id] = False

    def _shutdown_workers(self) -> None:
        # See NOTE [ Worker queues and shutdown ] for the numbered steps.
        if self._shutdown:
            return
        self._shutdown = True  # 1
        try:
            if hasattr(self, "_pin_memory_thread"):  # 2
                self._pin_memory_thread_done_event.set()
                self._worker_result_queue.put((None, None))
                self._pin_memory_thread.join()
                self._worker_result_queue.cancel_join_thread()
                self._worker_result_queue.close()
            self._workers_done_event.set()  # 3
            for worker_id in range(len(self._workers)):  # 4
                if self._persistent_workers or self._workers_status[worker_id]:
                    self._mark_worker_as_unavailable(worker_id, shutdown=True)
            for w in self._workers:  # 5
                w.join(timeout=MP_STATUS_CHECK_INTERVAL)
            for q in self._index_queues:
                q.cancel_join_thread()
                q.close()
        finally:
            for w in self._workers:  # 6
                if w.is_alive() and w.pid is not None:
                    w.terminate()
                    w.join(timeout=MP_STATUS_CHECK_INTERVAL)
            _live_iterators.discard(self)

    def __del__(self) -> None:
        self._shutdown_workers()


def _base_state(it: _BaseDataLoaderIter, tasks_done: int) -> dict:
    return {"version": STATE_VERSION, "num_workers": it._num_workers, "worker_method": it._worker_method,
            "tasks_done": tasks_done, "num_yielded": it._num_yielded, "generators": it._generator_states,
            "base_seed": it._base_seed, "draws_base_seed": it._epoch_draws_base_seed}


def _describe_exit(w) -> str:
    """'pid 123 (exit code -9, killed by SIGKILL)' for a dead worker process; its name for a thread."""
    if w.pid is None:
        return f"thread {w.name}"
    code = w.exitcode
    if code is not None and code < 0:
        import signal

        try:
            return f"pid {w.pid} (exit code {code}, killed by {signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"pid {w.pid} (exit code {code})"
