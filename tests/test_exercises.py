"""minidl.exercises: the checkers pass the reference solutions and explain what is wrong with others."""

import re

import numpy as np
import pytest
import torch

from minidl.exercises import (
    SortedBatchSampler,
    check_collate,
    check_sampler,
    first_difference,
    make_token_samples,
    pad_mask_collate,
)
from minidl.sampler import BatchSampler, SequentialSampler

# --- the references agree with torch ---------------------------------------------------------------


def test_sorted_batch_sampler_without_shuffle_is_a_batch_sampler_over_the_sorted_order():
    lengths = [4, 2, 2, 9, 1, 2, 4]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    for drop_last in (False, True):
        expected = [[order[i] for i in b] for b in BatchSampler(SequentialSampler(order), 3, drop_last)]
        sampler = SortedBatchSampler(lengths, 3, drop_last=drop_last)
        assert list(sampler) == expected
        assert len(sampler) == len(expected)


def test_sorted_batch_sampler_shuffles_batches_like_torch_randperm():
    lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    batches = list(SortedBatchSampler(lengths, 2))
    g = torch.Generator().manual_seed(3)
    sampler = SortedBatchSampler(lengths, 2, shuffle=True, generator=torch.Generator().manual_seed(3))
    for _ in range(3):  # a new order each epoch, drawn from the same generator
        assert list(sampler) == [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]


def test_pad_mask_collate_matches_pad_sequence():
    batch = make_token_samples(6, seed=4, zero_tokens=True)
    out = pad_mask_collate(batch)
    seqs = [torch.as_tensor(s["tokens"]) for s in batch]
    assert torch.equal(out["tokens"], torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True))
    ones = [torch.ones(len(s), dtype=torch.bool) for s in seqs]
    assert torch.equal(out["mask"], torch.nn.utils.rnn.pad_sequence(ones, batch_first=True))
    assert torch.equal(out["label"], torch.tensor([s["label"] for s in batch]))


def test_make_token_samples_is_reproducible():
    a, b = make_token_samples(5, seed=2), make_token_samples(5, seed=2)
    assert first_difference(a, b) is None
    assert all(s["tokens"].dtype == np.int64 and 1 <= len(s["tokens"]) <= 12 for s in a)
    assert min(int(s["tokens"].min()) for s in a) >= 1


def test_first_difference_names_the_place():
    assert first_difference([1, {"a": 2}], [1, {"a": 2}]) is None
    assert first_difference([1, {"a": 2}], [1, {"a": 3}]) == "batch[1]['a'] should be 2, but it is 3"
    assert first_difference(torch.zeros(2), torch.zeros(3)) == "batch should have shape (2,), but it has shape (3,)"
    assert "dtype torch.float32" in first_difference(torch.zeros(2), torch.zeros(2, dtype=torch.int64))
    assert first_difference(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 2], [3, 5]])) == (
        "batch[1, 1] should be 4, but it is 5"
    )
    assert first_difference(np.zeros(2), torch.zeros(2)) == "batch should be a numpy.ndarray, but it is a torch.Tensor"
    assert first_difference({"a": 1}, {"b": 1}) == "batch should have the keys ['a'], but it has ['b']"


# --- check_sampler ---------------------------------------------------------------------------------


def test_check_sampler_accepts_the_reference(capsys):
    check_sampler(SortedBatchSampler)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


@pytest.mark.parametrize("check, answer", [(check_sampler, SortedBatchSampler), (check_collate, pad_mask_collate)])
def test_checks_leave_the_global_rng_alone(check, answer):
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    check(answer)
    assert torch.equal(torch.rand(3), expected)


class TiesReversed(SortedBatchSampler):
    """Breaks ties by the larger index first."""

    def _sorted_batches(self):
        order = sorted(range(len(self.lengths)), key=lambda i: (self.lengths[i], -i))
        return [order[s : s + self.batch_size] for s in range(0, len(order), self.batch_size)][
            : len(self) if self.drop_last else None
        ]


class Longest(SortedBatchSampler):
    """Sorts longest first."""

    def _sorted_batches(self):
        order = sorted(range(len(self.lengths)), key=lambda i: -self.lengths[i])
        return [order[s : s + self.batch_size] for s in range(0, len(order), self.batch_size)]


class KeepsLastBatch(SortedBatchSampler):
    """Ignores drop_last when iterating (but not in __len__)."""

    def _sorted_batches(self):
        order = sorted(range(len(self.lengths)), key=lambda i: self.lengths[i])
        return [order[s : s + self.batch_size] for s in range(0, len(order), self.batch_size)]


