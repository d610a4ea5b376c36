"""Tests for minidl_course.startup: the start method a loader uses, and what its first batch costs.

No speed is asserted: only which method is named, how many batches were counted, and that a wait put
into every worker's start shows in the first batch's time (it cannot come out shorter than the wait).
"""

from __future__ import annotations

import multiprocessing
import time
from functools import partial

import pytest
import torch.utils.data

import minidl
from minidl_course.startup import StartupCost, start_method, startup_cost

START_WAIT = 0.3  # seconds every worker sleeps in worker_init_fn


class SleepAtStart:
    """A worker_init_fn that waits ``seconds`` (top level: spawned workers import it by name)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, worker_id: int) -> None:
        time.sleep(self.seconds)


def minidl_loader(num_workers: int, **kwargs):
    return minidl.DataLoader(list(range(24)), batch_size=4, num_workers=num_workers, **kwargs)


def test_start_method_names_how_workers_start():
    default = multiprocessing.get_start_method()
    assert start_method(minidl_loader(0)) == "main process"
    assert start_method(minidl_loader(2, worker_method="thread")) == "thread"
    assert start_method(minidl_loader(2)) == default
    assert start_method(minidl_loader(2, multiprocessing_context="spawn")) == "spawn"
    context = multiprocessing.get_context("forkserver")
    assert start_method(torch.utils.data.DataLoader(range(8), num_workers=2, multiprocessing_context=context)) == \
        "forkserver"
    assert start_method(torch.utils.data.DataLoader(range(8), num_workers=2)) == default


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["minidl process", "minidl thread", "torch"])
def test_startup_cost_counts_the_epoch_and_puts_the_start_in_the_first_batch(kind, no_leaks):
    init = SleepAtStart(START_WAIT)
    if kind == "torch":
        make = partial(torch.utils.data.DataLoader, list(range(24)), batch_size=4, num_workers=2, worker_init_fn=init)
    else:
        make = partial(minidl_loader, 2, worker_init_fn=init,
                       worker_method="thread" if kind == "minidl thread" else "multiprocessing")
    cost = startup_cost(make)
    expected = "thread" if kind == "minidl thread" else multiprocessing.get_start_method()
    assert cost.start_method == expected and cost.batches == 6
    assert cost.first_batch_s >= START_WAIT and cost.per_batch_s >= 0
    assert str(cost).startswith(f"{expected}: first batch ") and "for the other 5 batches: " in str(cost)


class SlowItems:
    """A map-style dataset whose every item sleeps ``seconds`` (top level: spawned workers import it)."""

    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.seconds)
        return i


def test_the_start_is_the_first_batch_less_one_batch_made_here_not_less_the_steady_pace():
    # 4 workers: the pace is a batch every 10 ms, but the first batch waited for one worker's whole 40 ms batch.
    cost = StartupCost("fork", first_batch_s=0.30, per_batch_s=0.01, batches=20, batch_s=0.04)
    assert cost.startup_s == pytest.approx(0.26)
    assert StartupCost("fork", first_batch_s=0.03, per_batch_s=0.01, batches=20, batch_s=0.04).startup_s == 0.0


@pytest.mark.timeout(120)
def test_startup_cost_times_one_batch_made_in_this_process():
    item_s = 0.01
    make = partial(minidl.DataLoader, SlowItems(24, item_s), batch_size=4, num_workers=2)
    cost = startup_cost(make)
    assert cost.batch_s >= 4 * item_s  # four items, each sleeping: it cannot take less
    assert cost.startup_s == max(0.0, cost.first_batch_s - cost.batch_s)


def test_one_batch_needs_a_map_style_dataset_and_says_so():
    class Stream(minidl.IterableDataset):
        def __iter__(self):
            return iter(range(8))

    with pytest.raises(TypeError, match="one_batch_s needs a map-style dataset .* got Stream"):
        startup_cost(partial(minidl.DataLoader, Stream(), batch_size=2, num_workers=2, worker_method="thread"))


def test_startup_cost_of_a_loader_without_workers():
    cost = startup_cost(partial(minidl_loader, 0))
    assert (cost.start_method, cost.batches) == ("main process", 6)


def test_startup_cost_needs_two_batches_and_says_so():
    with pytest.raises(ValueError, match="make_loader .* at least 2 batches, got 1"):
        startup_cost(partial(minidl.DataLoader, list(range(3)), batch_size=4))


def test_summary_says_which_part_dominates():
    slow_start = StartupCost("spawn", first_batch_s=1.01, per_batch_s=0.01, batches=11, batch_s=0.01)
    assert slow_start.startup_s == pytest.approx(1.0) and slow_start.steady_s == pytest.approx(0.1)
    assert slow_start.dominant == "start-up"
    assert str(slow_start) == ("spawn: first batch 1.010 s, then 10.0 ms a batch; start-up 1.000 s (~100 batches' "
                               "worth) against 0.100 s for the other 10 batches: start-up dominates")
    one_batch = StartupCost("fork", first_batch_s=0.02, per_batch_s=0.01, batches=11, batch_s=0.01)
    assert "(~1 batch's worth)" in str(one_batch)
    long_epoch = StartupCost("fork", first_batch_s=0.05, per_batch_s=0.01, batches=101, batch_s=0.01)
    assert long_epoch.dominant == "the batches" and str(long_epoch).endswith(": the batches dominate")
    quicker_than_a_batch = StartupCost("thread", first_batch_s=0.005, per_batch_s=0.01, batches=3, batch_s=0.01)
    assert quicker_than_a_batch.startup_s == 0.0 and quicker_than_a_batch.dominant == "the batches"


@pytest.mark.timeout(300)
def test_a_training_script_reruns_its_imports_in_every_spawned_worker_and_in_no_forked_one():
    from minidl_course.startup import start_method_costs, start_table

    fork, spawn = start_method_costs(["fork", "spawn"], workers=1, epochs=2)
    for run in (fork, spawn):
        assert run.workers == 1 and run.python.count(".") == 2 and run.import_s > 0
        assert set(run.waits) == set(run.epoch_s) == {False, True}
        assert all(len(run.waits[p]) == 2 and all(0 < f <= e for f, e in zip(run.waits[p], run.epoch_s[p]))
                   for p in (False, True))
    assert (fork.method, fork.top_runs) == ("fork", 0)  # a forked worker is a copy: the script's top never runs again
    # spawn: one worker started in each epoch without persistent_workers, then one kept for both epochs with it
    assert (spawn.method, spawn.top_runs) == ("spawn", 3) and all(s > 0 for s in spawn.rerun_import_s)
    assert "persistent_workers=True" in start_table([fork]) and "ran 0 times" in start_table([fork])
    (off,) = start_method_costs(["fork"], workers=1, epochs=1, persistent=False)
    assert set(off.waits) == set(off.epoch_s) == {False} and len(off.waits[False]) == 1


def test_fork_is_never_timed_on_macos(monkeypatch):
    import sys

    from minidl_course import startup

    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(startup.multiprocessing, "get_all_start_methods", lambda: ["spawn", "fork", "forkserver"])
    assert startup.start_methods() == ["forkserver", "spawn"]
    monkeypatch.setattr(sys, "platform", "linux")
    assert startup.start_methods() == ["fork", "forkserver", "spawn"]
    monkeypatch.setattr(startup.multiprocessing, "get_all_start_methods", lambda: ["spawn"])  # Windows
    assert startup.start_methods() == ["spawn"]


def test_a_method_this_platform_lacks_is_refused_before_any_run():
    from minidl_course.startup import start_method_costs

    with pytest.raises(ValueError, match="methods should be start methods.*no-such-method"):
        start_method_costs(["spawn", "no-such-method"], workers=1, epochs=1)
