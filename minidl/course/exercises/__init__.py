"""Checkers for the exercise notebooks: run the learner's code beside a reference on many seeded cases.

A checker stops at the first case where the two disagree and raises AssertionError saying, in plain
words, which case it was, what was expected, what came back and the likely cause; when every case
agrees it prints ``All N checks passed``. The reference solutions live here too, so the tests can
check the checkers. Needs torch: the exercises compare against ``torch.utils.data``.
"""

from __future__ import annotations

import copy
import multiprocessing
import pickle
import queue
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from minidl._random import randperm
from minidl.collate import default_collate
from minidl.course import toy
from minidl.course.exercises._common import _Checks, _loaders, _torch, _type_name, first_difference  # noqa: F401
from minidl.dataloader import DataLoader
from minidl.sampler import Batch, Sampler
from minidl.worker import ExceptionWrapper

Sample = dict[str, Any]  # one item of make_token_samples: {"tokens": 1-d int64 array, "label": int}


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


# --- ex03: a worker loop --------------------------------------------------------------------------

Task = tuple[int, list[int]]  # (task_idx, indices): one batch's worth of work, as the main process sends it
STUCK_AFTER = 3.0  # seconds a worker loop may take to leave after its sentinel before the checker gives up


def simple_worker_loop(dataset: Any, index_queue: Any, result_queue: Any, collate_fn: Callable) -> None:
    """Answer each task ``(task_idx, indices)`` with ``(task_idx, batch)``; leave at the ``None`` sentinel.

    ex03's reference: minidl's ``_worker_loop`` without seeding, worker info, ``done_event``, the parent
    watchdog or iterable datasets. A sample or a collate that raises doesn't end the loop: that task is
    answered with an ``ExceptionWrapper``, for the main process to raise.

    >>> tasks, results = queue.Queue(), queue.Queue()
    >>> for task in [(7, [3, 4]), (8, [99]), None]:
    ...     tasks.put(task)
    >>> simple_worker_loop(toy.RangeDataset(10), tasks, results, list)
    >>> results.get(), type(results.get()[1]).__name__
    ((7, [3, 4]), 'ExceptionWrapper')
    """
    while True:
        task = index_queue.get()
        if task is None:  # the sentinel: no more work
            return
        task_idx, indices = task
        try:
            batch = collate_fn([dataset[i] for i in indices])
        except Exception:
            batch = ExceptionWrapper(where="in a worker")  # the error travels back as data; the loop goes on
        result_queue.put((task_idx, batch))


def _worker_cases() -> Iterator[tuple[str, Any, Callable, list[Task]]]:
    """(description, dataset, collate_fn, tasks): small readable cases first, then seeded random ones."""
    yield "RangeDataset(10), default_collate", toy.RangeDataset(10), default_collate, [(0, [0, 1, 2]), (1, [3, 4])]
    yield ("RangeDataset(10), default_collate, task numbers that don't start at 0", toy.RangeDataset(10),
           default_collate, [(7, [3, 4, 5]), (8, [9]), (3, [0])])
    yield "RangeDataset(10), default_collate, no tasks at all", toy.RangeDataset(10), default_collate, []
    yield ("FailingDataset(10, bad_index=5) (sample 5 raises KeyError), default_collate",
           toy.FailingDataset(10, bad_index=5), default_collate, [(0, [4, 5]), (1, [6, 7]), (2, [8])])
    yield ("RangeDataset(10), default_collate, index 10 is out of range (IndexError)", toy.RangeDataset(10),
           default_collate, [(0, [8, 9]), (1, [10]), (2, [0])])
    yield ("make_token_samples(4, seed=1), pad_mask_collate, an empty task (the collate raises ValueError)",
           make_token_samples(4, seed=1), pad_mask_collate, [(0, [0, 1]), (1, []), (2, [2, 3])])
    rng = random.Random(0)
    for seed in range(30):
        n = rng.randint(1, 20)
        if seed % 3 == 0:
            description = f"RangeDataset({n}), default_collate"
            dataset, collate_fn = toy.RangeDataset(n), default_collate
        elif seed % 3 == 1:
            bad = rng.randrange(n)
            description = f"FailingDataset({n}, bad_index={bad}), default_collate"
            dataset, collate_fn = toy.FailingDataset(n, bad_index=bad), default_collate
        else:
            description = f"make_token_samples({n}, seed={seed}), pad_mask_collate"
            dataset, collate_fn = make_token_samples(n, seed=seed), pad_mask_collate
        labels = rng.sample(range(100), rng.randint(0, 6))  # task numbers: unique, in no particular order
        # Now and then an index one past the end: that task's answer is an IndexError.
        tasks = [(label, [rng.randrange(n + (rng.random() < 0.1)) for _ in range(rng.randint(1, 4))])
                 for label in labels]
        yield description, dataset, collate_fn, tasks


