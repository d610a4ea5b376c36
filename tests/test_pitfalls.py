"""The deliberate mistakes of minidl/course/pitfalls.py: they must go wrong exactly as notebook 06 says."""

from __future__ import annotations

import multiprocessing
import os
import random

import numpy as np
import pytest

from minidl.course import pitfalls

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_global_draws_names_this_process_and_follows_the_global_seeds():
    random.seed(3)
    np.random.seed(3)
    expected = {"random": [random.random(), random.random()], "numpy": np.random.rand(2).tolist()}
    random.seed(3)
    np.random.seed(3)
    pid, draws = pitfalls.global_draws(2)
    assert pid == os.getpid()
    assert {k: draws[k] for k in expected} == expected


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs the fork start method")
def test_forked_processes_repeat_numpy_and_torch_draws_but_not_python_random():
    np.random.seed(0)
    # One task per process: each is a fresh fork of this process, as each DataLoader worker is.
    with multiprocessing.get_context("fork").Pool(2, maxtasksperchild=1) as pool:
        results = pool.map(pitfalls.global_draws, [3] * 4, chunksize=1)
    pids = [pid for pid, _ in results]
    assert len(set(pids)) == 4 and os.getpid() not in pids
    draws = [d for _, d in results]
    np.random.seed(0)
    parent = np.random.rand(3).tolist()
    assert all(d["numpy"] == parent for d in draws)  # the parent's next draws, four times over
    if "torch" in draws[0]:
        assert all(d["torch"] == draws[0]["torch"] for d in draws)
    assert len({tuple(d["random"]) for d in draws}) == 4  # random reseeds itself after fork
