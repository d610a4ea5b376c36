"""Checkers for the exercise notebooks: run the learner's code beside a reference on many seeded cases.

A checker stops at the first case where the two disagree and raises AssertionError saying, in plain
words, which case it was, what was expected, what came back and the likely cause; when every case
agrees it prints ``All N checks passed``. The reference solutions live here too, so the tests can
check the checkers. Needs torch: the exercises compare against ``torch.utils.data``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from minidl._random import randperm
from minidl.dataloader import DataLoader
from minidl.sampler import Batch, Sampler

Sample = dict[str, Any]  # one item of make_token_samples: {"tokens": 1-d int64 array, "label": int}


def _torch():
    import torch  # imported when a check runs: `import minidl.exercises` itself needs only NumPy

    return torch


# --- comparing two batches ------------------------------------------------------------------------


def first_difference(expected: Any, got: Any, where: str = "batch") -> str | None:
    """Where ``got`` first differs from ``expected`` (type, keys, length, dtype, shape, value), in words.

    Returns None when they are equal, leaf by leaf. Tensors and arrays must agree in dtype and shape;
    dicts must have the same keys, in any order.

    >>> first_difference({"x": [1, 2]}, {"x": [1, 3]})
    "batch['x'][1] should be 2, but it is 3"
    >>> first_difference((1, "a"), (1, "a")) is None
    True
    """
    torch = _torch()
    if type(got) is not type(expected):
        return f"{where} should be {_type_name(expected)}, but it is {_type_name(got)}"
    if isinstance(expected, torch.Tensor | np.ndarray):
        if got.dtype != expected.dtype:
            return f"{where} should have dtype {expected.dtype}, but it has dtype {got.dtype}"
        if tuple(got.shape) != tuple(expected.shape):
            return f"{where} should have shape {tuple(expected.shape)}, but it has shape {tuple(got.shape)}"
        differs = (got != expected) if isinstance(got, np.ndarray) else (got != expected).numpy()
        if differs.any():
            pos = tuple(int(i) for i in np.argwhere(differs)[0])
            return (f"{where}[{', '.join(map(str, pos))}] should be {expected[pos].item()!r}, "
                    f"but it is {got[pos].item()!r}")
        return None
    if isinstance(expected, dict):
        if set(got) != set(expected):  # the same keys, in any order
            return f"{where} should have the keys {list(expected)}, but it has {list(got)}"
        for key in expected:
            found = first_difference(expected[key], got[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(expected, list | tuple):
        if len(got) != len(expected):
            return f"{where} should have {len(expected)} elements, but it has {len(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            found = first_difference(e, g, f"{where}[{i}]")
            if found:
                return found
        return None
    if got != expected:
        return f"{where} should be {expected!r}, but it is {got!r}"
    return None


def _type_name(obj: Any) -> str:
    """``obj``'s type with an article: "a list", "an int", "a torch.Tensor"."""
    t = type(obj)
    name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _loaders() -> tuple[tuple[str, type], ...]:
    """minidl's DataLoader and torch's: an answer must work in both."""
    return ("minidl.DataLoader", DataLoader), ("torch.utils.data.DataLoader", _torch().utils.data.DataLoader)


class _Checks:
    """Counts the checks that passed; ``fail`` raises the first mismatch with its case and a hint."""

    def __init__(self) -> None:
        self.passed = 0

    def fail(self, case: str, problem: str, hint: str = "") -> None:
        message = f"check {self.passed + 1} failed, for {case}:\n  {problem}"
        if hint:
            message += f"\n  Hint: {hint}"
        raise AssertionError(message)

    def done(self) -> None:
        print(f"All {self.passed} checks passed")


# --- ex01: a sampler ------------------------------------------------------------------------------


class SortedBatchSampler(Sampler[Batch]):
    """Batches of indices of similar length, so each batch needs little padding (ex01's reference).

    Indices are sorted by ``lengths[i]``, shortest first (ties keep index order), then cut into
    batches of ``batch_size``; ``shuffle`` yields the batches in the order of one
    ``torch.randperm(number of batches, generator=generator)`` per epoch.

    >>> list(SortedBatchSampler([3, 1, 2, 1, 3], batch_size=2))
    [[1, 3], [2, 0], [4]]
    >>> list(SortedBatchSampler([3, 1, 2, 1, 3], batch_size=2, drop_last=True))
    [[1, 3], [2, 0]]
    """

    def __init__(
        self, lengths: Sequence[int], batch_size: int, drop_last: bool = False, shuffle: bool = False, generator=None
    ) -> None:
        self.lengths = lengths
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.generator = generator

    def _sorted_batches(self) -> list[Batch]:
        # sorted() is stable: items of equal length keep their index order.
        order = sorted(range(len(self.lengths)), key=lambda i: self.lengths[i])
        batches = [order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __iter__(self) -> Iterator[Batch]:
        batches = self._sorted_batches()
        if not self.shuffle:
            yield from batches
            return
        # Drawn here, not in __init__: every epoch gets its own order of the same batches.
        for i in randperm(len(batches), self.generator):
            yield batches[i]

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.lengths) // self.batch_size
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size


