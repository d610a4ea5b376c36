"""Resumed mid-epoch, a loader hands out exactly the batches the uninterrupted one would have: any dataset,
sampler or batch sampler, workers or none, a state saved at any point (after a `break`, from another thread, between
snapshots), and what the state keeps (random streams, a dataset's and its iterator's own state, JSON values)."""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from resumetools import (
    CONFIGS,
    CUTS,
    REDUCED,
    ROOT,
    SNAPSHOT_SETTINGS,
    WORKER_METHODS,
    CountsIterCalls,
    EpochSeededSampler,
    GrowingState,
    IteratorHoldsState,
    LiveState,
    NoLenResumableStream,
    NormalDraws,
    OwnIterator,
    OwnShuffleBatchSampler,
    SavesTheGlobalGenerator,
    ShortLenBatchSampler,
    batches_of,
    flat,
    interrupted_equals_uninterrupted,
    maker,
    resume_from,
    seed_everything,
    worker_counts,
)

import minidl
from minidl_bench.batches import assert_same_batches
from minidl_course import toy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]


@pytest.mark.parametrize("name", CONFIGS)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=8))
def test_resume_map_style_at_any_cut(name, cut):
    full, resumed = interrupted_equals_uninterrupted(maker(CONFIGS[name]), cut)
    assert_same_batches(resumed, full)


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=9))
def test_resume_iterable_dataset_with_its_own_state(num_workers, cut):
    def make():
        return minidl.DataLoader(toy.ResumableStream(17), batch_size=2, num_workers=num_workers,
                                 stateful=True)

    full, resumed = interrupted_equals_uninterrupted(make, cut)
    assert_same_batches(resumed, full)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_in_a_later_epoch_with_a_distributed_sampler(num_workers):
    sampler = minidl.DistributedSampler(toy.RangeDataset(30), num_replicas=2, rank=1, seed=3)

    def make():
        sampler.set_epoch(2)  # the training loop sets the epoch before iterating, also on resume
        return minidl.DataLoader(toy.GlobalRandomDataset(30), batch_size=4, sampler=sampler,
                                 num_workers=num_workers, stateful=True)

    full, resumed = interrupted_equals_uninterrupted(make, cut=2)
    assert_same_batches(resumed, full)


def test_batch_sampler_resumes():
    def make():
        batch_sampler = minidl.BatchSampler(minidl.RandomSampler(range(20), generator=torch.Generator().manual_seed(1)),
                                            batch_size=3, drop_last=True)
        return minidl.DataLoader(toy.RangeDataset(20), batch_sampler=batch_sampler, num_workers=2, stateful=True)

    full, resumed = interrupted_equals_uninterrupted(make, cut=3)
    assert_same_batches(resumed, full)


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_resume_after_a_batch_that_used_numpys_cached_normal(cut):
    """A batch that only used the kept normal leaves the words unchanged: the worker must still send its state."""
    def make():
        return minidl.DataLoader(NormalDraws(), batch_size=1, num_workers=1, stateful=True)

    full, resumed = interrupted_equals_uninterrupted(make, cut=cut)
    assert_same_batches(resumed, full)


def test_every_kind_of_stream_is_put_back_from_its_json_state():
    """A worker's streams (Python's, NumPy's legacy and new generators, torch's, and the modules' global ones)
    are taken with their own getters and come back from the JSON the state holds, draw for draw."""
    from minidl import state

    streams = [random.Random(1), np.random.default_rng(3), torch.Generator().manual_seed(4), random, np.random, torch]
    draws = [lambda g: g.random(), lambda g: g.random(), lambda g: torch.rand((), generator=g).item(),
             lambda g: g.random(), lambda g: g.standard_normal(), lambda g: g.rand(()).item()]
    for g, draw in zip(streams, draws, strict=True):
        draw(g)
        saved = json.loads(json.dumps(state._plain(state.get_rng_state(g))))
        expected = [draw(g) for _ in range(3)]
        state.set_rng_state(g, saved)
        assert [draw(g) for _ in range(3)] == expected, g


