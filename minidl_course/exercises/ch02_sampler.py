"""Checker for ch02_sampler: a batch sampler of similar-length samples, held to a stable argsort cut into batches."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from minidl.sampler import BatchSampler
from minidl_course.exercises._common import _Checks, _loaders, _torch, _type_name, call, first_hint
from minidl_course.exercises.ch03_collate import make_token_samples

DELEGATED = "your sampler hands the batching to {0}: cut the sorted order into batches yourself, drop_last and all."
SHUFFLE_HINT = "shuffle reorders whole batches, never the indices inside them: permute the list of sorted batches."
# (lengths, batch_size, drop_last, shuffle, seed), seed None shuffling with the global torch RNG: ties, drop_last,
# a short batch dropped or not, none short; then seeded random cases with few distinct lengths: many ties
_rng = random.Random(0)
CASES = [([3, 1, 2], 2, False, False, None), ([2, 1, 2, 1, 2], 2, False, False, None),
         ([2, 1, 2, 1, 2], 2, True, False, None), ([5, 4], 3, False, False, None), ([5, 4], 3, True, False, None),
         ([1, 1, 1, 1], 4, True, False, None), ([3, 1, 2, 1, 3, 2, 2], 2, False, True, 0),
         ([3, 1, 2, 1, 3, 2, 2], 2, True, True, None)] + [
    ([_rng.randint(1, 8) for _ in range(_rng.randint(1, 30))], _rng.randint(1, 6), _rng.random() < 0.5, seed >= 20,
     seed if seed % 5 else None) for seed in range(40)]


def expected_epochs(lengths: list[int], batch_size: int, drop_last: bool, shuffle: bool, seed: int | None,
                    epochs: int = 3) -> list[list[list[int]]]:
    """The spec, computed another way: ``epochs`` epochs of batches, drawn from the RNG state as it is now."""
    torch = _torch()
    order = np.argsort(np.asarray(lengths), kind="stable").tolist()  # stable: ties keep their index order
    end = len(order) - len(order) % batch_size if drop_last else len(order)
    batches = [order[k : k + batch_size] for k in range(0, end, batch_size)]
    if not shuffle:
        return [batches] * epochs
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return [[batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()] for _ in range(epochs)]


def check_sampler(sampler_cls: Callable[..., Any]) -> None:
    """Check ch02_sampler: ``sampler_cls(lengths, batch_size, drop_last, shuffle, generator)``, then in both loaders."""
    torch = _torch()
    checks = _Checks(sampler_cls)
    library = {"minidl's BatchSampler": (BatchSampler,), "torch's BatchSampler": (torch.utils.data.BatchSampler,)}
    with torch.random.fork_rng(devices=[]):  # shuffling without a generator draws from the global RNG
        for lengths, batch_size, drop_last, shuffle, seed in CASES:
            generator = "None" if seed is None else f"torch.Generator().manual_seed({seed})"
            case = (f"lengths={lengths}, batch_size={batch_size}, drop_last={drop_last}, shuffle={shuffle}"
                    + (f", generator={generator}" if shuffle else ""))
            torch.manual_seed(1000 + (seed or 0))  # the spec and the learner start from the same global RNG state
            expected = expected_epochs(lengths, batch_size, drop_last, shuffle, seed)
            torch.manual_seed(1000 + (seed or 0))
            with checks.watching(library, case, "your sampler called {0}", DELEGATED):
                sampler = call(sampler_cls, list(lengths), batch_size=batch_size, drop_last=drop_last, shuffle=shuffle,
                               generator=None if seed is None else torch.Generator().manual_seed(seed),
                               what="sampler's __init__", case=case)
                _check_epochs(sampler, expected, lengths, batch_size, drop_last, shuffle, case, checks)
            checks.passed += 1
        lengths = [len(s["tokens"]) for s in make_token_samples(23, seed=7)]
        want = expected_epochs(lengths, 4, False, True, seed=5, epochs=2)
        for name, loader_cls in _loaders():  # a dataset of its own indices: each batch shows what was fetched
            sampler = sampler_cls(lengths, batch_size=4, drop_last=False, shuffle=True,
                                  generator=torch.Generator().manual_seed(5))
            got = [[b.tolist() for b in loader_cls(list(range(23)), batch_sampler=sampler)] for _ in range(2)]
            checks.first(f"{name}(dataset, batch_sampler=sampler) with lengths={lengths}, batch_size=4, shuffle=True",
                         (got != want, f"two epochs should load {want}, but loaded {got}", ""))
            checks.passed += 1
    checks.done()


def _check_epochs(sampler, expected, lengths, batch_size, drop_last, shuffle, case, checks: _Checks) -> None:
    got_len = call(len, sampler, what="sampler's __len__", case=case, explain=lambda e: checks.first(case, (
        isinstance(e, TypeError), f"len(sampler) failed: {e}", "define __len__ to return the number of batches.")))
    checks.first(case, (got_len != len(expected[0]), f"len(sampler) should be {len(expected[0])}, but it is "
                        f"{got_len}", "batches per epoch: n // batch_size with drop_last, else rounded up."))
    epochs = []
    for epoch in range(3 if shuffle else 1):  # without shuffling every epoch is the same
        where = case + (f", epoch {epoch + 1}" if shuffle else "")
        epochs.append(got := call(list, sampler, what="sampler's __iter__", case=where))
        checks.first(where, (epoch > 0 and got == epochs[0] and expected[epoch] != expected[0],
                             f"epoch {epoch + 1} gave the same batch order as epoch 1: {got}",
                             "draw the permutation inside __iter__, so that each epoch is shuffled anew."))
        for k, batch in enumerate(got):
            checks.first(where, (type(batch) is not list, f"batch {k} is {_type_name(batch)}: {batch!r}",
                                 "yield each batch as a list of ints, as BatchSampler does."))
            for i in (i for i in batch if type(i) is not int):
                checks.fail(where, f"batch {k} holds {i!r}, {_type_name(i)}",
                            "indices must be plain Python ints: convert with int(), or .tolist() a tensor.")
        if got != expected[epoch]:
            checks.fail(where, f"expected batches {expected[epoch]}, but got {got}",
                        _hint(expected[epoch], got, lengths, batch_size, drop_last, shuffle))


def _hint(expected, got, lengths: list[int], batch_size: int, drop_last: bool, shuffle: bool) -> str:
    """The mistake that turns the spec's batches into ``got``."""
    flat, short = sorted(i for b in got for i in b), len(lengths) % batch_size
    short_batch = f"{short} {'index' if short == 1 else 'indices'}"
    if flat != sorted(i for b in expected for i in b):
        dup = next((i for i, c in Counter(flat).items() if c > 1), None)
        missing = sorted({i for b in expected for i in b} - set(flat))
        return first_hint(
            f"index {missing[0]} is never yielded." if missing else "some indices should not be there.",
            (shuffle and sorted(map(len, got)) == sorted(map(len, expected)), SHUFFLE_HINT),  # right sizes, wrong ids
            (drop_last and len(got) == len(expected) + 1 and short and len(got[-1]) == short,
             f"with drop_last=True the last, short batch ({short_batch}) must not be yielded."),
            (not drop_last and len(got) == len(expected) - 1 and short,
             f"with drop_last=False the last, short batch ({short_batch}) must still be yielded."),
            (dup is not None, f"index {dup} is yielded more than once; each index belongs to exactly one batch."))
    if sorted(map(tuple, expected)) == sorted(map(tuple, got)):
        return ("right batches, wrong order: yield batches[i] for i in torch.randperm(len(batches), generator="
                "self.generator), anew each epoch." if shuffle else "without shuffle, batches go shortest first.")
    if shuffle or [len(b) for b in got] != [len(b) for b in expected]:
        return SHUFFLE_HINT if shuffle else f"batches hold batch_size={batch_size} indices, the last perhaps fewer."
    order = [i for b in got for i in b]
    pairs = list(zip(order, order[1:]))
    longer = next(((a, b) for a, b in pairs if lengths[b] < lengths[a]), None)
    a, b = longer or next(((a, b) for a, b in pairs if lengths[a] == lengths[b] and b < a), pairs[0])
    return (f"indices should be sorted by length, shortest first, but index {a} (length {lengths[a]}) comes before "
            f"index {b} (length {lengths[b]})." if longer else f"indices of equal length keep their index order, but "
            f"index {a} comes before index {b} (both length {lengths[b]}): sort with a stable sort, "
            "sorted(range(n), key=lambda i: lengths[i]).")
