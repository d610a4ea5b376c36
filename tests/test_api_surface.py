"""minidl's public surface against torch 2.13's ``torch.utils.data``, name by name.

Four checks, each run on both libraries: signatures (``inspect.signature``), which classes subscript
(``Dataset[int]``), the exception for every bad argument torch rejects (same type, same message character
for character; hypothesis then tries any value for the validated arguments), and ``repr``s.
Each documented difference is listed here with the reason, so a new one fails a test.
"""

from __future__ import annotations

import importlib
import inspect
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.utils.data as tud  # noqa: E402
import torch.utils.data._utils.collate as torch_collate  # noqa: E402

import minidl  # noqa: E402
import minidl.collate  # noqa: E402

SHARED = sorted(set(minidl.__all__) & set(tud.__all__))
SHARED_CLASSES = [name for name in SHARED if inspect.isclass(getattr(tud, name))]

# Where a default differs on purpose: (name, parameter) -> (torch's, minidl's). minidl never imports
# torch at import time, so it cannot name torch.default_generator; None draws from that same generator.
DIFFERENT_DEFAULTS = {("random_split", "generator"): (torch.default_generator, None)}
# torch names minidl leaves out on purpose: (class, attribute) -> why.
LEFT_OUT = {("ConcatDataset", "cummulative_sizes"): "deprecated misspelling of cumulative_sizes"}


def parameters(obj) -> list[tuple[str, str, object]]:
    """(name, kind, default) of each parameter: what a caller can rely on. Annotations are not compared."""
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(obj).parameters.values()]


def assert_binds_like_torch(ours: list, theirs: list, where: str) -> None:
    """torch's parameters first, in torch's order; minidl may add keyword-only ones with a default
    after them (DataLoader's), so every call written for torch binds the same way."""
    assert ours[: len(theirs)] == theirs, where
    for param, kind, default in ours[len(theirs) :]:
        assert kind == "KEYWORD_ONLY" and default is not inspect.Parameter.empty, f"{where}: {param}"


# --- signatures ----------------------------------------------------------------------------------


def test_minidl_exports_every_name_torch_exports_for_the_loader():
    # The names of torch.utils.data.__all__ that minidl does not export are all DataPipe machinery
    # (torchdata's, deprecated) or private.
    missing = set(tud.__all__) - set(minidl.__all__)
    datapipes = {"DFIterDataPipe", "DataChunk", "IterDataPipe", "MapDataPipe", "argument_validation",
                 "functional_datapipe", "guaranteed_datapipes_determinism", "non_deterministic",
                 "runtime_validation", "runtime_validation_disabled"}
    assert missing == datapipes | {"_DatasetKind"}


def test_minidl_extras_are_torchs_own_one_level_down_or_documented_additions():
    assert set(minidl.__all__) - set(tud.__all__) == {"WorkerInfo", "default_collate_fn_map", "numpy_collate"}
    assert inspect.isclass(tud._utils.worker.WorkerInfo)
    # The registry is torch's, entry for entry, with TorchTensor keying what torch keys by torch.Tensor.
    ours = [(torch.Tensor if key is minidl.collate.TorchTensor else key, fn.__name__)
            for key, fn in minidl.default_collate_fn_map.items()]
    assert ours == [(key, fn.__name__) for key, fn in torch_collate.default_collate_fn_map.items()]
    assert "torch-free" in minidl.numpy_collate.__doc__


@pytest.mark.parametrize("module", ["dataset", "sampler", "distributed", "dataloader"])
def test_each_module_exports_what_torchs_twin_exports(module):
    ours = importlib.import_module(f"minidl.{module}")
    theirs = importlib.import_module(f"torch.utils.data.{module}")
    assert ours.__all__ == theirs.__all__


@pytest.mark.parametrize("name", SHARED)
def test_signature_matches_torch(name):
    ours, theirs = parameters(getattr(minidl, name)), parameters(getattr(tud, name))
    for i, (param, kind, default) in enumerate(theirs):
        if (name, param) in DIFFERENT_DEFAULTS:
            torch_default, minidl_default = DIFFERENT_DEFAULTS[name, param]
            assert default is torch_default
            theirs[i] = (param, kind, minidl_default)
    assert_binds_like_torch(ours, theirs, name)


