"""DataLoader.state_dict(): resume mid-epoch and get exactly the batches the uninterrupted run gives."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import random
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minidl
from minidl_bench.batches import assert_same_batches
from minidl_course import toy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]


def seed_everything(s: int) -> None:
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def batches_of(loader_or_iter) -> list:
    return list(loader_or_iter)


def interrupted_equals_uninterrupted(make, cut: int, epochs_before: int = 0) -> tuple[list, list]:
    """Batches of one full epoch, and the same epoch stopped after ``cut`` batches and resumed."""
    seed_everything(0)
    loader = make()
    for _ in range(epochs_before):
        batches_of(loader)
    full = batches_of(loader)

    seed_everything(0)
    loader = make()
    for _ in range(epochs_before):
        batches_of(loader)
    it = iter(loader)
    first = [next(it) for _ in range(cut)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))  # a checkpoint survives a file
    del it

    seed_everything(12345)  # a different process state: the loader must restore what matters
    resumed = make()
    resumed.load_state_dict(state)
    return full, first + batches_of(resumed)


CONFIGS = {
    "main, shuffle with a generator": dict(num_workers=0, shuffle=True, seeded=True),
    "main, shuffle from the global seed": dict(num_workers=0, shuffle=True),
    "processes, shuffle with a generator": dict(num_workers=2, shuffle=True, seeded=True),
    "processes, global seed": dict(num_workers=2, shuffle=True),
    "one process, sequential": dict(num_workers=1),
    "threads": dict(num_workers=2, shuffle=True, seeded=True, worker_method="thread"),
    "processes, prefetch 3": dict(num_workers=2, shuffle=True, prefetch_factor=3),
}


def maker(config: dict, n: int = 23, batch_size: int = 3):
    kw = dict(config)
    seeded = kw.pop("seeded", False)
    dataset_cls = toy.WorkerRandomDataset if kw.get("worker_method") == "thread" else toy.GlobalRandomDataset

    def make():
        return minidl.DataLoader(dataset_cls(n), batch_size=batch_size, stateful=True,
                                 generator=torch.Generator().manual_seed(7) if seeded else None, **kw)

    return make


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


@pytest.mark.parametrize("persistent", [False, True])
def test_state_between_epochs_starts_the_next_epoch_identically(persistent):
    make = maker(dict(CONFIGS["processes, shuffle with a generator"], persistent_workers=persistent))
    seed_everything(0)
    loader = make()
    batches_of(loader)
    state = loader.state_dict()
    second = batches_of(loader)
    other = make()
    other.load_state_dict(state)
    assert_same_batches(batches_of(other), second)


def test_persistent_workers_resume():
    def make():
        return minidl.DataLoader(toy.GlobalRandomDataset(12), batch_size=2, num_workers=2, persistent_workers=True,
                                 stateful=True, shuffle=True)

    full, resumed = interrupted_equals_uninterrupted(make, cut=2, epochs_before=1)
    assert_same_batches(resumed, full)


def test_different_num_workers_is_refused_clearly():
    loader = minidl.DataLoader(toy.RangeDataset(10), num_workers=2, stateful=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError, match="num_workers=2"):
        minidl.DataLoader(toy.RangeDataset(10), num_workers=1, stateful=True).load_state_dict(state)
    with pytest.raises(ValueError, match="worker_method"):
        minidl.DataLoader(toy.RangeDataset(10), num_workers=2, worker_method="thread", stateful=True).load_state_dict(
            state)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_state_dict_and_load_state_dict_need_stateful(num_workers):
    it = iter(loader := minidl.DataLoader(toy.RangeDataset(10), num_workers=num_workers))
    next(it)
    with pytest.raises(RuntimeError, match="state_dict\\(\\) needs DataLoader\\(..., stateful=True\\)"):
        loader.state_dict()
    del it
    state = saved_state(num_workers=num_workers)
    with pytest.raises(RuntimeError, match="load_state_dict\\(\\) needs DataLoader\\(..., stateful=True\\)"):
        minidl.DataLoader(toy.RangeDataset(12), batch_size=2, num_workers=num_workers).load_state_dict(state)


def test_bad_version_is_refused():
    with pytest.raises(ValueError, match="version"):
        minidl.DataLoader(toy.RangeDataset(4), stateful=True).load_state_dict({"version": 99})


class NormalDraws(minidl.Dataset):
    """``(index, one normal from NumPy's global stream)``: the legacy generator draws normals in pairs and keeps
    the second, so every other item takes the kept one and leaves the generator's words as they were."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return index, float(np.random.standard_normal())


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_resume_after_a_batch_that_used_numpys_cached_normal(cut):
    """A batch that only used the kept normal leaves the words unchanged: the worker must still send its state."""
    def make():
        return minidl.DataLoader(NormalDraws(), batch_size=1, num_workers=1, stateful=True)

    full, resumed = interrupted_equals_uninterrupted(make, cut=cut)
    assert_same_batches(resumed, full)


def test_fingerprints_follow_every_stream():
    """Each stream's fingerprint changes with a draw, and is equal again once the stream is set back."""
    from minidl import state

    assert state._mt19937_readable()  # this platform reads MT19937's words at once (the cheap path)
    assert state._python_random_offset() is not None  # and Python's random.Random's
    streams = [random.Random(1), np.random.RandomState(2), np.random.default_rng(3), torch.Generator().manual_seed(4),
               np.random.Generator(np.random.MT19937(5))]
    draws = [lambda g: g.random(), lambda g: g.rand(), lambda g: g.random(), lambda g: torch.rand((), generator=g),
             lambda g: g.random()]
    for g, draw in zip(streams, draws):
        saved, before = state.rng_state(g), state._fingerprint(g)
        draw(g)
        assert state._fingerprint(g) != before, type(g)
        state.set_rng_state(g, saved)
        assert state._fingerprint(g) == before, type(g)


def test_a_workers_fingerprints_follow_its_streams_and_a_stream_replaced():
    """The readers a worker makes once read each stream as it moves; a stream that is another object gets its own."""
    from types import SimpleNamespace

    from minidl import state

    rng = SimpleNamespace(random_generator=random.Random(1), numpy_generator=np.random.default_rng(2),
                          torch_generator=torch.Generator().manual_seed(3))
    fingerprints = state._Fingerprints()
    first = fingerprints(rng)
    saved = state.rng_state(rng.numpy_generator)
    rng.numpy_generator.random()
    assert fingerprints(rng) != first
    state.set_rng_state(rng.numpy_generator, saved)
    assert fingerprints(rng) == first
    rng.numpy_generator = np.random.default_rng(2)  # another object, at another point of the same stream
    rng.numpy_generator.random()
    assert fingerprints(rng) != first
    assert fingerprints(rng) == [state._fingerprint(g) for g in state._streams(rng)]


def test_python_random_fingerprint_is_its_state():
    """The cheap read of a random.Random equals the state getstate() gives, and sees gauss()'s kept normal go."""
    from minidl import state

    g = random.Random(7)
    for draws in (0, 1, 623, 624, 625, 2000):
        g.seed(7)
        for _ in range(draws):
            g.random()
        words, kept = state._fingerprint(g)
        assert words == state._python_random_bytes(g) and kept is None
    g.gauss(0, 1)  # draws two normals, keeps the second without moving the words
    with_normal = state._fingerprint(g)
    g.gauss(0, 1)  # uses the kept one: only gauss_next changes
    assert state._fingerprint(g)[0] == with_normal[0] and state._fingerprint(g) != with_normal


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


# --- resume's edge cases: a state saved again, states refused, an epoch's end, tracing ------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_right_after_load_state_dict_keeps_the_resume_point(num_workers):
    def make():
        return minidl.DataLoader(toy.RangeDataset(12), batch_size=2, shuffle=True, num_workers=num_workers,
                                 stateful=True, generator=torch.Generator().manual_seed(1))

    full, _ = interrupted_equals_uninterrupted(make, cut=3)
    loader = make()
    it = iter(loader)
    [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    preempted = make()
    preempted.load_state_dict(state)
    again = preempted.state_dict()  # preempted a second time before its first batch
    final = make()
    final.load_state_dict(pickle.loads(pickle.dumps(again)))
    assert_same_batches(batches_of(final), full[3:])


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


def saved_state(**kwargs) -> dict:
    loader = minidl.DataLoader(toy.RangeDataset(12), batch_size=2, stateful=True, **kwargs)
    it = iter(loader)
    [next(it) for _ in range(2)]
    state = loader.state_dict()
    del it
    return state


@pytest.mark.parametrize("other, key", [
    (dict(dataset=toy.RangeDataset(10)), "dataset_len"),
    (dict(batch_size=3), "batch_size"),
    (dict(shuffle=True), "sampler"),
])
def test_load_state_dict_refuses_a_state_from_another_setting(other, key):
    state = saved_state()
    kwargs = dict(dataset=toy.RangeDataset(12), batch_size=2, stateful=True) | other
    with pytest.raises(ValueError, match=f"saved with {key}="):
        minidl.DataLoader(kwargs.pop("dataset"), **kwargs).load_state_dict(state)


@pytest.mark.parametrize("change, match", [
    (dict(tasks_done=7), "out of range"),  # 6 batches in the epoch
    (dict(tasks_done=-1), "out of range"),
    (dict(num_yielded=3), "out of range"),  # more handed out than done
    (dict(next_worker=5), "next_worker"),
])
def test_load_state_dict_refuses_counters_out_of_range(change, match):
    state = saved_state() | change
    with pytest.raises(ValueError, match=match):
        minidl.DataLoader(toy.RangeDataset(12), batch_size=2, stateful=True).load_state_dict(state)


@pytest.mark.parametrize("key", ["tasks_done", "generators", "num_workers"])
def test_load_state_dict_names_a_missing_key(key):
    state = saved_state()
    del state[key]
    with pytest.raises(ValueError, match=f"missing the key '{key}'"):
        minidl.DataLoader(toy.RangeDataset(12), batch_size=2, stateful=True).load_state_dict(state)


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("past_the_end", [False, True])
def test_iterable_dataset_resumed_at_the_end_of_an_epoch_then_gives_full_epochs(num_workers, persistent,
                                                                                 past_the_end):
    def make():
        return minidl.DataLoader(toy.ResumableStream(9), batch_size=2, num_workers=num_workers,
                                 stateful=True, persistent_workers=persistent, collate_fn=list)

    loader = make()
    it = iter(loader)
    n = len(list(make()))
    [next(it) for _ in range(n)]  # every batch of the epoch consumed
    if past_the_end:
        assert next(it, None) is None
    state = loader.state_dict()
    del it, loader
    resumed = make()
    resumed.load_state_dict(state)
    rest = sorted(x for b in resumed for x, _ in b)
    assert rest == (list(range(9)) if past_the_end else [])  # saved after StopIteration: the next epoch
    for _ in range(2):
        assert sorted(x for b in resumed for x, _ in b) == list(range(9))


@pytest.mark.parametrize(("saved", "loaded", "words"), [
    ("torch", None, "a torch.Generator, but this DataLoader draws from the global random state"),
    (None, "torch", "the global random state, but this DataLoader draws from a torch.Generator"),
    ("torch", "numpy", "a torch.Generator, but this DataLoader draws from a numpy.random.Generator"),
])
def test_load_state_dict_refuses_another_generator_setup(saved, loaded, words):
    def generator(kind):
        return {None: None, "torch": torch.Generator().manual_seed(1), "numpy": np.random.default_rng(1)}[kind]

    def make(kind):
        return minidl.DataLoader(toy.RangeDataset(10), batch_size=2, shuffle=True, generator=generator(kind),
                                 stateful=True)

    loader = make(saved)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    with pytest.raises(ValueError, match=words):
        make(loaded).load_state_dict(state)
    make(saved).load_state_dict(state)  # the same setup resumes


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


# --- the randomized sweep: resumed against uninterrupted over the loader's settings -------------------------
# Each example draws a loader (dataset kind, workers, sampler, snapshot_every_n_steps, ...), runs it for
# EPOCHS epochs uninterrupted, then again with one or two checkpoints at random points, each resumed by a fresh
# loader (a second resume, a resume in a later epoch with persistent workers), with errors the loop catches,
# and with a resume that fails and is tried again. MINIDL_RESUME_EXAMPLES sets how many (CI keeps it small).

EPOCHS = 2
SWEEP_EXAMPLES = int(os.environ.get("MINIDL_RESUME_EXAMPLES", "12"))


class SweepItems(minidl.Dataset):
    """``(index, a draw from the worker's NumPy stream)``; KeyError at ``bad``; a process worker exits while
    ``gate`` is set (a transient failure)."""

    def __init__(self, n: int, bad: int | None = None, gate=None) -> None:
        self.n, self.bad, self.gate = n, bad, gate

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if self.gate is not None and self.gate.is_set() and multiprocessing.parent_process() is not None:
            os._exit(3)
        if index == self.bad:
            raise KeyError(f"bad sample {index}")
        info = minidl.get_worker_info()
        rng = info.rng.numpy_generator if info is not None and info.rng is not None else np.random
        return index, float(rng.random())


class SweepStream(minidl.IterableDataset):
    """``(item, a draw from NumPy's stream)``, sharded round-robin by worker, with no state_dict(); a process
    worker exits while ``gate`` is set."""

    def __init__(self, n: int, gate=None) -> None:
        self.n, self.gate = n, gate

    def __iter__(self):
        info = minidl.get_worker_info()
        workers, worker_id = (1, 0) if info is None else (info.num_workers, info.id)
        for item in range(worker_id, self.n, workers):
            if self.gate is not None and self.gate.is_set() and multiprocessing.parent_process() is not None:
                os._exit(3)
            yield item, float(np.random.rand())


def _plain(batch):
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, list | tuple):
        return [_plain(b) for b in batch]
    return batch


@st.composite
def sweep_configs(draw):
    kind = draw(st.sampled_from(["map", "map", "stream", "stateless stream"]))
    workers = draw(st.integers(0, 3))
    method = "multiprocessing" if kind != "map" or workers == 0 else draw(st.sampled_from(["multiprocessing",
                                                                                          "thread"]))
    config = dict(kind=kind, n=draw(st.integers(4, 13)), batch_size=draw(st.sampled_from([None, 1, 2, 3])),
                  num_workers=workers, worker_method=method,
                  persistent_workers=workers > 0 and draw(st.booleans()),
                  in_order=workers == 0 or draw(st.booleans()),
                  snapshot_every_n_steps=draw(st.sampled_from([None, 0, 1, 1, 2, 3, 5])),
                  shuffle=kind == "map" and draw(st.sampled_from(["no", "generator", "global"])) or "no",
                  bad=None, fail_resume=workers > 0 and method == "multiprocessing" and draw(st.booleans()))
    config["drop_last"] = config["batch_size"] is not None and draw(st.booleans())
    if kind == "map" and draw(st.booleans()):
        config["bad"] = draw(st.integers(0, config["n"] - 1))
    config["cuts"] = sorted(set(draw(st.lists(st.integers(0, 2 * config["n"] + 2), min_size=1, max_size=2))))
    return config


def _sweep_loader(config: dict, gate):
    kind, n = config["kind"], config["n"]
    gate = gate if config["fail_resume"] else None
    dataset = SweepItems(n, config["bad"], gate) if kind == "map" else \
        toy.ResumableStream(n) if kind == "stream" else SweepStream(n, gate)
    shuffle = config["shuffle"]
    return minidl.DataLoader(dataset, batch_size=config["batch_size"], drop_last=config["drop_last"],
                             shuffle=shuffle != "no" or None if kind == "map" else None,
                             generator=torch.Generator().manual_seed(3) if shuffle == "generator" else None,
                             num_workers=config["num_workers"], worker_method=config["worker_method"],
                             persistent_workers=config["persistent_workers"], in_order=config["in_order"],
                             snapshot_every_n_steps=config["snapshot_every_n_steps"], stateful=True)


def _sweep_run(config: dict, cuts: list[int], gate) -> list[list]:
    """EPOCHS epochs of (plain) batches, a caught error as "KeyError"; at each position in ``cuts`` (batches had
    so far, over all epochs) the loader is checkpointed, dropped and a fresh one resumes from the checkpoint."""
    seed_everything(0)
    loader, epochs, position, cuts = _sweep_loader(config, gate), [], 0, list(cuts)
    for _ in range(EPOCHS):
        got, it = [], None
        while True:
            if cuts and cuts[0] == position:
                cuts.pop(0)
                state = json.loads(json.dumps(loader.state_dict()))  # a checkpoint survives a file
                rng = random.getstate(), np.random.get_state(), torch.get_rng_state()  # the loop's own checkpoint
                it = loader = None
                seed_everything(1000 + position)  # another process; the loop restores its RNG beside the loader's
                random.setstate(rng[0])
                np.random.set_state(rng[1])
                torch.set_rng_state(rng[2])
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*has no state_dict", category=UserWarning)
                    loader = _sweep_loader(config, gate)
                    loader.load_state_dict(state)
                if config["fail_resume"] and gate is not None:
                    it, got_first = _resume_fails_then_retry(loader, state, gate)
                    if got_first is not None:
                        got.append(got_first)
                        position += 1
                        continue
            if it is None:
                it = iter(loader)
            try:
                got.append(_plain(next(it)))
            except StopIteration:
                break
            except KeyError:
                got.append("KeyError")
            position += 1
        epochs.append(got)
    it = loader = None
    return epochs


def _resume_fails_then_retry(loader, state, gate):
    """The resumed loader's workers die (in iter() or at the first batch): try again, as a training script would:
    iter() again if iter() failed (the loader kept the state), else load the checkpoint again. Returns the
    iterator and the first batch if the retry already took it."""
    gate.set()
    try:
        it = iter(loader)
    except RuntimeError:
        gate.clear()
        return iter(loader), None
    try:
        first = next(it)
    except StopIteration:  # nothing left to fetch this epoch: nothing failed
        gate.clear()
        return it, None
    except RuntimeError:
        it = None
        gate.clear()
        loader.load_state_dict(state)
        return iter(loader), None
    gate.clear()  # a batch came before a worker saw the gate (prefetched before it was set): no failure this time
    return it, _plain(first)


def _without_draws(batch):
    if isinstance(batch, float):
        return None
    return [_without_draws(b) for b in batch] if isinstance(batch, list) else batch


def _same_epochs(resumed: list[list], full: list[list], config: dict) -> None:
    if config["in_order"]:
        assert resumed == full
        return
    # Out of order, the order is down to timing, and so is which worker fetches which sample of a map dataset
    # (and so its draws): each batch comes once. (A stream's items each come from one worker, draws and all.)
    if config["kind"] == "map":
        resumed, full = _without_draws(resumed), _without_draws(full)
    assert [sorted(map(repr, e)) for e in resumed] == [sorted(map(repr, e)) for e in full]


@settings(max_examples=SWEEP_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(config=sweep_configs())
def test_resumed_equals_uninterrupted_over_random_settings(config):
    gate = multiprocessing.get_context().Event() if config["fail_resume"] else None
    full = _sweep_run(config, [], gate)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Length of IterableDataset")
        resumed = _sweep_run(config, config["cuts"], gate)
    _same_epochs(resumed, full, config)
