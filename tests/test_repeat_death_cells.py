"""scripts/repeat_death_cells.py: a process the notebook's kernel started and left running is found, orphan or not."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import repeat_death_cells  # noqa: E402  (scripts/ is not a package)


@pytest.mark.timeout(60)
def test_a_process_left_running_is_found_by_its_mark_even_when_its_parent_is_gone():
    token = uuid.uuid4().hex
    env = {**os.environ, repeat_death_cells.MARK: token}
    # sh starts sleep in the background and exits at once: the sleep is an orphan, no one's child here
    subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 &"], env=env, check=True)
    try:
        deadline = time.monotonic() + 10
        while not (left := repeat_death_cells.left_running(token, kernel_pid=-1)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(left) == 1 and left[0].endswith(": sleep 30"), left
        assert repeat_death_cells.left_running(uuid.uuid4().hex, kernel_pid=-1) == []  # another run's mark: not ours
    finally:
        for line in repeat_death_cells.left_running(token, kernel_pid=-1):
            psutil.Process(int(line.split(":")[0])).kill()
    deadline = time.monotonic() + 10
    while repeat_death_cells.left_running(token, kernel_pid=-1) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert repeat_death_cells.left_running(token, kernel_pid=-1) == []
