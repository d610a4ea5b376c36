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
    run = ch06.run_child(["after", "sigkill", CHILDREN], hang_s=0.05, startup_s=0.05)  # torch takes longer to import
    assert run["hung"]
    assert run["lines"][-1] == {"hung": 0.05}
    assert run["returncode"] == -signal.SIGKILL
    assert alive_in_group(run["pid"]) == []


@pytest.mark.timeout(60)
def test_a_child_that_fails_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="KeyError"):
        ch06.run_child(["no-such-command", "sigkill", CHILDREN])


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
            watchdog = ch06._Watchdog(hang_s=1.0, startup_s=1.0)
            for _ in range(3):
                time.sleep(0.6)
                watchdog.rearm()
            print("alive after", 1.8, flush=True)
            time.sleep(60)
    """)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50,
                          start_new_session=True)
    assert time.monotonic() - start < 40  # far short of the worker's 60 s sleep
    worker_pid, child_pid = map(int, proc.stdout.split()[:2])
    assert "alive after 1.8" in proc.stdout and proc.stdout.rstrip().endswith('{"hung": 1.0}')
    assert not psutil.pid_exists(worker_pid) or psutil.Process(worker_pid).status() == psutil.STATUS_ZOMBIE
    assert alive_in_group(child_pid) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how, cause", [("sigkill", "is killed by signal: Killed"), ("exit", "exit code 3")])
def test_torch_death_reports_torchs_messages_or_counts_the_other_endings(how, cause):
    run = ch06.torch_death(how, CHILDREN, tries=3)
    for other in run["others"]:
        assert other["type"] in ("RuntimeError", "ConnectionResetError", "EOFError", "hung"), other
    if run["designed"] is not None:
        assert run["designed"]["message"] == TORCH_MESSAGES[0]
        assert run["designed"]["cause"].startswith(TORCH_MESSAGES[1]) and cause in run["designed"]["cause"]
        assert run["designed"]["took"] >= 0
    else:
        assert len(run["others"]) == 3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torch_after_death_loses_the_dead_workers_batch_and_keeps_the_other_worker():
    after = ch06.torch_after_death(CHILDREN)
    if after["hung"]:  # torch's race: the harness must still say so and end
        return
    batches = [got for got in after["got"] if isinstance(got, int)]
    assert 6 not in batches  # batch 3 (samples 6, 7) died with worker 1
    assert set(batches) <= set(range(0, 20, 2)) and batches == sorted(batches)
    assert any(isinstance(got, str) for got in after["got"])
    assert after["alive_after_error"] == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_die_returns_minidls_runtime_error(how):
    error, received, took = ch06.die(minidl.DataLoader, how, CHILDREN)
    assert type(error) is RuntimeError
    assert ch06.no_pids(error).startswith(ch06.TORCH_HANDLER)  # torch's signal handler's words for one worker
    assert [6, 7] not in received and took >= 0


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
