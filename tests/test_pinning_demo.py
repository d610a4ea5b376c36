"""minidl_course.pinning_demo: a fake pinnable batch as torch's pin_memory expects it, page locking, GPU results."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data._utils.pin_memory import pin_memory as torch_pin_memory  # noqa: E402

import minidl  # noqa: E402
from minidl.pin_memory import pin_memory  # noqa: E402
from minidl_course import toy  # noqa: E402
from minidl_course.accelerators import pretend_cuda  # noqa: E402
from minidl_course.pinning_demo import (  # noqa: E402
    FakePinnable,
    fake_pinnable_collate,
    gpu_results,
    lock_pages,
    locked_bytes,
    page_faults,
)


def test_pin_memory_returns_a_pinned_copy_and_leaves_the_original():
    original = FakePinnable(np.arange(4))
    pinned = original.pin_memory()
    assert pinned is not original and pinned.value is not original.value
    assert np.array_equal(pinned.value, original.value)
    assert pinned.is_pinned() and not original.is_pinned()
    assert pinned.pinned_in == threading.current_thread().name
    assert repr(pinned) == "FakePinnable(array of 4 int64, pinned in MainThread)"


@pytest.mark.parametrize("pin", [pin_memory, torch_pin_memory], ids=["minidl", "torch"])
def test_both_pin_memory_functions_pin_every_leaf_of_a_nested_batch(pin):
    batch = {"image": FakePinnable(np.zeros(3)), "meta": [FakePinnable(1), "name.jpg", 7]}
    out = pin(batch)
    assert out["image"].is_pinned() and out["meta"][0].is_pinned()
    assert out["meta"][1:] == ["name.jpg", 7]
    assert not batch["image"].is_pinned() and not batch["meta"][0].is_pinned()


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
def test_the_collate_runs_in_workers_and_the_pin_thread_pins(worker_method):
    with pretend_cuda():
        loader = minidl.DataLoader(toy.RangeDataset(7), batch_size=3, num_workers=2, worker_method=worker_method,
                                   collate_fn=fake_pinnable_collate, pin_memory=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            batches = list(loader)
    assert [b.value.tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert {b.pinned_in for b in batches} == {"minidl_pin_memory"}


def test_touching_fresh_memory_takes_page_faults():
    before = page_faults()
    buffer = np.empty(8 << 20, dtype=np.uint8)  # 8 MiB: mapped, but no page is there until touched
    buffer.fill(1)
    assert page_faults() > before


def test_lock_pages_locks_and_unlocks_or_says_why():
    buffer = np.ones(256 << 10, dtype=np.uint8)  # 256 KiB
    before = locked_bytes()
    try:
        with lock_pages(buffer) as locked:
            assert locked is buffer
            during = locked_bytes()
    except OSError as e:
        assert "mlock" in str(e) and "ulimit -l" in str(e)
        pytest.skip(f"this machine refuses to lock memory: {e}")
    if before is not None:  # /proc/self/status exists (Linux)
        assert during - before >= buffer.nbytes
        assert locked_bytes() == before


def test_gpu_results_reads_committed_csvs(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    assert gpu_results(notebooks) == {}
    (tmp_path / "results" / "x86_64-16c-py3.11-gil").mkdir(parents=True)
    csv_path = tmp_path / "results" / "x86_64-16c-py3.11-gil" / "gpu.csv"
    csv_path.write_text("suite,task,method,median_s\ngpu,h2d-copy,pinned,0.001\n")
    (tmp_path / "results" / "x86_64-16c-py3.11-gil" / "kernels.csv").write_text("suite\nkernels\n")
    (tmp_path / "results" / "x86_64-2c-py3.11-gil").mkdir()  # the suite run without CUDA: a header, no rows
    (tmp_path / "results" / "x86_64-2c-py3.11-gil" / "gpu.csv").write_text("suite,task,method,median_s\n")
    assert gpu_results(notebooks) == {csv_path: [{"suite": "gpu", "task": "h2d-copy", "method": "pinned",
                                                   "median_s": "0.001"}]}


def test_gpu_results_outside_a_project_is_empty(tmp_path):
    assert gpu_results(tmp_path) == {}