@pytest.mark.parametrize("name", SHARED_CLASSES)
def test_methods_match_torch(name):
    ours, theirs = getattr(minidl, name), getattr(tud, name)
    for attr, value in vars(theirs).items():
        if attr.startswith("_") and attr not in ("__init__", "__iter__", "__len__", "__getitem__",
                                                  "__getitems__", "__add__", "__repr__"):
            continue
        if (name, attr) in LEFT_OUT:
            assert not hasattr(ours, attr) and attr in ours.__doc__, f"{name}.{attr}: left out, and said so"
            continue
        assert hasattr(ours, attr), f"{name}.{attr}"
        if isinstance(value, property):
            assert isinstance(inspect.getattr_static(ours, attr), property), f"{name}.{attr}"
        elif callable(value) or isinstance(value, staticmethod):
            where = f"{name}.{attr}"
            assert isinstance(inspect.getattr_static(ours, attr), type(value)), where
            assert_binds_like_torch(parameters(getattr(ours, attr)), parameters(getattr(theirs, attr)), where)


COLLATE_FUNCTIONS = ["collate", "collate_tensor_fn", "collate_numpy_array_fn", "collate_numpy_scalar_fn",
                     "collate_float_fn", "collate_int_fn", "collate_str_fn", "default_collate", "default_convert"]


@pytest.mark.parametrize("name", COLLATE_FUNCTIONS)
def test_collate_functions_match_torch(name):
    assert parameters(getattr(minidl.collate, name)) == parameters(getattr(torch_collate, name))


def test_random_split_default_generator_is_torchs_default_generator():
    # The one default that differs (DIFFERENT_DEFAULTS): None must draw exactly what torch's
    # default_generator draws, and the docstring must say so.
    torch.manual_seed(7)
    ours = [list(s) for s in minidl.random_split(range(10), [3, 7])]
    torch.manual_seed(7)
    theirs = [list(s) for s in tud.random_split(range(10), [3, 7])]
    assert ours == theirs
    assert "default_generator" in minidl.random_split.__doc__


# --- subscripting --------------------------------------------------------------------------------


def subscripts(cls) -> bool:
    try:
        cls[int]
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("name", SHARED_CLASSES)
def test_subscriptable_exactly_where_torch_is(name):
    ours, theirs = getattr(minidl, name), getattr(tud, name)
    assert subscripts(ours) == subscripts(theirs)
    if subscripts(theirs):
        assert strip_modules(repr(ours[int])) == strip_modules(repr(theirs[int]))


def test_generic_classes_take_their_type_parameter():
    assert minidl.Dataset[int].__args__ == (int,)
    assert minidl.StackDataset[tuple].__args__ == (tuple,)
    assert minidl.DistributedSampler[int].__origin__ is minidl.DistributedSampler

    class Squares(minidl.Dataset[int]):  # the way torch's docs subclass it
        def __getitem__(self, i: int) -> int:
            return i * i

    assert Squares()[3] == 9


# --- bad arguments -------------------------------------------------------------------------------


class _TooShort:
    """A dataset whose __getitems__ returns one sample too few."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return i

    def __getitems__(self, indices):
        return indices[:-1]


def _stream(m):
    """An IterableDataset of the library ``m``, yielding 0, 1, 2."""
    return type("Stream", (m.IterableDataset,), {"__iter__": lambda self: iter(range(3))})()


def _subset_overriding_getitem(m):
    return type("MySubset", (m.Subset,), {"__getitem__": lambda self, i: i})(range(3), [0])


def call_id(call) -> str:
    """The call's own source, ``m.RandomSampler(range(3), num_samples=0)``, as the test id."""
    source = inspect.getsource(call)
    body = source[source.index("lambda m") :].split(":", 1)[1].strip()
    depth = 0
    for end, char in enumerate(body):  # the body ends at the first unbalanced ")" or top-level ","
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        if depth < 0 or (depth == 0 and char == ","):
            return body[:end]
    return body


def same(call):
    """Same exception type, same message, character for character."""
    return pytest.param(call, id=call_id(call))