class AlwaysRoundsUp(SortedBatchSampler):
    def __len__(self):
        return -(-len(self.lengths) // self.batch_size)


class ShufflesOnce(SortedBatchSampler):
    """Draws the permutation once, in __init__: every epoch repeats it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        batches = self._sorted_batches()
        self._order = [batches[i] for i in torch.randperm(len(batches), generator=self.generator).tolist()]

    def __iter__(self):
        if not self.shuffle:
            return super().__iter__()
        return iter(self._order)


class ShufflesIndices(SortedBatchSampler):
    """Shuffles the indices, then batches them: batches are no longer of similar length."""

    def __iter__(self):
        if not self.shuffle:
            yield from super().__iter__()
            return
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        for s in range(0, len(order) - (len(order) % self.batch_size if self.drop_last else 0), self.batch_size):
            yield order[s : s + self.batch_size]


class IgnoresGenerator(SortedBatchSampler):
    def __iter__(self):
        batches = self._sorted_batches()
        order = torch.randperm(len(batches)).tolist() if self.shuffle else range(len(batches))
        for i in order:
            yield batches[i]


class YieldsTuples(SortedBatchSampler):
    def __iter__(self):
        return (tuple(b) for b in super().__iter__())


class YieldsInts(SortedBatchSampler):
    """A plain sampler: indices, not batches of them."""

    def __iter__(self):
        return (i for b in super().__iter__() for i in b)


class YieldsNumpyInts(SortedBatchSampler):
    def __iter__(self):
        order = np.argsort(self.lengths, kind="stable")
        return iter([list(order[s : s + self.batch_size]) for s in range(0, len(order), self.batch_size)])


class NoLen:
    def __init__(self, lengths, batch_size, drop_last=False, shuffle=False, generator=None):
        self.inner = SortedBatchSampler(lengths, batch_size, drop_last, shuffle, generator)

    def __iter__(self):
        return iter(self.inner)


@pytest.mark.parametrize(
    "wrong, message",
    [
        (TiesReversed, r"equal length keep their index order.*stable sort"),
        (Longest, r"sorted by length, shortest first"),
        (KeepsLastBatch, r"drop_last=True the last, short batch \(1 index\) must not be yielded"),
        (AlwaysRoundsUp, r"len\(sampler\) should be 2, but it is 3"),
        (ShufflesOnce, r"epoch 2 gave the same batch order as epoch 1.*inside __iter__"),
        (ShufflesIndices, r"shuffle reorders whole batches, never the indices inside them"),
        (IgnoresGenerator, r"generator=self.generator"),
        (YieldsTuples, r"batch 0 is a tuple: \(1, 2\)"),
        (YieldsInts, r"batch 0 is an int: 1"),
        (YieldsNumpyInts, r"holds np.int64\(1\), a numpy.int64.*plain Python ints"),
        (NoLen, r"len\(sampler\) failed.*define __len__"),
    ],
)
def test_check_sampler_rejects_a_wrong_sampler_and_says_why(wrong, message):
    with pytest.raises(AssertionError, match=r"check \d+ failed, for lengths=\[") as info:
        check_sampler(wrong)
    assert re.search(message, str(info.value), re.DOTALL), str(info.value)


def test_check_sampler_names_the_case_when_the_sampler_raises():
    class Unfinished(SortedBatchSampler):
        def __len__(self):
            raise NotImplementedError("write __len__")

    with pytest.raises(NotImplementedError, match="write __len__") as info:
        check_sampler(Unfinished)
    assert "lengths=[3, 1, 2]" in info.value.__notes__[0]


# --- check_collate ---------------------------------------------------------------------------------


def test_check_collate_accepts_the_reference(capsys):
    check_collate(pad_mask_collate)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


def mask_from_tokens(batch):
    out = pad_mask_collate(batch)
    out["mask"] = out["tokens"] != 0
    return out


def float_tokens(batch):
    out = pad_mask_collate(batch)
    out["tokens"] = out["tokens"].float()
    return out


def left_padded(batch):
    longest = max(len(s["tokens"]) for s in batch)
    tokens = torch.zeros(len(batch), longest, dtype=torch.int64)
    mask = torch.zeros(len(batch), longest, dtype=torch.bool)
    for i, s in enumerate(batch):
        n = len(s["tokens"])
        tokens[i, longest - n :] = torch.as_tensor(s["tokens"])
        mask[i, longest - n :] = True
    return {"tokens": tokens, "mask": mask, "label": torch.tensor([s["label"] for s in batch])}


def fixed_length(batch):
    tokens = torch.zeros(len(batch), 12, dtype=torch.int64)
    mask = torch.zeros(len(batch), 12, dtype=torch.bool)
    for i, s in enumerate(batch):
        tokens[i, : len(s["tokens"])] = torch.as_tensor(s["tokens"])
        mask[i, : len(s["tokens"])] = True
    return {"tokens": tokens, "mask": mask, "label": torch.tensor([s["label"] for s in batch])}


def no_mask(batch):
    out = pad_mask_collate(batch)
    del out["mask"]
    return out


def labels_as_list(batch):
    out = pad_mask_collate(batch)
    out["label"] = [s["label"] for s in batch]
    return out


def pads_in_place(batch):
    longest = max(len(s["tokens"]) for s in batch)
    for s in batch:
        s["tokens"] = np.pad(s["tokens"], (0, longest - len(s["tokens"])))
    return pad_mask_collate(batch)


def returns_a_tuple(batch):
    out = pad_mask_collate(batch)
    return out["tokens"], out["mask"], out["label"]


@pytest.mark.parametrize(
    "wrong, message",
    [
        (mask_from_tokens, r"real token 0 at position \d+: build the mask from the lengths"),
        (float_tokens, r"batch\['tokens'\] should have dtype torch.int64, but it has dtype torch.float32"),
        (left_padded, r"padding goes on the right"),
        (fixed_length, r"should have shape \(2, 3\), but it has shape \(2, 12\).*not a fixed length"),
        (no_mask, r"should have the keys \['label', 'mask', 'tokens'\], but it has \['label', 'tokens'\]"),
        (labels_as_list, r"batch\['label'\] should be a torch.Tensor, but it is a list"),
        (pads_in_place, r"changed the samples it was given"),
        (returns_a_tuple, r"should be a dict .* but it is a tuple"),
    ],
)
def test_check_collate_rejects_a_wrong_collate_and_says_why(wrong, message):
    with pytest.raises(AssertionError, match=r"check \d+ failed, for ") as info:
        check_collate(wrong)
    assert re.search(message, str(info.value), re.DOTALL), str(info.value)


def test_check_collate_names_the_case_when_the_collate_raises():
    def unfinished(batch):
        raise NotImplementedError("write the collate")

    with pytest.raises(NotImplementedError, match="write the collate") as info:
        check_collate(unfinished)
    assert "two samples, 3 and 1 tokens" in info.value.__notes__[0]