def check_worker_loop(worker_loop: Callable[..., None], start_method: str | None = None) -> None:
    """Check ex03: ``worker_loop(dataset, index_queue, result_queue, collate_fn)`` against the reference.

    Runs it on many seeded task lists in a thread (where a hang or a crash can be seen and explained), then
    in two worker processes started with ``start_method`` (this platform's default if None). Raises
    AssertionError explaining the first mismatch; prints ``All N checks passed``.
    """
    checks = _Checks()
    _check_importable(worker_loop, checks)
    for description, dataset, collate_fn, tasks in _worker_cases():
        _check_worker_case(worker_loop, description, dataset, collate_fn, tasks, checks)
        checks.passed += 1
    _check_worker_in_processes(worker_loop, start_method, checks)
    checks.passed += 1
    checks.done()


def _check_importable(worker_loop: Callable, checks: _Checks) -> None:
    main = sys.modules.get("__main__")
    interactive = main is None or not hasattr(main, "__file__")
    if getattr(worker_loop, "__module__", None) == "__main__" and interactive:
        checks.fail(
            f"{getattr(worker_loop, '__name__', worker_loop)!r}, defined in this notebook",
            "a worker process can't import a function defined in a notebook cell",
            "workers started with spawn or forkserver import the function they run, by module and name; write "
            "it into a module file (the %%writefile cell) and import it from there.")


class _Poison:
    """Put on an index queue to stop a loop that ignored its sentinel: unpacking it raises."""

    def __iter__(self):
        raise TypeError("the checker is stopping a worker loop that did not leave at its sentinel")


def _run_worker_in_thread(worker_loop, dataset, collate_fn, tasks):
    """Run ``worker_loop`` on ``tasks`` + sentinel + one extra task; return what it did."""
    index_queue, result_queue = queue.Queue(), queue.Queue()
    for task in tasks:
        index_queue.put(task)
    index_queue.put(None)
    index_queue.put((999, [0]))  # after the sentinel: a loop that reads it has not stopped
    raised = []

    def run():
        try:
            worker_loop(dataset, index_queue, result_queue, collate_fn)
        except BaseException as e:  # noqa: B036 -- anything the learner's loop raises is reported
            raised.append(e)

    thread = threading.Thread(target=run, name="ex03_worker", daemon=True)
    thread.start()
    thread.join(timeout=STUCK_AFTER)
    still_running = thread.is_alive()
    unread = index_queue.qsize()  # 1 if the task after the sentinel is still there, as it should be
    if still_running:
        for _ in range(3):  # so the thread doesn't wait on the queue forever
            index_queue.put(_Poison())
        thread.join(timeout=1.0)
        raised.clear()  # what the poison made it raise is the checker's doing, not a finding
    results = []
    while True:
        try:
            results.append(result_queue.get_nowait())
        except queue.Empty:
            break
    return results, (raised[0] if raised else None), still_running, unread