BAD = [
    # --- samplers ---
    same(lambda m: list(m.Sampler())),
    same(lambda m: len(m.Sampler())),
    same(lambda m: list(m.SequentialSampler(5))),
    same(lambda m: m.RandomSampler(range(3), replacement=1)),
    same(lambda m: m.RandomSampler(range(3), replacement="yes")),
    same(lambda m: m.RandomSampler(range(3), replacement=None)),
    same(lambda m: m.RandomSampler(range(3), num_samples=0)),
    same(lambda m: m.RandomSampler(range(3), num_samples=-2)),
    same(lambda m: m.RandomSampler(range(3), num_samples=1.5)),
    same(lambda m: m.RandomSampler(range(3), num_samples="4")),
    same(lambda m: m.RandomSampler(range(0))),
    same(lambda m: list(m.RandomSampler(range(3), generator="x"))),
    same(lambda m: list(m.SubsetRandomSampler([1, 2], generator="x"))),
    same(lambda m: m.BatchSampler(range(3), batch_size=0, drop_last=False)),
    same(lambda m: m.BatchSampler(range(3), batch_size=-1, drop_last=False)),
    same(lambda m: m.BatchSampler(range(3), batch_size=True, drop_last=False)),
    same(lambda m: m.BatchSampler(range(3), batch_size=2.0, drop_last=False)),
    same(lambda m: m.BatchSampler(range(3), batch_size="2", drop_last=False)),
    same(lambda m: m.BatchSampler(range(3), batch_size=None, drop_last=False)),
    same(lambda m: m.BatchSampler(range(3), batch_size=2, drop_last=0)),
    same(lambda m: m.BatchSampler(range(3), batch_size=2, drop_last=None)),
    same(lambda m: list(m.BatchSampler(5, batch_size=2, drop_last=False))),
    same(lambda m: m.WeightedRandomSampler([1.0, 2.0], 0)),
    same(lambda m: m.WeightedRandomSampler([1.0, 2.0], -1)),
    same(lambda m: m.WeightedRandomSampler([1.0, 2.0], True)),
    same(lambda m: m.WeightedRandomSampler([1.0, 2.0], 2.0)),
    same(lambda m: m.WeightedRandomSampler([1.0, 2.0], 1, replacement=1)),
    same(lambda m: m.WeightedRandomSampler([1.0, 2.0], 1, replacement="no")),
    same(lambda m: m.WeightedRandomSampler([[1.0, 2.0], [3.0, 4.0]], 1)),
    same(lambda m: m.WeightedRandomSampler(3.0, 1)),
    same(lambda m: m.WeightedRandomSampler([[1.0], [1.0, 2.0]], 1)),
    same(lambda m: m.WeightedRandomSampler(["a", "b"], 1)),
    same(lambda m: list(m.WeightedRandomSampler([1.0, -1.0, 2.0], 2))),
    same(lambda m: list(m.WeightedRandomSampler([1.0, float("nan")], 2))),
    same(lambda m: list(m.WeightedRandomSampler([float("inf"), 1.0], 2))),
    same(lambda m: list(m.WeightedRandomSampler([0.0, 0.0], 2))),
    same(lambda m: list(m.WeightedRandomSampler([], 2))),
    same(lambda m: list(m.WeightedRandomSampler([1.0, 2.0], 3, replacement=False))),
    same(lambda m: list(m.WeightedRandomSampler([1.0, 2.0], 1, generator="x"))),
    # --- DistributedSampler ---
    same(lambda m: m.DistributedSampler(range(4), num_replicas=2, rank=2)),
    same(lambda m: m.DistributedSampler(range(4), num_replicas=2, rank=-1)),
    same(lambda m: m.DistributedSampler(range(4), num_replicas=1, rank=5)),
    same(lambda m: m.DistributedSampler(range(4), num_replicas=0, rank=0)),
    same(lambda m: m.DistributedSampler(range(4), num_replicas=-1, rank=0)),
    same(lambda m: m.DistributedSampler(range(4))),
    same(lambda m: m.DistributedSampler(range(4), num_replicas=2)),
    same(lambda m: m.DistributedSampler(range(4), rank=0)),
    # --- datasets ---
    same(lambda m: m.Dataset()[0]),
    same(lambda m: len(m.Dataset())),
    same(lambda m: next(iter(m.IterableDataset()))),
    same(lambda m: len(m.TensorDataset())),
    same(lambda m: m.TensorDataset(torch.zeros(3), torch.zeros(4))),
    same(lambda m: m.StackDataset()),
    same(lambda m: m.StackDataset(range(2), x=range(2))),
    same(lambda m: m.StackDataset(range(2), range(3))),
    same(lambda m: m.StackDataset(x=range(2), y=range(3))),
    same(lambda m: m.StackDataset(_TooShort(), range(3)).__getitems__([0, 1])),
    same(lambda m: m.StackDataset(x=_TooShort(), y=range(3)).__getitems__([0, 1])),
    same(lambda m: m.ConcatDataset([])),
    same(lambda m: m.ConcatDataset([range(2), _stream(m)])),
    same(lambda m: m.ConcatDataset([range(2)])[-3]),
    same(lambda m: m.ConcatDataset([range(2)])[2]),
    same(lambda m: m.ConcatDataset([range(2), 5])),
    same(lambda m: list(m.ChainDataset([_stream(m), range(3)]))),
    same(lambda m: len(m.ChainDataset([range(3)]))),
    same(lambda m: _subset_overriding_getitem(m)),
    same(lambda m: m.Subset(range(3), [5])[0]),
    same(lambda m: m.random_split(range(10), [3, 3])),
    same(lambda m: m.random_split(range(10), [1.5, -0.5])),
    same(lambda m: m.random_split(range(10), [0.6, 0.6])),
    same(lambda m: m.random_split(range(10), [5, 5], generator="x")),
    # --- collate ---
    same(lambda m: m.default_collate([])),
    same(lambda m: m.default_collate([object(), object()])),
    same(lambda m: m.default_collate([None, None])),
    same(lambda m: m.default_collate([[1, 2], [1]])),
    same(lambda m: m.default_collate([(1, 2), (1,)])),
    same(lambda m: m.default_collate([np.array(["a"]), np.array(["b"])])),
    same(lambda m: m.default_collate([np.array([None]), np.array([None])])),
    same(lambda m: m.default_collate([{"a": 1}, {"b": 2}])),
    same(lambda m: m.default_collate([torch.zeros(2), torch.zeros(3)])),
    same(lambda m: m.default_collate([torch.eye(2).to_sparse()] * 2)),
    same(lambda m: m.default_convert(np.bytes_(b"a"))),
    # --- DataLoader: the arguments torch validates when the loader is built ---
    same(lambda m: m.DataLoader(range(4), batch_size=0)),
    same(lambda m: m.DataLoader(range(4), batch_size=True)),
    same(lambda m: m.DataLoader(range(4), batch_size=1.5)),
    same(lambda m: m.DataLoader(range(4), num_workers=-1)),
    same(lambda m: m.DataLoader(range(4), num_workers="2")),
    same(lambda m: m.DataLoader(range(4), timeout=-1)),
    same(lambda m: m.DataLoader(range(4), num_workers=1, prefetch_factor=-1)),
    same(lambda m: m.DataLoader(range(4), persistent_workers=True)),
    same(lambda m: m.DataLoader(range(4), shuffle=True, sampler=[0, 1])),
    same(lambda m: m.DataLoader(range(4), batch_size=2, batch_sampler=[[0]])),
    same(lambda m: m.DataLoader(range(4), drop_last=True, batch_sampler=[[0]])),
    same(lambda m: m.DataLoader(range(4), batch_size=None, drop_last=True)),
    same(lambda m: m.DataLoader(range(4), batch_size=2, drop_last=1)),
    same(lambda m: m.DataLoader(_stream(m), shuffle=True)),
    same(lambda m: m.DataLoader(_stream(m), sampler=[0])),
    same(lambda m: m.DataLoader(_stream(m), batch_sampler=[[0]])),
    same(lambda m: m.DataLoader(range(4), num_workers=1, multiprocessing_context="nope")),
    same(lambda m: m.DataLoader(range(4), num_workers=1, multiprocessing_context=3)),
    same(lambda m: m.DataLoader(range(4), multiprocessing_context="spawn")),
    same(lambda m: setattr(m.DataLoader(range(4)), "batch_size", 3)),
    same(lambda m: setattr(m.DataLoader(range(4)), "sampler", [1])),
    same(lambda m: len(m.DataLoader(i for i in range(3)))),
    same(lambda m: next(iter(m.DataLoader(range(4), collate_fn=3)))),
    same(lambda m: next(iter(m.DataLoader(range(4), sampler=5)))),
]


