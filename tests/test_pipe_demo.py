"""minidl_course.pipe_demo: notebook 09's timing of a batch's trip from a process worker."""

from __future__ import annotations

import math

import pytest

import minidl
from minidl_course import pipe_demo


@pytest.mark.measures
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("collate", [minidl.numpy_collate, minidl.default_collate], ids=["numpy", "tensor"])
def test_receive_seconds_times_next_and_leaves_no_worker(collate):
    if collate is minidl.default_collate:
        pytest.importorskip("torch")
    seconds = pipe_demo.receive_seconds(collate, mib=1, batches=2)
    assert 0 < seconds < 60 and math.isfinite(seconds)


def test_unpickle_seconds_grows_with_the_batch():
    small, large = pipe_demo.unpickle_seconds(1, repeat=3), pipe_demo.unpickle_seconds(16, repeat=3)
    assert 0 < small < large  # 16 times the bytes to copy: no machine unpickles them faster than one MiB
