"""DataLoader: sampler -> indices -> fetch -> collate -> batch, in one process or across workers.

Mirrors ``torch/utils/data/dataloader.py``. The single-process iterator is the whole idea: sample,
fetch, collate, and pin when asked. The multi-worker iterator adds queues, a reorder buffer and a shutdown
protocol (see the NOTE below). Workers are processes by default, or threads with
``worker_method="thread"``, minidl's one addition to torch's loader. Where they part from torch's code, the lines
sit between ``# >>> thread workers`` and ``# <<< thread workers``, as in worker.py, or one line says
``# thread workers:``.

minidl's optional layers, tracing (minidl/trace.py) and resume (minidl/state.py), are iterator
subclasses put on top in ``DataLoader._get_iterator``. Every line of this file that serves one sits
between ``# >>> layer: NAME`` and ``# <<< layer: NAME``, the few methods the layers extend included.
Delete those lines and the layers' files, and the loader runs without them (tests/test_layers_removed.py does it).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
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
from typing import Any, Generic, TypeVar

import numpy as np

from minidl import _random, _utils
from minidl._picklable import check_main_module, pickling_errors_named
from minidl._thread_workers import _InThread, _ThreadContext  # thread workers: their context and worker side
from minidl._utils import MP_STATUS_CHECK_INTERVAL, ExceptionWrapper, process_cpu_count
from minidl.collate import default_collate, default_convert
from minidl.dataset import Dataset, IterableDataset
from minidl.fetch import _DatasetKind
from minidl.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler
from minidl.worker import (
    _apply_shared_seed,
    _InProcess,
    _is_iter_datapipe,
    _IterableDatasetStopIteration,
    _ResumeIteration,
    _worker_loop,
    _WorkerOptions,
    get_worker_info,
)

__all__ = ["DataLoader", "get_worker_info", "default_collate", "default_convert"]  # torch's own list

_T_co = TypeVar("_T_co", covariant=True)
WORKER_METHODS = ("multiprocessing", "thread")  # thread workers: the second choice


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


# >>> DataPipes: torch's classic DataLoader also runs an IterDataPipe or MapDataPipe graph
# (torch.utils.data.datapipes), for forward compatibility, and so does this one.
# The graph's own shufflers and sharding_filter do the work. The loader only switches them on and feeds them:
#   DataLoader.__init__   wraps the graph so that it can be pickled (_DataPipeSerializationWrapper).
#                         shuffle= turns the graph's shufflers on or off. Other IterableDatasets refuse shuffle=.
#   each iterator/epoch   draws one shared seed from loader.generator, BEFORE base_seed (_share_dist_seed).
#                         That seed seeds the graph's random datapipes. Workers reseed their copy with the same seed.
#   then                  shards the graph: over the ranks in the main process, over workers x ranks in workers.
def _is_datapipe(dataset) -> bool:
    torch_data = sys.modules.get("torch.utils.data")  # without torch imported, nothing can be a datapipe
    return torch_data is not None and isinstance(dataset, (torch_data.IterDataPipe, torch_data.MapDataPipe))


def _datapipe_serialization_wrapper(datapipe):
    from torch.utils.data.datapipes.datapipe import (
        _IterDataPipeSerializationWrapper,
        _MapDataPipeSerializationWrapper,
    )

    if _is_iter_datapipe(datapipe):
        return _IterDataPipeSerializationWrapper(datapipe)
    return _MapDataPipeSerializationWrapper(datapipe)


def _get_distributed_settings() -> tuple[int, int]:
    """(world_size, rank) when torch.distributed is initialized, else (1, 0)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _sharding_worker_init_fn(worker_init_fn, world_size, rank_id, worker_id) -> None:
    """Runs first in each worker: keep this worker's share of the datapipe graph, then call ``worker_init_fn``.

    There are ``num_workers * world_size`` shares. Worker ``w`` of rank ``r`` keeps share ``w * world_size + r``.
    """
    from torch.utils.data.graph_settings import apply_sharding

    info = get_worker_info()
    if info is None:
        raise AssertionError("Worker info is None in sharding worker init function")
    if not _is_datapipe(info.dataset):
        raise AssertionError("datapipe must be an instance of IterDataPipe or MapDataPipe")
    total_workers = info.num_workers * world_size
    global_worker_id = worker_id * world_size + rank_id
    apply_sharding(info.dataset, total_workers, global_worker_id)
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


