"""The exercise checkers, ch03 (a collate that pads and masks): each passes a learner's copy of the reference answer
and rejects typical wrong answers with the hint that names the mistake.
"""

import re

import numpy as np
import pytest
import torch
from exercise_support import (
    learner_copy,
)

from minidl_course.exercises import (
    check_collate,
    first_difference,
    make_token_samples,
)

pad_mask_collate = learner_copy("ch03_collate").pad_mask_collate


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
