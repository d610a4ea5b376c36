"""Checker for ch02_sampler: a batch sampler that puts samples of similar length together (notebook 02).

The expected batches come from the spec (a stable NumPy argsort, cut into batches, whole batches permuted
by ``torch.randperm``); the reference answer is in the solution notebook, not here.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from minidl.sampler import BatchSampler
from minidl_course.exercises._common import (
    Tripwire,
    _Checks,
    _loaders,
    _torch,
    _type_name,
    call,
    first_hint,
    refuse_reference,
    run_watched,
    watch,
)
from minidl_course.exercises.ch03_collate import make_token_samples


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


DELEGATED = ("your sampler hands the batching to {0}: cut the sorted order into batches yourself, "
             "with drop_last and __len__; that is what this exercise practises.")


def _library_batch_samplers() -> dict:
    return watch({"minidl's BatchSampler": (BatchSampler,),
                  "torch's BatchSampler": (_torch().utils.data.BatchSampler,)})


def expected_epochs(lengths: list[int], batch_size: int, drop_last: bool, shuffle: bool, seed: int | None,
                    epochs: int = 3) -> list[list[list[int]]]:
    """The spec, computed another way: ``epochs`` epochs of batches, drawn from the RNG state as it is now.

    seed None shuffles with the global torch RNG; a number with ``torch.Generator().manual_seed(seed)``.
    """
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
    """Check ch02_sampler: ``sampler_cls(lengths, batch_size, drop_last, shuffle, generator)`` against the spec.

    Compares ``len()`` and three epochs on each case, then the sampler inside minidl's and torch's
    DataLoader. Raises AssertionError explaining the first mismatch; prints ``All N checks passed``.
    """
    refuse_reference(sampler_cls)
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
    # The expected epochs and the learner's start from the same global RNG state (it matters when generator is None).
    torch.manual_seed(1000 + (seed or 0))
    expected = expected_epochs(lengths, batch_size, drop_last, shuffle, seed)
    torch.manual_seed(1000 + (seed or 0))
    run_watched(Tripwire(_library_batch_samplers()),
                lambda: _run_sampler_case(sampler_cls, lengths, batch_size, drop_last, shuffle, seed, case, expected,
                                          checks),
                lambda what: checks.fail(case, f"your sampler called {what}", DELEGATED.format(what)))


def _run_sampler_case(sampler_cls, lengths, batch_size, drop_last, shuffle, seed, case, expected, checks) -> None:
    sampler = call(_make_sampler, sampler_cls, lengths, batch_size, drop_last, shuffle, seed,
                   what="sampler's __init__", case=case)

    def no_len(e: Exception) -> None:
        if isinstance(e, TypeError):
            checks.fail(case, f"len(sampler) failed: {e}", "define __len__ to return the number of batches.")

    got_len = call(len, sampler, what="sampler's __len__", case=case, explain=no_len)
    if got_len != len(expected[0]):
        checks.fail(
            case,
            f"len(sampler) should be {len(expected[0])}, but it is {got_len}",
            "len is the number of batches an epoch yields: n // batch_size with drop_last, else rounded up.",
        )

    got_epochs = []
    for epoch in range(3):
        where = case + (f", epoch {epoch + 1}" if shuffle else "")
        got = call(list, sampler, what="sampler's __iter__", case=where)
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
        dup = next((i for i, c in Counter(flat_got).items() if c > 1), None)  # flat_got is sorted
        missing = sorted(set(flat_expected) - set(flat_got))
        checks.fail(case, f"expected batches {expected}, but got {got}", first_hint(
            f"index {missing[0]} is never yielded." if missing else "some indices should not be there.",
            # the right number and sizes of batches, of the wrong indices
            (shuffle and sorted(map(len, got)) == sorted(map(len, expected)), shuffle_hint),
            (drop_last and len(got) == len(expected) + 1 and short and len(got[-1]) == short,
             f"with drop_last=True the last, short batch ({short_batch}) must not be yielded."),
            (not drop_last and len(got) == len(expected) - 1 and short,
             f"with drop_last=False the last, short batch ({short_batch}) must still be yielded."),
            (dup is not None, f"index {dup} is yielded more than once; each index belongs to exactly one batch.")))

    if sorted(map(tuple, expected)) == sorted(map(tuple, got)):
        checks.fail(case, f"expected batches {expected}, but got {got}", "the batches are right but come in another "
                    "order: yield batches[i] for i in torch.randperm(number of batches, generator=self.generator), "
                    "one permutation per epoch." if shuffle else
                    "without shuffle the batches come in sorted order: shortest lengths first.")

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
    want = expected_epochs(lengths, 4, False, True, seed=5, epochs=2)
    for name, loader_cls in _loaders():
        case = f"{name}(dataset, batch_sampler=sampler) with lengths={lengths}, batch_size=4, shuffle=True"
        sampler = sampler_cls(lengths, batch_size=4, drop_last=False, shuffle=True,
                              generator=torch.Generator().manual_seed(5))
        got = [[b.tolist() for b in loader_cls(ids, batch_sampler=sampler)] for _ in range(2)]
        if got != want:
            checks.fail(case, f"two epochs should load {want}, but loaded {got}")
        checks.passed += 1
