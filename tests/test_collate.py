"""minidl.collate against torch.utils.data's collate: torch is the oracle."""

import collections
import copy
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data._utils.collate as torch_collate
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minidl.collate
import minidl.worker
from minidl.collate import (
    TorchTensor,
    collate,
    default_collate,
    default_collate_fn_map,
    default_convert,
    numpy_collate,
)
from minidl.worker import WorkerInfo
from minidl_bench.batches import assert_same_batch

Point = collections.namedtuple("Point", ["x", "y"])


class FrozenMap(Mapping):
    """An immutable mapping that can be rebuilt from a dict: its type survives collate."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def __eq__(self, other):
        return type(other) is type(self) and self._data == other._data


class KeysOnlyMap(FrozenMap):
    """A mapping whose constructor won't take a dict: collate falls back to a plain dict."""

    def __init__(self, **fields):
        self._data = fields


class TaggedDict(dict):
    """A mutable mapping with extra state that a copy keeps."""

    tag = "none"


class Tuple3(Sequence):
    """An immutable sequence rebuilt from a list."""

    def __init__(self, items):
        self._items = list(items)

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self):
        return len(self._items)


def tagged(**kwargs):
    d = TaggedDict(kwargs)
    d.tag = "kept"
    return d


def sample(kind: str, i: int):
    """The i-th sample of one kind; samples of a kind share their structure and shapes."""
    rng = np.random.default_rng(i)
    return {
        "int": i,
        "float": i + 0.25,
        "bool": i % 2 == 0,
        "str": f"s{i}",
        "bytes": b"b%d" % i,
        "np_float32": rng.standard_normal((2, 3)).astype(np.float32),
        "np_int8": rng.integers(-5, 5, size=4, dtype=np.int8),
        "np_uint8": rng.integers(0, 255, size=(2, 2), dtype=np.uint8),
        "np_bool": rng.random(3) > 0.5,
        "np_float16_0d": np.array(i / 3, dtype=np.float16),
        "np_complex": rng.standard_normal(2) + 1j,
        "np_scalar_f64": np.float64(i * 1.5),
        "np_scalar_i32": np.int32(i),
        "np_scalar_bool": np.bool_(i % 2),
        "np_str_scalar": np.str_(f"n{i}"),
        "tensor": torch.arange(6).reshape(2, 3) * i,
        "tensor_f16": torch.full((3,), i, dtype=torch.float16),
        "tensor_0d": torch.tensor(i * 2.0),
        "dict": {"a": i, "b": {"c": float(i), "d": f"d{i}"}},
        "tuple": (i, np.ones(2) * i, "t"),
        "list": [i, [float(i), i + 1]],
        "namedtuple": Point(i, torch.ones(2) * i),
        "nested": {"img": np.full((2, 2), i, dtype=np.float32), "meta": [Point(i, f"p{i}"), (i, i + 0.5)]},
        "ordered": collections.OrderedDict([("z", i), ("a", i * 2.0)]),
        "defaultdict": collections.defaultdict(list, {"k": i}),
        "tagged": tagged(v=i),
        "frozen": FrozenMap({"v": i, "w": np.int64(i)}),
        "keys_only": KeysOnlyMap(v=i),
        "userlist": collections.UserList([i, float(i)]),
        "tuple3": Tuple3([i, i + 1, i + 2]),
        "range": range(i, i + 3),
        "deque": collections.deque([i, i + 1]),
    }[kind]


KINDS = [
    "int", "float", "bool", "str", "bytes", "np_float32", "np_int8", "np_uint8", "np_bool",
    "np_float16_0d", "np_complex", "np_scalar_f64", "np_scalar_i32", "np_scalar_bool",
    "np_str_scalar", "tensor", "tensor_f16", "tensor_0d", "dict", "tuple", "list", "namedtuple",
    "nested", "ordered", "defaultdict", "tagged", "frozen", "keys_only", "userlist", "tuple3",
    "range", "deque",
]  # fmt: skip
TORCH_FREE_KINDS = [k for k in KINDS if not k.startswith("tensor") and k != "namedtuple"]


@pytest.mark.parametrize("kind", KINDS)
def test_default_collate_matches_torch(kind):
    batch = [sample(kind, i) for i in range(3)]
    assert_same_batch(default_collate(batch), torch_collate.default_collate(copy.deepcopy(batch)))


@pytest.mark.parametrize("kind", KINDS)
def test_default_convert_matches_torch(kind):
    data = sample(kind, 1)
    assert_same_batch(default_convert(data), torch_collate.default_convert(copy.deepcopy(data)))


