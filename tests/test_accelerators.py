"""minidl_course.accelerators: what notebooks 07 and 08 say and run on a CPU-only machine, on CUDA and on MPS.

The CUDA and MPS machines are this CPU-only build with torch reporting them (``accelerator_fakes``): the sentences
and 07's comparison with torch must hold there without raising, which is what a learner's GPU or Mac runs.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from accelerator_fakes import report_cuda, report_mps  # noqa: E402

from minidl_course import accelerators  # noqa: E402

DATA = torch.arange(20.0).view(10, 2)
MPS_WARNING = "'pin_memory' argument is set as true but not supported on MPS now, device pinned memory won't be used."
CPU_WARNING = ("'pin_memory' argument is set as true but no accelerator is found, "
               "then device pinned memory won't be used.")


def test_cpu_only_machine():
    assert accelerators.accelerator() == "cpu"
    assert "no accelerator" in accelerators.pinning_here() and "no accelerator" in accelerators.streams_here()
    assert accelerators.pinning_skipped_here() is None  # 07 tries torch's pinning calls, and prints what they raise
    rows = accelerators.compare_pinning(DATA)
    assert [r.setting for r in rows] == ["num_workers=0", "num_workers=2"]
    for row in rows:
        assert row.our_warnings == row.their_warnings == [CPU_WARNING]
        assert row.batches == 3 and row.same_batches and not row.pinned
        assert row.parity() == f"{row.setting}: 3 batches, the same warnings as torch: True, the same batches: True"
        assert row.here() == f"{row.setting}: {CPU_WARNING} (batches pinned: False)"


@pytest.mark.usefixtures("no_leaks")
def test_mps_reported(monkeypatch):
    report_mps(monkeypatch)
    assert accelerators.accelerator() == "mps"
    assert "MPS" in accelerators.pinning_here() and "MPS, not CUDA" in accelerators.streams_here()
    assert "not tried here" in accelerators.pinning_skipped_here()  # 07 calls none of torch's pinning functions
    for row in accelerators.compare_pinning(DATA):
        assert row.our_warnings == row.their_warnings == [MPS_WARNING]
        assert row.same_batches and not row.pinned
        assert "the same warnings as torch: True" in row.parity()


@pytest.mark.usefixtures("no_leaks")
def test_cuda_reported(monkeypatch):
    """07's comparison (its cell 27 raised IndexError here: no warning comes where CUDA pins)."""
    report_cuda(monkeypatch)
    assert accelerators.accelerator() == "cuda"
    assert "CUDA" in accelerators.pinning_here() and "side stream" in accelerators.streams_here()
    assert accelerators.pinning_skipped_here() is None
    for row in accelerators.compare_pinning(DATA):
        assert row.our_warnings == row.their_warnings == []
        assert row.same_batches and row.batches == 3
        assert row.here() == f"{row.setting}: no warning (batches pinned: False)"  # the fake pins by a plain copy


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("machine", ["cpu", "mps"])
def test_pretend_cuda_starts_minidl_pin_thread_on_any_machine(machine, monkeypatch):
    """07 runs the real pin thread on stand-in batches: on a Mac too, where minidl would otherwise not pin."""
    import minidl
    from minidl_course import toy
    from minidl_course.pinning_demo import fake_pinnable_collate

    if machine == "mps":
        report_mps(monkeypatch)
    with accelerators.pretend_cuda():
        loader = minidl.DataLoader(toy.RangeDataset(6), batch_size=2, num_workers=2, pin_memory=True,
                                   collate_fn=fake_pinnable_collate)
        batches = list(loader)
    assert [b.value.tolist() for b in batches] == [[0, 1], [2, 3], [4, 5]]
    assert {b.pinned_in for b in batches} == {"minidl_pin_memory"}
    assert accelerators.accelerator() == machine  # and torch answers as before once the block is left


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_warning_shows_once_per_place_in_the_code_under_pythons_default_filter(num_workers):
    """What 07 says: without an accelerator both loaders warn as each pass starts, and Python's default action for
    a UserWarning ("default": once per module and line that warns) shows it for the first pass only."""
    import warnings

    import torch.utils.data as tud

    import minidl

    for lib in (tud, minidl):
        loader = lib.DataLoader(lib.TensorDataset(DATA), batch_size=4, pin_memory=True, num_workers=num_workers)
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("default")
            for _ in range(3):
                assert len(list(loader)) == 3
        assert [str(w.message) for w in shown] == [CPU_WARNING], lib.__name__
        with warnings.catch_warnings(record=True) as every:
            warnings.simplefilter("always")
            for _ in range(3):
                list(loader)
        assert [str(w.message) for w in every] == [CPU_WARNING] * 3, lib.__name__  # one per pass, all raised
