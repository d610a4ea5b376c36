"""Collate: turn a list of samples into one batch, recursing into dicts, tuples and lists.

Mirrors ``torch/utils/data/_utils/collate.py``. ``collate`` walks the sample's structure and hands
each leaf type to a function looked up in an open registry (``default_collate_fn_map``). Importing
this module never imports torch. ``numpy_collate`` batches into NumPy arrays and never needs torch.
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any

import numpy as np

from minidl.worker import get_worker_info

CollateFnMap = dict[type | tuple[type, ...], Callable[..., Any]]

# NumPy dtypes torch cannot hold: bytes ("S", "a"), unicode ("U") and object ("O") arrays.
np_str_obj_array_pattern = re.compile(r"[SaUO]")

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)


def _torch():
    import torch  # imported where tensors are made: `import minidl.collate` must work without torch

    return torch


class _TorchTensorMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        # A tensor can only exist once torch has been imported, so if torch is not in sys.modules
        # nothing is a tensor, and we never import torch just to find that out.
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(obj, torch.Tensor)


class TorchTensor(metaclass=_TorchTensorMeta):
    """Registry key that matches ``torch.Tensor`` instances without importing torch."""


def collate(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Collate ``batch`` by the type of its first sample, with a registered leaf function or by recursing.

    Leaf functions are looked up by exact type first, then by ``isinstance`` in insertion order, as torch does.
    An entry for ``torch.Tensor`` itself (torch's documented override, ``default_collate_fn_map.update({torch.Tensor:
    fn})``) takes the place of ``TorchTensor``'s, so ``fn`` collates tensor subclasses too, as in torch.
    minidl adds one thing: an error inside a sample gains a note saying where, ``while collating sample['x'][0]``.
    """
    elem = batch[0]
    elem_type = type(elem)

    if collate_fn_map is not None:
        if elem_type in collate_fn_map:
            return collate_fn_map[elem_type](batch, collate_fn_map=collate_fn_map)
        for collate_type in collate_fn_map:
            if isinstance(elem, collate_type):
                return _registered_fn(collate_fn_map, collate_type)(batch, collate_fn_map=collate_fn_map)

    if isinstance(elem, Mapping):
        values = {key: _collate_field([d[key] for d in batch], f"[{key!r}]", collate_fn_map) for key in elem}
        return _rebuild_mapping(elem, values)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        fields = zip(elem._fields, zip(*batch))
        return elem_type(*(_collate_field(samples, f".{name}", collate_fn_map) for name, samples in fields))
    if isinstance(elem, Sequence):
        elem_size = len(elem)
        if not all(len(sample) == elem_size for sample in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = list(zip(*batch))  # position i across every sample
        items = [_collate_field(samples, f"[{i}]", collate_fn_map) for i, samples in enumerate(transposed)]
        if isinstance(elem, tuple):
            return items  # a plain tuple becomes a list, as torch has always done
        return _rebuild_sequence(elem, items)

    raise TypeError(default_collate_err_msg_format.format(elem_type))


def _registered_fn(collate_fn_map: CollateFnMap, collate_type: type | tuple[type, ...]) -> Callable[..., Any]:
    """The function registered for ``collate_type``. ``TorchTensor`` stands where torch keys ``torch.Tensor``."""
    if collate_type is TorchTensor:
        tensor = sys.modules["torch"].Tensor  # loaded: the sample is a tensor
        return collate_fn_map.get(tensor, collate_fn_map[TorchTensor])
    return collate_fn_map[collate_type]


def _collate_field(samples: Sequence[Any], where: str, collate_fn_map: CollateFnMap | None) -> Any:
    """Collate one field across the batch. If that fails, note where in the sample the field was."""
    try:
        return collate(samples, collate_fn_map=collate_fn_map)
    except (RuntimeError, TypeError) as err:
        if not isinstance(err, RecursionError):
            # Grow a single note outward as the error unwinds, up to "while collating sample['x'][0]".
            prefix = "while collating sample"
            notes = getattr(err, "__notes__", [])
            if notes and notes[-1].startswith(prefix):
                notes[-1] = prefix + where + notes[-1][len(prefix) :]
            else:
                err.add_note(prefix + where)
        raise


def _rebuild_mapping(elem: Mapping, values: dict) -> Mapping:
    """A mapping of ``elem``'s type holding ``values``, or a plain dict if that type can't be built."""
    # torch collates the values inside this try, and we do it before.
    # So a TypeError from a field propagates at once, instead of being retried with a plain dict first.
    # The result is the same, and it is computed once.
    try:
        if isinstance(elem, MutableMapping):
            # The type may carry extra state, such as a defaultdict's factory. So copy it, then overwrite.
            clone = copy.copy(elem)
            clone.update(values)
            return clone
        return type(elem)(values)
    except TypeError:  # the type has no copy() and update(), or no __init__(mapping)
        return values


def _rebuild_sequence(elem: Sequence, items: list) -> Sequence:
    """A sequence of ``elem``'s type holding ``items``, or a plain list if that type can't be built."""
    try:
        if isinstance(elem, MutableSequence):
            clone = copy.copy(elem)  # keep extra state, as for mappings
            for i, item in enumerate(items):
                clone[i] = item
            return clone
        return type(elem)(items)
    except TypeError:  # the type has no copy() and __setitem__, or no __init__(iterable), as range has not
        return items


def collate_tensor_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Stack tensors along a new first dimension; in a process worker, straight into shared memory."""
    torch = _torch()
    elem = batch[0]
    sparse = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
    if elem.is_nested or elem.layout in sparse:
        kind = "nested" if elem.is_nested else "sparse"
        raise RuntimeError(
            f"Batches of {kind} tensors are not currently supported by the default collate_fn; "
            "please provide a custom collate_fn to handle them appropriately."
        )
    out = None
    info = get_worker_info()
    if info is not None and info.worker_method == "multiprocessing":
        # The batch will be pickled to the main process: if it already lives in shared memory,
        # only a handle crosses the queue instead of a copy of every byte.
        numel = sum(x.numel() for x in batch)
        storage = elem._typed_storage()._new_shared(numel, device=elem.device)
        out = elem.new(storage).resize_(len(batch), *elem.shape)
    return torch.stack(batch, 0, out=out)  # torch's error names the mismatched shapes


def collate_numpy_array_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Turn NumPy arrays into tensors, then collate those (so they are stacked, maybe shared)."""
    elem = batch[0]
    if np_str_obj_array_pattern.search(elem.dtype.str) is not None:
        raise TypeError(default_collate_err_msg_format.format(elem.dtype))
    torch = _torch()
    return collate([torch.as_tensor(b) for b in batch], collate_fn_map=collate_fn_map)


def collate_numpy_scalar_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """NumPy scalars become a 1-d tensor of their own dtype."""
    return _torch().as_tensor(batch)


def collate_float_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Python floats become a float64 tensor (not torch's float32 default)."""
    torch = _torch()
    return torch.tensor(batch, dtype=torch.float64)


def collate_int_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Python ints become an int64 tensor (bools, a subclass of int, a bool tensor)."""
    return _torch().tensor(batch)


def collate_str_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Strings and bytes are left as a list."""
    return batch


# The default registry, in torch's order. torch keys the first entry by torch.Tensor.
# We key it by TorchTensor, which matches the same objects without importing torch.
# So the registry, with its numpy, number and str entries, works without torch.
# An entry for torch.Tensor added later, `m[torch.Tensor] = fn`, takes TorchTensor's place (see collate).
default_collate_fn_map: CollateFnMap = {
    TorchTensor: collate_tensor_fn,
    np.ndarray: collate_numpy_array_fn,  # and np.memmap, its subclass
    (np.bool_, np.number, np.object_): collate_numpy_scalar_fn,  # np.str_ and np.bytes_ go to str and bytes
    float: collate_float_fn,
    int: collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}


def default_collate(batch: Sequence[Any]) -> Any:
    """Batch samples into tensors, keeping their structure. DataLoader uses it when given a batch_size.

    >>> default_collate([0, 1, 2, 3])
    tensor([0, 1, 2, 3])
    >>> default_collate([{"x": 0.5, "name": "a"}, {"x": 1.5, "name": "b"}])
    {'x': tensor([0.5000, 1.5000], dtype=torch.float64), 'name': ['a', 'b']}
    >>> default_collate([(0, 1), (2, 3)])  # a tuple sample becomes a list of fields
    [tensor([0, 2]), tensor([1, 3])]
    """
    return collate(batch, collate_fn_map=default_collate_fn_map)


def default_convert(data: Any) -> Any:
    """Turn NumPy arrays and scalars in one sample into tensors; what DataLoader uses without batching.

    >>> default_convert({"x": np.array([1, 2]), "y": 3})
    {'x': tensor([1, 2]), 'y': 3}
    """
    elem_type = type(data)
    if isinstance(data, TorchTensor):
        return data
    if elem_type.__module__ == "numpy" and elem_type.__name__ not in ("str_", "string_"):
        if elem_type.__name__ == "ndarray" and np_str_obj_array_pattern.search(data.dtype.str):
            return data  # strings and objects have no tensor dtype
        return _torch().as_tensor(data)
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, {key: default_convert(data[key]) for key in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return elem_type(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return _rebuild_sequence(data, [default_convert(d) for d in data])
    return data


def _stack_arrays_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> np.ndarray:
    """Stack NumPy arrays; unequal shapes raise torch's RuntimeError, naming both shapes."""
    first = batch[0].shape
    for i, array in enumerate(batch):
        if array.shape != first:
            raise RuntimeError(
                f"stack expects each array to be equal size, but got {list(first)} at entry 0 "
                f"and {list(array.shape)} at entry {i}"
            )
    return np.stack(batch)


def _numpy_scalars_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> np.ndarray:
    """NumPy scalars, ints and bools become a 1-d array of their own dtype."""
    return np.asarray(batch)


def _numpy_float_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> np.ndarray:
    """Python floats become a float64 array."""
    return np.asarray(batch, dtype=np.float64)


# default_collate's registry with NumPy arrays instead of tensors at the leaves.
numpy_collate_fn_map: CollateFnMap = {
    np.ndarray: _stack_arrays_fn,
    (np.bool_, np.number, np.object_): _numpy_scalars_fn,
    float: _numpy_float_fn,
    int: _numpy_scalars_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}


def numpy_collate(batch: Sequence[Any]) -> Any:
    """``default_collate``'s torch-free twin: the same structure, with NumPy arrays for tensors.

    >>> numpy_collate([{"x": np.array([1, 2]), "y": 0.5}, {"x": np.array([3, 4]), "y": 1.5}])
    {'x': array([[1, 2],
           [3, 4]]), 'y': array([0.5, 1.5])}
    """
    return collate(batch, collate_fn_map=numpy_collate_fn_map)
