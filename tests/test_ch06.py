"""minidl_course/ch06.py: notebook 06's worker deaths, torch's in a child interpreter that cannot hang the caller."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from loadertools import alive_in_group

import minidl
from minidl_course import ch06

pytestmark = pytest.mark.usefixtures("no_leaks")

CHILDREN = "spawn" if multiprocessing.get_start_method() == "forkserver" else multiprocessing.get_start_method()
TORCH_MESSAGES = (ch06.TORCH_OUTER, "DataLoader worker (pid <pid>)")


@pytest.mark.timeout(60)
def test_a_child_that_overstays_is_killed_and_says_so():
    run = ch06.run_child(["after", CHILDREN, "sigkill"], hang_s=0.05, startup_s=0.05)  # torch takes longer to import
    assert run["hung"]
    assert run["lines"][-1] == {"hung": 0.05}
    assert run["returncode"] == -signal.SIGKILL
    assert alive_in_group(run["pid"]) == []


@pytest.mark.timeout(60)
def test_a_child_that_fails_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="KeyError"):
        ch06.run_child(["no-such-command", CHILDREN, "sigkill"])


@pytest.mark.timeout(60)
def test_the_watchdog_takes_the_childs_workers_with_it():
    # A child whose worker process sleeps for a minute: each rearm() puts the deadline off, and once the child
    # stops re-arming the watchdog ends it and its worker.
    script = textwrap.dedent("""
        import multiprocessing, os, time
        from minidl_course import ch06
        if __name__ == "__main__":
            worker = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
            worker.start()
            print(worker.pid, os.getpid(), flush=True)
            watchdog = ch06._Watchdog(hang_s=10.0, startup_s=10.0)
            for _ in range(3):
                time.sleep(0.5)  # far inside hang_s, however busy the machine
                watchdog.rearm()
            print("alive after", 1.5, flush=True)
            time.sleep(60)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=55,
                          start_new_session=True)  # the child would sleep 60 s more: only its watchdog ends it in time
    assert proc.returncode == -signal.SIGKILL
    worker_pid, child_pid = map(int, proc.stdout.split()[:2])
    assert "alive after 1.5" in proc.stdout and proc.stdout.rstrip().endswith('{"hung": 10.0}')
    # The worker is in the child's process group (spawn keeps it): alive_in_group waits for the SIGKILLs to land.
    assert alive_in_group(child_pid) == []
    assert not psutil.pid_exists(worker_pid) or psutil.Process(worker_pid).status() == psutil.STATUS_ZOMBIE


