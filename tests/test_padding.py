"""minidl_course.padding against torch.nn.utils.rnn.pad_sequence: torch is the oracle."""

import collections
import functools
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils.rnn import pad_sequence as torch_pad_sequence

import minidl
from minidl_bench.batches import assert_same_batch
from minidl_course.padding import pad_collate, pad_sequence

Pair = collections.namedtuple("Pair", ["tokens", "label"])


def ragged(lengths, trailing=(), dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 100, (n, *trailing), generator=g).to(dtype) for n in lengths]


@pytest.mark.parametrize("lengths", [[3, 1, 2], [1], [4, 4], [0, 2], [0, 0], [5, 1, 1, 7]])
@pytest.mark.parametrize("trailing", [(), (2,), (2, 3)])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pad_sequence_matches_torch(lengths, trailing, padding_side):
    seqs = ragged(lengths, trailing)
    expected = torch_pad_sequence(seqs, batch_first=True, padding_value=-7, padding_side=padding_side)
    assert_same_batch(pad_sequence(seqs, padding_value=-7, padding_side=padding_side), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bool])
def test_pad_sequence_keeps_dtype(dtype):
    seqs = ragged([2, 5], dtype=dtype)
    assert_same_batch(pad_sequence(seqs), torch_pad_sequence(seqs, batch_first=True))


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    trailing=st.sampled_from([(), (1,), (3,)]),
    padding_value=st.integers(-5, 5),
    seed=st.integers(0, 2**16),
)
def test_pad_sequence_property(lengths, trailing, padding_value, seed):
    seqs = ragged(lengths, trailing, seed=seed)
    out = pad_sequence(seqs, padding_value=padding_value)
    assert_same_batch(out, torch_pad_sequence(seqs, batch_first=True, padding_value=padding_value))
    # Each row holds its sequence, then nothing but padding.
    for row, seq in zip(out, seqs):
        assert torch.equal(row[: len(seq)], seq)
        assert (row[len(seq) :] == padding_value).all()


def test_pad_sequence_rejects_mismatched_trailing_dims():
    match = r"only pad the first dimension.*\[2, 3\] at entry 0 and \[3, 4\] at entry 1"
    with pytest.raises(RuntimeError, match=match):
        pad_sequence([torch.zeros(2, 3), torch.zeros(3, 4)])
    with pytest.raises(RuntimeError, match="at least one dimension"):
        pad_sequence([torch.tensor(1), torch.tensor(2)])
    with pytest.raises(ValueError, match="padding_side"):
        pad_sequence([torch.zeros(2)], padding_side="middle")


def test_pad_collate_pads_nested_fields():
    tokens = ragged([3, 1, 4], seed=1)
    batch = [
        {"tokens": t.numpy(), "label": i, "pair": Pair(t, float(i)), "name": f"s{i}"} for i, t in enumerate(tokens)
    ]
    padded = torch_pad_sequence(tokens, batch_first=True, padding_value=-1)
    expected = {
        "tokens": padded,
        "label": torch.tensor([0, 1, 2]),
        "pair": Pair(padded, torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)),
        "name": ["s0", "s1", "s2"],
    }
    assert_same_batch(pad_collate(batch, padding_value=-1), expected)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=0, max_size=3), batch_size=st.integers(1, 4))
def test_pad_collate_equals_default_collate_when_nothing_is_ragged(shape, batch_size):
    batch = [(np.full(shape, i, dtype=np.float32), i) for i in range(batch_size)]
    assert_same_batch(pad_collate(batch), minidl.default_collate(batch))


def test_pad_collate_in_a_dataloader_matches_torch(no_leaks):
    data = [(seq, i % 2) for i, seq in enumerate(ragged([2, 5, 1, 3, 3, 4, 1], seed=2))]

    def torch_collate(batch):
        seqs, labels = zip(*batch)
        return [torch_pad_sequence(list(seqs), batch_first=True), torch.tensor(labels)]

    expected = list(torch.utils.data.DataLoader(data, batch_size=3, collate_fn=torch_collate))
    # Process workers too: pad_collate is importable, so it can be sent to them.
    for num_workers in (0, 2):
        loader = minidl.DataLoader(data, batch_size=3, collate_fn=pad_collate, num_workers=num_workers)
        got = list(loader)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same_batch(g, e)


def test_partial_pad_collate_pickles():
    fn = pickle.loads(pickle.dumps(functools.partial(pad_collate, padding_value=-1)))
    assert fn([torch.tensor([1, 2]), torch.tensor([3])]).tolist() == [[1, 2], [3, -1]]