def _datapipe_process_group():
    """A gloo group to broadcast rank 0's shared seed on, when torch.distributed is initialized. Else None."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo") if dist.is_available() and dist.is_initialized() else None


def _share_dist_seed(generator, pg) -> int:
    """The epoch's shared seed: one draw from the loader's generator, which is rank 0's with a process group."""
    if pg is None:
        return _random.draw_seed(generator)  # the draw torch makes with torch.empty((), dtype=torch.int64).random_()
    import torch
    import torch.distributed as dist

    _shared_seed = torch.empty((), dtype=torch.int64).random_(generator=generator)
    dist.broadcast(_shared_seed, src=0, group=pg)
    return _shared_seed.item()
# <<< DataPipes


def _accelerator_available() -> bool:
    if not _random.HAS_TORCH:
        return False
    import torch

    return torch.accelerator.is_available()


class DataLoader(Generic[_T_co]):
    """Combines a dataset and a sampler into an iterable over batches, as ``torch.utils.data.DataLoader``.

    minidl's additions: ``worker_method`` runs the ``num_workers`` workers as processes
    (``"multiprocessing"``, torch's only choice) or as threads (``"thread"``). The layers add two more.
    ``trace=True`` records every step of every batch into ``loader.trace`` (minidl/trace.py).
    ``stateful=True`` makes the loader resumable mid-epoch with ``state_dict()`` and ``load_state_dict()``
    (minidl/state.py).
    """

    def __init__(
        self,
        dataset: Dataset[_T_co] | IterableDataset[_T_co] | Any,
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
        # >>> layer: tracing (minidl/trace.py)
        trace: bool | Any = False,  # or a minidl.trace.Trace to record into
        # <<< layer: tracing
        # >>> layer: resume (minidl/state.py)
        stateful: bool = False,
        snapshot_every_n_steps: int | None = 1,  # how often workers ship their state (torchdata's name and default)
        # <<< layer: resume
    ) -> None:
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; use num_workers=0 to disable multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing."  # torch's words, to the letter
                "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None."
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

        if _is_datapipe(dataset):  # see the DataPipes block
            # >>> thread workers: not for datapipes
            if num_workers > 0 and worker_method == "thread":
                raise ValueError(
                    "DataLoader with IterDataPipe or MapDataPipe: worker_method='thread' is not supported (thread "
                    "workers share one datapipe graph, and each worker must shard and seed its own copy); use "
                    "worker_method='multiprocessing' or num_workers=0"
                )
            # <<< thread workers
            self.dataset = _datapipe_serialization_wrapper(dataset)

        # Samplers choose keys; an IterableDataset has none, so it accepts no sampler at all.
        if _is_iterable_dataset(dataset):
            self._dataset_kind = _DatasetKind.Iterable
            if _is_iter_datapipe(dataset):  # shuffle= switches the graph's shufflers on or off; None leaves them
                if shuffle is not None:
                    from torch.utils.data.graph_settings import apply_shuffle_settings

                    dataset = apply_shuffle_settings(dataset, shuffle=shuffle)
            elif shuffle not in {False, None}:
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
        self._IterableDataset_len_called = None  # the length len(self) reported: more batches than that get a warning
        self._iterator = None  # kept between epochs only with persistent_workers
        # >>> layer: tracing (minidl/trace.py)
        if trace is True:
            from minidl.trace import Trace

            trace = Trace()
        self.trace = trace or None
        if self.trace is not None:
            self.trace.num_workers, self.trace.worker_method, self.trace.in_order = num_workers, worker_method, in_order
        # <<< layer: tracing
        # >>> layer: resume (minidl/state.py)
        if snapshot_every_n_steps is not None and (not isinstance(snapshot_every_n_steps, int)
                                                   or snapshot_every_n_steps < 0):
            raise ValueError("snapshot_every_n_steps option should be a non-negative integer or None, but got "
                             f"snapshot_every_n_steps={snapshot_every_n_steps!r}")
        self.stateful = stateful
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self._last_iterator = None  # the newest iterator, held as torchdata holds it, for state_dict()
        self._resume_state = None  # set by load_state_dict(), taken by the next iterator
        # <<< layer: resume
        self.__initialized = True
        self.check_worker_number_rationality()

    def _get_iterator(self) -> _BaseDataLoaderIter:
        single, multi = _SingleProcessDataLoaderIter, _MultiProcessingDataLoaderIter
        # >>> layer: tracing (minidl/trace.py)
        if self.trace is not None:
            from minidl.trace import traced_iterators

            single, multi = traced_iterators(single, multi)
        # <<< layer: tracing
        # >>> layer: resume (minidl/state.py), on top of tracing when both are on
        if self.stateful:
            from minidl.state import stateful_iterators

            single, multi = stateful_iterators(single, multi)
        # <<< layer: resume
        if self.num_workers == 0:
            return single(self)
        self.check_worker_number_rationality()
        return multi(self)

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
            # >>> thread workers: no start method to choose
            if self.worker_method == "thread":
                raise ValueError("multiprocessing_context can't be used with worker_method='thread'")
            # <<< thread workers
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
        # These define the batches. Changing one mid-life would silently desync the samplers.
        frozen = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
        if self.__dict__.get("_DataLoader__initialized") and attr in frozen:
            raise ValueError(f"{attr} attribute should not be set after {self.__class__.__name__} is initialized")
        super().__setattr__(attr, val)

    def __iter__(self):
        # Persistent workers outlive an epoch, so the iterator is reused and only reset.
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is None:
                self._iterator = self._get_iterator()
            else:
                self._iterator._reset(self)
            return self._iterator
        return self._get_iterator()

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        # What the fetcher consumes. It is lists of indices when batching, and single indices otherwise.
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._dataset_kind == _DatasetKind.Iterable:
            # The dataset's own claim. With workers, it is only right if each replica shards itself.
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last else math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)

    def check_worker_number_rationality(self) -> None:
        """Warn, as torch does, when asking for more workers than this process may use cores."""
        if not self.num_workers:
            return
        cores = process_cpu_count()
        if self.num_workers > cores:
            kind = "threads" if self.worker_method == "thread" else "processes"  # thread workers: named as such
            cpuset = "" if hasattr(os, "sched_getaffinity") else " (`cpuset` is not taken into account)"  # a Mac
            warnings.warn(
                f"This DataLoader will create {self.num_workers} worker {kind} in total. Our suggested "
                f"max number of worker in current system is {cores}{cpuset}, which is smaller than what this "
                "DataLoader is going to create. Please be aware that excessive worker creation might get "
                "DataLoader running slow or even freeze, lower the worker number to avoid potential "
                "slowness/freeze if necessary.",
                stacklevel=2,
            )

    # >>> layer: resume (minidl/state.py)
    def state_dict(self) -> dict:
        """Save where this loader stands, mid-epoch or between epochs; ``load_state_dict`` resumes from there.

        It needs ``DataLoader(..., stateful=True)``. torch's DataLoader has no such pair; minidl follows
        torchdata's ``StatefulDataLoader``. See minidl/state.py.
        """
        from minidl.state import loader_state_dict

        return loader_state_dict(self)

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter(loader)`` continue where ``state`` (from ``state_dict``) stopped."""
        from minidl.state import load_loader_state

        load_loader_state(self, state)
    # <<< layer: resume


def _mp_module():
    """torch.multiprocessing when torch is installed, so that tensors travel in shared memory. Else multiprocessing."""
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
        if loader.pin_memory and loader.pin_memory_device:  # torch 2.13's words, missing space included
            warnings.warn(
                "pin_memory_device is deprecated, the current accelerator will be used as the device,"
                f"ignore pin_memory_device='{loader.pin_memory_device}'.",
                stacklevel=3,
            )
        if loader.pin_memory and not self._pin_memory:
            warnings.warn(
                "'pin_memory' argument is set as true but no accelerator is found, "
                "then device pinned memory won't be used.",
                stacklevel=3,
            )
        # The current accelerator's type ("cuda", "xpu", "mps", ...), as torch 2.13 sets it; None when not pinning.
        accelerator = _random._torch().accelerator.current_accelerator() if self._pin_memory else None
        self._pin_memory_device = accelerator.type if accelerator is not None else None
        if self._pin_memory_device == "mps":  # torch 2.13 cannot pin on MPS yet (its issue 86060)
            self._pin_memory = False
            warnings.warn(
                "'pin_memory' argument is set as true but not supported on MPS now, "
                "device pinned memory won't be used.",
                stacklevel=3,
            )
        self._timeout = loader.timeout
        self._collate_fn = loader.collate_fn
        self._worker_method = loader.worker_method
        if not _random.HAS_TORCH and not _is_generator(loader.generator):  # with torch, its draw refuses it
            raise TypeError(f"generator should be a torch.Generator or a numpy.random.Generator, but got "
                            f"generator={loader.generator!r} of type {type(loader.generator).__name__}")
        # The draws come in torch's order, so the same generator gives the same seeds as torch.
        # An IterDataPipe's shared seed is drawn first. Then the sampler's iterator is made; it is lazy,
        # so it draws nothing yet. Then base_seed is drawn.
        self._shared_seed = None  # an IterDataPipe's (see the DataPipes block)
        self._pg = None
        if _is_iter_datapipe(self._dataset):
            self._pg = _datapipe_process_group()
            self._seed_datapipe(loader)
        self._sampler_iter = iter(self._index_sampler)
        draw_base_seed = functools.partial(_random.draw_seed, loader.generator)
        # >>> layer: resume (minidl/state.py): a resumed epoch draws its base_seed as the saved epoch drew it
        if getattr(self, "_resumed", None) is not None:
            draw_base_seed = functools.partial(self._resumed_base_seed, loader)
        # <<< layer: resume
        self._base_seed = draw_base_seed()  # every worker's seed is base_seed + worker_id
        self._persistent_workers = loader.persistent_workers
        self._num_yielded = 0

    # >>> layer: shared by tracing and resume: a layer's iterator mixin (minidl/trace.py, minidl/state.py) extends
    def _layer_create_fetcher(self, create_fetcher):
        """The fetcher factory the main process uses, with the layers' main sides around it (none: as it is)."""
        return create_fetcher

    def _layer_workers(self, worker_id: int) -> tuple:
        """The layers' worker sides for worker ``worker_id``, passed in ``_WorkerOptions.layers`` (see worker.py)."""
        return ()

    def _hand_overs_unrecorded(self):
        """A block whose hand-overs a layer drops (resume's replay): the other layers record none of them."""
        return contextlib.nullcontext()
    # <<< layer: shared

    def __iter__(self):
        return self

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        if _is_iter_datapipe(self._dataset):  # a new shared seed each epoch (drawn again on a first epoch's reset)
            self._seed_datapipe(loader)

    def _seed_datapipe(self, loader: DataLoader) -> None:
        """Draw the epoch's shared seed from the loader's generator and seed the datapipe's random parts with it."""
        self._shared_seed = _share_dist_seed(loader.generator, self._pg)
        self._dataset = _apply_shared_seed(self._dataset, self._shared_seed)

    def _next_index(self):
        return next(self._sampler_iter)  # may raise StopIteration

    def _next_data(self):
        raise NotImplementedError

    def __next__(self):
        data = self._next_data()
        self._num_yielded += 1
        if (
            self._dataset_kind == _DatasetKind.Iterable
            and self._IterableDataset_len_called is not None
            and self._num_yielded > self._IterableDataset_len_called
        ):
            warn_msg = (  # torch's words, to the letter
                f"Length of IterableDataset {self._dataset} was reported to be {self._IterableDataset_len_called}"
                f"(when accessing len(dataloader)), but {self._num_yielded} samples have been fetched. "
            )
            if self._num_workers > 0:
                warn_msg += (
                    "For multiprocessing data-loading, this could be caused by not properly configuring the "
                    "IterableDataset replica at each worker. Please see "
                    "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples."
                )
            warnings.warn(warn_msg, stacklevel=2)
        return data

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self):
        # torch's exact arguments, so that the message is torch's: ('{} cannot be pickled', '<class name>')
        raise NotImplementedError("{} cannot be pickled", self.__class__.__name__)