def _describe_tasks(tasks: Sequence[Task]) -> str:
    return f"tasks {list(tasks)}, then None" if tasks else "only the sentinel None"


def _check_worker_case(worker_loop, description, dataset, collate_fn, tasks, checks: _Checks) -> None:
    case = f"{description}, {_describe_tasks(tasks)}"
    expected_queue = queue.Queue()
    for task in [*tasks, None]:
        expected_queue.put(task)
    expected_results = queue.Queue()
    simple_worker_loop(dataset, expected_queue, expected_results, collate_fn)
    expected = [expected_results.get_nowait() for _ in range(expected_results.qsize())]

    results, raised, still_running, unread = _run_worker_in_thread(worker_loop, dataset, collate_fn, tasks)
    if raised is not None:
        _explain_crash(raised, results, expected, tasks, case, checks)
    for k, (want, got) in enumerate(zip(expected, results)):
        _compare_result(k, want, got, tasks, dataset, collate_fn, case, checks)
    if len(results) < len(expected):
        if still_running:
            checks.fail(case, f"after {len(results)} of {len(expected)} answers your loop stopped answering "
                              f"(it was still running {STUCK_AFTER:g} s later)",
                        "read a task, answer it, read the next: one put per task, each as soon as it's done.")
        checks.fail(case, f"your loop returned after {len(results)} of {len(expected)} answers",
                    "keep reading tasks until you read None; only the sentinel ends the loop.")
    if unread == 0 or len(results) > len(expected):
        checks.fail(case, "your loop read past the sentinel: it took the task put after None"
                          + (f" and answered it with {results[len(expected)]!r}" if len(results) > len(expected)
                             else ""),
                    "when index_queue.get() returns None, return from the function right away.")
    if still_running:
        checks.fail(case, f"your loop answered every task but was still running {STUCK_AFTER:g} s after the "
                          "sentinel None",
                    "None means 'no more work': return (or break out of the loop) when you read it.")


def _explain_crash(raised: BaseException, results, expected, tasks, case, checks: _Checks) -> None:
    what = f"{type(raised).__name__}: {raised}"
    if isinstance(raised, TypeError) and "NoneType" in str(raised) and len(results) == len(expected):
        checks.fail(case, f"your loop answered every task, then raised {what}",
                    "the None after the last task is the sentinel: check `if task is None` before unpacking, "
                    "and return.")
    k = len(results)
    if k < len(expected) and isinstance(expected[k][1], ExceptionWrapper):
        exc = expected[k][1].exc_type.__name__
        checks.fail(case, f"your loop died with {what} on task {tasks[k][0]} (indices {tasks[k][1]}), whose fetch "
                          f"or collate raises {exc}",
                    "a worker must survive a bad sample: wrap fetch + collate in try/except Exception, and put "
                    "(task_idx, ExceptionWrapper(where='in a worker')) for the main process to raise.")
    raised.add_note(f"(raised by your worker loop after {k} answers, for {case})")
    raise raised