def _sampler_cases() -> Iterator[tuple[list[int], int, bool, bool, int | None]]:
    """(lengths, batch_size, drop_last, shuffle, seed): small readable cases first, then seeded random ones.

    seed None means shuffle with no generator (the global torch RNG); a number means a seeded generator.
    """
    yield [3, 1, 2], 2, False, False, None
    yield [2, 1, 2, 1, 2], 2, False, False, None  # ties
    yield [2, 1, 2, 1, 2], 2, True, False, None  # drop_last
    yield [5, 4], 3, False, False, None  # one short batch
    yield [5, 4], 3, True, False, None  # ... dropped: no batches at all
    yield [1, 1, 1, 1], 4, True, False, None  # nothing short to drop
    yield [3, 1, 2, 1, 3, 2, 2], 2, False, True, 0  # shuffle with a generator
    yield [3, 1, 2, 1, 3, 2, 2], 2, True, True, None  # shuffle with the global RNG
    rng = random.Random(0)
    for seed in range(40):
        n = rng.randint(1, 30)
        lengths = [rng.randint(1, 8) for _ in range(n)]  # few distinct lengths: many ties
        yield lengths, rng.randint(1, 6), rng.random() < 0.5, seed >= 20, seed if seed % 5 else None


def check_sampler(sampler_cls: Callable[..., Any]) -> None:
    """Check ex01: ``sampler_cls(lengths, batch_size, drop_last, shuffle, generator)`` against the reference.

    Compares ``len()`` and three epochs on each case, then the sampler inside minidl's and torch's
    DataLoader. Raises AssertionError explaining the first mismatch; prints ``All N checks passed``.
    """
    torch = _torch()
    checks = _Checks()
    saved_rng = torch.get_rng_state()  # shuffling without a generator draws from the global RNG
    try:
        for lengths, batch_size, drop_last, shuffle, seed in _sampler_cases():
            _check_sampler_case(sampler_cls, lengths, batch_size, drop_last, shuffle, seed, checks)
            checks.passed += 1
        _check_sampler_in_dataloaders(sampler_cls, checks)
    finally:
        torch.set_rng_state(saved_rng)
    checks.done()


def _make_sampler(cls, lengths, batch_size, drop_last, shuffle, seed):
    torch = _torch()
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return cls(list(lengths), batch_size=batch_size, drop_last=drop_last, shuffle=shuffle, generator=generator)


def _check_sampler_case(sampler_cls, lengths, batch_size, drop_last, shuffle, seed, checks: _Checks) -> None:
    torch = _torch()
    generator = "None" if seed is None else f"torch.Generator().manual_seed({seed})"
    case = (
        f"lengths={lengths}, batch_size={batch_size}, drop_last={drop_last}, shuffle={shuffle}"
        + (f", generator={generator}" if shuffle else "")
    )
    # Both samplers start from the same global RNG state (it matters when generator is None).
    torch.manual_seed(1000 + (seed or 0))
    expected_sampler = _make_sampler(SortedBatchSampler, lengths, batch_size, drop_last, shuffle, seed)
    expected = [list(expected_sampler) for _ in range(3)]
    torch.manual_seed(1000 + (seed or 0))
    try:
        sampler = _make_sampler(sampler_cls, lengths, batch_size, drop_last, shuffle, seed)
    except Exception as e:
        e.add_note(f"(raised by your sampler's __init__, for {case})")
        raise

    try:
        got_len = len(sampler)
    except TypeError as e:
        checks.fail(case, f"len(sampler) failed: {e}", "define __len__ to return the number of batches.")
    except Exception as e:
        e.add_note(f"(raised by your sampler's __len__, for {case})")
        raise
    if got_len != len(expected[0]):
        checks.fail(
            case,
            f"len(sampler) should be {len(expected[0])}, but it is {got_len}",
            "len is the number of batches an epoch yields: n // batch_size with drop_last, else rounded up.",
        )

    got_epochs = []
    for epoch in range(3):
        where = case + (f", epoch {epoch + 1}" if shuffle else "")
        try:
            got = list(sampler)
        except Exception as e:
            e.add_note(f"(raised by your sampler's __iter__, for {where})")
            raise
        got_epochs.append(got)
        if epoch > 0 and got == got_epochs[0] and expected[epoch] != expected[0]:
            checks.fail(where, f"epoch {epoch + 1} gave the same batch order as epoch 1: {got}",
                        "draw the permutation inside __iter__, so that each epoch is shuffled anew.")
        _compare_batches(expected[epoch], got, lengths, batch_size, drop_last, shuffle, where, checks)
        if not shuffle:
            break  # one epoch is enough: without shuffling every epoch is the same