@pytest.mark.parametrize(
    "data",
    [np.array(["a", "b"]), np.array([b"x"]), np.array([1, "a"], dtype=object), [np.array(["a"]), "s"]],
    ids=["unicode", "bytes", "object", "list"],
)
def test_default_convert_leaves_string_and_object_arrays(data):
    assert_same_batch(default_convert(data), torch_collate.default_convert(data))


def test_registry_has_torchs_leaf_types():
    ours = list(default_collate_fn_map)
    theirs = list(torch_collate.default_collate_fn_map)
    assert ours[0] is TorchTensor and theirs[0] is torch.Tensor and ours[1:] == theirs[1:]
    assert isinstance(torch.ones(1), TorchTensor)
    assert isinstance(torch.nn.Parameter(torch.ones(1)), TorchTensor)
    assert not isinstance(np.ones(1), TorchTensor)


class Box:
    def __init__(self, value):
        self.value = value


def collate_box_fn(batch, *, collate_fn_map=None):
    return Box(collate([b.value for b in batch], collate_fn_map=collate_fn_map))


def test_custom_type_in_a_copied_registry_matches_torch():
    batch = [{"box": Box(np.array([i, i])), "n": i} for i in range(3)]
    ours = collate(batch, collate_fn_map={**default_collate_fn_map, Box: collate_box_fn})
    theirs = torch_collate.collate(
        batch, collate_fn_map={**torch_collate.default_collate_fn_map, Box: collate_box_fn}
    )
    assert type(ours["box"]) is Box
    assert_same_batch(ours["box"].value, theirs["box"].value)
    assert_same_batch(ours["n"], theirs["n"])
    with pytest.raises(TypeError):
        default_collate(batch)  # the shared registry was not touched


def test_registry_found_by_isinstance_and_overridable_by_exact_type():
    class MyFloat(float):
        pass

    assert_same_batch(default_collate([MyFloat(1.5), MyFloat(2.0)]), torch.tensor([1.5, 2.0], dtype=torch.float64))

    def as_sum(batch, *, collate_fn_map=None):
        return sum(batch)

    def both(registry):
        return collate([torch.ones(2), torch.ones(2)], collate_fn_map={**registry, torch.Tensor: as_sum})

    assert_same_batch(both(default_collate_fn_map), both(torch_collate.default_collate_fn_map))


class TaggedTensor(torch.Tensor):
    """A tensor subclass, as a library that tags its tensors would define one."""


def tagged_tensor(*values) -> TaggedTensor:
    return torch.tensor(values).as_subclass(TaggedTensor)


def count_tensors(batch, *, collate_fn_map=None):
    """A tensor override that says it ran: how many tensors it got and of which types."""
    return ("override", len(batch), sorted({type(t).__name__ for t in batch}))


TENSOR_BATCHES = {
    "plain tensors": lambda: [torch.ones(2), torch.zeros(2)],
    "a tensor subclass": lambda: [tagged_tensor(1.0, 2.0), tagged_tensor(3.0, 4.0)],
    "parameters": lambda: [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.zeros(2))],
    "subclass inside a dict": lambda: [{"x": tagged_tensor(1.0), "n": 1}, {"x": tagged_tensor(2.0), "n": 2}],
}


@pytest.mark.parametrize("kind", TENSOR_BATCHES)
def test_the_documented_tensor_override_collates_tensor_subclasses_too_like_torch(kind, monkeypatch):
    # torch's docs: extend default_collate in place with default_collate_fn_map.update({torch.Tensor: fn}).
    monkeypatch.setattr(torch_collate, "default_collate_fn_map", dict(torch_collate.default_collate_fn_map))
    monkeypatch.setattr(minidl.collate, "default_collate_fn_map", dict(default_collate_fn_map))
    torch_collate.default_collate_fn_map.update({torch.Tensor: count_tensors})
    minidl.collate.default_collate_fn_map.update({torch.Tensor: count_tensors})
    theirs = torch_collate.default_collate(TENSOR_BATCHES[kind]())
    ours = minidl.collate.default_collate(TENSOR_BATCHES[kind]())
    assert_same_batch(ours, theirs)
    assert "override" in str(ours)


@pytest.mark.parametrize("kind", TENSOR_BATCHES)
def test_a_tensor_override_in_a_copied_registry_is_found_like_torchs(kind):
    ours = collate(TENSOR_BATCHES[kind](), collate_fn_map={**default_collate_fn_map, torch.Tensor: count_tensors})
    registry = {**torch_collate.default_collate_fn_map, torch.Tensor: count_tensors}
    assert_same_batch(ours, torch_collate.collate(TENSOR_BATCHES[kind](), collate_fn_map=registry))


