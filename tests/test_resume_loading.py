"""load_state_dict() checks what it is given: the version, the keys, and a loader built like the one that saved
it; the pair needs stateful=True."""

from __future__ import annotations

import numpy as np
import pytest
from resumetools import saved_state

import minidl
from minidl_course import toy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(300)]


def test_different_num_workers_is_refused_clearly():
    loader = minidl.DataLoader(toy.RangeDataset(10), num_workers=2, stateful=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError, match="num_workers=2"):
        minidl.DataLoader(toy.RangeDataset(10), num_workers=1, stateful=True).load_state_dict(state)
    with pytest.raises(ValueError, match="worker_method"):
        minidl.DataLoader(toy.RangeDataset(10), num_workers=2, worker_method="thread", stateful=True).load_state_dict(
            state)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_state_dict_and_load_state_dict_need_stateful(num_workers):
    it = iter(loader := minidl.DataLoader(toy.RangeDataset(10), num_workers=num_workers))
    next(it)
    with pytest.raises(RuntimeError, match="state_dict\\(\\) needs DataLoader\\(..., stateful=True\\)"):
        loader.state_dict()
    del it
    state = saved_state(num_workers=num_workers)
    with pytest.raises(RuntimeError, match="load_state_dict\\(\\) needs DataLoader\\(..., stateful=True\\)"):
        minidl.DataLoader(toy.RangeDataset(12), batch_size=2, num_workers=num_workers).load_state_dict(state)


def test_bad_version_is_refused():
    with pytest.raises(ValueError, match="version"):
        minidl.DataLoader(toy.RangeDataset(4), stateful=True).load_state_dict({"version": 99})


@pytest.mark.parametrize("other, key", [
    (dict(dataset=toy.RangeDataset(10)), "dataset_len"),
    (dict(batch_size=3), "batch_size"),
    (dict(shuffle=True), "sampler"),
])
def test_load_state_dict_refuses_a_state_from_another_setting(other, key):
    state = saved_state()
    kwargs = dict(dataset=toy.RangeDataset(12), batch_size=2, stateful=True) | other
    with pytest.raises(ValueError, match=f"saved with {key}="):
        minidl.DataLoader(kwargs.pop("dataset"), **kwargs).load_state_dict(state)


@pytest.mark.parametrize("key", ["tasks_done", "generators", "num_workers"])
def test_load_state_dict_names_a_missing_key(key):
    state = saved_state()
    del state[key]
    with pytest.raises(ValueError, match=f"lacks the keys \\['{key}'\\]"):
        minidl.DataLoader(toy.RangeDataset(12), batch_size=2, stateful=True).load_state_dict(state)


@pytest.mark.parametrize(("saved", "loaded", "words"), [
    ("torch", None, "\\['a torch.Generator'\\] but this DataLoader has generator_kinds=\\['the global random state'"),
    (None, "torch", "\\['the global random state'\\] but this DataLoader has generator_kinds=\\['a torch.Generator'"),
    ("torch", "numpy", "\\['a torch.Generator'\\] but this DataLoader has generator_kinds=\\['a numpy.random"),
])
def test_load_state_dict_refuses_another_generator_setup(saved, loaded, words):
    def generator(kind):
        return {None: None, "torch": torch.Generator().manual_seed(1), "numpy": np.random.default_rng(1)}[kind]

    def make(kind):
        return minidl.DataLoader(toy.RangeDataset(10), batch_size=2, shuffle=True, generator=generator(kind),
                                 stateful=True)

    loader = make(saved)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    with pytest.raises(ValueError, match=words):
        make(loaded).load_state_dict(state)
    make(saved).load_state_dict(state)  # the same setup resumes