def _compare_batches(expected, got, lengths, batch_size, drop_last, shuffle, case, checks: _Checks) -> None:
    for k, batch in enumerate(got):
        if type(batch) is not list:
            checks.fail(case, f"batch {k} is {_type_name(batch)}: {batch!r}",
                        "yield each batch as a list of ints, as BatchSampler does.")
        for idx in batch:
            if type(idx) is not int:
                checks.fail(case, f"batch {k} holds {idx!r}, {_type_name(idx)}",
                            "indices must be plain Python ints: convert with int(), or .tolist() a tensor.")
    if got == expected:
        return

    flat_expected = sorted(i for b in expected for i in b)
    flat_got = sorted(i for b in got for i in b)
    short = len(lengths) % batch_size
    short_batch = f"{short} {'index' if short == 1 else 'indices'}"
    shuffle_hint = ("shuffle reorders whole batches, never the indices inside them: build the sorted batches "
                    "first, then permute the list of batches.")
    if flat_got != flat_expected:
        if shuffle and sorted(map(len, got)) == sorted(map(len, expected)):
            hint = shuffle_hint  # the right number and sizes of batches, of the wrong indices
        elif drop_last and len(got) == len(expected) + 1 and short and len(got[-1]) == short:
            hint = f"with drop_last=True the last, short batch ({short_batch}) must not be yielded."
        elif not drop_last and len(got) == len(expected) - 1 and short:
            hint = f"with drop_last=False the last, short batch ({short_batch}) must still be yielded."
        elif len(set(flat_got)) < len(flat_got):
            dup = next(i for i in flat_got if flat_got.count(i) > 1)
            hint = f"index {dup} is yielded more than once; each index belongs to exactly one batch."
        else:
            missing = sorted(set(flat_expected) - set(flat_got))
            hint = f"index {missing[0]} is never yielded." if missing else "some indices should not be there."
        checks.fail(case, f"expected batches {expected}, but got {got}", hint)

    if sorted(map(tuple, expected)) == sorted(map(tuple, got)):
        if shuffle:
            hint = ("the batches are right but come in another order: yield batches[i] for i in "
                    "torch.randperm(number of batches, generator=self.generator), one permutation per epoch.")
        else:
            hint = "without shuffle the batches come in sorted order: shortest lengths first."
        checks.fail(case, f"expected batches {expected}, but got {got}", hint)

    sizes, want_sizes = [len(b) for b in got], [len(b) for b in expected]
    if not shuffle and sizes != want_sizes:
        hint = (f"every batch holds batch_size={batch_size} indices, except perhaps the last; your batches "
                f"hold {sizes}.")
        checks.fail(case, f"expected batches {expected}, but got {got}", hint)
    if shuffle:
        checks.fail(case, f"expected batches {expected}, but got {got}", shuffle_hint)
    order = [i for b in got for i in b]
    steps = [p for p in range(1, len(order)) if lengths[order[p]] < lengths[order[p - 1]]]
    if steps:
        p = steps[0]
        hint = (f"indices should be sorted by length, shortest first, but index {order[p - 1]} (length "
                f"{lengths[order[p - 1]]}) comes before index {order[p]} (length {lengths[order[p]]}).")
    else:
        ties = [p for p in range(1, len(order))
                if lengths[order[p]] == lengths[order[p - 1]] and order[p] < order[p - 1]]
        p = ties[0] if ties else 1  # the orders differ, so with sizes and lengths right a tie is out of order
        hint = (f"indices of equal length keep their index order, but index {order[p - 1]} comes before "
                f"index {order[p]} (both length {lengths[order[p]]}): sort with a stable sort, "
                "sorted(range(n), key=lambda i: lengths[i]).")
    checks.fail(case, f"expected batches {expected}, but got {got}", hint)