def test_a_subclass_entry_wins_over_the_tensor_override_for_that_subclass_like_torch():
    def subclass_only(batch, *, collate_fn_map=None):
        return "subclass entry"

    extra = {torch.Tensor: count_tensors, TaggedTensor: subclass_only}
    for batch in ([tagged_tensor(1.0), tagged_tensor(2.0)], [torch.nn.Parameter(torch.ones(1))] * 2):
        ours = collate(batch, collate_fn_map={**default_collate_fn_map, **extra})
        assert ours == torch_collate.collate(batch, collate_fn_map={**torch_collate.default_collate_fn_map, **extra})


def test_collate_without_a_registry_recurses_then_rejects_leaves():
    for collate_fn in (collate, torch_collate.collate):
        with pytest.raises(TypeError, match="found <class 'int'>"):
            collate_fn([{"a": 1}, {"a": 2}])


def test_numpy_collate_matches_default_collate_with_arrays_for_tensors():
    def check(ours, theirs):
        if isinstance(theirs, torch.Tensor):
            assert isinstance(ours, np.ndarray) and ours.dtype == theirs.numpy().dtype
            np.testing.assert_array_equal(ours, theirs.numpy())
        elif isinstance(theirs, Mapping):
            assert type(ours) is type(theirs) and list(ours) == list(theirs)
            for key in theirs:
                check(ours[key], theirs[key])
        elif isinstance(theirs, (Sequence, tuple)) and not isinstance(theirs, (str, bytes)):
            assert type(ours) is type(theirs) and len(ours) == len(theirs)
            for x, y in zip(ours, theirs):
                check(x, y)
        else:
            assert ours == theirs

    for kind in TORCH_FREE_KINDS:
        batch = [sample(kind, i) for i in range(3)]
        check(numpy_collate(batch), torch_collate.default_collate(copy.deepcopy(batch)))