def _compare_result(k, want, got, tasks, dataset, collate_fn, case, checks: _Checks) -> None:
    want_idx, want_batch = want
    where = f"answer {k}"
    if not isinstance(got, tuple | list) or len(got) != 2:
        checks.fail(case, f"{where} should be the pair {(want_idx, '<batch>')}, but it is {_short(got)}",
                    "put (task_idx, batch) on result_queue: the main process needs the number to put batches "
                    "back in order.")
    got_idx, got_batch = got
    if got_idx != want_idx:
        hint = "send back the task_idx that came with the task: the main process reorders by it."
        if got_idx == k:
            hint = "send back the task_idx you received with the task, not your own count of tasks."
        checks.fail(case, f"{where} should be for task {want_idx}, but it says task {got_idx!r}", hint)
    if isinstance(want_batch, ExceptionWrapper):
        exc = want_batch.exc_type.__name__
        if isinstance(got_batch, ExceptionWrapper):
            if got_batch.exc_type is not want_batch.exc_type:
                checks.fail(case, f"{where} (task {want_idx}) should wrap a {exc}, but it wraps a "
                                  f"{got_batch.exc_type.__name__}")
            return
        hint = ("wrap the error, inside the except block: ExceptionWrapper(where='in a worker') records the "
                "exception's type and traceback as text, which travel between processes.")
        if isinstance(got_batch, BaseException):
            hint = ("put an ExceptionWrapper, not the exception itself: the wrapper carries the worker's "
                    "traceback as text (a traceback can't be pickled), so the main process can show it.")
        checks.fail(case, f"{where} (task {want_idx}, indices {tasks[k][1]}) should be an ExceptionWrapper "
                          f"holding the {exc} raised by the fetch or collate, but it is {_short(got_batch)}", hint)
    problem = first_difference(want_batch, got_batch, where=f"the batch of task {want_idx}")
    if problem:
        indices = tasks[k][1]
        hint = f"the batch is collate_fn([dataset[i] for i in {indices}])."
        samples = [dataset[i] for i in indices]
        if first_difference(samples, got_batch) is None:
            hint = "you put the list of samples: pass it through collate_fn first."
        checks.fail(case, problem, hint)


def _short(obj: Any) -> str:
    text = repr(obj)
    return f"{_type_name(obj)}: {text if len(text) < 80 else text[:77] + '...'}"


class _Crashed:
    """What ``_guarded_worker`` sends back when the worker loop raised: the worker's id and the error."""

    def __init__(self, worker_id: int, error: ExceptionWrapper) -> None:
        self.worker_id, self.error = worker_id, error


def _guarded_worker(worker_loop, worker_id, dataset, index_queue, result_queue, collate_fn) -> None:
    """A worker process's target: run ``worker_loop``, and send back any error it raises instead of printing it."""
    try:
        worker_loop(dataset, index_queue, result_queue, collate_fn)
    except BaseException:  # noqa: B036 -- reported to the main process, which raises it
        result_queue.put(_Crashed(worker_id, ExceptionWrapper(where=f"in worker process {worker_id}")))


def run_worker_processes(worker_loop: Callable[..., None], dataset: Any, tasks: Sequence[Task],
                         collate_fn: Callable = default_collate, num_workers: int = 2,
                         start_method: str | None = None, timeout: float = 60.0) -> dict[int, Any]:
    """Run ``worker_loop`` in ``num_workers`` processes; deal out ``tasks`` round-robin; return ``{task_idx: batch}``.

    The main process's side of notebook 05's picture, in small: one index queue per worker, one shared result
    queue, a ``None`` sentinel per worker once every answer is in. An error raised by the worker loop itself (not
    by a sample) is raised here, with the worker's traceback. ``start_method`` None is this platform's default.
    """
    ctx = multiprocessing.get_context(start_method)
    index_queues = [ctx.Queue() for _ in range(num_workers)]
    result_queue = ctx.Queue()
    workers = [ctx.Process(target=_guarded_worker, args=(worker_loop, i, dataset, q, result_queue, collate_fn),
                           name=f"worker {i}", daemon=True) for i, q in enumerate(index_queues)]
    try:
        for w in workers:
            w.start()  # under spawn/forkserver this pickles worker_loop: it must be importable
        for k, task in enumerate(tasks):
            index_queues[k % num_workers].put(task)
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(answers) < len(tasks):
            try:
                answer = result_queue.get(timeout=0.2)
            except queue.Empty:
                dead = [w for w in workers if not w.is_alive()]
                if dead or time.monotonic() > deadline:
                    why = f"{dead[0].name} exited with code {dead[0].exitcode}" if dead else f"none for {timeout:g} s"
                    raise RuntimeError(f"{len(answers)} of {len(tasks)} answers arrived: {why}") from None
                continue
            if isinstance(answer, _Crashed):
                answer.error.reraise()
            task_idx, batch = answer
            answers[task_idx] = batch
        for q in index_queues:  # only now: a tensor in shared memory must be received before its worker exits
            q.put(None)
        for w in workers:
            w.join(timeout=10)
        stuck = [w.name for w in workers if w.is_alive()]
        if stuck:
            raise RuntimeError(f"{', '.join(stuck)} did not exit within 10 s of its sentinel")
        if any(w.exitcode for w in workers):
            raise RuntimeError(f"the workers exited with codes {[w.exitcode for w in workers]}, not 0")
        return answers
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
                w.join(timeout=5)
        for q in [*index_queues, result_queue]:
            q.cancel_join_thread()
            q.close()


