"""The loader against torch 2.13 itself: WorkerInfo, warnings, bad arguments, exception types.

Each test runs the same thing through ``torch.utils.data`` and ``minidl`` and compares.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402
from loadertools import TorchShardedRange  # noqa: E402
from torch.utils.data._utils import worker as torch_worker  # noqa: E402

import minidl  # noqa: E402
import minidl.fetch  # noqa: E402
from minidl import worker  # noqa: E402
from minidl_course import toy  # noqa: E402

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(60)]


def outcome(make_and_iterate):
    """(exception type, message) of running it, or ('ok', the result)."""
    try:
        return "ok", make_and_iterate()
    except Exception as e:  # noqa: BLE001 -- the type is what is compared
        return type(e), str(e)


# --- WorkerInfo ---------------------------------------------------------------------------------


def test_worker_info_is_torchs_frozen_slotted_dataclass_field_for_field():
    assert [f.name for f in dataclasses.fields(worker.WorkerInfo)] == \
        [f.name for f in dataclasses.fields(torch_worker.WorkerInfo)]
    assert [f.default for f in dataclasses.fields(worker.WorkerInfo)] == \
        [f.default for f in dataclasses.fields(torch_worker.WorkerInfo)]
    assert "__slots__" in vars(worker.WorkerInfo) and "__slots__" in vars(torch_worker.WorkerInfo)
    ours = worker.WorkerInfo(id=1, num_workers=2, seed=7, dataset="d")
    theirs = torch_worker.WorkerInfo(id=1, num_workers=2, seed=7, dataset="d")
    assert repr(ours) == repr(theirs)  # every field in the repr, rng and worker_method included
    with pytest.raises(dataclasses.FrozenInstanceError):
        ours.id = 3
    assert [f.name for f in dataclasses.fields(worker._RNG)] == [f.name for f in dataclasses.fields(torch_worker._RNG)]


class Report(toy.RangeDataset):  # module level: spawn and forkserver workers import it by name
    def __getitem__(self, index):
        info = minidl.get_worker_info()
        rng = info.rng
        if rng is None:
            return index, info.worker_method, None
        draws = (rng.random_generator.random(), float(torch.rand((), generator=rng.torch_generator)),
                 float(rng.numpy_generator.random()))
        return index, info.worker_method, draws


def _as_is(x):
    return x


def infos(worker_method):
    loader = minidl.DataLoader(Report(4), batch_size=None, num_workers=2, worker_method=worker_method,
                               generator=torch.Generator().manual_seed(5), collate_fn=_as_is)
    return list(loader)


def test_process_workers_have_no_rng_as_in_torch():
    assert all(method == "multiprocessing" and rng is None for _, method, rng in infos("multiprocessing"))


def test_thread_workers_have_their_own_random_torch_and_numpy_generators_seeded_from_their_seed():
    got = infos("thread")
    assert got == infos("thread")  # reproducible: torch draws too, not only NumPy ones
    assert all(method == "thread" for _, method, _ in got)
    by_worker = {i % 2: draws for i, _, draws in got if i < 2}  # the first task of each worker
    assert by_worker[0] != by_worker[1]  # each worker its own streams
    base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(5)).item())
    seed = base_seed + 0  # worker 0's seed, as torch gives it
    expected = (random.Random(seed).random(), float(torch.rand((), generator=torch.Generator().manual_seed(seed))),
                float(np.random.default_rng(worker._generate_state(base_seed, 0)).random()))
    assert by_worker[0] == expected


def test_in_thread_workers_minidls_get_worker_info_shards_and_torchs_is_left_alone():
    def samples(dataset):
        loader = minidl.DataLoader(dataset, batch_size=3, num_workers=2, worker_method="thread", collate_fn=list)
        return sorted(int(x) for batch in loader for x in batch)

    assert samples(toy.ShardedRange(0, 20)) == list(range(20))  # minidl.get_worker_info: each thread its own info
    # torch's get_worker_info reads one module global that threads would share, so minidl leaves it alone: in a
    # thread worker it answers None, and a dataset sharded with it yields all of itself in every worker.
    assert samples(TorchShardedRange(0, 20)) == sorted(list(range(20)) * 2)
    assert "thread workers" in minidl.get_worker_info.__doc__


# --- warnings and bad arguments -------------------------------------------------------------------


class TorchOverlongRange(tud.IterableDataset):
    """Claims 4 items, streams 6 (a torch IterableDataset, so torch's loader sees an iterable too)."""

    def __iter__(self):
        return iter(range(6))

    def __len__(self):
        return 4

    def __repr__(self):
        return "TorchOverlongRange()"


@pytest.mark.parametrize("num_workers", [0, 1])
def test_overlong_iterable_dataset_warns_with_torchs_words(num_workers):
    def messages(module):
        loader = module.DataLoader(TorchOverlongRange(), batch_size=None, num_workers=num_workers)
        len(loader)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(loader)
        return [str(w.message) for w in caught if "Length of IterableDataset" in str(w.message)]

    ours = messages(minidl)
    assert ours == messages(tud) and len(ours) == 2


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # torch's own __del__
@pytest.mark.parametrize("case", [
    dict(num_workers=2, prefetch_factor=0),
    dict(timeout=1.0),
    dict(generator="x"),
    dict(generator="x", shuffle=True),
])
def test_bad_arguments_raise_what_torch_raises(case):
    def run(module):
        return outcome(lambda: next(iter(module.DataLoader(list(range(8)), **case))))

    ours, theirs = run(minidl), run(tud)
    assert ours[0] is theirs[0] and ours[0] in (AssertionError, TypeError), (ours, theirs)
    assert ours[1] == theirs[1]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # torch's own __del__
@pytest.mark.parametrize("num_workers", [0, 1])
def test_pickling_an_iterator_raises_torchs_error_word_for_word(num_workers):
    import pickle

    def run(module):
        return outcome(lambda: pickle.dumps(iter(module.DataLoader(list(range(4)), num_workers=num_workers))))

    ours, theirs = run(minidl), run(tud)
    assert ours[0] is theirs[0] is NotImplementedError
    assert ours[1] == theirs[1]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_an_exception_built_only_from_keyword_message_keeps_its_type(num_workers):
    def run(module):
        return outcome(lambda: list(module.DataLoader(toy.KeywordErrorDataset(6, bad_index=3), batch_size=2,
                                                      num_workers=num_workers)))

    ours, theirs = run(minidl), run(tud)
    assert ours[0] is theirs[0] is toy.KeywordOnlyError
    if num_workers:
        assert "Caught KeywordOnlyError in DataLoader worker process 0" in ours[1] and "bad sample 3" in ours[1]


def _report_the_loops_assertion(loop, report) -> None:
    """Run a worker loop, in a child process, on a sentinel sent while it still had work; report what it raised."""
    index_queue, data_queue, done_event = multiprocessing.Queue(), multiprocessing.Queue(), multiprocessing.Event()
    index_queue.put(None)  # the sentinel, with neither done_event set nor the dataset exhausted
    try:
        loop(minidl.fetch._DatasetKind.Map, range(4), index_queue, data_queue, done_event, False, _as_is, False, 0,
             None, 0, 1, False, None)
    except AssertionError as e:
        report.put(str(e))
    else:
        report.put(None)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="each loop runs in a forked child")