def _is_generator(g) -> bool:
    if g is None or isinstance(g, np.random.Generator):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(g, torch.Generator)


class _SingleProcessDataLoaderIter(_BaseDataLoaderIter):
    """``num_workers=0``: the main process samples, fetches, collates (and pins) each batch itself."""

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        if self._timeout != 0:
            raise AssertionError("_SingleProcessDataLoaderIter requires timeout == 0")
        if self._num_workers != 0:
            raise AssertionError("_SingleProcessDataLoaderIter requires num_workers == 0")
        if _is_datapipe(self._dataset):  # one process: shard over the ranks only
            from torch.utils.data.graph_settings import apply_sharding

            apply_sharding(self._dataset, *_get_distributed_settings())
        create_fetcher = _DatasetKind.create_fetcher
        # >>> layer: shared by tracing and resume
        create_fetcher = self._layer_create_fetcher(create_fetcher)
        # <<< layer: shared
        self._dataset_fetcher = create_fetcher(
            self._dataset_kind, self._dataset, self._auto_collation, self._collate_fn, self._drop_last
        )

    def _next_data(self):
        index = self._next_index()  # may raise StopIteration
        data = self._dataset_fetcher.fetch(index)  # may raise StopIteration
        if self._pin_memory:
            from minidl.pin_memory import pin_memory

            data = pin_memory(data, self._pin_memory_device)
        return data


