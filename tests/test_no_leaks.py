"""The unit tests' leak check (conftest.no_leaks) counts only /dev/shm files made by the test's own processes."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest
from conftest import OwnProcesses, shm_made_since, shm_segments

from minidl_course import osfacts

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not osfacts.dev_shm(), reason=osfacts.dev_shm().why_not or "no /dev/shm")]

MAKE = "import os; open(f'/dev/shm/torch_{os.getpid()}_123_0', 'w').close()"


def make_torch_file() -> None:
    """Runs in a child started by multiprocessing: leaves a file named as torch names its segments, and exits."""
    open(f"/dev/shm/torch_{os.getpid()}_123_0", "w").close()


def test_a_file_left_by_a_process_the_test_started_counts_even_after_it_exited():
    own = OwnProcesses()
    child = multiprocessing.get_context("spawn").Process(target=make_torch_file)
    child.start()
    child.join()
    pids = own.stop()
    name = f"torch_{child.pid}_123_0"
    try:
        assert child.pid in pids and name in shm_segments(pids)
    finally:
        os.unlink(f"/dev/shm/{name}")


def test_another_programs_torch_file_does_not_count():
    own = OwnProcesses()
    # Another program: started by a process that exits at once, so it is no descendant of this one.
    launcher = subprocess.run(
        [sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
         f"{MAKE + '; import time; time.sleep(30)'!r}], start_new_session=True); print(p.pid)"],
        capture_output=True, text=True, check=True)
    other = int(launcher.stdout)
    name = f"torch_{other}_123_0"
    try:
        for _ in range(200):  # wait for it to appear
            if name in osfacts.shm_files():
                break
            subprocess.run(["sleep", "0.05"])
        pids = own.stop()
        assert name in osfacts.shm_files() and other not in pids and name not in shm_segments(pids)
    finally:
        os.kill(other, 9)
        os.unlink(f"/dev/shm/{name}")


def test_a_file_an_earlier_process_left_does_not_count_when_a_new_process_has_its_pid():
    # pids are reused: a worker of this test may get the pid of a process that left torch files long ago.
    child = multiprocessing.get_context("spawn").Process(target=make_torch_file)
    child.start()
    child.join()
    stale = f"torch_{child.pid}_123_0"
    fresh = f"torch_{child.pid}_456_0"
    try:
        before = set(osfacts.shm_files())  # as the fixture looks when a test begins
        open(f"/dev/shm/{fresh}", "w").close()  # made during the test by "a process with that pid"
        assert stale in shm_segments([child.pid])
        assert shm_made_since(before, [child.pid]) == {fresh}
    finally:
        os.unlink(f"/dev/shm/{stale}")
        os.unlink(f"/dev/shm/{fresh}")