def _check_worker_in_processes(worker_loop, start_method: str | None, checks: _Checks) -> None:
    """Two real worker processes, tasks dealt round-robin, answers gathered from one shared result queue."""
    dataset = toy.FailingDataset(24, bad_index=13)
    tasks = [(k, [2 * k, 2 * k + 1]) for k in range(12)]
    method = start_method or multiprocessing.get_start_method()
    case = (f"two worker processes ({method}), FailingDataset(24, bad_index=13), default_collate, "
            "tasks (k, [2k, 2k + 1]) for k in 0..11 dealt round-robin")
    expected_queue, expected_results = queue.Queue(), queue.Queue()
    for task in [*tasks, None]:
        expected_queue.put(task)
    simple_worker_loop(dataset, expected_queue, expected_results, default_collate)
    expected = dict(expected_results.get_nowait() for _ in range(len(tasks)))
    try:
        got = run_worker_processes(worker_loop, dataset, tasks, default_collate, start_method=start_method)
    except (TypeError, AttributeError, pickle.PicklingError) as e:  # what pickling a function can raise
        checks.fail(case, f"the worker processes could not be given your function: {type(e).__name__}: {e}",
                    "write it into a module file and import it from there, so a fresh process can import it.")
    except RuntimeError as e:
        checks.fail(case, str(e).splitlines()[0], "return from the function when you read None; nothing else.")
    for idx in sorted(expected):
        want, have = expected[idx], got.get(idx)
        if isinstance(want, ExceptionWrapper):
            if not (isinstance(have, ExceptionWrapper) and have.exc_type is want.exc_type):
                checks.fail(case, f"task {idx} should come back as an ExceptionWrapper holding a KeyError, "
                                  f"but it is {_short(have)}")
            continue
        problem = first_difference(want, have, where=f"the batch of task {idx}")
        if problem:
            checks.fail(case, problem)


# --- ex04: a one-batch-ahead prefetcher ----------------------------------------------------------


def make_image_batches(n_batches: int, batch_size: int = 4, channels: int = 3, size: tuple[int, int] = (4, 4),
                       seed: int = 0) -> list[tuple[Any, Any]]:
    """``n_batches`` batches ``(uint8 images (B, C, H, W), int64 targets)``; targets number the samples 0, 1, ...

    >>> [(tuple(x.shape), x.dtype, y.tolist()) for x, y in make_image_batches(2, batch_size=2, size=(3, 3))]
    [((2, 3, 3, 3), torch.uint8, [0, 1]), ((2, 3, 3, 3), torch.uint8, [2, 3])]
    """
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 256, (batch_size, channels, *size), dtype=torch.uint8, generator=g),
             torch.arange(k * batch_size, (k + 1) * batch_size)) for k in range(n_batches)]


class RecordingLoader:
    """A loader over ready-made batches that notes each batch it hands out in ``log`` ("fetch 0", ...).

    Others may append to the same ``log`` (a consumer's "yield 0"), to see in which order things happened.

    >>> loader = RecordingLoader(["a", "b"])
    >>> list(loader), loader.log
    (['a', 'b'], ['fetch 0', 'fetch 1'])
    """

    def __init__(self, batches: Sequence[Any], log: list[str] | None = None) -> None:
        self.batches = batches
        self.log = [] if log is None else log
        self.fetched = 0  # batches handed out so far, over all passes
        self.passes = 0  # how many times iteration started

    def __iter__(self) -> Iterator[Any]:
        self.passes += 1
        for k, batch in enumerate(self.batches):
            self.log.append(f"fetch {k}")
            self.fetched += 1
            yield batch

    def __len__(self) -> int:
        return len(self.batches)