def test_numpy_collate_and_registry_need_no_torch():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        import numpy as np
        from minidl.collate import default_collate, default_collate_fn_map, default_convert, numpy_collate

        out = numpy_collate([{"x": np.ones(2), "y": (1, "a")}, {"x": np.zeros(2), "y": (2, "b")}])
        assert out["x"].tolist() == [[1.0, 1.0], [0.0, 0.0]] and out["y"][0].tolist() == [1, 2]
        assert out["y"][1] == ("a", "b")  # zip hands str_fn a tuple; torch keeps it too
        assert np.ndarray in default_collate_fn_map and float in default_collate_fn_map
        assert default_collate(["a", "b"]) == ["a", "b"]  # no tensor made, so no torch needed
        assert default_convert({"s": "x", "n": [1]}) == {"s": "x", "n": [1]}
        try:
            default_collate([1, 2])
        except ImportError:
            print("ok")
        """
    )
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize(
    "batch",
    [
        [torch.ones(3), torch.ones(4)],
        [np.ones(3), np.ones(4)],
        [torch.ones(2, 3), torch.ones(2, 3), torch.ones(3, 2)],
    ],
    ids=["tensor", "numpy", "third"],
)
def test_mismatched_shapes_name_both_shapes(batch):
    with pytest.raises(RuntimeError) as ours:
        default_collate(batch)
    with pytest.raises(RuntimeError) as theirs:
        torch_collate.default_collate(batch)
    assert str(ours.value) == str(theirs.value)
    first, bad = next((batch[0], b) for b in batch if b.shape != batch[0].shape)
    assert str(list(first.shape)) in str(ours.value) and str(list(bad.shape)) in str(ours.value)


def test_numpy_collate_stacks_string_arrays_that_default_collate_refuses():
    out = numpy_collate([np.array(["a", "b"]), np.array(["c", "d"])])
    np.testing.assert_array_equal(out, np.array([["a", "b"], ["c", "d"]]))


def test_numpy_collate_mismatched_shapes_name_both_shapes():
    with pytest.raises(RuntimeError, match=r"got \[2, 3\] at entry 0 and \[3, 2\] at entry 2"):
        numpy_collate([np.ones((2, 3)), np.ones((2, 3)), np.ones((3, 2))])


def test_shape_error_says_where_in_the_sample():
    batch = [{"img": [np.ones(3), 0]}, {"img": [np.ones(4), 1]}]
    for collate_fn in (default_collate, numpy_collate):
        with pytest.raises(RuntimeError, match=r"\[3\] at entry 0 and \[4\] at entry 1") as err:
            collate_fn(batch)
        assert err.value.__notes__ == ["while collating sample['img'][0]"]
    with pytest.raises(RuntimeError) as err:
        default_collate([Point(1, torch.ones(1)), Point(2, torch.ones(2))])
    assert err.value.__notes__ == ["while collating sample.y"]


def test_unequal_sequence_lengths():
    for collate_fn in (default_collate, numpy_collate, torch_collate.default_collate):
        with pytest.raises(RuntimeError, match="each element in list of batch should be of equal size"):
            collate_fn([[1, 2], [3]])


@pytest.mark.parametrize("batch", [[object(), object()], [None, None], [np.array(["a"]), np.array(["b"])]])
def test_unsupported_type_raises_torchs_type_error(batch):
    with pytest.raises(TypeError) as ours:
        default_collate(batch)
    with pytest.raises(TypeError) as theirs:
        torch_collate.default_collate(batch)
    assert str(ours.value) == str(theirs.value)


def test_nested_and_sparse_tensors_are_refused_like_torch():
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    for batch in ([nested, nested], [torch.eye(2).to_sparse()] * 2):
        with pytest.raises(RuntimeError) as ours:
            default_collate(batch)
        with pytest.raises(RuntimeError) as theirs:
            torch_collate.default_collate(batch)
        assert str(ours.value) == str(theirs.value)


def in_worker(worker_method):
    """Pretend to be inside a minidl worker for the duration of a call."""
    info = WorkerInfo(id=0, num_workers=1, seed=0, dataset=None, worker_method=worker_method)

    def call(fn, *args):
        saved = minidl.worker._worker_info
        minidl.worker._worker_info = info
        try:
            return fn(*args)
        finally:
            minidl.worker._worker_info = saved

    return call


def test_process_worker_stacks_into_shared_memory():
    batch = [torch.arange(3.0) + i for i in range(4)]
    out = in_worker("multiprocessing")(default_collate, batch)
    assert out.is_shared()
    assert_same_batch(out, torch.stack(batch))
    from_numpy = in_worker("multiprocessing")(default_collate, [np.ones(2, dtype=np.int16)] * 2)
    assert from_numpy.is_shared() and from_numpy.dtype == torch.int16
    with pytest.raises(RuntimeError, match=r"\[3\] at entry 0 and \[4\] at entry 1"):
        in_worker("multiprocessing")(default_collate, [torch.ones(3), torch.ones(4)])


def test_thread_worker_and_main_process_do_not_use_shared_memory():
    batch = [torch.ones(3), torch.zeros(3)]
    assert not in_worker("thread")(default_collate, batch).is_shared()
    assert not default_collate(batch).is_shared()


def pick(batch, i):
    """Sample ``i`` back out of a collated batch (the inverse of collate, up to containers)."""
    if isinstance(batch, Mapping):
        return {key: pick(value, i) for key, value in batch.items()}
    if isinstance(batch, list) and batch and isinstance(batch[0], (str, bytes)):
        return batch[i]
    if isinstance(batch, list):
        return [pick(field, i) for field in batch]
    return batch[i]


def assert_unstacks_to(picked, original):
    if isinstance(original, Mapping):
        for key in original:
            assert_unstacks_to(picked[key], original[key])
    elif isinstance(original, (tuple, list)):
        for x, y in zip(picked, original):
            assert_unstacks_to(x, y)
    elif isinstance(original, str):
        assert picked == original
    else:
        leaf = picked.numpy() if isinstance(picked, torch.Tensor) else picked
        np.testing.assert_array_equal(leaf, np.asarray(original))


arrays = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.int16, np.int64, np.bool_]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
)


@st.composite
def batches(draw):
    """A batch of 1-5 samples sharing one structure: an array of fixed shape, numbers, strings."""
    template = draw(arrays)
    n = draw(st.integers(1, 5))
    return [
        {
            "x": draw(hnp.arrays(template.dtype, template.shape)),
            "meta": (
                draw(st.integers(-(2**62), 2**62)),
                draw(st.floats(allow_nan=False, width=64)),
                draw(st.text(max_size=3)),
            ),
        }
        for _ in range(n)
    ]


@settings(max_examples=50, deadline=None)
@given(batches())
def test_collate_then_unstack_gives_back_the_samples(batch):
    for collate_fn in (default_collate, numpy_collate):
        out = collate_fn(batch)
        assert len(out["x"]) == len(batch)
        for i, original in enumerate(batch):
            assert_unstacks_to(pick(out, i), original)
