"""Checker for ch03_collate: a collate function that pads token ids and returns a mask, held to ``pad_sequence``."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from minidl_course.exercises._common import _Checks, _loaders, _torch, _type_name, call, first_difference, first_hint

Sample = dict[str, Any]  # one item of make_token_samples: {"tokens": 1-d int64 array, "label": int}
DELEGATED = "your collate hands the padding to {0}: write it yourself (torch.zeros, then copy in each sample)."
DTYPE_HINTS = {"tokens": "token ids need dtype=torch.int64 (torch.zeros makes float32 unless told otherwise).",
               "mask": "the mask is boolean: dtype=torch.bool, or compare (e.g. positions < lengths).",
               "label": "labels are integers: dtype=torch.int64."}


def make_token_samples(n: int, seed: int = 0, max_len: int = 12, zero_tokens: bool = False) -> list[Sample]:
    """``n`` samples ``{"tokens": 1..max_len token ids from 1 to 99 (from 0 with zero_tokens), "label": 0 or 1}``.
    >>> [(s["tokens"].tolist(), s["label"]) for s in make_token_samples(2, seed=1, max_len=4)]
    [([51, 75], 1), ([15], 1)]
    """
    rng, low = np.random.default_rng(seed), 0 if zero_tokens else 1
    return [{"tokens": rng.integers(low, 100, size=int(rng.integers(1, max_len + 1)), dtype=np.int64),
             "label": int(rng.integers(0, 2))} for _ in range(n)]


def expected_collate(batch: Sequence[Sample]) -> dict[str, Any]:
    """What the spec asks for, built with torch's ``pad_sequence`` (torch is the oracle; the learner writes it)."""
    torch = _torch()
    pad = torch.nn.utils.rnn.pad_sequence
    tokens = [torch.as_tensor(s["tokens"], dtype=torch.int64) for s in batch]
    return {"tokens": pad(tokens, batch_first=True),  # pads with 0 by default
            "mask": pad([torch.ones(len(t), dtype=torch.bool) for t in tokens], batch_first=True),
            "label": torch.tensor([s["label"] for s in batch], dtype=torch.int64)}


def _cases() -> Iterator[tuple[str, list[Sample]]]:
    """(description, batch): small readable batches first, then seeded random ones."""
    for description, rows in (("two samples, 3 and 1 tokens", [([5, 6, 7], 1), ([8], 0)]),
                              ("one sample", [([4, 2], 0)]),
                              ("three samples of equal length", [([i, i + 1], i % 2) for i in (1, 3, 5)]),
                              ("a real token 0", [([4, 0, 2], 1), ([7], 0)]),
                              ("the longest sample last", [([9], 0), ([1, 2, 3, 4], 1)])):
        yield description, [{"tokens": np.array(tokens), "label": label} for tokens, label in rows]
    rng = random.Random(0)
    for seed in range(40):
        size, zero_tokens = rng.randint(1, 8), seed >= 20  # from seed 20 on, 0 is also a real token id
        yield (f"make_token_samples({size}, seed={seed}, zero_tokens={zero_tokens})",
               make_token_samples(size, seed=seed, zero_tokens=zero_tokens))


def check_collate(collate_fn: Callable[[list[Sample]], Any]) -> None:
    """Check ch03_collate: ``collate_fn(batch)`` against the spec on many batches, then inside both loaders."""
    torch = _torch()
    from minidl_course import padding
    library = {"torch.nn.utils.rnn.pad_sequence": (torch.nn.utils.rnn.pad_sequence,),
               "minidl_course.padding.pad_sequence": (padding.pad_sequence,),
               "minidl_course.padding.pad_collate": (padding.pad_collate,)}
    checks = _Checks(collate_fn)
    for description, batch in _cases():
        rows = ", ".join(f"{{'tokens': {s['tokens'].tolist()}, 'label': {s['label']}}}" for s in batch)
        case, untouched = f"{description}: [{rows}]", copy.deepcopy(batch)
        with checks.watching(library, case, "your collate called {0}", DELEGATED):
            got = call(collate_fn, batch, what="collate function", case=case)
        expected, changed = expected_collate(untouched), first_difference(untouched, batch, where="batch")
        checks.first(case, (changed, f"your collate changed the samples it was given: {changed}",
                            "build new tensors for the batch; never write into the samples."),
                     (not isinstance(got, dict), f"the result should be a dict with keys {list(expected)}, but it is "
                      f"{_type_name(got)}", ""))
        checks.first(case, (sorted(got) != sorted(expected), f"the result should have the keys {sorted(expected)}, "
                            f"but it has {sorted(got)}", ""))
        for key in expected:
            if problem := first_difference(expected[key], got[key], where=f"batch[{key!r}]"):
                checks.fail(case, problem, _hint(key, got[key], expected[key], batch))
        checks.passed += 1
    samples = make_token_samples(10, seed=99, zero_tokens=True)
    with torch.random.fork_rng(devices=[]):  # every epoch of a DataLoader draws a base seed from the global RNG
        for name, loader_cls in _loaders():
            problem = first_difference(list(loader_cls(samples, batch_size=4, collate_fn=expected_collate)),
                                       list(loader_cls(samples, batch_size=4, collate_fn=collate_fn)), "batches")
            checks.first(f"{name}(make_token_samples(10, seed=99, zero_tokens=True), batch_size=4, collate_fn=yours)",
                         (problem, problem, ""))
            checks.passed += 1
    checks.done()


def _hint(key: str, value, want, batch: Sequence[Sample]) -> str:
    """Why ``batch[key]`` is not the spec's: not a tensor, its dtype, its shape, or its first wrong value."""
    torch = _torch()
    lengths = [len(s["tokens"]) for s in batch]
    if not isinstance(value, torch.Tensor):
        return "turn lists and arrays into tensors: torch.tensor(...) or torch.as_tensor(...)."
    if value.dtype != want.dtype:
        return DTYPE_HINTS[key]
    if key == "label":
        return "one label per sample." if value.shape != want.shape else "label[i] is sample i's label, in batch order."
    if value.shape != want.shape:
        return f"{len(batch)} rows (one per sample) by {max(lengths)} columns (the longest here, not a fixed length)."
    i, j = (int(v) for v in torch.nonzero(value != want)[0])
    if key == "mask":
        return (f"sample {i} has a real token 0 at position {j}: build the mask from the lengths, not from tokens != 0."
                if j < lengths[i] and int(batch[i]["tokens"][j]) == 0 else
                f"mask[i, j] is True exactly when j < the length of sample i (here {lengths[i]}).")
    left = torch.zeros_like(want)
    for r, n in enumerate(lengths):
        left[r, left.shape[1] - n :] = torch.as_tensor(batch[r]["tokens"])
    return first_hint(f"row {i} starts with sample {i}'s tokens, in order.",
                      (torch.equal(value, left), "each row starts with its tokens; the padding goes on the right."),
                      (j >= lengths[i], f"row {i} has {lengths[i]} real tokens; the positions after them hold 0."))
