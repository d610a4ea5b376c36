"""Padding collate: batch sequences of different lengths by padding them to the longest one.

``default_collate`` stacks, so every sample must have the same shape; text, audio and event
streams do not. ``pad_collate`` is ``default_collate`` with one registry entry swapped: tensors (and
NumPy arrays, which become tensors) are padded along their first dimension instead of stacked.
It lives in the package, not in a notebook, so that DataLoader workers can import it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from minidl.collate import CollateFnMap, TorchTensor, collate, collate_tensor_fn, default_collate_fn_map


def pad_sequence(sequences: Sequence[Any], padding_value: float = 0, padding_side: str = "right") -> Any:
    """Stack tensors of shape ``(L_i, *rest)`` into one ``(B, max L_i, *rest)`` tensor, padding the gaps.

    The same result as ``torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, ...)``.

    >>> import torch
    >>> pad_sequence([torch.tensor([1, 2, 3]), torch.tensor([4])], padding_value=-1)
    tensor([[ 1,  2,  3],
            [ 4, -1, -1]])
    """
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side should be 'right' or 'left', but got padding_side={padding_side!r}")
    first = sequences[0]
    if first.dim() == 0:
        raise RuntimeError("pad_sequence needs sequences with at least one dimension, but got 0-d tensors")
    rest = tuple(first.shape[1:])
    for i, seq in enumerate(sequences):
        # Only the first dimension may differ; anything else can't be padded into one tensor.
        if seq.dim() == 0 or tuple(seq.shape[1:]) != rest:
            raise RuntimeError(
                f"pad_sequence can only pad the first dimension, but got {list(first.shape)} at entry 0 "
                f"and {list(seq.shape)} at entry {i}"
            )
    longest = max(len(seq) for seq in sequences)
    out = first.new_full((len(sequences), longest, *rest), padding_value)
    for i, seq in enumerate(sequences):
        # Copy each sequence into its row; what it leaves uncovered keeps padding_value.
        if padding_side == "right":
            out[i, : len(seq)] = seq
        else:
            out[i, longest - len(seq) :] = seq
    return out


def _pad_tensor_fn(
    batch: Sequence[Any], *, padding_value: float, padding_side: str, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """The registry entry for tensors: stack them if they agree in shape, else pad them."""
    if all(x.shape == batch[0].shape for x in batch):
        # Nothing to pad: stack exactly as default_collate does (in shared memory inside a worker).
        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    return pad_sequence(batch, padding_value, padding_side)


def pad_collate(batch: Sequence[Any], padding_value: float = 0, padding_side: str = "right") -> Any:
    """``default_collate``, except that tensors and arrays of different lengths are padded, not stacked.

    Dicts, tuples and namedtuples are walked as usual, so ``(sequence, label)`` samples work. To use
    another ``padding_value`` in a DataLoader, pass ``functools.partial(pad_collate, padding_value=-1)``.

    >>> import numpy as np
    >>> pad_collate([(np.array([1, 2, 3]), 0), (np.array([4]), 1)])
    [tensor([[1, 2, 3],
            [4, 0, 0]]), tensor([0, 1])]
    """
    # A copy of the default registry with the tensor entry swapped, so dict order (the order in
    # which isinstance is tried) stays exactly default_collate's. NumPy arrays become tensors
    # first and come back through this same entry.
    collate_fn_map: CollateFnMap = dict(default_collate_fn_map)
    collate_fn_map[TorchTensor] = functools.partial(
        _pad_tensor_fn, padding_value=padding_value, padding_side=padding_side
    )
    return collate(batch, collate_fn_map=collate_fn_map)