def _check_sampler_in_dataloaders(sampler_cls, checks: _Checks) -> None:
    torch = _torch()
    samples = make_token_samples(23, seed=7)
    lengths = [len(s["tokens"]) for s in samples]
    ids = list(range(len(samples)))  # a dataset of its own indices: each batch shows what was fetched
    for name, loader_cls in _loaders():
        case = f"{name}(dataset, batch_sampler=sampler) with lengths={lengths}, batch_size=4, shuffle=True"
        expected = SortedBatchSampler(lengths, 4, shuffle=True, generator=torch.Generator().manual_seed(5))
        sampler = sampler_cls(lengths, batch_size=4, drop_last=False, shuffle=True,
                              generator=torch.Generator().manual_seed(5))
        want = [[b.tolist() for b in loader_cls(ids, batch_sampler=expected)] for _ in range(2)]
        got = [[b.tolist() for b in loader_cls(ids, batch_sampler=sampler)] for _ in range(2)]
        if got != want:
            checks.fail(case, f"two epochs should load {want}, but loaded {got}")
        checks.passed += 1


# --- ex02: a collate function ---------------------------------------------------------------------


def make_token_samples(n: int, seed: int = 0, max_len: int = 12, zero_tokens: bool = False) -> list[Sample]:
    """``n`` samples ``{"tokens": 1-d int64 array of 1..max_len token ids, "label": 0 or 1}``, reproducibly.

    Token ids run from 1 to 99, or from 0 with ``zero_tokens``: then 0 is a real token, not padding.

    >>> [(s["tokens"].tolist(), s["label"]) for s in make_token_samples(2, seed=1, max_len=4)]
    [([51, 75], 1), ([15], 1)]
    """
    rng = np.random.default_rng(seed)
    low = 0 if zero_tokens else 1
    samples = []
    for _ in range(n):
        length = int(rng.integers(1, max_len + 1))
        tokens = rng.integers(low, 100, size=length, dtype=np.int64)
        samples.append({"tokens": tokens, "label": int(rng.integers(0, 2))})
    return samples


def pad_mask_collate(batch: Sequence[Sample]) -> dict[str, Any]:
    """Token samples to ``{"tokens": (B, L) int64 padded with 0, "mask": (B, L) bool, "label": (B,) int64}``.

    ``L`` is the longest sample in the batch; ``mask`` is True where a row holds a real token.
    ex02's reference.

    >>> out = pad_mask_collate([{"tokens": np.array([5, 0, 7]), "label": 1}, {"tokens": np.array([9]), "label": 0}])
    >>> out["tokens"].tolist(), out["mask"].tolist(), out["label"].tolist()
    ([[5, 0, 7], [9, 0, 0]], [[True, True, True], [True, False, False]], [1, 0])
    """
    torch = _torch()
    lengths = [len(sample["tokens"]) for sample in batch]
    longest = max(lengths)
    tokens = torch.zeros(len(batch), longest, dtype=torch.int64)  # 0 is the padding id
    mask = torch.zeros(len(batch), longest, dtype=torch.bool)
    for i, sample in enumerate(batch):
        tokens[i, : lengths[i]] = torch.as_tensor(sample["tokens"])
        mask[i, : lengths[i]] = True  # from the length, not tokens != 0: a real token may be 0
    labels = torch.tensor([sample["label"] for sample in batch], dtype=torch.int64)
    return {"tokens": tokens, "mask": mask, "label": labels}


def _collate_cases() -> Iterator[tuple[str, list[Sample]]]:
    """(description, batch): small readable batches first, then seeded random ones."""
    yield "two samples, 3 and 1 tokens", [{"tokens": np.array([5, 6, 7]), "label": 1},
                                          {"tokens": np.array([8]), "label": 0}]
    yield "one sample", [{"tokens": np.array([4, 2]), "label": 0}]
    yield "three samples of equal length", [{"tokens": np.array([i, i + 1]), "label": i % 2} for i in (1, 3, 5)]
    yield "a real token 0", [{"tokens": np.array([4, 0, 2]), "label": 1}, {"tokens": np.array([7]), "label": 0}]
    yield "the longest sample last", [{"tokens": np.array([9]), "label": 0},
                                      {"tokens": np.array([1, 2, 3, 4]), "label": 1}]
    rng = random.Random(0)
    for seed in range(40):
        size = rng.randint(1, 8)
        zero_tokens = seed >= 20  # from here on, 0 is also a real token id
        yield (f"make_token_samples({size}, seed={seed}, zero_tokens={zero_tokens})",
               make_token_samples(size, seed=seed, zero_tokens=zero_tokens))


