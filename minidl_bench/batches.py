"""Are two loaders' batches the same? One check for the benchmarks (before anything is timed) and the tests.

A benchmark that times a wrong answer measures nothing, so every suite first compares each loader's first
batches with a reference loader's (``check_first_batches``). The comparison itself (``batch_difference``)
walks two collated batches together and names the first place they differ: a container of another type,
other keys or length, a tensor or array of another dtype, shape or value, a different plain value.
torch is never imported here: a torch tensor can only exist once something else imported torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

CHECK_BATCHES = 2  # batches compared before a loader is timed, unless a suite asks for more


def batch_difference(a: Any, b: Any, path: str = "batch", *, exact_containers: bool = True) -> str | None:
    """Where ``a`` and ``b`` first differ, as ``"batch[1]['x']: why"``, or None when they are the same.

    Same means: the same container types all the way down (a tuple is not a list, a namedtuple keeps
    its class), the same keys in the same order, the same extra attributes on a container (a dict
    subclass's ``tag``, a defaultdict's ``default_factory``), and on the leaves: tensors and arrays of
    the same dtype, shape and values (NaN is never equal), anything else ``==``. ``exact_containers=False``
    lets a list stand for a tuple and back (a loader that hands out ``(images, labels)`` as it is, beside
    one that collates it into a list).
    """
    loose = not exact_containers and isinstance(a, list | tuple) and isinstance(b, list | tuple)
    if type(a) is not type(b) and not loose:
        return f"{path}: {type(a).__name__} != {type(b).__name__}"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype} {tuple(a.shape)} != {b.dtype} {tuple(b.shape)}"
        return None if torch.equal(a, b) else f"{path}: values differ: {a} != {b}"
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype} {a.shape} != {b.dtype} {b.shape}"
        return None if np.array_equal(a, b) else f"{path}: values differ: {a} != {b}"
    if isinstance(a, Mapping):
        if list(a) != list(b):
            return f"{path}: keys {list(a)} != {list(b)}"
        pairs = [(f"{path}[{k!r}]", a[k], b[k]) for k in a]
    elif isinstance(a, Sequence) and not isinstance(a, str | bytes | bytearray):  # list, tuple, UserList, range
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        pairs = [(f"{path}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b))]
    else:
        return None if a == b else f"{path}: {a!r} != {b!r}"
    extras = _extras(a), _extras(b)
    if any(extras) and not loose:
        pairs.append((f"{path}.__dict__", *extras))
    return next((d for p, x, y in pairs
                 if (d := batch_difference(x, y, p, exact_containers=exact_containers)) is not None), None)


def _extras(container: Any) -> dict[str, Any]:
    """What a container carries beside its items: its instance attributes, and a defaultdict's factory."""
    extras = dict(getattr(container, "__dict__", {}))
    if hasattr(container, "default_factory"):
        extras["default_factory"] = container.default_factory
    return extras


def same_batch(a: Any, b: Any, *, exact_containers: bool = True) -> bool:
    """Whether ``a`` and ``b`` are the same batch (see ``batch_difference``)."""
    return batch_difference(a, b, exact_containers=exact_containers) is None


def assert_same_batch(a: Any, b: Any, path: str = "batch", *, exact_containers: bool = True) -> None:
    """Raise AssertionError naming where ``a`` and ``b`` first differ (see ``batch_difference``)."""
    difference = batch_difference(a, b, path, exact_containers=exact_containers)
    if difference is not None:
        raise AssertionError(difference)


def same_batches(got: Iterable, expected: Iterable, *, exact_containers: bool = True) -> bool:
    """Whether two sequences of batches have the same length and the same batches, in order."""
    got, expected = list(got), list(expected)
    return len(got) == len(expected) and all(same_batch(a, b, exact_containers=exact_containers)
                                             for a, b in zip(got, expected))


def assert_same_batches(got: Iterable, expected: Iterable, what: str = "batches", *,
                        exact_containers: bool = True) -> None:
    """Raise AssertionError naming the first difference between two sequences of batches (their count too)."""
    got, expected = list(got), list(expected)
    if len(got) != len(expected):
        raise AssertionError(f"{what}: {len(got)} batches != {len(expected)}")
    for i, (a, b) in enumerate(zip(got, expected)):
        difference = batch_difference(a, b, f"batch {i}", exact_containers=exact_containers)
        if difference is not None:
            raise AssertionError(f"{what}: {difference}")


def first_batches(loader: Iterable, n: int = CHECK_BATCHES) -> list:
    """The first ``n`` batches (fewer if the epoch is shorter); leaving the loop early shuts the workers down.

    A generator's ``close()`` runs now, not at garbage collection, so a ``with Pool`` inside it ends here.
    """
    it = iter(loader)
    batches = [batch for _, batch in zip(range(n), it)]
    if hasattr(it, "close"):
        it.close()
    del it
    return batches


def check_first_batches(what: str, reference: Callable[[], Iterable], loaders: Mapping[Any, Callable[[], Iterable]],
                        n: int = CHECK_BATCHES, reference_name: str = "the reference loader", *,
                        exact_containers: bool = True) -> None:
    """Raise AssertionError unless every loader's first ``n`` batches equal ``reference``'s.

    ``reference`` and each of ``loaders``' values make a fresh loader; the error names the setting and where
    its batches first differ. The benchmark suites call this before they time anything.
    """
    expected = first_batches(reference(), n)
    for key, make in loaders.items():
        try:
            assert_same_batches(first_batches(make(), n), expected, f"{what}: {key}", exact_containers=exact_containers)
        except AssertionError as error:
            raise AssertionError(f"{error} (against {reference_name}'s)") from None
