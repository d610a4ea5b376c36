"""The ``gpu`` bench suite: without CUDA it says so and records nothing; with CUDA (``gpu`` marker) its quick
run writes the rows it promises. No test asserts a speed."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from accelerator_fakes import report_cuda  # noqa: E402

import minidl_bench  # noqa: E402
from minidl_bench import gpu  # noqa: E402
from minidl_bench.harness import COLUMNS, PlainBar, Session, main, missing  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def registered(monkeypatch):
    """The suite registered under ``gpu``, whether or not minidl_bench.SUITES lists it yet."""
    monkeypatch.setitem(minidl_bench.SUITES, "gpu", "minidl_bench.gpu")


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == COLUMNS
        return list(reader)


def test_without_cuda_the_suite_says_it_needs_cuda_and_records_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # so this holds on a GPU machine too
    session = Session("gpu", quick=True, out=tmp_path, bar=PlainBar())  # it prints what a suite logs
    gpu.run(session)
    assert "needs CUDA" in capsys.readouterr().out
    assert session.rows == [] and session.figures == []
    assert not list(tmp_path.iterdir())


@pytest.mark.usefixtures("registered")
def test_without_cuda_the_cli_exits_cleanly(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["gpu", "--quick", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "needs CUDA" in captured.out + captured.err
    assert not list(tmp_path.glob("*.png"))
    # The harness writes a CSV for every suite it ran; this one has a header and no rows.
    assert not (tmp_path / "gpu.csv").exists() or read_rows(tmp_path / "gpu.csv") == []


@pytest.mark.usefixtures("registered")
def test_without_tqdm_the_cli_prints_plain_lines(tmp_path, monkeypatch, capsys):
    # The GPU machine's own Python may lack tqdm: the harness then prints what the bar would have written.
    from minidl_bench import harness

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(harness, "missing", lambda *modules: [m for m in modules if m == "tqdm"])
    monkeypatch.setitem(sys.modules, "tqdm", None)  # importing it would fail
    assert main(["gpu", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[gpu] skipped the whole suite: it needs CUDA" in out and "[gpu] measured nothing: no CSV written" in out


@pytest.fixture
def pin_loops(monkeypatch):
    """Which library's pin-memory loop each pin thread ran: torch reports CUDA and pins by a copy (accelerator_fakes),
    so both loaders start their pin threads here."""
    from torch.utils.data._utils import pin_memory as torch_pin

    import minidl.pin_memory

    report_cuda(monkeypatch)
    ran = []
    for name, module in (("torch", torch_pin), ("minidl", minidl.pin_memory)):
        def loop(*args, _loop=module._pin_memory_loop, _name=name):
            ran.append(_name)
            _loop(*args)
        monkeypatch.setattr(module, "_pin_memory_loop", loop)
    return ran


@pytest.mark.usefixtures("no_leaks")
def test_the_pin_thread_task_runs_both_pin_threads_here(tmp_path, pin_loops, capsys):
    """The pin-thread task tried on this CPU machine: each round runs an epoch through torch's pin thread and one
    through minidl's, to device "cpu"; torch is the baseline and minidl's row carries the paired ratio."""
    session = Session("gpu", quick=True, out=tmp_path, bar=PlainBar())
    results = gpu.pin_thread(session, torch, "cpu", lambda: None)
    rounds = session.repeats + 1  # the warm-up round first
    assert {name: len(values) for name, values in results.items()} == {"torch": rounds, "minidl": rounds}
    assert all(v > 0 for values in results.values() for v in values)
    assert sorted(pin_loops) == ["minidl"] * (rounds + 1) + ["torch"] * (rounds + 1)  # + the batches' check
    assert [(r.task, r.method, r.size, r.workers, r.baseline) for r in session.rows] == [
        ("pin-thread", "torch", gpu.QUICK_PIN_BATCH, 2, True), ("pin-thread", "minidl", gpu.QUICK_PIN_BATCH, 2, False)]
    assert "per batch, minidl / torch paired by round: " in session.rows[1].note
    with open(tmp_path / "gpu_rounds.csv", newline="") as f:  # every round's figure, to pair them again
        rows = [(r["task"], r["method"], int(r["round"]), float(r["per_batch_s"])) for r in csv.DictReader(f)]
    assert [row[:3] for row in rows] == [("pin-thread", name, r) for name in results for r in range(rounds)]
    assert [row[3] for row in rows] == pytest.approx([v for values in results.values() for v in values], rel=1e-5)
    log = capsys.readouterr().out
    assert f"both loaders give the same {gpu.QUICK_PIN_BATCHES} batches, pinned: False" in log  # the fake copies
    assert "seconds per batch, minidl / torch, median [CI] of 3 paired rounds: " in log


@pytest.mark.usefixtures("no_leaks")
def test_the_pin_thread_task_refuses_batches_that_differ_from_torchs(tmp_path, pin_loops, monkeypatch):
    import minidl.pin_memory

    monkeypatch.setattr(minidl.pin_memory, "pin_memory", lambda data, device=None: [data[0], data[1] + 1])
    session = Session("gpu", quick=True, out=tmp_path, bar=PlainBar())
    with pytest.raises(AssertionError, match="minidl's pinned batches differ from torch's"):
        gpu.pin_thread(session, torch, "cpu", lambda: None)
    assert session.rows == []


class QueuedDevice:
    """A device queue on the CPU that keeps CUDA's documented host synchronisation: queued work runs only when the
    host waits for it. A blocking copy (torch's ``memcpy_and_sync``: the copy, then ``cudaStreamSynchronize``) and a
    ``non_blocking`` copy from pageable memory (which CUDA says may be synchronous; here it always is) wait for
    everything queued before them; a ``non_blocking`` copy from pinned memory is only queued. ``log`` records what
    happened, in order."""

    def __init__(self, step_s: float) -> None:
        self.step_s, self.queue, self.log, self.pinned = step_s, [], [], set()

    def pin(self, tensor):
        pinned = tensor.clone()
        self.pinned.add(pinned.data_ptr())
        return pinned

    def queue_step(self) -> None:
        def step():
            time.sleep(self.step_s)
            self.log.append("step done")
        self.queue.append(step)

    def synchronize(self) -> None:
        while self.queue:
            self.queue.pop(0)()

    def to(self, x, non_blocking):
        out = torch.empty_like(x)
        if non_blocking and x.data_ptr() in self.pinned:
            self.queue.append(lambda: out.copy_(x))
        else:
            self.synchronize()
            out.copy_(x)
        self.log.append(f"copy returned, pinned {x.data_ptr() in self.pinned}, non_blocking {non_blocking}")
        return out


@pytest.fixture
def queued_device(monkeypatch):
    """The CUDA stand-in (accelerator_fakes.report_cuda), pinning into memory the QueuedDevice knows as pinned."""
    report_cuda(monkeypatch)
    device = QueuedDevice(step_s=0.02)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, device_=None: device.pin(self))
    return device


def test_the_host_wait_task_times_what_the_loops_thread_waits_for(tmp_path, queued_device, capsys):
    """Tried through a device queue that keeps CUDA's rules: a blocking copy, or a non_blocking one from pageable
    memory, holds the thread for the step queued before it (the step's sleep is a floor no load can lower); a
    non_blocking copy from pinned memory returns before that step has run."""
    session = Session("gpu", quick=True, out=tmp_path, bar=PlainBar())
    waits = gpu.host_wait(session, torch, "cuda", queued_device.queue_step, queued_device.synchronize,
                          to=queued_device.to)
    rounds = session.repeats + 1  # the warm-up round first
    assert {name: len(values) for name, values in waits.items()} == {name: rounds for name in gpu.WAIT_WAYS}
    for name in ("pageable, blocking", "pageable, non_blocking", "pinned, blocking"):
        assert min(waits[name]) >= queued_device.step_s, name
    log = queued_device.log
    returned = [i for i, line in enumerate(log) if line == "copy returned, pinned True, non_blocking True"]
    assert len(returned) == rounds
    assert all(log[i - 1] != "step done" for i in returned)  # returned with its step still queued
    assert all(log[i + 1] == "step done" for i in returned)  # which ran when the bench synchronised
    blocking = [i for i, line in enumerate(log) if line.startswith("copy returned") and i not in returned]
    assert len(blocking) == 3 * rounds and all(log[i - 1] == "step done" for i in blocking)
    assert [(r.task, r.method, r.size, r.baseline) for r in session.rows] == [
        ("h2d-wait", name, gpu.QUICK_WAIT_BATCH, name == "pageable, blocking") for name in gpu.WAIT_WAYS] + [
        ("h2d-wait", "step alone", gpu.QUICK_WAIT_BATCH, False)]
    assert session.rows[-1].timing.min >= queued_device.step_s
    assert all("the step queued before each copy: " in r.note for r in session.rows[:-1])
    assert "x.to() held the loop's thread for (median of 3): pageable, blocking " in capsys.readouterr().out


def test_the_host_wait_task_refuses_a_copy_that_differs(tmp_path, queued_device):
    def wrong(x, non_blocking):
        return queued_device.to(x, non_blocking) + 1

    session = Session("gpu", quick=True, out=tmp_path, bar=PlainBar())
    with pytest.raises(AssertionError, match="h2d-wait: the .* copy of 8 images is wrong"):
        gpu.host_wait(session, torch, "cuda", queued_device.queue_step, queued_device.synchronize, to=wrong)
    assert session.rows == []


def test_gpu_check_script_without_cuda_says_so_and_exits_cleanly(tmp_path):
    out = tmp_path / "run"
    # An empty CUDA_VISIBLE_DEVICES hides any GPU, so this holds on a GPU machine too.
    env = os.environ | {"PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== no CUDA here: nothing to test or measure" in result.stdout
    assert f"torch {torch.__version__}, built for CUDA {torch.version.cuda}" in result.stdout
    assert "torch.cuda.is_available() is False" in result.stdout
    assert "== gpu-marked tests" not in result.stdout  # nothing was run
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log"]
    assert (out / "gpu_check.log").read_text() == result.stdout  # the log is everything it printed


def test_gpu_check_script_needs_its_output_folder():
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2 and "usage:" in result.stderr


def test_importing_the_suite_does_not_import_torch():
    code = "import sys, minidl_bench.gpu; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("registered")
def test_quick_run_on_cuda_writes_every_row(tmp_path):
    assert main(["gpu", "--quick", "--out", str(tmp_path)]) == 0
    rows = read_rows(tmp_path / "gpu.csv")
    copies = [r for r in rows if r["task"] == "h2d-copy"]
    assert sorted((int(r["size"]), r["method"]) for r in copies) == sorted(
        (n, m) for n in gpu.QUICK_COPY_BATCHES for m in ("pageable", "pinned"))
    waits = [r for r in rows if r["task"] == "h2d-wait"]
    assert [(r["method"], int(r["size"])) for r in waits] == [
        (name, gpu.QUICK_WAIT_BATCH) for name in [*gpu.WAIT_WAYS, "step alone"]]
    steps = [r for r in rows if r["task"] == "train-step"]
    assert {r["method"] for r in steps} == {"data already on GPU", "copy then step", "copy then step, pageable, "
                                            "blocking", "PrefetchLoader, pinned", "PrefetchLoader, pageable"}
    assert all(int(r["size"]) == gpu.QUICK_STEPS for r in steps)
    assert all("the loop's thread queued the epoch in " in r["note"] for r in steps)
    pins = [r for r in rows if r["task"] == "pin-thread"]
    assert [(r["method"], int(r["size"])) for r in pins] == [("torch", gpu.QUICK_PIN_BATCH),
                                                              ("minidl", gpu.QUICK_PIN_BATCH)]
    assert all("pinned: True" in r["note"] for r in pins) and "minidl / torch paired by round" in pins[1]["note"]
    assert len(rows) == len(copies) + len(waits) + len(steps) + len(pins)
    for r in rows:
        median, low, high = float(r["median_s"]), float(r["min_s"]), float(r["max_s"])
        assert 0 < low <= median <= high and int(r["repeats"]) >= 3
    assert all("GB/s" in r["note"] for r in copies)
    assert all(r["speedup"] for r in rows), "every row has a baseline in its (task, size) group"
    assert (tmp_path / "gpu_rounds.csv").exists()
    if not missing("matplotlib"):
        assert sorted(p.name for p in tmp_path.glob("*.png")) == ["gpu_bandwidth.png", "gpu_prefetch.png"]