def prefetch_one_ahead(loader: Iterable[Any], mean: Sequence[float], std: Sequence[float]) -> Iterator[Any]:
    """Yield ``loader``'s ``(images, targets)`` normalised, each only once the next one is fetched (ex04's reference).

    Images become float32 ``(x - mean * 255) / (std * 255)`` per channel, as ``minidl.prefetch.PrefetchLoader``
    computes them; at most one batch is held besides the one handed out.

    >>> batches = make_image_batches(3, batch_size=2, channels=1)
    >>> out = list(prefetch_one_ahead(batches, mean=[0.0], std=[1 / 255]))  # (x - 0) / 1: the raw values
    >>> [y.tolist() for _, y in out], [x.float().equal(raw.float()) for (x, _), (raw, _) in zip(out, batches)]
    ([[0, 1], [2, 3], [4, 5]], [True, True, True])
    """
    torch = _torch()
    shape = (1, len(mean), 1, 1)  # broadcasts over (N, C, H, W)
    scale = torch.tensor([m * 255 for m in mean], dtype=torch.float32).view(shape)
    spread = torch.tensor([s * 255 for s in std], dtype=torch.float32).view(shape)
    current = None  # the batch ready to hand out
    for images, targets in loader:
        upcoming = ((images.to(torch.float32) - scale) / spread, targets)  # started before `current` is yielded
        if current is not None:
            yield current
        current = upcoming
    if current is not None:  # the loader ran out: the batch still held is the last one
        yield current


def _prefetch_cases() -> Iterator[tuple[str, list[tuple[Any, Any]], list[float], list[float]]]:
    """(description, batches, mean, std): small readable cases first, then seeded random ones."""
    imagenet = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    yield "3 batches of 2 images, 3x4x4, ImageNet statistics", make_image_batches(3, 2), *imagenet
    yield "1 batch", make_image_batches(1, 2), *imagenet
    yield "2 batches", make_image_batches(2, 3, seed=1), *imagenet
    yield "an empty loader (no batches)", [], *imagenet
    yield "5 batches of 1 grey image, 1x2x3", make_image_batches(5, 1, 1, (2, 3), seed=2), [0.5], [0.25]
    rng = random.Random(0)
    for seed in range(30):
        n, size, channels = rng.randint(0, 7), rng.randint(1, 4), rng.choice((1, 3))
        shape = (rng.randint(1, 5), rng.randint(1, 5))
        mean = [round(rng.uniform(0.2, 0.8), 3) for _ in range(channels)]
        std = [round(rng.uniform(0.1, 0.4), 3) for _ in range(channels)]
        description = f"{n} batches of {size} images, {channels}x{shape[0]}x{shape[1]}, make_image_batches seed {seed}"
        yield description, make_image_batches(n, size, channels, shape, seed=seed), mean, std


def check_prefetcher(prefetcher: Callable[..., Iterable[Any]]) -> None:
    """Check ex04: ``prefetcher(loader, mean, std)`` (a generator function or a class) against the reference.

    On each case it must yield every batch once, in order, normalised like ``PrefetchLoader``, and fetch batch
    k + 1 (never k + 2) before handing out batch k. Then it runs over a ``minidl.DataLoader``. Raises
    AssertionError explaining the first mismatch; prints ``All N checks passed``.
    """
    checks = _Checks()
    for description, batches, mean, std in _prefetch_cases():
        _check_prefetch_case(prefetcher, description, batches, mean, std, checks)
        checks.passed += 1
    _check_prefetcher_with_dataloader(prefetcher, checks)
    checks.done()


