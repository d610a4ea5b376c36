"""DataLoader's API and the single-process iterator, with torch.utils.data as the oracle."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402
from loadertools import TorchShardedRange  # noqa: E402

import minidl  # noqa: E402
from minidl_bench.batches import assert_same_batch  # noqa: E402
from minidl_course import toy  # noqa: E402

Point = collections.namedtuple("Point", ["x", "y"])


class NestedDataset(minidl.Dataset):
    """Samples of every container and leaf type collate handles."""

    def __len__(self):
        return 13

    def __getitem__(self, i):
        return {
            "tensor": torch.arange(3) + i,
            "array": np.full((2, 2), i, dtype=np.float32),
            "int": i,
            "float": i / 2,
            "str": f"s{i}",
            "tuple": (i, torch.tensor([i, -i])),
            "point": Point(i, float(i)),
        }


def both(dataset_factory, seed=0, **kwargs):
    """The batches of minidl's and torch's loaders built with the same arguments and seed."""
    out = []
    for mod in (minidl, tud):
        kw = dict(kwargs)
        if kw.pop("seeded", False):
            kw["generator"] = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        out.append(list(mod.DataLoader(dataset_factory(), **kw)))
    return out


DATASETS = {
    "range": lambda: toy.RangeDataset(17),
    "nested": NestedDataset,
    "tensors": lambda: minidl.TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10)),
    "numpy": lambda: [np.arange(3, dtype=np.int16) * i for i in range(11)],
    "strings": lambda: [f"item-{i}" for i in range(9)],
}


@pytest.mark.parametrize("name", DATASETS)
@pytest.mark.parametrize("batch_size", [1, 3, 4, None])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_same_batches_as_torch(name, batch_size, drop_last, shuffle):
    if batch_size is None and drop_last:
        return  # an invalid combination, covered by test_bad_arguments
    ours, theirs = both(DATASETS[name], batch_size=batch_size, drop_last=drop_last, shuffle=shuffle, seeded=shuffle)
    assert_same_batch(ours, theirs)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_shuffle_without_generator_follows_torch_global_seed(seed):
    ours, theirs = both(lambda: toy.RangeDataset(30), seed=seed, batch_size=4, shuffle=True)
    assert_same_batch(ours, theirs)


def test_every_sampler_gives_torch_batches():
    n = 25
    weights = [0.1 * (i % 5 + 1) for i in range(n)]
    makers = {
        "random_replacement": lambda m, g: m.RandomSampler(range(n), replacement=True, num_samples=40, generator=g),
        "random_num_samples": lambda m, g: m.RandomSampler(range(n), num_samples=60, generator=g),
        "subset_random": lambda m, g: m.SubsetRandomSampler(list(range(3, 20)), generator=g),
        "weighted": lambda m, g: m.WeightedRandomSampler(weights, 30, generator=g),
        "weighted_noreplace": lambda m, g: m.WeightedRandomSampler(weights, 20, replacement=False, generator=g),
    }
    for name, make in makers.items():
        batches = []
        for mod in (minidl, tud):
            g = torch.Generator().manual_seed(3)
            batches.append(list(mod.DataLoader(toy.RangeDataset(n), batch_size=4, sampler=make(mod, g))))
        assert_same_batch(*batches, path=name)
    # a custom batch_sampler, and a plain list as sampler
    for kw in (dict(batch_sampler=[[3, 1], [0, 2, 4]]), dict(sampler=[5, 2, 9], batch_size=2)):
        ours, theirs = both(lambda: toy.RangeDataset(n), **kw)
        assert_same_batch(ours, theirs)


def test_random_split_subsets_load_like_torch():
    parts = []
    for mod in (minidl, tud):
        g = torch.Generator().manual_seed(11)
        subsets = mod.random_split(toy.RangeDataset(20), [0.5, 0.3, 0.2], generator=g)
        parts.append([list(mod.DataLoader(s, batch_size=3)) for s in subsets])
    assert_same_batch(*parts)


def test_iterable_dataset_batches_and_len():
    for batch_size, drop_last in [(4, False), (4, True), (None, False), (1, False)]:
        loaders = [minidl.DataLoader(toy.ShardedRange(0, 10), batch_size=batch_size, drop_last=drop_last),
                   tud.DataLoader(TorchShardedRange(0, 10), batch_size=batch_size, drop_last=drop_last)]
        assert len(loaders[0]) == len(loaders[1])
        assert_same_batch(list(loaders[0]), list(loaders[1]))


class _TooShort(minidl.IterableDataset):
    def __iter__(self):
        return iter(range(5))

    def __len__(self):
        return 3


def test_torch_iterable_dataset_runs_on_minidl():
    assert_same_batch(list(minidl.DataLoader(TorchShardedRange(0, 7), batch_size=3)),
                list(tud.DataLoader(TorchShardedRange(0, 7), batch_size=3)))


def test_iterable_longer_than_reported_len_warns():
    loader = minidl.DataLoader(_TooShort(), batch_size=None)
    assert len(loader) == 3
    with pytest.warns(UserWarning, match="reported to be 3"):
        list(loader)


def test_len_matches_torch():
    for kw in [dict(batch_size=3), dict(batch_size=3, drop_last=True), dict(batch_size=None),
               dict(batch_sampler=[[0], [1, 2]])]:
        assert len(minidl.DataLoader(toy.RangeDataset(10), **kw)) == len(tud.DataLoader(toy.RangeDataset(10), **kw))


def test_getitems_is_used_for_a_batch():
    class Batched(toy.RangeDataset):
        calls = 0

        def __getitems__(self, indices):
            Batched.calls += 1
            return [self[i] for i in indices]

    batches = list(minidl.DataLoader(Batched(10), batch_size=5))
    assert Batched.calls == 2 and [b.tolist() for b in batches] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_default_collate_fn_choice_follows_auto_collation():
    assert minidl.DataLoader([1]).collate_fn is minidl.default_collate
    assert minidl.DataLoader([1], batch_size=None).collate_fn is minidl.default_convert


def test_frozen_attributes_after_init():
    loader = minidl.DataLoader(toy.RangeDataset(4))
    for attr in ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"):
        with pytest.raises(ValueError, match=attr):
            setattr(loader, attr, None)
    loader.num_workers = 0  # not frozen, as in torch


def test_iterator_cannot_be_pickled():
    import pickle

    with pytest.raises(NotImplementedError, match="cannot be pickled"):
        pickle.dumps(iter(minidl.DataLoader(toy.RangeDataset(4))))


def test_pin_memory_without_accelerator_warns_and_yields_plain_batches():
    with pytest.warns(UserWarning, match="no accelerator"):
        batches = list(minidl.DataLoader(toy.RangeDataset(4), batch_size=2, pin_memory=True))
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3]]


# --- bad input: the same exception type as torch, and a message naming the argument ---------

ds = toy.RangeDataset(8)
BAD = [
    (dict(num_workers=-1), ValueError, "num_workers"),
    (dict(timeout=-1), ValueError, "timeout"),
    (dict(prefetch_factor=2), ValueError, "prefetch_factor"),
    (dict(num_workers=1, prefetch_factor=-1), ValueError, "prefetch_factor"),
    (dict(persistent_workers=True), ValueError, "persistent_workers"),
    (dict(sampler=[0, 1], shuffle=True), ValueError, "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[0]], batch_size=2), ValueError, "batch_sampler"),
    (dict(batch_sampler=[[0]], shuffle=True), ValueError, "batch_sampler"),
    (dict(batch_sampler=[[0]], sampler=[0]), ValueError, "batch_sampler"),
    (dict(batch_sampler=[[0]], drop_last=True), ValueError, "batch_sampler"),
    (dict(batch_size=None, drop_last=True), ValueError, "drop_last"),
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(batch_size=-2), ValueError, "batch_size"),
    (dict(multiprocessing_context="spawn"), ValueError, "multiprocessing_context"),
    (dict(num_workers=1, multiprocessing_context="nope"), ValueError, "multiprocessing_context"),
    (dict(num_workers=1, multiprocessing_context=3), TypeError, "multiprocessing_context"),
]


@pytest.mark.parametrize("kwargs,exc,match", BAD, ids=[str(k) for k, _, _ in BAD])
def test_bad_arguments(kwargs, exc, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(exc, match=match):
            tud.DataLoader(ds, **kwargs)  # the oracle agrees this is an error of this type
        with pytest.raises(exc, match=match):
            minidl.DataLoader(ds, **kwargs)


@pytest.mark.parametrize("kwargs,match", [(dict(shuffle=True), "shuffle"), (dict(sampler=[0]), "sampler"),
                                          (dict(batch_sampler=[[0]]), "batch_sampler")])
def test_iterable_dataset_rejects_sampling_options(kwargs, match):
    for make in (lambda: tud.DataLoader(TorchShardedRange(0, 4), **kwargs),
                 lambda: minidl.DataLoader(toy.ShardedRange(0, 4), **kwargs)):
        with pytest.raises(ValueError, match=match):
            make()


def test_unknown_worker_method():
    with pytest.raises(ValueError, match="worker_method"):
        minidl.DataLoader(ds, num_workers=1, worker_method="greenlet")
    with pytest.raises(ValueError, match="multiprocessing_context"):
        minidl.DataLoader(ds, num_workers=1, worker_method="thread", multiprocessing_context="spawn")


@pytest.mark.timeout(120)
def test_the_iterators_invariant_checks_raise_under_python_O_as_torchs_do():
    # torch 2.13 raises AssertionError itself where a bare `assert` would vanish under `python -O`.
    import os
    import subprocess
    import sys

    code = ("import sys, minidl, torch.utils.data as tud\n"
            "for mod in (minidl, tud):\n"
            "    it = iter(mod.DataLoader(list(range(8)), num_workers=1))  # 2 tasks sent: the most in flight\n"
            "    try:\n"
            "        it._try_put_index()\n"
            "        print('no error')\n"
            "    except AssertionError as e:\n"
            "        print(e)\n"
            "    it._shutdown_workers()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, env=env, timeout=100)
    assert out.stdout.splitlines() == ["Number of outstanding tasks exceeded maximum allowed tasks"] * 2, out.stderr


def test_only_dataloader_py_names_the_optional_layers():
    # Tracing and resume are layers chosen in DataLoader._get_iterator: no other loader file imports them,
    # so the loader's files and trace.py/state.py form no import circle.
    import ast
    from pathlib import Path

    package = Path(minidl.__file__).parent
    for path in sorted(package.glob("*.py")):
        if path.stem in ("dataloader", "trace", "state"):
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
        assert not imported & {"minidl.trace", "minidl.state"}, f"{path.name} imports a layer"