def test_a_numpy_driven_loader_does_not_import_torch():
    import os
    import subprocess
    import sys

    code = ("import sys, numpy as np, minidl\n"
            "loader = minidl.DataLoader(list(range(8)), batch_size=2, shuffle=True, generator=np.random.default_rng(0),"
            " collate_fn=minidl.numpy_collate)\n"
            "batches = list(loader)\n"
            "print(len(batches), 'torch' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["4", "False"], out.stderr


@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
def test_traced_loader_with_workers_gives_state_mid_epoch_and_goes_on(worker_method):
    loader = minidl.DataLoader(toy.SlowDataset(16, slow=(2,), slow_delay=0.3), batch_size=2, num_workers=2,
                               stateful=True, trace=True, worker_method=worker_method, collate_fn=list)
    it = iter(loader)
    got = [next(it)]
    loader.state_dict()  # later batches arrive while it waits for the workers' states: filed, not lost
    got += list(it)
    assert [x for b in got for x in b] == list(range(16))
    assert sum(e["event"] == "yield" for e in loader.trace.events) == 8


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("cut", range(10))
def test_iterable_resume_keeps_the_batches_of_a_worker_whose_end_already_arrived(cut, persistent):
    # Worker 0's shard has 5 batches, worker 1's 4: near the end of the epoch both StopIterations are in
    # before the consumer has taken those workers' last batches. The first state_dict() drains them; a
    # second must still count those batches as to come.
    def make():
        return minidl.DataLoader(toy.ResumableStream(17), batch_size=2, num_workers=2, stateful=True,
                                 persistent_workers=persistent)

    seed_everything(0)
    full = batches_of(make())
    seed_everything(0)
    loader = make()
    it = iter(loader)
    first = [next(it) for _ in range(cut)]
    loader.state_dict()
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert_same_batches(first + batches_of(resumed), full)


@pytest.mark.parametrize("worker_method, num_workers", [("multiprocessing", 0), ("multiprocessing", 2), ("thread", 2)])
def test_resume_and_tracing_compose(worker_method, num_workers):
    # Both layers on: the resumed loader gives the uninterrupted run's batches, and its trace records exactly
    # those, numbered as in the uninterrupted epoch (7 batches; the first 3 were had before the checkpoint).
    dataset = toy.WorkerRandomDataset(14) if worker_method == "thread" else toy.GlobalRandomDataset(14)

    def make():
        return minidl.DataLoader(dataset, batch_size=2, shuffle=True, num_workers=num_workers, stateful=True,
                                 trace=True, worker_method=worker_method, generator=torch.Generator().manual_seed(3))

    full, _ = interrupted_equals_uninterrupted(make, cut=3)
    seed_everything(0)  # as the uninterrupted run: the main process's streams feed num_workers=0
    loader = make()
    it = iter(loader)
    [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    seed_everything(12345)
    resumed = make()
    resumed.load_state_dict(state)
    assert_same_batches(batches_of(resumed), full[3:])
    events = resumed.trace.events
    assert sorted(e["batch"] for e in events if e["event"] == "yield") == [3, 4, 5, 6]
    assert {e["batch"] for e in events if e["event"] == "fetch"} == {3, 4, 5, 6}


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_state_dict_after_breaking_out_of_a_for_loop_resumes_after_the_break(num_workers):
    # The loader held its iterator only weakly: leaving the loop dropped it, and state_dict() restarted the epoch.
    def make():
        return minidl.DataLoader(toy.RangeDataset(10), num_workers=num_workers, stateful=True, collate_fn=list)

    loader = make()
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert flat(resume_from(make, loader.state_dict())) == list(range(3, 10))


@pytest.mark.parametrize("num_workers", worker_counts(0, 1))
def test_a_dataset_returning_its_live_state_dict_is_saved_where_the_consumer_stands(num_workers):
    def make():
        return minidl.DataLoader(LiveState(), batch_size=None, num_workers=num_workers, stateful=True)

    loader = make()
    it = iter(loader)
    got = [next(it), next(it)]
    state = loader.state_dict()
    del it
    assert got + list(resume_from(make, state)) == list(range(8))


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_a_custom_batch_sampler_s_own_generator_is_saved(num_workers):
    def make():
        return minidl.DataLoader(toy.RangeDataset(8), batch_sampler=OwnShuffleBatchSampler(), num_workers=num_workers,
                                 stateful=True, collate_fn=list)

    full = make()
    epochs = [flat(full), flat(full)]
    loader = make()
    list(loader)  # epoch 0
    it = iter(loader)  # epoch 1: stop after two batches
    got = [next(it), next(it)]
    state = loader.state_dict()
    del it
    assert flat(got) + flat(resume_from(make, state)) == epochs[1]


@pytest.mark.parametrize("worker_method", WORKER_METHODS)
def test_state_dict_never_waits_on_a_slow_worker_nor_takes_a_late_answer(worker_method):
    # Before: state_dict() asked the workers and waited up to `timeout`; a late answer was taken by the next call.
    dataset = toy.SlowOnceDataset(12, slow_index=4, delay=4.0)
    # fork: a spawned worker's start (importing torch) may take longer than the timeout on a busy machine
    context = "fork" if worker_method == "multiprocessing" else None

    def make(timeout=0.0):
        return minidl.DataLoader(dataset, batch_size=1, num_workers=2, timeout=timeout, stateful=True,
                                 worker_method=worker_method, collate_fn=list, multiprocessing_context=context)

    loader = make(timeout=3.0)
    it = iter(loader)
    got = [next(it) for _ in range(3)]
    first = loader.state_dict()  # worker 0 is busy in item 4's slow __getitem__ here
    got.append(next(it))  # item 3
    second = loader.state_dict()
    del it
    assert flat(got[:3]) + flat(resume_from(make, first)) == list(range(12))
    assert flat(got) + flat(resume_from(make, second)) == list(range(12))


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_state_dict_from_another_thread_while_the_loop_runs(num_workers):
    loader = minidl.DataLoader(toy.SlowDataset(40, delay=0.005), batch_size=2, num_workers=num_workers,
                               stateful=True, collate_fn=list)
    got, states, errors = [], [], []
    it = iter(loader)
    stop = threading.Event()

    def checkpointer():
        while not stop.is_set():
            try:
                states.append(loader.state_dict())
            except Exception as e:  # noqa: BLE001 -- the test reports it
                errors.append(e)
                return

    def consume():
        got.extend(it)

    threads = [threading.Thread(target=checkpointer, daemon=True), threading.Thread(target=consume, daemon=True)]
    for t in threads:
        t.start()
    threads[1].join(timeout=60)
    stop.set()
    threads[0].join(timeout=60)
    assert not any(t.is_alive() for t in threads), "state_dict() from another thread hung the loop"
    assert not errors and states
    assert flat(got) == list(range(40))


def test_a_main_class_that_pickles_by_value_reaches_spawned_workers_as_in_torch():
    env = {**os.environ, "PYTHONPATH": ROOT}
    for make in ("minidl.DataLoader", "__import__('torch').utils.data.DataLoader"):
        done = subprocess.run([sys.executable, "-c", REDUCED.format(make=make)], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=240)
        assert done.returncode == 0, (make, done.stderr)
        assert done.stdout.split("\n")[0] == "[[0, 1], [2, 3]]"


def test_prefetch_factor_without_workers_says_what_torch_says():
    with pytest.raises(ValueError) as torch_error:
        torch.utils.data.DataLoader(range(4), prefetch_factor=2)
    with pytest.raises(ValueError) as minidl_error:
        minidl.DataLoader(range(4), prefetch_factor=2)
    assert str(minidl_error.value) == str(torch_error.value)


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_the_state_is_json_safe(num_workers):
    def make():
        return minidl.DataLoader(toy.GlobalRandomDataset(12), batch_size=2, shuffle=True, num_workers=num_workers,
                                 stateful=True)

    seed_everything(0)
    full = [repr(b) for b in make()]
    seed_everything(0)
    loader = make()
    it = iter(loader)
    got = [repr(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert got + [repr(b) for b in resumed] == full


@pytest.mark.parametrize(("persistent", "every"), SNAPSHOT_SETTINGS)
def test_snapshot_every_n_steps_resumes_at_every_cut(persistent, every):
    # Workers ship their state only before every n-th batch (never, with 0 or None); a state saved between
    # snapshots resumes from the last one and fetches the batches since again: the same batches either way.
    def make():
        return minidl.DataLoader(toy.GlobalRandomDataset(14), batch_size=2, shuffle=True, num_workers=2,
                                 persistent_workers=persistent, stateful=True, snapshot_every_n_steps=every,
                                 generator=torch.Generator().manual_seed(3))

    full = make()
    epochs = [[repr(b) for b in full] for _ in range(2)]
    replays = []
    for cut in CUTS:
        loader = make()
        it = iter(loader)
        got = [repr(next(it)) for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict()))
        replays.append(state["replay"])
        del it
        resumed = resume_from(make, state)
        assert got + [repr(b) for b in resumed] == epochs[0], cut
        assert [repr(b) for b in resumed] == epochs[1], cut
    expected = [0, 1, 2, 0, 1, 2, 0, 1] if every == 3 else list(range(8))  # at cuts 0 to 7
    assert replays == [expected[cut] for cut in CUTS]


def test_snapshot_every_n_steps_is_checked():
    with pytest.raises(ValueError, match="snapshot_every_n_steps"):
        minidl.DataLoader(range(4), stateful=True, snapshot_every_n_steps=-1)


def test_a_saved_state_is_not_changed_by_later_batches():
    # torchdata's TestDynamicState reads worker_0's dataset state: here it is state["workers"][0]["dataset"].
    loader = minidl.DataLoader(GrowingState(), batch_size=None, num_workers=2, stateful=True)
    it = iter(loader)
    [next(it) for _ in range(6)]
    state = loader.state_dict()
    kept = copy.deepcopy(state)
    [next(it) for _ in range(4)]
    later = loader.state_dict()
    assert state == kept and later != state
    assert [len(w["dataset"]["seen"]) for w in state["workers"]] == [3, 3]
    assert [len(w["dataset"]["seen"]) for w in later["workers"]] == [5, 5]


@pytest.mark.parametrize("dataset_cls", [IteratorHoldsState, OwnIterator])
@pytest.mark.parametrize("num_workers", worker_counts(0, 1))
def test_the_iterator_s_own_state_is_saved_and_loaded_after_iter(dataset_cls, num_workers):
    # torchdata saves the state of the iterator iter(dataset) returns, and loads it after iter().
    def make():
        return minidl.DataLoader(dataset_cls(), batch_size=2, num_workers=num_workers, stateful=True, collate_fn=list)

    loader = make()
    it = iter(loader)
    got = [next(it), next(it)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    assert flat(got) + flat(resume_from(make, state)) == list(range(10))
    saved = (state["workers"] or [state["main"]])[0]
    assert saved["iterator"] == {"i": 4} and saved["dataset"] is None  # stored once (torchdata's Duplication test)


def test_a_map_dataset_s_state_goes_back_after_the_sampler_s_draws_are_replayed():
    def make():
        return minidl.DataLoader(SavesTheGlobalGenerator(30), shuffle=True, stateful=True, collate_fn=list)

    torch.manual_seed(0)
    full = flat(make())
    torch.manual_seed(0)
    loader = make()
    got = []
    for i, b in enumerate(loader):
        got.append(b)
        if i == 9:
            break
    state = loader.state_dict()
    torch.manual_seed(0)
    assert flat(got) + flat(resume_from(make, state)) == full


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_iter_is_called_once_per_replica_also_when_resumed(num_workers):
    # torchdata's TestSingleIterCalled reads its private keys; here each replica's state says how often it was iter()ed.
    def make():
        return minidl.DataLoader(CountsIterCalls(), batch_size=2, num_workers=num_workers, stateful=True)

    def iter_calls(state):
        return [w["dataset"]["iter_calls"] for w in (state["workers"] or [state["main"]])]

    loader = make()
    it = iter(loader)
    [next(it) for _ in range(4)]
    state = loader.state_dict()
    assert iter_calls(state) == [1] * max(1, num_workers)
    resumed = resume_from(make, state)
    it = iter(resumed)
    [next(it) for _ in range(2)]
    assert iter_calls(resumed.state_dict()) == [2] * max(1, num_workers)  # the saved count, and this epoch's iter()


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_a_sampler_with_its_own_state_resumes_in_a_later_epoch_with_that_epoch_s_order(num_workers):
    # The sampler's state_dict() is saved as the epoch starts and put back before the replayed draws: resumed in
    # epoch 1, it hands out epoch 1's permutation, not epoch 0's again.
    def make():
        return minidl.DataLoader(toy.RangeDataset(12), batch_size=2, sampler=EpochSeededSampler(12, seed=5),
                                 num_workers=num_workers, stateful=True)

    full, resumed = interrupted_equals_uninterrupted(make, cut=2, epochs_before=1)
    assert_same_batches(resumed, full)
    epoch_zero = flat(make())
    assert flat(full) != epoch_zero  # the two epochs differ, so the check above can tell them apart


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
@pytest.mark.parametrize("cut", [1, 4, 6])
def test_a_batch_sampler_whose_len_under_reports_saves_and_resumes(num_workers, cut):
    # len() says 5 batches, it hands out 7: a state saved past the fifth still loads and resumes.
    def make():
        sampler = minidl.RandomSampler(range(14), generator=torch.Generator().manual_seed(2))
        return minidl.DataLoader(toy.RangeDataset(14), batch_sampler=ShortLenBatchSampler(sampler, 2, False),
                                 num_workers=num_workers, stateful=True)

    assert len(make()) == 5
    full, resumed = interrupted_equals_uninterrupted(make, cut=cut)
    assert len(full) == 7
    assert_same_batches(resumed, full)


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_an_iterable_dataset_whose_len_raises_saves_and_resumes(num_workers):
    # Iterated as a for loop does (list() would ask len(), which raises as it does under torch).
    def make():
        return minidl.DataLoader(NoLenResumableStream(17), batch_size=2, num_workers=num_workers, stateful=True)

    seed_everything(0)
    full = [b for b in make()]  # noqa: C416
    seed_everything(0)
    loader = make()
    it = iter(loader)
    had = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    it = loader = None
    assert state["dataset_len"] is None
    resumed = make()
    resumed.load_state_dict(state)
    assert_same_batches(had + [b for b in resumed], full)  # noqa: C416
