"""The exercise checkers, ch02 (a batch sampler of similar lengths): each passes a learner's copy of the reference
answer and rejects typical wrong answers with the hint that names the mistake.
"""

import re

import numpy as np
import pytest
import torch
from exercise_support import (
    learner_copy,
)

from minidl.sampler import BatchSampler, SequentialSampler
from minidl_course.exercises import (
    check_sampler,
)

SortedBatchSampler = learner_copy("ch02_sampler").SortedBatchSampler


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


# --- check_sampler ---------------------------------------------------------------------------------


def test_check_sampler_accepts_the_reference(capsys):
    check_sampler(SortedBatchSampler)
    assert re.fullmatch(r"All \d+ checks passed\n", capsys.readouterr().out)


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