@pytest.mark.parametrize("call", BAD)
def test_bad_argument_raises_like_torch(call):
    with pytest.raises(Exception) as theirs:
        call(tud)
    with pytest.raises(Exception) as ours:
        call(minidl)
    assert type(ours.value) is type(theirs.value)
    assert strip_modules(str(ours.value)) == strip_modules(str(theirs.value))


def outcome(call, m):
    """What ``call(m)`` does: ("ok", len) or (exception type, message)."""
    try:
        return "ok", len(call(m))
    except Exception as e:  # noqa: BLE001 - any exception is an outcome to compare
        return type(e), strip_modules(str(e))


ANY_VALUE = st.one_of(st.integers(-3, 40), st.floats(-2, 40), st.booleans(), st.none(), st.text(max_size=2))
ARGUMENTS = {
    "BatchSampler(batch_size)": lambda v: lambda m: m.BatchSampler(range(7), v, False),
    "BatchSampler(drop_last)": lambda v: lambda m: m.BatchSampler(range(7), 2, v),
    "RandomSampler(replacement)": lambda v: lambda m: m.RandomSampler(range(7), replacement=v),
    "RandomSampler(num_samples)": lambda v: lambda m: m.RandomSampler(range(7), True, num_samples=v),
    "WeightedRandomSampler(num_samples)": lambda v: lambda m: m.WeightedRandomSampler([1.0] * 7, v),
    "WeightedRandomSampler(replacement)": lambda v: lambda m: m.WeightedRandomSampler([1.0] * 7, 3, v),
    "DistributedSampler(num_replicas)": lambda v: lambda m: m.DistributedSampler(range(7), v, 0),
    "DistributedSampler(rank)": lambda v: lambda m: m.DistributedSampler(range(7), 3, v),
    "DataLoader(batch_size)": lambda v: lambda m: m.DataLoader(range(7), batch_size=v),
}


