"""minidl_bench.batches: the one batch-equality check the tests and the benchmark suites share."""

from __future__ import annotations

import collections
import subprocess
import sys

import numpy as np
import pytest

from minidl_bench.batches import (
    assert_same_batch,
    assert_same_batches,
    batch_difference,
    check_first_batches,
    first_batches,
    same_batch,
    same_batches,
)

Point = collections.namedtuple("Point", ["x", "y"])


class Tagged(dict):
    pass


def tagged(tag, **items):
    d = Tagged(items)
    d.tag = tag
    return d


def nested(value=1.0, dtype=np.float32):
    return {"x": [np.full((2, 3), value, dtype=dtype), (np.arange(2), "s")], "n": 3, "p": Point(1, [2])}


def test_equal_structures_are_the_same():
    assert batch_difference(nested(), nested()) is None
    assert same_batch(nested(), nested())
    assert_same_batch(nested(), nested())
    assert_same_batches([nested(), nested(2.0)], [nested(), nested(2.0)])


@pytest.mark.parametrize("a,b,where", [
    (nested(), nested(2.0), "batch['x'][0]: values differ"),
    (nested(), nested(dtype=np.float64), "batch['x'][0]: float32 (2, 3) != float64 (2, 3)"),
    (np.zeros((2, 3)), np.zeros((3, 2)), "batch: float64 (2, 3) != float64 (3, 2)"),
    ((1, 2), [1, 2], "batch: tuple != list"),
    (Point(1, 2), (1, 2), "batch: Point != tuple"),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}, "batch: keys ['a', 'b'] != ['b', 'a']"),
    ([1, 2], [1, 2, 3], "batch: length 2 != 3"),
    (tagged("kept", a=1), tagged("lost", a=1), "batch.__dict__['tag']: 'kept' != 'lost'"),
    (collections.defaultdict(list, a=1), collections.defaultdict(int, a=1), "batch.__dict__['default_factory']"),
    (collections.UserList([1]), collections.UserList([2]), "batch[0]: 1 != 2"),
    (np.array([np.nan]), np.array([np.nan]), "batch: values differ"),
    ("s", b"s", "batch: str != bytes"),
])
def test_a_difference_is_named_where_it_is(a, b, where):
    difference = batch_difference(a, b)
    assert difference is not None and difference.startswith(where), difference
    assert not same_batch(a, b)
    with pytest.raises(AssertionError, match="^batch"):
        assert_same_batch(a, b)


def test_torch_tensors_compare_by_dtype_shape_and_value():
    torch = pytest.importorskip("torch")
    assert same_batch([torch.arange(3), {"y": torch.ones(2)}], [torch.arange(3), {"y": torch.ones(2)}])
    assert batch_difference(torch.arange(3), torch.arange(3).float()).startswith("batch: torch.int64 (3,) != ")
    assert batch_difference([torch.arange(3)], [torch.tensor([0, 1, 3])]).startswith("batch[0]: values differ")
    assert batch_difference(torch.zeros(2), np.zeros(2, dtype=np.float32)) == "batch: Tensor != ndarray"


def test_sequences_of_batches_differ_in_count_or_in_one_batch():
    with pytest.raises(AssertionError, match=r"^loader: 1 batches != 2$"):
        assert_same_batches([1], [1, 2], "loader")
    with pytest.raises(AssertionError, match=r"^batches: batch 1\[0\]: 3 != 4$"):
        assert_same_batches([[1], [3]], [[1], [4]])


def test_first_batches_stops_early_and_closes_a_generator():
    closed = []

    def loader():
        try:
            yield from range(10)
        finally:
            closed.append(True)

    assert first_batches(loader(), 3) == [0, 1, 2] and closed == [True]
    assert first_batches([5], 3) == [5]  # a shorter epoch gives what it has


def test_check_first_batches_names_the_loader_that_differs():
    check_first_batches("same", lambda: [[0], [1]], {"a": lambda: [[0], [1]], "b": lambda: ([0], [1], [9])})
    with pytest.raises(AssertionError, match=r"^trivial: wrong: batch 1\[0\]: 2 != 1 \(against torch's\)$"):
        check_first_batches("trivial", lambda: [[0], [1]], {"right": lambda: [[0], [1]], "wrong": lambda: [[0], [2]]},
                            reference_name="torch")


def test_importing_the_helper_does_not_import_torch():
    code = "import sys, minidl_bench.batches; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "False"


def test_exact_containers_false_lets_a_list_stand_for_a_tuple_and_nothing_else():
    images, labels = np.zeros((2, 3), np.float32), np.arange(2)
    assert not same_batch((images, labels), [images, labels])
    assert same_batch((images, labels), [images, labels], exact_containers=False)
    assert not same_batch((images, labels), [images, labels + 1], exact_containers=False)
    assert not same_batch((images,), {"images": images}, exact_containers=False)
    assert not same_batch([(1, 2)], [(1, 2, 3)], exact_containers=False)


def test_same_batches_compares_count_and_each_batch_in_order():
    assert same_batches([[1], (2,)], [[1], (2,)])
    assert not same_batches([[1]], [[1], [2]])
    assert not same_batches([[1], [2]], [[2], [1]])
    assert not same_batches([(1,)], [[1]]) and same_batches([(1,)], [[1]], exact_containers=False)