TORCH_ERRORS = ("RuntimeError", "ConnectionResetError", "EOFError")  # the exceptions torch's race has raised


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_torch_after_death_records_whatever_torch_did_and_leaves_nothing_running():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    outcomes = ch06.torch_after_death(CHILDREN)
    assert list(outcomes) == ["sigkill", "exit"]
    for how, outcome in outcomes.items():
        assert (outcome.library, outcome.how) == ("torch", how)
        assert all(error.split(":")[0] in TORCH_ERRORS for error in outcome.errors), outcome
        assert set(outcome.had) <= set(ch06.FIRSTS) and ch06.BAD_INDEX not in outcome.had  # batch 3 died with worker 1
        if not outcome.hung:  # torch's race may hang: the outcome says so, and nothing is left (below)
            assert outcome.errors and outcome.ended == "StopIteration" and outcome.killed == 0, outcome
            if outcome.cause and outcome.cause != outcome.errors[0]:  # the designed report: two messages
                assert outcome.errors[0] == f"RuntimeError: {ch06.TORCH_OUTER}"
                assert outcome.kind.startswith("the wait loop's RuntimeError from the handler's RuntimeError, then ")
                assert outcome.cause.startswith("RuntimeError: " + ch06.TORCH_HANDLER[how == "exit"])
        assert str(outcome).startswith(f'torch, how="{how}": ')
    assert not [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.timeout(120)
def test_a_hung_torch_child_is_an_outcome_and_the_next_child_runs_the_rest():
    # No child can import torch in 0.05 s: each one's watchdog ends it, and each how is recorded as hung.
    outcomes = ch06.torch_after_death(CHILDREN, hang_s=0.05, startup_s=0.05)
    assert [(o.how, o.hung, o.had, o.errors) for o in outcomes.values()] == [("sigkill", True, [], []),
                                                                           ("exit", True, [], [])]
    assert "it hung, and the watchdog killed the child interpreter and its workers" in str(outcomes["exit"])
    assert outcomes["sigkill"].kind == "no exception, then hung"


def _asleep_after_the_first_batch(event):
    # The worker dies while the main thread sleeps here, outside next(): SIGCHLD's handler raises in this function.
    if event.get("batch") == 0:
        time.sleep(1.0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["sigkill", "exit"])
@pytest.mark.parametrize("on_event", [lambda event: None, _asleep_after_the_first_batch], ids=["in next", "asleep"])
def test_minidls_outcome_is_the_same_every_time(how, on_event):
    outcome = ch06.after_death(minidl.DataLoader, how, CHILDREN, "minidl", on_event)
    assert outcome.kind == "RuntimeError, then raised on every next()"
    assert outcome.errors[0].startswith("RuntimeError: " + ch06.TORCH_HANDLER[how == "exit"])
    assert len(set(outcome.errors)) == 1 and len(outcome.errors) == ch06.MAX_ERRORS
    # Wherever the first error was raised, the survivor is shut down by the time next() raises again.
    assert outcome.workers_alive[1:] == [0] * (ch06.MAX_ERRORS - 1) and outcome.killed == 0
    assert ch06.BAD_INDEX not in outcome.had and outcome.noticed != "no exception"


class ScriptedLoader:
    """Stands in for a DataLoader: its iterator returns, or raises, each of ``STEPS`` in turn, then stops."""

    STEPS: list = []

    def __init__(self, dataset, **kwargs):
        self.steps = list(self.STEPS)

    def __iter__(self):
        return self

    def __next__(self):
        if not self.steps:
            raise StopIteration
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        return [step, step + 1]


def test_an_exception_raised_between_two_lines_is_recorded_and_next_is_called_again():
    # A SIGCHLD handler raises wherever the main thread is: here, in the bookkeeping after the second batch.
    ScriptedLoader.STEPS = [0, 2, ConnectionResetError(104, "Connection reset by peer"), 8, 10]
    raised_once = []

    def on_event(event):
        if event.get("batch") == 2 and not raised_once:
            raised_once.append(True)
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")

    outcome = ch06.after_death(ScriptedLoader, "sigkill", None, "scripted", on_event)
    assert outcome.had == [0, 2, 8, 10]
    assert outcome.errors == ["RuntimeError: DataLoader worker (pid <pid>) is killed by signal: Killed.",
                              "ConnectionResetError: [Errno 104] Connection reset by peer"]
    assert outcome.had_before == 2 and outcome.ended == "StopIteration"
    assert outcome.kind == "RuntimeError, then ConnectionResetError, then StopIteration, 6 batches lost"


def test_a_loader_that_raises_on_every_next_is_left_after_max_errors():
    ScriptedLoader.STEPS = [0, *[RuntimeError("dead worker")] * 10]
    outcome = ch06.after_death(ScriptedLoader, "exit", None, "scripted")
    assert outcome.errors == ["RuntimeError: dead worker"] * ch06.MAX_ERRORS
    assert outcome.ended == "raised on every next()" and outcome.lost == ch06.FIRSTS[1:]
    assert "then each of 3 more next() calls raised the same again" in str(outcome)


def test_a_hung_outcome_is_put_together_from_the_events_before_the_watchdog():
    events = [{"how": "exit", "batch": 0}, {"how": "exit", "batch": 2},
              {"how": "exit", "error": "EOFError: ", "cause": None, "took": 0.5, "alive": 1, "had_before": 2},
              {"how": "exit", "batch": 4}]
    outcome = ch06._hung("exit", events)
    assert (outcome.had, outcome.errors, outcome.workers_left, outcome.had_before) == ([0, 2, 4], ["EOFError: "], 1, 2)
    assert outcome.kind == "EOFError, then hung"
    assert "batches had: 3 of 10" in str(outcome)


def test_the_outcome_doctests():
    import doctest

    assert doctest.testmod(ch06).failed == 0


def test_torch_outer_is_the_message_in_torchs_source():
    import inspect

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    source = inspect.getsource(_MultiProcessingDataLoaderIter._try_get_data)
    assert 'f"' + ch06.TORCH_OUTER.replace("<pid>", "{pids_str}") + '"' in source


def test_as_designed_wants_a_runtime_error_caused_by_one():
    try:
        try:
            raise RuntimeError("inner")
        except RuntimeError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as error:
        assert ch06.as_designed(error)
    assert not ch06.as_designed(RuntimeError("alone"))
    assert not ch06.as_designed(ConnectionResetError())


@pytest.mark.timeout(180)
def test_persistent_workers_keep_their_seed_every_epoch_and_still_draw_new_numbers_as_torchs_do():
    import torch

    from minidl_course import toy

    def two_epochs(loader_cls, dataset):
        loader = loader_cls(dataset, batch_size=2, num_workers=2, persistent_workers=True,
                            generator=torch.Generator().manual_seed(0))
        return [list(loader) for _ in range(2)]

    seeds = [{int(w[0]): int(s[0]) for _, w, s, _ in epoch} for epoch in two_epochs(minidl.DataLoader,
                                                                                      toy.WorkerIdDataset(8))]
    assert seeds[0] == seeds[1] and len(set(seeds[0].values())) == 2
    draws = [[[float(x) for _, d in epoch for x in d["numpy"]] for epoch in two_epochs(cls, toy.GlobalRandomDataset(8))]
             for cls in (minidl.DataLoader, torch.utils.data.DataLoader)]
    assert not set(draws[0][0]) & set(draws[0][1])
    assert draws[0] == draws[1]