@pytest.mark.parametrize("argument", ARGUMENTS)
@settings(max_examples=60, deadline=None)
@given(value=ANY_VALUE)
def test_any_value_is_accepted_or_refused_like_torch(argument, value):
    call = ARGUMENTS[argument](value)
    assert outcome(call, minidl) == outcome(call, tud)


def test_no_process_group_was_left_initialised():
    # The DistributedSampler rows above rely on there being none; make sure no test set one up.
    assert not dist.is_initialized()


# --- reprs ---------------------------------------------------------------------------------------


def strip_modules(text: str) -> str:
    """Drop module paths and addresses: ``<torch.utils.data.sampler.X object at 0x..>`` -> ``<X object>``."""
    text = re.sub(r"\b(?:torch\.utils\.data|minidl)(?:\.\w+)*\.(?=[A-Z_]\w*)", "", text)
    return re.sub(r" at 0x[0-9a-f]+", "", text)


INSTANCES = [
    lambda m: m.Dataset(),
    lambda m: _stream(m),
    lambda m: m.TensorDataset(torch.zeros(2)),
    lambda m: m.StackDataset(range(2)),
    lambda m: m.ConcatDataset([range(2)]),
    lambda m: m.ChainDataset([]),
    lambda m: m.Subset(range(3), [0]),
    lambda m: m.Sampler(),
    lambda m: m.SequentialSampler(range(3)),
    lambda m: m.RandomSampler(range(3)),
    lambda m: m.SubsetRandomSampler([0]),
    lambda m: m.WeightedRandomSampler([1.0], 1),
    lambda m: m.BatchSampler(range(3), 2, False),
    lambda m: m.DistributedSampler(range(3), num_replicas=1, rank=0),
    lambda m: m.DataLoader(range(3)),
]


@pytest.mark.parametrize("make", INSTANCES)
def test_repr_matches_torch(make):
    ours, theirs = strip_modules(repr(make(minidl))), strip_modules(repr(make(tud)))
    assert ours == theirs
    assert "object" in ours  # none of them defines a __repr__: each reads <Class object>