def test_a_worker_given_the_sentinel_while_it_has_work_raises_torchs_assertion():
    context = multiprocessing.get_context("fork")
    said = []
    for loop in (torch_worker._worker_loop, worker._worker_loop):
        report = context.Queue()
        child = context.Process(target=_report_the_loops_assertion, args=(loop, report))
        child.start()
        said.append(report.get(timeout=30))
        child.join(timeout=30)
    assert said[0] == said[1] == "Received final signal but neither done_event nor iteration_end is set"


def test_dataloader_is_subscriptable_as_in_torch():
    assert minidl.DataLoader[int].__origin__ is minidl.DataLoader
    assert tud.DataLoader[int].__origin__ is tud.DataLoader


# --- the rest of the loader's public surface ----------------------------------------------------


def test_dataloader_signature_is_torchs_plus_four_documented_additions():
    import inspect

    ours = inspect.signature(minidl.DataLoader.__init__).parameters
    theirs = inspect.signature(tud.DataLoader.__init__).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    for name, p in theirs.items():
        assert (ours[name].kind, ours[name].default) == (p.kind, p.default), name
    added = ["worker_method", "trace", "stateful", "snapshot_every_n_steps"]  # minidl's, keyword-only
    assert list(ours)[len(theirs):] == added
    assert all(ours[n].kind is inspect.Parameter.KEYWORD_ONLY for n in added)
    assert ours["snapshot_every_n_steps"].default == 1  # torchdata's StatefulDataLoader's name and default
    assert inspect.signature(minidl.get_worker_info).parameters == inspect.signature(tud.get_worker_info).parameters


BAD = [
    dict(num_workers=-1),
    dict(timeout=-1),
    dict(num_workers=0, prefetch_factor=2),
    dict(num_workers=1, prefetch_factor=-1),
    dict(persistent_workers=True),
    dict(sampler=[0, 1], shuffle=True),
    dict(batch_sampler=[[0, 1]], batch_size=2),
    dict(batch_sampler=[[0, 1]], drop_last=True),
    dict(batch_size=None, drop_last=True),
    dict(num_workers=0, multiprocessing_context="spawn"),
    dict(num_workers=1, multiprocessing_context="nonsense"),
    dict(num_workers=1, multiprocessing_context=3),
]


@pytest.mark.parametrize("case", BAD, ids=[",".join(c) for c in BAD])
def test_bad_arguments_at_construction_raise_torchs_type_with_its_message(case):
    ours = outcome(lambda: minidl.DataLoader(list(range(8)), **case))
    theirs = outcome(lambda: tud.DataLoader(list(range(8)), **case))
    assert ours[0] is theirs[0] and ours[0] in (ValueError, TypeError)
    # the same words up to the first difference in spacing/case: compare the opening, normalised
    assert ours[1].lower().replace(" ", "")[:30] == theirs[1].lower().replace(" ", "")[:30], (ours, theirs)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_device_warns_as_deprecated_like_torch(num_workers):
    # torch 2.13 ignores pin_memory_device (it pins for the current accelerator) and says so.
    def warnings_of(module):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(module.DataLoader(range(4), batch_size=2, num_workers=num_workers, pin_memory=True,
                                   pin_memory_device="cuda:1"))
        return [str(w.message) for w in caught if "pin" in str(w.message)]

    assert warnings_of(minidl) == warnings_of(tud)
    assert any("pin_memory_device is deprecated" in m for m in warnings_of(minidl))


@pytest.mark.parametrize("affinity", ["counted", "unknown, as on a Mac"])
def test_too_many_workers_warn_in_torchs_words(affinity, monkeypatch):
    import os

    if affinity != "counted":  # a Mac's os module: no affinity mask to count, only os.cpu_count()
        monkeypatch.delattr(os, "sched_getaffinity", raising=False)
        monkeypatch.delattr(os, "process_cpu_count", raising=False)

    def message(module):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module.DataLoader(range(4), num_workers=1000)
        return [str(w.message) for w in caught]

    assert message(minidl) == message(tud) and len(message(tud)) == 1
