"""minidl_course.osfacts: each fact probed on this Linux machine, and taken away in the Mac stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minidl_course import osfacts

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "mac_standin"


def in_standin(code: str) -> dict:
    """Run ``code`` (which prints one JSON line last) in a fresh interpreter inside the Mac stand-in."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{STANDIN}")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_fact_is_true_when_available_and_its_line_says_why_not_otherwise():
    there, missing = osfacts.Fact("X", True), osfacts.Fact("Y", False, "no Y here")
    assert there and not missing
    assert there.line() == "This platform shows X."
    assert missing.line() == "This platform can't show Y: no Y here."
    assert osfacts.linux_only(missing, "PSS grows").startswith("Linux only: PSS grows. This platform can't show Y")
    assert "committed Linux result" in osfacts.linux_only(missing, "PSS grows")
    assert osfacts.linux_only(there, "PSS grows").startswith("Linux only: PSS grows.")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="these facts are Linux's")
def test_on_linux_every_fact_the_course_needs_is_there_and_the_readers_read_it():
    missing = [f.line() for f in osfacts.all_facts() if not f and "namespace" not in f.what]
    assert not missing
    me = os.getpid()
    assert osfacts.status_kib(me, "VmRSS") > 0 and osfacts.status_kib(me, "VmPTE") > 0
    assert osfacts.status_kib(me, "VmNothing") is None
    assert osfacts.locked_bytes() >= 0
    assert 0 < osfacts.uss_bytes() and 0 < osfacts.pss_bytes() <= osfacts.status_kib(me, "VmRSS") * 1024 * 2
    assert osfacts.pss_bytes(me) > 0
    assert isinstance(osfacts.open_shm_files(me), list) and isinstance(osfacts.mapped_shm_files(me), list)
    assert osfacts.open_shm_sizes([me]) is not None
    assert all(name.startswith(f"torch_{me}_") for name in osfacts.shm_files([me]))
    assert osfacts.shm_size_bytes() > 0
    busy, total = osfacts.machine_cpu_seconds()
    assert 0 <= busy <= total
    assert osfacts.pids_named("definitely-no-such-command") == []
    assert "file_descriptor" in osfacts.sharing_strategies()


def test_a_reader_asked_about_a_process_that_is_gone_returns_none_or_nothing():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert osfacts.status_kib(child.pid, "VmRSS") is None
    assert osfacts.open_shm_files(child.pid) is None and osfacts.mapped_shm_files(child.pid) is None
    assert osfacts.pss_bytes(child.pid) is None and osfacts.uss_bytes(child.pid) is None


@pytest.mark.timeout(120)
def test_in_the_mac_standin_each_missing_fact_says_why_and_no_reader_raises():
    got = in_standin(
        "import json, os\n"
        "from minidl_course import osfacts\n"
        "facts = {f.what: [bool(f), f.why_not] for f in osfacts.all_facts()}\n"
        "me = os.getpid()\n"
        "reads = [osfacts.status_kib(me, 'VmPTE'), osfacts.locked_bytes(), osfacts.pss_bytes(),\n"
        "         osfacts.open_shm_files(me), osfacts.mapped_shm_files(me), osfacts.open_shm_sizes([me]),\n"
        "         osfacts.shm_files([me]), osfacts.shm_size_bytes(), osfacts.machine_cpu_seconds(),\n"
        "         osfacts.pids_named('python')]\n"
        "print(json.dumps({'facts': facts, 'reads': reads, 'uss': osfacts.uss_bytes(),\n"
        "                  'strategies': sorted(osfacts.sharing_strategies())}))\n")
    shown = {what for what, (available, _) in got["facts"].items() if available}
    assert shown == {"a process's private memory (USS)", "torch's 'file_system' sharing strategy"}
    assert all(why for what, (available, why) in got["facts"].items() if not available)
    assert got["facts"]["a process's proportional set size (PSS)"][1].startswith("psutil gives this platform rss")
    assert got["facts"]["torch's 'file_descriptor' sharing strategy"][1] == (
        "torch offers only ['file_system'] on this platform")
    assert got["reads"] == [None] * 10
    assert got["uss"] > 0 and got["strategies"] == ["file_system"]