def _reference_outputs(batches, mean, std) -> list[tuple[Any, Any]]:
    """What PrefetchLoader(device="cpu") yields for these batches: the reference normalisation."""
    from minidl.prefetch import PrefetchLoader

    return list(PrefetchLoader(batches, device="cpu", mean=mean, std=std, channels=len(mean)))


def _check_prefetch_case(prefetcher, description, batches, mean, std, checks: _Checks) -> None:
    torch = _torch()
    case = f"{description}, mean={mean}, std={std}"
    expected = _reference_outputs(batches, mean, std)
    untouched = [(x.clone(), y.clone()) for x, y in batches]
    log: list[str] = []
    loader = RecordingLoader(batches, log)
    got = []
    try:
        for k, item in enumerate(prefetcher(loader, mean, std)):
            log.append(f"yield {k}")
            fetched_then = loader.fetched
            got.append(item)
            if k + 1 < len(batches) and fetched_then < k + 2:
                checks.fail(case, f"when you handed out batch {k}, batch {k + 1} had not been fetched yet "
                                  f"(order so far: {', '.join(log)})",
                            "take the next batch from the loader (and normalise it) before you yield the current "
                            "one; that is what prefetching means.")
            if fetched_then > k + 2:
                checks.fail(case, f"when you handed out batch {k}, you had already fetched {fetched_then} batches "
                                  f"(order so far: {', '.join(log)})",
                            "stay one batch ahead, no more: every batch held costs memory (GPU memory, on a GPU).")
            if k >= len(batches):
                break
    except RuntimeError as e:
        if "StopIteration" in str(e):
            checks.fail(case, f"your prefetcher raised RuntimeError: {e}",
                        "next(iterator) on an exhausted iterator raises StopIteration, which a generator turns "
                        "into this error: use next(iterator, None), or a for loop over the loader.")
        e.add_note(f"(raised by your prefetcher, for {case})")
        raise
    except Exception as e:
        e.add_note(f"(raised by your prefetcher, for {case})")
        raise
    if loader.passes != 1:
        checks.fail(case, f"you iterated the loader {loader.passes} times for one pass over the data",
                    "loop over the loader once: a DataLoader starts a new epoch (and new workers) on each iter().")
    for k, ((x, y), (before_x, before_y)) in enumerate(zip(batches, untouched)):
        if not (torch.equal(x, before_x) and torch.equal(y, before_y)):
            checks.fail(case, f"batch {k} of the loader was changed in place",
                        "make a new tensor for the normalised images; never write into the loader's batches.")
    if len(got) != len(expected):
        hint = ""
        if len(got) == len(expected) - 1:
            hint = ("the last batch is missing: when the loop over the loader ends, one batch is still held; "
                    "yield it too.")
        elif len(got) > len(expected):
            hint = "each batch is handed out exactly once."
        checks.fail(case, f"the loader has {len(expected)} batches, but you yielded {len(got)}", hint)
    for k, (item, (want_x, want_y)) in enumerate(zip(got, expected)):
        _compare_prefetched(k, item, want_x, want_y, batches, mean, std, case, checks)