def check_collate(collate_fn: Callable[[list[Sample]], Any]) -> None:
    """Check ex02: ``collate_fn(batch)`` against ``pad_mask_collate`` on many batches, then inside loaders.

    Raises AssertionError explaining the first mismatch; prints ``All N checks passed``.
    """
    torch = _torch()
    checks = _Checks()
    for description, batch in _collate_cases():
        _check_collate_case(collate_fn, batch, description, checks)
        checks.passed += 1
    samples = make_token_samples(10, seed=99, zero_tokens=True)
    saved_rng = torch.get_rng_state()  # every epoch of a DataLoader draws a base seed from it
    try:
        for name, loader_cls in _loaders():
            case = f"{name}(make_token_samples(10, seed=99, zero_tokens=True), batch_size=4, collate_fn=yours)"
            want = list(loader_cls(samples, batch_size=4, collate_fn=pad_mask_collate))
            got = list(loader_cls(samples, batch_size=4, collate_fn=collate_fn))
            problem = first_difference(want, got, where="batches")
            if problem:
                checks.fail(case, problem)
            checks.passed += 1
    finally:
        torch.set_rng_state(saved_rng)
    checks.done()


def _describe_batch(batch: Sequence[Sample]) -> str:
    rows = ", ".join(f"{{'tokens': {s['tokens'].tolist()}, 'label': {s['label']}}}" for s in batch)
    return f"[{rows}]"


def _check_collate_case(collate_fn, batch: list[Sample], description: str, checks: _Checks) -> None:
    torch = _torch()
    case = f"{description}: {_describe_batch(batch)}"
    untouched = copy.deepcopy(batch)
    expected = pad_mask_collate(untouched)
    try:
        got = collate_fn(batch)
    except Exception as e:
        e.add_note(f"(raised by your collate function, for {case})")
        raise
    changed = first_difference(untouched, batch, where="batch")
    if changed:
        checks.fail(case, f"your collate changed the samples it was given: {changed}",
                    "build new tensors for the batch; never write into the samples.")
    if not isinstance(got, dict):
        checks.fail(case, f"the result should be a dict with keys {list(expected)}, but it is {_type_name(got)}")
    if sorted(got) != sorted(expected):
        checks.fail(case, f"the result should have the keys {sorted(expected)}, but it has {sorted(got)}")
    lengths = [len(s["tokens"]) for s in batch]
    for key in ("tokens", "mask", "label"):
        where = f"batch[{key!r}]"
        value, want = got[key], expected[key]
        if not isinstance(value, torch.Tensor):
            checks.fail(case, f"{where} should be a torch.Tensor, but it is {_type_name(value)}",
                        "turn lists and arrays into tensors: torch.tensor(...) or torch.as_tensor(...).")
        if value.dtype != want.dtype:
            hint = {
                "tokens": "token ids are integers: create the tensor with dtype=torch.int64 (torch.zeros "
                          "makes float32 unless told otherwise).",
                "mask": "the mask is boolean: dtype=torch.bool, or compare (e.g. positions < lengths).",
                "label": "labels are integers: dtype=torch.int64.",
            }[key]
            checks.fail(case, f"{where} should have dtype {want.dtype}, but it has dtype {value.dtype}", hint)
        if tuple(value.shape) != tuple(want.shape):
            if key == "label":
                hint = "one label per sample."
            else:
                hint = (f"{len(batch)} rows (one per sample) by {max(lengths)} columns (the longest sample "
                        "in this batch, not a fixed length).")
            checks.fail(case, f"{where} should have shape {tuple(want.shape)}, but it has shape "
                              f"{tuple(value.shape)}", hint)
        problem = first_difference(want, value, where=where)
        if problem:
            checks.fail(case, problem, _collate_value_hint(key, value, want, batch, lengths))


def _collate_value_hint(key: str, value, want, batch: Sequence[Sample], lengths: list[int]) -> str:
    torch = _torch()
    if key == "label":
        return "label[i] is sample i's label, in batch order."
    i, j = (int(v) for v in torch.nonzero(value != want)[0])
    if key == "mask":
        zero_token = j < lengths[i] and int(batch[i]["tokens"][j]) == 0
        if zero_token:
            return (f"sample {i} has a real token 0 at position {j}: build the mask from the lengths, "
                    "not from tokens != 0.")
        return f"mask[i, j] is True exactly when j < the length of sample i (here {lengths[i]})."
    left = torch.zeros_like(want)
    for r, n in enumerate(lengths):
        left[r, left.shape[1] - n :] = torch.as_tensor(batch[r]["tokens"])
    if torch.equal(value, left):
        return "each row starts with its sample's tokens; the padding goes on the right."
    if j >= lengths[i]:
        return f"row {i} has {lengths[i]} real tokens; the positions after them hold the padding id 0."
    return f"row {i} starts with sample {i}'s tokens, in order."