# The iterators whose workers are running. At interpreter exit, _shutdown_live_iterators shuts them down.
# It runs before multiprocessing's own exit hook, which would otherwise terminate their daemon workers
# from under them.
_live_iterators: weakref.WeakSet = weakref.WeakSet()
_atexit_registered = False


def _shutdown_live_iterators() -> None:
    for it in list(_live_iterators):
        it._shutdown_workers()


class _MultiProcessingDataLoaderIter(_BaseDataLoaderIter):
    """``num_workers > 0``: workers fetch and collate; the main process hands batches back in order."""

    _shutdown = True  # until workers exist: a half-built iterator has nothing to shut down
    _owner_pid = None  # the process that started the workers; only it may shut them down

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
    # Bookkeeping:
    #   * task k is sent with _send_idx == k;
    #   * _task_info[k] is (worker,) while task k is in flight, and (worker, batch) once it has arrived early;
    #   * _rcvd_idx is the next task to hand back. An early batch waits in _task_info until its turn.
    # At most prefetch_factor * num_workers tasks are in flight. Each batch handed back frees one slot.
    #
    # Shutdown protocol (_shutdown_workers). It runs on exhaustion, on an error, on `del`, on GC or at exit:
    #   1. Mark the iterator shut down, so the protocol runs only once.
    #   2. Stop the pin-memory thread: set its done event, wake it with a dummy item, join it.
    #   3. Set workers_done_event. Workers stop fetching and only drain their index queue.
    #   4. Put the None sentinel on every index queue. Each worker leaves its loop when it reads it.
    #   5. Join each worker for a bounded time, asking for its exit status too (_utils.join_worker: a spawned
    #      worker's torch_shm_manager can keep the pipe join() waits on open). Close the index queues without
    #      waiting for their feeder threads (cancel_join_thread): nobody will read what is left in them.
    #   6. Terminate any process worker still alive (stuck in user code) and join it, so no worker
    #      outlives the iterator. A thread worker cannot be killed. It is a daemon, and a thread stuck
    #      in a slow __getitem__ exits as soon as it gets back to the loop.
    #
    # A failure surfaces in the main process as an exception. It never leaves the main process hanging:
    #   * An exception in a worker travels to the main process as an ExceptionWrapper.
    #     The main process raises it again, with the same type.
    #   * A worker process may die (os._exit, SIGKILL, a segfault, the OOM killer).
    #     The main process raises a RuntimeError naming its pid and how it ended (exit code or signal).
    #     It notices the death in one of three ways:
    #     - At once, through SIGCHLD, for process workers started from the main thread.
    #       The handler (_utils._set_SIGCHLD_handler, as torch's) runs whenever a child ends.
    #       It checks the registered worker pids, and raises if one of ours ended badly.
    #     - On a failed read. A worker that dies right after putting a batch leaves a handle to shared
    #       memory that nobody can open, so the read fails (EOFError, ConnectionResetError).
    #       torch checks its workers at that point. But a worker not yet reaped still looks alive,
    #       so the raw error can escape (scripts/fault_loop.py counts how often; see results/README.md).
    #       minidl first joins its workers briefly, so the dead one is seen and named every time.
    #     - While waiting: every MP_STATUS_CHECK_INTERVAL seconds, the main process checks its workers.
    #     The iterator then shuts down. Every later next() raises the same error again:
    #     the epoch cannot finish, and must not end as if it were complete.
    #   * A read may fail because this process is out of file descriptors (EMFILE).
    #     Every batch from a process worker holds one. The error then says so, and names two fixes:
    #     raise `ulimit -n`, or use the 'file_system' sharing strategy
    #     (torch.multiprocessing.set_sharing_strategy), which holds none.
    #   * With timeout > 0, a batch that takes longer raises a RuntimeError naming the timeout.
    #     As in torch, the iterator lives on: the next next() serves the rest of the epoch.
    #   * A process worker polls for its parent, and exits if the main process has died.
    #
    # Which thread owns what. This matters without the GIL, where threads truly run at the same time:
    #   * Every attribute of this iterator (_task_info, _send_idx, _rcvd_idx, the status lists, the trace)
    #     belongs to the consumer's thread alone. Only __next__ and _shutdown_workers touch them, and both
    #     run in that thread (or in __del__ or atexit, once the consumer is gone).
    #   * Workers and the pin-memory thread share only queues and events with it, and those are thread-safe.
    #     Their results, and any layer's events, travel inside the queued tuples.
    #   * Thread workers do share the dataset and collate_fn, so those must be safe to call from several
    #     threads at once. Each thread worker keeps its own WorkerInfo, in thread-local storage.

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        if self._prefetch_factor <= 0:
            raise AssertionError("prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter")
        # >>> thread workers: threading's queues, event and threads stand in for a multiprocessing context
        if self._worker_method == "thread":
            context = _ThreadContext
            runs_in = _InThread  # says how a worker seeds itself, keeps its WorkerInfo and watches its parent
        else:
            context = loader.multiprocessing_context or _mp_module().get_context()
            runs_in = _InProcess
            check_main_module(context, loader)  # spawn/forkserver: refuse now what a worker could not import
        # <<< thread workers
        self._worker_init_fn = loader.worker_init_fn
        if _is_datapipe(self._dataset):  # each worker first keeps its own share (see the DataPipes block)
            self._worker_init_fn = functools.partial(
                _sharding_worker_init_fn, self._worker_init_fn, *_get_distributed_settings()
            )

        self._worker_result_queue = context.Queue()
        # Process workers share a flag: a killed worker cannot leave it locked, as it could an Event.
        # thread workers: they share a threading.Event.
        self._workers_done_event = context.Event() if context is _ThreadContext else _utils.DoneFlag(context)
        self._index_queues = []
        self._workers = []
        self._failure = None  # set when a worker died: every later next() raises it again
        self._owner_pid = os.getpid()
        self._shutdown = False  # from here on, __del__ has workers and queues to clean up
        for i in range(self._num_workers):
            index_queue = context.Queue()
            index_queue.cancel_join_thread()  # the main process puts here: exiting never waits for the queue's feeder
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
                    self._worker_init_fn,
                    i,
                    self._num_workers,
                    self._persistent_workers,
                    self._shared_seed,
                    _WorkerOptions(
                        runs_in=runs_in,
                        # >>> layer: shared by tracing and resume
                        layers=self._layer_workers(i),
                        # <<< layer: shared
                    ),
                ),
                name=f"minidl_worker_{i}",
            )
            w.daemon = True
            with pickling_errors_named(context, loader):  # spawn/forkserver pickle the arguments here: name what fails
                w.start()
            # Only started workers are recorded, so shutdown never joins one that never ran.
            self._index_queues.append(index_queue)
            self._workers.append(w)

        if self._pin_memory:
            self._pin_memory_thread_done_event = threading.Event()
            self._data_queue = queue.Queue()
            from minidl.pin_memory import _pin_memory_loop

            in_queue, out_queue = self._worker_result_queue, self._data_queue
            # >>> layer: tracing (minidl/trace.py): its queues note when the thread pins each batch
            in_queue, out_queue = self._traced_pin_queues(in_queue, out_queue)
            # <<< layer: tracing
            device_id = _random._torch().accelerator.current_device_index()  # the device to pin for, as torch
            pin_memory_thread = threading.Thread(
                target=_pin_memory_loop,
                args=(in_queue, out_queue, device_id, self._pin_memory_thread_done_event, self._pin_memory_device),
                name="minidl_pin_memory",
            )
            pin_memory_thread.daemon = True
            pin_memory_thread.start()
            self._pin_memory_thread = pin_memory_thread  # recorded once started, as the workers are
        else:
            self._data_queue = self._worker_result_queue

        if self._worker_method == "multiprocessing":  # thread workers: no SIGCHLD. See the NOTE: a death seen at once
            _utils._set_worker_pids(id(self), tuple(w.pid for w in self._workers))
            _utils._set_SIGCHLD_handler()
        global _atexit_registered
        _live_iterators.add(self)
        if not _atexit_registered:
            atexit.register(_shutdown_live_iterators)
            _atexit_registered = True
        self._reset(loader, first_iter=True)

    # >>> layer: tracing (minidl/trace.py)
    def _traced_pin_queues(self, in_queue, out_queue) -> tuple:
        """The pin thread's two queues; the traced iterator wraps them (untraced: as they are)."""
        return in_queue, out_queue
    # <<< layer: tracing

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        if self._failure is not None:  # a persistent worker died in an earlier epoch: raise again, as torch does
            raise RuntimeError(self._failure)
        super()._reset(loader, first_iter)
        self._send_idx = 0  # idx of the next task to be sent to workers
        self._rcvd_idx = 0  # idx of the next task to be returned in __next__
        self._task_info = {}  # task idx -> (worker_id,) in flight, or (worker_id, data) once it arrived
        self._tasks_outstanding = 0  # tasks sent whose answer has not been received yet
        self._workers_status = [True] * self._num_workers  # False once a worker is told to stop
        self._workers_num_tasks = [0] * self._num_workers  # tasks in flight per worker
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:
            # Persistent workers: tell each one a new epoch begins and wait for every ack, so no
            # stale result from the last epoch can be mistaken for one of this epoch.
            for index_queue in self._index_queues:
                index_queue.put(_ResumeIteration(self._shared_seed))
            acks = self._num_workers
            while acks > 0:
                if isinstance(self._get_data()[0], _ResumeIteration):
                    acks -= 1  # anything else is a stale result of the last epoch: dropped
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _try_get_data(self, timeout: float = MP_STATUS_CHECK_INTERVAL):
        """One bounded wait on the data queue: (True, data), or (False, None) if nothing came."""
        try:
            return True, self._data_queue.get(timeout=timeout)
        except Exception as e:
            # A failed read (not a timeout) most likely means a worker died. Give its death time to show.
            failed = self._failed_workers(wait=not isinstance(e, queue.Empty))
            if failed:
                self._fail(failed, e)
            if isinstance(e, queue.Empty):
                return False, None
            _raise_if_out_of_file_descriptors()
            raise

    def _fail(self, failed: list, cause: BaseException | None = None):
        """Shut down for good and raise a RuntimeError naming the dead workers; every later next() raises it too."""
        # >>> thread workers: a thread that left its loop without the sentinel has no pid, nor exit code
        if failed[0].pid is None:
            self._failure = f"DataLoader worker thread(s) {[w.name for w in failed]} exited unexpectedly"
        else:
            self._failure = _utils.worker_failure_message([(w.pid, w.exitcode) for w in failed])
        # <<< thread workers
        self._shutdown_workers()
        raise RuntimeError(self._failure) from cause

    def _failed_workers(self, wait: bool) -> list:
        """The workers that should be running and are not. With ``wait``, first join them for up to one interval."""
        deadline = _utils.now() + (MP_STATUS_CHECK_INTERVAL if wait else 0.0)
        while True:
            failed = [w for i, w in enumerate(self._workers) if self._workers_status[i] and not w.is_alive()]
            if failed or _utils.now() >= deadline:
                return failed
            for w in self._workers:
                w.join(timeout=0.01)

    def _get_data(self):
        if self._timeout > 0:
            success, data = self._try_get_data(self._timeout)
            if success:
                return data
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        while True:
            if self._pin_memory and not self._pin_memory_thread.is_alive():
                raise RuntimeError("Pin memory thread exited unexpectedly")
            success, data = self._try_get_data()
            if success:
                return data

    def _next_data(self):
        if self._failure is not None:
            raise RuntimeError(self._failure)
        if self._worker_method == "multiprocessing" and not self._shutdown and id(self) not in _utils._worker_pids:
            # The SIGCHLD handler reported a dead worker, maybe in the middle of our bookkeeping: stop here.
            self._fail(self._failed_workers(wait=True) or self._workers)
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

            # The next task in order has arrived: hand it back (from the reorder buffer if it came early).
            if len(self._task_info[self._rcvd_idx]) == 2:
                worker_id, data = self._task_info.pop(self._rcvd_idx)
                self._rcvd_idx += 1
                return self._process_data(data, worker_id)

            if self._shutdown or self._tasks_outstanding <= 0:  # torch's check and words
                raise AssertionError("Invalid iterator state: shutdown or no outstanding tasks when fetching next data")
            idx, data = self._get_data()
            self._tasks_outstanding -= 1
            if self._dataset_kind == _DatasetKind.Iterable and isinstance(data, _IterableDatasetStopIteration):
                # This replica is exhausted: stop sending it work (but keep persistent ones).
                if self._persistent_workers:
                    self._workers_status[data.worker_id] = False
                else:
                    self._mark_worker_as_unavailable(data.worker_id)
                self._try_put_index()
                continue

            if idx != self._rcvd_idx:
                if not self._in_order:  # out of order: hand it back at once
                    worker_id = self._task_info.pop(idx)[0]
                    return self._process_data(data, worker_id)
                self._task_info[idx] += (data,)  # early: keep it in the reorder buffer
            else:
                worker_id = self._task_info.pop(idx)[0]
                self._rcvd_idx += 1
                return self._process_data(data, worker_id)

    def _try_put_index(self) -> None:
        """Send the next batch of indices to the next active worker, round-robin."""
        max_tasks = self._prefetch_factor * self._num_workers
        if self._tasks_outstanding >= max_tasks:
            raise AssertionError("Number of outstanding tasks exceeded maximum allowed tasks")
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

        self._index_queues[worker_queue_idx].put((self._send_idx, index))
        self._task_info[self._send_idx] = (worker_queue_idx,)
        self._workers_num_tasks[worker_queue_idx] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _process_data(self, data, worker_id: int):
        self._workers_num_tasks[worker_id] -= 1
        self._try_put_index()  # a slot freed: keep the pipeline full
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        return data

    def _mark_worker_as_unavailable(self, worker_id: int, shutdown: bool = False) -> None:
        # Send the None sentinel, so the worker leaves its loop. A dead worker never reads it, which is harmless.
        if not self._workers_status[worker_id] and not self._persistent_workers and not shutdown:
            raise AssertionError("Worker status inconsistent when marking worker as unavailable")
        self._index_queues[worker_id].put(None)
        self._workers_status[worker_id] = False
        if self._workers_done_event.is_set() != shutdown:
            raise AssertionError("_workers_done_event state does not match shutdown flag")

    def _shutdown_workers(self) -> None:
        # See NOTE [ Worker queues and shutdown ] for the numbered steps.
        if self._shutdown:
            return
        self._shutdown = True  # 1
        _utils._remove_worker_pids(id(self))  # from here on, a worker that ends is no SIGCHLD error
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
                _utils.join_worker(w, MP_STATUS_CHECK_INTERVAL)
            for q in self._index_queues:
                q.cancel_join_thread()
                q.close()
        finally:
            for w in self._workers:  # 6
                if w.is_alive() and w.pid is not None:  # thread workers: a thread has no pid and cannot be killed
                    w.terminate()
                    _utils.join_worker(w, MP_STATUS_CHECK_INTERVAL)
            _live_iterators.discard(self)

    def __del__(self) -> None:
        if os.getpid() == self._owner_pid:  # a forked child inherits this object, but not its workers
            self._shutdown_workers()


def _raise_if_out_of_file_descriptors() -> None:
    """After a failed read, check whether this process is out of file descriptors, and if so say so, as torch does.

    The check opens 10 temporary files, as torch's does.
    """
    import contextlib
    import errno
    import tempfile

    try:
        with contextlib.ExitStack() as stack:
            for _ in range(10):
                stack.enter_context(tempfile.NamedTemporaryFile())
    except OSError as e:
        if e.errno == errno.EMFILE:
            raise RuntimeError(
                "Too many open files. Communication with the workers is no longer possible. Please increase "
                "the limit using `ulimit -n` in the shell or change the sharing strategy by calling "
                "`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of your code"
            ) from None

