"""Checker for ch02_sampler: a batch sampler that puts samples of similar length together (notebook 02).

The expected batches come from the spec: a stable NumPy argsort, cut into batches, whole batches permuted by
``torch.randperm``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from minidl.sampler import BatchSampler
from minidl_course.exercises._common import _Checks, _loaders, _torch, _type_name, call, first_hint
from minidl_course.exercises.ch03_collate import make_token_samples

DELEGATED = ("your sampler hands the batching to {0}: cut the sorted order into batches yourself, "
             "with drop_last and __len__; that is what this exercise practises.")
SHUFFLE_HINT = ("shuffle reorders whole batches, never the indices inside them: build the sorted batches first, then "
                "permute the list of batches.")


def _sampler_cases() -> Iterator[tuple[list[int], int, bool, bool, int | None]]:
    """(lengths, batch_size, drop_last, shuffle, seed), seed None shuffling with the global torch RNG."""
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
        lengths = [rng.randint(1, 8) for _ in range(rng.randint(1, 30))]  # few distinct lengths: many ties
        yield lengths, rng.randint(1, 6), rng.random() < 0.5, seed >= 20, seed if seed % 5 else None


def expected_epochs(lengths: list[int], batch_size: int, drop_last: bool, shuffle: bool, seed: int | None,
                    epochs: int = 3) -> list[list[list[int]]]:
    """The spec, computed another way: ``epochs`` epochs of batches, drawn from the RNG state as it is now."""
    torch = _torch()
    order = np.argsort(np.asarray(lengths), kind="stable").tolist()  # stable: ties keep their index order
    full, short = divmod(len(order), batch_size)
    count = full if drop_last or not short else full + 1
    batches = [order[k * batch_size : (k + 1) * batch_size] for k in range(count)]
    if not shuffle:
        return [batches] * epochs
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return [[batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()] for _ in range(epochs)]


def check_sampler(sampler_cls: Callable[..., Any]) -> None:
    """Check ch02_sampler: ``sampler_cls(lengths, batch_size, drop_last, shuffle, generator)`` against the spec:
    ``len()`` and three epochs on each case, then inside minidl's and torch's DataLoader."""
    torch = _torch()
    checks = _Checks(sampler_cls)
    saved_rng = torch.get_rng_state()  # shuffling without a generator draws from the global RNG
    library = {"minidl's BatchSampler": (BatchSampler,), "torch's BatchSampler": (torch.utils.data.BatchSampler,)}
    try:
        for lengths, batch_size, drop_last, shuffle, seed in _sampler_cases():
            generator = "None" if seed is None else f"torch.Generator().manual_seed({seed})"
            case = (f"lengths={lengths}, batch_size={batch_size}, drop_last={drop_last}, shuffle={shuffle}"
                    + (f", generator={generator}" if shuffle else ""))
            torch.manual_seed(1000 + (seed or 0))  # the spec and the learner start from the same global RNG state
            expected = expected_epochs(lengths, batch_size, drop_last, shuffle, seed)
            torch.manual_seed(1000 + (seed or 0))
            checks.watched(library, case, "your sampler called {0}", DELEGATED, _run_case,
                           sampler_cls, lengths, batch_size, drop_last, shuffle, seed, case, expected, checks)
            checks.passed += 1
        samples = make_token_samples(23, seed=7)
        lengths = [len(s["tokens"]) for s in samples]
        want = expected_epochs(lengths, 4, False, True, seed=5, epochs=2)
        for name, loader_cls in _loaders():  # a dataset of its own indices: each batch shows what was fetched
            sampler = sampler_cls(lengths, batch_size=4, drop_last=False, shuffle=True,
                                  generator=torch.Generator().manual_seed(5))
            got = [[b.tolist() for b in loader_cls(list(range(23)), batch_sampler=sampler)] for _ in range(2)]
            if got != want:
                checks.fail(f"{name}(dataset, batch_sampler=sampler) with lengths={lengths}, batch_size=4, "
                            "shuffle=True", f"two epochs should load {want}, but loaded {got}")
            checks.passed += 1
    finally:
        torch.set_rng_state(saved_rng)
    checks.done()


def _run_case(sampler_cls, lengths, batch_size, drop_last, shuffle, seed, case, expected, checks: _Checks) -> None:
    generator = None if seed is None else _torch().Generator().manual_seed(seed)
    sampler = call(sampler_cls, list(lengths), batch_size=batch_size, drop_last=drop_last, shuffle=shuffle,
                   generator=generator, what="sampler's __init__", case=case)

    def no_len(e: Exception) -> None:
        if isinstance(e, TypeError):
            checks.fail(case, f"len(sampler) failed: {e}", "define __len__ to return the number of batches.")

    got_len = call(len, sampler, what="sampler's __len__", case=case, explain=no_len)
    if got_len != len(expected[0]):
        checks.fail(case, f"len(sampler) should be {len(expected[0])}, but it is {got_len}",
                    "len is the number of batches an epoch yields: n // batch_size with drop_last, else rounded up.")
    epochs = []
    for epoch in range(3 if shuffle else 1):  # without shuffling every epoch is the same
        where = case + (f", epoch {epoch + 1}" if shuffle else "")
        epochs.append(got := call(list, sampler, what="sampler's __iter__", case=where))
        if epoch > 0 and got == epochs[0] and expected[epoch] != expected[0]:
            checks.fail(where, f"epoch {epoch + 1} gave the same batch order as epoch 1: {got}",
                        "draw the permutation inside __iter__, so that each epoch is shuffled anew.")
        _compare_batches(expected[epoch], got, lengths, batch_size, drop_last, shuffle, where, checks)


def _compare_batches(expected, got, lengths, batch_size, drop_last, shuffle, case, checks: _Checks) -> None:
    for k, batch in enumerate(got):
        if type(batch) is not list:
            checks.fail(case, f"batch {k} is {_type_name(batch)}: {batch!r}",
                        "yield each batch as a list of ints, as BatchSampler does.")
        for idx in (i for i in batch if type(i) is not int):
            checks.fail(case, f"batch {k} holds {idx!r}, {_type_name(idx)}",
                        "indices must be plain Python ints: convert with int(), or .tolist() a tensor.")
    if got == expected:
        return
    problem = f"expected batches {expected}, but got {got}"
    short = len(lengths) % batch_size
    short_batch = f"{short} {'index' if short == 1 else 'indices'}"
    flat_expected, flat_got = sorted(i for b in expected for i in b), sorted(i for b in got for i in b)
    if flat_got != flat_expected:
        dup = next((i for i, c in Counter(flat_got).items() if c > 1), None)  # flat_got is sorted
        missing = sorted(set(flat_expected) - set(flat_got))
        checks.fail(case, problem, first_hint(
            f"index {missing[0]} is never yielded." if missing else "some indices should not be there.",
            # the right number and sizes of batches, of the wrong indices
            (shuffle and sorted(map(len, got)) == sorted(map(len, expected)), SHUFFLE_HINT),
            (drop_last and len(got) == len(expected) + 1 and short and len(got[-1]) == short,
             f"with drop_last=True the last, short batch ({short_batch}) must not be yielded."),
            (not drop_last and len(got) == len(expected) - 1 and short,
             f"with drop_last=False the last, short batch ({short_batch}) must still be yielded."),
            (dup is not None, f"index {dup} is yielded more than once; each index belongs to exactly one batch.")))
    sizes = [len(b) for b in got]
    checks.fail(case, problem, first_hint(
        "", (sorted(map(tuple, expected)) == sorted(map(tuple, got)), "the batches are right but come in another "
             "order: yield batches[i] for i in torch.randperm(number of batches, generator=self.generator), one "
             "permutation per epoch." if shuffle else
             "without shuffle the batches come in sorted order: shortest lengths first."),
        (not shuffle and sizes != [len(b) for b in expected], f"every batch holds batch_size={batch_size} indices, "
         f"except perhaps the last; your batches hold {sizes}."),
        (shuffle, SHUFFLE_HINT)) or _order_hint([i for b in got for i in b], lengths))


def _order_hint(order: list[int], lengths: list[int]) -> str:
    """The first pair of neighbours out of order: by length, or by index among equal lengths."""
    steps = [p for p in range(1, len(order)) if lengths[order[p]] < lengths[order[p - 1]]]
    if steps:
        a, b = order[steps[0] - 1], order[steps[0]]
        return (f"indices should be sorted by length, shortest first, but index {a} (length {lengths[a]}) comes "
                f"before index {b} (length {lengths[b]}).")
    ties = [p for p in range(1, len(order)) if lengths[order[p]] == lengths[order[p - 1]] and order[p] < order[p - 1]]
    p = ties[0] if ties else 1  # the orders differ, so with sizes and lengths right a tie is out of order
    return (f"indices of equal length keep their index order, but index {order[p - 1]} comes before index "
            f"{order[p]} (both length {lengths[order[p]]}): sort with a stable sort, "
            "sorted(range(n), key=lambda i: lengths[i]).")