def _compare_prefetched(k, item, want_x, want_y, batches, mean, std, case, checks: _Checks) -> None:
    torch = _torch()
    where = f"batch {k}"
    if not isinstance(item, tuple | list) or len(item) != 2:
        checks.fail(case, f"{where} should be a pair (images, targets), but it is {_short(item)}")
    x, y = item
    if not isinstance(x, torch.Tensor):
        checks.fail(case, f"{where}'s images should be a torch.Tensor, but they are {_type_name(x)}")
    if x.dtype != torch.float32:
        checks.fail(case, f"{where}'s images should have dtype torch.float32, but they have {x.dtype}",
                    "convert with images.to(torch.float32) (or .float()), and keep mean and std float32 too.")
    if tuple(x.shape) != tuple(want_x.shape):
        checks.fail(case, f"{where}'s images should have shape {tuple(want_x.shape)}, but they have "
                          f"{tuple(x.shape)}", "normalising changes values, never the shape (N, C, H, W).")
    if not (isinstance(y, torch.Tensor) and torch.equal(y, want_y)):
        moved = next((j for j, (_, t) in enumerate(batches) if isinstance(y, torch.Tensor) and torch.equal(y, t)),
                     None)
        if moved is not None:
            checks.fail(case, f"the batch you handed out in place {k} is the loader's batch {moved}",
                        "hand the batches out in the loader's order: yield the batch you held, then hold the new one.")
        checks.fail(case, f"{where}'s targets should be {want_y.tolist()}, but they are {_short(y)}",
                    "pass the targets through untouched.")
    if not torch.allclose(x, want_x, rtol=1e-5, atol=1e-5):
        i = tuple(int(v) for v in torch.nonzero(~torch.isclose(x, want_x, rtol=1e-5, atol=1e-5))[0])
        raw = int(batches[k][0][i])
        c = i[1]
        hint = (f"the raw value there is {raw} (channel {c}, mean {mean[c]}, std {std[c]}): "
                f"({raw} - {mean[c]} * 255) / ({std[c]} * 255) = {float(want_x[i]):.4f}.")
        if abs(float(x[i]) - (raw - mean[c]) / std[c]) < 1e-3:
            hint = ("mean and std are for images scaled to [0, 1], and these are 0..255: scale them by 255, "
                    "(x - mean * 255) / (std * 255).")
        checks.fail(case, f"{where}'s images{list(i)} should be {float(want_x[i]):.5f}, but it is {float(x[i]):.5f}",
                    hint)


def _check_prefetcher_with_dataloader(prefetcher, checks: _Checks) -> None:
    """Over a real minidl.DataLoader with fast_collate: the same batches as PrefetchLoader gives."""
    import functools

    from minidl.prefetch import PrefetchLoader, fast_collate

    rng = np.random.default_rng(5)
    samples = [(rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8), i) for i in range(10)]  # HWC images
    loader = DataLoader(samples, batch_size=4, collate_fn=functools.partial(fast_collate, channels_last=True))
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    case = "minidl.DataLoader(10 HWC uint8 images, batch_size=4, collate_fn=fast_collate(channels_last=True))"
    want = list(PrefetchLoader(loader, device="cpu", mean=mean, std=std))
    try:
        got = list(prefetcher(loader, mean, std))
    except Exception as e:
        e.add_note(f"(raised by your prefetcher, for {case})")
        raise
    if len(got) != len(want):
        checks.fail(case, f"the loader has {len(want)} batches, but you yielded {len(got)}")
    for k, (item, (want_x, want_y)) in enumerate(zip(got, want)):
        _compare_prefetched(k, item, want_x, want_y, [b for b in loader], mean, std, case, checks)
    checks.passed += 1


# --- the measuring and debugging exercises (ch01, ch07, ch09, ch10, ch11, ch12): one checker module each -------------
# Each module holds its checker and the datasets its notebook uses; none holds a reference answer (those are in
# minidl.course.solutions, which no exercise notebook imports). Importing them needs only NumPy.
from minidl.course.exercises.ch01_nogil import check_nogil  # noqa: E402, F401
from minidl.course.exercises.ch07_pinning_cost import check_pin_copy  # noqa: E402, F401
from minidl.course.exercises.ch09_threads_or_processes import check_choice  # noqa: E402, F401
from minidl.course.exercises.ch10_overhead_ratio import check_overhead  # noqa: E402, F401
from minidl.course.exercises.ch11_vectorise_or_workers import check_decision  # noqa: E402, F401
from minidl.course.exercises.ch12_pitfalls_debug import check_no_hang, check_no_leak, check_num_workers  # noqa: E402, F401
